use axum::{
    extract::{Request, State},
    http::header::AUTHORIZATION,
    middleware::Next,
    response::Response,
};
use subtle::ConstantTimeEq;

use super::{error::ApiError, ApiState};
use crate::domain::AccountId;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Account(AccountId),
}

impl Principal {
    /// Whether the caller may see `account`. Others get 404, so ids do not leak.
    pub fn check(&self, account: &AccountId) -> Result<(), ApiError> {
        match self {
            Self::Admin => Ok(()),
            Self::Account(own) if own == account => Ok(()),
            Self::Account(_) => Err(ApiError::not_found("account")),
        }
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Self::Admin => Ok(()),
            Self::Account(_) => Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "forbidden",
                "needs the admin token",
            )),
        }
    }
}

/// Checks the bearer token and records the principal for the handlers.
pub async fn authenticate(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let header = request
        .headers()
        .get(AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("missing `Authorization: Bearer <token>` header"))?;
    let token = header
        .to_str()
        .ok()
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .ok_or_else(|| ApiError::unauthorized("Authorization header must be `Bearer <token>`"))?;
    let principal = if bool::from(token.as_bytes().ct_eq(state.admin_token.as_bytes())) {
        Principal::Admin
    } else {
        return Err(ApiError::unauthorized("invalid token"));
    };
    request.extensions_mut().insert(principal);
    Ok(next.run(request).await)
}
