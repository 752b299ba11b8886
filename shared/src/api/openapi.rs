//! The OpenAPI 3 document's frame (info, security, shared schemas) and the meta routes. The
//! paths come from the route list in `api::v1_routes`. The types here exist only to describe
//! parameters and lists.

#![allow(dead_code)] // fields of these types are read by the derive macros only

use utoipa::{
    openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
    IntoParams, IntoResponses, Modify, OpenApi, ToSchema,
};

use super::{
    error::Body as ErrorBody,
    views::{
        AttemptView, AuditView, DeliveryView, EndpointView, EventTypeView, KeyView, ReplayView,
    },
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hooklane API",
        description = "Webhook delivery: accounts, endpoints, events, the delivery log, replays, account tokens and API keys. \
                       Send `Authorization: Bearer <credential>`: the admin token, a scoped API key or an account token. \
                       Each operation names the one scope it needs in its `security` (none: any credential will do)."
    ),
    components(schemas(
        ErrorBody,
        DeliveryStatusName,
        EndpointStatusName,
        TriggerName,
        ReplayScopeName,
        ReplayableStatus,
        PrincipalKind,
        ScopeName,
        EventTypeName,
        EventTypePattern,
    )),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token, an API key from POST /v1/keys holding the scope an operation names, \
                         or an account token from POST /v1/accounts/{account}/tokens",
                    ))
                    .build(),
            ),
        );
    }
}

#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or `degraded` while the store refuses writes.
    #[schema(example = "ok")]
    status: String,
    /// What is wrong with the store, when `degraded`.
    #[schema(example = "writes failing for 12 s: storage failure: database is locked")]
    store: Option<String>,
}

use serde::Serialize;

/// How long the store's writes may fail (from the first failure to the latest), with no
/// success between, before `/health` says so: a lock held past the busy timeout once is not
/// yet an outage.
pub const STORE_FAULT_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long after the last failed write a fault is still reported: longer than an
/// unrecorded attempt waits to be tried again (30 s at least), shorter than nothing.
pub const STORE_FAULT_STALE: std::time::Duration = std::time::Duration::from_secs(60);

/// Liveness, and whether the store takes writes; needs no token.
#[utoipa::path(get, path = "/health", tag = "meta", security(()),
    responses(
        (status = 200, description = "The server is up", body = Health),
        (status = 503, description = "Writes to the store have failed over more than 10 s with none going through between (a full disk, an I/O error, another process holding the database's write lock): publishes are answered 503 and attempts are sent but not recorded; `store` says since when and why", body = Health),
    ))]
pub async fn health(
    axum::extract::State(state): axum::extract::State<super::ApiState>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    // Only where something notes the store's writes (publishes, and the embedded
    // dispatcher's records and fan-out); the AWS shape's API notes its publishes.
    // A fault no write has met for a while is not reported: nothing may have tried since
    // (the dispatcher idle, the delivery gone), and only a write clears it.
    let now = state.app.clock.now();
    // Failures spread over more than the grace: one refused write (a publish that met a lock
    // held for its 5 s busy wait) is no outage, and records written again through one are.
    let failing = crate::telemetry::store_fault(&state.app.store).and_then(|fault| {
        let spread = (fault.last - fault.since).to_std().ok()?;
        let failing = (now - fault.since).to_std().ok()?;
        let quiet = (now - fault.last).to_std().unwrap_or_default();
        (spread > STORE_FAULT_GRACE && quiet < STORE_FAULT_STALE).then_some((failing, fault.error))
    });
    match failing {
        None => axum::Json(serde_json::json!({"status": "ok"})).into_response(),
        Some((failing, error)) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({
                "status": "degraded",
                "store": format!("writes failing for {} s: {error}", failing.as_secs()),
            })),
        )
            .into_response(),
    }
}

/// This document; needs no token.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", security(()),
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
pub async fn openapi_json(
    axum::Extension(document): axum::Extension<std::sync::Arc<utoipa::openapi::OpenApi>>,
) -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(document.as_ref().clone())
}

/// Errors of every route: bad input, no access, nothing there.
#[derive(IntoResponses)]
pub enum ReadErrors {
    #[response(
        status = 400,
        description = "A parameter, the JSON body or one of its fields does not fit; `field` names it"
    )]
    BadRequest(ErrorBody<'static>),
    #[response(status = 401, description = "Missing, invalid or expired token")]
    Unauthorized(ErrorBody<'static>),
    #[response(
        status = 403,
        description = "The credential lacks the scope the route needs"
    )]
    Forbidden(ErrorBody<'static>),
    #[response(status = 404, description = "Not found, or not visible to this token")]
    NotFound(ErrorBody<'static>),
    #[response(
        status = 409,
        description = "The request conflicts with the current state"
    )]
    Conflict(ErrorBody<'static>),
    #[response(status = 503, description = "Storage is unavailable; try again")]
    Unavailable(ErrorBody<'static>),
}

/// What routes that take a JSON body answer besides [`ReadErrors`].
#[derive(IntoResponses)]
pub enum BodyErrors {
    #[response(
        status = 413,
        description = "The request body is over its limit (the message names it; a `Content-Length` over it is refused before the body is read), or an event's webhook body is over `HOOKLANE_MAX_PAYLOAD` (256 KiB by default). A publish's (or a test event's) request body may be six times `HOOKLANE_MAX_PAYLOAD` and 16 KiB more, room for text escaped as `\\uXXXX` (as Python's `json.dumps` does by default); other routes' bodies, `HOOKLANE_MAX_PAYLOAD` and 16 KiB more; a batch's, 3.7 MB as sent (or one event's limit, if larger)"
    )]
    TooLarge(ErrorBody<'static>),
    #[response(status = 415, description = "The body is not `application/json`")]
    UnsupportedMediaType(ErrorBody<'static>),
    #[response(
        status = 422,
        description = "A field is well-formed but not acceptable; `field` names it"
    )]
    Unprocessable(ErrorBody<'static>),
}

