use super::{ServiceError, ServiceResult};
use crate::{
    domain::{
        deliveries_to, Account, AccountId, Delivery, Endpoint, EndpointId, Event, EventId,
        EventType, InvalidField,
    },
    limits::{PublishBuckets, Unlimited},
    store::{EventDeliveries, PageAfter, PendingRef, PublishOutcome, PutEventOutcome, StoreError},
    App, PublishMode,
};

#[derive(Debug, Clone)]
pub struct NewEvent {
    pub id: Option<String>,
    pub event_type: String,
    pub data: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct Published {
    pub event: Event,
    /// Those created (with [`PublishMode::ThroughStream`], those its fan-out creates), all
    /// of them; for an id published before, the first stored ones in endpoint-id order (see
    /// [`first_deliveries`]), or, none stored yet, those its fan-out will create.
    pub deliveries: Vec<Delivery>,
    /// False when the id was published before: nothing new was created.
    pub created: bool,
    /// With an id published before: where the list of its deliveries goes on after
    /// `deliveries`, when the event may have more (the cursor of
    /// `GET …/events/{event}/deliveries`). `None` when `deliveries` are all of them.
    pub next: Option<EndpointId>,
}

impl Published {
    fn created(event: Event, deliveries: Vec<Delivery>) -> Self {
        Self {
            event,
            deliveries,
            created: true,
            next: None,
        }
    }

    /// An id published before, answered with its stored deliveries (`stored`, the first
    /// ones), or, when none were found, the ones its fan-out will create (`planned`: `None`
    /// where the publish writes the deliveries itself). The fan-out may not have run yet (a
    /// client retrying at once), and a cursor past the endpoints looked at would skip the
    /// deliveries it then writes before it; the planned list is whole, and has none.
    fn again(
        event: Event,
        stored: EventDeliveries,
        planned: impl FnOnce(&Event) -> Option<Vec<Delivery>>,
    ) -> Self {
        let planned = stored
            .deliveries
            .is_empty()
            .then(|| planned(&event))
            .flatten();
        let (deliveries, next) = match planned {
            Some(planned) => (planned, None),
            None => (stored.deliveries, stored.next),
        };
        Self {
            event,
            deliveries,
            created: false,
            next,
        }
    }
}

/// Deliveries an event's answer lists at most, and so what an answer for an id published
/// before reads (`api::views::EVENT_DELIVERIES_SHOWN` says why 1,000).
pub const ANSWER_DELIVERIES: u32 = 1_000;

/// Pages [`first_deliveries`] reads at most to find them.
const ANSWER_PAGES: usize = 4;

/// The first of a stored event's deliveries, [`ANSWER_DELIVERIES`] at most in endpoint-id
/// order, and where their list goes on: what a retry is answered with. An event may have
/// 100,000 deliveries, and a retry (a client timed out, an outbox relay restarted) came at
/// the moment the platform was slowest: it reads what it lists, not all of them. A DynamoDB
/// page looks at a bounded number of the account's endpoints, and may find few of an event
/// sent to few of many: the read goes on for [`ANSWER_PAGES`] pages at most (8,000 of the
/// account's endpoints), then answers what it found with the cursor.
async fn first_deliveries(app: &App, event: &Event) -> ServiceResult<EventDeliveries> {
    let mut first = EventDeliveries::default();
    let mut page = PageAfter::first(ANSWER_DELIVERIES);
    for _ in 0..ANSWER_PAGES {
        let read = app.store.event_deliveries(event, &page).await?;
        first.deliveries.extend(read.deliveries);
        first.next = read.next;
        let found = u32::try_from(first.deliveries.len()).unwrap_or(u32::MAX);
        match &first.next {
            Some(next) if found < ANSWER_DELIVERIES => {
                page = PageAfter {
                    after: Some(next.clone()),
                    limit: ANSWER_DELIVERIES - found,
                };
            }
            _ => break,
        }
    }
    Ok(first)
}

/// Records an event, idempotent on its id, and one delivery per endpoint subscribed now. An
/// id already published is answered with the stored event when this is the same event again
/// (a retry: same type, JSON-equal data), and refused (`EventConflict`, nothing written)
/// when it is another: see [`Event::conflict_with`].
/// How depends on `app.publish`: with [`PublishMode::WithDeliveries`] the event and its
/// deliveries are written in one transaction and queued here; with
/// [`PublishMode::ThroughStream`] only the event is written, and the stream's fan-out
/// creates and queues the deliveries listed here (their ids are derived from the event and
/// the endpoint, so the fan-out gives them exactly these).
pub async fn publish(app: &App, account: &AccountId, input: NewEvent) -> ServiceResult<Published> {
    publish_limited(app, &Unlimited, account, input).await
}

/// [`publish`] within the account's publish rate limit: `RateLimited` when it is used up.
pub async fn publish_limited(
    app: &App,
    limits: &dyn PublishBuckets,
    account: &AccountId,
    input: NewEvent,
) -> ServiceResult<Published> {
    let given_id = input.id.is_some();
    let event = new_event(app, account, input, app.clock.now())?;
    let Some(stored) = app.store.get_account(account).await? else {
        return Err(ServiceError::NotFound("account"));
    };
    if let Err(limited) = take_publish_tokens(app, limits, &stored, 1).await {
        // A retry of an event already published is answered as within the limit (200, the
        // first event): a client retrying after a timeout, or the outbox relay after a
        // restart, was refused what it already had, and kept the limit spent. So is another
        // event under a published id (409): waiting would not change that answer.
        if given_id {
            if let Some(answer) = already_published(app, account, &event).await {
                return answer;
            }
        }
        return Err(limited);
    }
    let endpoints = app.store.list_endpoints(account).await?;
    match app.publish {
        PublishMode::WithDeliveries => with_deliveries(app, event, &endpoints).await,
        PublishMode::ThroughStream => through_stream(app, event, &endpoints).await,
    }
}

async fn with_deliveries(
    app: &App,
    event: Event,
    endpoints: &[Endpoint],
) -> ServiceResult<Published> {
    let chosen = deliveries_to(&event, endpoints, event.created_at);
    let published = write_with_deliveries(app, event, chosen).await?;
    mark_missed(app, [&published.event], endpoints).await?;
    Ok(published)
}

/// Marks those of `events` that a disabled endpoint would have received (see
/// [`Event::missed_by_any`]), so that a resend asking for them finds them. Nothing to
/// write for an account whose endpoints are all active. An error is the caller's: the
/// publish is answered with it, and a retry of the same id marks the event again.
pub(super) async fn mark_missed<'a>(
    app: &App,
    events: impl IntoIterator<Item = &'a Event>,
    endpoints: &[Endpoint],
) -> ServiceResult<()> {
    if !endpoints
        .iter()
        .any(|e| e.status != crate::domain::EndpointStatus::Active)
    {
        return Ok(());
    }
    let missed: Vec<Event> = events
        .into_iter()
        .filter(|event| event.missed_by_any(endpoints))
        .cloned()
        .collect();
    if !missed.is_empty() {
        app.store.mark_missed(&missed).await?;
    }
    Ok(())
}

