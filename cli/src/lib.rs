//! The `hooklane` binary's parts: configuration, `serve`, `receive`, `relay`
//! (feature `relay`) and `bench` (feature `bench`, on the test kit's endpoint farm).

#[cfg(feature = "bench")]
pub mod bench;
pub mod config;
pub mod receive;
#[cfg(feature = "relay")]
pub mod relay;
pub mod serve;
#[cfg(feature = "aws")]
pub mod serve_aws;
