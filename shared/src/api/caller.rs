//! Who is asking for a change, and from where, as the audit log records it: the credential
//! that `auth::authenticate` checked, and the client's IP address. The address is the TCP
//! peer's (`serve` serves the router with `ConnectInfo`), or the one a transport in front of
//! the router puts in the request as [`ClientAddress`] (the api function: API Gateway's
//! source IP). `X-Forwarded-For` is never read: any client can write it.

use std::net::{IpAddr, SocketAddr};

use axum::{
    extract::{ConnectInfo, FromRequestParts},
    http::request::Parts,
};

use super::{auth::Principal, error::ApiError};
use crate::domain::{Actor, Caller};

/// The client's address as a transport in front of the router saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress(pub IpAddr);

/// The client's address: one a transport gave, else the TCP peer's; `None` when neither is
/// known (a router called in-process).
pub fn client_address(parts: &Parts) -> Option<IpAddr> {
    if let Some(ClientAddress(ip)) = parts.extensions.get::<ClientAddress>() {
        return Some(*ip);
    }
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip().to_canonical())
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        // `auth::authenticate` put it there; a handler mounted without it fails closed.
        let principal = parts
            .extensions
            .get::<Principal>()
            .ok_or_else(|| ApiError::unauthorized("missing token"))?;
        Ok(Caller::new(
            Actor::from(principal),
            client_address(parts).map(|ip| ip.to_string()),
        ))
    }
}