/// Writes the event and these deliveries in one transaction, idempotent on the event's id,
/// then queues the deliveries.
pub(super) async fn write_with_deliveries(
    app: &App,
    event: Event,
    chosen: Vec<(&Endpoint, Delivery)>,
) -> ServiceResult<Published> {
    let now = event.created_at;
    let (receivers, deliveries): (Vec<&Endpoint>, Vec<Delivery>) = chosen.into_iter().unzip();
    let written = super::noted_write(app, app.store.publish(&event, &deliveries)).await;
    match written? {
        PublishOutcome::AlreadyExists { event } => {
            let stored = first_deliveries(app, &event).await?;
            Ok(Published::again(event, stored, |_| None))
        }
        PublishOutcome::Created => {
            let refs = deliveries
                .iter()
                .zip(&receivers)
                .map(|(d, e)| PendingRef::new(d, e, now))
                .collect();
            crate::telemetry::event_published();
            // The event is committed; if the queue fails now, the sweeper picks the rows up.
            if let Err(error) = app.queue.enqueue(refs).await {
                tracing::error!(event.id = %event.id, %error, "enqueue after publish failed; the sweeper will retry");
            }
            Ok(Published::created(event, deliveries))
        }
    }
}

async fn through_stream(
    app: &App,
    event: Event,
    endpoints: &[Endpoint],
) -> ServiceResult<Published> {
    let written = super::noted_write(app, app.store.put_event(&event)).await;
    match written? {
        PutEventOutcome::Created => {
            crate::telemetry::event_published();
            let deliveries = planned_deliveries(&event, endpoints);
            Ok(Published::created(event, deliveries))
        }
        PutEventOutcome::AlreadyExists(event) => {
            let stored = first_deliveries(app, &event).await?;
            Ok(Published::again(event, stored, |event| {
                Some(planned_deliveries(event, endpoints))
            }))
        }
    }
}

