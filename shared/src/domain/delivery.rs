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

/// The deliveries of `event` to those of `endpoints` that receive it (see
/// [`Endpoint::receives`](crate::domain::Endpoint::receives)), created at
/// `now`, each beside its endpoint: who gets an event, decided in one place.
pub fn deliveries_to<'a>(
    event: &crate::domain::Event,
    endpoints: &'a [crate::domain::Endpoint],
    now: Timestamp,
) -> Vec<(&'a crate::domain::Endpoint, Delivery)> {
    endpoints
        .iter()
        .filter(|endpoint| endpoint.receives(event))
        .map(|endpoint| {
            (
                endpoint,
                Delivery::new_pending(event, endpoint.id.clone(), now),
            )
        })
        .collect()
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
    /// When the message a busy endpoint sent back is expected (AWS shape): until then the
    /// sweeper does not take the delivery for lost. Its next try is not moved by it: a copy
    /// that finds a slot free earlier may go ahead.
    #[serde(skip)]
    pub queued_until: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Hex digits of a delivery id's endpoint part and of its (event, endpoint) part.
const PART_HEX: usize = 16;
/// Hex digits of a delivery id's time part (milliseconds; enough until the year 10889).
const TIME_HEX: usize = 12;
const DELIVERY_PREFIX: &str = "dlv_";

fn hex_of_hash(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hasher.update([0]);
        }
        hasher.update(part.as_bytes());
    }
    hex::encode(&hasher.finalize()[..PART_HEX / 2])
}

/// A delivery id's endpoint part: the same for every delivery to one endpoint of one
/// account. The AWS store partitions an endpoint's delivery log by it.
pub fn delivery_log_partition(account: &AccountId, endpoint: &EndpointId) -> String {
    hex_of_hash(&[account.as_str(), endpoint.as_str()])
}

/// What every id of a log partition starts with.
pub fn delivery_log_prefix(partition: &str) -> String {
    format!("{DELIVERY_PREFIX}{partition}")
}

/// A time as delivery ids carry it after their endpoint part: `TIME_HEX` hex digits of
/// milliseconds. Times outside what they hold (before 1970, after the year 10889) are taken
/// as the nearest end.
pub fn delivery_log_time(at: Timestamp) -> String {
    const LATEST: i64 = (1 << (4 * TIME_HEX)) - 1;
    let millis = crate::clock::to_millis(at).clamp(0, LATEST);
    format!("{millis:0width$x}", width = TIME_HEX)
}

/// Where deliveries of events created at `at` start in a log partition's order: ids of a
/// partition sort by their event's time, then by the rest of the id.
pub fn delivery_log_position(partition: &str, at: Timestamp) -> String {
    format!(
        "{}{}",
        delivery_log_prefix(partition),
        delivery_log_time(at)
    )
}

impl DeliveryId {
    /// The one id a delivery of an event to an endpoint has, so a repeated fan-out finds the
    /// delivery it made and the store can find an event's deliveries from the account's
    /// endpoints without an index: `dlv_`, then the endpoint part
    /// (`delivery_log_partition`), the event's creation time in hex milliseconds, and a hash
    /// of (account, event, endpoint). Deliveries to one endpoint share the prefix and sort
    /// by their event's time.
    pub fn derived(
        account: &AccountId,
        event: &EventId,
        event_created: Timestamp,
        endpoint: &EndpointId,
    ) -> Self {
        let mut id =
            delivery_log_position(&delivery_log_partition(account, endpoint), event_created);
        id.push_str(&hex_of_hash(&[
            account.as_str(),
            event.as_str(),
            endpoint.as_str(),
        ]));
        Self::from_trusted(id)
    }

    /// The endpoint part of a derived id (`delivery_log_partition`); `None` for a string of
    /// another shape (an id given from outside that no delivery can have).
    pub fn log_partition(&self) -> Option<&str> {
        let rest = self.as_str().strip_prefix(DELIVERY_PREFIX)?;
        let well_formed = rest.len() == 2 * PART_HEX + TIME_HEX
            && rest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        well_formed.then(|| &rest[..PART_HEX])
    }

    /// The event time a derived id carries, as `delivery_log_time` writes it.
    pub fn log_time(&self) -> Option<&str> {
        self.log_partition()?;
        let start = DELIVERY_PREFIX.len() + PART_HEX;
        Some(&self.as_str()[start..start + TIME_HEX])
    }
}

impl Delivery {
    /// A new pending delivery of `event` to an endpoint, due `now`, with the id derived from
    /// (account, event, endpoint). Its creation time is the event's: that is where it sits
    /// in the endpoint's log however late the fan-out runs.
    pub fn new_pending(
        event: &crate::domain::Event,
        endpoint_id: EndpointId,
        now: Timestamp,
    ) -> Self {
        Self::pending(
            &event.account_id,
            &event.id,
            &event.event_type,
            event.created_at,
            endpoint_id,
            now,
        )
    }

    /// The delivery an endpoint never had of an event it missed while disabled, created on
    /// a person's request: due `now`, its first attempt manual. Its id and place in the log
    /// are the ones the fan-out would have given it.
    pub fn recovered(
        missed: &crate::domain::MissedEvent,
        endpoint_id: EndpointId,
        now: Timestamp,
    ) -> Self {
        Self {
            next_trigger: Trigger::Manual,
            ..Self::pending(
                &missed.account_id,
                &missed.id,
                &missed.event_type,
                missed.created_at,
                endpoint_id,
                now,
            )
        }
    }

