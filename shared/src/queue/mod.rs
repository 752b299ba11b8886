//! The Queue port: how a pending delivery gets to a sender at its due time.

use async_trait::async_trait;

use crate::store::PendingRef;

pub mod embedded;
pub mod fan_out;
#[cfg(feature = "aws")]
pub mod sqs;
pub mod window;

#[derive(Debug, thiserror::Error)]
#[error("queue failure: {0}")]
pub struct QueueError(pub String);

#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// Schedules deliveries for their due time. Enqueueing one that is already queued is harmless.
    async fn enqueue(&self, items: Vec<PendingRef>) -> Result<(), QueueError>;
    /// [`Queue::enqueue`] for deliveries a replay made pending again. One whose last attempt
    /// ended it a moment ago may still be held by that attempt's worker: it is queued once
    /// the worker lets go, not dropped as already queued.
    async fn enqueue_replayed(&self, items: Vec<PendingRef>) -> Result<(), QueueError> {
        self.enqueue(items).await
    }
    /// An endpoint's lane limits changed (cap, rate limit).
    async fn update_lane(
        &self,
        endpoint: &crate::domain::EndpointId,
        max_in_flight: u32,
        rate_limit_per_second: Option<u32>,
    );
}