/// How a publish of `new` over the publish limit is answered if its id is already published:
/// as a retry within the limit is (the stored event and its first deliveries) if `new` is
/// that event again, with the conflict if it is another; nothing is written. A read that
/// fails leaves the caller its 429, and so does an event none of whose deliveries are
/// stored yet when more are planned than an answer lists: the limit is what bounds a
/// caller's reads, and planning them reads every endpoint of the account.
async fn already_published(
    app: &App,
    account: &AccountId,
    new: &Event,
) -> Option<ServiceResult<Published>> {
    let event = app.store.get_event(account, &new.id).await.ok()??;
    if let Some(conflict) = event.conflict_with(new) {
        return Some(Err(ServiceError::EventConflict(conflict)));
    }
    let stored = first_deliveries(app, &event).await.ok()?;
    let endpoints = if stored.deliveries.is_empty() && app.publish == PublishMode::ThroughStream {
        Some(app.store.list_endpoints(account).await.ok()?)
    } else {
        None
    };
    let answer = Published::again(event, stored, |event| {
        endpoints.map(|endpoints| planned_deliveries(event, &endpoints))
    });
    (answer.deliveries.len() <= ANSWER_DELIVERIES as usize).then_some(Ok(answer))
}

/// Events one batch holds at most.
pub const MAX_BATCH: usize = 100;

/// Publishes up to [`MAX_BATCH`] events of one account at once, each idempotent on its id;
/// answered in order. Every item is checked before anything is written: one invalid item
/// fails the whole batch with an error naming its index, and nothing is written. So does an
/// item under the id of another stored event (`InBatch` of an `EventConflict`), found as the
/// store writes the batch, in the same transaction.
pub async fn publish_batch(
    app: &App,
    account: &AccountId,
    inputs: Vec<NewEvent>,
) -> ServiceResult<Vec<Published>> {
    publish_batch_limited(app, &Unlimited, account, inputs).await
}

/// Refuses a batch of no event or of more than [`MAX_BATCH`]; checked before any item is,
/// so that an oversized batch is answered for its size, not for its 150th item.
pub fn check_batch_size(len: usize) -> Result<(), InvalidField> {
    if len == 0 {
        return Err(InvalidField::new(
            "events",
            "a batch holds at least one event",
        ));
    }
    if len > MAX_BATCH {
        return Err(InvalidField::new(
            "events",
            format!("a batch holds at most {MAX_BATCH} events, not {len}"),
        ));
    }
    Ok(())
}

/// [`publish_batch`] within the account's publish rate limit, each event taking a token.
pub async fn publish_batch_limited(
    app: &App,
    limits: &dyn PublishBuckets,
    account: &AccountId,
    inputs: Vec<NewEvent>,
) -> ServiceResult<Vec<Published>> {
    check_batch_size(inputs.len())?;
    let now = app.clock.now();
    let mut events = Vec::with_capacity(inputs.len());
    let mut seen = std::collections::HashMap::new();
    for (index, input) in inputs.into_iter().enumerate() {
        let event = new_event(app, account, input, now).map_err(|error| ServiceError::InBatch {
            index,
            error: Box::new(error),
        })?;
        if let Some(first) = seen.insert(event.id.clone(), index) {
            return Err(ServiceError::InBatch {
                index,
                error: Box::new(
                    InvalidField::new("id", format!("repeats the id of events[{first}]")).into(),
                ),
            });
        }
        events.push(event);
    }
    let Some(stored) = app.store.get_account(account).await? else {
        return Err(ServiceError::NotFound("account"));
    };
    // One token per event: a batch counts as its events do.
    take_publish_tokens(
        app,
        limits,
        &stored,
        u32::try_from(events.len()).unwrap_or(u32::MAX),
    )
    .await?;
    let endpoints = app.store.list_endpoints(account).await?;
    let with_deliveries = app.publish == PublishMode::WithDeliveries;
    let items: Vec<crate::store::BatchItem> = events
        .iter()
        .map(|event| {
            let deliveries = with_deliveries.then(|| planned_deliveries(event, &endpoints));
            (event.clone(), deliveries)
        })
        .collect();
    let written = super::noted_write(app, app.store.publish_batch(&items)).await;
    let outcomes = match written {
        Ok(outcomes) => outcomes,
        // An item under the id of another event: nothing of the batch was written, and it is
        // refused naming that item, as an invalid one is.
        Err(StoreError::EventConflict(conflict)) => {
            let index = items
                .iter()
                .position(|(event, _)| &event.id == conflict.id());
            let error = ServiceError::EventConflict(conflict);
            return Err(match index {
                Some(index) => ServiceError::InBatch {
                    index,
                    error: Box::new(error),
                },
                None => error,
            });
        }
        Err(other) => return Err(other.into()),
    };
    let mut created = Vec::with_capacity(items.len());
    let mut again = Vec::new();
    let mut queued = Vec::new();
    for (index, ((event, deliveries), outcome)) in items.into_iter().zip(outcomes).enumerate() {
        match outcome {
            PublishOutcome::Created => {
                crate::telemetry::event_published();
                let deliveries = match deliveries {
                    Some(deliveries) => {
                        queued.extend(pending_refs(&event, &deliveries, &endpoints));
                        deliveries
                    }
                    None => planned_deliveries(&event, &endpoints),
                };
                created.push((index, Published::created(event, deliveries)));
            }
            PublishOutcome::AlreadyExists { event } => again.push((index, event)),
        }
    }
    // What was written is queued and marked before anything is read for the answer: a
    // read that fails then only fails the answer.
    if !queued.is_empty() {
        // Committed; if the queue fails now, the store is still the source of truth.
        if let Err(error) = app.queue.enqueue(queued).await {
            tracing::error!(%error, "enqueue after a batch publish failed; the sweeper will retry");
        }
    }
    if with_deliveries {
        // Without deliveries, the stream's fan-out marks what it finds missed.
        let events = created.iter().map(|(_, p)| &p.event);
        mark_missed(app, events.chain(again.iter().map(|(_, e)| e)), &endpoints).await?;
    }
    // The events published before are read a few at a time.
    use futures_util::StreamExt;
    let endpoints = &endpoints;
    let reads = again.into_iter().map(|(index, event)| async move {
        let stored = first_deliveries(app, &event).await?;
        let answer = Published::again(event, stored, |event| {
            (!with_deliveries).then(|| planned_deliveries(event, endpoints))
        });
        ServiceResult::Ok((index, answer))
    });
    let again: Vec<(usize, Published)> = futures_util::stream::iter(reads)
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<ServiceResult<_>>()?;
    let mut published: Vec<(usize, Published)> = created.into_iter().chain(again).collect();
    published.sort_unstable_by_key(|(index, _)| *index);
    Ok(published.into_iter().map(|(_, p)| p).collect())
}

