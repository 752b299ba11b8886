//! Test events: a signed `hooklane.test` event sent to one endpoint, so that a customer can
//! check their receiver (and its signature check) before real traffic arrives.

use serde_json::json;

use super::{endpoints, publish, ServiceError, ServiceResult};
use crate::{
    domain::{
        AccountId, Delivery, EndpointId, EndpointStatus, Event, EventId, EventType, InvalidField,
    },
    limits::PublishBuckets,
    App,
};

/// The type of every test event. Endpoints receive it whatever their event-type filter.
pub const TEST_EVENT_TYPE: &str = "hooklane.test";

/// Sends a test event to this endpoint only, through the normal path: it is logged,
/// attempted, retried and replayable like any delivery, and counts against the account's
/// publish rate limit. A disabled endpoint is refused (`Conflict`): its deliveries would be
/// abandoned, not sent.
pub async fn send(
    app: &App,
    limits: &dyn PublishBuckets,
    account: &AccountId,
    id: &EndpointId,
) -> ServiceResult<publish::Published> {
    let Some(stored) = app.store.get_account(account).await? else {
        return Err(ServiceError::NotFound("account"));
    };
    let endpoint = endpoints::get(app, account, id).await?;
    if endpoint.status != EndpointStatus::Active {
        return Err(ServiceError::Conflict(format!(
            "endpoint {id} is disabled: enable it, then send the test event"
        )));
    }
    publish::take_publish_tokens(app, limits, &stored, 1).await?;
    let now = app.clock.now();
    let data = json!({
        "endpoint_id": endpoint.id.as_str(),
        "message": "A test event from Hooklane. If your receiver verified its signature, the endpoint is ready.",
    });
    let event_type = EventType::parse(TEST_EVENT_TYPE)?;
    let event = Event::new(EventId::generate(), account.clone(), event_type, now, &data)
        .map_err(|e| InvalidField::new("data", e.to_string()))?;
    let delivery = Delivery::new_pending(&event, endpoint.id.clone(), now);
    publish::write_with_deliveries(app, event, vec![(&endpoint, delivery)]).await
}
