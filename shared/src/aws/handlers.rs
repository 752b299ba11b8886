//! What each Lambda function does with one piece of input, shared by the functions (which
//! add only the Lambda event types) and by the local runner (`aws::local`), which feeds them
//! from the stream, the queue and timers itself.

use std::sync::Arc;

use serde_json::Value;

use super::{
    admin_token::{admin_token, AdminTokenError},
    settings::AwsSettings,
    shape::AwsShape,
    stream::{event_from_image, StreamedEvent},
};
use crate::{
    api::{router, ApiState},
    queue::sqs::DeliveryMessage,
    service::{
        access::{Access, AdminToken},
        catalog::Catalog,
        fan_out::{fan_out_batch_until, recover_unfanned},
        health, notifications,
        sender::{self, handle_batch, Lanes},
        sweep::{sweep_overdue, SweepReport},
        tokens, ServiceResult,
    },
    store::StoreError,
    tokens::TokenKey,
};

/// How long an api function instance may go on accepting a credential after it was revoked
/// through another instance: what it read of the credential is kept this long.
pub const CREDENTIAL_CACHE: std::time::Duration = crate::service::access::LAMBDA_CREDENTIAL_CACHE;

/// The API function's router: the admin token and the token signing key are loaded once,
/// side by side (they are independent reads: SSM or the control table, and the control
/// table), so a cold start waits for one round trip rather than two.
pub async fn api_router(
    shape: &AwsShape,
    settings: &AwsSettings,
) -> Result<axum::Router, AdminTokenError> {
    let (token, token_key) = tokio::try_join!(admin_token(shape, settings), async {
        token_signing_key(shape)
            .await
            .map_err(AdminTokenError::from)
    })?;
    Ok(router(api_state(shape, &token, token_key)))
}

/// The API's state for an admin token the caller already has.
pub async fn api_state_with_token(
    shape: &AwsShape,
    admin_token: &str,
) -> Result<ApiState, StoreError> {
    let token_key = token_signing_key(shape).await?;
    Ok(api_state(shape, admin_token, token_key))
}

async fn token_signing_key(shape: &AwsShape) -> Result<TokenKey, StoreError> {
    tokens::signing_key(shape.app.store.as_ref())
        .await
        .map_err(|e| StoreError::Backend(format!("cannot load the token signing key: {e}")))
}

/// The API's state: the app and who may use it.
pub fn api_state(shape: &AwsShape, admin_token: &str, token_key: TokenKey) -> ApiState {
    ApiState {
        app: shape.app.clone(),
        access: Arc::new(Access::new(
            Arc::clone(&shape.app.store),
            Arc::clone(&shape.app.clock),
            token_key,
            AdminToken::fixed(admin_token),
            CREDENTIAL_CACHE,
        )),
        // The control table's buckets: every api function instance takes from the same one.
        publish_limits: shape.slots.clone(),
        // Another instance's change to the catalog is seen within the credential cache's time.
        catalog: Arc::new(Catalog::new(
            shape.app.config.strict_event_types,
            CREDENTIAL_CACHE,
        )),
    }
}

/// Fan-out of a batch of events-table stream records' new images (in DynamoDB JSON), in
/// stream order; all their new deliveries are queued together. `Err((position, error))`
/// means "retry from the image at `position`": the ones before it are done. An unreadable
/// image is logged and skipped, since retrying cannot make it readable and would stop the
/// shard.
pub async fn fan_out_images(shape: &AwsShape, images: &[Value]) -> Result<usize, (usize, String)> {
    fan_out_images_until(shape, images, None).await
}

/// The share of a fan-out invocation's time given to fanning out; the rest is for queueing
/// and marking what was done, and reporting where the next invocation begins.
pub const FAN_OUT_SHARE: f64 = 2.0 / 3.0;

/// When an invocation whose deadline is `deadline_ms` (epoch milliseconds, as Lambda's
/// context gives it) stops fanning out: [`FAN_OUT_SHARE`] of the time it has left.
pub fn fan_out_deadline(deadline_ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::now() + time_left(deadline_ms).mul_f64(FAN_OUT_SHARE)
}

/// What is left of an invocation whose deadline is `deadline_ms` (epoch milliseconds).
fn time_left(deadline_ms: u64) -> std::time::Duration {
    let now_ms = u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0);
    std::time::Duration::from_millis(deadline_ms.saturating_sub(now_ms))
}

