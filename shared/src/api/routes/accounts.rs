//! Accounts: create one (admin), read one, change one (admin).

use super::*;
use crate::{domain::rate::PublishRate, service::accounts};

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAccount {
    /// Chosen by the caller, or generated.
    #[schema(pattern = r"^[A-Za-z0-9_.:-]{1,128}$", example = "acme")]
    id: Option<String>,
    #[schema(min_length = 1, max_length = 200, example = "Acme Corp")]
    name: String,
    /// Told when an endpoint is disabled.
    #[schema(format = "email", example = "ops@acme.example")]
    owner_email: String,
    /// This account's own publish rate limit; without one, the configured default applies.
    #[serde(default, deserialize_with = "crate::api::json::object::option")]
    publish_rate_limit: Option<PublishRateLimit>,
}

/// A publish rate limit: `per_second` events a second on average, bursts of up to `burst`.
#[derive(Deserialize, ToSchema, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct PublishRateLimit {
    #[serde(deserialize_with = "whole::required")]
    #[schema(minimum = 1, maximum = 1000000, example = 50)]
    per_second: u32,
    /// `per_second` when absent.
    #[serde(default, deserialize_with = "whole::option")]
    #[schema(minimum = 1, maximum = 1000000, example = 200)]
    burst: Option<u32>,
}

impl PublishRateLimit {
    fn checked(self) -> Result<PublishRate, crate::domain::InvalidField> {
        PublishRate::new(self.per_second, self.burst, "publish_rate_limit")
    }
}

#[utoipa::path(
    post,
    path = "/v1/accounts",
    security(("bearer" = ["accounts:write"])),
    tag = "accounts",
    summary = "Creates an account.",
    request_body = CreateAccount,
    responses((status = 201, description = "The account was created", body = AccountView), ReadErrors, BodyErrors),
)]
pub async fn create_account(
    State(state): State<ApiState>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateAccount>,
) -> ApiResult<Response> {
    let account = accounts::create(
        &state.app,
        accounts::NewAccount {
            id: body.id,
            name: body.name,
            owner_email: body.owner_email,
            publish_rate_limit: body
                .publish_rate_limit
                .map(PublishRateLimit::checked)
                .transpose()?,
        },
        &caller,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(AccountView::from(&account))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}",
    security(("bearer" = ["accounts:read"])),
    tag = "accounts",
    summary = "Reads an account.",
    params(AccountPath),
    responses((status = 200, description = "The account", body = AccountView), ReadErrors),
)]
pub async fn get_account(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
) -> ApiResult<Response> {
    let account = accounts::get(&state.app, &account).await?;
    Ok(Json(AccountView::from(&account)).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateAccount {
    #[schema(min_length = 1, max_length = 200)]
    name: Option<String>,
    #[schema(format = "email")]
    owner_email: Option<String>,
    /// `null` removes the account's own limit: the configured default applies again.
    #[serde(default, deserialize_with = "crate::api::json::object::double_option")]
    publish_rate_limit: Option<Option<PublishRateLimit>>,
}

#[utoipa::path(
    patch,
    path = "/v1/accounts/{account}",
    // Not an account token's: the publish rate limit is the platform's to set.
    security(("bearer" = ["accounts:write"])),
    tag = "accounts",
    summary = "Changes an account; absent fields stay, `null` clears an optional one.",
    params(AccountPath),
    request_body = UpdateAccount,
    responses((status = 200, description = "The account as changed", body = AccountView), ReadErrors, BodyErrors),
)]
pub async fn update_account(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    caller: Caller,
    JsonBody(body): JsonBody<UpdateAccount>,
) -> ApiResult<Response> {
    let publish_rate_limit = match body.publish_rate_limit {
        Some(Some(limit)) => Some(Some(limit.checked()?)),
        Some(None) => Some(None),
        None => None,
    };
    let account = accounts::update(
        &state.app,
        &account,
        accounts::AccountChange {
            name: body.name,
            owner_email: body.owner_email,
            publish_rate_limit,
        },
        &caller,
    )
    .await?;
    Ok(Json(AccountView::from(&account)).into_response())
}
