use std::time::Duration;

use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Extension, Json,
};
use serde::{Deserialize, Deserializer};
use utoipa::ToSchema;

use super::{
    auth::{AdminOnly, Principal},
    error::{ApiError, ApiResult},
    json::{whole, JsonBody},
    openapi::{
        AccountDeliveryFilters, AccountPath, AttemptList, DeliveryFilters, DeliveryList,
        DeliveryPath, EndpointList, EndpointPath, EventPath, EventTypeName, EventTypePattern,
        PageParams, ReadErrors, ReplayList, ReplayableStatus, WriteErrors,
    },
    views::{
        AccountView, AttemptView, DeliveryView, EndpointView, EventView, ListView, ReplayView,
        TokenView, WhoamiView,
    },
    ApiState,
};
use crate::{
    domain::{
        AccountId, DeliveryId, DeliveryStatus, EndpointId, EventId, EventType, ReplayFilter,
        ReplayId,
    },
    service::{accounts, endpoints, publish, replay, tokens},
    store::{cursor, DeliveryQuery},
};

fn account_id(raw: &str) -> ApiResult<AccountId> {
    AccountId::parse(raw).map_err(|_| ApiError::not_found("account"))
}

fn endpoint_id(raw: &str) -> ApiResult<EndpointId> {
    EndpointId::parse(raw).map_err(|_| ApiError::not_found("endpoint"))
}

/// Resolves the account in the path and checks the caller may see it.
fn scoped(principal: &Principal, raw: &str) -> ApiResult<AccountId> {
    let account = account_id(raw)?;
    principal.check(&account)?;
    Ok(account)
}

/// Distinguishes an absent field from an explicit `null` in PATCH bodies.
fn double_option<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

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
    tag = "accounts",
    summary = "Creates an account (admin only).",
    request_body = CreateAccount,
    responses((status = 201, description = "The account was created", body = AccountView), WriteErrors),
)]
pub async fn create_account(
    State(state): State<ApiState>,
    _admin: AdminOnly,
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
    tag = "accounts",
    summary = "Reads an account.",
    params(AccountPath),
    responses((status = 200, description = "The account", body = AccountView), ReadErrors),
)]
pub async fn get_account(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(account): Path<String>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let account = accounts::get(&state.app, &account).await?;
    Ok(Json(AccountView::from(&account)).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// http or https; private and loopback addresses are refused unless allowed.
    #[schema(
        format = "uri",
        max_length = 2048,
        example = "https://hooks.acme.example/hooklane"
    )]
    url: String,
    #[schema(max_length = 1000)]
    description: Option<String>,
    /// Event types or patterns (`invoice.*`); absent means every type.
    #[schema(value_type = Option<Vec<EventTypePattern>>, min_items = 1, max_items = 100)]
    event_types: Option<Vec<String>>,
    /// Requests in flight at once (default 4).
    #[serde(default, deserialize_with = "whole::option")]
    #[schema(minimum = 1, maximum = 1000)]
    max_in_flight: Option<u32>,
    #[serde(default, deserialize_with = "whole::option")]
    #[schema(minimum = 1, maximum = 100000)]
    rate_limit_per_second: Option<u32>,
    /// A `whsec_…` secret to use instead of a generated one.
    #[schema(pattern = "^whsec_")]
    secret: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints",
    tag = "endpoints",
    summary = "Creates an endpoint.",
    params(AccountPath),
    request_body = CreateEndpoint,
    responses((status = 201, description = "The endpoint was created; `secret` signs its webhooks", body = EndpointView), WriteErrors),
)]
pub async fn create_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(account): Path<String>,
    JsonBody(body): JsonBody<CreateEndpoint>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoints::create(
        &state.app,
        &account,
        endpoints::NewEndpoint {
            url: body.url,
            description: body.description,
            event_types: body.event_types,
            max_in_flight: body.max_in_flight,
            rate_limit_per_second: body.rate_limit_per_second,
            secret: body.secret,
        },
    )
    .await?;
    Ok((StatusCode::CREATED, Json(EndpointView::from(&endpoint))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints",
    tag = "endpoints",
    summary = "Lists the account's endpoints.",
    params(AccountPath),
    responses((status = 200, description = "The account's endpoints", body = EndpointList), ReadErrors),
)]
pub async fn list_endpoints(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(account): Path<String>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let list = endpoints::list(&state.app, &account).await?;
    Ok(Json(ListView {
        data: list.iter().map(EndpointView::from).collect(),
        next_cursor: None,
    })
    .into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints/{endpoint}",
    tag = "endpoints",
    summary = "Reads an endpoint.",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint", body = EndpointView), ReadErrors),
)]
pub async fn get_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoints::get(&state.app, &account, &endpoint_id(&endpoint)?).await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpoint {
    #[schema(format = "uri", max_length = 2048)]
    url: Option<String>,
    #[schema(max_length = 1000)]
    description: Option<String>,
    /// `null` receives every event type again.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<EventTypePattern>>, min_items = 1, max_items = 100)]
    event_types: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "whole::option")]
    #[schema(minimum = 1, maximum = 1000)]
    max_in_flight: Option<u32>,
    /// `null` removes the rate limit.
    #[serde(default, deserialize_with = "whole::double_option")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100000)]
    rate_limit_per_second: Option<Option<u32>>,
}

