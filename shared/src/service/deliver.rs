use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tracing::Instrument;

use super::{health, noted_write, ServiceError, ServiceResult};
use crate::{
    clock::Timestamp,
    domain::{
        health::should_disable, Attempt, AttemptOutcome, Decision, DeliveryId, DeliveryStatus,
        EndpointStatus, KeptResponse, RetryPolicy, Trigger,
    },
    http::{LocalFault, OutboundRequest, OutboundResponse},
    signing::{self, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP},
    store::{
        AttemptRecord, DeliveryWork, PendingRef, RecordOutcome, StoreError, StoreResult,
        Unattempted, UnattemptedMove,
    },
    App,
};

/// A ticket that arrives this much before its delivery's time is early, not due.
const EARLY_TOLERANCE: Duration = Duration::from_millis(500);

/// A webhook sent but left unrecorded goes back to the queue for at least this long, even
/// when its schedule would have it sooner: the store that refused its record is likely
/// still refusing.
pub const UNRECORDED_RESEND_FLOOR: Duration = Duration::from_secs(30);

/// How an attempt's record is written again while the store refuses it (a full disk, an I/O
/// error, another process holding the SQLite file's write lock past the busy timeout). The
/// webhook is already sent: a delivery left reading as unattempted is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRetry {
    /// The pause after the first failure; each next one doubles, up to `max_pause`.
    pub first_pause: Duration,
    pub max_pause: Duration,
    /// No pause ends later than this after the first write began.
    pub give_up_after: Duration,
}

impl RecordRetry {
    /// One write, no retry: the Lambda sender's (a Lambda has its timeout, and the message
    /// comes back after the queue's visibility timeout, not seconds later).
    pub const ONCE: Self = Self {
        first_pause: Duration::ZERO,
        max_pause: Duration::ZERO,
        give_up_after: Duration::ZERO,
    };

    /// The embedded dispatcher's: 100 ms doubling to 5 s, for up to two minutes (a backup
    /// tool's write lock, a disk freed by an operator). Past that the attempt goes back to
    /// the queue, for [`UNRECORDED_RESEND_FLOOR`] at least.
    pub const PATIENT: Self = Self {
        first_pause: Duration::from_millis(100),
        max_pause: Duration::from_secs(5),
        give_up_after: Duration::from_secs(120),
    };
}

/// Why an attempt came to no [`AttemptResult`].
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// Nothing was sent (the delivery is as it was), or the attempt was recorded and what
    /// came after it failed.
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// The webhook was sent, but its record could not be written: the delivery still reads
    /// as unattempted. It is not to be sent again before `resend_at`.
    #[error("attempt {number} was sent but could not be recorded: {error}")]
    Unrecorded {
        number: u32,
        error: StoreError,
        resend_at: Timestamp,
    },
    /// Nothing was sent: this process ran out of a resource of its own (file descriptors)
    /// even after dropping its idle connections. Not the endpoint's failure, so no attempt
    /// is recorded (no retry spent, no failure streak, no disable); the delivery is as it
    /// was and is to be tried again soon.
    #[error("webhook not sent, no attempt recorded: {0}")]
    Unsent(LocalFault),
}

impl From<StoreError> for AttemptError {
    fn from(error: StoreError) -> Self {
        Self::Service(error.into())
    }
}

/// What an attempt came to, for the caller's bookkeeping.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptResult {
    /// Nothing to do: not found, or no longer pending.
    Skipped,
    /// The ticket came early; try again at this time.
    NotYetDue(PendingRef),
    /// An attempt was made; `retry` is set while the delivery stays pending.
    Attempted {
        decision: Decision,
        retry: Option<PendingRef>,
    },
    /// The attempt was sent, but someone else had already moved the delivery on.
    Stale,
    /// The delivery ended without an attempt: `failed` when its event is past retention or
    /// erased, `abandoned` when its endpoint is disabled or deleted.
    Unsendable,
}

