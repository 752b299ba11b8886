//! Who is calling and what they may do: the bearer credential is checked, then the route's
//! account and scope. Each route declares its scope once, in its `#[utoipa::path]`
//! (`security(("bearer" = ["<scope>"]))`); the router reads the declarations back from the
//! OpenAPI document, so the document and the enforcement cannot disagree.

use std::{collections::HashMap, sync::Arc};

use axum::{
    extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State},
    http::{header::AUTHORIZATION, Method, StatusCode},
    middleware::Next,
    response::Response,
};

use super::{error::ApiError, ApiState};
pub use crate::domain::Principal;
use crate::{
    domain::{AccountId, Denied, Scope},
    service::access::AuthError,
};

/// The security scheme every `/v1` route declares its scope under.
pub const SCHEME: &str = "bearer";

/// What a route needs, as its OpenAPI operation declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Any valid credential (`security(("bearer" = []))`).
    AnyCredential,
    Scope(Scope),
}

/// Every operation's [`Need`], by method and path template.
#[derive(Debug, Default)]
pub struct RouteScopes(HashMap<(Method, String), Need>);

impl RouteScopes {
    /// Read from the document's operations. An operation that declares no `bearer`
    /// requirement of its own, or a scope that is not one, needs `admin`: it fails closed.
    pub fn from_document(document: &utoipa::openapi::OpenApi) -> Self {
        let value = serde_json::to_value(document).unwrap_or_default();
        let mut needs = HashMap::new();
        for (path, item) in value["paths"].as_object().into_iter().flatten() {
            for (method, operation) in item.as_object().into_iter().flatten() {
                let Ok(method) = Method::from_bytes(method.to_uppercase().as_bytes()) else {
                    continue;
                };
                needs.insert((method, path.clone()), Self::need_of(operation));
            }
        }
        Self(needs)
    }

    fn need_of(operation: &serde_json::Value) -> Need {
        let declared = operation["security"]
            .as_array()
            .and_then(|reqs| reqs.iter().find_map(|r| r.get(SCHEME)))
            .and_then(|scopes| scopes.as_array());
        match declared.map(Vec::as_slice) {
            Some([]) => Need::AnyCredential,
            Some([scope]) => Need::Scope(
                scope
                    .as_str()
                    .and_then(Scope::parse)
                    .unwrap_or(Scope::Admin),
            ),
            _ => Need::Scope(Scope::Admin),
        }
    }

    pub fn need(&self, method: &Method, path: &str) -> Need {
        self.0
            .get(&(method.clone(), path.to_owned()))
            .copied()
            .unwrap_or(Need::Scope(Scope::Admin))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&(Method, String), &Need)> {
        self.0.iter()
    }
}

impl From<AuthError> for ApiError {
    fn from(error: AuthError) -> Self {
        match error {
            AuthError::Store(store) => crate::service::ServiceError::Store(store).into(),
            other => ApiError::unauthorized(other.to_string()),
        }
    }
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> Self {
        match denied {
            Denied::NotVisible => ApiError::not_found("account"),
            other => ApiError::new(StatusCode::FORBIDDEN, "forbidden", other.to_string()),
        }
    }
}

/// The bearer credential of a request, or the 401 that its absence gets.
pub fn bearer(headers: &axum::http::HeaderMap) -> Result<&str, ApiError> {
    let header = headers
        .get(AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("missing `Authorization: Bearer <token>` header"))?;
    header
        .to_str()
        .ok()
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .ok_or_else(|| ApiError::unauthorized("Authorization header must be `Bearer <token>`"))
}

/// Checks the credential, then the route's account and scope, before any body is read, and
/// records the principal for the handlers.
pub async fn authenticate(
    State((state, scopes)): State<(ApiState, Arc<RouteScopes>)>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let principal = state
        .access
        .authenticate(bearer(request.headers())?)
        .await?;
    let (mut parts, body) = request.into_parts();
    // Fails closed: a route whose template is unknown needs `admin`.
    let need = parts
        .extensions
        .get::<MatchedPath>()
        .map_or(Need::Scope(Scope::Admin), |path| {
            scopes.need(&parts.method, path.as_str())
        });
    let account = match RawPathParams::from_request_parts(&mut parts, &state).await {
        Ok(params) => match params.iter().find(|(name, _)| *name == "account") {
            // An id no account can have is not found, whoever asks.
            Some((_, raw)) => {
                Some(AccountId::parse(raw).map_err(|_| ApiError::not_found("account"))?)
            }
            None => None,
        },
        Err(_) => return Err(ApiError::not_found("account")),
    };
    let scope = match need {
        Need::AnyCredential => None,
        Need::Scope(scope) => Some(scope),
    };
    principal.authorize(scope, account.as_ref())?;
    let mut request = Request::from_parts(parts, body);
    request.extensions_mut().insert(principal);
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `/v1` operation declares its own `bearer` requirement with one known scope;
    /// only `whoami` and reading the event-type catalog take any credential.
    #[test]
    fn every_route_declares_one_known_scope() {
        let document = serde_json::to_value(super::super::document()).unwrap();
        let mut operations = 0;
        for (path, item) in document["paths"].as_object().unwrap() {
            if !path.starts_with("/v1/") {
                continue;
            }
            for (method, operation) in item.as_object().unwrap() {
                operations += 1;
                let declared = operation["security"][0][SCHEME]
                    .as_array()
                    .unwrap_or_else(|| panic!("{method} {path} declares no scope"));
                let names: Vec<&str> = declared.iter().filter_map(|s| s.as_str()).collect();
                match names.as_slice() {
                    [] => assert!(
                        path == "/v1/whoami"
                            || (method == "get" && path.starts_with("/v1/event-types")),
                        "{method} {path} declares no scope"
                    ),
                    [scope] => assert!(Scope::parse(scope).is_some(), "{method} {path}: {scope}"),
                    more => panic!("{method} {path} declares several scopes: {more:?}"),
                }
            }
        }
        assert!(operations >= 23, "{operations}");
    }

    #[test]
    fn an_undeclared_or_unknown_scope_needs_admin() {
        let need = |operation: serde_json::Value| RouteScopes::need_of(&operation);
        assert_eq!(need(serde_json::json!({})), Need::Scope(Scope::Admin));
        assert_eq!(
            need(serde_json::json!({"security": [{"bearer": ["root"]}]})),
            Need::Scope(Scope::Admin)
        );
        assert_eq!(
            need(serde_json::json!({"security": [{"bearer": ["events:publish"]}]})),
            Need::Scope(Scope::EventsPublish)
        );
        assert_eq!(
            need(serde_json::json!({"security": [{"bearer": []}]})),
            Need::AnyCredential
        );
        let scopes = RouteScopes::default();
        assert_eq!(
            scopes.need(&Method::GET, "/v1/nowhere"),
            Need::Scope(Scope::Admin)
        );
    }
}
