//! The core crate's integration tests, one binary (each test binary links the whole tree):
//! the store contract on both stores, the API behind API Gateway, an event's answers within
//! what the AWS function may return, erasures the sweeper finishes, another event under a
//! published id answered 409, property tests of what is parsed from outside, and the SAM
//! template against what the code emits and needs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

mod admin_api;
mod api_gateway;
mod erasures;
mod event_answers;
mod event_conflicts;
mod properties;
mod secrets_at_rest;
mod stores;
mod template_metrics;
mod template_stack;
