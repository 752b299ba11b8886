//! The `hooklane` binary's parts: configuration, `serve`, `verify`, and the fake endpoint farm.

pub mod config;
pub mod farm;
pub mod serve;
pub mod verify;
