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
    /// An endpoint's lane limits changed (cap, rate limit).
    async fn update_lane(
        &self,
        endpoint: &crate::domain::EndpointId,
        max_in_flight: u32,
        rate_limit_per_second: Option<u32>,
    );
}
