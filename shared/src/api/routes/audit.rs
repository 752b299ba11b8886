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
    page_params_of(params, default, |raw| cursor::decode(raw).is_some())
}

/// [`page_params`] for a list whose cursors `ours` tells apart from other lists'.
pub(super) fn page_params_of(
    params: Vec<(String, String)>,
    default: u32,
    ours: impl Fn(&str) -> bool,
) -> ApiResult<(Option<String>, u32)> {
    let mut after = None;
    let mut limit = default;
    for (name, value) in params {
        match name.as_str() {
            "cursor" => {
                if !ours(&value) {
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

/// A page of a list read whole (endpoints, event types, API keys), in its order: at most
/// `limit` items, and no more once the page holds `budget` bytes of them as JSON (with one
/// more, the page stays far inside the 6 MB a Lambda function may answer); with the cursor of
/// its last item (`cursor_of`) when more follow.
pub(super) fn byte_page<'a, T: 'a, V: serde::Serialize>(
    items: impl IntoIterator<Item = &'a T>,
    limit: u32,
    budget: usize,
    view: impl Fn(&'a T) -> V,
    cursor_of: impl Fn(&'a T) -> String,
) -> ListView<V> {
    let mut data = Vec::new();
    let mut bytes = 0;
    let mut last: Option<&'a T> = None;
    for item in items {
        if data.len() >= limit as usize || bytes >= budget {
            return ListView {
                data,
                next_cursor: last.map(cursor_of),
            };
        }
        let shown = view(item);
        bytes += serde_json::to_vec(&shown).map_or(0, |json| json.len());
        data.push(shown);
        last = Some(item);
    }
    ListView {
        data,
        next_cursor: None,
    }
}

/// The bytes of a page of a list read whole: see [`byte_page`].
pub(super) const LIST_PAGE_BYTES: usize = 1 << 20;

/// A page of the log, each entry as `principal` may read it ([`AuditView::shown_to`]).
async fn page(
    state: &ApiState,
    principal: &Principal,
    account: Option<&AccountId>,
    params: Vec<(String, String)>,
) -> ApiResult<Response> {
    let (after, limit) = page_params(params, 50)?;
    let page = audit::list(&state.app, account, after.as_deref(), limit).await?;
    Ok(Json(ListView {
        data: page
            .items
            .iter()
            .map(|entry| AuditView::shown_to(entry, principal))
            .collect(),
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
    description = "Read by an account token (the account's own, or a portal link's), a change the platform made (by the admin token or an API key) shows the actor `{\"type\": \"platform\", \"id\": null}`, `address` null, a key target's id as `[redacted]` and no key name or key id in `details`: the operator's addresses and keys are not the customer's to see. Changes by the account's tokens and by Hooklane itself (`system`) are shown as recorded, as is every entry to the admin token and API keys.",
    params(AccountPath, PageParams),
    responses((status = 200, description = "Entries, newest first", body = AuditList), ReadErrors),
)]
pub async fn list_audit(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Scoped(account): Scoped,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    page(&state, &principal, Some(&account), params).await
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
    Extension(principal): Extension<Principal>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    page(&state, &principal, None, params).await
}