/// Takes `n` tokens of the account's publish limit (its own, or the configured default);
/// `RateLimited` when they are not there. A bucket that cannot be read lets the publish
/// through: the limit protects the service, and refusing every publish while the control
/// table is unreachable would be the outage it is meant to prevent.
pub(super) async fn take_publish_tokens(
    app: &App,
    limits: &dyn PublishBuckets,
    account: &Account,
    n: u32,
) -> ServiceResult<()> {
    let Some(rate) = account.publish_rate_limit.or(app.config.publish_rate) else {
        return Ok(());
    };
    let taken = take_tokens(limits, &account.id, rate, n, "publishes").await;
    if taken.is_err() {
        crate::telemetry::publishes_throttled(&account.id, n);
    }
    taken
}

/// Takes `n` tokens of `bucket` at `rate`; `RateLimited` (naming `what` is limited) when
/// they are not there. A bucket that cannot be read lets the request through.
pub(super) async fn take_tokens(
    limits: &dyn PublishBuckets,
    bucket: &AccountId,
    rate: crate::domain::rate::PublishRate,
    n: u32,
    what: &'static str,
) -> ServiceResult<()> {
    match limits.take(bucket, rate, n).await {
        Ok(None) => Ok(()),
        Ok(Some(retry_after)) => Err(ServiceError::RateLimited {
            what,
            per_second: rate.per_second,
            burst: rate.burst,
            retry_after,
        }),
        Err(error) => {
            tracing::warn!(bucket = %bucket, %error, what, "rate bucket unavailable; let through");
            Ok(())
        }
    }
}

/// An event checked as `publish` checks it: id, type, size.
fn new_event(
    app: &App,
    account: &AccountId,
    input: NewEvent,
    now: crate::clock::Timestamp,
) -> ServiceResult<Event> {
    let id = match input.id.as_deref() {
        Some(raw) => EventId::parse(raw)?,
        None => EventId::generate(),
    };
    let event_type = EventType::parse(&input.event_type)?;
    let event = Event::new(id, account.clone(), event_type, now, &input.data)
        .map_err(|e| InvalidField::new("data", e.to_string()))?;
    if event.payload.len() > app.config.max_payload_bytes {
        return Err(ServiceError::TooLarge {
            field: "data",
            message: format!(
                "event body is {} bytes; the limit is {} bytes (send ids and let receivers fetch details)",
                event.payload.len(),
                app.config.max_payload_bytes
            ),
        });
    }
    Ok(event)
}

fn pending_refs(event: &Event, deliveries: &[Delivery], endpoints: &[Endpoint]) -> Vec<PendingRef> {
    let endpoints = crate::domain::endpoints_by_id(endpoints);
    deliveries
        .iter()
        .filter_map(|d| {
            let endpoint = endpoints.get(&d.endpoint_id)?;
            Some(PendingRef {
                delivery_id: d.id.clone(),
                endpoint_id: endpoint.id.clone(),
                account_id: event.account_id.clone(),
                due: event.created_at,
                max_in_flight: endpoint.max_in_flight,
                rate_limit_per_second: endpoint.rate_limit_per_second,
            })
        })
        .collect()
}