#[utoipa::path(
    patch,
    path = "/v1/accounts/{account}/endpoints/{endpoint}",
    tag = "endpoints",
    summary = "Changes an endpoint; absent fields stay, `null` clears an optional one.",
    params(EndpointPath),
    request_body = UpdateEndpoint,
    responses((status = 200, description = "The endpoint as changed", body = EndpointView), WriteErrors),
)]
pub async fn update_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
    JsonBody(body): JsonBody<UpdateEndpoint>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoints::update(
        &state.app,
        &account,
        &endpoint_id(&endpoint)?,
        endpoints::EndpointChanges {
            url: body.url,
            description: body.description,
            event_types: body.event_types,
            max_in_flight: body.max_in_flight,
            rate_limit_per_second: body.rate_limit_per_second,
        },
    )
    .await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/endpoints/{endpoint}",
    tag = "endpoints",
    summary = "Deletes an endpoint; its delivery history stays.",
    params(EndpointPath),
    responses((status = 204, description = "Deleted; its pending deliveries are abandoned"), ReadErrors),
)]
pub async fn delete_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    endpoints::delete(&state.app, &account, &endpoint_id(&endpoint)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/enable",
    tag = "endpoints",
    summary = "Enables an endpoint with a fresh health clock.",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint, active", body = EndpointView), ReadErrors),
)]
pub async fn enable_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoints::enable(&state.app, &account, &endpoint_id(&endpoint)?).await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/disable",
    tag = "endpoints",
    summary = "Disables an endpoint; its pending deliveries are abandoned.",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint, disabled", body = EndpointView), ReadErrors),
)]
pub async fn disable_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoints::disable(&state.app, &account, &endpoint_id(&endpoint)?).await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// How long the old secret keeps signing (default 86400, at most 30 days).
    #[serde(default, deserialize_with = "whole::option")]
    #[schema(minimum = 0, maximum = 2592000)]
    grace_period_seconds: Option<u64>,
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/secret/rotate",
    tag = "endpoints",
    summary = "Rotates the signing secret with a grace period (default 24 h) during which both secrets sign.",
    params(EndpointPath),
    request_body = Option<RotateSecret>,
    responses((status = 200, description = "The endpoint with its new secret; the old one signs too until `retiring_secret_until`", body = EndpointView), WriteErrors),
)]
pub async fn rotate_secret(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    // The body is optional: an empty POST (or `null`) rotates with the default grace period.
    let text = body.trim_ascii();
    let options: RotateSecret = if text.is_empty() || text == b"null" {
        RotateSecret::default()
    } else {
        super::json::parse_object(&body)?
    };
    let grace_secs = options.grace_period_seconds.unwrap_or(86_400);
    if grace_secs > 30 * 86_400 {
        return Err(ApiError::bad_request(
            "grace_period_seconds",
            "at most 30 days (2592000)",
        ));
    }
    let endpoint = endpoints::rotate_secret(
        &state.app,
        &account,
        &endpoint_id(&endpoint)?,
        Duration::from_secs(grace_secs),
    )
    .await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishEvent {
    /// Idempotency key: publishing the same id again returns the first event.
    #[schema(pattern = r"^[A-Za-z0-9_.:-]{1,128}$")]
    id: Option<String>,
    /// Dot-separated segments of letters, digits, `_` or `-`.
    #[serde(rename = "type")]
    #[schema(
        pattern = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$",
        max_length = 128,
        example = "invoice.paid"
    )]
    event_type: String,
    /// Any JSON; the whole webhook body is at most 256 KiB.
    data: serde_json::Value,
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/events",
    tag = "events",
    summary = "Publishes an event, idempotent on its id.",
    params(AccountPath),
    request_body = PublishEvent,
    responses((status = 202, description = "The event was recorded. `deliveries` lists one pending delivery per endpoint subscribed to its type now. On the embedded shape they are created and queued with the event; on the AWS shape the event is written alone and the events table's stream fan-out creates and queues them moments later, with these ids", body = EventView), (status = 200, description = "An event with this id exists: it is returned and nothing is created", body = EventView), WriteErrors),
)]
pub async fn publish_event(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(account): Path<String>,
    JsonBody(body): JsonBody<PublishEvent>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let published = publish::publish(
        &state.app,
        &account,
        publish::NewEvent {
            id: body.id,
            event_type: body.event_type,
            data: body.data,
        },
    )
    .await?;
    let status = if published.created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(EventView::new(&published.event, &published.deliveries)),
    )
        .into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/events/{event}",
    tag = "events",
    summary = "Reads an event and its deliveries.",
    params(EventPath),
    responses((status = 200, description = "The event and its deliveries", body = EventView), ReadErrors),
)]
pub async fn get_event(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, event)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let event = EventId::parse(&event).map_err(|_| ApiError::not_found("event"))?;
    let (event, deliveries) = publish::get(&state.app, &account, &event).await?;
    Ok(Json(EventView::new(&event, &deliveries)).into_response())
}

