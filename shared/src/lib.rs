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
pub mod notify;
pub mod queue;
pub mod service;
pub mod signing;
pub mod slots;
pub mod store;
pub mod telemetry;
#[cfg(any(test, feature = "contract"))]
pub mod testing;
pub mod tokens;

pub use app::{App, PublishMode};
pub use clock::{Clock, SystemClock};
pub use config::CoreConfig;

/// Version sent in the `User-Agent` header of every webhook.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
