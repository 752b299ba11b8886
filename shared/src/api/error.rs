use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde::Serialize;

use crate::{domain::InvalidField, service::ServiceError, store::StoreError};

/// Every error the API returns: `{"error": {"code", "message", "field"?}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    /// Whole seconds for a `Retry-After` header (429).
    pub retry_after: Option<u64>,
}

/// The one error shape of the API.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ErrorBody)]
pub struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ErrorDetail)]
pub struct Detail<'a> {
    /// Stable, machine-readable: `invalid_request`, `invalid_field`, `not_found`, …
    code: &'a str,
    message: &'a str,
    /// The request field or parameter at fault, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: None,
        }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn bad_request(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message).with_field(field)
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: Detail {
                code: self.code,
                message: &self.message,
                field: self.field.as_deref(),
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                "www-authenticate",
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl From<InvalidField> for ApiError {
    fn from(error: InvalidField) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            format!("{}: {}", error.field, error.message),
        )
        .with_field(error.field)
    }
}

impl From<ServiceError> for ApiError {
    fn from(error: ServiceError) -> Self {
        match error {
            ServiceError::Invalid(invalid) => invalid.into(),
            ServiceError::InBatch { index, error } => {
                let mut inner = Self::from(*error);
                let at = format!("events[{index}]");
                inner.field = Some(match inner.field.take() {
                    Some(field) => format!("{at}.{field}"),
                    None => at.clone(),
                });
                inner.message = format!("{at}: {}", inner.message);
                inner
            }
            ServiceError::NotFound(what) => Self::not_found(what),
            ServiceError::Conflict(message) => Self::new(StatusCode::CONFLICT, "conflict", message),
            ServiceError::EventConflict(conflict) => {
                Self::new(StatusCode::CONFLICT, "conflict", conflict.to_string())
                    .with_field(conflict.field())
            }
            ServiceError::TooLarge { field, message } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
                    .with_field(field)
            }
            ServiceError::RateLimited {
                what,
                per_second,
                burst,
                retry_after,
            } => {
                // Whole seconds, rounded up: a client that waits as told finds a token.
                let seconds = retry_after.as_millis().div_ceil(1000).max(1);
                let mut error = Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    format!(
                        "this account's {what} may go at {per_second} events/s (bursts of {burst}); retry in {seconds} s"
                    ),
                );
                error.retry_after = Some(u64::try_from(seconds).unwrap_or(u64::MAX));
                error
            }
            ServiceError::Store(StoreError::NotFound(what)) => Self::not_found(what),
            // The platform wrote it malformed; reading it again will not change that.
            ServiceError::Store(rejected @ StoreError::Rejected(_)) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "event_rejected",
                rejected.to_string(),
            ),
            // Not an outage: retrying will not help, and the message names the field (an
            // item written by hand, through the outbox, without it).
            ServiceError::Store(StoreError::Corrupt(message)) => {
                tracing::error!(error = %message, "stored item cannot be read");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "unreadable_item",
                    format!("the stored item cannot be read: {message}"),
                )
            }
            ServiceError::Store(StoreError::LimitReached(what)) => Self::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("the account has as many {what} as it may have"),
            ),
            ServiceError::Store(StoreError::Changed(what)) => Self::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("the {what} was changed by another request meanwhile; try again"),
            ),
            ServiceError::Store(other) => {
                tracing::error!(error = %other, "store failure behind an API call");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "storage is unavailable; try again",
                )
            }
            ServiceError::Queue(queue) => {
                tracing::error!(error = %queue, "queue failure behind an API call");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "queue is unavailable; try again",
                )
            }
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
