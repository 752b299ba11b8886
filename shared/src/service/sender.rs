//! The AWS sender's use-case: one queue message, at most one attempt.
//!
//! The queue pushes work at any number of senders, so before an attempt the sender takes
//! one of the endpoint's in-flight slots (and a rate token, if the endpoint has a rate
//! limit). When none is free the message goes back to the queue and no attempt is spent:
//! for 5–15 s while the delivery is on time, and otherwise for about as long again as it has
//! waited past its time (half to all of it), at most 5 minutes ([`BUSY_REQUEUE_LONGEST`]):
//! one the sweeper sent again, 5 minutes late, goes back for 2.5–5. Every trip costs a
//! receive, a read and a send: a flat 5–15 s would bring a saturated endpoint's backlog of
//! N messages round N/10 times a second, its cost growing with N², where this brings it
//! round at most N/150 times a second and still drains it at the endpoint's pace
//! (`sender/requeue_model.rs`).
//! The messages of one batch for the same endpoint take their slots together and give them
//! back together: two writes of the slot record for the batch, not two per message. A slot
//! works through its batch's messages for one request deadline (the hold), each request sent
//! as soon as the previous one is answered.
//!
//! An endpoint with one slot is kept busy across senders: a message that finds the slot
//! held is listed on the slot record and comes back when the holder's hold is over; the
//! holder takes listed deliveries once its own are done, and a message that comes while
//! the holder finishes its last attempt waits for the slot instead of going back to the
//! queue.
//!
//! A webhook this sender could not send at all, for want of its own resources (out of file
//! descriptors: nothing reached the endpoint, no attempt recorded), goes back to the queue
//! due 2–8 s later, as in the embedded dispatcher, instead of after the queue's visibility
//! timeout; its message is done with. The copy is sent with the batch's other follow-ups,
//! when the batch ends (by then the sender has let its idle connections go): one that was
//! due by then comes back at once. If it cannot be queued again, the message fails and
//! comes back after the visibility timeout.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::future::join_all;
use rand::Rng;
use tracing::Instrument;

use super::{
    deliver::{self, AttemptResult},
    ServiceError,
};
use crate::{
    clock::{add, Timestamp},
    domain::{
        AccountId, Delivery, DeliveryId, DeliveryStatus, Endpoint, EndpointId, EndpointStatus,
        Trigger,
    },
    queue::{Queue, QueueError},
    slots::{lease_for, RateLimiter, SlotError, SlotLeases, WAITING_MAX},
    store::{PendingRef, StoreError, Unattempted, UnattemptedMove, RECORD_THROTTLE_WAIT},
    App,
};

/// How long the sender's slot leases last: a slot may take further messages of its batch
/// for one request deadline, and the lease covers the last attempt started then.
pub fn slot_lease(request_deadline: Duration) -> Duration {
    lease_for(request_deadline * 2)
}

/// The longest a queue batch can take the sender: a one-slot endpoint's wait for the slot,
/// the hold that starts further attempts, and the last attempt started at its end, each up to
/// one request deadline; then the writes that record the attempts, which wait at most
/// [`RECORD_THROTTLE_WAIT`] for a throttled table, and `AFTER_THE_WAIT` more. The function's
/// timeout covers it.
pub fn longest_batch(request_deadline: Duration) -> Duration {
    request_deadline * 3 + RECORD_THROTTLE_WAIT + AFTER_THE_WAIT
}

/// Three requests that may follow the record's wait (its last, the endpoint's failing clock,
/// and the follow-up's queueing), each with the SDK's three tries, of at most
/// [`TRY_ANSWER_WAIT`] before their answer begins, and its pauses between them (up to 1 s,
/// then 2 s). Checked against the SDK's configuration in `aws::clients`. Not counted: the
/// other requests that may follow the record one after another: the attempt's detail row,
/// the clock's read, the slot's release, the hour counts, and a schedule before the SQS send
/// (eight in all). Each answers in milliseconds; one that goes unanswered costs 1.5 s and a
/// try more, and 7.5 s only if all three tries go unanswered. The record's last write is
/// the first of the chain: what the function's timeout cuts short after it sends no webhook
/// twice (the messages come back, and the repeat finds each delivery recorded and queues it
/// again), but the detail rows and hour counts not yet written are missing, and the slots'
/// leases are held until they end.
pub const AFTER_THE_WAIT: Duration = Duration::from_millis(3 * ONE_WRITE.as_millis() as u64);

/// One request's three tries, each of at most [`TRY_ANSWER_WAIT`] before its answer begins,
/// and the SDK's pauses between them (up to 1 s, then 2 s).
pub const ONE_WRITE: Duration =
    Duration::from_millis(3 * TRY_ANSWER_WAIT.as_millis() as u64 + 3000);

/// How much of a Lambda invocation must be left for the sender to send a webhook: the
/// request's deadline, then the record's wait for a throttled table and its last write's
/// tries. A webhook sent later could be cut off by the function's timeout before its record
/// is written, and be sent again; its message goes back to the queue instead. A batch's
/// sends start within two deadlines (a slot's wait and its hold) unless reads before them
/// went unanswered: the function's timeout leaves room for both (a template test).
pub fn send_margin(request_deadline: Duration) -> Duration {
    request_deadline + RECORD_THROTTLE_WAIT + ONE_WRITE
}

/// How long one try of a request to DynamoDB or the Scheduler, or of a send to SQS, waits
/// for its answer to begin (connecting and sending included; the SDK's read timeout) before
/// the SDK gives it up and tries again. Without it, a request whose answer never came (a
/// connection lost on the way) waited until Lambda stopped the function, and a sender
/// stopped there has sent webhooks it never recorded. DynamoDB begins its answer within
/// milliseconds; the body that follows (a page of a query, a batch of payloads) is not
/// counted, so a large read is never cut short. AWS advises a second or more for
/// `TransactWriteItems`, whose tries share the idempotency token the SDK fills in, so that a
/// try rarely meets its own transaction still under way.
pub const TRY_ANSWER_WAIT: Duration = Duration::from_millis(1500);

pub const REQUEUE_MIN: Duration = Duration::from_secs(5);
pub const REQUEUE_MAX: Duration = Duration::from_secs(15);
/// The longest a message waits in the queue for a busy endpoint: a delivery that has waited
/// long comes back this often, so the endpoint's slot, once free, is taken within it. Under
/// SQS's 900 s `DelaySeconds`, so a re-queue never takes the Scheduler's path.
pub const BUSY_REQUEUE_LONGEST: Duration = Duration::from_secs(300);
const _: () = assert!(
    BUSY_REQUEUE_LONGEST.as_secs() as i64 <= crate::queue::sqs::MAX_SQS_DELAY_SECONDS,
    "a re-queue for a busy endpoint must fit SQS's DelaySeconds"
);

/// A delivery not sent for want of this sender's own resources (file descriptors) goes back
/// to the queue for this long, drawn between the two, as the embedded dispatcher's do: soon,
/// as it is not the endpoint's fault, and spread out so that the deliveries put back
/// together do not all connect again at once.
pub const UNSENT_REQUEUE_MIN: Duration = Duration::from_secs(2);
pub const UNSENT_REQUEUE_MAX: Duration = Duration::from_secs(8);

