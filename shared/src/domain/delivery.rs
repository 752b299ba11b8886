use serde::Serialize;
use sha2::{Digest, Sha256};

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

impl DeliveryId {
    /// The one id a delivery of an event to an endpoint has: a hash of (account, event,
    /// endpoint), so a repeated fan-out finds the delivery it made, and the store can find an
    /// event's deliveries from the account's endpoints without an index.
    pub fn derived(account: &AccountId, event: &EventId, endpoint: &EndpointId) -> Self {
        let digest = Sha256::new()
            .chain_update(account.as_str())
            .chain_update([0])
            .chain_update(event.as_str())
            .chain_update([0])
            .chain_update(endpoint.as_str())
            .finalize();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        Self::from_trusted(format!("dlv_{hex}"))
    }
}

impl Delivery {
    /// A new pending delivery, with the id derived from its (account, event, endpoint).
    pub fn new_pending(
        event_id: EventId,
        endpoint_id: EndpointId,
        account_id: AccountId,
        event_type: EventType,
        now: Timestamp,
    ) -> Self {
        Self {
            id: DeliveryId::derived(&account_id, &event_id, &endpoint_id),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_id_is_the_one_fan_out_derives() {
        let event = crate::domain::Event::new(
            EventId::parse("evt_1").unwrap(),
            AccountId::parse("acme").unwrap(),
            EventType::parse("invoice.paid").unwrap(),
            crate::clock::from_millis(0),
            &serde_json::json!({}),
        )
        .unwrap();
        let endpoint = EndpointId::parse("ep_1").unwrap();
        let delivery = Delivery::new_pending(
            event.id.clone(),
            endpoint.clone(),
            event.account_id.clone(),
            event.event_type.clone(),
            event.created_at,
        );
        assert_eq!(
            delivery.id,
            crate::service::fan_out::delivery_id_for(&event, &endpoint)
        );
        let other = EndpointId::parse("ep_2").unwrap();
        assert_ne!(
            delivery.id,
            DeliveryId::derived(&event.account_id, &event.id, &other)
        );
    }
}