/// As [`fan_out_images`], leaving the events not fanned out by `deadline` to a retry from
/// the first of them (see [`fan_out_batch_until`]).
pub async fn fan_out_images_until(
    shape: &AwsShape,
    images: &[Value],
    deadline: Option<tokio::time::Instant>,
) -> Result<usize, (usize, String)> {
    let mut events = Vec::new();
    let mut positions = Vec::new();
    for (position, image) in images.iter().enumerate() {
        match event_from_image(image) {
            Ok(StreamedEvent::New(event)) => {
                events.push(event);
                positions.push(position);
            }
            Ok(StreamedEvent::AlreadyFannedOut) => {}
            // Retrying cannot make it readable, and would stop the shard: it is recorded as
            // rejected (on the item, in a metric and the log) and fan-out goes on.
            Err(error) => reject_image(shape, image, &error).await,
        }
    }
    if images.is_empty() {
        // An idle poll of the local runner's stream reader: nothing to say.
        return Ok(0);
    }
    let outcome = fan_out_batch_until(&shape.app, &events, deadline).await;
    tracing::info!(
        events = events.len(),
        created = outcome.created,
        "fanned out"
    );
    // Those past a failed event come again with the retry, and are rejected then.
    let settled = outcome.failed.unwrap_or(events.len());
    for event in outcome
        .unknown_account
        .iter()
        .filter(|&&p| p < settled)
        .filter_map(|&p| events.get(p))
    {
        let reason = crate::domain::event::unknown_account(&event.account_id);
        if let Err(failure) = shape
            .store
            .reject_event(event.account_id.as_str(), event.id.as_str(), &reason)
            .await
        {
            tracing::warn!(event.id = %event.id, error = %failure, "rejected event not marked; the sweeper rejects it");
        }
    }
    match outcome.failed {
        Some(failed) => {
            let position = positions.get(failed).copied().unwrap_or(0);
            let error = outcome.error.map_or_else(
                || "out of time before this event's fan-out ended".to_owned(),
                |error| error.to_string(),
            );
            Err((position, error))
        }
        None => Ok(outcome.created),
    }
}

/// Records an unreadable events-table image as rejected. Without its keys there is no item
/// to mark: the metric and the log line are all there is.
async fn reject_image(shape: &AwsShape, image: &Value, error: &str) {
    let key = |name: &str| image.get(name)?.get("S")?.as_str();
    let (Some(account), Some(id)) = (key("account_id"), key("id")) else {
        tracing::error!(error, "event image without its keys; rejected");
        crate::telemetry::event_rejected();
        return;
    };
    if let Err(failure) = shape.store.reject_event(account, id, error).await {
        // Still in the `unfanned` index: the sweeper rejects it on its next run.
        tracing::warn!(event.id = id, error = %failure, "rejected event not marked");
    }
}

/// What became of one queue message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageOutcome {
    /// Handled (or unusable for good): delete it.
    Done,
    /// Leave it in the queue; it comes back after its visibility timeout.
    Retry,
}

/// The sender function's work for one SQS batch of `(message id, body)`: the messages are
/// handled concurrently and their follow-ups queued together. One outcome per message, in
/// order.
pub async fn handle_queue_batch(
    shape: &AwsShape,
    messages: &[(&str, Option<&str>)],
) -> Vec<MessageOutcome> {
    handle_queue_batch_until(shape, messages, None).await
}

/// When an invocation whose deadline is `deadline_ms` (epoch milliseconds, as Lambda's
/// context gives it) sends its last webhook: [`sender::send_margin`] before it.
pub fn send_by(deadline_ms: u64, request_deadline: std::time::Duration) -> tokio::time::Instant {
    let margin = sender::send_margin(request_deadline);
    tokio::time::Instant::now() + time_left(deadline_ms).saturating_sub(margin)
}

/// [`handle_queue_batch`], sending webhooks only until `send_by` (see [`send_by`]).
pub async fn handle_queue_batch_until(
    shape: &AwsShape,
    messages: &[(&str, Option<&str>)],
    send_by: Option<tokio::time::Instant>,
) -> Vec<MessageOutcome> {
    let mut outcomes = vec![MessageOutcome::Done; messages.len()];
    let mut parsed = Vec::new();
    let mut positions = Vec::new();
    for (position, (message_id, body)) in messages.iter().enumerate() {
        let Some(body) = body else {
            tracing::error!(message.id = %message_id, "message without a body; dropped");
            continue;
        };
        match DeliveryMessage::parse(body) {
            Ok(message) => {
                parsed.push(message);
                positions.push(position);
            }
            // Retrying cannot fix a malformed message; the delivery row stays for the sweeper.
            Err(error) => {
                tracing::error!(message.id = %message_id, %error, "malformed message; dropped")
            }
        }
    }
    let lanes = Lanes {
        slots: shape.slots.as_ref(),
        rate: shape.slots.as_ref(),
        sweep_grace: shape.sweep_grace,
        send_by,
    };
    let handled = handle_batch(&shape.app, lanes, &parsed).await;
    for ((position, (delivery, _, _)), result) in positions.into_iter().zip(&parsed).zip(handled) {
        if let Err(error) = result {
            let message_id = messages[position].0;
            tracing::warn!(message.id = %message_id, delivery.id = %delivery, %error, "message failed; it will come back");
            outcomes[position] = MessageOutcome::Retry;
        }
    }
    // A partial-batch response is a successful invocation: Lambda's Errors never counts these.
    crate::telemetry::batch_item_failures(
        "sender",
        outcomes
            .iter()
            .filter(|o| **o == MessageOutcome::Retry)
            .count(),
    );
    outcomes
}

