//! The event-type catalog, in both shapes: the operator adds types with a schema and an
//! example; publishing a type with a schema checks `data` (422 naming the JSON path, nothing
//! written, in a batch too); any credential reads the catalog; changes are audited; and with
//! `HOOKLANE_STRICT_EVENT_TYPES` a type the catalog lacks is refused.

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

fn invoice_schema() -> Value {
    json!({
        "type": "object",
        "required": ["invoice_id", "amount"],
        "properties": {
            "invoice_id": {"type": "string", "minLength": 1},
            "amount": {"type": "integer", "minimum": 0},
            "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}
        },
        "$defs": {"line": {"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}}}}
    })
}

/// A 422 naming `field`, whose message contains `says`.
fn refused(answer: &(u16, Value), field: &str, says: &str) {
    let (status, body) = answer;
    assert_eq!(*status, 422, "{body}");
    assert_eq!(body["error"]["field"], field, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(says), "{message:?} does not say {says:?}");
}

async fn publish(server: &Server, body: Value) -> (u16, Value) {
    server.post("/v1/accounts/acme/events", body).await
}

async fn the_catalog_checks_what_is_published(server: &Server) {
    server.create_account("acme").await;
    let created = server
        .post(
            "/v1/event-types",
            json!({
                "name": "invoice.paid",
                "description": "An invoice was paid in full.",
                "schema": invoice_schema(),
                "example": {"invoice_id": "in_1", "amount": 1200, "currency": "EUR"},
            }),
        )
        .await;
    assert_eq!(created.0, 201, "{}", created.1);
    assert_eq!(created.1["deprecated"], false);
    assert_eq!(created.1["schema"], invoice_schema());
    let again = server
        .post("/v1/event-types", json!({"name": "invoice.paid"}))
        .await;
    assert_eq!(again.0, 409, "{}", again.1);

    // Schemas and examples are checked when they are registered.
    let unknown = json!({"name": "order.created", "schema": {"type": "object", "properties": {"id": {"unevaluatedProperties": false}}}});
    refused(
        &server.post("/v1/event-types", unknown).await,
        "schema",
        "/properties/id/unevaluatedProperties",
    );
    let mismatch = json!({"name": "order.created", "schema": {"type": "object", "required": ["id"]}, "example": {"other": 1}});
    refused(
        &server.post("/v1/event-types", mismatch).await,
        "example",
        "does not match the schema",
    );
    refused(
        &server
            .post("/v1/event-types", json!({"name": "bad..name"}))
            .await,
        "name",
        "dot-separated",
    );

    // Any credential reads the catalog: here an account token.
    let (_, token) = server
        .post("/v1/accounts/acme/tokens", json!({"ttl_seconds": 600}))
        .await;
    let token = token["token"].as_str().expect("token").to_owned();
    let (status, list) = server
        .request_as(&token, Method::GET, "/v1/event-types", None)
        .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["data"][0]["name"], "invoice.paid", "{list}");
    let (status, one) = server.get("/v1/event-types/invoice.paid").await;
    assert_eq!(
        (status, &one["description"]),
        (200, &json!("An invoice was paid in full."))
    );
    assert_eq!(server.get("/v1/event-types/invoice.none").await.0, 404);

    // Publishing: each error names the JSON path in `data`, and nothing is written.
    let id = |n: &str| format!("evt_catalog_{n}");
    let cases = [
        (json!({"invoice_id": "in_2"}), "data", "amount"),
        (
            json!({"invoice_id": "in_2", "amount": -5}),
            "data.amount",
            "0",
        ),
        (
            json!({"invoice_id": "in_2", "amount": 5, "currency": "eur"}),
            "data.currency",
            "^[A-Z]{3}$",
        ),
        (
            json!({"invoice_id": "in_2", "amount": 5, "lines": [{"sku": "a"}, {}]}),
            "data.lines[1]",
            "sku",
        ),
    ];
    for (n, (data, field, says)) in cases.into_iter().enumerate() {
        let body = json!({"id": id(&n.to_string()), "type": "invoice.paid", "data": data});
        refused(&publish(server, body).await, field, says);
        let stored = server
            .get(&format!("/v1/accounts/acme/events/{}", id(&n.to_string())))
            .await;
        assert_eq!(stored.0, 404, "refused, yet stored: {}", stored.1);
    }
    let good = json!({"id": id("ok"), "type": "invoice.paid", "data": {"invoice_id": "in_3", "amount": 0, "currency": "EUR"}});
    assert_eq!(publish(server, good).await.0, 202);
    // A type the catalog lacks is accepted (not strict).
    let other = json!({"type": "order.created", "data": {"anything": true}});
    assert_eq!(publish(server, other).await.0, 202);

    // A batch with one bad item is refused whole, naming the item.
    let batch = json!({"events": [
        {"id": id("b0"), "type": "invoice.paid", "data": {"invoice_id": "in_4", "amount": 1}},
        {"id": id("b1"), "type": "invoice.paid", "data": {"invoice_id": "in_5", "amount": "1"}},
    ]});
    refused(
        &server.post("/v1/accounts/acme/events/batch", batch).await,
        "events[1].data.amount",
        "integer",
    );
    // A batch over 100 is refused for its length, before any item is checked.
    let mut too_long =
        vec![json!({"type": "invoice.paid", "data": {"invoice_id": "in_6", "amount": 1}}); 150];
    too_long[120]["data"]["amount"] = json!("1");
    refused(
        &server
            .post(
                "/v1/accounts/acme/events/batch",
                json!({"events": too_long}),
            )
            .await,
        "events",
        "at most 100",
    );
    assert_eq!(
        server
            .get(&format!("/v1/accounts/acme/events/{}", id("b0")))
            .await
            .0,
        404
    );

    // Without its schema, the type checks nothing; deleted, it is gone.
    let (status, changed) = server
        .request(
            Method::PATCH,
            "/v1/event-types/invoice.paid",
            Some(json!({"schema": null, "example": null, "deprecated": true})),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(
        (&changed["schema"], &changed["deprecated"]),
        (&Value::Null, &json!(true))
    );
    let loose = json!({"type": "invoice.paid", "data": {"amount": "lots"}});
    assert_eq!(publish(server, loose).await.0, 202);
    let gone = server
        .request(Method::DELETE, "/v1/event-types/invoice.paid", None)
        .await;
    assert_eq!(gone.0, 204, "{}", gone.1);
    assert_eq!(server.get("/v1/event-types/invoice.paid").await.0, 404);
    let twice = server
        .request(Method::DELETE, "/v1/event-types/invoice.paid", None)
        .await;
    assert_eq!(twice.0, 404);

    // Each change is in the operator's audit log.
    let (_, audit) = server.get("/v1/audit?limit=50").await;
    let actions: Vec<&str> = audit["data"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["target"]["type"] == "event_type")
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        actions,
        [
            "event_type.deleted",
            "event_type.updated",
            "event_type.created"
        ],
        "{audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_event_type_catalog() {
    let scratch = Scratch::new("event-types");
    let server = Server::start(&scratch, &[]).await;
    the_catalog_checks_what_is_published(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_event_type_catalog() {
    let scratch = Scratch::new("aws-event-types");
    let prefix = crate::aws_pipeline::unique("catalog");
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &[]).await;
    the_catalog_checks_what_is_published(&server).await;
    crate::iam::assert_allowed(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_event_types_refuse_a_type_the_catalog_lacks() {
    let scratch = Scratch::new("strict-event-types");
    let server = Server::start(&scratch, &[("HOOKLANE_STRICT_EVENT_TYPES", "true")]).await;
    server.create_account("acme").await;
    let unknown = json!({"type": "order.created", "data": {}});
    refused(
        &publish(&server, unknown.clone()).await,
        "type",
        "not in the event-type catalog",
    );
    let made = server
        .post("/v1/event-types", json!({"name": "order.created"}))
        .await;
    assert_eq!(made.0, 201, "{}", made.1);
    // This instance's own change is seen at once.
    assert_eq!(publish(&server, unknown).await.0, 202);
    // Test events are the platform's own, whatever the catalog says.
    let (endpoint, _) = server
        .create_endpoint("acme", "http://127.0.0.1:9/never", json!({}))
        .await;
    let test = server
        .post(
            &format!("/v1/accounts/acme/endpoints/{endpoint}/test"),
            Value::Null,
        )
        .await;
    assert_eq!(test.0, 202, "{}", test.1);
}
