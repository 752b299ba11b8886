//! Accounts: create one (admin), read one.

use super::*;
use crate::service::accounts;

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
    JsonBody(body): JsonBody<CreateAccount>,
) -> ApiResult<Response> {
    let account = accounts::create(
        &state.app,
        accounts::NewAccount {
            id: body.id,
            name: body.name,
            owner_email: body.owner_email,
        },
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
