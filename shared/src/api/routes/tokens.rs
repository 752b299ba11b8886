//! Account tokens: issue one, revoke one or all of an account's; who a credential is; the
//! admin token's rotation.

use super::*;
use crate::service::tokens;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// Lifetime of the token (default 86400, at most 90 days); it ends no later than the key
    /// that mints it.
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
    description = "The token holds the account-token scopes (docs/ACCESS.md) on this account; the credential that mints it must hold each of them too (`admin` does), or the answer is 403.",
    params(AccountPath),
    request_body = CreateToken,
    responses((status = 201, description = "A token that reaches only this account", body = TokenView), ReadErrors, BodyErrors),
)]
pub async fn create_token(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    caller: Caller,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<CreateToken>,
) -> ApiResult<Response> {
    // A credential hands on no more than it holds: a key that may mint tokens but not, say,
    // replay, cannot mint a token that replays.
    let carried = crate::domain::Scope::of_account_token(false);
    let missing: Vec<&str> = carried
        .filter(|scope| !principal.has_scope(*scope))
        .map(|scope| scope.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "an account token carries scopes this credential does not hold ({}): a credential mints no more than it holds",
                missing.join(", ")
            ),
        ));
    }
    let ttl = body
        .ttl_seconds
        .map_or(tokens::DEFAULT_TTL, Duration::from_secs);
    let minted = tokens::mint(
        &state.app,
        state.access.token_key(),
        &account,
        (ttl, principal.expires_at()),
        &caller,
    )
    .await?;
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

/// A token id in a path: `tok_` and 32 hex digits.
pub struct TokenId(String);

impl PathId for TokenId {
    // Named as the field of `POST …/tokens` that gives it, not `token` (the credential).
    const NAME: &'static str = "token_id";
    const WHAT: &'static str = "token";
    fn from_path(raw: &str) -> Option<Self> {
        tokens::is_token_id(raw).then(|| Self(raw.to_owned()))
    }
}

#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/tokens/{token_id}",
    security(("bearer" = ["tokens:write"])),
    tag = "access",
    summary = "Revokes one account token (or portal link) by its id: it is refused from then on.",
    params(TokenPath),
    responses((status = 204, description = "Revoked (revoking again changes nothing)"), ReadErrors),
)]
pub async fn revoke_token(
    State(state): State<ApiState>,
    ScopedId(account, TokenId(token)): ScopedId<TokenId>,
    caller: Caller,
) -> ApiResult<Response> {
    tokens::revoke(&state.app, &state.access, &account, &token, &caller).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/tokens",
    security(("bearer" = ["tokens:write"])),
    tag = "access",
    summary = "Revokes every account token of the account issued until now; new ones work.",
    params(AccountPath),
    responses((status = 200, description = "Tokens issued up to `tokens_revoked_before` are refused", body = TokensRevokedView), ReadErrors),
)]
pub async fn revoke_tokens(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    caller: Caller,
) -> ApiResult<Response> {
    let before = tokens::revoke_all(&state.app, &state.access, &account, &caller).await?;
    Ok(Json(TokensRevokedView {
        account_id: account.as_str(),
        tokens_revoked_before: before,
    })
    .into_response())
}

#[utoipa::path(
    post,
    path = "/v1/admin-token",
    security(("bearer" = ["admin"])),
    tag = "access",
    summary = "Replaces the admin token with a new one, shown once; the old one is refused at once.",
    responses((status = 201, description = "The new admin token (409: it is set by the configuration instead)", body = AdminTokenView), ReadErrors),
)]
pub async fn rotate_admin_token(
    State(state): State<ApiState>,
    caller: Caller,
) -> ApiResult<Response> {
    let token = state
        .access
        .rotate_admin_token(&caller)
        .await
        .map_err(|e| match e {
            crate::service::access::RotateError::Configured => {
                ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
            crate::service::access::RotateError::Store(store) => {
                crate::service::ServiceError::Store(store).into()
            }
        })?;
    Ok((StatusCode::CREATED, Json(AdminTokenView { token: &token })).into_response())
}
