use super::ServiceResult;
use crate::{
    clock::Timestamp,
    domain::{health::should_disable, Delivery, Endpoint, Event, EventId, EventType},
    store::{DisableRequest, Notification},
    App,
};

pub const ENDPOINT_DISABLED: &str = "endpoint.disabled";

/// Disables every active endpoint that has been failing for longer than the threshold.
/// Returns how many were disabled.
pub async fn check(app: &App) -> ServiceResult<usize> {
    let now = app.clock.now();
    let cutoff =
        now - chrono::Duration::from_std(app.config.disable_after).unwrap_or(chrono::Duration::MAX);
    let mut disabled = 0;
    for endpoint in app.store.failing_endpoints(cutoff).await? {
        if let Some(since) = endpoint.failing_since {
            if should_disable(Some(since), now, app.config.disable_after)
                && disable_failing(app, &endpoint, since).await?
            {
                disabled += 1;
            }
        }
    }
    Ok(disabled)
}

/// Disables one endpoint that has failed since `failing_since`: abandons its pending
/// deliveries, queues the owner's e-mail and publishes `endpoint.disabled`, all in one
/// transaction. False if it recovered or was changed meanwhile.
pub async fn disable_failing(
    app: &App,
    endpoint: &Endpoint,
    failing_since: Timestamp,
) -> ServiceResult<bool> {
    let now = app.clock.now();
    let failing_for = humanize((now - failing_since).to_std().unwrap_or_default());
    let reason = format!(
        "every delivery failed for {failing_for} (since {})",
        failing_since.to_rfc3339()
    );
    let account = app.store.get_account(&endpoint.account_id).await?;
    let notification = account.map(|account| Notification {
        id: format!("ntf_{}", uuid::Uuid::now_v7().simple()),
        account_id: account.id.clone(),
        recipient: account.owner_email.clone(),
        subject: format!("Webhook endpoint disabled: {}", endpoint.url.as_str()),
        body: format!(
            "Hello {name},\n\nWe disabled your webhook endpoint {url} (id {id}) because {reason}.\n\
             Pending deliveries to it were abandoned; nothing is lost: after fixing the endpoint, \
             re-enable it and ask for a resend of the events since {since}.\n",
            name = account.name,
            url = endpoint.url.as_str(),
            id = endpoint.id,
            since = failing_since.to_rfc3339(),
        ),
        created_at: now,
    });
    let operational_event = operational_event(app, endpoint, failing_since, &reason, now).await?;
    let published = operational_event
        .as_ref()
        .map(|(_, deliveries)| deliveries.clone());
    let outcome = app
        .store
        .disable_endpoint(&DisableRequest {
            account_id: endpoint.account_id.clone(),
            endpoint_id: endpoint.id.clone(),
            reason: reason.clone(),
            now,
            expected_failing_since: Some(failing_since),
            notification,
            operational_event,
        })
        .await?;
    let Some(outcome) = outcome else {
        return Ok(false);
    };
    tracing::warn!(endpoint.id = %endpoint.id, account.id = %endpoint.account_id, abandoned = outcome.abandoned, %reason, "endpoint disabled");
    // The endpoint is disabled whatever happens to its entry (`record` logs a failure).
    let _ = super::audit::record(
        app,
        &crate::domain::Caller::system(),
        Some(&endpoint.account_id),
        crate::domain::AuditAction::EndpointDisabled,
        crate::domain::AuditTarget::new(crate::domain::TargetKind::Endpoint, &endpoint.id),
        super::audit::details(
            serde_json::json!({ "reason": reason, "abandoned": outcome.abandoned }),
        ),
    )
    .await;
    crate::telemetry::endpoint_disabled(&endpoint.account_id, outcome.abandoned);
    if let Some(deliveries) = published {
        enqueue_new(app, deliveries).await?;
    }
    super::notifications::flush(app).await?;
    Ok(true)
}

async fn operational_event(
    app: &App,
    endpoint: &Endpoint,
    failing_since: Timestamp,
    reason: &str,
    now: Timestamp,
) -> ServiceResult<Option<(Event, Vec<Delivery>)>> {
    let Some(ops) = &app.config.operations_account else {
        return Ok(None);
    };
    let event_type = EventType::from_trusted(ENDPOINT_DISABLED.into());
    let data = serde_json::json!({
        "account_id": endpoint.account_id,
        "endpoint_id": endpoint.id,
        "url": endpoint.url,
        "failing_since": failing_since,
        "disabled_at": now,
        "reason": reason,
    });
    let event = Event::new(EventId::generate(), ops.clone(), event_type, now, &data)
        .map_err(|e| crate::domain::InvalidField::new("data", e.to_string()))?;
    let deliveries = app
        .store
        .list_endpoints(ops)
        .await?
        .iter()
        .filter(|e| e.id != endpoint.id && e.receives(&event))
        .map(|e| Delivery::new_pending(&event, e.id.clone(), now))
        .collect();
    Ok(Some((event, deliveries)))
}

async fn enqueue_new(app: &App, deliveries: Vec<Delivery>) -> ServiceResult<()> {
    if deliveries.is_empty() {
        return Ok(());
    }
    let Some(account) = deliveries.first().map(|d| d.account_id.clone()) else {
        return Ok(());
    };
    let endpoints = app.store.list_endpoints(&account).await?;
    let endpoints = crate::domain::endpoints_by_id(&endpoints);
    let refs = deliveries
        .iter()
        .filter_map(|d| {
            let endpoint = endpoints.get(&d.endpoint_id)?;
            Some(crate::store::PendingRef {
                delivery_id: d.id.clone(),
                endpoint_id: d.endpoint_id.clone(),
                account_id: d.account_id.clone(),
                due: d.next_try_at.unwrap_or(d.created_at),
                max_in_flight: endpoint.max_in_flight,
                rate_limit_per_second: endpoint.rate_limit_per_second,
            })
        })
        .collect();
    app.queue.enqueue(refs).await?;
    Ok(())
}

fn humanize(duration: std::time::Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        s if s >= 2 * 86_400 => format!("{} days", s / 86_400),
        s if s >= 2 * 3600 => format!("{} hours", s / 3600),
        s if s >= 120 => format!("{} minutes", s / 60),
        s => format!("{s} seconds"),
    }
}
