use std::time::Duration;

use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Extension, Json,
};
use serde::{Deserialize, Deserializer};

use super::{
    auth::Principal,
    error::{ApiError, ApiResult},
    json::JsonBody,
    views::{AccountView, AttemptView, DeliveryView, EndpointView, EventView, ListView},
    ApiState,
};
use crate::{
    domain::{AccountId, DeliveryId, DeliveryStatus, EndpointId, EventId, EventType},
    service::{accounts, endpoints, publish},
    store::{sqlite::decode_cursor, DeliveryQuery},
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAccount {
    id: Option<String>,
    name: String,
    owner_email: String,
}

pub async fn create_account(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<CreateAccount>,
) -> ApiResult<Response> {
    principal.require_admin()?;
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

pub async fn get_account(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(account): Path<String>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let account = accounts::get(&state.app, &account).await?;
    Ok(Json(AccountView::from(&account)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    url: String,
    description: Option<String>,
    event_types: Option<Vec<String>>,
    max_in_flight: Option<u32>,
    rate_limit_per_second: Option<u32>,
    secret: Option<String>,
}

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

pub async fn get_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoints::get(&state.app, &account, &endpoint_id(&endpoint)?).await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpoint {
    url: Option<String>,
    description: Option<String>,
    #[serde(default, deserialize_with = "double_option")]
    event_types: Option<Option<Vec<String>>>,
    max_in_flight: Option<u32>,
    #[serde(default, deserialize_with = "double_option")]
    rate_limit_per_second: Option<Option<u32>>,
}

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

pub async fn delete_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    endpoints::delete(&state.app, &account, &endpoint_id(&endpoint)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn enable_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoints::enable(&state.app, &account, &endpoint_id(&endpoint)?).await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

pub async fn disable_endpoint(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    let endpoint = endpoints::disable(&state.app, &account, &endpoint_id(&endpoint)?).await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    grace_period_seconds: Option<u64>,
}

pub async fn rotate_secret(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((account, endpoint)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let account = scoped(&principal, &account)?;
    // The body is optional: an empty POST rotates with the default grace period.
    let options: RotateSecret = if body.iter().all(u8::is_ascii_whitespace) {
        RotateSecret::default()
    } else {
        super::json::parse(&body)?
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishEvent {
    id: Option<String>,
    #[serde(rename = "type")]
    event_type: String,
    data: serde_json::Value,
}

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
                if decode_cursor(&value).is_none() {
                    return Err(ApiError::bad_request(
                        "cursor",
                        "cursor is not one this API returned",
                    ));
                }
                query.cursor = Some(value);
            }
            "limit" => {
                query.limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|l| (1..=500).contains(l))
                    .ok_or_else(|| {
                        ApiError::bad_request("limit", "limit must be between 1 and 500")
                    })?
            }
            other => {
                return Err(ApiError::bad_request(
                    other.to_owned(),
                    format!("unknown query parameter `{other}`"),
                ))
            }
        }
    }
    Ok(query)
}

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
