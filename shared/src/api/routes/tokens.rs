//! Account tokens: issue one (admin), and who a token is.

use super::*;
use crate::service::tokens;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// Lifetime of the token (default 86400, at most 90 days).
    #[serde(default, deserialize_with = "whole::option")]
    #[schema(minimum = 1, maximum = 7776000, example = 3600)]
    ttl_seconds: Option<u64>,
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/tokens",
    security(("bearer" = ["tokens:write"])),
    tag = "access",
    summary = "Mints an expiring account token.",
    params(AccountPath),
    request_body = CreateToken,
    responses((status = 201, description = "A token that reaches only this account", body = TokenView), ReadErrors, BodyErrors),
)]
pub async fn create_token(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    JsonBody(body): JsonBody<CreateToken>,
) -> ApiResult<Response> {
    let ttl = body
        .ttl_seconds
        .map_or(tokens::DEFAULT_TTL, Duration::from_secs);
    let minted = tokens::mint(&state.app, state.access.token_key(), &account, ttl).await?;
    Ok((StatusCode::CREATED, Json(TokenView::from(&minted))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/whoami",
    security(("bearer" = [])),
    tag = "access",
    summary = "Tells who the bearer token belongs to.",
    responses((status = 200, description = "Who the token belongs to", body = WhoamiView), ReadErrors),
)]
pub async fn whoami(Extension(principal): Extension<Principal>) -> ApiResult<Response> {
    Ok(Json(WhoamiView::from(&principal)).into_response())
}
