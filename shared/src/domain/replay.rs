//! Replays: a person asks for final deliveries to be sent again. Each request is kept as an
//! audit record of who asked, when, for what, and how many deliveries it touched.

use super::{
    delivery::DeliveryStatus,
    endpoint::{Endpoint, EndpointStatus},
    event::{EventType, MissedEvent},
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
    /// Also create the deliveries the endpoint never had: events of its types published in
    /// the window while it was disabled (endpoint scope only, on request).
    pub include_missed: bool,
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
            include_missed: false,
        }
    }

    /// A bulk filter; statuses default to failed and abandoned.
    pub fn bulk(
        since: Timestamp,
        until: Option<Timestamp>,
        statuses: Option<Vec<DeliveryStatus>>,
        event_types: Vec<EventType>,
        include_missed: bool,
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
            include_missed,
        })
    }

    /// Whether something created at `created_at` is in the window: in milliseconds, as the
    /// stores keep times, so a `since` taken a fraction of a millisecond before a publish
    /// still covers it.
    pub fn covers(&self, created_at: Timestamp) -> bool {
        self.since
            .is_none_or(|since| to_millis(created_at) >= to_millis(since))
            && self
                .until
                .is_none_or(|until| to_millis(created_at) < to_millis(until))
    }

    /// Whether an event of this type is asked for.
    fn names(&self, event_type: &EventType) -> bool {
        self.event_types.is_empty() || self.event_types.contains(event_type)
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
    /// Deliveries created for events the endpoint missed while disabled (`include_missed`),
    /// counted apart from `count`.
    pub missed: u32,
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
            && filter.names(candidate.event_type)
            && filter.covers(candidate.created_at)
    }

    /// Whether this replay creates the delivery `endpoint` never had of an event it missed
    /// while disabled: asked for, in scope, active now, subscribed to the type and existing
    /// when it was published, and in the window. The store's list of missed events may hold
    /// events another endpoint missed, or ones this endpoint has a delivery of; adding a
    /// delivery only where none exists covers the second.
    pub fn recovers(&self, endpoint: &Endpoint, missed: &MissedEvent) -> bool {
        let filter = &self.filter;
        filter.include_missed
            && matches!(&self.scope, ReplayScope::Endpoint(id) if *id == endpoint.id)
            && endpoint.account_id == self.account_id
            && missed.account_id == self.account_id
            && endpoint.status == EndpointStatus::Active
            && endpoint.subscribed_at(&missed.event_type, missed.created_at)
            && filter.names(&missed.event_type)
            && filter.covers(missed.created_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_millis;

    #[test]
    fn bulk_filter_defaults_to_failed_and_abandoned() {
        let filter = ReplayFilter::bulk(from_millis(0), None, None, vec![], false).unwrap();
        assert_eq!(
            filter.statuses,
            vec![DeliveryStatus::Failed, DeliveryStatus::Abandoned]
        );
    }

    #[test]
    fn bulk_filter_refuses_what_cannot_be_replayed() {
        let since = from_millis(10_000);
        let err =
            ReplayFilter::bulk(since, Some(from_millis(10_000)), None, vec![], false).unwrap_err();
        assert_eq!(err.field, "until");
        let err = ReplayFilter::bulk(
            since,
            None,
            Some(vec![DeliveryStatus::Pending]),
            vec![],
            false,
        )
        .unwrap_err();
        assert_eq!(err.field, "statuses");
        let err = ReplayFilter::bulk(since, None, Some(vec![]), vec![], false).unwrap_err();
        assert_eq!(err.field, "statuses");
        let deduped = ReplayFilter::bulk(
            since,
            None,
            Some(vec![DeliveryStatus::Failed, DeliveryStatus::Failed]),
            vec![],
            false,
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
            false,
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
            missed: 0,
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

    #[test]
    fn a_resend_recovers_only_what_the_endpoint_missed_in_its_window() {
        use crate::domain::{EndpointStatus, EventTypeFilter};
        use crate::fixtures::{at, endpoint, typed_event};
        let mut receiver = endpoint("acme", "ep_main", at(100));
        receiver.event_types = EventTypeFilter::parse(Some(&["invoice.*".to_owned()])).unwrap();
        let paid = typed_event("acme", "evt_paid", "invoice.paid", at(150)).as_missed();
        let filter = |include_missed| {
            ReplayFilter::bulk(at(120), Some(at(200)), None, vec![], include_missed).unwrap()
        };
        let replay = Replay {
            id: ReplayId::from_trusted("rpl_1".into()),
            account_id: receiver.account_id.clone(),
            actor: "admin".into(),
            scope: ReplayScope::Endpoint(receiver.id.clone()),
            filter: filter(true),
            requested_at: at(300),
            count: 0,
            missed: 0,
            more: false,
        };
        assert!(replay.recovers(&receiver, &paid));
        // Not asked for; another endpoint's scope; disabled still; another account's event.
        let not_asked = Replay {
            filter: filter(false),
            ..replay.clone()
        };
        assert!(!not_asked.recovers(&receiver, &paid));
        let other = endpoint("acme", "ep_other", at(100));
        assert!(!replay.recovers(&other, &paid));
        let disabled = Endpoint {
            status: EndpointStatus::Disabled,
            ..receiver.clone()
        };
        assert!(!replay.recovers(&disabled, &paid));
        let elsewhere = typed_event("beta", "evt_paid", "invoice.paid", at(150)).as_missed();
        assert!(!replay.recovers(&receiver, &elsewhere));
        // A type it does not subscribe to, or one the filter leaves out.
        let created = typed_event("acme", "evt_user", "user.created", at(150)).as_missed();
        assert!(!replay.recovers(&receiver, &created));
        let only_refunds = Replay {
            filter: ReplayFilter {
                event_types: vec![EventType::parse("invoice.refunded").unwrap()],
                ..filter(true)
            },
            ..replay.clone()
        };
        assert!(!only_refunds.recovers(&receiver, &paid));
        // Outside the window, or published before the endpoint existed.
        for second in [119, 200] {
            let outside = typed_event("acme", "evt_x", "invoice.paid", at(second)).as_missed();
            assert!(!replay.recovers(&receiver, &outside), "{second}");
        }
        let younger = endpoint("acme", "ep_main", at(151));
        let younger = Endpoint {
            event_types: receiver.event_types.clone(),
            ..younger
        };
        assert!(!replay.recovers(&younger, &paid));
    }

    #[test]
    fn an_event_is_missed_when_a_disabled_subscriber_would_have_had_it() {
        use crate::domain::{EndpointStatus, EventTypeFilter};
        use crate::fixtures::{at, endpoint, typed_event};
        let event = typed_event("acme", "evt_1", "invoice.paid", at(150));
        let active = endpoint("acme", "ep_on", at(100));
        let disabled = Endpoint {
            status: EndpointStatus::Disabled,
            ..endpoint("acme", "ep_off", at(100))
        };
        assert!(!event.missed_by_any(std::slice::from_ref(&active)));
        assert!(event.missed_by_any(&[active.clone(), disabled.clone()]));
        let other_types = Endpoint {
            event_types: EventTypeFilter::parse(Some(&["user.*".to_owned()])).unwrap(),
            ..disabled.clone()
        };
        assert!(!event.missed_by_any(&[other_types]));
        let created_later = Endpoint {
            created_at: at(151),
            ..disabled
        };
        assert!(!event.missed_by_any(&[created_later]));
    }
}
