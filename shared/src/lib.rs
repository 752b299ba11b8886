//! Hooklane core: the delivery engine shared by the embedded binary and the AWS functions.
//!
//! `domain` is pure; `store`, `queue`, `notify` and `http` are ports with their adapters;
//! `service` holds the use-cases; `api` is the HTTP API router served by both shapes.

pub mod api;
pub mod app;
#[cfg(feature = "aws")]
pub mod aws;
pub mod clock;
pub mod config;
pub mod dispatcher;
pub mod domain;
pub mod http;
pub mod limits;
pub mod notify;
pub mod queue;
pub mod secrets;
pub mod service;
pub mod signing;
pub mod slots;
pub mod store;
pub mod telemetry;

// The test kit's fixtures and test support, compiled into this crate's own unit tests (they
// cannot use the kit as a crate: it depends on this one). They name this crate
// `hooklane::`, as everywhere else they are compiled. The store contract suites run from
// the integration tests (`tests/core/stores.rs`), which can use the kit.
#[cfg(test)]
extern crate self as hooklane;
#[cfg(all(test, feature = "aws"))]
#[allow(dead_code)]
#[path = "../../tests/kit/src/faults.rs"]
pub(crate) mod faults;
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../tests/kit/src/fixtures.rs"]
pub(crate) mod fixtures;
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../tests/kit/src/testing.rs"]
pub(crate) mod testing;
pub mod tokens;

pub use app::{App, PublishMode};
pub use clock::{Clock, SystemClock};
pub use config::CoreConfig;

/// Version sent in the `User-Agent` header of every webhook.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
