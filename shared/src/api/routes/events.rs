//! Events: publish one or a batch (each idempotent on its id: the same event again is
//! answered with the stored one, another event under that id is a 409), read one and its
//! deliveries a page at a time, erase one.

use super::super::views::{
    event_page_after, event_page_cursor, BatchEventView, BatchResult, BatchView,
    EVENT_DELIVERIES_SHOWN,
};
use super::*;
use crate::{service::publish, store::PageAfter};
use serde::Serialize;

#[derive(Deserialize, ToSchema, Clone)]
#[serde(deny_unknown_fields)]
pub struct PublishEvent {
    /// Idempotency key: publishing the same event again (same `type`, JSON-equal `data`)
    /// returns the first one; another event under this id is refused (409).
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
    description = "The answer lists at most 1,000 deliveries, so that it stays well within what the AWS function may answer (6 MB): an event sent to more endpoints is answered with the first 1,000 by endpoint id, `deliveries_partial` true, `deliveries_total` their number, and `deliveries_next_cursor` for `GET …/events/{event}/deliveries`, which lists the others. An id published before is answered with the first deliveries stored, 1,000 at most by endpoint id, reading no more of them (so with no `deliveries_total`), and `deliveries_next_cursor` when it may have more; on the AWS shape the answer looks at no more than 8,000 of the account's endpoints, so an event sent to few of more endpoints than that may list fewer. With none found (on the AWS shape the fan-out may not have run yet), it lists the deliveries the fan-out creates for the endpoints subscribed now, as a first publish does.",
    responses((status = 202, description = "The event was recorded. `deliveries` lists one pending delivery per endpoint subscribed to its type now (1,000 at most: see `deliveries_partial`). The event is written alone: the fan-out (on the AWS shape, the events table's stream) creates and queues them moments later, with these ids", body = EventView), (status = 200, description = "This event was published before (same id and `type`, JSON-equal `data`; an erased one, same id and `type`): it is returned with its first deliveries and nothing is created", body = EventView), ReadErrors, EventIdTaken, BodyErrors, PublishErrors),
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
    Ok(within_aws_answer(
        status,
        EventView::published(&published),
        EventView::without_deliveries,
    ))
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
    description = "Every event is checked before anything is written: an invalid one fails the whole batch with an error whose `field` names it (`events[3].type`), and nothing is written. So does one whose id is already another event (409, `events[3].data` or `events[3].type`); an id that is the same event again is answered with it, as a single publish is (its first 1,000 deliveries by endpoint id at most, with `deliveries_next_cursor` when it may have more). The batch is one transaction in both shapes: its body may be 3.7 MB, so that on AWS its events fit one DynamoDB transaction (unless numbers written out longer than sent, such as `1e15`, make them pass 4 MB: then several, and the events stored under the batch's ids are compared with it before the first is written).",
    params(AccountPath),
    request_body = PublishBatch,
    responses((status = 202, description = "The events were recorded; `results` answers each in order, as a single publish would, unless the whole answer would be over 5 MB as the AWS function carries it: then it is `abridged`, each event without its deliveries, and without its `data` when this batch created it", body = BatchView), ReadErrors, EventIdTaken, BodyErrors, PublishErrors),
)]
pub async fn publish_batch(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    JsonBody(body): JsonBody<PublishBatch>,
) -> ApiResult<Response> {
    publish::check_batch_size(body.events.len())?;
    // Every item is checked before any is written: one bad item refuses the batch (and so
    // does one under the id of another event, found as the batch is written).
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
                event: BatchEventView::new(p, abridged),
            })
            .collect(),
        abridged,
    };
    // 100 events to 100 endpoints each are 10,000 deliveries, about 4 MB of them.
    Ok(within_aws_answer(
        StatusCode::ACCEPTED,
        answer(false),
        |_| answer(true),
    ))
}

/// The largest answer given whole, as the AWS function's answer would carry it
/// (JSON-escaped): within Lambda's 6 MB with room for the rest of its response.
pub const AWS_ANSWER_BYTES: usize = 5_000_000;