/// The longest a sweep runs: the sweeper function's `Timeout`, for which its run lock is
/// held (a template test keeps the two equal).
pub const SWEEP_RUN: std::time::Duration = std::time::Duration::from_secs(240);

/// How often the sweeper runs: its schedule's rate (a template test keeps the two equal).
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// The longest a health check runs: the health function's `Timeout`.
pub const HEALTH_RUN: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs `work` unless another run of `name` holds its lock (`None` then): a scheduled run
/// that started late must not overlap the next. The lock is held for `longest` at most.
async fn one_at_a_time<T, F>(
    shape: &AwsShape,
    name: &str,
    longest: std::time::Duration,
    work: F,
) -> ServiceResult<Option<T>>
where
    F: std::future::Future<Output = ServiceResult<T>>,
{
    let now = shape.app.clock.now();
    let until = crate::clock::add(now, longest);
    let Some(lock) = shape.store.take_run(name, now, until).await? else {
        tracing::info!(run = name, "another run is under way; this one stops");
        return Ok(None);
    };
    let outcome = work.await;
    if let Err(error) = shape.store.release_run(&lock).await {
        // It lapses at its `until`: the next run waits for that at most.
        tracing::warn!(run = name, %error, "the run lock was not given back");
    }
    outcome.map(Some)
}

/// The sweeper function's work, run `every` so long ([`SWEEP_EVERY`] on Lambda): fans out
/// events whose stream record was lost, re-queues pending deliveries more than `grace` past
/// due (again at doubling ages, counted from when the last sweep ran, or `every` ago if none
/// has), and measures the due backlog. `None` when another sweep is under way.
pub async fn sweep(
    shape: &AwsShape,
    grace: std::time::Duration,
    every: std::time::Duration,
) -> ServiceResult<Option<SweepReport>> {
    one_at_a_time(shape, "sweep", SWEEP_RUN, sweep_now(shape, grace, every)).await
}

async fn sweep_now(
    shape: &AwsShape,
    grace: std::time::Duration,
    every: std::time::Duration,
) -> ServiceResult<SweepReport> {
    let run_started = std::time::Instant::now();
    let now = shape.app.clock.now();
    // Events first: their deliveries are then due, and the walk below sees them. A failure
    // there does not keep the deliveries from being swept; the run still fails, afterwards.
    let recovered = recover_unfanned(&shape.app, now, grace).await;
    let resume = shape.store.due_walk_resume().await?;
    let since_last = match shape.store.last_sweep().await? {
        Some(last) if last < now => (now - last).to_std().unwrap_or(every),
        _ => every,
    };
    let report = sweep_overdue(&shape.app, now, (grace, since_last), resume.clone()).await?;
    if report.resume_at != resume {
        shape
            .store
            .set_due_walk_resume(report.resume_at.as_ref())
            .await?;
    }
    // The walk is done: the next sweep's window starts here, whatever happens below.
    shape.store.set_last_sweep(now).await?;
    // Erasures a call left unfinished (answered 202) end whether or not it is repeated,
    // started only while a whole call and the writes after it fit in the sweeper's time.
    let left = SWEEP_RUN.saturating_sub(run_started.elapsed());
    let starts_for = left
        .saturating_sub(crate::store::dynamodb::ERASE_BUDGET + std::time::Duration::from_secs(15));
    let erased = shape.store.finish_erasures(now, starts_for).await;
    tracing::info!(
        recovered = recovered.as_ref().ok(),
        erasures_finished = erased.as_ref().ok(),
        requeued = report.requeued,
        due = report.due,
        oldest_due = ?report.oldest_due,
        complete = report.complete,
        "swept"
    );
    recovered?;
    erased?;
    Ok(report)
}

/// The health function's work: disables long-failing endpoints, then sends the owner mail
/// still queued. Returns (disabled, mailed); `None` when another check is under way.
pub async fn check_health(shape: &AwsShape) -> ServiceResult<Option<(usize, usize)>> {
    one_at_a_time(shape, "health", HEALTH_RUN, async {
        let disabled = health::check(&shape.app).await?;
        let mailed = notifications::flush(&shape.app).await?;
        tracing::info!(disabled, mailed, "health checked");
        Ok((disabled, mailed))
    })
    .await
}
