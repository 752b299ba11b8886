//! Hooklane's test kit, kept out of the product crates: the fake endpoint farm that the
//! end-to-end tests and `hooklane bench` send to, the store contract suites and their
//! fixtures, test support (the AWS shape on the emulator, a local receiver), an API-only
//! `App`, and (feature `aws`) the DynamoDB request meter with the cost measurement and an
//! interceptor that makes a table's batch reads fail.
//!
//! `fixtures` and `testing` are also compiled into the core crate's own unit tests (`#[path]`
//! modules there): a crate's unit tests cannot use a crate that depends on it, and this way
//! they are written once. The contract suites run from the core's integration tests.

pub mod app;
pub mod audit_contract;
pub mod catalog_contract;
pub mod contract;
#[cfg(all(test, feature = "aws"))]
mod cost;
pub mod created_contract;
pub mod farm;
#[cfg(feature = "aws")]
pub mod faults;
pub mod fixtures;
#[cfg(feature = "aws")]
pub mod meter;
pub mod missed_contract;
pub mod notification_contract;
pub mod replay_contract;
pub mod stats_contract;
pub mod testing;
