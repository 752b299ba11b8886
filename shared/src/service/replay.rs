//! Replays: final deliveries sent again on a person's request, through the queue, with an
//! audit record of each request.

use super::{audit, ServiceError, ServiceResult};
use crate::{
    domain::{
        AccountId, AuditAction, AuditTarget, Caller, DeliveryId, DeliveryStatus, EndpointId,
        EndpointStatus, Replay, ReplayFilter, ReplayId, ReplayScope, TargetKind,
    },
    store::{Page, PageAfter, ReplayRequest},
    App,
};

/// The most deliveries one bulk request replays; `more` tells the caller to ask again.
pub const BULK_LIMIT: u32 = 10_000;

/// Replays go to active endpoints only; `missing` is the error when the endpoint is gone.
async fn active_endpoint(
    app: &App,
    account: &AccountId,
    id: &EndpointId,
    missing: ServiceError,
) -> ServiceResult<()> {
    match app.store.get_endpoint(account, id).await? {
        None => Err(missing),
        Some(endpoint) if endpoint.status != EndpointStatus::Active => Err(ServiceError::Conflict(
            "the endpoint is disabled; enable it before replaying".into(),
        )),
        Some(_) => Ok(()),
    }
}

async fn carry_out(
    app: &App,
    replay: Replay,
    limit: u32,
    caller: &Caller,
) -> ServiceResult<Replay> {
    let outcome = app.store.replay(&ReplayRequest { replay, limit }).await?;
    if !outcome.queued.is_empty() {
        // The rows are pending and due now: if the queue fails, the sweeper sends them.
        if let Err(error) = app.queue.enqueue(outcome.queued).await {
            tracing::error!(replay.id = %outcome.replay.id, %error, "enqueue after replay failed; the sweeper will retry");
        }
    }
    tracing::info!(replay.id = %outcome.replay.id, actor = %outcome.replay.actor, count = outcome.replay.count, "replay requested");
    crate::telemetry::replayed(u64::from(outcome.replay.count));
    let replay = outcome.replay;
    let scope = match &replay.scope {
        ReplayScope::Delivery(id) => serde_json::json!({ "delivery": id }),
        ReplayScope::Endpoint(id) => serde_json::json!({ "endpoint": id }),
    };
    audit::record(
        app,
        caller,
        Some(&replay.account_id),
        AuditAction::ReplayCreated,
        AuditTarget::new(TargetKind::Replay, &replay.id),
        audit::details(serde_json::json!({
            "scope": scope,
            "count": replay.count,
            "more": replay.more,
        })),
    )
    .await?;
    Ok(replay)
}

/// Sends one final delivery again: the next attempt is manual and the retry schedule
/// starts over. A pending delivery is refused (409): it is still being tried.
pub async fn replay_delivery(
    app: &App,
    account: &AccountId,
    delivery: &DeliveryId,
    caller: &Caller,
) -> ServiceResult<Replay> {
    let current = app
        .store
        .get_delivery(account, delivery)
        .await?
        .ok_or(ServiceError::NotFound("delivery"))?;
    if current.status == DeliveryStatus::Pending {
        return Err(ServiceError::Conflict(
            "the delivery is still pending; it will be tried at its next_try_at".into(),
        ));
    }
    let deleted = ServiceError::Conflict(
        "the delivery's endpoint was deleted; there is nowhere to send it".into(),
    );
    active_endpoint(app, account, &current.endpoint_id, deleted).await?;
    if app
        .store
        .get_event(account, &current.event_id)
        .await?
        .is_none()
    {
        return Err(ServiceError::Conflict(
            "the delivery's event is past retention and no longer stored; it cannot be sent again"
                .into(),
        ));
    }
    let replay = carry_out(
        app,
        Replay {
            id: ReplayId::generate(),
            account_id: account.clone(),
            actor: caller.actor.to_text(),
            scope: ReplayScope::Delivery(delivery.clone()),
            filter: ReplayFilter::single(),
            requested_at: app.clock.now(),
            count: 0,
            more: false,
        },
        1,
        caller,
    )
    .await?;
    if replay.count == 0 {
        return Err(ServiceError::Conflict(
            "the delivery changed meanwhile and was not replayed; look again".into(),
        ));
    }
    Ok(replay)
}

/// "Resend since T": the endpoint's deliveries that match `filter` get a manual attempt.
pub async fn replay_endpoint(
    app: &App,
    account: &AccountId,
    endpoint: &EndpointId,
    filter: ReplayFilter,
    caller: &Caller,
) -> ServiceResult<Replay> {
    active_endpoint(app, account, endpoint, ServiceError::NotFound("endpoint")).await?;
    carry_out(
        app,
        Replay {
            id: ReplayId::generate(),
            account_id: account.clone(),
            actor: caller.actor.to_text(),
            scope: ReplayScope::Endpoint(endpoint.clone()),
            filter,
            requested_at: app.clock.now(),
            count: 0,
            more: false,
        },
        BULK_LIMIT,
        caller,
    )
    .await
}

/// The account's replay audit trail, newest first.
pub async fn list(
    app: &App,
    account: &AccountId,
    after: Option<&ReplayId>,
    limit: u32,
) -> ServiceResult<Page<Replay>> {
    if app.store.get_account(account).await?.is_none() {
        return Err(ServiceError::NotFound("account"));
    }
    let page = PageAfter {
        after: after.cloned(),
        limit,
    };
    Ok(app.store.list_replays(account, &page).await?)
}
