use super::{ServiceError, ServiceResult};
use crate::{
    domain::{AccountId, Delivery, Event, EventId, EventType, InvalidField},
    store::{PendingRef, PublishOutcome},
    App,
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
    pub deliveries: Vec<Delivery>,
    /// False when the id was published before: nothing new was created.
    pub created: bool,
}

/// Records an event and one delivery per subscribed endpoint in one transaction, then
/// hands the deliveries to the queue. Idempotent on the event id.
pub async fn publish(app: &App, account: &AccountId, input: NewEvent) -> ServiceResult<Published> {
    let id = match input.id.as_deref() {
        Some(raw) => EventId::parse(raw)?,
        None => EventId::generate(),
    };
    let event_type = EventType::parse(&input.event_type)?;
    if app.store.get_account(account).await?.is_none() {
        return Err(ServiceError::NotFound("account"));
    }
    let now = app.clock.now();
    let event = Event::new(id, account.clone(), event_type, now, &input.data)
        .map_err(|e| InvalidField::new("data", e.to_string()))?;
    if event.payload.len() > app.config.max_payload_bytes {
        return Err(ServiceError::TooLarge(format!(
            "event body is {} bytes; the limit is {} bytes (send ids and let receivers fetch details)",
            event.payload.len(),
            app.config.max_payload_bytes
        )));
    }
    let endpoints = app.store.list_endpoints(account).await?;
    let receivers: Vec<_> = endpoints
        .iter()
        .filter(|e| e.receives(&event.event_type))
        .collect();
    let deliveries: Vec<Delivery> = receivers
        .iter()
        .map(|e| {
            Delivery::new_pending(
                event.id.clone(),
                e.id.clone(),
                account.clone(),
                event.event_type.clone(),
                now,
            )
        })
        .collect();
    match app.store.publish(&event, &deliveries).await? {
        PublishOutcome::AlreadyExists { event, deliveries } => Ok(Published {
            event,
            deliveries,
            created: false,
        }),
        PublishOutcome::Created => {
            let refs = deliveries
                .iter()
                .zip(&receivers)
                .map(|(d, e)| PendingRef {
                    delivery_id: d.id.clone(),
                    endpoint_id: e.id.clone(),
                    account_id: account.clone(),
                    due: now,
                    max_in_flight: e.max_in_flight,
                    rate_limit_per_second: e.rate_limit_per_second,
                })
                .collect();
            crate::telemetry::published(deliveries.len());
            // The event is committed; if the queue fails now, the sweeper picks the rows up.
            if let Err(error) = app.queue.enqueue(refs).await {
                tracing::error!(event.id = %event.id, %error, "enqueue after publish failed; the sweeper will retry");
            }
            Ok(Published {
                event,
                deliveries,
                created: true,
            })
        }
    }
}

pub async fn get(
    app: &App,
    account: &AccountId,
    id: &EventId,
) -> ServiceResult<(Event, Vec<Delivery>)> {
    let event = app
        .store
        .get_event(account, id)
        .await?
        .ok_or(ServiceError::NotFound("event"))?;
    let deliveries = app.store.deliveries_of_event(account, id).await?;
    Ok((event, deliveries))
}
