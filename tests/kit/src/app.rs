//! An `App` for tests that drive the API alone: an in-memory SQLite store, the embedded
//! queue, mail to the log, and a transport that refuses to send.
#![allow(clippy::expect_used)] // test code: a store that cannot open is a failed test

use std::sync::Arc;

use hooklane::{
    http::{OutboundRequest, OutboundResponse, Transport},
    store::sqlite::SqliteStore,
    App, SystemClock,
};

/// A transport for an `App` that nothing dispatches from: a webhook sent is a failed test.
pub struct NoNetwork;

#[async_trait::async_trait]
impl Transport for NoNetwork {
    async fn post(&self, _: OutboundRequest) -> OutboundResponse {
        panic!("this test's App sends no webhook: nothing dispatches from it")
    }
}

/// The App behind an API-only test, on a fresh in-memory store.
pub fn api_only_app() -> App {
    App {
        transport: Arc::new(NoNetwork),
        ..crate::fixtures::app_on(
            Arc::new(SqliteStore::in_memory().expect("an in-memory SQLite store opens")),
            Arc::new(SystemClock),
        )
    }
}