impl AttemptResult {
    /// The next ticket for this delivery, if it needs one.
    pub fn follow_up(&self) -> Option<&PendingRef> {
        match self {
            Self::NotYetDue(next) => Some(next),
            Self::Attempted { retry, .. } => retry.as_ref(),
            Self::Skipped | Self::Stale | Self::Unsendable => None,
        }
    }
}

fn pending_ref(work: &DeliveryWork, due: Timestamp) -> Option<PendingRef> {
    let endpoint = work.endpoint.as_ref()?;
    Some(PendingRef {
        delivery_id: work.delivery.id.clone(),
        endpoint_id: endpoint.id.clone(),
        account_id: work.delivery.account_id.clone(),
        due,
        max_in_flight: endpoint.max_in_flight,
        rate_limit_per_second: endpoint.rate_limit_per_second,
    })
}

/// Makes one attempt of a pending delivery: sign, POST, record, decide what comes next.
pub async fn attempt(
    app: &App,
    delivery_id: &DeliveryId,
    trigger: Trigger,
) -> Result<AttemptResult, AttemptError> {
    attempt_reporting_answer(app, delivery_id, trigger, &|| {}).await
}

/// [`attempt`], calling `answered` as soon as the endpoint has answered (or the request
/// failed), before the attempt is recorded.
pub async fn attempt_reporting_answer(
    app: &App,
    delivery_id: &DeliveryId,
    trigger: Trigger,
    answered: &(dyn Fn() + Send + Sync),
) -> Result<AttemptResult, AttemptError> {
    attempt_sent_by(app, delivery_id, trigger, answered, None).await
}

/// [`attempt_reporting_answer`], sending the webhook only until `send_by`: past it (what is
/// left of a Lambda invocation would not cover the request and its record) nothing is sent,
/// as [`AttemptError::Unsent`] with [`LocalFault::InvocationTime`].
pub async fn attempt_sent_by(
    app: &App,
    delivery_id: &DeliveryId,
    trigger: Trigger,
    answered: &(dyn Fn() + Send + Sync),
    send_by: Option<tokio::time::Instant>,
) -> Result<AttemptResult, AttemptError> {
    let retry = RecordRetry::ONCE;
    attempt_until(app, delivery_id, trigger, answered, retry, None, send_by).await
}

/// [`attempt_reporting_answer`], writing the attempt's record again on `retry`'s terms while
/// the store refuses it, until `stop` turns true. A webhook sent whose record could not be
/// written comes back as [`AttemptError::Unrecorded`], saying when it may be sent again.
pub async fn attempt_recording(
    app: &App,
    delivery_id: &DeliveryId,
    trigger: Trigger,
    answered: &(dyn Fn() + Send + Sync),
    retry: RecordRetry,
    stop: Option<&watch::Receiver<bool>>,
) -> Result<AttemptResult, AttemptError> {
    attempt_until(app, delivery_id, trigger, answered, retry, stop, None).await
}

