use axum::{
    extract::{FromRequestParts, RawPathParams, Request, State},
    http::header::AUTHORIZATION,
    middleware::Next,
    response::Response,
};
use subtle::ConstantTimeEq;

use super::{error::ApiError, ApiState};
use crate::{clock::Timestamp, domain::AccountId, tokens::TOKEN_PREFIX};

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    /// The holder of an account token: one account, nothing else.
    Account {
        account_id: AccountId,
        token_id: String,
        expires_at: Timestamp,
    },
}

impl Principal {
    /// Whether the caller may see `account`. Others get 404, so ids do not leak.
    pub fn check(&self, account: &AccountId) -> Result<(), ApiError> {
        match self {
            Self::Admin => Ok(()),
            Self::Account { account_id, .. } if account_id == account => Ok(()),
            Self::Account { .. } => Err(ApiError::not_found("account")),
        }
    }

    /// How audit trails name the caller: `admin` or `token:<token id>`.
    pub fn actor(&self) -> String {
        match self {
            Self::Admin => "admin".to_owned(),
            Self::Account { token_id, .. } => format!("token:{token_id}"),
        }
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Self::Admin => Ok(()),
            Self::Account { .. } => Err(ApiError::new(
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
    request: Request,
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
    let principal = if token.starts_with(TOKEN_PREFIX) {
        let claims = state
            .token_key
            .verify(token, state.app.clock.now())
            .map_err(|e| ApiError::unauthorized(e.to_string()))?;
        Principal::Account {
            account_id: claims.account_id,
            token_id: claims.token_id,
            expires_at: claims.expires_at,
        }
    } else if bool::from(token.as_bytes().ct_eq(state.admin_token.as_bytes())) {
        Principal::Admin
    } else {
        return Err(ApiError::unauthorized("invalid token"));
    };
    // Every route under an account is scoped here, before any body is read, so another
    // account's routes answer 404 whatever is sent to them.
    let (mut parts, body) = request.into_parts();
    if let Principal::Account { account_id, .. } = &principal {
        // Fails closed: a path whose parameters cannot be read is not shown to a token.
        let visible = match RawPathParams::from_request_parts(&mut parts, &state).await {
            Ok(params) => params
                .iter()
                .find(|(name, _)| *name == "account")
                .is_none_or(|(_, account)| account_id.as_str() == account),
            Err(_) => false,
        };
        if !visible {
            return Err(ApiError::not_found("account"));
        }
    }
    let mut request = Request::from_parts(parts, body);
    request.extensions_mut().insert(principal);
    Ok(next.run(request).await)
}

/// A handler argument that admits only the admin token. Put it before the body so that an
/// account token is refused before its body is read.
pub struct AdminOnly;

impl<S: Send + Sync> FromRequestParts<S> for AdminOnly {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<Principal>() {
            Some(principal) => principal.require_admin().map(|()| Self),
            None => Err(ApiError::unauthorized("missing token")),
        }
    }
}