fn parse_time(field: &str, raw: &str) -> ApiResult<crate::clock::Timestamp> {
    chrono::DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|_| {
            ApiError::bad_request(
                field,
                format!("{field}: `{raw}` is not an RFC 3339 time like 2026-01-31T12:00:00Z"),
            )
        })
}

fn parse_limit(raw: &str) -> ApiResult<u32> {
    raw.parse::<u32>()
        .ok()
        .filter(|l| (1..=500).contains(l))
        .ok_or_else(|| ApiError::bad_request("limit", "limit must be between 1 and 500"))
}

fn unknown_parameter(name: &str) -> ApiError {
    ApiError::bad_request(name.to_owned(), format!("unknown query parameter `{name}`"))
}

/// Reads the delivery-log filters, naming any parameter that does not fit.
fn delivery_query(
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
    tag = "deliveries",
    summary = "The account's delivery log.",
    params(AccountPath, AccountDeliveryFilters),
    responses((status = 200, description = "A page of deliveries, newest first", body = DeliveryList), ReadErrors),
)]
pub async fn list_deliveries(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(account): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
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
    tag = "deliveries",
    summary = "One endpoint's delivery log.",
    params(EndpointPath, DeliveryFilters),
    responses((status = 200, description = "A page of deliveries, newest first", body = DeliveryList), ReadErrors),
)]
pub async fn list_endpoint_deliveries(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoints::get(&state.app, &account, &endpoint_id(&endpoint)?).await?;
    let mut query = delivery_query(params, false)?;
    query.endpoint_id = Some(endpoint.id);
    deliveries_page(&state, &account, &query).await
}

