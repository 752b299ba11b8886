//! Property tests for everything parsed from outside: no panic, no 5xx, nothing half-written.

use axum::{body::Body, http::Request};
use hooklane::{
    api::{self, ApiState},
    clock::from_millis,
    config::parse_duration,
    domain::{outcome::parse_retry_after, AccountId, EndpointUrl, EventType, RetrySchedule},
    http::AddressPolicy,
    signing::{self, SigningSecret},
    store::cursor::decode as decode_cursor,
    App,
};
use proptest::prelude::*;
use serde_json::{json, Value};
use tower::ServiceExt;

const TOKEN: &str = "property-test-admin-token";

fn app() -> App {
    hooklane_testkit::app::api_only_app()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn call(
    router: &axum::Router,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    token: Option<&str>,
) -> (u16, Value) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = match body {
        Some(bytes) => request
            .header("content-type", "application/json")
            .body(Body::from(bytes)),
        None => request.body(Body::empty()),
    }
    .expect("request");
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A router with account `acme` and one endpoint.
async fn seeded() -> (App, axum::Router) {
    let app = app();
    let router = api::router(ApiState::new(
        app.clone(),
        hooklane::tokens::TokenKey::generate(),
        hooklane::service::access::AdminToken::fixed(TOKEN),
        std::time::Duration::ZERO,
        std::sync::Arc::new(hooklane::limits::Unlimited),
    ));
    let account = br#"{"id":"acme","name":"Acme","owner_email":"o@acme.example"}"#.to_vec();
    let (status, _) = call(&router, "POST", "/v1/accounts", Some(account), Some(TOKEN)).await;
    assert_eq!(status, 201);
    let endpoint = br#"{"url":"https://93.184.215.14/hook"}"#.to_vec();
    let (status, body) = call(
        &router,
        "POST",
        "/v1/accounts/acme/endpoints",
        Some(endpoint),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    (app, router)
}

fn assert_error_shape(status: u16, body: &Value) {
    assert!(status < 500, "5xx: {status} {body}");
    if status >= 400 {
        assert!(
            body["error"]["code"].is_string() && body["error"]["message"].is_string(),
            "{status} {body}"
        );
    }
}

/// JSON values that look like our request bodies: real field names with values of any type.
fn body_like(fields: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let samples = vec![
        "invoice.paid",
        "https://93.184.215.14/x",
        "http://127.0.0.1/",
        "a@b.co",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "*",
        "evt_1",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
        prop::sample::select(samples).prop_map(|s| json!(s)),
    ];
    let value = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    let key = prop_oneof![
        prop::sample::select(fields.to_vec()).prop_map(str::to_owned),
        "[a-z_]{1,10}"
    ];
    prop::collection::btree_map(key, value, 0..6)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn parsers_never_panic(raw in ".{0,300}") {
        let _ = EndpointUrl::parse(&raw);
        if let Ok(url) = url::Url::parse(&raw) {
            let _ = AddressPolicy::default().check_url(&url);
        }
        if let Some(delay) = parse_retry_after(&raw, from_millis(1_700_000_000_000)) {
            prop_assert!(delay.as_secs() <= 365 * 86_400);
        }
        let _ = decode_cursor(&raw);
        let _ = SigningSecret::parse(&raw);
        let _ = RetrySchedule::parse(&raw);
        let _ = parse_duration(&raw, "x");
        let _ = AccountId::parse(&raw);
        if let Ok(ty) = EventType::parse(&raw) {
            prop_assert!(ty.as_str().split('.').all(|s| !s.is_empty()));
        }
    }

    #[test]
    fn verify_rejects_garbage_without_panicking(
        id in ".{0,40}",
        ts in ".{0,20}",
        sig in ".{0,200}",
        body in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let secret = SigningSecret::generate();
        prop_assert!(signing::verify(&[&secret], &id, &ts, &sig, &body, 1_700_000_000, 300).is_err());
    }

    #[test]
    fn endpoint_bodies_get_4xx_json_or_201(
        body in body_like(&["url", "description", "event_types", "max_in_flight", "rate_limit_per_second", "secret"]),
    ) {
        runtime().block_on(async {
            let (_, router) = seeded().await;
            let bytes = serde_json::to_vec(&body).unwrap();
            let (status, response) =
                call(&router, "POST", "/v1/accounts/acme/endpoints", Some(bytes), Some(TOKEN)).await;
            assert_error_shape(status, &response);
            let (_, list) = call(&router, "GET", "/v1/accounts/acme/endpoints", None, Some(TOKEN)).await;
            let count = list["data"].as_array().map(Vec::len).unwrap_or(0);
            // Either it was created whole, or nothing was written.
            assert_eq!(count, if status == 201 { 2 } else { 1 }, "{status} {response}");
        });
    }

    #[test]
    fn event_bodies_get_4xx_json_or_202_and_nothing_half_written(
        body in body_like(&["id", "type", "data"]),
    ) {
        runtime().block_on(async {
            let (app, router) = seeded().await;
            let bytes = serde_json::to_vec(&body).unwrap();
            let (status, response) =
                call(&router, "POST", "/v1/accounts/acme/events", Some(bytes), Some(TOKEN)).await;
            assert_error_shape(status, &response);
            let account = AccountId::parse("acme").unwrap();
            let page = app.store.list_deliveries(&account, &Default::default()).await.unwrap();
            assert_eq!(page.items.len(), if status == 202 { 1 } else { 0 }, "{status} {response}");
        });
    }

    #[test]
    fn raw_bytes_are_never_a_5xx(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        path in prop::sample::select(vec!["/v1/accounts", "/v1/accounts/acme/endpoints", "/v1/accounts/acme/events"]),
    ) {
        runtime().block_on(async {
            let (_, router) = seeded().await;
            let (status, response) = call(&router, "POST", path, Some(bytes), Some(TOKEN)).await;
            assert_error_shape(status, &response);
        });
    }

    #[test]
    fn delivery_log_queries_are_never_a_5xx(
        params in prop::collection::vec(
            (
                prop::sample::select(vec!["endpoint", "status", "event_type", "since", "until", "status_code", "cursor", "limit", "other"]),
                "[ -~]{0,30}",
            ),
            0..4,
        ),
    ) {
        runtime().block_on(async {
            let (_, router) = seeded().await;
            let query = params
                .iter()
                .map(|(k, v)| format!("{k}={}", url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()))
                .collect::<Vec<_>>()
                .join("&");
            let path = format!("/v1/accounts/acme/deliveries?{query}");
            let (status, response) = call(&router, "GET", &path, None, Some(TOKEN)).await;
            assert_error_shape(status, &response);
        });
    }

    #[test]
    fn tokens_and_paths_are_never_a_5xx(token in "[ -~]{0,60}", segment in "[a-zA-Z0-9_.%:-]{0,40}") {
        runtime().block_on(async {
            let (_, router) = seeded().await;
            let paths = [
                format!("/v1/accounts/{segment}"),
                format!("/v1/accounts/acme/endpoints/{segment}"),
                format!("/v1/accounts/acme/deliveries/{segment}/attempts"),
                format!("/v1/accounts/acme/events/{segment}"),
            ];
            for path in paths {
                let (status, response) = call(&router, "GET", &path, None, Some(&token)).await;
                assert_error_shape(status, &response);
                // A path that names a real route needs the token; an empty segment is no route.
                if token.trim() != TOKEN && !segment.is_empty() {
                    assert_eq!(status, 401, "{path} with token {token:?}: {response}");
                }
                let (status, response) = call(&router, "GET", &path, None, Some(TOKEN)).await;
                assert_error_shape(status, &response);
            }
        });
    }
}
