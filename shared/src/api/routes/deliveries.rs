//! The delivery log: an account's or an endpoint's deliveries a page at a time, one delivery, its attempts.

use super::*;
use crate::service::endpoints;

pub(super) fn parse_time(field: &str, raw: &str) -> ApiResult<crate::clock::Timestamp> {
    chrono::DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|_| {
            ApiError::bad_request(
                field,
                format!("{field}: `{raw}` is not an RFC 3339 time like 2026-01-31T12:00:00Z"),
            )
        })
}

pub(super) fn parse_limit(raw: &str) -> ApiResult<u32> {
    raw.parse::<u32>()
        .ok()
        .filter(|l| (1..=500).contains(l))
        .ok_or_else(|| ApiError::bad_request("limit", "limit must be between 1 and 500"))
}

pub(super) fn unknown_parameter(name: &str) -> ApiError {
    ApiError::bad_request(name.to_owned(), format!("unknown query parameter `{name}`"))
}

/// Reads the delivery-log filters, naming any parameter that does not fit.
pub(super) fn delivery_query(
    params: Vec<(String, String)>,
    endpoint_allowed: bool,
) -> ApiResult<DeliveryQuery> {
    let mut query = DeliveryQuery {
        limit: 50,
        ..DeliveryQuery::default()
    };
    for (name, value) in params {
        match name.as_str() {
            "endpoint" if endpoint_allowed => {
                query.endpoint_id = Some(
                    endpoint_id(&value)
                        .map_err(|_| ApiError::bad_request("endpoint", "not an endpoint id"))?,
                )
            }
            "status" => {
                query.status = Some(DeliveryStatus::parse(&value).ok_or_else(|| {
                    ApiError::bad_request(
                        "status",
                        "status must be one of pending, delivered, failed, abandoned",
                    )
                })?)
            }
            "event_type" => {
                query.event_type = Some(
                    EventType::parse(&value)
                        .map_err(|e| ApiError::bad_request("event_type", e.message))?
                        .as_str()
                        .to_owned(),
                )
            }
            "since" => query.since = Some(parse_time("since", &value)?),
            "until" => query.until = Some(parse_time("until", &value)?),
            "status_code" => {
                query.status_code = Some(
                    value
                        .parse::<u16>()
                        .ok()
                        .filter(|c| (100..=599).contains(c))
                        .ok_or_else(|| {
                            ApiError::bad_request(
                                "status_code",
                                "status_code must be an HTTP status between 100 and 599",
                            )
                        })?,
                )
            }
            "cursor" => {
                if cursor::decode(&value).is_none() {
                    return Err(ApiError::bad_request(
                        "cursor",
                        "cursor is not one this API returned",
                    ));
                }
                query.cursor = Some(value);
            }
            "limit" => query.limit = parse_limit(&value)?,
            other => return Err(unknown_parameter(other)),
        }
    }
    Ok(query)
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/deliveries",
    security(("bearer" = ["deliveries:read"])),
    tag = "deliveries",
    summary = "The account's delivery log.",
    params(AccountPath, EndpointFilter, DeliveryFilters),
    responses((status = 200, description = "A page of deliveries, newest first", body = DeliveryList), ReadErrors),
)]
pub async fn list_deliveries(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let query = delivery_query(params, true)?;
    if state
        .app
        .store
        .get_account(&account)
        .await
        .map_err(crate::service::ServiceError::from)?
        .is_none()
    {
        return Err(ApiError::not_found("account"));
    }
    deliveries_page(&state, &account, &query).await
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/deliveries",
    security(("bearer" = ["deliveries:read"])),
    tag = "deliveries",
    summary = "One endpoint's delivery log.",
    params(EndpointPath, DeliveryFilters),
    responses((status = 200, description = "A page of deliveries, newest first", body = DeliveryList), ReadErrors),
)]
pub async fn list_endpoint_deliveries(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let endpoint = endpoints::get(&state.app, &account, &endpoint).await?;
    let mut query = delivery_query(params, false)?;
    query.endpoint_id = Some(endpoint.id);
    deliveries_page(&state, &account, &query).await
}