/// What the publish routes answer besides [`ReadErrors`] and [`BodyErrors`].
#[derive(IntoResponses)]
pub enum PublishErrors {
    #[response(
        status = 429,
        description = "The account's publish rate limit is used up (its own, or the configured default; a batch takes one token per event). Nothing was written",
        headers(("Retry-After" = u64, description = "Whole seconds until the publish would be accepted"))
    )]
    TooManyRequests(ErrorBody<'static>),
}

/// The publish routes' 409, listed after [`ReadErrors`] in place of its general one.
#[derive(IntoResponses)]
pub enum EventIdTaken {
    #[response(
        status = 409,
        description = "The id is already an event of another `type`, or with other `data` (compared as JSON: members in any order; numbers as parsed, so `1` and `1.0` differ; of an erased event, the `type` alone): an id names one event, so this one is refused, not answered with the stored one. `field` is `type` or `data` (in a batch, `events[3].data`: the whole batch is refused and nothing of it is written). Nothing was written; publish the event under a new id"
    )]
    Conflict(ErrorBody<'static>),
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AccountPath {
    #[param(example = "acme")]
    account: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EndpointPath {
    #[param(example = "acme")]
    account: String,
    endpoint: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventPath {
    #[param(example = "acme")]
    account: String,
    event: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeliveryPath {
    #[param(example = "acme")]
    account: String,
    delivery: String,
}

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum DeliveryStatusName {
    Pending,
    Delivered,
    Failed,
    Abandoned,
}

/// An event type: dot-separated segments of letters, digits, `_` or `-`.
#[derive(ToSchema)]
#[schema(
    pattern = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$",
    example = "invoice.paid"
)]
pub struct EventTypeName(String);

/// An endpoint's event-type filter entry: an event type, `prefix.*`, or `*`.
#[derive(ToSchema)]
#[schema(
    pattern = r"^(\*|[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(\.\*)?)$",
    example = "invoice.*"
)]
pub struct EventTypePattern(String);

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum EndpointStatusName {
    Active,
    Disabled,
}

/// What set off an attempt: the retry schedule, or a person's replay.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum TriggerName {
    Scheduled,
    Manual,
}

/// One delivery, or an endpoint's deliveries since a time.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum ReplayScopeName {
    Delivery,
    Endpoint,
}

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum PrincipalKind {
    Admin,
    Key,
    Account,
}

/// A scope a key can hold; every route needs one (see each operation's `security`).
#[derive(ToSchema)]
pub enum ScopeName {
    #[schema(rename = "accounts:read")]
    AccountsRead,
    #[schema(rename = "accounts:write")]
    AccountsWrite,
    #[schema(rename = "tokens:write")]
    TokensWrite,
    #[schema(rename = "endpoints:read")]
    EndpointsRead,
    #[schema(rename = "endpoints:write")]
    EndpointsWrite,
    #[schema(rename = "events:publish")]
    EventsPublish,
    #[schema(rename = "events:erase")]
    EventsErase,
    #[schema(rename = "deliveries:read")]
    DeliveriesRead,
    #[schema(rename = "deliveries:replay")]
    DeliveriesReplay,
    #[schema(rename = "admin")]
    Admin,
}

/// The statuses a bulk replay can resend.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum ReplayableStatus {
    Delivered,
    Failed,
    Abandoned,
}

/// Delivery-log filters of one endpoint's log.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryFilters {
    status: Option<DeliveryStatusName>,
    /// Exact event type.
    event_type: Option<EventTypeName>,
    /// Created at or after (RFC 3339).
    since: Option<chrono::DateTime<chrono::Utc>>,
    /// Created before (RFC 3339).
    until: Option<chrono::DateTime<chrono::Utc>>,
    /// The last attempt's HTTP status.
    #[param(minimum = 100, maximum = 599)]
    status_code: Option<u16>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

/// The account's delivery log takes an endpoint's filters, plus the endpoint.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EndpointFilter {
    /// Only this endpoint's deliveries.
    #[param(pattern = r"^[A-Za-z0-9_.:-]{1,128}$")]
    endpoint: Option<String>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

