//! What the API shows of the domain.

use serde::Serialize;

use crate::{
    clock::Timestamp,
    domain::{Account, Attempt, Delivery, Endpoint, Event},
};

#[derive(Serialize)]
pub struct AccountView<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub owner_email: &'a str,
    pub created_at: Timestamp,
}

impl<'a> From<&'a Account> for AccountView<'a> {
    fn from(a: &'a Account) -> Self {
        Self {
            id: a.id.as_str(),
            name: &a.name,
            owner_email: a.owner_email.as_str(),
            created_at: a.created_at,
        }
    }
}

#[derive(Serialize)]
pub struct EndpointView<'a> {
    pub id: &'a str,
    pub account_id: &'a str,
    pub url: &'a str,
    pub description: &'a str,
    /// Shown to the endpoint's owner so that they can verify signatures.
    pub secret: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retiring_secret_until: Option<Timestamp>,
    pub status: &'static str,
    pub event_types: Option<&'a [String]>,
    pub max_in_flight: u32,
    pub rate_limit_per_second: Option<u32>,
    pub failing_since: Option<Timestamp>,
    pub disabled_reason: Option<&'a str>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl<'a> From<&'a Endpoint> for EndpointView<'a> {
    fn from(e: &'a Endpoint) -> Self {
        Self {
            id: e.id.as_str(),
            account_id: e.account_id.as_str(),
            url: e.url.as_str(),
            description: &e.description,
            secret: e.secret.expose(),
            retiring_secret_until: e.retiring_secret.as_ref().map(|r| r.until),
            status: e.status.as_str(),
            event_types: e.event_types.patterns(),
            max_in_flight: e.max_in_flight,
            rate_limit_per_second: e.rate_limit_per_second,
            failing_since: e.failing_since,
            disabled_reason: e.disabled_reason.as_deref(),
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

#[derive(Serialize)]
pub struct DeliveryView<'a> {
    pub id: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub endpoint_id: &'a str,
    pub status: &'static str,
    pub attempts: u32,
    pub last_status: Option<u16>,
    pub next_try_at: Option<Timestamp>,
    pub last_error: Option<&'a str>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl<'a> From<&'a Delivery> for DeliveryView<'a> {
    fn from(d: &'a Delivery) -> Self {
        Self {
            id: d.id.as_str(),
            event_id: d.event_id.as_str(),
            event_type: d.event_type.as_str(),
            endpoint_id: d.endpoint_id.as_str(),
            status: d.status.as_str(),
            attempts: d.attempts,
            last_status: d.last_status,
            next_try_at: d.next_try_at,
            last_error: d.last_error.as_deref(),
            created_at: d.created_at,
            updated_at: d.updated_at,
        }
    }
}

#[derive(Serialize)]
pub struct EventView<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub event_type: &'a str,
    pub created_at: Timestamp,
    pub data: serde_json::Value,
    pub deliveries: Vec<DeliveryView<'a>>,
}

impl<'a> EventView<'a> {
    pub fn new(event: &'a Event, deliveries: &'a [Delivery]) -> Self {
        Self {
            id: event.id.as_str(),
            event_type: event.event_type.as_str(),
            created_at: event.created_at,
            data: event.data(),
            deliveries: deliveries.iter().map(DeliveryView::from).collect(),
        }
    }
}

#[derive(Serialize)]
pub struct AttemptView<'a> {
    pub number: u32,
    pub trigger: &'static str,
    pub started_at: Timestamp,
    pub latency_ms: u64,
    pub status_code: Option<u16>,
    pub response_headers: &'a [(String, String)],
    pub response_body: &'a str,
    pub response_body_truncated: bool,
    pub error: Option<&'a str>,
}

impl<'a> From<&'a Attempt> for AttemptView<'a> {
    fn from(a: &'a Attempt) -> Self {
        Self {
            number: a.number,
            trigger: a.trigger.as_str(),
            started_at: a.started_at,
            latency_ms: a.latency_ms,
            status_code: a.status_code,
            response_headers: &a.response_headers,
            response_body: &a.response_body,
            response_body_truncated: a.response_body_truncated,
            error: a.error.as_deref(),
        }
    }
}

#[derive(Serialize)]
pub struct ListView<T: Serialize> {
    pub data: Vec<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}
