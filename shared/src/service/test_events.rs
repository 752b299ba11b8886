//! Test events: a signed `hooklane.test` event sent to one endpoint, so that a customer can
//! check their receiver (and its signature check) before real traffic arrives.

use serde_json::json;

use super::{endpoints, publish, ServiceError, ServiceResult};
use crate::{
    domain::{
        rate::PublishRate, AccountId, Delivery, EndpointId, EndpointStatus, Event, EventId,
        EventType, InvalidField,
    },
    limits::PublishBuckets,
    App,
};

/// The type of every test event. Endpoints receive it whatever their event-type filter.
pub const TEST_EVENT_TYPE: &str = "hooklane.test";

/// Test events an account may send: ten at once, then one a second. Their own bucket, not
/// the account's publish limit: a customer trying their receiver must not use up the
/// platform's publishes, nor, unlimited, aim a flood of signed requests at any address.
const TEST_EVENTS_PER_SECOND: u32 = 1;
const TEST_EVENTS_BURST: u32 = 10;

/// Sends a test event to this endpoint only, through the normal path: it is logged,
/// attempted, retried and replayable like any delivery. It takes a token of the account's
/// test-event bucket ([`TEST_EVENTS_BURST`] at once, then [`TEST_EVENTS_PER_SECOND`]). A
/// disabled endpoint is refused (`Conflict`): its deliveries would be abandoned, not sent.
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
    take_test_token(limits, &stored.id).await?;
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

/// Takes a token of the account's test-event bucket (kept beside its publish bucket, under a
/// key no account id can have). A bucket that cannot be read lets the test event through, as
/// it does a publish.
async fn take_test_token(limits: &dyn PublishBuckets, account: &AccountId) -> ServiceResult<()> {
    let rate = PublishRate::new(
        TEST_EVENTS_PER_SECOND,
        Some(TEST_EVENTS_BURST),
        "test events",
    )?;
    let bucket = AccountId::from_trusted(format!("{account}#test-events"));
    publish::take_tokens(limits, &bucket, rate, 1, "test events").await
}