#[derive(Debug, thiserror::Error)]
pub enum SenderError {
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// The attempt failed or was left unrecorded: the message comes back, as for any error.
    /// (One not sent for want of this process's own resources is re-queued instead, as
    /// [`Busy::OutOfResources`], unless that fails.)
    #[error(transparent)]
    Attempt(#[from] deliver::AttemptError),
    #[error(transparent)]
    Slots(#[from] SlotError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// An attempt ran (or the delivery needed none); its follow-up is queued.
    Attempted(AttemptResult),
    /// The endpoint is busy or over its rate, or this sender could not send: the message
    /// was queued again for later, no attempt spent.
    Requeued { after: Duration, busy: Busy },
    /// Nothing to do: the delivery is no longer pending, or its endpoint is gone or disabled.
    Skipped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    AllSlotsHeld,
    RateLimited,
    /// This batch held a slot for the endpoint as long as its lease allows; the slot is
    /// free now, so the message comes back at once to take it.
    SlotTimeUsed,
    /// This sender ran out of its own resources, such as file descriptors: nothing was
    /// sent and no attempt recorded (not the endpoint's fault), so the message comes back
    /// in 2–8 s.
    OutOfResources,
}

/// The per-endpoint limits kept outside the sender instances.
#[derive(Clone, Copy)]
pub struct Lanes<'a> {
    pub slots: &'a dyn SlotLeases,
    pub rate: &'a dyn RateLimiter,
    /// How long past due the sweeper lets a pending delivery be before it re-sends it: a
    /// delivery re-queued for a busy endpoint has its next try moved before then.
    pub sweep_grace: Duration,
    /// On Lambda, the last moment a webhook may be sent (see [`send_margin`]); its message
    /// goes back to the queue instead, as for a sender out of its own resources.
    pub send_by: Option<tokio::time::Instant>,
}

pub async fn handle_message(
    app: &App,
    lanes: Lanes<'_>,
    delivery_id: &DeliveryId,
    endpoint_id: &EndpointId,
    account_id: &AccountId,
) -> Result<Handled, SenderError> {
    let mut handled =
        handle_endpoint_group(lanes, &[(app, delivery_id)], endpoint_id, account_id).await;
    flush_hour_counts(app).await;
    // One message in, one outcome out.
    handled.pop().unwrap_or(Ok(Handled::Skipped))
}

/// One message of a queue batch: which delivery, for whom.
pub type Message = (DeliveryId, EndpointId, AccountId);

/// A queue batch: the messages of each endpoint handled together (see
/// [`handle_endpoint_group`]), the endpoints side by side, and the follow-ups they queue
/// (retries; re-queues for busy endpoints and for webhooks not sent) sent together, so SQS
/// takes ten to a request. One outcome per message, in order. If the follow-ups cannot be
/// queued, every message that had one fails, so the queue hands it out again (its attempt,
/// if any, is recorded; the repeat finds it not yet due and queues it again).
pub async fn handle_batch(
    app: &App,
    lanes: Lanes<'_>,
    messages: &[Message],
) -> Vec<Result<Handled, SenderError>> {
    let held: Vec<Arc<Held>> = messages.iter().map(|_| Arc::default()).collect();
    // Each message's follow-ups are held back apart, to tell which message had one.
    let holding: Vec<App> = held
        .iter()
        .map(|held| App {
            queue: Arc::new(Holding {
                inner: app.queue.clone(),
                held: held.clone(),
            }),
            ..app.clone()
        })
        .collect();
    let mut groups: Vec<(&EndpointId, &AccountId, Vec<usize>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (position, (delivery, endpoint, account)) in messages.iter().enumerate() {
        // A second copy of a delivery in the same batch is done with the first.
        if !seen.insert(delivery) {
            continue;
        }
        match groups
            .iter_mut()
            .find(|(e, a, _)| *e == endpoint && *a == account)
        {
            Some((_, _, positions)) => positions.push(position),
            None => groups.push((endpoint, account, vec![position])),
        }
    }
    let handled = join_all(groups.iter().map(|(endpoint, account, positions)| {
        let group: Vec<(&App, &DeliveryId)> = positions
            .iter()
            .map(|&p| (&holding[p], &messages[p].0))
            .collect();
        async move { handle_endpoint_group(lanes, &group, endpoint, account).await }
    }))
    .await;
    flush_hour_counts(app).await;
    // Every position but a repeated copy's belongs to one group and is replaced; the
    // copies stay `Skipped`.
    let mut outcomes: Vec<Result<Handled, SenderError>> =
        messages.iter().map(|_| Ok(Handled::Skipped)).collect();
    for ((_, _, positions), results) in groups.iter().zip(handled) {
        for (&position, result) in positions.iter().zip(results) {
            outcomes[position] = result;
        }
    }
    let follow_ups: Vec<PendingRef> = held.iter().flat_map(|h| h.take()).collect();
    if follow_ups.is_empty() {
        return outcomes;
    }
    if let Err(error) = app.queue.enqueue(follow_ups).await {
        for (outcome, held) in outcomes.iter_mut().zip(&held) {
            if held.had_any() && outcome.is_ok() {
                *outcome = Err(SenderError::Queue(QueueError(error.0.clone())));
            }
        }
    }
    outcomes
}

/// The batch's attempts counted by endpoint and hour, written once for the batch. They
/// are for health at a glance: a failure to write them is logged, and fails no message
/// (the store keeps them for the next batch).
async fn flush_hour_counts(app: &App) {
    if let Err(error) = app.store.flush_hour_counts().await {
        tracing::warn!(%error, "cannot write the endpoints' hour counts; kept for the next batch");
    }
}

/// The messages of one batch for one endpoint, each with the App to use for it: the
/// endpoint is read once, each message's delivery is checked to be pending and due, each
/// takes a rate token (if the endpoint has a rate limit), then their in-flight slots are
/// taken together — as many as are free, up to one per message — each slot works through
/// the messages in turn for up to one request deadline, and the slots are given back
/// together when all of them are done. A message that finds no free slot or token, or no
/// time left, is re-queued without spending an attempt, as is one whose webhook this sender
/// could not send for want of its own resources. One outcome per message, in order.
async fn handle_endpoint_group(
    lanes: Lanes<'_>,
    group: &[(&App, &DeliveryId)],
    endpoint_id: &EndpointId,
    account_id: &AccountId,
) -> Vec<Result<Handled, SenderError>> {
    let Some(&(app, _)) = group.first() else {
        return Vec::new();
    };
    let endpoint = match app.store.get_endpoint(account_id, endpoint_id).await {
        Ok(Some(endpoint)) if endpoint.status == EndpointStatus::Active => endpoint,
        // Disabled or deleted, which abandoned its pending work; a delivery that abandon
        // missed (it reads the `pending` index, which lags its last writes) ends here, unsent,
        // rather than staying pending: one read of each delivery.
        Ok(inactive) => {
            let deleted = inactive.is_none();
            return join_all(group.iter().map(|&(app, delivery)| async move {
                match deliver::abandon_if_pending(app, account_id, delivery, endpoint_id, deleted)
                    .await
                {
                    Ok(AttemptResult::Unsendable) => {
                        Ok(Handled::Attempted(AttemptResult::Unsendable))
                    }
                    Ok(_) => Ok(Handled::Skipped),
                    Err(error) => Err(error.into()),
                }
            }))
            .await;
        }
        Err(error) => {
            let text = error.to_string();
            return group
                .iter()
                .map(|_| Err(ServiceError::from(StoreError::Backend(text.clone())).into()))
                .collect();
        }
    };
    let span = |delivery: &DeliveryId| {
        tracing::info_span!(
            "message",
            delivery.id = %delivery,
            endpoint.id = %endpoint.id,
            account.id = %endpoint.account_id,
        )
    };
    let mut outcomes: Vec<Option<Result<Handled, SenderError>>> =
        group.iter().map(|_| None).collect();
    // Each delivery as it stands, read side by side: only pending, due ones go on.
    let states = join_all(
        group
            .iter()
            .map(|&(app, delivery)| app.store.get_delivery(account_id, delivery)),
    )
    .await;
    let mut ready: Vec<(usize, Delivery)> = Vec::new();
    for (n, state) in states.into_iter().enumerate() {
        let app = group[n].0;
        match state {
            Ok(Some(d)) if d.status == DeliveryStatus::Pending && d.endpoint_id == endpoint.id => {
                let now = app.clock.now();
                match d.next_try_at {
                    // Early (a retry's message that SQS could not hold long enough, or a
                    // repeat of a deferred one): back to the queue for its time, no slot.
                    Some(due) if due > add(now, EARLY) => {
                        let result = AttemptResult::NotYetDue(PendingRef::new(&d, &endpoint, due));
                        outcomes[n] = Some(follow_up(app, result).await);
                    }
                    _ => ready.push((n, d)),
                }
            }
            Ok(_) => outcomes[n] = Some(Ok(Handled::Skipped)),
            Err(error) => outcomes[n] = Some(Err(ServiceError::from(error).into())),
        }
    }
    let mut rate_ok: Vec<(usize, Delivery)> = Vec::new();
    for (n, d) in ready {
        let (app, delivery) = group[n];
        if let Some(per_second) = endpoint.rate_limit_per_second {
            match lanes.rate.try_take(&endpoint.id, per_second).await {
                Ok(true) => {}
                Ok(false) => {
                    let requeued = requeue(
                        app,
                        lanes,
                        &d,
                        &endpoint,
                        Busy::RateLimited,
                        busy_delay(Busy::RateLimited, waited(&d, app.clock.now())),
                    )
                    .instrument(span(delivery))
                    .await;
                    outcomes[n] = Some(requeued);
                    continue;
                }
                Err(error) => {
                    outcomes[n] = Some(Err(error.into()));
                    continue;
                }
            }
        }
        rate_ok.push((n, d));
    }
    let mut ready = rate_ok;
    let deadline = app.config.sender.deadline;
    let lease = slot_lease(deadline);
    let wanted = u32::try_from(ready.len()).unwrap_or(u32::MAX);
    let take = || {
        lanes
            .slots
            .acquire_many(&endpoint.id, endpoint.max_in_flight, wanted, lease)
    };
    let mut tokens = if ready.is_empty() {
        Vec::new()
    } else {
        match take().await {
            Ok(tokens) => tokens,
            Err(error) => {
                for (n, _) in &ready {
                    outcomes[*n] = Some(Err(SlotError(error.0.clone()).into()));
                }
                ready.clear();
                Vec::new()
            }
        }
    };
    // A one-slot endpoint's holder whose hold is over is finishing its last attempt and
    // gives the slot back within a deadline: waiting for it here beats a trip through the
    // queue, which would leave the endpoint idle meanwhile. Otherwise `back_at` is when
    // the listed messages come back: when the holder's hold is over, or its lease if it
    // does not give the slot back.
    let mut back_at = None;
    if tokens.is_empty() && !ready.is_empty() && lists_waiting(&endpoint) {
        let polled_from = std::time::Instant::now();
        let mut kept = false;
        loop {
            let leases = match lanes.slots.live_leases(&endpoint.id).await {
                Ok(leases) => leases,
                Err(error) => {
                    tracing::warn!(endpoint.id = %endpoint.id, %error, "cannot read the slot leases");
                    break;
                }
            };
            if let Some(expiry) = leases.first() {
                let over =
                    *expiry - chrono::Duration::from_std(lease - deadline).unwrap_or_default();
                if over > app.clock.now() {
                    back_at = Some(over);
                    break;
                }
                if polled_from.elapsed() >= deadline {
                    back_at = Some(*expiry);
                    break;
                }
                if !kept {
                    // Meanwhile the sweeper must not send them again: this wait, a hold
                    // and the attempt under way at its end.
                    let until = add(app.clock.now(), deadline * 3);
                    kept = true;
                    let waiting = std::mem::take(&mut ready);
                    ready = keep_all(group, lanes, waiting, until, &mut outcomes).await;
                    if ready.is_empty() {
                        break;
                    }
                }
                tokio::time::sleep(SLOT_POLL).await;
                continue;
            }
            // Given back (or run out): take it, unless another sender was quicker.
            match take().await {
                Ok(taken) if !taken.is_empty() => {
                    tokens = taken;
                    break;
                }
                Ok(_) if polled_from.elapsed() < deadline => {}
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(endpoint.id = %endpoint.id, %error, "cannot take a slot");
                    break;
                }
            }
        }
    }
    // Each slot taken works through the waiting messages in turn: a slot freed by a finished
    // attempt goes to the next message at once instead of idling until a re-queued copy
    // comes back, as long as another attempt still fits in the slot's lease. The messages
    // that wait for one of this batch's slots may wait up to two deadlines: the sweeper must
    // not send them again meanwhile. (Without a slot, all of them go back to the queue.)
    // The leases run from here.
    let started = std::time::Instant::now();
    // An endpoint with a rate limit took a token per message above, for now: its messages
    // are not held for later (one per slot, the rest back to the queue).
    let hold = if endpoint.rate_limit_per_second.is_some() {
        Duration::ZERO
    } else {
        deadline
    };
    // The last of them may wait for the hold, then for the attempt under way at its end.
    let held_until = add(app.clock.now(), deadline * 2);
    let first_ones = if tokens.is_empty() || hold.is_zero() {
        ready.len()
    } else {
        tokens.len().min(ready.len())
    };
    let later = ready.split_off(first_ones);
    let mut held = ready;
    held.extend(keep_all(group, lanes, later, held_until, &mut outcomes).await);
    let waiting =
        std::sync::Mutex::new(held.into_iter().collect::<std::collections::VecDeque<_>>());
    // Each slot's first message goes at once; the next ones while the hold lasts.
    let next = |first: bool| {
        let mut waiting = waiting.lock().unwrap_or_else(|p| p.into_inner());
        (first || started.elapsed() < hold)
            .then(|| waiting.pop_front())
            .flatten()
    };
    let worked = join_all(tokens.iter().map(|_| async {
        let mut done = Vec::new();
        // The slot bounds requests in flight, not bookkeeping: the next request goes as
        // soon as the endpoint has answered, while the last attempt is being recorded.
        let mut recording = futures_util::stream::FuturesUnordered::new();
        let mut sent = 0usize;
        while let Some((n, d)) = next(sent == 0) {
            sent += 1;
            let (app, delivery) = group[n];
            let answered = Arc::new(tokio::sync::Notify::new());
            let signal = answered.clone();
            let endpoint = &endpoint;
            recording.push(async move {
                let answered = move || signal.notify_one();
                let result = attempt_answering(app, lanes, &d, endpoint, &answered)
                    .instrument(span(delivery))
                    .await;
                (n, result)
            });
            loop {
                tokio::select! {
                    _ = answered.notified() => break,
                    finished = futures_util::StreamExt::next(&mut recording) => match finished {
                        Some((m, result)) => {
                            done.push((m, result));
                            if m == n {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
        }
        while let Some(finished) = futures_util::StreamExt::next(&mut recording).await {
            done.push(finished);
        }
        // Then deliveries other senders could not start, while the hold lasts.
        while lists_waiting(&endpoint) && started.elapsed() < hold {
            match attempt_waiting(app, lanes, &endpoint).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(error) => {
                    tracing::warn!(endpoint.id = %endpoint.id, %error, "cannot take a waiting delivery");
                    break;
                }
            }
        }
        done
    }))
    .await;
    if let Err(error) = lanes.slots.release_many(&tokens).await {
        // The leases run out by themselves; only this endpoint's throughput suffers meanwhile.
        tracing::warn!(endpoint.id = %endpoint.id, %error, "slot release failed");
    }
    for (n, result) in worked.into_iter().flatten() {
        outcomes[n] = Some(result);
    }
    // No slot for them, or no time left on the slots this batch held (given back just
    // now): back to the queue, no attempt spent.
    let busy = if tokens.is_empty() {
        Busy::AllSlotsHeld
    } else {
        Busy::SlotTimeUsed
    };
    let left: Vec<(usize, Delivery)> = waiting
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into();
    // Without a slot, the first few are listed for the endpoint's holder to take while
    // their messages wait (see [`attempt_waiting`]).
    let listed = if tokens.is_empty() && lists_waiting(&endpoint) {
        WAITING_MAX
    } else {
        0
    };
    // Their messages come back when the holder's hold is over, to take the slot in turn
    // (and so serve the list).
    let requeued = join_all(left.iter().enumerate().map(|(position, (n, d))| {
        let (app, delivery) = group[*n];
        let after = match back_at {
            Some(at) if position < listed => until_slot_free(app.clock.now(), at),
            _ => busy_delay(busy, waited(d, app.clock.now())),
        };
        let endpoint = &endpoint;
        async move {
            let requeued = requeue(app, lanes, d, endpoint, busy, after)
                .instrument(span(delivery))
                .await;
            (position, *n, add(app.clock.now(), after), requeued)
        }
    }))
    .await;
    let mut waiting_list = Vec::new();
    for (position, n, back, requeued) in requeued {
        if position < listed && matches!(requeued, Ok(Handled::Requeued { .. })) {
            waiting_list.push((left[position].1.id.clone(), back));
        }
        outcomes[n] = Some(requeued);
    }
    if let Err(error) = lanes.slots.wait(&endpoint.id, &waiting_list).await {
        // Their messages come back all the same.
        tracing::warn!(endpoint.id = %endpoint.id, %error, "cannot list waiting deliveries");
    }
    // Every message was skipped, re-queued, refused or attempted above.
    outcomes
        .into_iter()
        .map(|outcome| outcome.unwrap_or(Ok(Handled::Skipped)))
        .collect()
}

/// One attempt of a delivery whose slot is held, and its follow-up queued; `answered` is
/// called once the endpoint has answered (or the request failed), before the recording.
/// A webhook not sent for want of this process's own resources is re-queued for 2–8 s
/// ([`Busy::OutOfResources`]); the message fails only if that cannot be done.
async fn attempt_answering(
    app: &App,
    lanes: Lanes<'_>,
    delivery: &Delivery,
    endpoint: &Endpoint,
    answered: &(dyn Fn() + Send + Sync),
) -> Result<Handled, SenderError> {
    let sent = deliver::attempt_sent_by(
        app,
        &delivery.id,
        Trigger::Scheduled,
        answered,
        lanes.send_by,
    );
    match sent.await {
        Ok(result) => follow_up(app, result).await,
        Err(deliver::AttemptError::Unsent(fault)) => {
            // Nothing was sent and nothing recorded (the attempt logged why): the delivery
            // is as it was read, pending with the same attempts.
            let busy = Busy::OutOfResources;
            tracing::debug!(delivery.id = %delivery.id, cause = %fault, "webhook not sent; back to the queue");
            requeue(
                app,
                lanes,
                delivery,
                endpoint,
                busy,
                busy_delay(busy, Duration::ZERO),
            )
            .await
        }
        Err(error) => Err(error.into()),
    }
}

async fn follow_up(app: &App, result: AttemptResult) -> Result<Handled, SenderError> {
    if let Some(next) = result.follow_up() {
        app.queue.enqueue(vec![next.clone()]).await?;
    }
    Ok(Handled::Attempted(result))
}

/// Whether the endpoint's busy deliveries are listed for its slot holder: only with one
/// slot, where the slot itself keeps a listed delivery's own message from starting a second
/// request while the holder's is in flight (that message finds the slot held). With more
/// slots it could take another one, so they wait for their messages.
fn lists_waiting(endpoint: &Endpoint) -> bool {
    endpoint.max_in_flight == 1 && endpoint.rate_limit_per_second.is_none()
}

/// Takes one delivery off the endpoint's waiting list and attempts it, with the endpoint's
/// one slot held. Its follow-up is not queued: the delivery's own message is still on its
/// way and carries on from there when it comes back (it finds the delivery done, a retry
/// due, or a retry to queue for its time). That goes for a webhook not sent for want of
/// this process's own resources too (nothing recorded: its message finds it still to be
/// tried), so it is not re-queued. `false` when there is nothing more to take: the list is
/// empty, or this process is out of resources and the next one would fare no better.
async fn attempt_waiting(
    app: &App,
    lanes: Lanes<'_>,
    endpoint: &Endpoint,
) -> Result<bool, SenderError> {
    let Some(delivery) = lanes
        .slots
        .take_waiting(&endpoint.id, app.clock.now())
        .await?
    else {
        return Ok(false);
    };
    let span = tracing::info_span!(
        "waiting",
        delivery.id = %delivery,
        endpoint.id = %endpoint.id,
        account.id = %endpoint.account_id,
    );
    let result = match deliver::attempt_sent_by(
        app,
        &delivery,
        Trigger::Scheduled,
        &|| {},
        lanes.send_by,
    )
    .instrument(span)
    .await
    {
        Ok(result) => result,
        Err(deliver::AttemptError::Unsent(fault)) => {
            tracing::debug!(delivery.id = %delivery, endpoint.id = %endpoint.id, cause = %fault, "waiting delivery not sent; its own message brings it back");
            return Ok(false);
        }
        Err(error) => return Err(error.into()),
    };
    tracing::debug!(delivery.id = %delivery, endpoint.id = %endpoint.id, ?result, "waiting delivery taken");
    Ok(true)
}

/// [`keep_from_sweeper`] for each of `deliveries` side by side: the ones still pending come
/// back (their `queued_until` as now stored); the others get their outcome.
async fn keep_all(
    group: &[(&App, &DeliveryId)],
    lanes: Lanes<'_>,
    deliveries: Vec<(usize, Delivery)>,
    until: Timestamp,
    outcomes: &mut [Option<Result<Handled, SenderError>>],
) -> Vec<(usize, Delivery)> {
    let kept = join_all(deliveries.into_iter().map(|(n, mut d)| async move {
        let kept = keep_from_sweeper(group[n].0, lanes, &d, until).await;
        if matches!(kept, Ok(true)) {
            d.queued_until = d.queued_until.max(Some(until));
        }
        (n, d, kept)
    }))
    .await;
    let mut still = Vec::with_capacity(kept.len());
    for (n, d, kept) in kept {
        match kept {
            Ok(true) => still.push((n, d)),
            Ok(false) => outcomes[n] = Some(Ok(Handled::Skipped)),
            Err(error) => outcomes[n] = Some(Err(error)),
        }
    }
    still
}

/// Makes sure the sweeper does not take `delivery` for lost before `until`, when its
/// message is expected back: a conditional write when the sweeper's grace would run out
/// first, nothing otherwise. `false` when the delivery has moved on meanwhile.
async fn keep_from_sweeper(
    app: &App,
    lanes: Lanes<'_>,
    delivery: &Delivery,
    until: Timestamp,
) -> Result<bool, SenderError> {
    let expected = delivery
        .next_try_at
        .unwrap_or(delivery.created_at)
        .max(delivery.queued_until.unwrap_or(delivery.created_at));
    if add(expected, lanes.sweep_grace) > add(until, REQUEUE_MAX) {
        return Ok(true);
    }
    let change = UnattemptedMove::of(delivery, Unattempted::Defer(until), app.clock.now());
    Ok(app
        .store
        .move_unattempted(&change)
        .await
        .map_err(ServiceError::from)?)
}

/// A message this much before its delivery's time is early, not due.
const EARLY: Duration = Duration::from_millis(500);

/// What one message of a batch queued, held back to be sent with the rest of the batch.
#[derive(Default)]
struct Held {
    items: Mutex<Vec<PendingRef>>,
    had_any: std::sync::atomic::AtomicBool,
}

impl Held {
    fn take(&self) -> Vec<PendingRef> {
        std::mem::take(&mut *self.items.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn had_any(&self) -> bool {
        self.had_any.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct Holding {
    inner: Arc<dyn Queue>,
    held: Arc<Held>,
}

#[async_trait::async_trait]
impl Queue for Holding {
    async fn enqueue(&self, items: Vec<PendingRef>) -> Result<(), QueueError> {
        self.held
            .had_any
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.held
            .items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(items);
        Ok(())
    }

    async fn update_lane(
        &self,
        endpoint: &EndpointId,
        max_in_flight: u32,
        rate_limit_per_second: Option<u32>,
    ) {
        self.inner
            .update_lane(endpoint, max_in_flight, rate_limit_per_second)
            .await;
    }
}

/// How long a message waits for a busy endpoint: 5–15 s (jittered, so senders do not come
/// back in step), or, once the delivery has `waited` past its time longer than that, half to
/// all of that again, at most [`BUSY_REQUEUE_LONGEST`]; nothing when this batch has just
/// given the endpoint's slot back; 2–8 s for one this sender could not send
/// ([`UNSENT_REQUEUE_MIN`]), which is no fault of the endpoint's.
fn busy_delay(busy: Busy, waited: Duration) -> Duration {
    busy_delay_drawn(busy, waited, &mut rand::rng())
}

fn busy_delay_drawn(busy: Busy, waited: Duration, rng: &mut impl Rng) -> Duration {
    match busy {
        Busy::SlotTimeUsed => Duration::ZERO,
        Busy::AllSlotsHeld | Busy::RateLimited => {
            let first = rng.random_range(REQUEUE_MIN..=REQUEUE_MAX);
            // Doubling the wait bounds the trips at about log2 of it, plus one per
            // `BUSY_REQUEUE_LONGEST` once there; the jitter keeps a backlog spread out.
            let again = waited
                .min(BUSY_REQUEUE_LONGEST)
                .mul_f64(rng.random_range(0.5..=1.0));
            first.max(again).min(BUSY_REQUEUE_LONGEST)
        }
        Busy::OutOfResources => rng.random_range(UNSENT_REQUEUE_MIN..=UNSENT_REQUEUE_MAX),
    }
}

/// How long `delivery` has waited past its time (its retry's, or its creation for a first
/// try): a busy endpoint's re-queue is about as long again. Waiting for a busy endpoint moves
/// only `queued_until`, never this.
fn waited(delivery: &Delivery, now: Timestamp) -> Duration {
    (now - delivery.next_try_at.unwrap_or(delivery.created_at))
        .to_std()
        .unwrap_or_default()
}

/// How long a listed delivery's message waits: until `at` (the holder's hold is over), plus
/// up to half a second so that the copies do not all come at once, at most the usual 15 s.
fn until_slot_free(now: Timestamp, at: Timestamp) -> Duration {
    let left = (at - now).to_std().unwrap_or_default();
    let jitter = rand::rng().random_range(Duration::ZERO..=Duration::from_millis(500));
    (left + jitter).min(REQUEUE_MAX)
}

/// How often a sender waiting for a one-slot endpoint's holder to finish looks at the slot.
const SLOT_POLL: Duration = Duration::from_millis(200);

/// Puts the message back for `after` ([`busy_delay`], or [`until_slot_free`] for a listed
/// delivery), no attempt spent. When the sweeper would take the delivery for lost before
/// the message is back (its next try plus the sweeper's grace comes first), its
/// `queued_until` moves to the message's time: one conditional write per grace period of
/// waiting, not per re-queue.
async fn requeue(
    app: &App,
    lanes: Lanes<'_>,
    delivery: &Delivery,
    endpoint: &Endpoint,
    busy: Busy,
    after: Duration,
) -> Result<Handled, SenderError> {
    let now = app.clock.now();
    let due = add(now, after);
    if !keep_from_sweeper(app, lanes, delivery, due).await? {
        // Attempted or finished meanwhile: this copy is not needed.
        return Ok(Handled::Skipped);
    }
    app.queue
        .enqueue(vec![PendingRef::new(delivery, endpoint, due)])
        .await?;
    tracing::debug!(delivery.id = %delivery.id, endpoint.id = %endpoint.id, ?busy, ?after, "no attempt now; re-queued");
    Ok(Handled::Requeued { after, busy })
}

#[cfg(test)]
mod requeue_model;

#[cfg(test)]
mod tests {
    use std::sync::{atomic::Ordering, Arc};

    use super::*;
    use crate::{
        clock::SystemClock,
        config::CoreConfig,
        domain::{DeliveryStatus, EndpointStatus},
        fixtures,
        http::{AddressPolicy, HttpSender, SenderConfig},
        notify::LogNotifier,
        queue::sqs::{
            tests::{emulated_queue, receive, Emulated},
            DeliveryMessage,
        },
        service::publish::{publish, NewEvent},
        slots::dynamodb::{tests::slots, DynamoSlots},
        store::Store,
        testing::emulator_store,
        testing::slow_receiver,
    };

    async fn aws_app(receiver_url: &str, cap: u32) -> (App, Emulated, DynamoSlots) {
        let store = emulator_store().await;
        let emulated = emulated_queue().await;
        let queue = emulated.queue.clone();
        let sender = SenderConfig {
            policy: AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()], false),
            ..SenderConfig::default()
        };
        let config = CoreConfig {
            sender: sender.clone(),
            ..CoreConfig::default()
        };
        store
            .create_account(&fixtures::account("acme"))
            .await
            .unwrap();
        let mut endpoint = fixtures::endpoint("acme", "ep_slow", chrono::Utc::now());
        endpoint.url = crate::domain::EndpointUrl::parse(receiver_url).unwrap();
        endpoint.max_in_flight = cap;
        store.create_endpoint(&endpoint).await.unwrap();
        let app = App {
            store: Arc::new(store),
            queue: Arc::new(queue),
            transport: Arc::new(HttpSender::new(sender).unwrap()),
            notifier: Arc::new(LogNotifier),
            clock: Arc::new(SystemClock),
            config: Arc::new(config),
            // No stream runs here: publishing writes the deliveries and queues them.
            publish: crate::PublishMode::WithDeliveries,
        };
        (app, emulated, slots().await)
    }

    /// The lanes of the emulator's slot table, for a sweeper with this grace.
    fn lanes_of(slots: &DynamoSlots, sweep_grace: std::time::Duration) -> Lanes<'_> {
        Lanes {
            slots,
            rate: slots,
            sweep_grace,
            send_by: None,
        }
    }

    async fn next_message(e: &Emulated) -> (DeliveryId, EndpointId, AccountId) {
        let messages = receive(e, 1).await;
        assert_eq!(messages.len(), 1, "{messages:?}");
        DeliveryMessage::parse(messages[0].body().unwrap()).unwrap()
    }

    /// How many messages the queue holds back for their delay.
    async fn delayed_messages(e: &Emulated) -> usize {
        let name = aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesDelayed;
        e.sqs
            .get_queue_attributes()
            .queue_url(&e.queue_url)
            .attribute_names(name.clone())
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap_or_default()
            .remove(&name)
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Publishes an `invoice.paid` of this id to `acme` and takes its delivery's message
    /// off the queue, as the sender's trigger would hand it over.
    async fn stored(app: &App, account: &AccountId, delivery: &DeliveryId) -> Delivery {
        app.store
            .get_delivery(account, delivery)
            .await
            .unwrap()
            .expect("the delivery is stored")
    }

    async fn publish_and_receive(
        app: &App,
        e: &Emulated,
        id: &str,
    ) -> (DeliveryId, EndpointId, AccountId) {
        let new = NewEvent {
            id: Some(id.into()),
            event_type: "invoice.paid".into(),
            data: serde_json::json!({}),
        };
        publish(app, &AccountId::parse("acme").unwrap(), new)
            .await
            .unwrap();
        next_message(e).await
    }

    #[tokio::test]
    async fn a_message_becomes_one_signed_attempt_with_a_slot_held_meanwhile() {
        let receiver = slow_receiver(std::time::Duration::from_millis(10)).await;
        let (app, emulated, slots) = aws_app(&receiver.url, 1).await;
        let account = AccountId::parse("acme").unwrap();
        let new = NewEvent {
            id: None,
            event_type: "invoice.paid".into(),
            data: serde_json::json!({"n": 1}),
        };
        let published = publish(&app, &account, new).await.unwrap();
        let (delivery, endpoint, account_id) = next_message(&emulated).await;
        assert_eq!(delivery, published.deliveries[0].id);
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));
        let handled = handle_message(&app, lanes, &delivery, &endpoint, &account_id)
            .await
            .unwrap();
        assert!(
            matches!(
                handled,
                Handled::Attempted(AttemptResult::Attempted {
                    decision: crate::domain::Decision::Delivered,
                    ..
                })
            ),
            "{handled:?}"
        );
        assert_eq!(receiver.served.load(Ordering::SeqCst), 1);
        let stored = stored(&app, &account, &delivery).await;
        assert_eq!(stored.status, DeliveryStatus::Delivered);
        // The slot came back: a cap-1 endpoint is free again.
        let token = slots
            .acquire(&endpoint, 1, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        assert!(token.is_some());
    }

    #[tokio::test]
    async fn a_busy_endpoint_sends_the_message_back_without_spending_an_attempt() {
        let receiver = slow_receiver(std::time::Duration::from_millis(10)).await;
        let (app, emulated, slots) = aws_app(&receiver.url, 1).await;
        let account = AccountId::parse("acme").unwrap();
        let endpoint = EndpointId::parse("ep_slow").unwrap();
        let held = slots
            .acquire(&endpoint, 1, std::time::Duration::from_secs(30))
            .await
            .unwrap();
        assert!(held.is_some());
        let new = NewEvent {
            id: Some("evt_busy".into()),
            event_type: "invoice.paid".into(),
            data: serde_json::json!({}),
        };
        publish(&app, &account, new).await.unwrap();
        let (delivery, endpoint_id, account_id) = next_message(&emulated).await;
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));
        let handled = handle_message(&app, lanes, &delivery, &endpoint_id, &account_id)
            .await
            .unwrap();
        let Handled::Requeued { after, busy } = handled else {
            panic!("expected a re-queue, got {handled:?}");
        };
        assert_eq!(busy, Busy::AllSlotsHeld);
        assert!((REQUEUE_MIN..=REQUEUE_MAX).contains(&after));
        assert_eq!(receiver.served.load(Ordering::SeqCst), 0);
        let stored = stored(&app, &account, &delivery).await;
        assert_eq!(
            (stored.status, stored.attempts),
            (DeliveryStatus::Pending, 0)
        );
        assert!(
            receive(&emulated, 0).await.is_empty(),
            "the re-queued message waits its delay"
        );

        // A disabled endpoint's messages are dropped, unsent; a delivery its disabling left
        // pending (on AWS, the `pending` index had not caught up with it) ends abandoned.
        let mut disabled = app
            .store
            .get_endpoint(&account, &endpoint)
            .await
            .unwrap()
            .unwrap();
        let read = disabled.version();
        disabled.status = EndpointStatus::Disabled;
        app.store.update_endpoint(&disabled, &read).await.unwrap();
        let handled = handle_message(&app, lanes, &delivery, &endpoint_id, &account_id)
            .await
            .unwrap();
        assert_eq!(handled, Handled::Attempted(AttemptResult::Unsendable));
        assert_eq!(receiver.served.load(Ordering::SeqCst), 0);
        let ended = self::stored(&app, &account, &delivery).await;
        assert_eq!(
            (ended.status, ended.attempts),
            (DeliveryStatus::Abandoned, 0)
        );
        let again = handle_message(&app, lanes, &delivery, &endpoint_id, &account_id)
            .await
            .unwrap();
        assert_eq!(again, Handled::Skipped);
    }

    /// A delivery that has waited for a busy endpoint goes back for about as long again
    /// (half to all of it), not the first wait's 5–15 s, and only its `queued_until` moves:
    /// its next trip still measures the wait from its own time. The message waits in SQS.
    #[tokio::test]
    async fn a_delivery_that_has_waited_for_a_busy_endpoint_goes_back_for_longer() {
        let receiver = slow_receiver(std::time::Duration::from_millis(10)).await;
        // Two slots: a one-slot endpoint lists its waiting deliveries for the holder instead.
        let (app, emulated, slots) = aws_app(&receiver.url, 2).await;
        let account = AccountId::parse("acme").unwrap();
        let endpoint = EndpointId::parse("ep_slow").unwrap();
        let held = slots
            .acquire_many(&endpoint, 2, 2, std::time::Duration::from_secs(1800))
            .await
            .unwrap();
        assert_eq!(held.len(), 2);
        let (delivery, endpoint_id, account_id) =
            publish_and_receive(&app, &emulated, "evt_waited").await;
        let published = stored(&app, &account, &delivery).await;
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));
        let mut waits = Vec::new();
        for waited_secs in [0, 240] {
            let later = App {
                clock: Arc::new(crate::clock::ManualClock::new(add(
                    published.created_at,
                    std::time::Duration::from_secs(waited_secs),
                ))),
                ..app.clone()
            };
            let handled = handle_message(&later, lanes, &delivery, &endpoint_id, &account_id)
                .await
                .unwrap();
            let Handled::Requeued { after, busy } = handled else {
                panic!("expected a re-queue, got {handled:?}");
            };
            assert_eq!(busy, Busy::AllSlotsHeld);
            waits.push(after.as_secs());
        }
        assert!((5..=15).contains(&waits[0]), "{waits:?}");
        assert!((120..=240).contains(&waits[1]), "{waits:?}");
        let kept = stored(&app, &account, &delivery).await;
        assert_eq!(
            (kept.status, kept.attempts, kept.next_try_at),
            (DeliveryStatus::Pending, 0, published.next_try_at),
            "waiting moves no more than queued_until"
        );
        assert!(kept.queued_until > published.queued_until);
        assert_eq!(receiver.served.load(Ordering::SeqCst), 0);
        assert!(receive(&emulated, 0).await.is_empty());
        assert_eq!(
            delayed_messages(&emulated).await,
            2,
            "both copies wait in SQS"
        );
    }
    /// A webhook this sender had no descriptor to send (EMFILE) is put back on the queue for
    /// 2–8 s, as the embedded dispatcher does, instead of failing the message (back only after
    /// the queue's visibility timeout); no attempt is recorded against the endpoint.
    #[tokio::test]
    async fn a_message_not_sent_for_want_of_descriptors_is_requeued_for_seconds_with_no_attempt() {
        let receiver = slow_receiver(std::time::Duration::from_millis(10)).await;
        let (mut app, emulated, slots) = aws_app(&receiver.url, 1).await;
        let (delivery, endpoint, account) =
            publish_and_receive(&app, &emulated, "evt_emfile").await;
        // What the `HttpSender` answers when the process is out of file descriptors even
        // after dropping its idle connections: nothing was sent.
        app.transport = Arc::new(fixtures::Answering(crate::http::OutboundResponse {
            error: Some("not sent: out of file descriptors".into()),
            unsent: Some(crate::http::LocalFault::ProcessFileLimit),
            ..Default::default()
        }));
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));
        let handled = handle_message(&app, lanes, &delivery, &endpoint, &account).await;
        let Ok(Handled::Requeued { after, busy }) = handled else {
            panic!("expected a re-queue, got {handled:?}");
        };
        assert_eq!(busy, Busy::OutOfResources);
        assert!(
            (std::time::Duration::from_secs(2)..=std::time::Duration::from_secs(8))
                .contains(&after),
            "back after {after:?}, not 2–8 s"
        );
        assert_eq!(receiver.served.load(Ordering::SeqCst), 0);
        let stored = stored(&app, &account, &delivery).await;
        assert_eq!(
            (stored.status, stored.attempts, stored.last_error),
            (DeliveryStatus::Pending, 0, None)
        );
        let read = app
            .store
            .get_endpoint(&account, &endpoint)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.failing_since, None, "no failure streak");
        // Its copy is on the queue, held back for its delay.
        assert!(
            receive(&emulated, 0).await.is_empty(),
            "the re-queued message waits its delay"
        );
        assert_eq!(delayed_messages(&emulated).await, 1);
        // The slot came back.
        assert!(slots.live_leases(&endpoint).await.unwrap().is_empty());
    }

    /// A queue that takes nothing.
    struct Refusing;

    #[async_trait::async_trait]
    impl Queue for Refusing {
        async fn enqueue(&self, _: Vec<PendingRef>) -> Result<(), QueueError> {
            Err(QueueError("refused".into()))
        }

        async fn update_lane(&self, _: &EndpointId, _: u32, _: Option<u32>) {}
    }

    /// A webhook not sent for want of descriptors whose copy the queue then refuses fails
    /// its message: SQS hands it out again after the visibility timeout, and nothing is lost.
    #[tokio::test]
    async fn a_webhook_not_sent_whose_copy_is_refused_fails_its_message() {
        let receiver = slow_receiver(std::time::Duration::from_millis(10)).await;
        let (mut app, emulated, slots) = aws_app(&receiver.url, 1).await;
        let message = publish_and_receive(&app, &emulated, "evt_emfile_refused").await;
        app.transport = Arc::new(fixtures::Answering(crate::http::OutboundResponse {
            error: Some("not sent: out of file descriptors".into()),
            unsent: Some(crate::http::LocalFault::ProcessFileLimit),
            ..Default::default()
        }));
        app.queue = Arc::new(Refusing);
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));
        let handled = handle_batch(&app, lanes, std::slice::from_ref(&message)).await;
        assert!(
            matches!(handled.as_slice(), [Err(SenderError::Queue(_))]),
            "the message must fail when its copy cannot be queued: {handled:?}"
        );
        let (delivery, _, account) = message;
        let stored = stored(&app, &account, &delivery).await;
        assert_eq!(
            (stored.status, stored.attempts),
            (DeliveryStatus::Pending, 0)
        );
    }

    #[tokio::test]
    async fn copies_of_a_delivery_get_one_attempt_and_a_stale_copy_takes_no_slot() {
        let receiver = slow_receiver(std::time::Duration::from_millis(10)).await;
        let (app, emulated, slots) = aws_app(&receiver.url, 1).await;
        let message = publish_and_receive(&app, &emulated, "evt_copies").await;
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));
        // SQS handed out the same delivery three times in one batch.
        let handled = handle_batch(
            &app,
            lanes,
            &[message.clone(), message.clone(), message.clone()],
        )
        .await;
        let attempted = handled
            .iter()
            .filter(|h| matches!(h, Ok(Handled::Attempted(_))))
            .count();
        let skipped = handled
            .iter()
            .filter(|h| matches!(h, Ok(Handled::Skipped)))
            .count();
        assert_eq!((attempted, skipped), (1, 2), "{handled:?}");
        assert_eq!(receiver.served.load(Ordering::SeqCst), 1);

        // Another copy arrives while the endpoint's only slot is held elsewhere: the delivery
        // is done, so the copy is dropped, not queued again for a slot it does not need.
        let (delivery, endpoint, account_id) = message;
        let held = slots
            .acquire(&endpoint, 1, std::time::Duration::from_secs(30))
            .await
            .unwrap();
        assert!(held.is_some());
        let handled = handle_message(&app, lanes, &delivery, &endpoint, &account_id)
            .await
            .unwrap();
        assert_eq!(handled, Handled::Skipped);
        assert!(
            receive(&emulated, 0).await.is_empty(),
            "nothing was queued again"
        );
    }

    #[tokio::test]
    async fn a_slot_holder_with_time_left_takes_the_delivery_that_found_the_endpoint_busy() {
        let answer = std::time::Duration::from_millis(1500);
        let receiver = slow_receiver(answer).await;
        let (app, emulated, slots) = aws_app(&receiver.url, 1).await;
        let account = AccountId::parse("acme").unwrap();
        let mut messages = Vec::new();
        for id in ["evt_first", "evt_second"] {
            let new = NewEvent {
                id: Some(id.into()),
                event_type: "invoice.paid".into(),
                data: serde_json::json!({}),
            };
            publish(&app, &account, new).await.unwrap();
            messages.push(next_message(&emulated).await);
        }
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));
        let [(first, endpoint, _), (second, _, _)] = &messages[..] else {
            panic!("two messages");
        };
        let began = std::time::Instant::now();
        let (held, waited) = tokio::join!(
            handle_message(&app, lanes, first, endpoint, &account),
            async {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                handle_message(&app, lanes, second, endpoint, &account).await
            }
        );
        assert!(
            matches!(
                held,
                Ok(Handled::Attempted(AttemptResult::Attempted { .. }))
            ),
            "{held:?}"
        );
        let Ok(Handled::Requeued { after, busy }) = waited else {
            panic!("the second found the endpoint busy: {waited:?}");
        };
        assert_eq!(busy, Busy::AllSlotsHeld);
        // Its message comes back when the holder's hold is over, to take the slot in turn:
        // the hold less the time it took to be put back (two sends of 1.5 s, more on a busy
        // machine), plus at most half a second of jitter.
        let hold = app.config.sender.deadline;
        let took = began.elapsed();
        assert!(
            after + took + std::time::Duration::from_millis(100) >= hold
                && after <= hold + std::time::Duration::from_secs(1),
            "back after {after:?}, put back {took:?} after the hold of {hold:?} began"
        );
        assert_eq!(
            receiver.served.load(Ordering::SeqCst),
            2,
            "the holder sent the second meanwhile"
        );
        let stored = app
            .store
            .get_delivery(&account, second)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (stored.status, stored.attempts),
            (DeliveryStatus::Delivered, 1)
        );
        // Its own message, when it comes back, finds it done and takes no slot.
        let again = handle_message(&app, lanes, second, endpoint, &account)
            .await
            .unwrap();
        assert_eq!(again, Handled::Skipped);
        assert_eq!(receiver.served.load(Ordering::SeqCst), 2);
        assert!(slots.live_leases(endpoint).await.unwrap().is_empty());
    }

    /// Sends the `unsent`-th request (counting from 1) nowhere, as when the process is out
    /// of file descriptors, and every other one through `inner`.
    struct UnsentAt {
        inner: HttpSender,
        unsent: usize,
        posted: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl crate::http::Transport for UnsentAt {
        async fn post(
            &self,
            request: crate::http::OutboundRequest,
        ) -> crate::http::OutboundResponse {
            if self.posted.fetch_add(1, Ordering::SeqCst) + 1 == self.unsent {
                return crate::http::OutboundResponse {
                    error: Some("not sent: out of file descriptors".into()),
                    unsent: Some(crate::http::LocalFault::ProcessFileLimit),
                    ..Default::default()
                };
            }
            self.inner.post(request).await
        }
    }

    /// A listed delivery the slot holder could not send (out of descriptors) is not queued
    /// again by the holder: its own message, put back when it found the endpoint busy, is
    /// on its way and finds it pending with no attempt, and delivers it.
    #[tokio::test]
    async fn a_waiting_delivery_the_holder_could_not_send_is_left_to_its_own_message() {
        let receiver = slow_receiver(std::time::Duration::from_millis(1500)).await;
        let (mut app, emulated, slots) = aws_app(&receiver.url, 1).await;
        app.transport = Arc::new(UnsentAt {
            inner: HttpSender::new(app.config.sender.clone()).unwrap(),
            unsent: 2,
            posted: Default::default(),
        });
        let (first, endpoint, account) = publish_and_receive(&app, &emulated, "evt_first").await;
        let (second, _, _) = publish_and_receive(&app, &emulated, "evt_second").await;
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));
        let (held, waited) = tokio::join!(
            handle_message(&app, lanes, &first, &endpoint, &account),
            async {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                handle_message(&app, lanes, &second, &endpoint, &account).await
            }
        );
        assert!(
            matches!(
                held,
                Ok(Handled::Attempted(AttemptResult::Attempted { .. }))
            ),
            "{held:?}"
        );
        assert!(
            matches!(
                waited,
                Ok(Handled::Requeued {
                    busy: Busy::AllSlotsHeld,
                    ..
                })
            ),
            "{waited:?}"
        );
        assert_eq!(receiver.served.load(Ordering::SeqCst), 1);
        let waiting = stored(&app, &account, &second).await;
        assert_eq!(
            (waiting.status, waiting.attempts, waiting.last_error),
            (DeliveryStatus::Pending, 0, None)
        );
        // The holder queued nothing for it: only its own message is on its way.
        assert_eq!(delayed_messages(&emulated).await, 1);
        assert!(receive(&emulated, 0).await.is_empty());
        // Which, when it comes back, delivers it at its first attempt.
        let handled = handle_message(&app, lanes, &second, &endpoint, &account)
            .await
            .unwrap();
        assert!(
            matches!(handled, Handled::Attempted(AttemptResult::Attempted { .. })),
            "{handled:?}"
        );
        let delivered = stored(&app, &account, &second).await;
        assert_eq!(
            (delivered.status, delivered.attempts),
            (DeliveryStatus::Delivered, 1)
        );
        assert_eq!(receiver.served.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_message_waits_for_the_slot_of_a_holder_whose_hold_is_over() {
        let receiver = slow_receiver(std::time::Duration::from_millis(10)).await;
        let (app, emulated, slots) = aws_app(&receiver.url, 1).await;
        let (delivery, endpoint, account) = publish_and_receive(&app, &emulated, "evt_next").await;
        // A holder past its hold (its lease ends sooner than a hold's last attempt would),
        // finishing an attempt: it gives the slot back a second from now.
        let held = slots
            .acquire(&endpoint, 1, std::time::Duration::from_secs(4))
            .await
            .unwrap()
            .unwrap();
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));
        let (handled, ()) = tokio::join!(
            handle_message(&app, lanes, &delivery, &endpoint, &account),
            async {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                slots.release(&held).await.unwrap();
            }
        );
        assert!(
            matches!(
                handled,
                Ok(Handled::Attempted(AttemptResult::Attempted { .. }))
            ),
            "the message took the slot given back instead of going back to the queue: {handled:?}"
        );
        assert_eq!(receiver.served.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_delivery_waiting_for_a_busy_endpoint_is_not_taken_for_lost_by_the_sweeper() {
        let receiver = slow_receiver(std::time::Duration::from_millis(10)).await;
        let (app, emulated, slots) = aws_app(&receiver.url, 1).await;
        let (delivery, endpoint, account) =
            publish_and_receive(&app, &emulated, "evt_waiting").await;
        let held = slots
            .acquire(&endpoint, 1, std::time::Duration::from_secs(60))
            .await
            .unwrap();
        assert!(held.is_some());
        let grace = std::time::Duration::from_secs(5);
        let lanes = lanes_of(&slots, grace);
        let handled = handle_message(&app, lanes, &delivery, &endpoint, &account)
            .await
            .unwrap();
        assert!(
            matches!(
                handled,
                Handled::Requeued {
                    busy: Busy::AllSlotsHeld,
                    ..
                }
            ),
            "{handled:?}"
        );
        let stored = stored(&app, &account, &delivery).await;
        let expected = stored
            .queued_until
            .expect("the delivery says when its message is back");
        assert!(
            expected
                >= add(
                    chrono::Utc::now(),
                    REQUEUE_MIN - std::time::Duration::from_secs(1)
                ),
            "{expected}"
        );
        // A sweep a little later, past the grace of the delivery's first due time, leaves it
        // alone: its message is on its way.
        let later = add(chrono::Utc::now(), std::time::Duration::from_secs(6));
        let report = crate::service::sweep::sweep_overdue(&app, later, (grace, grace), None)
            .await
            .unwrap();
        assert_eq!(report.requeued, 0, "{report:?}");
    }

    #[tokio::test]
    async fn a_batch_for_one_endpoint_takes_and_gives_back_its_slots_in_one_write_each_and_reuses_them(
    ) {
        use crate::aws::clients::{self, SharedInterceptor};
        use crate::store::dynamodb::{create_tables, TableNames};

        let cap = 4;
        // Long enough that the four attempts overlap even when the emulator answers slowly
        // (a loaded machine): the concurrency assertion below needs them in flight together.
        let receiver = slow_receiver(std::time::Duration::from_millis(1200)).await;
        let (app, _emulated, _) = aws_app(&receiver.url, cap).await;
        let account = AccountId::parse("acme").unwrap();
        let mut messages = Vec::new();
        for n in 0..10 {
            let new = NewEvent {
                id: Some(format!("evt_batch_{n}")),
                event_type: "invoice.paid".into(),
                data: serde_json::json!({ "n": n }),
            };
            let published = publish(&app, &account, new).await.unwrap();
            let delivery = &published.deliveries[0];
            messages.push((
                delivery.id.clone(),
                delivery.endpoint_id.clone(),
                delivery.account_id.clone(),
            ));
        }
        // The slots on their own tables, through a client that counts its requests.
        let sdk = crate::aws::load_sdk_config().await;
        let tables = TableNames::with_prefix(&format!("m{}", uuid::Uuid::new_v4().simple()));
        let requests = Operations::default();
        let client = clients::dynamodb(&sdk, Some(&SharedInterceptor::new(requests.clone())));
        create_tables(&client, &tables).await.unwrap();
        let slots = DynamoSlots::new(client, tables.control.clone(), Arc::new(SystemClock));
        requests.clear();
        let lanes = lanes_of(&slots, std::time::Duration::from_secs(300));

        let handled = handle_batch(&app, lanes, &messages).await;
        let used = requests.taken();

        let attempted = handled
            .iter()
            .filter(|h| matches!(h, Ok(Handled::Attempted(_))))
            .count();
        let requeued = handled
            .iter()
            .filter(|h| {
                matches!(
                    h,
                    Ok(Handled::Requeued {
                        busy: Busy::AllSlotsHeld,
                        ..
                    })
                )
            })
            .count();
        assert_eq!(
            (attempted, requeued),
            (10, 0),
            "each of the four slots took the next message when its attempt was done: {handled:?}"
        );
        assert_eq!(receiver.served.load(Ordering::SeqCst), 10);
        assert_eq!(
            receiver.most.load(Ordering::SeqCst),
            4,
            "four attempts ran at once, never more"
        );
        let writes = used
            .iter()
            .filter(|operation| {
                ["PutItem", "UpdateItem", "DeleteItem"].contains(&operation.as_str())
            })
            .count();
        assert_eq!(
            writes, 2,
            "one write takes the slots, one gives them back: {used:?}"
        );
        // Given back: all four slots are free again, and no more.
        let again = slots
            .acquire_many(&messages[0].1, cap, 10, std::time::Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(again.len(), 4);
        let stored_attempts: u32 = {
            let mut total = 0;
            for (delivery, _, _) in &messages {
                total += app
                    .store
                    .get_delivery(&account, delivery)
                    .await
                    .unwrap()
                    .unwrap()
                    .attempts;
            }
            total
        };
        assert_eq!(stored_attempts, 10, "one attempt per message");
    }

    /// The operations a client sent (`PutItem`, `Query`, …), in order.
    #[derive(Debug, Default, Clone)]
    struct Operations(Arc<std::sync::Mutex<Vec<String>>>);

    impl Operations {
        fn clear(&self) {
            self.0.lock().unwrap().clear();
        }

        fn taken(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    impl aws_smithy_runtime_api::client::interceptors::Intercept for Operations {
        fn name(&self) -> &'static str {
            "Operations"
        }

        fn read_after_execution(
            &self,
            _: &aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextRef<'_>,
            _: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
            cfg: &mut aws_smithy_types::config_bag::ConfigBag,
        ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
            let operation = cfg
                .load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
                .map_or("unknown", |metadata| metadata.name());
            self.0.lock().unwrap().push(operation.to_owned());
            Ok(())
        }
    }
}
