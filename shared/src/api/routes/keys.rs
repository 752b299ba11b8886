//! Scoped API keys: make one (its secret shown once), list them, revoke one or all of an
//! account's.

use axum::extract::Path;

use super::deliveries::parse_time;
use super::*;
use crate::{
    api::{
        openapi::{KeyList, KeyPath, ScopeName},
        views::{KeyView, NewKeyView},
    },
    clock::to_millis,
    domain::{ApiKey, ApiKeyId},
    service::keys,
};

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// What the key is for, for people reading the list.
    #[schema(min_length = 1, max_length = 200, example = "billing backend")]
    name: String,
    /// What it may do; `admin` is everything.
    #[schema(value_type = Vec<ScopeName>, min_items = 1, example = json!(["events:publish"]))]
    scopes: Vec<String>,
    /// Only these accounts (1 to 100, each existing); left out, every account. An `admin`
    /// key cannot be limited.
    #[schema(min_items = 1, max_items = 100)]
    accounts: Option<Vec<String>>,
    /// When it stops working (RFC 3339, in the future); left out, never.
    #[schema(format = DateTime)]
    expires_at: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/keys",
    security(("bearer" = ["admin"])),
    tag = "access",
    summary = "Makes a scoped API key; its secret is in this answer only.",
    request_body = CreateKey,
    responses((status = 201, description = "The key, with its `secret`, shown this once", body = NewKeyView), ReadErrors, BodyErrors),
)]
pub async fn create_key(
    State(state): State<ApiState>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateKey>,
) -> ApiResult<Response> {
    let expires_at = body
        .expires_at
        .as_deref()
        .map(|raw| parse_time("expires_at", raw))
        .transpose()?;
    let minted = keys::create(
        &state.app,
        keys::NewKey {
            name: body.name,
            scopes: body.scopes,
            accounts: body.accounts,
            expires_at,
        },
        &caller,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(NewKeyView::from(&minted))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/keys",
    security(("bearer" = ["admin"])),
    tag = "access",
    summary = "Lists the API keys, revoked ones included, newest first (no secrets).",
    description = "`limit` keys a page (500, the most, by default), and no more once a page holds 1 MiB of them: a key may be limited to many accounts, and revoked keys stay listed, so the whole list could outgrow what Lambda can answer (6 MB). Follow `next_cursor` for the rest.",
    params(PageParams),
    responses((status = 200, description = "A page of the keys, newest first", body = KeyList), ReadErrors),
)]
pub async fn list_keys(
    State(state): State<ApiState>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let (cursor, limit) = super::audit::page_params(params, 500)?;
    let after = cursor.as_deref().and_then(cursor::decode);
    if after
        .as_ref()
        .is_some_and(|(_, id)| !id.starts_with("key_"))
    {
        return Err(ApiError::bad_request(
            "cursor",
            "cursor is of another list than the API keys",
        ));
    }
    let mut keys = keys::list(&state.app).await?;
    let newest_first =
        |k: &ApiKey| std::cmp::Reverse((to_millis(k.created_at), k.id.as_str().to_owned()));
    keys.sort_by_key(newest_first);
    let before = |k: &&ApiKey| {
        after
            .as_ref()
            .is_none_or(|(at, id)| (to_millis(k.created_at), k.id.as_str()) < (*at, id.as_str()))
    };
    let page = super::audit::byte_page(
        keys.iter().filter(before),
        limit,
        super::audit::LIST_PAGE_BYTES,
        KeyView::from,
        |k| cursor::encode(to_millis(k.created_at), k.id.as_str()),
    );
    Ok(Json(page).into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/keys/{key}",
    security(("bearer" = ["admin"])),
    tag = "access",
    summary = "Revokes an API key: it is refused from then on (revoking again changes nothing).",
    params(KeyPath),
    responses((status = 200, description = "The key, with `revoked_at`", body = KeyView), ReadErrors),
)]
pub async fn revoke_key(
    State(state): State<ApiState>,
    caller: Caller,
    Path(raw): Path<String>,
) -> ApiResult<Response> {
    let id = ApiKeyId::parse(&raw).ok_or_else(|| ApiError::not_found("key"))?;
    let key = keys::revoke(&state.app, &state.access, &id, &caller).await?;
    Ok(Json(KeyView::from(&key)).into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/keys",
    security(("bearer" = ["admin"])),
    tag = "access",
    summary = "Revokes every API key limited to the account (also for the other accounts a key is limited to); keys for every account stay.",
    params(AccountPath),
    responses((status = 200, description = "The keys this call revoked, with `revoked_at` (none the second time)", body = KeyList), ReadErrors),
)]
pub async fn revoke_account_keys(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    caller: Caller,
) -> ApiResult<Response> {
    let keys = keys::revoke_account_keys(&state.app, &state.access, &account, &caller).await?;
    Ok(Json(ListView {
        data: keys.iter().map(KeyView::from).collect(),
        next_cursor: None,
    })
    .into_response())
}
