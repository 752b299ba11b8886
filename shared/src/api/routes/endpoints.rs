//! Endpoints: create, list (in pages), read, change, delete, enable, disable, rotate the
//! secret.

use super::*;
use crate::{clock::to_millis, domain::Endpoint, service::endpoints};

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
    /// Headers sent with every attempt (at most 20), by name. Not `host`, `content-*`,
    /// `webhook-*` or a hop-by-hop header; `authorization` is always secret.
    #[schema(value_type = Option<HashMap<String, HeaderInput>>)]
    headers: Option<serde_json::Value>,
}

/// A custom header's value: a string, or `{"value": "…", "secret": true}` for one the API
/// never shows again (1 to 1024 printable ASCII characters).
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // Documents the shape; `CustomHeaders::parse` reads the value.
pub enum HeaderInput {
    #[schema(example = "tenant-42")]
    Plain(String),
    Marked {
        #[schema(min_length = 1, max_length = 1024)]
        value: String,
        #[serde(default)]
        secret: bool,
    },
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints",
    security(("bearer" = ["endpoints:write"])),
    tag = "endpoints",
    summary = "Creates an endpoint.",
    params(AccountPath),
    request_body = CreateEndpoint,
    responses((status = 201, description = "The endpoint was created; `secret` signs its webhooks", body = EndpointView), ReadErrors, BodyErrors),
)]
pub async fn create_endpoint(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    caller: Caller,
    JsonBody(body): JsonBody<CreateEndpoint>,
) -> ApiResult<Response> {
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
            headers: body.headers,
        },
        &caller,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(EndpointView::from(&endpoint))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints",
    security(("bearer" = ["endpoints:read"])),
    tag = "endpoints",
    summary = "Lists the account's endpoints, oldest first.",
    description = "`limit` endpoints a page (100 by default), and no more once a page holds 1 MiB of them: an endpoint can hold 20 custom headers of 1 KiB each, so a page of them could otherwise outgrow what Lambda can answer (6 MB). Follow `next_cursor` for the rest.",
    params(AccountPath, PageParams),
    responses((status = 200, description = "A page of the account's endpoints, oldest first", body = EndpointList), ReadErrors),
)]
pub async fn list_endpoints(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    Extension(principal): Extension<Principal>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let (cursor, limit) = super::audit::page_params(params, 100)?;
    // The creation time and id of the last endpoint of the previous page; the other lists'
    // cursors have the same shape, and their ids another prefix.
    let after = cursor.as_deref().and_then(cursor::decode);
    if after.as_ref().is_some_and(|(_, id)| !id.starts_with("ep_")) {
        return Err(ApiError::bad_request(
            "cursor",
            "cursor is of another list than this account's endpoints",
        ));
    }
    let list = endpoints::list(&state.app, &account).await?;
    let past = |e: &&Endpoint| {
        after
            .as_ref()
            .is_none_or(|(at, id)| (to_millis(e.created_at), e.id.as_str()) > (*at, id.as_str()))
    };
    // One more endpoint is tens of KB as JSON at most (20 header values of 1 KiB, a 2 KiB
    // URL, 100 event-type patterns).
    let page = super::audit::byte_page(
        list.iter().filter(past),
        limit,
        super::audit::LIST_PAGE_BYTES,
        |e| EndpointView::for_principal(e, &principal),
        |e| cursor::encode(to_millis(e.created_at), e.id.as_str()),
    );
    Ok(Json(page).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints/{endpoint}",
    security(("bearer" = ["endpoints:read"])),
    tag = "endpoints",
    summary = "Reads an endpoint.",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint", body = EndpointView), ReadErrors),
)]
pub async fn get_endpoint(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<Response> {
    let endpoint = endpoints::get(&state.app, &account, &endpoint).await?;
    Ok(Json(EndpointView::for_principal(&endpoint, &principal)).into_response())
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
    /// A merge patch of the headers: a name with a value sets it, with `null` removes it;
    /// names left out stay as they are (a secret need not be sent again). `null` removes
    /// them all.
    #[serde(default, deserialize_with = "double_option")]
    /// Each value a string, `{"value": "…", "secret": true}`, or `null`.
    #[schema(value_type = Option<Object>)]
    headers: Option<Option<serde_json::Value>>,
}

#[utoipa::path(
    patch,
    path = "/v1/accounts/{account}/endpoints/{endpoint}",
    security(("bearer" = ["endpoints:write"])),
    tag = "endpoints",
    summary = "Changes an endpoint; absent fields stay, `null` clears an optional one.",
    description = "Changes made at the same moment (this, a rotation, enabling, the endpoint being disabled for failing) each apply to the endpoint as the others left it; none is written over. One that keeps being overtaken is answered 409: send it again.",
    params(EndpointPath),
    request_body = UpdateEndpoint,
    responses((status = 200, description = "The endpoint as changed", body = EndpointView), ReadErrors, BodyErrors),
)]
pub async fn update_endpoint(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
    caller: Caller,
    JsonBody(body): JsonBody<UpdateEndpoint>,
) -> ApiResult<Response> {
    let endpoint = endpoints::update(
        &state.app,
        &account,
        &endpoint,
        endpoints::EndpointChanges {
            url: body.url,
            description: body.description,
            event_types: body.event_types,
            max_in_flight: body.max_in_flight,
            rate_limit_per_second: body.rate_limit_per_second,
            headers: body.headers,
        },
        &caller,
    )
    .await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/endpoints/{endpoint}",
    security(("bearer" = ["endpoints:write"])),
    tag = "endpoints",
    summary = "Deletes an endpoint; its delivery history stays.",
    params(EndpointPath),
    responses((status = 204, description = "Deleted; its pending deliveries are abandoned"), ReadErrors),
)]
pub async fn delete_endpoint(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
    caller: Caller,
) -> ApiResult<Response> {
    endpoints::delete(&state.app, &account, &endpoint, &caller).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/enable",
    security(("bearer" = ["endpoints:write"])),
    tag = "endpoints",
    summary = "Enables an endpoint with a fresh health clock.",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint, active", body = EndpointView), ReadErrors),
)]
pub async fn enable_endpoint(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
    caller: Caller,
) -> ApiResult<Response> {
    let endpoint = endpoints::enable(&state.app, &account, &endpoint, &caller).await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/disable",
    security(("bearer" = ["endpoints:write"])),
    tag = "endpoints",
    summary = "Disables an endpoint; its pending deliveries are abandoned.",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint, disabled", body = EndpointView), ReadErrors),
)]
pub async fn disable_endpoint(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
    caller: Caller,
) -> ApiResult<Response> {
    let endpoint = endpoints::disable(&state.app, &account, &endpoint, &caller).await?;
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
    security(("bearer" = ["endpoints:write"])),
    tag = "endpoints",
    summary = "Rotates the signing secret with a grace period (default 24 h) during which both secrets sign.",
    description = "One secret retires at a time: while an earlier rotation's grace period runs, a rotation with a grace period is refused (409), as it would end the first one's at once; one with `grace_period_seconds` 0 is taken and stops both previous secrets.",
    params(EndpointPath),
    request_body = Option<RotateSecret>,
    responses((status = 200, description = "The endpoint with its new secret; the old one signs too until `retiring_secret_until`", body = EndpointView), ReadErrors, BodyErrors),
)]
pub async fn rotate_secret(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
    caller: Caller,
    crate::api::json::LimitedBytes(body): crate::api::json::LimitedBytes,
) -> ApiResult<Response> {
    // The body is optional: an empty POST (or `null`) rotates with the default grace period.
    let text = body.trim_ascii();
    let options: RotateSecret = if text.is_empty() || text == b"null" {
        RotateSecret::default()
    } else {
        crate::api::json::parse_object(&body)?
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
        &endpoint,
        Duration::from_secs(grace_secs),
        &caller,
    )
    .await?;
    Ok(Json(EndpointView::from(&endpoint)).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/test",
    security(("bearer" = ["endpoints:write"])),
    tag = "endpoints",
    summary = "Sends a signed `hooklane.test` event to this endpoint only.",
    description = "The event goes to this endpoint whatever its event-type filter, through the normal path: it is in the delivery log, attempted, retried and replayable like any other, and limited on its own (not by the account's publish rate limit): ten at once, then one a second per account (429 with `Retry-After` past that). A disabled endpoint answers 409.",
    params(EndpointPath),
    responses((status = 202, description = "The test event and its one pending delivery", body = EventView), ReadErrors, PublishErrors),
)]
pub async fn send_test_event(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
) -> ApiResult<Response> {
    let published = crate::service::test_events::send(
        &state.app,
        state.publish_limits.as_ref(),
        &account,
        &endpoint,
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(EventView::published(&published))).into_response())
}
