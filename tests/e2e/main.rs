//! End-to-end tests: the real `hooklane` binary against the fake endpoint farm on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

mod support;

mod bad_input;
mod crash;
mod delivery_rules;
mod health;
mod hostile;
mod isolation;
mod retries;
mod signatures;
