//! An event id names one event: publishing another event (another `type`, other `data`)
//! under a published id is answered 409 naming the field, alone or in a batch, and writes
//! nothing; the same event again is answered 200 with the stored one. Through the API's
//! router, in both publish modes (the event with its deliveries, or alone for the fan-out).

use hooklane::PublishMode;
use hooklane_testkit::fixtures::{create_account_and_endpoints, endpoint, t0};
use serde_json::{json, Value};

use crate::admin_api;

async fn router(publish: PublishMode) -> axum::Router {
    let app = hooklane::App {
        publish,
        ..hooklane_testkit::app::api_only_app()
    };
    create_account_and_endpoints(
        app.store.as_ref(),
        "acme",
        &[endpoint("acme", "ep_a", t0())],
    )
    .await;
    admin_api::router(app)
}

async fn send(
    router: &axum::Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let (status, _, json) = admin_api::send(router, method, path, body).await;
    (status, json)
}

const PUBLISH: &str = "/v1/accounts/acme/events";
const BATCH: &str = "/v1/accounts/acme/events/batch";

#[tokio::test]
async fn another_event_under_a_published_id_is_answered_409_naming_the_field() {
    for mode in [PublishMode::WithDeliveries, PublishMode::ThroughStream] {
        let router = router(mode).await;
        let first = json!({"id": "evt_1", "type": "invoice.paid",
            "data": {"amount": 42.5, "currency": "EUR", "lines": [{"sku": "a"}]}});
        let (status, published) = send(&router, "POST", PUBLISH, Some(first)).await;
        assert_eq!(status, 202, "{mode:?}: {published}");

        // The same event again, its members in another order: the stored one, 200.
        let retry = json!({"id": "evt_1", "type": "invoice.paid",
            "data": {"lines": [{"sku": "a"}], "currency": "EUR", "amount": 42.5}});
        let (status, again) = send(&router, "POST", PUBLISH, Some(retry)).await;
        assert_eq!(status, 200, "{mode:?}: {again}");
        assert_eq!(again["created_at"], published["created_at"], "{mode:?}");

        let other_data = json!({"id": "evt_1", "type": "invoice.paid",
            "data": {"amount": 43, "currency": "EUR", "lines": [{"sku": "a"}]}});
        let (status, body) = send(&router, "POST", PUBLISH, Some(other_data.clone())).await;
        assert_eq!(
            (status, body),
            (
                409,
                json!({"error": {
                    "code": "conflict",
                    "message": "event `evt_1` was already published with other data: an event id \
                                names one event; publish this one under a new id",
                    "field": "data",
                }})
            ),
            "{mode:?}"
        );
        let other_type = json!({"id": "evt_1", "type": "invoice.voided",
            "data": {"amount": 42.5, "currency": "EUR", "lines": [{"sku": "a"}]}});
        let (status, body) = send(&router, "POST", PUBLISH, Some(other_type)).await;
        assert_eq!(
            (status, body),
            (
                409,
                json!({"error": {
                    "code": "conflict",
                    "message": "event `evt_1` was already published with another type \
                                (`invoice.paid`): an event id names one event; publish this one \
                                under a new id",
                    "field": "type",
                }})
            ),
            "{mode:?}"
        );

        let (_, stored) = send(&router, "GET", &format!("{PUBLISH}/evt_1"), None).await;
        assert_eq!(stored["data"], published["data"], "{mode:?}");
        assert_eq!(stored["type"], "invoice.paid", "{mode:?}");

        // Erased, only the type is compared: other data is answered with the erased event.
        let (status, _) = send(&router, "DELETE", &format!("{PUBLISH}/evt_1"), None).await;
        assert_eq!(status, 200, "{mode:?}");
        let different = json!({"id": "evt_1", "type": "invoice.paid", "data": {"n": 1}});
        let (status, body) = send(&router, "POST", PUBLISH, Some(different)).await;
        assert_eq!(
            (status, &body["data"]),
            (200, &Value::Null),
            "{mode:?}: {body}"
        );
        let different = json!({"id": "evt_1", "type": "invoice.voided", "data": {"n": 1}});
        let (status, body) = send(&router, "POST", PUBLISH, Some(different)).await;
        assert_eq!(
            (status, &body["error"]["field"]),
            (409, &json!("type")),
            "{mode:?}: {body}"
        );
    }
}

/// A batch with one item under the id of another event is refused whole, as a batch with an
/// invalid item is: 409 naming the item (`events[3].data`), and none of its items written, so
/// that sending it again without that item writes each of the others once.
#[tokio::test]
async fn a_batch_with_an_item_under_another_events_id_is_refused_naming_it() {
    for mode in [PublishMode::WithDeliveries, PublishMode::ThroughStream] {
        let router = router(mode).await;
        let first = json!({"id": "evt_1", "type": "invoice.paid", "data": {"amount": 42.5}});
        let (status, published) = send(&router, "POST", PUBLISH, Some(first.clone())).await;
        assert_eq!(status, 202, "{mode:?}: {published}");

        let fresh = |id: &str| json!({"id": id, "type": "invoice.paid", "data": {"n": id}});
        let other_data = json!({"id": "evt_1", "type": "invoice.paid", "data": {"amount": 43}});
        let batch = json!({"events": [fresh("evt_2"), fresh("evt_3"), first.clone(), other_data]});
        // The same id twice in one batch is refused as such, before anything else.
        let (status, body) = send(&router, "POST", BATCH, Some(batch)).await;
        assert_eq!(
            (status, &body["error"]["field"]),
            (422, &json!("events[3].id")),
            "{mode:?}: {body}"
        );
        let other_data = json!({"id": "evt_1", "type": "invoice.paid", "data": {"amount": 43}});
        let batch = json!({"events": [fresh("evt_2"), fresh("evt_3"), fresh("evt_4"), other_data]});
        let (status, body) = send(&router, "POST", BATCH, Some(batch)).await;
        assert_eq!(status, 409, "{mode:?}: {body}");
        assert_eq!(
            body,
            json!({"error": {
                "code": "conflict",
                "message": "events[3]: event `evt_1` was already published with other data: an \
                            event id names one event; publish this one under a new id",
                "field": "events[3].data",
            }}),
            "{mode:?}"
        );
        for id in ["evt_2", "evt_3", "evt_4"] {
            let (status, _) = send(&router, "GET", &format!("{PUBLISH}/{id}"), None).await;
            assert_eq!(status, 404, "{mode:?}: {id} of a refused batch was written");
        }
        let other_type = json!({"id": "evt_1", "type": "invoice.voided", "data": {"amount": 42.5}});
        let batch = json!({"events": [other_type, fresh("evt_2")]});
        let (status, body) = send(&router, "POST", BATCH, Some(batch)).await;
        assert_eq!(
            (status, &body["error"]["field"]),
            (409, &json!("events[0].type")),
            "{mode:?}: {body}"
        );

        // Sent again without it: the others are written once; the same event again is
        // answered with the stored one, as before.
        let batch = json!({"events": [fresh("evt_2"), first, fresh("evt_3"), fresh("evt_4")]});
        let (status, body) = send(&router, "POST", BATCH, Some(batch)).await;
        assert_eq!(status, 202, "{mode:?}: {body}");
        let created: Vec<&Value> = body["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| &r["created"])
            .collect();
        assert_eq!(
            created,
            [&json!(true), &json!(false), &json!(true), &json!(true)],
            "{mode:?}: {body}"
        );
        assert_eq!(
            body["results"][1]["event"]["created_at"], published["created_at"],
            "{mode:?}: {body}"
        );
    }
}
