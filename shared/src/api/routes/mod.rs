//! The API's handlers, one file per resource. Each carries its `#[utoipa::path]`; the route
//! list is `api::v1_routes`.

use std::time::Duration;

use axum::{
    extract::{FromRequestParts, Query, RawPathParams, State},
    http::request::Parts,
    http::StatusCode,
    response::{IntoResponse, Response},
    Extension, Json,
};
use serde::{Deserialize, Deserializer};
use utoipa::ToSchema;

use super::{
    auth::Principal,
    error::{ApiError, ApiResult},
    json::{whole, JsonBody},
    openapi::{
        AccountPath, AttemptList, BodyErrors, DeliveryFilters, DeliveryList, DeliveryPath,
        EndpointFilter, EndpointList, EndpointPath, EventDeliveryList, EventIdTaken, EventPath,
        EventTypeName, EventTypePattern, PageParams, PublishErrors, ReadErrors, ReplayList,
        ReplayableStatus, TokenPath,
    },
    views::{
        AccountView, AdminTokenView, AttemptView, DeliveryView, EndpointView, EventView, ListView,
        ReplayView, TokenView, TokensRevokedView, WhoamiView,
    },
    ApiState,
};
use crate::{
    domain::{
        AccountId, Caller, Delivery, DeliveryId, DeliveryStatus, EndpointId, EventId, EventType,
        ReplayFilter, ReplayId,
    },
    store::{cursor, DeliveryQuery},
};

mod accounts;
mod audit;
mod deliveries;
mod endpoint_stats;
mod endpoints;
mod event_types;
mod events;
mod keys;
mod portal;
mod replays;
mod tokens;

pub use accounts::*;
pub use audit::*;
pub use deliveries::*;
pub use endpoint_stats::*;
pub use endpoints::*;
pub use event_types::*;
pub use events::*;
pub use keys::*;
pub use portal::*;
pub use replays::*;
pub use tokens::*;

fn endpoint_id(raw: &str) -> ApiResult<EndpointId> {
    EndpointId::parse(raw).map_err(|_| ApiError::not_found("endpoint"))
}

/// The `{account}` of the route's path, parsed and checked against the caller: an account
/// the caller may not see answers 404, as one that does not exist.
pub struct Scoped(pub AccountId);

/// `{account}`, checked as [`Scoped`] is, and the route's other id (`{endpoint}`, `{event}`
/// or `{delivery}`); a malformed id answers 404, as a missing one does.
pub struct ScopedId<Id>(pub AccountId, pub Id);

/// An id a route's path names after the account.
pub trait PathId: Sized {
    /// The path parameter, and what a 404 says is not found.
    const NAME: &'static str;
    /// What a 404 calls it, when not its parameter's name.
    const WHAT: &'static str = Self::NAME;
    fn from_path(raw: &str) -> Option<Self>;
}

macro_rules! path_ids {
    ($($id:ty => $name:literal),* $(,)?) => {$(
        impl PathId for $id {
            const NAME: &'static str = $name;
            fn from_path(raw: &str) -> Option<Self> {
                <$id>::parse(raw).ok()
            }
        }
    )*};
}
path_ids!(EndpointId => "endpoint", EventId => "event", DeliveryId => "delivery");

/// The path parameter `name`, or a 404 naming it.
fn path_param(params: &RawPathParams, name: &'static str) -> ApiResult<String> {
    params
        .iter()
        .find(|(param, _)| *param == name)
        .map(|(_, value)| value.to_owned())
        .ok_or_else(|| ApiError::not_found(name))
}

impl<S: Send + Sync> FromRequestParts<S> for Scoped {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::not_found("account"))?;
        let account = AccountId::parse(&path_param(&params, "account")?)
            .map_err(|_| ApiError::not_found("account"))?;
        // `auth::authenticate` checked it already; a handler mounted without it fails closed.
        let principal = parts
            .extensions
            .get::<Principal>()
            .ok_or_else(|| ApiError::unauthorized("missing token"))?;
        if !principal.reaches(&account) {
            return Err(ApiError::not_found("account"));
        }
        Ok(Self(account))
    }
}

impl<S: Send + Sync, Id: PathId> FromRequestParts<S> for ScopedId<Id> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        let Scoped(account) = Scoped::from_request_parts(parts, state).await?;
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::not_found(Id::WHAT))?;
        let id = Id::from_path(
            &path_param(&params, Id::NAME).map_err(|_| ApiError::not_found(Id::WHAT))?,
        )
        .ok_or_else(|| ApiError::not_found(Id::WHAT))?;
        Ok(Self(account, id))
    }
}

/// Distinguishes an absent field from an explicit `null` in PATCH bodies.
fn double_option<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}