    fn pending(
        account_id: &AccountId,
        event_id: &EventId,
        event_type: &EventType,
        created_at: Timestamp,
        endpoint_id: EndpointId,
        now: Timestamp,
    ) -> Self {
        Self {
            id: DeliveryId::derived(account_id, event_id, created_at, &endpoint_id),
            event_id: event_id.clone(),
            endpoint_id,
            account_id: account_id.clone(),
            event_type: event_type.clone(),
            status: DeliveryStatus::Pending,
            attempts: 0,
            next_try_at: Some(now),
            last_status: None,
            last_error: None,
            client_error_count: 0,
            schedule_start: 0,
            next_trigger: Trigger::Scheduled,
            queued_until: None,
            created_at,
            updated_at: now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{clock::from_millis, domain::Event};

    fn event(id: &str, created_millis: i64) -> Event {
        Event::new(
            EventId::parse(id).unwrap(),
            AccountId::parse("acme").unwrap(),
            EventType::parse("invoice.paid").unwrap(),
            from_millis(created_millis),
            &serde_json::json!({}),
        )
        .unwrap()
    }

    /// Who gets an event: the active endpoints subscribed to its type that existed when it
    /// was published, allowing a second for clocks apart, to the millisecond the stores keep.
    #[test]
    fn an_event_goes_to_the_active_endpoints_that_existed_when_it_was_published() {
        use crate::fixtures::endpoint;
        let published = 1_700_000_000_000;
        let event = event("evt_1", published);
        let at = |offset: i64| from_millis(published + offset);
        let mut disabled = endpoint("acme", "ep_disabled", at(-1));
        disabled.status = crate::domain::EndpointStatus::Disabled;
        let endpoints = [
            endpoint("acme", "ep_before", at(-60_000)),
            // The last millisecond the allowance covers, half of it gone: the stores keep
            // milliseconds.
            endpoint(
                "acme",
                "ep_within",
                at(999) + chrono::TimeDelta::microseconds(500),
            ),
            endpoint("acme", "ep_after", at(1_000)),
            disabled,
        ];
        let to: Vec<&str> = deliveries_to(&event, &endpoints, at(5))
            .iter()
            .map(|(endpoint, _)| endpoint.id.as_str())
            .collect();
        assert_eq!(to, ["ep_before", "ep_within"]);
    }

    #[test]
    fn a_delivery_id_is_the_one_fan_out_derives() {
        let event = event("evt_1", 0);
        let endpoint = EndpointId::parse("ep_1").unwrap();
        let delivery = Delivery::new_pending(&event, endpoint.clone(), from_millis(5));
        assert_eq!(
            delivery.id,
            crate::service::fan_out::delivery_id_for(&event, &endpoint)
        );
        assert_eq!(delivery.created_at, event.created_at);
        let other = EndpointId::parse("ep_2").unwrap();
        assert_ne!(
            delivery.id,
            DeliveryId::derived(&event.account_id, &event.id, event.created_at, &other)
        );
    }

    #[test]
    fn ids_to_one_endpoint_share_its_partition_and_sort_by_event_time() {
        let endpoint = EndpointId::parse("ep_1").unwrap();
        let earlier = Delivery::new_pending(
            &event("evt_b", 1_700_000_000_000),
            endpoint.clone(),
            from_millis(0),
        );
        let later = Delivery::new_pending(
            &event("evt_a", 1_700_000_000_001),
            endpoint.clone(),
            from_millis(0),
        );
        let partition = delivery_log_partition(&earlier.account_id, &endpoint);
        assert_eq!(earlier.id.log_partition(), Some(partition.as_str()));
        assert_eq!(later.id.log_partition(), Some(partition.as_str()));
        assert!(earlier.id < later.id);
        assert!(earlier.id.log_time() < later.id.log_time());
        let start = delivery_log_position(&partition, from_millis(1_700_000_000_001));
        assert!(earlier.id.as_str() < start.as_str() && start.as_str() < later.id.as_str());
        let elsewhere = EndpointId::parse("ep_2").unwrap();
        assert_ne!(
            delivery_log_partition(&earlier.account_id, &elsewhere),
            partition
        );
    }

    #[test]
    fn event_times_out_of_range_still_give_well_formed_ids() {
        let endpoint = EndpointId::parse("ep_1").unwrap();
        let account = AccountId::parse("acme").unwrap();
        for at in [
            chrono::DateTime::<chrono::Utc>::MIN_UTC,
            from_millis(-1),
            chrono::DateTime::<chrono::Utc>::MAX_UTC,
        ] {
            let id =
                DeliveryId::derived(&account, &EventId::parse("evt_1").unwrap(), at, &endpoint);
            assert!(id.log_partition().is_some(), "{id} for {at}");
        }
    }

    /// A delivery's id is its identity in the store: a fan-out run again finds the delivery
    /// it made by it, so the derivation must never change under stored data.
    #[test]
    fn a_derived_id_is_the_same_in_every_version() {
        let id = DeliveryId::derived(
            &AccountId::parse("acme").unwrap(),
            &EventId::parse("evt_1").unwrap(),
            from_millis(1_764_921_600_123),
            &EndpointId::parse("ep_1").unwrap(),
        );
        // sha256("acme\0ep_1")[..8], the time in hex ms, sha256("acme\0evt_1\0ep_1")[..8].
        assert_eq!(
            id.as_str(),
            "dlv_c15b2d78ea1aacac019aed86687b17c5260f043cd7e6"
        );
    }

    #[test]
    fn ids_of_another_shape_have_no_partition() {
        for raw in ["dlv_1", "evt_0123", "dlv_ad28994910d8e00baa40d426671e2e63"] {
            assert_eq!(
                DeliveryId::from_trusted(raw.into()).log_partition(),
                None,
                "{raw}"
            );
        }
        let upper = format!("dlv_{}", "A".repeat(44));
        assert_eq!(DeliveryId::from_trusted(upper).log_partition(), None);
    }
}
