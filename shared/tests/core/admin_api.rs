//! The API's router over an app, called with the admin token: requests through it without
//! a server, for the tests of what the API answers.

use std::{sync::Arc, time::Duration};

use axum::body::Body;
use hooklane::{
    api::{self, ApiState},
    service::access::AdminToken,
    tokens::TokenKey,
    App,
};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

const ADMIN: &str = "core-tests-admin-token-0123456789";

/// The router over `app`, without publish limits or a credential cache.
pub fn router(app: App) -> axum::Router {
    api::router(ApiState::new(
        app,
        TokenKey::generate(),
        AdminToken::fixed(ADMIN),
        Duration::ZERO,
        Arc::new(hooklane::limits::Unlimited),
    ))
}

/// The status, the body as text and as JSON (`null` when it is not JSON).
pub async fn send(
    router: &axum::Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, String, Value) {
    let request = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    (status, text, json)
}
