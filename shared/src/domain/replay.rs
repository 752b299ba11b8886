//! Replays: a person asks for final deliveries to be sent again. Each request is kept as an
//! audit record of who asked, when, for what, and how many deliveries it touched.

use super::{
    delivery::DeliveryStatus,
    event::EventType,
    ids::{AccountId, DeliveryId, EndpointId, ReplayId},
    InvalidField,
};
use crate::clock::{to_millis, Timestamp};

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

/// A delivery as a replay's rule sees it.
#[derive(Debug, Clone, Copy)]
pub struct ReplayCandidate<'a> {
    pub delivery_id: &'a DeliveryId,
    pub endpoint_id: &'a EndpointId,
    pub account_id: &'a AccountId,
    pub status: DeliveryStatus,
    pub event_type: &'a EventType,
    pub created_at: Timestamp,
    /// A disabled or deleted endpoint gets nothing sent again until it is enabled.
    pub endpoint_active: bool,
    /// Its event is still stored: one removed by retention cannot be sent again.
    pub event_kept: bool,
}

impl Replay {
    /// Whether this replay sends the delivery again: the one rule of eligibility, which
    /// every store applies to the deliveries of the scope it reads.
    pub fn selects(&self, candidate: &ReplayCandidate<'_>) -> bool {
        let filter = &self.filter;
        let in_scope = match &self.scope {
            ReplayScope::Delivery(id) => candidate.delivery_id == id,
            ReplayScope::Endpoint(id) => candidate.endpoint_id == id,
        };
        in_scope
            && *candidate.account_id == self.account_id
            && candidate.endpoint_active
            && candidate.event_kept
            && candidate.status.is_final()
            && filter.statuses.contains(&candidate.status)
            && (filter.event_types.is_empty() || filter.event_types.contains(candidate.event_type))
            // In milliseconds, as the stores keep times: a `since` taken a fraction of a
            // millisecond before a publish still covers it.
            && filter
                .since
                .is_none_or(|since| to_millis(candidate.created_at) >= to_millis(since))
            && filter
                .until
                .is_none_or(|until| to_millis(candidate.created_at) < to_millis(until))
    }
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

    #[test]
    fn a_replay_selects_only_what_every_clause_allows() {
        let account = AccountId::from_trusted("acme".into());
        let other = AccountId::from_trusted("other".into());
        let endpoint = EndpointId::from_trusted("ep_main".into());
        let elsewhere = EndpointId::from_trusted("ep_other".into());
        let delivery = DeliveryId::from_trusted("dlv_1".into());
        let paid = EventType::parse("invoice.paid").unwrap();
        let created = EventType::parse("user.created").unwrap();
        let filter = ReplayFilter::bulk(
            from_millis(10_000),
            Some(from_millis(20_000)),
            None,
            vec![paid.clone()],
        )
        .unwrap();
        let replay = Replay {
            id: ReplayId::from_trusted("rpl_1".into()),
            account_id: account.clone(),
            actor: "admin".into(),
            scope: ReplayScope::Endpoint(endpoint.clone()),
            filter,
            requested_at: from_millis(30_000),
            count: 0,
            more: false,
        };
        let eligible = ReplayCandidate {
            delivery_id: &delivery,
            endpoint_id: &endpoint,
            account_id: &account,
            status: DeliveryStatus::Failed,
            event_type: &paid,
            created_at: from_millis(10_000),
            endpoint_active: true,
            event_kept: true,
        };
        assert!(replay.selects(&eligible));
        let refused = [
            ReplayCandidate {
                endpoint_id: &elsewhere,
                ..eligible
            },
            ReplayCandidate {
                account_id: &other,
                ..eligible
            },
            ReplayCandidate {
                status: DeliveryStatus::Pending,
                ..eligible
            },
            ReplayCandidate {
                status: DeliveryStatus::Delivered,
                ..eligible
            },
            ReplayCandidate {
                event_type: &created,
                ..eligible
            },
            ReplayCandidate {
                created_at: from_millis(9_999),
                ..eligible
            },
            ReplayCandidate {
                created_at: from_millis(20_000),
                ..eligible
            },
            ReplayCandidate {
                endpoint_active: false,
                ..eligible
            },
            ReplayCandidate {
                event_kept: false,
                ..eligible
            },
        ];
        for candidate in &refused {
            assert!(!replay.selects(candidate), "{candidate:?}");
        }
        // A `since` a fraction of a millisecond into the delivery's millisecond covers it.
        let within_the_millisecond = Replay {
            filter: ReplayFilter {
                since: Some(from_millis(10_000) + chrono::Duration::microseconds(500)),
                ..replay.filter.clone()
            },
            ..replay.clone()
        };
        assert!(within_the_millisecond.selects(&eligible));
        let single = Replay {
            scope: ReplayScope::Delivery(delivery.clone()),
            filter: ReplayFilter::single(),
            ..replay
        };
        assert!(single.selects(&ReplayCandidate {
            status: DeliveryStatus::Delivered,
            created_at: from_millis(0),
            event_type: &created,
            ..eligible
        }));
        let another = DeliveryId::from_trusted("dlv_2".into());
        assert!(!single.selects(&ReplayCandidate {
            delivery_id: &another,
            ..eligible
        }));
    }
}
