//! The event-type catalog: the operator adds, changes and removes types; any credential
//! reads them (the page lists them for customers choosing what to subscribe to).

use axum::extract::Path;

use super::*;
use crate::{
    api::{
        openapi::{EventTypeList, EventTypeNamePath},
        views::EventTypeView,
    },
    service::catalog,
};

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEventType {
    #[schema(value_type = EventTypeName)]
    name: String,
    #[schema(max_length = 1000, example = "An invoice was paid in full.")]
    description: Option<String>,
    /// A JSON Schema (2020-12, the subset docs/EVENT_TYPES.md lists) that `data` must match
    /// when an event of this type is published through the API.
    #[schema(value_type = Option<Object>, example = json!({"type": "object", "required": ["invoice_id"]}))]
    schema: Option<serde_json::Value>,
    /// A payload customers can copy (any JSON); it must match the schema.
    #[schema(example = json!({"invoice_id": "in_1"}))]
    example: Option<serde_json::Value>,
    /// Still accepted, shown as deprecated (default false).
    deprecated: Option<bool>,
}

#[utoipa::path(
    post,
    path = "/v1/event-types",
    security(("bearer" = ["admin"])),
    tag = "event types",
    summary = "Adds a type to the event-type catalog.",
    request_body = CreateEventType,
    responses((status = 201, description = "The type", body = EventTypeView), (status = 409, description = "A type of that name exists", body = crate::api::error::Body), ReadErrors, BodyErrors),
)]
pub async fn create_event_type(
    State(state): State<ApiState>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateEventType>,
) -> ApiResult<Response> {
    let def = catalog::create(
        &state.app,
        catalog::NewEventType {
            name: body.name,
            description: body.description,
            schema: body.schema,
            example: body.example,
            deprecated: body.deprecated,
        },
        &caller,
    )
    .await?;
    state.catalog.forget(def.name.as_str());
    Ok((StatusCode::CREATED, Json(EventTypeView::from(&def))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/event-types",
    security(("bearer" = [])),
    tag = "event types",
    summary = "The event-type catalog, by name; any credential may read it.",
    description = "`limit` types a page (500, the most, by default), and no more once a page holds 1 MiB of them: a type's schema and example may each be 64 KiB, so the whole catalog could outgrow what Lambda can answer (6 MB). Follow `next_cursor` for the rest.",
    params(PageParams),
    responses((status = 200, description = "A page of the catalog, by name", body = EventTypeList), ReadErrors),
)]
pub async fn list_event_types(
    State(state): State<ApiState>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let (cursor, limit) = super::audit::page_params(params, 500)?;
    // The last type's name, with no time: the other lists' cursors carry one.
    let after = match cursor.as_deref().and_then(cursor::decode) {
        Some((0, name)) => Some(name),
        Some(_) => {
            return Err(ApiError::bad_request(
                "cursor",
                "cursor is of another list than the event-type catalog",
            ))
        }
        None => None,
    };
    let mut list = catalog::list(&state.app).await?;
    list.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
    let page = super::audit::byte_page(
        list.iter()
            .filter(|t| after.as_deref().is_none_or(|after| t.name.as_str() > after)),
        limit,
        super::audit::LIST_PAGE_BYTES,
        EventTypeView::from,
        |t| cursor::encode(0, t.name.as_str()),
    );
    Ok(Json(page).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/event-types/{name}",
    security(("bearer" = [])),
    tag = "event types",
    summary = "Reads one type of the catalog.",
    params(EventTypeNamePath),
    responses((status = 200, description = "The type", body = EventTypeView), ReadErrors),
)]
pub async fn get_event_type(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    let def = catalog::get(&state.app, &name).await?;
    Ok(Json(EventTypeView::from(&def)).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEventType {
    #[schema(max_length = 1000)]
    description: Option<String>,
    /// `null` removes the schema: events of the type are no longer checked.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Object>)]
    schema: Option<Option<serde_json::Value>>,
    /// `null` removes the example.
    #[serde(default, deserialize_with = "double_option")]
    example: Option<Option<serde_json::Value>>,
    deprecated: Option<bool>,
}

#[utoipa::path(
    patch,
    path = "/v1/event-types/{name}",
    security(("bearer" = ["admin"])),
    tag = "event types",
    summary = "Changes a type; absent fields stay, `null` removes the schema or example.",
    params(EventTypeNamePath),
    request_body = UpdateEventType,
    responses((status = 200, description = "The type as changed", body = EventTypeView), ReadErrors, BodyErrors),
)]
pub async fn update_event_type(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    caller: Caller,
    JsonBody(body): JsonBody<UpdateEventType>,
) -> ApiResult<Response> {
    let def = catalog::update(
        &state.app,
        &name,
        catalog::EventTypeChanges {
            description: body.description,
            schema: body.schema,
            example: body.example,
            deprecated: body.deprecated,
        },
        &caller,
    )
    .await?;
    state.catalog.forget(&name);
    Ok(Json(EventTypeView::from(&def)).into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/event-types/{name}",
    security(("bearer" = ["admin"])),
    tag = "event types",
    summary = "Removes a type from the catalog; events already published keep it.",
    params(EventTypeNamePath),
    responses((status = 204, description = "Removed"), ReadErrors),
)]
pub async fn delete_event_type(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    caller: Caller,
) -> ApiResult<Response> {
    catalog::delete(&state.app, &name, &caller).await?;
    state.catalog.forget(&name);
    Ok(StatusCode::NO_CONTENT.into_response())
}
