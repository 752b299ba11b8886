//! The `hooklane` binary's parts: configuration, `serve`, `receive`, `verify`, and the fake endpoint farm.

pub mod config;
pub mod farm;
pub mod receive;
pub mod serve;
pub mod verify;
