//! Replays: final deliveries sent again on a person's request, through the queue, with an
//! audit record of each request.

use super::{audit, ServiceError, ServiceResult};
use crate::{
    domain::{
        AccountId, AuditAction, AuditTarget, Caller, Delivery, DeliveryId, DeliveryStatus,
        Endpoint, EndpointId, EndpointStatus, Replay, ReplayFilter, ReplayId, ReplayScope,
        TargetKind,
    },
    store::{MissedQuery, Page, PageAfter, PendingRef, ReplayRequest},
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
) -> ServiceResult<Endpoint> {
    match app.store.get_endpoint(account, id).await? {
        None => Err(missing),
        Some(endpoint) if endpoint.status != EndpointStatus::Active => Err(ServiceError::Conflict(
            "the endpoint is disabled; enable it before replaying".into(),
        )),
        Some(endpoint) => Ok(endpoint),
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
        if let Err(error) = app.queue.enqueue_replayed(outcome.queued).await {
            tracing::error!(replay.id = %outcome.replay.id, %error, "enqueue after replay failed; the sweeper will retry");
        }
    }
    tracing::info!(replay.id = %outcome.replay.id, actor = %outcome.replay.actor, count = outcome.replay.count, missed = outcome.replay.missed, "replay requested");
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
            "include_missed": replay.filter.include_missed,
            "missed": replay.missed,
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
            missed: 0,
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

/// "Resend since T": the endpoint's deliveries that match `filter` get a manual attempt;
/// with `include_missed`, so do the events of its types it missed while disabled (see
/// [`recover_missed`]), counted apart in the record.
pub async fn replay_endpoint(
    app: &App,
    account: &AccountId,
    endpoint: &EndpointId,
    filter: ReplayFilter,
    caller: &Caller,
) -> ServiceResult<Replay> {
    let endpoint =
        active_endpoint(app, account, endpoint, ServiceError::NotFound("endpoint")).await?;
    let mut replay = Replay {
        id: ReplayId::generate(),
        account_id: account.clone(),
        actor: caller.actor.to_text(),
        scope: ReplayScope::Endpoint(endpoint.id.clone()),
        filter,
        requested_at: app.clock.now(),
        count: 0,
        missed: 0,
        more: false,
    };
    if replay.filter.include_missed {
        (replay.missed, replay.more) = recover_missed(app, &replay, &endpoint, BULK_LIMIT).await?;
    }
    carry_out(app, replay, BULK_LIMIT, caller).await
}

/// Missed events read from the store at a time.
const MISSED_PAGE: u32 = 1_000;

/// Creates, and queues, the deliveries `endpoint` never had of the events it missed while
/// disabled in the replay's window (those [`Replay::recovers`]): at most `limit`. Each is
/// added only where the (event, endpoint) has no delivery, so asking again passes over what
/// an earlier request created and carries on where it stopped. Returns how many were
/// created and whether more may remain.
async fn recover_missed(
    app: &App,
    replay: &Replay,
    endpoint: &Endpoint,
    limit: u32,
) -> ServiceResult<(u32, bool)> {
    let Some(since) = replay.filter.since else {
        return Ok((0, false));
    };
    let limit = limit as usize;
    let now = replay.requested_at;
    let mut after = None;
    let mut created = 0usize;
    loop {
        let page = app
            .store
            .missed_events(&MissedQuery {
                account: replay.account_id.clone(),
                since,
                until: replay.filter.until,
                after: after.take(),
                limit: MISSED_PAGE,
            })
            .await?;
        let last_page = page.len() < MISSED_PAGE as usize;
        after = page.last().map(|m| (m.created_at, m.id.clone()));
        let wanted: Vec<Delivery> = page
            .iter()
            .filter(|missed| replay.recovers(endpoint, missed))
            .map(|missed| Delivery::recovered(missed, endpoint.id.clone(), now))
            .collect();
        // In slices no larger than the room left: what exists already takes none of it.
        let mut rest = &wanted[..];
        while !rest.is_empty() {
            if created == limit {
                return Ok((u32::try_from(created).unwrap_or(u32::MAX), true));
            }
            let (slice, later) = rest.split_at((limit - created).min(rest.len()));
            rest = later;
            let added = app.store.add_deliveries(slice).await?;
            created += added.len();
            if added.is_empty() {
                continue;
            }
            let queued = added
                .iter()
                .map(|d| PendingRef::new(d, endpoint, now))
                .collect();
            // The rows are pending and due now: if the queue fails, the sweeper sends them.
            if let Err(error) = app.queue.enqueue(queued).await {
                tracing::error!(replay.id = %replay.id, %error, "enqueue after recovering missed events failed; the sweeper will retry");
            }
        }
        if last_page {
            return Ok((u32::try_from(created).unwrap_or(u32::MAX), false));
        }
    }
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

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::{
        clock::ManualClock,
        fixtures,
        service::publish::{publish, NewEvent},
        store::{sqlite::SqliteStore, Store},
    };

    #[tokio::test]
    async fn missed_events_are_recovered_a_limit_at_a_time_each_once() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let clock = Arc::new(ManualClock::new(fixtures::t0()));
        let app = fixtures::app_on(store.clone(), clock.clone());
        store
            .create_account(&fixtures::account("acme"))
            .await
            .unwrap();
        let mut main = fixtures::endpoint("acme", "ep_main", fixtures::t0());
        main.status = EndpointStatus::Disabled;
        store.create_endpoint(&main).await.unwrap();
        let account = main.account_id.clone();
        for n in 0..5 {
            clock.advance(Duration::from_secs(1));
            let input = NewEvent {
                id: Some(format!("evt_{n}")),
                event_type: "invoice.paid".into(),
                data: serde_json::json!({"n": n}),
            };
            let published = publish(&app, &account, input).await.unwrap();
            assert!(published.deliveries.is_empty(), "disabled: no delivery");
        }
        let read = main.version();
        main.status = EndpointStatus::Active;
        store.update_endpoint(&main, &read).await.unwrap();
        let replay = Replay {
            id: ReplayId::generate(),
            account_id: account.clone(),
            actor: "admin".into(),
            scope: ReplayScope::Endpoint(main.id.clone()),
            filter: ReplayFilter::bulk(fixtures::t0(), None, None, vec![], true).unwrap(),
            requested_at: app.clock.now(),
            count: 0,
            missed: 0,
            more: false,
        };
        // Two a request: each asks again where the one before stopped.
        let mut answers = Vec::new();
        loop {
            let answer = recover_missed(&app, &replay, &main, 2).await.unwrap();
            answers.push(answer);
            if !answer.1 || answers.len() > 5 {
                break;
            }
        }
        assert_eq!(answers, [(2, true), (2, true), (1, false)]);
        assert_eq!(
            recover_missed(&app, &replay, &main, 2).await.unwrap(),
            (0, false)
        );
        for n in 0..5 {
            let event = store
                .get_event(
                    &account,
                    &crate::domain::EventId::parse(&format!("evt_{n}")).unwrap(),
                )
                .await
                .unwrap()
                .unwrap();
            let deliveries = store.deliveries_of_event(&event).await.unwrap();
            assert_eq!(deliveries.len(), 1, "evt_{n}: {deliveries:?}");
            assert_eq!(deliveries[0].endpoint_id, main.id);
            assert_eq!(deliveries[0].next_trigger, crate::domain::Trigger::Manual);
        }
    }
}
