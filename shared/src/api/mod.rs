//! The HTTP API: one axum router, served by `hooklane serve` and by the `api` Lambda.

use std::sync::Arc;

use axum::{
    extract::DefaultBodyLimit,
    middleware,
    routing::{get, post},
    Router,
};

use crate::{tokens::TokenKey, App};

pub mod auth;
pub mod error;
pub mod json;
mod normalize;
pub mod openapi;
mod routes;
mod ui;
pub mod views;

pub use auth::Principal;
pub use error::{ApiError, ApiResult};

#[derive(Clone)]
pub struct ApiState {
    pub app: App,
    pub admin_token: Arc<str>,
    /// Signs and verifies account tokens.
    pub token_key: Arc<TokenKey>,
}

/// The whole API. Everything under `/v1` needs a bearer token; `/health`, `/openapi.json`
/// and the static page under `/ui` do not.
pub fn router(state: ApiState) -> Router {
    let body_limit = state.app.config.max_payload_bytes + 64 * 1024;
    let v1 = Router::new()
        .route("/accounts", post(routes::create_account))
        .route("/accounts/{account}", get(routes::get_account))
        .route(
            "/accounts/{account}/endpoints",
            post(routes::create_endpoint).get(routes::list_endpoints),
        )
        .route(
            "/accounts/{account}/endpoints/{endpoint}",
            get(routes::get_endpoint)
                .patch(routes::update_endpoint)
                .delete(routes::delete_endpoint),
        )
        .route(
            "/accounts/{account}/endpoints/{endpoint}/enable",
            post(routes::enable_endpoint),
        )
        .route(
            "/accounts/{account}/endpoints/{endpoint}/disable",
            post(routes::disable_endpoint),
        )
        .route(
            "/accounts/{account}/endpoints/{endpoint}/secret/rotate",
            post(routes::rotate_secret),
        )
        .route(
            "/accounts/{account}/endpoints/{endpoint}/deliveries",
            get(routes::list_endpoint_deliveries),
        )
        .route("/accounts/{account}/events", post(routes::publish_event))
        .route("/accounts/{account}/events/{event}", get(routes::get_event))
        .route(
            "/accounts/{account}/deliveries",
            get(routes::list_deliveries),
        )
        .route(
            "/accounts/{account}/deliveries/{delivery}",
            get(routes::get_delivery),
        )
        .route(
            "/accounts/{account}/deliveries/{delivery}/attempts",
            get(routes::list_attempts),
        )
        .route(
            "/accounts/{account}/deliveries/{delivery}/replay",
            post(routes::replay_delivery),
        )
        .route(
            "/accounts/{account}/endpoints/{endpoint}/replay",
            post(routes::replay_endpoint),
        )
        .route("/accounts/{account}/replays", get(routes::list_replays))
        .route("/accounts/{account}/tokens", post(routes::create_token))
        .route("/whoami", get(routes::whoami))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ));
    Router::new()
        .route("/health", get(openapi::health))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/ui", get(ui::index))
        .route("/ui/", get(ui::index))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/app.css", get(ui::style))
        .nest("/v1", v1)
        .fallback(|| async { ApiError::not_found("route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        .layer(middleware::map_response(normalize::json_errors))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}