/// `full` as JSON, or `abridged(full)` if `full` is over [`AWS_ANSWER_BYTES`] as the AWS
/// function carries it. The change is written by then: an answer too large for the
/// function (6 MB, the body JSON-escaped within it) would turn that success into an error,
/// every time the request is sent again.
fn within_aws_answer<F: Serialize, A: Serialize>(
    status: StatusCode,
    full: F,
    abridged: impl FnOnce(F) -> A,
) -> Response {
    if let Ok(text) = serde_json::to_string(&full) {
        // Escaping at most sextuples a byte (`\u001f`): a small answer is not escaped to
        // be measured, on every call.
        let fits = text.len().saturating_mul(6) <= AWS_ANSWER_BYTES
            || serde_json::to_string(&text).is_ok_and(|escaped| escaped.len() <= AWS_ANSWER_BYTES);
        if fits {
            return (
                status,
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                text,
            )
                .into_response();
        }
    }
    (status, Json(abridged(full))).into_response()
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/events/{event}",
    security(("bearer" = ["deliveries:read"])),
    tag = "events",
    summary = "Reads an event and its deliveries.",
    description = "Lists at most 1,000 deliveries, the first by endpoint id, reading no more of them: an event sent to more endpoints is answered with `deliveries_partial` true (and no `deliveries_total`: they are not counted) and `deliveries_next_cursor`, where `GET …/events/{event}/deliveries` goes on. On the AWS shape the answer looks at no more than 2,000 of the account's endpoints (each endpoint it ever had is one read), so an event sent to few of more endpoints than that may list fewer, with `deliveries_partial` true.",
    params(EventPath),
    responses((status = 200, description = "The event and its deliveries, 1,000 at most", body = EventView), (status = 422, description = "An event item written through the outbox that fan-out rejected (docs/OUTBOX.md); the message gives the reason", body = crate::api::error::Body), ReadErrors),
)]
pub async fn get_event(
    State(state): State<ApiState>,
    ScopedId(account, event): ScopedId<EventId>,
) -> ApiResult<Response> {
    let limit = u32::try_from(EVENT_DELIVERIES_SHOWN).unwrap_or(u32::MAX);
    let (event, first) =
        publish::get(&state.app, &account, &event, &PageAfter::first(limit)).await?;
    Ok(within_aws_answer(
        StatusCode::OK,
        EventView::first(&event, &first),
        EventView::without_deliveries,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/events/{event}/deliveries",
    security(("bearer" = ["deliveries:read"])),
    tag = "events",
    summary = "An event's deliveries, a page at a time.",
    description = "One delivery per endpoint the event was sent to, in endpoint-id order, `limit` a page (100 by default, 500 at most), with `next_cursor` while there may be more. Start from the beginning, or from the `deliveries_next_cursor` of the event's answer (which lists the first 1,000). On the AWS shape a page looks at no more than 2,000 of the account's endpoints (each endpoint it ever had is one read), so an event sent to few of many endpoints may answer short pages, even empty ones, with a `next_cursor` to go on.",
    params(EventPath, PageParams),
    responses((status = 200, description = "A page of the event's deliveries, in endpoint-id order", body = EventDeliveryList), (status = 422, description = "An event item written through the outbox that fan-out rejected (docs/OUTBOX.md); the message gives the reason", body = crate::api::error::Body), ReadErrors),
)]
pub async fn list_event_deliveries(
    State(state): State<ApiState>,
    ScopedId(account, event): ScopedId<EventId>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    // Only this list's own cursors: one of the delivery log's would restart it.
    let (cursor, limit) =
        super::audit::page_params_of(params, 100, |raw| event_page_after(raw).is_some())?;
    let after = cursor.as_deref().and_then(event_page_after);
    let (_, page) = publish::get(&state.app, &account, &event, &PageAfter { after, limit }).await?;
    Ok(Json(ListView {
        data: page.deliveries.iter().map(DeliveryView::from).collect(),
        next_cursor: page.next.as_ref().map(event_page_cursor),
    })
    .into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/accounts/{account}/events/{event}",
    security(("bearer" = ["events:erase"])),
    tag = "events",
    summary = "Erases an event's content, for a deletion request.",
    description = "Removes the event's payload and the response bodies of the attempts to send it. \
        The event, its deliveries and their attempts stay in the log, the event marked with `erased_at` \
        and `data` null; deliveries still pending end `failed` and are never sent. Erasing again once one has answered 200 \
        changes nothing; publishing the id again returns the erased event (its data cannot be \
        compared any more; another `type` is refused, 409). An event item written \
        through the outbox that fan-out could not read (docs/OUTBOX.md) loses its `data` the same way \
        and stays refused. The answer lists the event's first deliveries after the erasure as \
        `GET …/events/{event}` does (1,000 at most, `deliveries_partial` and `deliveries_next_cursor` when it has more). \
        On the AWS shape an erasure goes through the event's deliveries for 20 s at most: one sent to more endpoints \
        than that covers (some thousands) is answered 202 with `erasure_incomplete` true, and each repeat of the \
        `DELETE` goes on where the last stopped, until one answers 200; if nobody repeats it, each sweep \
        (every 5 minutes) goes on with it until it is done.",
    params(EventPath),
    responses((status = 200, description = "The event as it is now, erased, with its first deliveries (1,000 at most)", body = EventView), (status = 202, description = "AWS shape: the payload is gone and nothing can send it, but the erasure stopped part-way through the event's deliveries (`erasure_incomplete`): some response bodies remain. Repeat the `DELETE` to go on (the sweeper finishes it otherwise)", body = EventView), ReadErrors),
)]
pub async fn erase_event(
    State(state): State<ApiState>,
    ScopedId(account, event): ScopedId<EventId>,
    caller: Caller,
) -> ApiResult<Response> {
    let erased = publish::erase(&state.app, &account, &event, &caller).await?;
    let status = if erased.erasure.complete {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok(within_aws_answer(
        status,
        EventView::erased(&erased),
        EventView::without_deliveries,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{delivery, endpoint, event, t0};

    async fn text(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// What counts is the answer as the AWS function carries it, JSON-escaped.
    #[tokio::test]
    async fn an_answer_too_large_for_the_aws_function_is_abridged() {
        // 2 MB of quotes are 4 MB of JSON, 8 MB escaped.
        let quotes = "\"".repeat(2_000_000);
        let response = within_aws_answer(StatusCode::OK, &quotes, |_| "abridged");
        assert_eq!(text(response).await, "\"abridged\"");
        let letters = "a".repeat(4_000_000);
        let response = within_aws_answer(StatusCode::OK, &letters, |_| "abridged");
        assert_eq!(text(response).await.len(), 4_000_002);
    }

    #[test]
    fn an_event_without_its_deliveries_says_how_many_it_has() {
        let ev = event("acme", "evt_1", t0());
        let deliveries: Vec<_> = (0..3)
            .map(|i| delivery(&ev, &endpoint("acme", &format!("ep_{i}"), t0()), t0()))
            .collect();
        let whole = serde_json::to_value(EventView::new(&ev, &deliveries)).unwrap();
        assert_eq!(whole["deliveries"].as_array().map(Vec::len), Some(3));
        assert!(
            whole.get("deliveries_partial").is_none() && whole.get("deliveries_total").is_none()
        );
        let none =
            serde_json::to_value(EventView::new(&ev, &deliveries).without_deliveries()).unwrap();
        assert_eq!(
            (
                &none["deliveries"],
                &none["deliveries_partial"],
                &none["deliveries_total"]
            ),
            (
                &serde_json::json!([]),
                &serde_json::json!(true),
                &serde_json::json!(3)
            )
        );
        // A read's first deliveries: more, not counted, and where to go on; without them,
        // from the start.
        let page = crate::store::EventDeliveries::first(deliveries.clone(), 2);
        let first = serde_json::to_value(EventView::first(&ev, &page)).unwrap();
        assert_eq!(first["deliveries_partial"], true);
        assert!(first.get("deliveries_total").is_none());
        assert_eq!(
            first["deliveries_next_cursor"]
                .as_str()
                .and_then(event_page_after),
            Some(deliveries[1].endpoint_id.clone())
        );
        let none = serde_json::to_value(EventView::first(&ev, &page).without_deliveries()).unwrap();
        assert_eq!(none["deliveries_partial"], true);
        assert!(none.get("deliveries_total").is_none());
        assert!(none.get("deliveries_next_cursor").is_none());
        // A first page that found none yet (DynamoDB stopped at its budget) still goes on.
        let looked = crate::store::EventDeliveries {
            deliveries: Vec::new(),
            next: Some(deliveries[0].endpoint_id.clone()),
        };
        let empty = serde_json::to_value(EventView::first(&ev, &looked)).unwrap();
        assert_eq!(empty["deliveries_partial"], true);
        assert_eq!(
            empty["deliveries_next_cursor"]
                .as_str()
                .and_then(event_page_after),
            looked.next
        );
        let empty = serde_json::to_value(EventView::new(&ev, &[]).without_deliveries()).unwrap();
        assert!(
            empty.get("deliveries_partial").is_none(),
            "nothing was left out"
        );
    }

    /// An erasure that stopped part-way says so, with or without its deliveries; a complete
    /// one has no such field.
    #[test]
    fn an_unfinished_erasure_is_flagged() {
        let ev = event("acme", "evt_1", t0()).erased(t0());
        let to = endpoint("acme", "ep_1", t0());
        let erased = |complete| publish::Erased {
            erasure: crate::store::Erasure {
                event: ev.clone(),
                ended: 1,
                complete,
            },
            first: crate::store::EventDeliveries {
                deliveries: vec![delivery(&ev, &to, t0())],
                next: None,
            },
        };
        let (unfinished, done) = (erased(false), erased(true));
        let answer = serde_json::to_value(EventView::erased(&unfinished)).unwrap();
        assert_eq!(
            (
                &answer["erasure_incomplete"],
                &answer["erased_at"].is_string()
            ),
            (&serde_json::json!(true), &true)
        );
        assert_eq!(answer["deliveries"].as_array().map(Vec::len), Some(1));
        let bare = serde_json::to_value(EventView::erased(&unfinished).without_deliveries());
        assert_eq!(bare.unwrap()["erasure_incomplete"], true);
        let answer = serde_json::to_value(EventView::erased(&done)).unwrap();
        assert!(answer.get("erasure_incomplete").is_none(), "{answer}");
    }
}
