//! The pure domain: no I/O, no clocks, no randomness that the caller does not pass in.

pub mod access;
pub mod account;
pub mod attempt;
pub mod audit;
pub mod catalog;
pub mod delivery;
pub mod endpoint;
pub mod event;
pub mod headers;
pub mod health;
pub mod ids;
pub mod json_schema;
pub mod outcome;
pub mod rate;
pub mod replay;
pub mod schedule;
pub mod stats;

pub use access::{ApiKey, ApiKeyId, Denied, Principal, Scope};
pub use account::{Account, EmailAddress};
pub use attempt::{Attempt, KeptResponse, Trigger};
pub use audit::{Actor, AuditAction, AuditEntry, AuditId, AuditTarget, Caller, TargetKind};
pub use catalog::EventTypeDef;
pub use delivery::{
    deliveries_to, delivery_log_partition, delivery_log_position, delivery_log_prefix,
    delivery_log_time, Delivery, DeliveryStatus,
};
pub use endpoint::{
    by_id as endpoints_by_id, Endpoint, EndpointStatus, EndpointUrl, EndpointVersion,
    EventTypeFilter,
};
pub use event::{Event, EventConflict, EventType, MissedEvent};
pub use ids::{AccountId, DeliveryId, EndpointId, EventId, ReplayId};
pub use outcome::{AttemptOutcome, Decision, DeliveryUpdate, RetryPolicy};
pub use replay::{Replay, ReplayCandidate, ReplayFilter, ReplayScope};
pub use schedule::RetrySchedule;
pub use stats::{EndpointStats, HourCount, LastFailure};

/// Input that does not fit the domain, naming the field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidField {
    /// The field's name, or its path (`headers.x-tenant`).
    pub field: std::borrow::Cow<'static, str>,
    pub message: String,
}

impl InvalidField {
    pub fn new(
        field: impl Into<std::borrow::Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}
