use serde::Serialize;

use super::{
    attempt::Trigger,
    event::EventType,
    ids::{AccountId, DeliveryId, EndpointId, EventId},
};
use crate::clock::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    Pending,
    Delivered,
    Failed,
    Abandoned,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::Abandoned => "abandoned",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "pending" => Some(Self::Pending),
            "delivered" => Some(Self::Delivered),
            "failed" => Some(Self::Failed),
            "abandoned" => Some(Self::Abandoned),
            _ => None,
        }
    }

    pub fn is_final(self) -> bool {
        self != Self::Pending
    }
}

/// One (event, endpoint) pair: the source of truth for whether that event reached that endpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delivery {
    pub id: DeliveryId,
    pub event_id: EventId,
    pub endpoint_id: EndpointId,
    pub account_id: AccountId,
    pub event_type: EventType,
    pub status: DeliveryStatus,
    pub attempts: u32,
    /// When a pending delivery is due; `None` once it is final.
    pub next_try_at: Option<Timestamp>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    /// How many answers were one of the "you are misconfigured" client errors.
    #[serde(skip)]
    pub client_error_count: u32,
    /// Attempts made before the current run of the retry schedule: a replay restarts the
    /// schedule while attempt numbers keep counting.
    pub schedule_start: u32,
    /// What sets off the next attempt: `Manual` after a replay, until that attempt is made.
    pub next_trigger: Trigger,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Delivery {
    pub fn new_pending(
        event_id: EventId,
        endpoint_id: EndpointId,
        account_id: AccountId,
        event_type: EventType,
        now: Timestamp,
    ) -> Self {
        Self {
            id: DeliveryId::generate(),
            event_id,
            endpoint_id,
            account_id,
            event_type,
            status: DeliveryStatus::Pending,
            attempts: 0,
            next_try_at: Some(now),
            last_status: None,
            last_error: None,
            client_error_count: 0,
            schedule_start: 0,
            next_trigger: Trigger::Scheduled,
            created_at: now,
            updated_at: now,
        }
    }
}
