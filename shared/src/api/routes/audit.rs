//! The audit log: an account's changes, and the operator's (changes over no one account),
//! newest first, a page at a time.

use super::deliveries::{parse_limit, unknown_parameter};
use super::*;
use crate::{
    api::{openapi::AuditList, views::AuditView},
    service::audit,
};

/// `cursor` and `limit`, as the delivery log reads them.
/// A page's `cursor` (checked to be one of ours) and `limit` (`default` when not given).
pub(super) fn page_params(
    params: Vec<(String, String)>,
    default: u32,
) -> ApiResult<(Option<String>, u32)> {
    let mut after = None;
    let mut limit = default;
    for (name, value) in params {
        match name.as_str() {
            "cursor" => {
                if cursor::decode(&value).is_none() {
                    return Err(ApiError::bad_request(
                        "cursor",
                        "cursor is not one this API returned",
                    ));
                }
                after = Some(value);
            }
            "limit" => limit = parse_limit(&value)?,
            other => return Err(unknown_parameter(other)),
        }
    }
    Ok((after, limit))
}

async fn page(
    state: &ApiState,
    account: Option<&AccountId>,
    params: Vec<(String, String)>,
) -> ApiResult<Response> {
    let (after, limit) = page_params(params, 50)?;
    let page = audit::list(&state.app, account, after.as_deref(), limit).await?;
    Ok(Json(ListView {
        data: page.items.iter().map(AuditView::from).collect(),
        next_cursor: page.next_cursor,
    })
    .into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/audit",
    security(("bearer" = ["accounts:read"])),
    tag = "audit",
    summary = "The account's audit log: every change to it, its endpoints, secrets, keys and tokens, every replay and erasure; who, when, from where.",
    params(AccountPath, PageParams),
    responses((status = 200, description = "Entries, newest first", body = AuditList), ReadErrors),
)]
pub async fn list_audit(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    page(&state, Some(&account), params).await
}

#[utoipa::path(
    get,
    path = "/v1/audit",
    security(("bearer" = ["admin"])),
    tag = "audit",
    summary = "The operator's audit log: changes over no one account (keys that reach every account, the admin token).",
    params(PageParams),
    responses((status = 200, description = "Entries, newest first", body = AuditList), ReadErrors),
)]
pub async fn list_operator_audit(
    State(state): State<ApiState>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    page(&state, None, params).await
}
