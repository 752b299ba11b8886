//! Replays: one delivery, an endpoint's deliveries since a time, and the list of replays.

use super::*;
use crate::service::replay;

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/deliveries/{delivery}/replay",
    security(("bearer" = ["deliveries:replay"])),
    tag = "replays",
    summary = "Sends a delivered, failed or abandoned delivery again; the retry schedule starts over.",
    params(DeliveryPath),
    responses((status = 202, description = "The delivery is pending again, due now, for a manual attempt", body = ReplayView), ReadErrors, BodyErrors),
)]
pub async fn replay_delivery(
    State(state): State<ApiState>,
    ScopedId(account, delivery): ScopedId<DeliveryId>,
    caller: Caller,
) -> ApiResult<Response> {
    let replay = replay::replay_delivery(&state.app, &account, &delivery, &caller).await?;
    Ok((StatusCode::ACCEPTED, Json(ReplayView::from(&replay))).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkReplay {
    /// Deliveries created at or after this time (RFC 3339).
    #[schema(format = DateTime, example = "2026-01-31T12:00:00Z")]
    since: String,
    /// Deliveries created before this time.
    #[schema(format = DateTime)]
    until: Option<String>,
    /// Which final statuses to resend (default failed and abandoned).
    #[schema(value_type = Option<Vec<ReplayableStatus>>, min_items = 1)]
    statuses: Option<Vec<String>>,
    /// Only these event types (exact names).
    #[schema(value_type = Option<Vec<EventTypeName>>)]
    event_types: Option<Vec<String>>,
    /// Also send the events of the endpoint's types published in the window while it was
    /// disabled, which it has no delivery of (they are counted in `missed`). Default false.
    include_missed: Option<bool>,
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/replay",
    security(("bearer" = ["deliveries:replay"])),
    tag = "replays",
    summary = "Resends the endpoint's deliveries created since a time (failed and abandoned by default), and on request the events it missed while disabled.",
    params(EndpointPath),
    request_body = BulkReplay,
    responses((status = 202, description = "Matching deliveries are pending again for a manual attempt", body = ReplayView), ReadErrors, BodyErrors),
)]
pub async fn replay_endpoint(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
    caller: Caller,
    JsonBody(body): JsonBody<BulkReplay>,
) -> ApiResult<Response> {
    let since = parse_time("since", &body.since)?;
    let until = body
        .until
        .as_deref()
        .map(|raw| parse_time("until", raw))
        .transpose()?;
    let statuses = body
        .statuses
        .map(|raw| {
            raw.iter()
                .map(|s| {
                    DeliveryStatus::parse(s).ok_or_else(|| {
                        ApiError::bad_request(
                            "statuses",
                            format!("`{s}` is not one of delivered, failed, abandoned"),
                        )
                    })
                })
                .collect::<ApiResult<Vec<_>>>()
        })
        .transpose()?;
    let event_types = body
        .event_types
        .unwrap_or_default()
        .iter()
        .map(|raw| {
            EventType::parse(raw).map_err(|e| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_field",
                    format!("event_types: {}", e.message),
                )
                .with_field("event_types")
            })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    let include_missed = body.include_missed.unwrap_or(false);
    let filter = ReplayFilter::bulk(since, until, statuses, event_types, include_missed)?;
    let replay = replay::replay_endpoint(&state.app, &account, &endpoint, filter, &caller).await?;
    Ok((StatusCode::ACCEPTED, Json(ReplayView::from(&replay))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/replays",
    security(("bearer" = ["deliveries:read"])),
    tag = "replays",
    summary = "The replay audit trail: who, when, filters, how many.",
    params(AccountPath, PageParams),
    responses((status = 200, description = "Replay requests, newest first", body = ReplayList), ReadErrors),
)]
pub async fn list_replays(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Scoped(account): Scoped,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let mut after = None;
    let mut limit = 50;
    for (name, value) in params {
        match name.as_str() {
            "cursor" => {
                after = Some(ReplayId::parse(&value).map_err(|_| {
                    ApiError::bad_request("cursor", "cursor is not one this API returned")
                })?)
            }
            "limit" => limit = parse_limit(&value)?,
            other => return Err(unknown_parameter(other)),
        }
    }
    let page = replay::list(&state.app, &account, after.as_ref(), limit).await?;
    Ok(Json(ListView {
        data: page
            .items
            .iter()
            .map(|r| ReplayView::shown_to(r, &principal))
            .collect(),
        next_cursor: page.next_cursor,
    })
    .into_response())
}
