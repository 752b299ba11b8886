//! The API router as the `api` Lambda serves it: requests are API Gateway events (HTTP API
//! v2 and REST v1) turned into HTTP requests by `lambda_http`, as in the function.

use std::time::Duration;

use hooklane::{
    api::{self, ApiState},
    service::access::AdminToken,
    tokens::TokenKey,
};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const ADMIN: &str = "lambda-admin-token-0123456789";

fn router() -> axum::Router {
    let app = hooklane_testkit::app::api_only_app();
    api::router(ApiState::new(
        app,
        TokenKey::generate(),
        AdminToken::fixed(ADMIN),
        Duration::ZERO,
        std::sync::Arc::new(hooklane::limits::Unlimited),
    ))
}

/// An HTTP API (v2) event on the `$default` stage.
fn http_api_event(
    method: &str,
    path: &str,
    query: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> String {
    let mut headers = json!({
        "host": "abc123.execute-api.eu-west-1.amazonaws.com",
        "x-forwarded-proto": "https",
        "content-type": "application/json",
    });
    if let Some(token) = token {
        headers["authorization"] = json!(format!("Bearer {token}"));
    }
    json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc123",
            "domainName": "abc123.execute-api.eu-west-1.amazonaws.com",
            "domainPrefix": "abc123",
            "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "192.0.2.1", "userAgent": "test"},
            "requestId": "req-1",
            "routeKey": "$default",
            "stage": "$default",
            "time": "30/Nov/2026:04:00:00 +0000",
            "timeEpoch": 1_795_924_800_000_u64
        },
        "body": body.map(|b| b.to_string()),
        "isBase64Encoded": false
    })
    .to_string()
}

/// A REST API (v1) event with multi-value query parameters.
fn rest_api_event(method: &str, path: &str, query: &[(&str, &str)], token: &str) -> String {
    let single: serde_json::Map<String, Value> = query
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let multi: serde_json::Map<String, Value> = query
        .iter()
        .map(|(k, v)| (k.to_string(), json!([v])))
        .collect();
    json!({
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": {"Host": "abc123.execute-api.eu-west-1.amazonaws.com", "Authorization": format!("Bearer {token}")},
        "multiValueHeaders": {"Host": ["abc123.execute-api.eu-west-1.amazonaws.com"], "Authorization": [format!("Bearer {token}")]},
        "queryStringParameters": single,
        "multiValueQueryStringParameters": multi,
        "pathParameters": {"proxy": path.trim_start_matches('/')},
        "stageVariables": null,
        "requestContext": {
            "accountId": "123456789012",
            "resourceId": "r1",
            "stage": "prod",
            "requestId": "req-2",
            "identity": {"sourceIp": "192.0.2.1"},
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "apiId": "abc123",
            "path": format!("/prod{path}")
        },
        "body": null,
        "isBase64Encoded": false
    })
    .to_string()
}

async fn send(router: &axum::Router, event: &str) -> (u16, Value) {
    let request = lambda_http::request::from_str(event).expect("a valid API Gateway event");
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn the_router_serves_api_gateway_events() {
    let router = router();
    let (status, body) = send(&router, &http_api_event("GET", "/health", "", None, None)).await;
    assert_eq!((status, &body["status"]), (200, &json!("ok")));
    let (status, document) = send(
        &router,
        &http_api_event("GET", "/openapi.json", "", None, None),
    )
    .await;
    assert_eq!(status, 200);
    assert!(document["paths"]["/v1/accounts/{account}/deliveries/{delivery}/replay"].is_object());

    let (status, _) = send(
        &router,
        &http_api_event("GET", "/v1/accounts/acme", "", None, None),
    )
    .await;
    assert_eq!(status, 401);
    let create = json!({"id": "acme", "name": "Acme", "owner_email": "ops@acme.example"});
    let (status, body) = send(
        &router,
        &http_api_event("POST", "/v1/accounts", "", Some(ADMIN), Some(create)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, token) = send(
        &router,
        &http_api_event(
            "POST",
            "/v1/accounts/acme/tokens",
            "",
            Some(ADMIN),
            Some(json!({"ttl_seconds": 600})),
        ),
    )
    .await;
    assert_eq!(status, 201, "{token}");
    let token = token["token"].as_str().unwrap();
    let (status, body) = send(
        &router,
        &http_api_event("GET", "/v1/accounts/acme", "", Some(token), None),
    )
    .await;
    assert_eq!((status, &body["id"]), (200, &json!("acme")));
    let (status, _) = send(
        &router,
        &http_api_event("GET", "/v1/accounts/other", "", Some(token), None),
    )
    .await;
    assert_eq!(status, 404);

    // Query strings arrive through both event versions.
    let (status, body) = send(
        &router,
        &http_api_event(
            "GET",
            "/v1/accounts/acme/deliveries",
            "status=lost",
            Some(token),
            None,
        ),
    )
    .await;
    assert_eq!((status, &body["error"]["field"]), (400, &json!("status")));
    // A REST API puts its stage in front of the path (`/prod/v1/...`): the function must run
    // with AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH set (or behind an HTTP API's $default stage).
    let rest = rest_api_event(
        "GET",
        "/v1/accounts/acme/deliveries",
        &[("status", "failed"), ("limit", "5")],
        token,
    );
    let (status, body) = send(&router, &rest).await;
    assert_eq!(
        (status, &body["error"]["message"]),
        (404, &json!("route not found"))
    );
    std::env::set_var("AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH", "true");
    let (status, body) = send(&router, &rest).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"], json!([]));
    let (status, body) = send(
        &router,
        &rest_api_event("GET", "/v1/accounts/acme/replays", &[("limit", "0")], token),
    )
    .await;
    assert_eq!((status, &body["error"]["field"]), (400, &json!("limit")));
}

/// Behind a custom domain whose API mapping has a key (`hooks.example.com/base`), the API
/// answers under that path when `PublicUrl` names it, and at its own paths still: whether
/// the path it is handed carries the mapping's key or not (a proxy in front may add it).
#[tokio::test]
async fn the_api_answers_under_the_path_of_its_public_url() {
    let mut app = hooklane_testkit::app::api_only_app();
    let mut config = (*app.config).clone();
    config.public_url = Some(url::Url::parse("https://hooks.example.com/base/").unwrap());
    app.config = std::sync::Arc::new(config);
    let router = api::router(ApiState::new(
        app,
        TokenKey::generate(),
        AdminToken::fixed(ADMIN),
        Duration::ZERO,
        std::sync::Arc::new(hooklane::limits::Unlimited),
    ));
    for (path, token, want) in [
        ("/base/health", None, 200),
        ("/base/v1/whoami", Some(ADMIN), 200),
        ("/base/v1/whoami", None, 401),
        ("/base/ui", None, 200),
        ("/health", None, 200),
        ("/v1/whoami", Some(ADMIN), 200),
        ("/base/nowhere", None, 404),
    ] {
        let request = lambda_http::request::from_str(&http_api_event("GET", path, "", token, None))
            .expect("a valid API Gateway event");
        let response = router.clone().oneshot(request).await.expect("infallible");
        assert_eq!(response.status().as_u16(), want, "{path}");
        if path.starts_with("/base/v1/") {
            assert_eq!(
                response
                    .headers()
                    .get("cache-control")
                    .and_then(|v| v.to_str().ok()),
                Some("no-store"),
                "{path}"
            );
        }
    }
}
