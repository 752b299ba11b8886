//! Fan-out of an event stored without its deliveries (published on the AWS shape, or written
//! by the outbox helper; both arrive through the DynamoDB stream): one delivery per
//! subscribed endpoint, then the queue.
//! Replaying it is harmless: a delivery's id is derived from (event, endpoint), and the
//! store adds only the ones that do not exist yet.

use std::collections::HashMap;

use futures_util::{stream, StreamExt};

use super::{ServiceError, ServiceResult};
use crate::{
    domain::{
        deliveries_to, AccountId, Delivery, DeliveryId, DeliveryStatus, Endpoint, EndpointId, Event,
    },
    store::{FannedOut, PendingRef},
    App,
};

/// The one id a delivery of `event` to `endpoint` can have (`Delivery::new_pending` gives it).
pub fn delivery_id_for(event: &Event, endpoint: &EndpointId) -> DeliveryId {
    DeliveryId::derived(&event.account_id, &event.id, event.created_at, endpoint)
}

/// How long one sweep spends fanning out events whose stream record never completed
/// fan-out (the event under way when it runs out is finished, or a large one's part).
pub const RECOVER_BUDGET: std::time::Duration = std::time::Duration::from_secs(60);

/// Fans out the events whose stream record never completed fan-out (lost, or discarded
/// after the stream's retries): those still unmarked `grace` after their creation. Returns
/// how many events were fanned out.
pub async fn recover_unfanned(
    app: &App,
    now: crate::clock::Timestamp,
    grace: std::time::Duration,
) -> ServiceResult<usize> {
    const PAGE: u32 = 100;
    // A bounded share per run (the sweeper's next run goes on), so a backlog leaves the
    // deliveries' sweep its time.
    const PAGES_PER_RUN: usize = 50;
    let started = std::time::Instant::now();
    // Within a page too: a page of a large account's events takes minutes, and the sweep of
    // the deliveries comes after this in the same run.
    let deadline = tokio::time::Instant::now() + RECOVER_BUDGET;
    let cutoff = now - chrono::TimeDelta::from_std(grace).unwrap_or_default();
    let mut recovered = 0;
    let mut after = None;
    let mut first_error = None;
    for _ in 0..PAGES_PER_RUN {
        if started.elapsed() >= RECOVER_BUDGET {
            break;
        }
        let page = app.store.unfanned_events(after, cutoff, PAGE).await?;
        let Some(last) = page.last else {
            break;
        };
        after = Some(last);
        let mut rest = &page.events[..];
        while !rest.is_empty() {
            let outcome = fan_out_batch_until(app, rest, Some(deadline)).await;
            let done = outcome.failed.unwrap_or(rest.len()).min(rest.len());
            for event in &rest[..done] {
                tracing::warn!(event.id = %event.id, account.id = %event.account_id, "event fanned out by the sweeper: its stream record never completed fan-out");
            }
            recovered += done;
            crate::telemetry::events_recovered(done);
            let Some(error) = outcome.error else {
                if outcome.failed.is_some() {
                    // Out of time: the next run goes on from here.
                    return first_error.map_or(Ok(recovered), Err);
                }
                break;
            };
            if matches!(error, ServiceError::Queue(_)) {
                // Nothing else can be queued either: the next run tries again.
                return Err(error);
            }
            // This event is left for the next run; the ones after it go on.
            if let Some(failed) = rest.get(done) {
                tracing::error!(event.id = %failed.id, account.id = %failed.account_id, %error, "the sweeper cannot fan out this event; it tries again next run");
            }
            first_error.get_or_insert(error);
            if tokio::time::Instant::now() >= deadline {
                // Each call runs its first event to its end (or a part's): past the budget,
                // no more calls.
                return first_error.map_or(Ok(recovered), Err);
            }
            rest = rest.get(done + 1..).unwrap_or_default();
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(recovered),
    }
}

/// Creates the missing deliveries of a stored event and queues them. Returns how many
/// were created.
pub async fn fan_out(app: &App, event: &Event) -> ServiceResult<usize> {
    let outcome = fan_out_batch(app, std::slice::from_ref(event)).await;
    match outcome.error {
        Some(error) => Err(error),
        None => Ok(outcome.created),
    }
}

/// What fanning out a batch of events came to.
#[derive(Debug)]
pub struct BatchOutcome {
    /// Deliveries created.
    pub created: usize,
    /// The positions of events whose account does not exist (written to the store directly,
    /// through the outbox): they get no deliveries and are not marked fanned out; the caller
    /// records them as rejected.
    pub unknown_account: Vec<usize>,
    /// The first event (by position) whose fan-out failed, and why; the events before it
    /// are done and their deliveries queued.
    pub failed: Option<usize>,
    pub error: Option<ServiceError>,
}

/// Events of one batch fanned out at the same time.
const CONCURRENT_EVENTS: usize = 8;

/// Fans out a batch of stored events (one stream batch), several at a time, and queues all
/// their new deliveries together, so SQS takes them ten to a request. The outcome is as if
/// they were done in order, stopping at the first event that fails: only the deliveries of
/// the events before it are queued (an event after it may have got its deliveries; the
/// retry from the failed one queues them). When the queue refuses, the whole batch counts
/// as failed: running it again is harmless, and it queues the deliveries a previous run
/// created but may not have queued (those still pending without an attempt).
pub async fn fan_out_batch(app: &App, events: &[Event]) -> BatchOutcome {
    fan_out_batch_until(app, events, None).await
}

/// Deliveries an event's fan-out writes and queues at a time when it has more than this
/// many, recording after each part how far it got
/// ([`Store::record_fan_out_progress`](crate::store::Store::record_fan_out_progress)): an
/// event to 100,000 endpoints that runs out of time, or whose writes are slowed by
/// throttling, goes on where it stopped instead of beginning again, so every invocation
/// moves it forward. An event to this many or fewer is written whole, and queued with its
/// batch's other events. The default of `CoreConfig::fan_out_part`.
pub const FAN_OUT_PART: usize = 1000;

/// How long writing the deliveries of one part of a fan-out, to `endpoints` endpoints, may
/// take on DynamoDB: a conditional write per delivery,
/// [`WRITE_CONCURRENCY`](crate::store::dynamodb::WRITE_CONCURRENCY) at a time, each counted
/// at [`WRITE_TIME`] (DynamoDB's writes take single-digit milliseconds; this leaves room
/// for the slower ones and for throttling's retries). The fan-out function's share of its
/// timeout must cover one part ([`FAN_OUT_PART`]): an invocation then always moves an event
/// forward, however many endpoints it has.
#[cfg(feature = "aws")]
pub fn longest_fan_out(endpoints: u64) -> std::time::Duration {
    let concurrency = crate::store::dynamodb::WRITE_CONCURRENCY as u64;
    let rounds = endpoints.div_ceil(concurrency.max(1));
    WRITE_TIME.saturating_mul(u32::try_from(rounds).unwrap_or(u32::MAX))
}

/// What [`longest_fan_out`] counts for one write.
#[cfg(feature = "aws")]
pub const WRITE_TIME: std::time::Duration = std::time::Duration::from_millis(20);

/// As [`fan_out_batch`], giving up at `deadline` the events still running (the first stops
/// at the end of a part, see [`FAN_OUT_PART`]): they and the events after them are reported
/// as `failed` with no `error` (out of time), to be fanned out by the next invocation, which
/// Lambda starts from the first of them. Those done are queued and marked as usual. A stream
/// batch of a large account's events otherwise ran into the function's timeout with nothing
/// queued or marked, and every retry began the batch again.
pub async fn fan_out_batch_until(
    app: &App,
    events: &[Event],
    deadline: Option<tokio::time::Instant>,
) -> BatchOutcome {
    let now = app.clock.now();
    // Each account's endpoints, read once for the batch; the batch ends before the first
    // event whose account's endpoints cannot be read.
    let mut endpoints_of: HashMap<AccountId, Vec<Endpoint>> = HashMap::new();
    let mut unknown: std::collections::HashSet<AccountId> = Default::default();
    let mut failure: Option<(usize, ServiceError)> = None;
    let mut readable = events.len();
    for (position, event) in events.iter().enumerate() {
        if endpoints_of.contains_key(&event.account_id) || unknown.contains(&event.account_id) {
            continue;
        }
        // An account with endpoints exists; only one without is looked up (an outbox write
        // may name an account that does not exist).
        let listed = match app.store.list_endpoints(&event.account_id).await {
            Ok(endpoints) if endpoints.is_empty() => app
                .store
                .get_account(&event.account_id)
                .await
                .map(|account| account.map(|_| endpoints)),
            other => other.map(Some),
        };
        match listed {
            Ok(Some(endpoints)) => {
                endpoints_of.insert(event.account_id.clone(), endpoints);
            }
            Ok(None) => {
                unknown.insert(event.account_id.clone());
            }
            Err(error) => {
                failure = Some((position, error.into()));
                readable = position;
                break;
            }
        }
    }
    let unknown_account: Vec<usize> = events[..readable]
        .iter()
        .enumerate()
        .filter(|(_, e)| unknown.contains(&e.account_id))
        .map(|(position, _)| position)
        .collect();
    let mut refs: Vec<PendingRef> = Vec::new();
    let mut created = 0;
    let pending: Vec<_> = events[..readable]
        .iter()
        .map(|event| {
            let endpoints = endpoints_of
                .get(&event.account_id)
                .map_or(&[][..], Vec::as_slice);
            fan_out_one(app, event, now, endpoints, deadline)
        })
        .collect();
    let mut done = stream::iter(pending)
        .buffered(CONCURRENT_EVENTS)
        .enumerate();
    let mut out_of_time = None;
    let mut next = 0;
    loop {
        // The first event is not cut short here: it stops itself past the deadline at the end
        // of a part, once that part is recorded. An event cut anywhere else begins that part
        // again (each of its writes made again), so one cut short at the deadline every time
        // would never end, and hold back every event after it.
        if next == readable {
            // All done, however late: nothing is left over for a retry to begin at.
            break;
        }
        let item = match deadline.filter(|_| next > 0) {
            // Past it, an event that happens to be finished already is not taken either:
            // where a batch stops does not depend on how its events were scheduled.
            Some(deadline) if tokio::time::Instant::now() >= deadline => {
                out_of_time = Some(next);
                break;
            }
            Some(deadline) => match tokio::time::timeout_at(deadline, done.next()).await {
                Ok(item) => item,
                Err(_) => {
                    out_of_time = Some(next);
                    break;
                }
            },
            None => done.next().await,
        };
        let Some((position, result)) = item else {
            break;
        };
        next = position + 1;
        match result {
            Ok(one) => {
                created += one.created;
                refs.extend(one.to_queue);
                if one.cut_short {
                    out_of_time = Some(position);
                    break;
                }
            }
            Err(error) => {
                failure = Some((position, error));
                break;
            }
        }
    }
    drop(done);
    if !refs.is_empty() {
        if let Err(error) = app.queue.enqueue(refs).await {
            return BatchOutcome {
                created,
                unknown_account,
                failed: Some(0),
                error: Some(error.into()),
            };
        }
    }
    // Out of time before the event whose endpoints could not be read: the events between
    // were cut short, so the retry begins at the first of them.
    let failure = failure.filter(|(position, _)| out_of_time.is_none_or(|t| *position < t));
    let (failed, error) = match (failure, out_of_time) {
        (Some((position, error)), _) => (Some(position), Some(error)),
        (None, Some(position)) => {
            tracing::warn!(
                events = events.len(),
                fanned_out = position,
                "out of time: the events from this one on are left to the next invocation"
            );
            (Some(position), None)
        }
        (None, None) => (None, None),
    };
    // The events before the failed one are done: out of the sweeper's `unfanned` list. If
    // this fails, the sweeper fans them out again later, which changes nothing.
    // Those a disabled endpoint missed are marked so in the same write.
    let done: Vec<FannedOut> = events[..failed.unwrap_or(events.len())]
        .iter()
        .filter(|e| !unknown.contains(&e.account_id))
        .map(|event| FannedOut {
            missed: endpoints_of
                .get(&event.account_id)
                .is_some_and(|endpoints| event.missed_by_any(endpoints)),
            event: event.clone(),
        })
        .collect();
    if !done.is_empty() {
        if let Err(error) = app.store.mark_fanned_out(&done).await {
            tracing::warn!(%error, events = done.len(), "fan-out done but not marked; the sweeper will look again");
        }
    }
    BatchOutcome {
        created,
        unknown_account,
        failed,
        error,
    }
}

/// What one event's fan-out came to.
struct EventFanOut {
    created: usize,
    /// What its batch queues: an event fanned out in parts has queued its own.
    to_queue: Vec<PendingRef>,
    /// Stopped at the deadline after a part; the next fan-out of it goes on from there.
    cut_short: bool,
}

/// The deliveries of one event: written whole and left to the batch to queue, or, to more
/// endpoints than a part ([`FAN_OUT_PART`]), a part at a time in endpoint-id order from where
/// an earlier fan-out of it stopped, each part queued and recorded before the next. Past
/// `deadline` it stops at the end of a part.
async fn fan_out_one(
    app: &App,
    event: &Event,
    now: crate::clock::Timestamp,
    endpoints: &[Endpoint],
    deadline: Option<tokio::time::Instant>,
) -> ServiceResult<EventFanOut> {
    let mut planned = deliveries_to(event, endpoints, now);
    let part = app.config.fan_out_part.max(1);
    if planned.len() <= part {
        let (created, to_queue) = write_whole(app, event, now, planned, deadline).await?;
        return Ok(EventFanOut {
            created,
            to_queue,
            cut_short: false,
        });
    }
    planned.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    if let Some(through) = app
        .store
        .fan_out_progress(&event.account_id, &event.id)
        .await?
    {
        planned.retain(|(endpoint, _)| endpoint.id > through);
    }
    let mut created = 0;
    let mut parts = planned.chunks(part).peekable();
    while let Some(part) = parts.next() {
        let (added, to_queue) = write_part(app, event, now, part, deadline).await?;
        created += added;
        if !to_queue.is_empty() {
            app.queue.enqueue(to_queue).await?;
        }
        if let Some((last, _)) = part.last() {
            app.store
                .record_fan_out_progress(&event.account_id, &event.id, &last.id)
                .await?;
        }
        let out_of_time = deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
        if out_of_time && parts.peek().is_some() {
            tracing::warn!(event.id = %event.id, account.id = %event.account_id, through = ?part.last().map(|(e, _)| &e.id), "out of time in this event's fan-out: the next goes on after the endpoint recorded");
            return Ok(EventFanOut {
                created,
                to_queue: Vec::new(),
                cut_short: true,
            });
        }
    }
    Ok(EventFanOut {
        created,
        to_queue: Vec::new(),
        cut_short: false,
    })
}

/// An event's deliveries written at once: how many were created, and what to queue.
async fn write_whole(
    app: &App,
    event: &Event,
    now: crate::clock::Timestamp,
    planned: Vec<(&Endpoint, Delivery)>,
    deadline: Option<tokio::time::Instant>,
) -> ServiceResult<(usize, Vec<PendingRef>)> {
    let (receivers, deliveries): (Vec<&Endpoint>, Vec<Delivery>) = planned.into_iter().unzip();
    let added = app
        .store
        .add_deliveries_of(event, &deliveries, deadline)
        .await?;
    let mut to_queue: Vec<Delivery> = added.clone();
    if added.len() < deliveries.len() {
        // A replay: queue again what an earlier run created but may not have queued.
        let existing = app.store.deliveries_of_event(event).await?;
        let added: std::collections::HashSet<&DeliveryId> = added.iter().map(|a| &a.id).collect();
        to_queue.extend(
            existing
                .into_iter()
                .filter(|d| unsent(d) && !added.contains(&d.id)),
        );
    }
    Ok((added.len(), pending_refs(&to_queue, &receivers, now)))
}

/// One part of an event's deliveries written: how many were created, and what to queue. Those
/// already written (by the fan-out this one goes on from, cut short within this part) are
/// read back one by one, as a part is all a replay can find written past the recorded mark.
async fn write_part(
    app: &App,
    event: &Event,
    now: crate::clock::Timestamp,
    part: &[(&Endpoint, Delivery)],
    deadline: Option<tokio::time::Instant>,
) -> ServiceResult<(usize, Vec<PendingRef>)> {
    let deliveries: Vec<Delivery> = part.iter().map(|(_, d)| d.clone()).collect();
    let added = app
        .store
        .add_deliveries_of(event, &deliveries, deadline)
        .await?;
    let mut to_queue: Vec<Delivery> = added.clone();
    if added.len() < deliveries.len() {
        let added: std::collections::HashSet<&DeliveryId> = added.iter().map(|a| &a.id).collect();
        let earlier: Vec<DeliveryId> = deliveries
            .iter()
            .map(|d| d.id.clone())
            .filter(|id| !added.contains(id))
            .collect();
        let store = std::sync::Arc::clone(&app.store);
        let account = event.account_id.clone();
        let read: Vec<_> = stream::iter(earlier)
            .map(move |id| {
                let (store, account) = (std::sync::Arc::clone(&store), account.clone());
                async move { store.get_delivery(&account, &id).await }
            })
            .buffered(READ_CONCURRENCY)
            .collect()
            .await;
        for delivery in read {
            to_queue.extend(delivery?.filter(unsent));
        }
    }
    let receivers: Vec<&Endpoint> = part.iter().map(|(e, _)| *e).collect();
    Ok((added.len(), pending_refs(&to_queue, &receivers, now)))
}

/// What a replay queues again of the deliveries it finds written: those still pending with no
/// attempt (it cannot know whether the run that wrote them got as far as queueing them).
fn unsent(delivery: &Delivery) -> bool {
    delivery.status == DeliveryStatus::Pending && delivery.attempts == 0
}

/// Reads of a replayed part's deliveries made at a time.
const READ_CONCURRENCY: usize = 16;

/// What to queue for `deliveries`, each beside its endpoint among `receivers`.
fn pending_refs(
    deliveries: &[Delivery],
    receivers: &[&Endpoint],
    now: crate::clock::Timestamp,
) -> Vec<PendingRef> {
    let receivers: HashMap<&EndpointId, &Endpoint> =
        receivers.iter().map(|e| (&e.id, *e)).collect();
    deliveries
        .iter()
        .filter_map(|d| {
            let endpoint = receivers.get(&d.endpoint_id)?;
            Some(PendingRef::new(d, endpoint, d.next_try_at.unwrap_or(now)))
        })
        .collect()
}
