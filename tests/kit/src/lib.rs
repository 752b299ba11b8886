//! Hooklane's test kit, kept out of the product crates: the fake endpoint farm that the
//! end-to-end tests and `hooklane bench` send to, an API-only `App`, and (feature `aws`) the
//! DynamoDB request meter with the cost-per-delivery measurement built on it.

pub mod app;
#[cfg(all(test, feature = "aws"))]
mod cost;
pub mod farm;
#[cfg(feature = "aws")]
pub mod meter;