pub(super) async fn deliveries_page(
    state: &ApiState,
    account: &AccountId,
    query: &DeliveryQuery,
) -> ApiResult<Response> {
    let page = state
        .app
        .store
        .list_deliveries(account, query)
        .await
        .map_err(crate::service::ServiceError::from)?;
    Ok(Json(ListView {
        data: page.items.iter().map(DeliveryView::from).collect(),
        next_cursor: page.next_cursor,
    })
    .into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/deliveries/{delivery}",
    security(("bearer" = ["deliveries:read"])),
    tag = "deliveries",
    summary = "Reads a delivery.",
    params(DeliveryPath),
    responses((status = 200, description = "The delivery", body = DeliveryView), ReadErrors),
)]
pub async fn get_delivery(
    State(state): State<ApiState>,
    ScopedId(account, delivery): ScopedId<DeliveryId>,
) -> ApiResult<Response> {
    let delivery = existing_delivery(&state, &account, &delivery).await?;
    Ok(Json(DeliveryView::from(&delivery)).into_response())
}

/// The account's delivery of that id, or 404.
async fn existing_delivery(
    state: &ApiState,
    account: &AccountId,
    id: &DeliveryId,
) -> ApiResult<Delivery> {
    state
        .app
        .store
        .get_delivery(account, id)
        .await
        .map_err(crate::service::ServiceError::from)?
        .ok_or_else(|| ApiError::not_found("delivery"))
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/deliveries/{delivery}/attempts",
    security(("bearer" = ["deliveries:read"])),
    tag = "deliveries",
    summary = "Attempt detail: status, latency, response headers and body, error, trigger.",
    description = "Oldest first, `limit` attempts a page (100 by default), and no more once a page holds 1 MiB of them (so at most 1 MiB and one attempt, under 2 MB): an attempt keeps up to 64 KiB of response body and 16 KiB of response headers, so a page of them could otherwise outgrow what Lambda can answer (6 MB).",
    params(DeliveryPath, PageParams),
    responses((status = 200, description = "A page of the delivery's attempts, oldest first", body = AttemptList), ReadErrors),
)]
pub async fn list_attempts(
    State(state): State<ApiState>,
    ScopedId(account, delivery): ScopedId<DeliveryId>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let (cursor, limit) = super::audit::page_params(params, 100)?;
    // The number of the last attempt the previous page held, of this delivery.
    let after = match cursor.as_deref().and_then(cursor::decode) {
        None => 0,
        Some((number, of)) if of == delivery.as_str() => u32::try_from(number)
            .map_err(|_| ApiError::bad_request("cursor", "cursor is not one this API returned"))?,
        Some(_) => {
            return Err(ApiError::bad_request(
                "cursor",
                "cursor is of another delivery's attempts",
            ))
        }
    };
    existing_delivery(&state, &account, &delivery).await?;
    let attempts = state
        .app
        .store
        .list_attempts(&delivery)
        .await
        .map_err(crate::service::ServiceError::from)?;
    let mut data = Vec::new();
    let mut bytes = 0;
    let mut next_cursor = None;
    for attempt in attempts.iter().filter(|a| a.number > after) {
        if data.len() >= limit as usize || bytes >= ATTEMPT_PAGE_BYTES {
            next_cursor = data.last().map(|last: &AttemptView| {
                cursor::encode(i64::from(last.number), delivery.as_str())
            });
            break;
        }
        let view = AttemptView::from(attempt);
        bytes += serde_json::to_vec(&view).map_or(0, |json| json.len());
        data.push(view);
    }
    Ok(Json(ListView { data, next_cursor }).into_response())
}

/// A page of attempts stops once it holds this many bytes of them: with one more attempt
/// (at most about 500 KB as JSON: 64 KiB of body and 16 KiB of headers, all control bytes
/// escaped six-fold), a page stays well inside the 6 MB a Lambda function may answer.
const ATTEMPT_PAGE_BYTES: usize = 1 << 20;