/// The deliveries the fan-out creates for `event` given the endpoints subscribed now.
fn planned_deliveries(event: &Event, endpoints: &[Endpoint]) -> Vec<Delivery> {
    deliveries_to(event, endpoints, event.created_at)
        .into_iter()
        .map(|(_, delivery)| delivery)
        .collect()
}

/// An event and a page of its deliveries, in endpoint-id order ([`Store::event_deliveries`]):
/// an event sent to many endpoints is shown without reading every delivery.
///
/// [`Store::event_deliveries`]: crate::store::Store::event_deliveries
pub async fn get(
    app: &App,
    account: &AccountId,
    id: &EventId,
    page: &PageAfter<EndpointId>,
) -> ServiceResult<(Event, EventDeliveries)> {
    let event = app
        .store
        .get_event(account, id)
        .await?
        .ok_or(ServiceError::NotFound("event"))?;
    let deliveries = app.store.event_deliveries(&event, page).await?;
    Ok((event, deliveries))
}

/// An erasure, and the event's first deliveries as they are after it.
#[derive(Debug, Clone)]
pub struct Erased {
    pub erasure: crate::store::Erasure,
    /// As [`first_deliveries`] reads them.
    pub first: EventDeliveries,
}

/// Erases an event's content on request (a customer's deletion request): see
/// [`crate::store::Store::erase_event`]. Publishing its id again returns the erased event
/// (its type compared, its data gone: [`Event::conflict_with`]). An erasure that is not
/// complete (DynamoDB, an event to many thousands of endpoints) is recorded in the audit
/// log as such; calling again goes on with it.
pub async fn erase(
    app: &App,
    account: &AccountId,
    id: &EventId,
    caller: &crate::domain::Caller,
) -> ServiceResult<Erased> {
    let erasure = app
        .store
        .erase_event(account, id, app.clock.now())
        .await?
        .ok_or(ServiceError::NotFound("event"))?;
    if erasure.ended > 0 {
        crate::telemetry::completed(account, "failed", u64::from(erasure.ended));
    }
    tracing::info!(account.id = %account, event.id = %id, ended = erasure.ended, complete = erasure.complete, "event erased");
    super::audit::record(
        app,
        caller,
        Some(account),
        crate::domain::AuditAction::EventErased,
        crate::domain::AuditTarget::new(crate::domain::TargetKind::Event, id),
        super::audit::details(serde_json::json!({
            "deliveries_ended": erasure.ended,
            "complete": erasure.complete,
        })),
    )
    .await?;
    let first = first_deliveries(app, &erasure.event).await?;
    Ok(Erased { erasure, first })
}

#[cfg(all(test, feature = "aws"))]
mod tests {
    use super::*;
    use crate::{
        domain::DeliveryStatus,
        fixtures,
        service::fan_out::{delivery_id_for, fan_out},
        testing::{emulated_shape, receive_queued},
    };

    /// An account may have 100,000 endpoints: each delivery finds its endpoint by id, not by
    /// a search of the list (quadratic: 20,000 endpoints took seconds of a publish's time).
    #[test]
    fn each_delivery_is_queued_with_its_own_endpoints_limits_among_many() {
        let at = fixtures::t0();
        let endpoints: Vec<Endpoint> = (0..20_000u32)
            .map(|i| {
                let mut endpoint = fixtures::endpoint("acme", &format!("ep_{i}"), at);
                endpoint.max_in_flight = 1 + i % 97;
                endpoint.rate_limit_per_second = Some(1 + i % 89);
                endpoint
            })
            .collect();
        let event = fixtures::event("acme", "evt_1", at);
        let deliveries: Vec<Delivery> = crate::domain::deliveries_to(&event, &endpoints, at)
            .into_iter()
            .map(|(_, delivery)| delivery)
            .collect();
        let refs = pending_refs(&event, &deliveries, &endpoints);
        assert_eq!(refs.len(), endpoints.len());
        for r in &refs {
            let n: u32 = r.endpoint_id.as_str()["ep_".len()..].parse().unwrap();
            assert_eq!(
                (r.max_in_flight, r.rate_limit_per_second),
                (1 + n % 97, Some(1 + n % 89)),
                "{}",
                r.endpoint_id
            );
        }
    }

