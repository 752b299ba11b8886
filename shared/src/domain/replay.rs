//! Replays: a person asks for final deliveries to be sent again. Each request is kept as an
//! audit record of who asked, when, for what, and how many deliveries it touched.

use super::{
    delivery::DeliveryStatus,
    event::EventType,
    ids::{AccountId, DeliveryId, EndpointId, ReplayId},
    InvalidField,
};
use crate::clock::Timestamp;

/// What a replay was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayScope {
    /// One delivery, whatever its final status.
    Delivery(DeliveryId),
    /// "Resend since T": the endpoint's deliveries that match the filter.
    Endpoint(EndpointId),
}

/// Which deliveries of the scope are replayed. Only final statuses can be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayFilter {
    /// Deliveries created at or after this time.
    pub since: Option<Timestamp>,
    /// Deliveries created before this time.
    pub until: Option<Timestamp>,
    pub statuses: Vec<DeliveryStatus>,
    /// Empty means every event type.
    pub event_types: Vec<EventType>,
}

impl ReplayFilter {
    /// Any final status: a single replay may resend even a delivered event.
    pub fn single() -> Self {
        Self {
            since: None,
            until: None,
            statuses: vec![
                DeliveryStatus::Delivered,
                DeliveryStatus::Failed,
                DeliveryStatus::Abandoned,
            ],
            event_types: Vec::new(),
        }
    }

    /// A bulk filter; statuses default to failed and abandoned.
    pub fn bulk(
        since: Timestamp,
        until: Option<Timestamp>,
        statuses: Option<Vec<DeliveryStatus>>,
        event_types: Vec<EventType>,
    ) -> Result<Self, InvalidField> {
        if until.is_some_and(|until| until <= since) {
            return Err(InvalidField::new("until", "must be later than `since`"));
        }
        let statuses =
            statuses.unwrap_or_else(|| vec![DeliveryStatus::Failed, DeliveryStatus::Abandoned]);
        if statuses.is_empty() {
            return Err(InvalidField::new("statuses", "name at least one status"));
        }
        if statuses.contains(&DeliveryStatus::Pending) {
            return Err(InvalidField::new(
                "statuses",
                "pending deliveries are still being tried; replay delivered, failed or abandoned ones",
            ));
        }
        let mut unique = Vec::with_capacity(statuses.len());
        for status in statuses {
            if !unique.contains(&status) {
                unique.push(status);
            }
        }
        Ok(Self {
            since: Some(since),
            until,
            statuses: unique,
            event_types,
        })
    }
}

/// One replay request, as the audit trail keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub id: ReplayId,
    pub account_id: AccountId,
    /// `admin` or `token:<token id>`.
    pub actor: String,
    pub scope: ReplayScope,
    pub filter: ReplayFilter,
    pub requested_at: Timestamp,
    /// Deliveries put back in the queue.
    pub count: u32,
    /// More deliveries matched than one request replays; asking again continues.
    pub more: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_millis;

    #[test]
    fn bulk_filter_defaults_to_failed_and_abandoned() {
        let filter = ReplayFilter::bulk(from_millis(0), None, None, vec![]).unwrap();
        assert_eq!(
            filter.statuses,
            vec![DeliveryStatus::Failed, DeliveryStatus::Abandoned]
        );
    }

    #[test]
    fn bulk_filter_refuses_what_cannot_be_replayed() {
        let since = from_millis(10_000);
        let err = ReplayFilter::bulk(since, Some(from_millis(10_000)), None, vec![]).unwrap_err();
        assert_eq!(err.field, "until");
        let err = ReplayFilter::bulk(since, None, Some(vec![DeliveryStatus::Pending]), vec![])
            .unwrap_err();
        assert_eq!(err.field, "statuses");
        let err = ReplayFilter::bulk(since, None, Some(vec![]), vec![]).unwrap_err();
        assert_eq!(err.field, "statuses");
        let deduped = ReplayFilter::bulk(
            since,
            None,
            Some(vec![DeliveryStatus::Failed, DeliveryStatus::Failed]),
            vec![],
        )
        .unwrap();
        assert_eq!(deduped.statuses, vec![DeliveryStatus::Failed]);
    }
}
