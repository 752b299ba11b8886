//! The API's handlers, one file per resource. Each carries its `#[utoipa::path]`; the route
//! list is `api::v1_routes`.

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
    store::{cursor, DeliveryQuery},
};

mod accounts;
mod deliveries;
mod endpoints;
mod events;
mod replays;
mod tokens;

pub use accounts::*;
pub use deliveries::*;
pub use endpoints::*;
pub use events::*;
pub use replays::*;
pub use tokens::*;

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
