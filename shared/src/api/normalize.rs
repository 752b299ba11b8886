//! Extractor rejections of axum itself (a path that does not percent-decode, say) answer in
//! plain text; this turns every non-JSON error response into the API's one error shape.

use axum::{
    body::{to_bytes, Body},
    http::{header::CONTENT_TYPE, StatusCode},
    response::{IntoResponse, Response},
};

use super::error::ApiError;

const MAX_ERROR_TEXT: usize = 16 * 1024;

pub async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let text = match to_bytes(response.into_body(), MAX_ERROR_TEXT).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let code = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        s if s.is_server_error() => "internal",
        _ => "invalid_request",
    };
    let mut normalized = ApiError::new(status, code, message).into_response();
    if normalized.headers().get(CONTENT_TYPE).is_none() {
        *normalized.body_mut() = Body::empty();
    }
    normalized
}