    #[tokio::test]
    async fn on_the_aws_shape_publish_writes_the_event_alone_and_fan_out_makes_the_listed_deliveries(
    ) {
        let (settings, shape) = emulated_shape().await;
        assert_eq!(shape.app.publish, PublishMode::ThroughStream);
        let store = &shape.app.store;
        store
            .create_account(&fixtures::account("acme"))
            .await
            .unwrap();
        for id in ["ep_a", "ep_b"] {
            store
                .create_endpoint(&fixtures::endpoint("acme", id, fixtures::t0()))
                .await
                .unwrap();
        }
        let account = AccountId::parse("acme").unwrap();
        let new = NewEvent {
            id: Some("evt_streamed".into()),
            event_type: "invoice.paid".into(),
            data: serde_json::json!({"amount": 42}),
        };
        let published = publish(&shape.app, &account, new.clone()).await.unwrap();
        assert!(published.created);
        let listed: Vec<_> = published.deliveries.iter().map(|d| d.id.clone()).collect();
        assert_eq!(listed.len(), 2);
        assert!(published
            .deliveries
            .iter()
            .all(|d| d.status == DeliveryStatus::Pending
                && d.id == delivery_id_for(&published.event, &d.endpoint_id)));
        let stored = store
            .get_event(&account, &published.event.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.payload, published.event.payload);
        assert!(
            store
                .deliveries_of_event(&published.event)
                .await
                .unwrap()
                .is_empty(),
            "the deliveries are the fan-out's to write"
        );
        assert_eq!(
            receive_queued(&settings.queue_url, 0).await.len(),
            0,
            "nothing sent"
        );

        // A client retrying before the fan-out ran is told the same deliveries.
        let early = publish(&shape.app, &account, new.clone()).await.unwrap();
        assert!(!early.created);
        assert_eq!(early.event, stored);
        assert_eq!(
            early.deliveries.iter().map(|d| &d.id).collect::<Vec<_>>(),
            listed.iter().collect::<Vec<_>>()
        );

        assert_eq!(fan_out(&shape.app, &published.event).await.unwrap(), 2);
        let mut stored: Vec<_> = store
            .deliveries_of_event(&published.event)
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.id)
            .collect();
        stored.sort();
        let mut expected = listed.clone();
        expected.sort();
        assert_eq!(stored, expected, "the fan-out made the deliveries listed");
        assert_eq!(receive_queued(&settings.queue_url, 0).await.len(), 2);

        let again = publish(&shape.app, &account, new).await.unwrap();
        assert!(!again.created);
        let mut returned: Vec<_> = again.deliveries.into_iter().map(|d| d.id).collect();
        returned.sort();
        assert_eq!(returned, expected, "the stored deliveries, nothing new");
    }

    #[tokio::test]
    async fn on_the_aws_shape_a_batch_writes_its_events_alone_for_the_stream() {
        let (settings, shape) = emulated_shape().await;
        let store = &shape.app.store;
        store
            .create_account(&fixtures::account("acme"))
            .await
            .unwrap();
        store
            .create_endpoint(&fixtures::endpoint("acme", "ep_a", fixtures::t0()))
            .await
            .unwrap();
        let account = AccountId::parse("acme").unwrap();
        let inputs: Vec<NewEvent> = (0..3)
            .map(|i| NewEvent {
                id: Some(format!("evt_batch_{i}")),
                event_type: "invoice.paid".into(),
                data: serde_json::json!({"i": i}),
            })
            .collect();
        let published = publish_batch(&shape.app, &account, inputs.clone())
            .await
            .unwrap();
        assert!(published
            .iter()
            .all(|p| p.created && p.deliveries.len() == 1));
        for p in &published {
            assert!(store
                .deliveries_of_event(&p.event)
                .await
                .unwrap()
                .is_empty());
        }
        assert_eq!(receive_queued(&settings.queue_url, 0).await.len(), 0);
        assert_eq!(fan_out(&shape.app, &published[1].event).await.unwrap(), 1);
        let again = publish_batch(&shape.app, &account, inputs).await.unwrap();
        assert!(again.iter().all(|p| !p.created));
        assert_eq!(
            again[1].deliveries[0].id, published[1].deliveries[0].id,
            "the fanned-out delivery is the one listed"
        );
    }

    /// On DynamoDB, as on SQLite: another event under a published id is refused naming the
    /// field, alone or in a batch (naming the item, nothing of the batch written); the same
    /// event again is answered with the stored one.
    #[tokio::test]
    async fn on_the_aws_shape_another_event_under_a_published_id_is_refused() {
        let (_settings, shape) = emulated_shape().await;
        let store = &shape.app.store;
        store
            .create_account(&fixtures::account("acme"))
            .await
            .unwrap();
        let account = AccountId::parse("acme").unwrap();
        let new = |id: &str, kind: &str, data: serde_json::Value| NewEvent {
            id: Some(id.into()),
            event_type: kind.into(),
            data,
        };
        let first = publish(
            &shape.app,
            &account,
            new(
                "evt_1",
                "invoice.paid",
                serde_json::json!({"amount": 1, "to": "x"}),
            ),
        )
        .await
        .unwrap();
        assert!(first.created);
        let retry = publish(
            &shape.app,
            &account,
            new(
                "evt_1",
                "invoice.paid",
                serde_json::json!({"to": "x", "amount": 1}),
            ),
        )
        .await
        .unwrap();
        assert!(!retry.created);
        for (field, input) in [
            (
                "type",
                new(
                    "evt_1",
                    "invoice.voided",
                    serde_json::json!({"amount": 1, "to": "x"}),
                ),
            ),
            (
                "data",
                new(
                    "evt_1",
                    "invoice.paid",
                    serde_json::json!({"amount": 2, "to": "x"}),
                ),
            ),
        ] {
            match publish(&shape.app, &account, input).await {
                Err(ServiceError::EventConflict(conflict)) => {
                    assert_eq!(conflict.field(), field, "{conflict}");
                }
                other => panic!("other {field} under a published id: {other:?}"),
            }
        }
        let batch = vec![
            new("evt_2", "invoice.paid", serde_json::json!({})),
            new(
                "evt_1",
                "invoice.paid",
                serde_json::json!({"amount": 2, "to": "x"}),
            ),
        ];
        match publish_batch(&shape.app, &account, batch).await {
            Err(ServiceError::InBatch { index: 1, error }) => {
                assert!(
                    matches!(*error, ServiceError::EventConflict(ref c) if c.field() == "data"),
                    "{error:?}"
                );
            }
            other => panic!("a batch with another event under a published id: {other:?}"),
        }
        assert_eq!(
            store
                .get_event(&account, &EventId::parse("evt_2").unwrap())
                .await
                .unwrap(),
            None,
            "nothing of the refused batch is written"
        );
        assert_eq!(
            store
                .get_event(&account, &first.event.id)
                .await
                .unwrap()
                .map(|e| e.payload),
            Some(first.event.payload),
        );
    }
}

