//! The `hooklane` binary's parts: configuration, `serve`, `receive`, `verify`, `bench`, and the fake endpoint farm.

pub mod bench;
pub mod config;
pub mod farm;
pub mod receive;
pub mod serve;
#[cfg(feature = "aws")]
pub mod serve_aws;
pub mod verify;