#[derive(ToSchema)]
pub struct EndpointList {
    data: Vec<EndpointView<'static>>,
    /// Present when there are more endpoints to read.
    next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct DeliveryList {
    data: Vec<DeliveryView<'static>>,
    /// Present when there is more to read. A page reads at most 2,000 deliveries, so under a
    /// filter that few match it can hold fewer than `limit`, or none, and still continue.
    next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct EventDeliveryList {
    data: Vec<DeliveryView<'static>>,
    /// Present while the event may have more deliveries. On the AWS shape a page looks at no
    /// more than 2,000 of the account's endpoints, so an event sent to few of many can answer
    /// fewer than `limit`, or none, and still continue.
    next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct AttemptList {
    data: Vec<AttemptView<'static>>,
    /// Present when there are more attempts to read.
    next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct ReplayList {
    data: Vec<ReplayView<'static>>,
    next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct AuditList {
    data: Vec<AuditView<'static>>,
    /// Present when there is more to read.
    next_cursor: Option<String>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct KeyPath {
    #[param(example = "key_0192d1f4a5b67c8d9e0f1a2b3c4d5e6f")]
    key: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventTypeNamePath {
    #[param(example = "invoice.paid")]
    name: String,
}

#[derive(ToSchema)]
pub struct EventTypeList {
    data: Vec<EventTypeView<'static>>,
    /// Present when there are more types to read.
    next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct KeyList {
    data: Vec<KeyView<'static>>,
    /// Present when there are more keys to read.
    next_cursor: Option<String>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TokenPath {
    #[param(example = "acme")]
    account: String,
    /// The `token_id` the token was minted with.
    #[param(example = "tok_0192d1f4a5b67c8d9e0f1a2b3c4d5e6f")]
    token_id: String,
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use tower::ServiceExt;

    use crate::{clock::ManualClock, fixtures, store::sqlite::SqliteStore};

    async fn health_at(app: &crate::App) -> u16 {
        let router = crate::api::router(crate::api::ApiState::new(
            app.clone(),
            crate::tokens::TokenKey::generate(),
            crate::service::access::AdminToken::fixed("test-admin-token-0123456789"),
            Duration::ZERO,
            Arc::new(crate::limits::Unlimited),
        ));
        let request = axum::http::Request::get("/health")
            .body(axum::body::Body::empty())
            .unwrap();
        router.oneshot(request).await.unwrap().status().as_u16()
    }

    /// A fault no write has met for a minute is not reported: only a write clears it, and
    /// none may come (nothing due, the delivery gone).
    #[tokio::test]
    async fn a_store_fault_nothing_has_met_for_a_minute_is_not_reported() {
        let clock = Arc::new(ManualClock::new(fixtures::t0()));
        let app = fixtures::app_on(Arc::new(SqliteStore::in_memory().unwrap()), clock.clone());
        let failed_at = crate::clock::add(fixtures::t0(), Duration::from_secs(11));
        crate::telemetry::store_write_failed(&app.store, (fixtures::t0(), failed_at), &"locked");
        clock.advance(Duration::from_secs(12));
        assert_eq!(health_at(&app).await, 503, "past the grace");
        clock.advance(Duration::from_secs(60));
        assert_eq!(health_at(&app).await, 200, "a minute without a write");
    }

    /// Publishes the store refuses for more than 10 s (another process holds the database's
    /// write lock) are reported by `/health` as refused attempt records are; one that goes
    /// through, a batch too, clears it.
    #[tokio::test]
    async fn a_publish_the_store_refuses_is_reported_until_one_goes_through() {
        use crate::service::publish::{publish, publish_batch, NewEvent};
        let (store, database) = fixtures::sqlite_file_store("health-publish");
        let clock = Arc::new(ManualClock::new(fixtures::t0()));
        let app = fixtures::app_on(store.clone(), clock.clone());
        fixtures::account_with_endpoints(&*store, "acme", ["ep_a"]).await;
        let account = crate::domain::AccountId::from_trusted("acme".into());
        let new = |id: &str| NewEvent {
            id: Some(id.into()),
            event_type: "invoice.paid".into(),
            data: serde_json::json!({}),
        };
        let lock = rusqlite::Connection::open(&database).unwrap();
        lock.execute_batch("BEGIN IMMEDIATE").unwrap();
        let refused = publish(&app, &account, new("evt_1")).await;
        assert!(
            matches!(refused, Err(crate::service::ServiceError::Store(_))),
            "{refused:?}"
        );
        clock.advance(Duration::from_secs(12));
        assert_eq!(
            health_at(&app).await,
            200,
            "one refused publish is no outage"
        );
        let refused = publish(&app, &account, new("evt_1")).await;
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(health_at(&app).await, 503, "publishes refused for 12 s");
        lock.execute_batch("COMMIT").unwrap();
        publish_batch(&app, &account, vec![new("evt_1"), new("evt_2")])
            .await
            .unwrap();
        assert_eq!(health_at(&app).await, 200, "a batch went through");
        std::fs::remove_dir_all(database.parent().unwrap()).unwrap();
    }
}