#[cfg(test)]
mod limit_tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        clock::ManualClock,
        domain::rate::PublishRate,
        fixtures,
        limits::MemoryBuckets,
        store::{sqlite::SqliteStore, Store},
    };

    /// With the account's publish limit used up, the same id again is answered with the
    /// event already published; a new id is refused.
    #[tokio::test]
    async fn a_retry_of_a_published_event_is_answered_over_the_limit() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().unwrap());
        let clock = Arc::new(ManualClock::new(fixtures::t0()));
        let app = fixtures::app_on(store.clone(), clock.clone());
        fixtures::account_with_endpoints(store.as_ref(), "acme", ["ep_1"]).await;
        let account = AccountId::parse("acme").unwrap();
        let mut limited = store.get_account(&account).await.unwrap().unwrap();
        limited.publish_rate_limit = Some(PublishRate::new(1, Some(1), "x").unwrap());
        store.update_account(&limited).await.unwrap();
        let buckets = MemoryBuckets::new(clock.clone());
        let event = |id: &str| NewEvent {
            id: Some(id.to_owned()),
            event_type: "invoice.paid".to_owned(),
            data: serde_json::json!({"n": 1}),
        };
        let first = publish_limited(&app, &buckets, &account, event("evt_1"))
            .await
            .unwrap();
        assert!(first.created);
        let again = publish_limited(&app, &buckets, &account, event("evt_1"))
            .await
            .expect("the retry of a published event is refused over the limit");
        assert!(!again.created);
        assert_eq!(again.event.id, first.event.id);
        assert_eq!(again.deliveries.len(), 1);
        let new = publish_limited(&app, &buckets, &account, event("evt_2")).await;
        assert!(
            matches!(new, Err(ServiceError::RateLimited { .. })),
            "{new:?}"
        );
    }

    /// Where the publish writes the deliveries, a retry lists those written, over the limit
    /// as within it: none for an event no endpoint took, even once an endpoint that takes it
    /// is added (it would be a delivery that is never created).
    #[tokio::test]
    async fn a_retry_lists_only_what_was_written_within_the_limit_or_over_it() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().unwrap());
        let clock = Arc::new(ManualClock::new(fixtures::t0()));
        let app = fixtures::app_on(store.clone(), clock.clone());
        assert_eq!(app.publish, PublishMode::WithDeliveries);
        fixtures::account_with_endpoints(store.as_ref(), "acme", [] as [&str; 0]).await;
        let account = AccountId::parse("acme").unwrap();
        let event = |id: &str| NewEvent {
            id: Some(id.to_owned()),
            event_type: "invoice.paid".to_owned(),
            data: serde_json::json!({"n": 1}),
        };
        let buckets = MemoryBuckets::new(clock.clone());
        let first = publish_limited(&app, &buckets, &account, event("evt_1"))
            .await
            .unwrap();
        assert!(first.created && first.deliveries.is_empty());
        let late = fixtures::endpoint("acme", "ep_late", fixtures::t0());
        store.create_endpoint(&late).await.unwrap();
        let within = publish_limited(&app, &buckets, &account, event("evt_1"))
            .await
            .unwrap();
        assert_eq!((within.created, within.deliveries.len()), (false, 0));
        let mut limited = store.get_account(&account).await.unwrap().unwrap();
        limited.publish_rate_limit = Some(PublishRate::new(1, Some(1), "x").unwrap());
        store.update_account(&limited).await.unwrap();
        publish_limited(&app, &buckets, &account, event("evt_2"))
            .await
            .unwrap();
        let over = publish_limited(&app, &buckets, &account, event("evt_1"))
            .await
            .expect("a retry is answered over the limit");
        assert_eq!(
            (over.created, over.deliveries.len(), over.next),
            (false, 0, None),
            "{:?}",
            over.deliveries
        );
    }

    /// Within the limit or over it, another event under a published id is refused as a
    /// conflict (not a 429: waiting would not change the answer), and nothing is written; a
    /// batch with such an item is refused naming it, and writes none of its items.
    #[tokio::test]
    async fn another_event_under_a_published_id_is_a_conflict_within_the_limit_or_over_it() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().unwrap());
        let clock = Arc::new(ManualClock::new(fixtures::t0()));
        let app = fixtures::app_on(store.clone(), clock.clone());
        fixtures::account_with_endpoints(store.as_ref(), "acme", ["ep_1"]).await;
        let account = AccountId::parse("acme").unwrap();
        let event = |id: &str, kind: &str, n: u32| NewEvent {
            id: Some(id.to_owned()),
            event_type: kind.to_owned(),
            data: serde_json::json!({"n": n}),
        };
        let conflict = |result: ServiceResult<Published>, field: &str| match result {
            Err(ServiceError::EventConflict(conflict)) => {
                assert_eq!(conflict.field(), field, "{conflict}");
                assert_eq!(conflict.id().as_str(), "evt_1", "{conflict}");
            }
            other => panic!("another event under a published id ({field}): {other:?}"),
        };
        let buckets = MemoryBuckets::new(clock.clone());
        let first = publish_limited(&app, &buckets, &account, event("evt_1", "invoice.paid", 1))
            .await
            .unwrap();
        assert!(first.created);
        // Within the limit (none set yet), then over it: the same answers.
        for over_limit in [false, true] {
            if over_limit {
                let mut limited = store.get_account(&account).await.unwrap().unwrap();
                limited.publish_rate_limit = Some(PublishRate::new(1, Some(1), "x").unwrap());
                store.update_account(&limited).await.unwrap();
                publish_limited(&app, &buckets, &account, event("evt_4", "invoice.paid", 1))
                    .await
                    .unwrap();
                let new_id =
                    publish_limited(&app, &buckets, &account, event("evt_9", "invoice.paid", 1))
                        .await;
                assert!(
                    matches!(new_id, Err(ServiceError::RateLimited { .. })),
                    "over the limit: {new_id:?}"
                );
            }
            for (kind, n, field) in [("invoice.paid", 2, "data"), ("invoice.voided", 1, "type")] {
                conflict(
                    publish_limited(&app, &buckets, &account, event("evt_1", kind, n)).await,
                    field,
                );
            }
        }
        // Over the limit still, the stored event's retry is answered with it.
        let again = publish_limited(&app, &buckets, &account, event("evt_1", "invoice.paid", 1))
            .await
            .unwrap();
        assert_eq!((again.created, &again.event), (false, &first.event));

        match publish_batch(
            &app,
            &account,
            vec![
                event("evt_2", "invoice.paid", 1),
                event("evt_3", "invoice.paid", 1),
                event("evt_1", "invoice.paid", 2),
            ],
        )
        .await
        {
            Err(ServiceError::InBatch { index: 2, error }) => {
                assert!(
                    matches!(*error, ServiceError::EventConflict(ref c) if c.field() == "data"),
                    "{error:?}"
                );
            }
            other => panic!("a batch with another event under a published id: {other:?}"),
        }
        for id in ["evt_2", "evt_3"] {
            assert_eq!(
                store
                    .get_event(&account, &EventId::parse(id).unwrap())
                    .await
                    .unwrap(),
                None,
                "{id}: nothing of the refused batch is written"
            );
        }
        assert_eq!(
            store.deliveries_of_event(&first.event).await.unwrap(),
            first.deliveries
        );
    }
}