/// [`attempt_recording`], sending nothing past `send_by` (see [`attempt_sent_by`]).
async fn attempt_until(
    app: &App,
    delivery_id: &DeliveryId,
    trigger: Trigger,
    answered: &(dyn Fn() + Send + Sync),
    retry: RecordRetry,
    stop: Option<&watch::Receiver<bool>>,
    send_by: Option<tokio::time::Instant>,
) -> Result<AttemptResult, AttemptError> {
    let Some(work) = app.store.load_work(delivery_id).await? else {
        return Ok(AttemptResult::Skipped);
    };
    if work.delivery.status != DeliveryStatus::Pending {
        return Ok(AttemptResult::Skipped);
    }
    let Some(endpoint) = work
        .endpoint
        .as_ref()
        .filter(|e| e.status == EndpointStatus::Active)
    else {
        return Ok(abandoned(app, &work.delivery, work.endpoint.is_none()).await?);
    };
    if endpoint.secret.is_withheld() {
        // A store without the secrets key read this endpoint: sending unsigned is never an
        // option, and the delivery stays pending for a process that holds the key.
        return Err(crate::store::StoreError::Backend(
            crate::secrets::SecretsError::Withheld.to_string(),
        )
        .into());
    }
    let now = app.clock.now();
    let Some(event) = work.event.as_ref() else {
        return Ok(ended_unsent(app, &work, EVENT_EXPIRED, now).await?);
    };
    if event.is_erased() {
        return Ok(ended_unsent(app, &work, crate::domain::event::EVENT_ERASED, now).await?);
    }
    if let Some(due) = work.delivery.next_try_at {
        if trigger == Trigger::Scheduled && due > crate::clock::add(now, EARLY_TOLERANCE) {
            return Ok(
                pending_ref(&work, due).map_or(AttemptResult::Skipped, AttemptResult::NotYetDue)
            );
        }
    }
    let number = work.delivery.attempts + 1;
    // A replay marks the delivery for one manual attempt, whoever picks it up.
    let trigger = if work.delivery.next_trigger == Trigger::Manual {
        Trigger::Manual
    } else {
        trigger
    };
    // After a replay the schedule starts over; attempt numbers keep counting.
    let attempts_in_schedule = number.saturating_sub(work.delivery.schedule_start);
    let span = tracing::info_span!(
        "attempt",
        event.id = %event.id,
        endpoint.id = %endpoint.id,
        delivery.id = %work.delivery.id,
        attempt = number,
    );
    async {
        let timestamp = now.timestamp();
        let body = Bytes::from(event.payload.clone());
        let signature = signing::signature_header(&endpoint.signing_secrets(now), event.id.as_str(), timestamp, &body);
        let request = OutboundRequest {
            url: endpoint.url.as_url().clone(),
            headers: [
                ("content-type", "application/json".to_owned()),
                (HEADER_ID, event.id.to_string()),
                (HEADER_TIMESTAMP, timestamp.to_string()),
                (HEADER_SIGNATURE, signature),
            ]
            .into_iter()
            .map(|(name, value)| (name.into(), value))
            .chain(endpoint.headers.iter().map(|(name, h)| (name.to_owned().into(), h.value.clone())))
            .collect(),
            body,
        };
        // Checked after the reads (which may have taken long), before anything is sent.
        if send_by.is_some_and(|by| tokio::time::Instant::now() >= by) {
            answered();
            crate::telemetry::send_out_of_resources(LocalFault::InvocationTime.label(), "put_back");
            tracing::warn!("webhook not sent: too little of the invocation is left to send it and record its answer; the delivery is tried again soon");
            return Err(AttemptError::Unsent(LocalFault::InvocationTime));
        }
        let response = app.transport.post(request).await;
        answered();
        if let Some(fault) = response.unsent {
            // Hooklane's own fault: nothing reached the endpoint, so nothing is held against it.
            tracing::error!(cause = %fault, "webhook not sent: this process is out of resources; no attempt recorded, the delivery is tried again soon");
            return Err(AttemptError::Unsent(fault));
        }
        let finished = app.clock.now();
        let outcome = classify(&response, finished);
        let policy = &app.config.retry;
        let client_errors = work.delivery.client_error_count + u32::from(policy.is_client_error(&outcome));
        let decision = policy.decide(attempts_in_schedule, client_errors, &outcome, finished, &mut rand::rng());
        // Bounded in bytes here, whatever the transport handed on, so every store can keep it.
        let kept = KeptResponse::of(
            &response.headers,
            &response.body,
            response.body_truncated,
            app.config.sender.max_response_body,
        );
        let attempt = Attempt {
            delivery_id: work.delivery.id.clone(),
            number,
            trigger,
            started_at: now,
            latency_ms: u64::try_from(response.latency.as_millis()).unwrap_or(u64::MAX),
            status_code: response.status,
            response_headers: kept.headers,
            response_body: kept.body,
            response_body_truncated: kept.body_truncated,
            error: outcome.error_text(),
        };
        let record = AttemptRecord {
            attempt,
            expected_attempts: work.delivery.attempts,
            decision: decision.clone(),
            client_error_count: client_errors,
            endpoint_id: endpoint.id.clone(),
            account_id: work.delivery.account_id.clone(),
            success: outcome.is_success(),
            now: finished,
        };
        match &decision {
            Decision::Delivered => tracing::debug!(status = response.status, latency_ms = record.attempt.latency_ms, "delivered"),
            Decision::RetryAt(at) => tracing::info!(status = response.status, error = record.attempt.error.as_deref(), next_try_at = %at, "attempt failed; will retry"),
            Decision::Failed { reason } => tracing::warn!(status = response.status, error = record.attempt.error.as_deref(), reason, "delivery failed"),
        }
        let failing_since = match record_retrying(app, &record, retry, stop).await {
            Ok(RecordOutcome::Stale) => {
                tracing::info!("delivery was already moved on; attempt not recorded");
                return Ok(AttemptResult::Stale);
            }
            Ok(RecordOutcome::Recorded { endpoint_failing_since }) => endpoint_failing_since,
            Err(error) => {
                let now = app.clock.now();
                let resend_at = resend_at(policy, &decision, attempts_in_schedule, finished, now);
                return Err(AttemptError::Unrecorded { number, error, resend_at });
            }
        };
        crate::telemetry::attempt_recorded(
            &endpoint.id,
            &work.delivery.account_id,
            number,
            &outcome,
            &decision,
            response.latency,
            (finished - event.created_at).to_std().unwrap_or_default(),
        );
        if app.config.disable_on_attempt && should_disable(failing_since, finished, app.config.disable_after) {
            if let Some(since) = failing_since {
                health::disable_failing(app, endpoint, since).await?;
                return Ok(AttemptResult::Attempted { decision, retry: None });
            }
        }
        let retry = match decision {
            Decision::RetryAt(at) => pending_ref(&work, at),
            _ => None,
        };
        Ok(AttemptResult::Attempted { decision, retry })
    }
    .instrument(span)
    .await
}

