//! Events: publish one or a batch (each idempotent on its id), read one.

use super::super::views::{BatchEventView, BatchResult, BatchView};
use super::*;
use crate::service::publish;

#[derive(Deserialize, ToSchema, Clone)]
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
    security(("bearer" = ["events:publish"])),
    tag = "events",
    summary = "Publishes an event, idempotent on its id.",
    params(AccountPath),
    request_body = PublishEvent,
    responses((status = 202, description = "The event was recorded. `deliveries` lists one pending delivery per endpoint subscribed to its type now. On the embedded shape they are created and queued with the event; on the AWS shape the event is written alone and the events table's stream fan-out creates and queues them moments later, with these ids", body = EventView), (status = 200, description = "An event with this id exists: it is returned and nothing is created", body = EventView), ReadErrors, BodyErrors, PublishErrors),
)]
pub async fn publish_event(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    JsonBody(body): JsonBody<PublishEvent>,
) -> ApiResult<Response> {
    state
        .catalog
        .check(&state.app, &body.event_type, &body.data)
        .await?;
    let published = publish::publish_limited(
        &state.app,
        state.publish_limits.as_ref(),
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

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishBatch {
    /// 1 to 100 events, each as `POST /v1/accounts/{account}/events` takes it.
    #[schema(min_items = 1, max_items = 100)]
    #[serde(deserialize_with = "crate::api::json::object::list")]
    events: Vec<PublishEvent>,
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/events/batch",
    security(("bearer" = ["events:publish"])),
    tag = "events",
    summary = "Publishes up to 100 events at once, each idempotent on its id.",
    description = "Every event is checked before anything is written: an invalid one fails the whole batch with an error whose `field` names it (`events[3].type`), and nothing is written. The batch is one transaction in both shapes: its body may be 3.7 MB, so that on AWS its events fit one DynamoDB transaction.",
    params(AccountPath),
    request_body = PublishBatch,
    responses((status = 202, description = "The events were recorded; `results` answers each in order, as a single publish would, unless the whole answer would be over 5 MB as the AWS function carries it: then it is `abridged`, each event without its deliveries, and without its `data` when this batch created it", body = BatchView), ReadErrors, BodyErrors, PublishErrors),
)]
pub async fn publish_batch(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    JsonBody(body): JsonBody<PublishBatch>,
) -> ApiResult<Response> {
    publish::check_batch_size(body.events.len())?;
    // Every item is checked before any is written: one bad item refuses the batch.
    for (index, event) in body.events.iter().enumerate() {
        if let Err(error) = state
            .catalog
            .check(&state.app, &event.event_type, &event.data)
            .await
        {
            let error = Box::new(error);
            return Err(crate::service::ServiceError::InBatch { index, error }.into());
        }
    }
    let inputs = body
        .events
        .into_iter()
        .map(|e| publish::NewEvent {
            id: e.id,
            event_type: e.event_type,
            data: e.data,
        })
        .collect();
    let published =
        publish::publish_batch_limited(&state.app, state.publish_limits.as_ref(), &account, inputs)
            .await?;
    let answer = |abridged: bool| BatchView {
        results: published
            .iter()
            .map(|p| BatchResult {
                created: p.created,
                event: BatchEventView::new(&p.event, &p.deliveries, p.created, abridged),
            })
            .collect(),
        abridged,
    };
    // The events are written: an answer too large for the AWS function (6 MB, the body
    // JSON-escaped within it) would turn that success into an error, every time it is sent
    // again. 100 events to 100 endpoints each are 10,000 deliveries, about 4 MB of them.
    if let Ok(full) = serde_json::to_string(&answer(false)) {
        // Escaping at most sextuples a byte (`\u001f`): a small answer is not escaped to
        // be measured, on every batch.
        let fits = full.len().saturating_mul(6) <= BATCH_ANSWER_BYTES
            || serde_json::to_string(&full).is_ok_and(|text| text.len() <= BATCH_ANSWER_BYTES);
        if fits {
            return Ok((
                StatusCode::ACCEPTED,
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                full,
            )
                .into_response());
        }
    }
    Ok((StatusCode::ACCEPTED, Json(answer(true))).into_response())
}

/// The largest batch answer given whole, as the AWS function's answer would carry it
/// (JSON-escaped): within Lambda's 6 MB with room for the rest of its response.
pub const BATCH_ANSWER_BYTES: usize = 5_000_000;

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/events/{event}",
    security(("bearer" = ["deliveries:read"])),
    tag = "events",
    summary = "Reads an event and its deliveries.",
    params(EventPath),
    responses((status = 200, description = "The event and its deliveries", body = EventView), (status = 422, description = "An event item written through the outbox that fan-out rejected (docs/OUTBOX.md); the message gives the reason", body = crate::api::error::Body), ReadErrors),
)]
pub async fn get_event(
    State(state): State<ApiState>,
    ScopedId(account, event): ScopedId<EventId>,
) -> ApiResult<Response> {
    let (event, deliveries) = publish::get(&state.app, &account, &event).await?;
    Ok(Json(EventView::new(&event, &deliveries)).into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/events/{event}",
    security(("bearer" = ["events:erase"])),
    tag = "events",
    summary = "Erases an event's content, for a deletion request.",
    description = "Removes the event's payload and the response bodies of the attempts to send it. \
        The event, its deliveries and their attempts stay in the log, the event marked with `erased_at` \
        and `data` null; deliveries still pending end `failed` and are never sent. Erasing again \
        changes nothing; publishing the id again returns the erased event. An event item written \
        through the outbox that fan-out could not read (docs/OUTBOX.md) loses its `data` the same way \
        and stays refused.",
    params(EventPath),
    responses((status = 200, description = "The event as it is now, with its deliveries", body = EventView), ReadErrors),
)]
pub async fn erase_event(
    State(state): State<ApiState>,
    ScopedId(account, event): ScopedId<EventId>,
    caller: Caller,
) -> ApiResult<Response> {
    let erasure = publish::erase(&state.app, &account, &event, &caller).await?;
    Ok(Json(EventView::new(&erasure.event, &erasure.deliveries)).into_response())
}
