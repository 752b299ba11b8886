//! End-to-end tests: the real `hooklane` binary against the fake endpoint farm on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

mod support;

mod access;
mod audit;
mod aws_pipeline;
mod backup;
mod bad_input;
mod bench_smoke;
mod bootstraps;
mod client_connections;
mod crash;
mod custom_headers;
mod delivery_log;
mod delivery_rules;
mod endpoint_changes;
mod endpoint_stats;
mod erasure;
mod event_types;
mod file_descriptors;
mod health;
mod hostile;
mod iam;
mod isolation;
mod limits;
mod metrics;
mod outbox;
mod portal;
mod relay;
mod replay;
mod retention;
mod retries;
mod schema;
mod secrets;
mod shutdown;
mod signatures;
mod snippets;
mod store_faults;
mod test_events;
mod ui;