/// Writes an attempt's record, and again on `retry`'s terms while the store refuses it. The
/// same record each time: its outcome is what the endpoint answered, and a write that did go
/// through after all finds the delivery moved on (`Stale`) rather than counting it twice.
async fn record_retrying(
    app: &App,
    record: &AttemptRecord,
    retry: RecordRetry,
    stop: Option<&watch::Receiver<bool>>,
) -> StoreResult<RecordOutcome> {
    let first = tokio::time::Instant::now();
    let mut pause = retry.first_pause;
    let mut failures: u32 = 0;
    loop {
        let error = match noted_write(app, app.store.record_attempt(record)).await {
            Ok(outcome) => {
                if failures > 0 {
                    tracing::info!(
                        failures,
                        after_ms = millis(first.elapsed()),
                        "attempt recorded once the store took writes again"
                    );
                }
                return Ok(outcome);
            }
            Err(error) => error,
        };
        failures += 1;
        // The caller says what becomes of it; a stop leaves it to the next start.
        let stopping = stop.is_some_and(|stop| *stop.borrow());
        if stopping || first.elapsed() + pause >= retry.give_up_after {
            return Err(error);
        }
        // One line per pause: they double, so a long fault is a few dozen lines, not a flood.
        tracing::warn!(
            %error,
            failures,
            retry_in_ms = millis(pause),
            "attempt sent but its record could not be written; writing it again"
        );
        let stopped = match stop {
            Some(stop) => {
                let mut stop = stop.clone();
                tokio::select! {
                    () = tokio::time::sleep(pause) => false,
                    () = stop_asked(&mut stop) => true,
                }
            }
            None => {
                tokio::time::sleep(pause).await;
                false
            }
        };
        if stopped {
            return Err(error);
        }
        pause = pause.saturating_mul(2).min(retry.max_pause);
    }
}

