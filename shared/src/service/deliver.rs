use std::time::Duration;

use bytes::Bytes;
use tracing::Instrument;

use super::{health, ServiceResult};
use crate::{
    clock::Timestamp,
    domain::{
        health::should_disable, Attempt, AttemptOutcome, Decision, DeliveryId, DeliveryStatus,
        EndpointStatus, KeptResponse, Trigger,
    },
    http::{OutboundRequest, OutboundResponse},
    signing::{self, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP},
    store::{AttemptRecord, DeliveryWork, PendingRef, RecordOutcome, Unattempted, UnattemptedMove},
    App,
};

/// A ticket that arrives this much before its delivery's time is early, not due.
const EARLY_TOLERANCE: Duration = Duration::from_millis(500);

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
) -> ServiceResult<AttemptResult> {
    attempt_reporting_answer(app, delivery_id, trigger, &|| {}).await
}

/// [`attempt`], calling `answered` as soon as the endpoint has answered (or the request
/// failed), before the attempt is recorded.
pub async fn attempt_reporting_answer(
    app: &App,
    delivery_id: &DeliveryId,
    trigger: Trigger,
    answered: &(dyn Fn() + Send + Sync),
) -> ServiceResult<AttemptResult> {
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
        return abandoned(app, &work.delivery, work.endpoint.is_none()).await;
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
        return ended_unsent(app, &work, EVENT_EXPIRED, now).await;
    };
    if event.is_erased() {
        return ended_unsent(app, &work, crate::domain::event::EVENT_ERASED, now).await;
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
        let response = app.transport.post(request).await;
        answered();
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
        let failing_since = match app.store.record_attempt(&record).await? {
            RecordOutcome::Stale => {
                tracing::info!("delivery was already moved on; attempt not recorded");
                return Ok(AttemptResult::Stale);
            }
            RecordOutcome::Recorded { endpoint_failing_since } => endpoint_failing_since,
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
    let change = UnattemptedMove::of(
        delivery,
        Unattempted::Abandon(reason.into()),
        app.clock.now(),
    );
    if !app.store.move_unattempted(&change).await? {
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
    if !app.store.move_unattempted(&change).await? {
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
}
