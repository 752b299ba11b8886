//! Fan-out of an event stored without its deliveries (the outbox helper's events, arriving
//! through the DynamoDB stream): one delivery per subscribed endpoint, then the queue.
//! Replaying it is harmless: a delivery's id is derived from (event, endpoint), and the
//! store adds only the ones that do not exist yet.

use sha2::{Digest, Sha256};

use super::ServiceResult;
use crate::{
    domain::{Delivery, DeliveryId, EndpointId, Event},
    store::PendingRef,
    App,
};

/// The one id a delivery of `event` to `endpoint` can have.
pub fn delivery_id_for(event: &Event, endpoint: &EndpointId) -> DeliveryId {
    let digest = Sha256::new()
        .chain_update(event.account_id.as_str())
        .chain_update([0])
        .chain_update(event.id.as_str())
        .chain_update([0])
        .chain_update(endpoint.as_str())
        .finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    DeliveryId::from_trusted(format!("dlv_{hex}"))
}

/// Creates the missing deliveries of a stored event and queues them. Returns how many
/// were created.
pub async fn fan_out(app: &App, event: &Event) -> ServiceResult<usize> {
    let now = app.clock.now();
    let endpoints = app.store.list_endpoints(&event.account_id).await?;
    let receivers: Vec<_> = endpoints
        .iter()
        .filter(|e| e.receives(&event.event_type))
        .collect();
    let deliveries: Vec<Delivery> = receivers
        .iter()
        .map(|endpoint| {
            let mut delivery = Delivery::new_pending(
                event.id.clone(),
                endpoint.id.clone(),
                event.account_id.clone(),
                event.event_type.clone(),
                now,
            );
            delivery.id = delivery_id_for(event, &endpoint.id);
            delivery
        })
        .collect();
    let added = app.store.add_deliveries(&deliveries).await?;
    crate::telemetry::fanned_out(added.len());
    let refs: Vec<PendingRef> = added
        .iter()
        .filter_map(|d| {
            let endpoint = receivers.iter().find(|e| e.id == d.endpoint_id)?;
            Some(PendingRef {
                delivery_id: d.id.clone(),
                endpoint_id: endpoint.id.clone(),
                account_id: d.account_id.clone(),
                due: now,
                max_in_flight: endpoint.max_in_flight,
                rate_limit_per_second: endpoint.rate_limit_per_second,
            })
        })
        .collect();
    if !refs.is_empty() {
        app.queue.enqueue(refs).await?;
    }
    Ok(added.len())
}