/// Returns once `stop` turns true; never if its sender is gone (no stop can come then).
async fn stop_asked(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|stopping| *stopping).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// When a webhook sent at `sent` and left unrecorded may be sent again: not before the retry
/// its answer decided (the schedule, stretched by a Retry-After), or, had it ended the
/// delivery, the schedule's delay after this attempt (its last, once spent); and not within
/// [`UNRECORDED_RESEND_FLOOR`] of `now`.
fn resend_at(
    policy: &RetryPolicy,
    decision: &Decision,
    attempts_in_schedule: u32,
    sent: Timestamp,
    now: Timestamp,
) -> Timestamp {
    let scheduled = match decision {
        Decision::RetryAt(at) => *at,
        Decision::Delivered | Decision::Failed { .. } => {
            let delays = policy.schedule.delays();
            let index =
                usize::try_from(attempts_in_schedule.saturating_sub(1)).unwrap_or(usize::MAX);
            let delay = delays
                .get(index)
                .or(delays.last())
                .copied()
                .unwrap_or(UNRECORDED_RESEND_FLOOR);
            crate::clock::add(sent, delay)
        }
    };
    scheduled.max(crate::clock::add(now, UNRECORDED_RESEND_FLOOR))
}

/// What `last_error` says of a delivery whose event is past retention.
pub const EVENT_EXPIRED: &str =
    "its event is past retention and no longer stored; it cannot be sent";

/// A pending delivery of an endpoint disabled or deleted ends `abandoned`, as the endpoint's
/// other pending work did when it was disabled or deleted. On DynamoDB that abandon reads the
/// `pending` index, which may lag its last second of writes, so a delivery whose retry was
/// being recorded then can be missed; its own next try ends it here.
async fn abandoned(
    app: &App,
    delivery: &crate::domain::Delivery,
    deleted: bool,
) -> ServiceResult<AttemptResult> {
    let reason = if deleted {
        "endpoint deleted"
    } else {
        "abandoned: endpoint disabled"
    };
    let now = app.clock.now();
    let change = UnattemptedMove::of(delivery, Unattempted::Abandon(reason.into()), now);
    if !noted_write(app, app.store.move_unattempted(&change)).await? {
        return Ok(AttemptResult::Stale);
    }
    tracing::warn!(delivery.id = %delivery.id, endpoint.id = %delivery.endpoint_id, reason, "pending delivery of an inactive endpoint abandoned");
    crate::telemetry::completed(&delivery.account_id, "abandoned", 1);
    Ok(AttemptResult::Unsendable)
}

/// For a message to `endpoint`, read as disabled or (`deleted`) gone: ends its delivery
/// `abandoned` if it is still pending, and never sends (the endpoint may be enabled again
/// meanwhile; its slots and rate were not taken for this). One read of the delivery.
pub async fn abandon_if_pending(
    app: &App,
    account: &crate::domain::AccountId,
    delivery_id: &DeliveryId,
    endpoint: &crate::domain::EndpointId,
    deleted: bool,
) -> ServiceResult<AttemptResult> {
    match app.store.get_delivery(account, delivery_id).await? {
        Some(delivery)
            if delivery.status == DeliveryStatus::Pending && &delivery.endpoint_id == endpoint =>
        {
            abandoned(app, &delivery, deleted).await
        }
        _ => Ok(AttemptResult::Skipped),
    }
}

/// A pending delivery whose event is gone (past retention) or erased ends `failed` at
/// once, without an attempt, saying why: no retry can bring the event back.
async fn ended_unsent(
    app: &App,
    work: &DeliveryWork,
    reason: &str,
    now: Timestamp,
) -> ServiceResult<AttemptResult> {
    let delivery = &work.delivery;
    let change = UnattemptedMove::of(delivery, Unattempted::Fail(reason.to_owned()), now);
    if !noted_write(app, app.store.move_unattempted(&change)).await? {
        return Ok(AttemptResult::Stale);
    }
    tracing::warn!(delivery.id = %delivery.id, event.id = %delivery.event_id, reason, "event not sendable; delivery failed");
    crate::telemetry::completed(&delivery.account_id, "failed", 1);
    Ok(AttemptResult::Unsendable)
}

