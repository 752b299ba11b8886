//! Per-endpoint in-flight slots and rate limits shared by concurrent senders.
//!
//! On AWS the queue pushes work at any number of sender instances, so the endpoint's
//! in-flight cap is kept outside them: a sender takes a slot lease before it POSTs and
//! gives it back after. A lease runs out by itself (request deadline + margin), so a
//! sender that crashes while holding one never blocks the endpoint for longer than that.
//! A sender with several messages for one endpoint takes (and gives back) their slots
//! together, so the shared record is written once per batch rather than once per message.

use std::time::Duration;

use async_trait::async_trait;

use crate::{
    clock::Timestamp,
    domain::{DeliveryId, EndpointId},
};

#[cfg(feature = "aws")]
pub mod dynamodb;

#[derive(Debug, thiserror::Error)]
#[error("slot lease failure: {0}")]
pub struct SlotError(pub String);

/// Proof of holding one in-flight slot of an endpoint, needed to give it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotToken {
    pub endpoint: EndpointId,
    pub holder: String,
}

#[async_trait]
pub trait SlotLeases: Send + Sync + 'static {
    /// Takes one of the endpoint's `cap` slots for at most `lease_for`; `None` when all are
    /// held by live leases.
    async fn acquire(
        &self,
        endpoint: &EndpointId,
        cap: u32,
        lease_for: Duration,
    ) -> Result<Option<SlotToken>, SlotError>;

    /// Gives a slot back early. Releasing an expired or unknown token is harmless.
    async fn release(&self, token: &SlotToken) -> Result<(), SlotError>;

    /// Takes up to `wanted` of the endpoint's `cap` slots together (a sender with several
    /// messages for one endpoint): as many as are free, perhaps none.
    async fn acquire_many(
        &self,
        endpoint: &EndpointId,
        cap: u32,
        wanted: u32,
        lease_for: Duration,
    ) -> Result<Vec<SlotToken>, SlotError>;

    /// Gives slots back together. Releasing expired or unknown tokens is harmless.
    async fn release_many(&self, tokens: &[SlotToken]) -> Result<(), SlotError>;

    /// When each live lease on the endpoint's slots runs out, earliest first (when a busy
    /// endpoint's next slot frees at the latest).
    async fn live_leases(&self, endpoint: &EndpointId) -> Result<Vec<Timestamp>, SlotError>;

    /// Lists deliveries that found every slot of the endpoint held, each with the time its
    /// re-queued message comes back, so that a holder with time left on its lease can take
    /// them meanwhile instead of letting the endpoint idle. A hint only: at most
    /// [`WAITING_MAX`] are listed, and a delivery left off still has its message.
    async fn wait(
        &self,
        endpoint: &EndpointId,
        waiting: &[(DeliveryId, Timestamp)],
    ) -> Result<(), SlotError>;

    /// Takes one listed delivery whose message comes back no earlier than `not_before` off
    /// the endpoint's waiting list (an attempt started now is over before its message is
    /// back), dropping the entries whose messages are back already. Each entry is taken
    /// once, whoever asks.
    async fn take_waiting(
        &self,
        endpoint: &EndpointId,
        not_before: Timestamp,
    ) -> Result<Option<DeliveryId>, SlotError>;
}

/// How many deliveries an endpoint's waiting list holds: enough to keep a slot busy for a
/// hold of slow attempts, few enough that the slot record stays within one write unit.
pub const WAITING_MAX: usize = 10;

#[async_trait]
pub trait RateLimiter: Send + Sync + 'static {
    /// Takes one token from the endpoint's bucket (refilled at `per_second`, holding at most
    /// `per_second`); false when the bucket is empty.
    async fn try_take(&self, endpoint: &EndpointId, per_second: u32) -> Result<bool, SlotError>;
}

/// How long a slot lease lasts: the request deadline plus a margin for the bookkeeping
/// around it (load, record, release).
pub fn lease_for(request_deadline: Duration) -> Duration {
    request_deadline + Duration::from_secs(5)
}