async fn deliveries_page(
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
    tag = "deliveries",
    summary = "Reads a delivery.",
    params(DeliveryPath),
    responses((status = 200, description = "The delivery", body = DeliveryView), ReadErrors),
)]
pub async fn get_delivery(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, delivery)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let delivery = DeliveryId::parse(&delivery).map_err(|_| ApiError::not_found("delivery"))?;
    let delivery = state
        .app
        .store
        .get_delivery(&account, &delivery)
        .await
        .map_err(crate::service::ServiceError::from)?
        .ok_or_else(|| ApiError::not_found("delivery"))?;
    Ok(Json(DeliveryView::from(&delivery)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/deliveries/{delivery}/attempts",
    tag = "deliveries",
    summary = "Attempt detail: status, latency, response headers and body, error, trigger.",
    params(DeliveryPath),
    responses((status = 200, description = "Every attempt of the delivery, oldest first", body = AttemptList), ReadErrors),
)]
pub async fn list_attempts(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, delivery)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let delivery = DeliveryId::parse(&delivery).map_err(|_| ApiError::not_found("delivery"))?;
    let store = &state.app.store;
    if store
        .get_delivery(&account, &delivery)
        .await
        .map_err(crate::service::ServiceError::from)?
        .is_none()
    {
        return Err(ApiError::not_found("delivery"));
    }
    let attempts = store
        .list_attempts(&delivery)
        .await
        .map_err(crate::service::ServiceError::from)?;
    Ok(Json(ListView {
        data: attempts.iter().map(AttemptView::from).collect(),
        next_cursor: None,
    })
    .into_response())
}

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
    tag = "access",
    summary = "Mints an expiring account token (admin only).",
    params(AccountPath),
    request_body = CreateToken,
    responses((status = 201, description = "A token that reaches only this account", body = TokenView), WriteErrors),
)]
pub async fn create_token(
    State(state): State<ApiState>,
    _admin: AdminOnly,
    Path(account): Path<String>,
    JsonBody(body): JsonBody<CreateToken>,
) -> ApiResult<Response> {
    let account = account_id(&account)?;
    let ttl = body
        .ttl_seconds
        .map_or(tokens::DEFAULT_TTL, Duration::from_secs);
    let minted = tokens::mint(&state.app, &state.token_key, &account, ttl).await?;
    Ok((StatusCode::CREATED, Json(TokenView::from(&minted))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/whoami",
    tag = "access",
    summary = "Tells who the bearer token belongs to.",
    responses((status = 200, description = "Who the token belongs to", body = WhoamiView), ReadErrors),
)]
pub async fn whoami(Extension(principal): Extension<Principal>) -> ApiResult<Response> {
    Ok(Json(WhoamiView::from(&principal)).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/deliveries/{delivery}/replay",
    tag = "replays",
    summary = "Sends a delivered, failed or abandoned delivery again; the retry schedule starts over.",
    params(DeliveryPath),
    responses((status = 202, description = "The delivery is pending again, due now, for a manual attempt", body = ReplayView), WriteErrors),
)]
pub async fn replay_delivery(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, delivery)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let delivery = DeliveryId::parse(&delivery).map_err(|_| ApiError::not_found("delivery"))?;
    let replay =
        replay::replay_delivery(&state.app, &account, &delivery, principal.actor()).await?;
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
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/replay",
    tag = "replays",
    summary = "Resends the endpoint's deliveries created since a time (failed and abandoned by default).",
    params(EndpointPath),
    request_body = BulkReplay,
    responses((status = 202, description = "Matching deliveries are pending again for a manual attempt", body = ReplayView), WriteErrors),
)]
pub async fn replay_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
    JsonBody(body): JsonBody<BulkReplay>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoint_id(&endpoint)?;
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
    let filter = ReplayFilter::bulk(since, until, statuses, event_types)?;
    let replay =
        replay::replay_endpoint(&state.app, &account, &endpoint, filter, principal.actor()).await?;
    Ok((StatusCode::ACCEPTED, Json(ReplayView::from(&replay))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/replays",
    tag = "replays",
    summary = "The replay audit trail: who, when, filters, how many.",
    params(AccountPath, PageParams),
    responses((status = 200, description = "Replay requests, newest first", body = ReplayList), ReadErrors),
)]
pub async fn list_replays(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(account): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
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
        data: page.items.iter().map(ReplayView::from).collect(),
        next_cursor: page.next_cursor,
    })
    .into_response())
}
