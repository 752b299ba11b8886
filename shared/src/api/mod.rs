//! The HTTP API: one axum router, served by `hooklane serve` and by the `api` Lambda.

use std::sync::Arc;

use axum::{
    extract::{DefaultBodyLimit, Request},
    http::{header::CACHE_CONTROL, HeaderValue},
    middleware::{self, Next},
    response::Response,
    routing::get,
    Extension, Router,
};
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{limits::PublishBuckets, service::access::Access, App};

pub mod auth;
pub mod caller;
pub mod error;
pub mod json;
mod normalize;
pub mod openapi;
mod routes;
mod ui;
pub mod views;

pub use auth::Principal;
pub use caller::ClientAddress;
pub use error::{ApiError, ApiResult};

#[derive(Clone)]
pub struct ApiState {
    pub app: App,
    /// Checks credentials; holds the key that signs account tokens.
    pub access: Arc<Access>,
    /// The accounts' publish rate buckets.
    pub publish_limits: Arc<dyn PublishBuckets>,
    /// The event-type catalog as publishing reads it.
    pub catalog: Arc<crate::service::catalog::Catalog>,
}

impl ApiState {
    pub fn new(
        app: App,
        token_key: crate::tokens::TokenKey,
        admin: crate::service::access::AdminToken,
        cache_ttl: std::time::Duration,
        publish_limits: Arc<dyn PublishBuckets>,
    ) -> Self {
        let access = Arc::new(Access::new(
            Arc::clone(&app.store),
            Arc::clone(&app.clock),
            token_key,
            admin,
            cache_ttl,
        ));
        let catalog = Arc::new(crate::service::catalog::Catalog::new(
            app.config.strict_event_types,
            cache_ttl,
        ));
        Self {
            app,
            access,
            publish_limits,
            catalog,
        }
    }
}

/// The route list, written once: each `routes!` registers its handlers with axum and their
/// `#[utoipa::path]` annotations (which hold the paths) in the OpenAPI document, so the
/// router and the document cannot disagree. Handlers on one path go in one `routes!`.
fn v1_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(routes::create_account))
        .routes(routes!(routes::get_account, routes::update_account))
        .routes(routes!(routes::create_endpoint, routes::list_endpoints))
        .routes(routes!(
            routes::get_endpoint,
            routes::update_endpoint,
            routes::delete_endpoint
        ))
        .routes(routes!(routes::enable_endpoint))
        .routes(routes!(routes::disable_endpoint))
        .routes(routes!(routes::rotate_secret))
        .routes(routes!(routes::send_test_event))
        .routes(routes!(routes::endpoint_stats))
        .routes(routes!(routes::list_endpoint_deliveries))
        .routes(routes!(routes::replay_endpoint))
        .routes(routes!(routes::create_event_type, routes::list_event_types))
        .routes(routes!(
            routes::get_event_type,
            routes::update_event_type,
            routes::delete_event_type
        ))
        .routes(routes!(routes::publish_event))
        .routes(routes!(routes::publish_batch))
        .routes(routes!(routes::get_event, routes::erase_event))
        .routes(routes!(routes::list_event_deliveries))
        .routes(routes!(routes::list_deliveries))
        .routes(routes!(routes::get_delivery))
        .routes(routes!(routes::list_attempts))
        .routes(routes!(routes::replay_delivery))
        .routes(routes!(routes::list_replays))
        .routes(routes!(routes::list_audit))
        .routes(routes!(routes::list_operator_audit))
        .routes(routes!(routes::create_token, routes::revoke_tokens))
        .routes(routes!(routes::revoke_token))
        .routes(routes!(routes::create_portal_link))
        .routes(routes!(routes::rotate_admin_token))
        .routes(routes!(routes::whoami))
        .routes(routes!(routes::create_key, routes::list_keys))
        .routes(routes!(routes::revoke_key))
        .routes(routes!(routes::revoke_account_keys))
}

/// The routes that need no token.
fn meta_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(openapi::health))
        .routes(routes!(openapi::openapi_json))
}

/// The OpenAPI document of the API, as `/openapi.json` serves it.
pub fn document() -> utoipa::openapi::OpenApi {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(v1_routes())
        .merge(meta_routes())
        .into_openapi()
}

/// The whole API. Everything under `/v1` needs a bearer token; `/health`, `/openapi.json`
/// and the static page under `/ui` do not.
pub fn router(state: ApiState) -> Router {
    let mount = mount_path(state.app.config.public_url.as_ref());
    let api = api_router(state);
    // Under a public URL with a path (`https://hooks.example.com/base/`), the API answers
    // there too: an API Gateway custom domain's API mapping, like some proxies, passes the
    // path on with its mapping key in it. The API sees its own paths either way.
    match mount {
        Some(mount) => Router::new().nest(&mount, api.clone()).merge(api),
        None => api,
    }
}

/// The path of a public URL, without its last `/`, if it is more than the root and only of
/// the characters a route path takes as they are.
fn mount_path(public_url: Option<&url::Url>) -> Option<String> {
    let path = public_url?.path().trim_end_matches('/');
    let plain = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~'));
    (!path.is_empty() && plain && !path.contains("//")).then(|| path.to_owned())
}

fn api_router(state: ApiState) -> Router {
    // The extractors other than `JsonBody` (which reads `json::BodyLimit`) stop here.
    let body_limit = state.app.config.batch_body_limit();
    let scopes = Arc::new(auth::RouteScopes::from_document(&document()));
    let authenticated = v1_routes().route_layer(middleware::from_fn_with_state(
        (state.clone(), scopes),
        auth::authenticate,
    ));
    let (routes, document) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(authenticated)
        .merge(meta_routes())
        .split_for_parts();
    Router::new()
        .merge(routes)
        .route("/ui", get(ui::index))
        .route("/ui/", get(ui::index))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/app.css", get(ui::style))
        .fallback(|| async { ApiError::not_found("route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        .layer(middleware::map_response(normalize::json_errors))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            json::limit_body,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(Extension(Arc::new(document)))
        // Outermost, so that every answer under `/v1` has it, whoever made it.
        .layer(middleware::from_fn(no_store))
        .with_state(state)
}

/// `Cache-Control: no-store` on every answer under `/v1`, errors included: answers carry
/// endpoints' signing secrets, keys, tokens and portal links, which no browser or proxy cache
/// may keep. The page under `/ui` sets its own.
async fn no_store(request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let under_v1 = path == "/v1" || path.starts_with("/v1/");
    let mut response = next.run(request).await;
    if under_v1 {
        response
            .headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
