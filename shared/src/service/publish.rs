use super::{ServiceError, ServiceResult};
use crate::{
    domain::{AccountId, Delivery, Endpoint, Event, EventId, EventType, InvalidField},
    store::{PendingRef, PublishOutcome, PutEventOutcome},
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
    pub deliveries: Vec<Delivery>,
    /// False when the id was published before: nothing new was created.
    pub created: bool,
}

/// Records an event, idempotent on its id, and one delivery per endpoint subscribed now.
/// How depends on `app.publish`: with [`PublishMode::WithDeliveries`] the event and its
/// deliveries are written in one transaction and queued here; with
/// [`PublishMode::ThroughStream`] only the event is written, and the stream's fan-out
/// creates and queues the deliveries listed here (their ids are derived from the event and
/// the endpoint, so the fan-out gives them exactly these).
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
    let now = event.created_at;
    let receivers: Vec<&Endpoint> = endpoints
        .iter()
        .filter(|e| e.receives(&event.event_type))
        .collect();
    let deliveries: Vec<Delivery> = receivers
        .iter()
        .map(|e| Delivery::new_pending(&event, e.id.clone(), now))
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
                    account_id: event.account_id.clone(),
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

async fn through_stream(
    app: &App,
    event: Event,
    endpoints: &[Endpoint],
) -> ServiceResult<Published> {
    match app.store.put_event(&event).await? {
        PutEventOutcome::Created => {
            crate::telemetry::event_published();
            let deliveries = planned_deliveries(&event, endpoints);
            Ok(Published {
                event,
                deliveries,
                created: true,
            })
        }
        PutEventOutcome::AlreadyExists(event) => {
            let stored = app.store.deliveries_of_event(&event).await?;
            // None stored yet: the fan-out has not run (a client retrying at once), and
            // these are the ones it will create.
            let deliveries = if stored.is_empty() {
                planned_deliveries(&event, endpoints)
            } else {
                stored
            };
            Ok(Published {
                event,
                deliveries,
                created: false,
            })
        }
    }
}

/// The deliveries the fan-out creates for `event` given the endpoints subscribed now.
fn planned_deliveries(event: &Event, endpoints: &[Endpoint]) -> Vec<Delivery> {
    endpoints
        .iter()
        .filter(|e| e.receives(&event.event_type))
        .map(|endpoint| Delivery::new_pending(event, endpoint.id.clone(), event.created_at))
        .collect()
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
    let deliveries = app.store.deliveries_of_event(&event).await?;
    Ok((event, deliveries))
}

#[cfg(all(test, feature = "aws"))]
mod tests {
    use super::*;
    use crate::{
        contract,
        domain::DeliveryStatus,
        service::fan_out::{delivery_id_for, fan_out},
        testing::{emulated_shape, receive_queued},
    };

    #[tokio::test]
    async fn on_the_aws_shape_publish_writes_the_event_alone_and_fan_out_makes_the_listed_deliveries(
    ) {
        let (settings, shape) = emulated_shape().await;
        assert_eq!(shape.app.publish, PublishMode::ThroughStream);
        let store = &shape.app.store;
        store
            .create_account(&contract::account("acme"))
            .await
            .unwrap();
        for id in ["ep_a", "ep_b"] {
            store
                .create_endpoint(&contract::endpoint("acme", id, contract::t0()))
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
}