fn classify(response: &OutboundResponse, now: Timestamp) -> AttemptOutcome {
    match (&response.error, response.status) {
        (None, Some(status)) => AttemptOutcome::from_response(
            status,
            response.header("retry-after"),
            response.header("location"),
            now,
        ),
        (Some(error), Some(status)) => AttemptOutcome::TransportError {
            message: format!("HTTP {status}, then {error}"),
        },
        (Some(error), None) => AttemptOutcome::TransportError {
            message: error.clone(),
        },
        (None, None) => AttemptOutcome::TransportError {
            message: "no response".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        clock::ManualClock,
        domain::Delivery,
        fixtures,
        store::{sqlite::SqliteStore, EndpointDeletion, Store},
    };

    /// A pending delivery of an endpoint whose disabling or deletion missed it (on DynamoDB,
    /// the `pending` index that abandon reads had not caught up with its retry) ends
    /// abandoned at its next try, unsent, instead of staying pending for good.
    #[tokio::test]
    async fn a_delivery_its_endpoints_disabling_missed_is_abandoned_at_its_next_try() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let app = fixtures::app_on(store.clone(), Arc::new(ManualClock::new(fixtures::t0())));
        let [mut disabled, deleted] =
            fixtures::account_with_endpoints(&*store, "acme", ["ep_off", "ep_gone"]).await;
        let event = fixtures::event("acme", "evt_1", fixtures::t0());
        let to_disabled = fixtures::delivery(&event, &disabled, fixtures::t0());
        store
            .publish(&event, std::slice::from_ref(&to_disabled))
            .await
            .unwrap();
        // Disabled, this delivery left pending.
        let read = disabled.version();
        disabled.status = EndpointStatus::Disabled;
        store.update_endpoint(&disabled, &read).await.unwrap();
        // Deleted, then a delivery to it written (as a fan-out racing the deletion would).
        assert!(store
            .delete_endpoint(&EndpointDeletion {
                account_id: deleted.account_id.clone(),
                endpoint_id: deleted.id.clone(),
                at: fixtures::t0(),
            })
            .await
            .unwrap());
        let to_deleted = fixtures::delivery(&event, &deleted, fixtures::t0());
        store
            .add_deliveries(std::slice::from_ref(&to_deleted))
            .await
            .unwrap();

        for (delivery, reason) in [
            (&to_disabled, "abandoned: endpoint disabled"),
            (&to_deleted, "endpoint deleted"),
        ] {
            let result = attempt(&app, &delivery.id, Trigger::Scheduled)
                .await
                .unwrap();
            assert_eq!(result, AttemptResult::Unsendable, "{reason}");
            let stored = store
                .get_delivery(&delivery.account_id, &delivery.id)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(stored.status, DeliveryStatus::Abandoned, "{reason}");
            assert_eq!(stored.attempts, 0);
            assert_eq!(stored.last_error.as_deref(), Some(reason));
        }
    }

    /// The sender's way for messages of an endpoint it read as inactive: abandons only a
    /// pending delivery of that endpoint, and never sends.
    #[tokio::test]
    async fn a_message_of_an_inactive_endpoint_abandons_only_its_own_pending_delivery() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let app = fixtures::app_on(store.clone(), Arc::new(ManualClock::new(fixtures::t0())));
        let [off, other] =
            fixtures::account_with_endpoints(&*store, "acme", ["ep_off", "ep_other"]).await;
        let event = fixtures::event("acme", "evt_1", fixtures::t0());
        let to_off = fixtures::delivery(&event, &off, fixtures::t0());
        let to_other = fixtures::delivery(&event, &other, fixtures::t0());
        store
            .publish(&event, &[to_off.clone(), to_other.clone()])
            .await
            .unwrap();
        let account = &to_off.account_id;
        assert_eq!(
            abandon_if_pending(&app, account, &to_other.id, &off.id, false)
                .await
                .unwrap(),
            AttemptResult::Skipped,
            "another endpoint's delivery"
        );
        for expected in [AttemptResult::Unsendable, AttemptResult::Skipped] {
            let result = abandon_if_pending(&app, account, &to_off.id, &off.id, false)
                .await
                .unwrap();
            assert_eq!(result, expected);
        }
        let status = |d: &Delivery| {
            let store = store.clone();
            let (account, id) = (d.account_id.clone(), d.id.clone());
            async move {
                store
                    .get_delivery(&account, &id)
                    .await
                    .unwrap()
                    .unwrap()
                    .status
            }
        };
        assert_eq!(status(&to_off).await, DeliveryStatus::Abandoned);
        assert_eq!(status(&to_other).await, DeliveryStatus::Pending);
    }

    /// A webhook sent and left unrecorded goes back to the queue no sooner than its schedule
    /// (stretched by Retry-After) would send the next, and never within the floor.
    #[test]
    fn an_unrecorded_webhook_is_sent_again_no_sooner_than_its_schedule() {
        let policy = RetryPolicy::default();
        let sent = fixtures::t0();
        let now = crate::clock::add(sent, Duration::from_secs(120));
        let later = |seconds| crate::clock::add(sent, Duration::from_secs(seconds));
        // A retry decided for an hour on (a Retry-After): then.
        let retry = Decision::RetryAt(later(3600));
        assert_eq!(resend_at(&policy, &retry, 1, sent, now), later(3600));
        // Decided sooner than the floor from now: the floor.
        let soon = Decision::RetryAt(later(30));
        assert_eq!(resend_at(&policy, &soon, 1, sent, now), later(150));
        // Delivered by its third attempt: the schedule's third delay (600 s) after it.
        assert_eq!(
            resend_at(&policy, &Decision::Delivered, 3, sent, now),
            later(600)
        );
        // Past the schedule's end: its last delay.
        let failed = fixtures::failed();
        assert_eq!(resend_at(&policy, &failed, 40, sent, now), later(86_400));
    }

    /// A receiver answering every webhook alike, counting them.
    struct Counting {
        answer: OutboundResponse,
        posts: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl crate::http::Transport for Counting {
        async fn post(&self, _: OutboundRequest) -> OutboundResponse {
            self.posts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.answer.clone()
        }
    }

    /// An app over a SQLite file holding one delivery due, sending to `answer`; and a
    /// connection holding the file's write lock, as a backup tool would.
    async fn locked_store(
        name: &str,
        answer: OutboundResponse,
    ) -> (
        App,
        Arc<Counting>,
        Delivery,
        rusqlite::Connection,
        std::path::PathBuf,
    ) {
        let (store, database) = fixtures::sqlite_file_store(name);
        let dir = database.parent().unwrap().to_path_buf();
        let receiver = Arc::new(Counting {
            answer,
            posts: Default::default(),
        });
        let app = App {
            transport: receiver.clone(),
            ..fixtures::app_on(store.clone(), Arc::new(ManualClock::new(fixtures::t0())))
        };
        let [endpoint] = fixtures::account_with_endpoints(&*store, "acme", ["ep_a"]).await;
        let (_, delivery) = fixtures::publish_one(&*store, &endpoint, "evt_1").await;
        let lock = rusqlite::Connection::open(&database).unwrap();
        lock.execute_batch("BEGIN IMMEDIATE").unwrap();
        (app, receiver, delivery, lock, dir)
    }

    fn answered(status: u16, headers: &[(&str, &str)]) -> OutboundResponse {
        OutboundResponse {
            status: Some(status),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            body: Vec::new(),
            body_truncated: false,
            latency: Duration::from_millis(1),
            error: None,
            unsent: None,
        }
    }

    /// A webhook the process had no descriptor to send is not the endpoint's failure: no
    /// attempt is recorded (no retry spent, nothing in the failure streak), the delivery is
    /// pending as it was, and the caller is told why, to put it back.
    #[tokio::test]
    async fn a_webhook_not_sent_for_want_of_descriptors_records_no_attempt() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let unsent = OutboundResponse {
            error: Some("not sent: out of file descriptors".into()),
            unsent: Some(LocalFault::ProcessFileLimit),
            ..OutboundResponse::default()
        };
        let receiver = Arc::new(Counting {
            answer: unsent,
            posts: Default::default(),
        });
        let app = App {
            transport: receiver.clone(),
            ..fixtures::app_on(store.clone(), Arc::new(ManualClock::new(fixtures::t0())))
        };
        let [endpoint] = fixtures::account_with_endpoints(&*store, "acme", ["ep_a"]).await;
        let (_, delivery) = fixtures::publish_one(&*store, &endpoint, "evt_1").await;
        let result = attempt(&app, &delivery.id, Trigger::Scheduled).await;
        assert!(
            matches!(
                result,
                Err(AttemptError::Unsent(LocalFault::ProcessFileLimit))
            ),
            "{result:?}"
        );
        assert_eq!(receiver.posts.load(std::sync::atomic::Ordering::SeqCst), 1);
        let stored = fixtures::status_of(&*store, &delivery.account_id, &delivery.id).await;
        assert_eq!(
            (stored.status, stored.attempts, stored.last_error),
            (DeliveryStatus::Pending, 0, None)
        );
        assert!(store.list_attempts(&delivery.id).await.unwrap().is_empty());
        let read = store
            .get_endpoint(&endpoint.account_id, &endpoint.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.failing_since, None, "no failure streak");
    }

    /// A record the store refuses past the retry's bound comes back unrecorded, once, with
    /// the delivery left as it was and a resend no sooner than the endpoint's Retry-After.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_refused_past_the_bound_comes_back_unrecorded_with_its_schedule() {
        let (app, receiver, delivery, lock, dir) =
            locked_store("unrecorded", answered(503, &[("retry-after", "3600")])).await;
        let retry = RecordRetry {
            first_pause: Duration::from_millis(10),
            max_pause: Duration::from_millis(10),
            give_up_after: Duration::from_secs(1),
        };
        let result =
            attempt_recording(&app, &delivery.id, Trigger::Scheduled, &|| {}, retry, None).await;
        let Err(AttemptError::Unrecorded {
            number,
            error,
            resend_at,
        }) = result
        else {
            panic!("{result:?}");
        };
        assert_eq!(number, 1);
        assert!(error.to_string().contains("locked"), "{error}");
        assert!(
            resend_at >= crate::clock::add(fixtures::t0(), Duration::from_secs(3600)),
            "{resend_at}"
        );
        let fault =
            crate::telemetry::store_fault(&app.store).expect("the fault is kept for /health");
        assert_eq!(fault.since, fixtures::t0());
        assert_eq!(receiver.posts.load(std::sync::atomic::Ordering::SeqCst), 1);
        lock.execute_batch("COMMIT").unwrap();
        let stored = fixtures::status_of(&*app.store, &delivery.account_id, &delivery.id).await;
        assert_eq!(
            (stored.status, stored.attempts),
            (DeliveryStatus::Pending, 0)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Shutdown ends the record's retry during its pause, not when the pause is over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_ends_the_record_retry_at_once() {
        let (app, _, delivery, lock, dir) = locked_store("record-stop", answered(200, &[])).await;
        let retry = RecordRetry {
            first_pause: Duration::from_secs(60),
            max_pause: Duration::from_secs(60),
            give_up_after: Duration::from_secs(120),
        };
        let (stop, stopped) = watch::channel(false);
        let attempt = {
            let (app, id) = (app.clone(), delivery.id.clone());
            tokio::spawn(async move {
                attempt_recording(&app, &id, Trigger::Scheduled, &|| {}, retry, Some(&stopped))
                    .await
            })
        };
        // The first write fails at the busy timeout; the 60 s pause follows.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while crate::telemetry::store_fault(&app.store).is_none()
            && std::time::Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            crate::telemetry::store_fault(&app.store).is_some(),
            "the record never failed"
        );
        stop.send(true).unwrap();
        let result = tokio::time::timeout(Duration::from_secs(2), attempt)
            .await
            .expect("the retry outlived the stop")
            .unwrap();
        assert!(
            matches!(result, Err(AttemptError::Unrecorded { .. })),
            "{result:?}"
        );
        lock.execute_batch("COMMIT").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
