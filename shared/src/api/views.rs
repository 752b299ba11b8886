//! What the API shows of the domain.

use std::borrow::Cow;

use serde::Serialize;
use utoipa::ToSchema;

use super::{
    auth::Principal,
    openapi::{
        DeliveryStatusName, EndpointStatusName, PrincipalKind, ReplayScopeName, ReplayableStatus,
        ScopeName, TriggerName,
    },
};
use crate::{
    clock::Timestamp,
    domain::Scope,
    domain::{
        audit::REDACTED, rate::PublishRate, stats::Totals, Account, Actor, ApiKey, ApiKeyId,
        Attempt, AuditEntry, Delivery, Endpoint, EndpointId, EndpointStats, Event, EventTypeDef,
        Replay, ReplayScope, TargetKind,
    },
    service::{
        keys::MintedKey,
        publish::{Erased, Published},
        tokens::MintedToken,
    },
    store::EventDeliveries,
};

#[derive(Serialize, ToSchema)]
pub struct AccountView<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub owner_email: &'a str,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub created_at: Timestamp,
    /// The account's own publish rate limit; `null` when the configured default applies.
    #[schema(value_type = Option<PublishRateView>)]
    pub publish_rate_limit: Option<PublishRate>,
}

/// A publish rate limit: `per_second` events a second on average, bursts of up to `burst`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct PublishRateView {
    per_second: u32,
    burst: u32,
}

impl<'a> From<&'a Account> for AccountView<'a> {
    fn from(a: &'a Account) -> Self {
        Self {
            id: a.id.as_str(),
            name: &a.name,
            owner_email: a.owner_email.as_str(),
            created_at: a.created_at,
            publish_rate_limit: a.publish_rate_limit,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct EndpointView<'a> {
    pub id: &'a str,
    pub account_id: &'a str,
    pub url: &'a str,
    pub description: &'a str,
    /// The signing secret, for verifying signatures: shown only to a caller that may change
    /// the endpoint (`endpoints:write`); whoever holds it can sign webhooks the receiver
    /// takes for genuine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub retiring_secret_until: Option<Timestamp>,
    #[schema(value_type = EndpointStatusName)]
    pub status: &'static str,
    #[schema(value_type = Option<Vec<String>>)]
    #[schema(required = true)]
    pub event_types: Option<&'a [String]>,
    pub max_in_flight: u32,
    #[schema(required = true)]
    pub rate_limit_per_second: Option<u32>,
    /// Sent with every attempt, by lower-case name; a secret value is never shown.
    pub headers: std::collections::BTreeMap<&'a str, HeaderView<'a>>,
    #[schema(value_type = Option<String>, format = DateTime)]
    #[schema(required = true)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub failing_since: Option<Timestamp>,
    #[schema(required = true)]
    pub disabled_reason: Option<&'a str>,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub updated_at: Timestamp,
}

impl<'a> EndpointView<'a> {
    /// The endpoint as a caller that may only read it sees it: without its secret.
    pub fn without_secret(e: &'a Endpoint) -> Self {
        Self {
            secret: None,
            ..Self::from(e)
        }
    }

    /// The endpoint, its secret shown when `principal` may change it.
    pub fn for_principal(e: &'a Endpoint, principal: &crate::domain::Principal) -> Self {
        if principal.has_scope(crate::domain::Scope::EndpointsWrite) {
            Self::from(e)
        } else {
            Self::without_secret(e)
        }
    }
}

impl<'a> From<&'a Endpoint> for EndpointView<'a> {
    fn from(e: &'a Endpoint) -> Self {
        Self {
            id: e.id.as_str(),
            account_id: e.account_id.as_str(),
            url: e.url.as_str(),
            description: &e.description,
            secret: Some(e.secret.expose()),
            retiring_secret_until: e.retiring_secret.as_ref().map(|r| r.until),
            status: e.status.as_str(),
            event_types: e.event_types.patterns(),
            max_in_flight: e.max_in_flight,
            rate_limit_per_second: e.rate_limit_per_second,
            headers: e
                .headers
                .iter()
                .map(|(name, h)| {
                    let value = (!h.secret).then_some(h.value.as_str());
                    let secret = h.secret;
                    (name, HeaderView { value, secret })
                })
                .collect(),
            failing_since: e.failing_since,
            disabled_reason: e.disabled_reason.as_deref(),
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

/// One custom header of an endpoint.
#[derive(Serialize, ToSchema)]
pub struct HeaderView<'a> {
    /// `null` for a secret value: it can be replaced, never read back.
    #[schema(required = true)]
    pub value: Option<&'a str>,
    pub secret: bool,
}

/// One type of the event-type catalog.
#[derive(Serialize, ToSchema)]
pub struct EventTypeView<'a> {
    pub name: &'a str,
    pub description: &'a str,
    /// The JSON Schema events' `data` must match; `null` for none.
    #[schema(value_type = Option<Object>)]
    #[schema(required = true)]
    pub schema: Option<&'a serde_json::Value>,
    /// Any JSON; `null` for none.
    #[schema(value_type = Option<serde_json::Value>)]
    #[schema(required = true)]
    pub example: Option<&'a serde_json::Value>,
    pub deprecated: bool,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub updated_at: Timestamp,
}

impl<'a> From<&'a EventTypeDef> for EventTypeView<'a> {
    fn from(d: &'a EventTypeDef) -> Self {
        Self {
            name: d.name.as_str(),
            description: &d.description,
            schema: d.schema.as_ref(),
            example: d.example.as_ref(),
            deprecated: d.deprecated,
            created_at: d.created_at,
            updated_at: d.updated_at,
        }
    }
}

/// An endpoint's health at a glance: its attempts of the last 24 hours and 7 days.
#[derive(Serialize, ToSchema)]
pub struct EndpointStatsView<'a> {
    pub endpoint_id: &'a str,
    /// The current hour is the last of `hours`; the counts run up to this time.
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub generated_at: Timestamp,
    pub last_24h: TotalsView,
    pub last_7d: TotalsView,
    /// When the current failing streak started (every attempt since failed); `null` when
    /// the last attempt succeeded.
    #[schema(value_type = Option<String>, format = DateTime)]
    #[schema(required = true)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub failing_since: Option<Timestamp>,
    #[schema(required = true)]
    pub last_failure: Option<LastFailureView<'a>>,
    /// 168 hours, oldest first; the last one is the current hour, so far.
    pub hours: Vec<PeriodView>,
    /// The same, by 24 hours: 7 periods, the last ending with the current hour.
    pub days: Vec<PeriodView>,
}

#[derive(Serialize, ToSchema)]
pub struct TotalsView {
    pub attempts: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Succeeded over attempts, 0 to 1; `null` without attempts.
    #[schema(required = true)]
    pub success_rate: Option<f64>,
}

impl From<Totals> for TotalsView {
    fn from(t: Totals) -> Self {
        Self {
            attempts: t.attempts(),
            succeeded: t.succeeded,
            failed: t.failed,
            success_rate: t.success_rate(),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct PeriodView {
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub start: Timestamp,
    pub succeeded: u64,
    pub failed: u64,
}

#[derive(Serialize, ToSchema)]
pub struct LastFailureView<'a> {
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub at: Timestamp,
    /// `null` when nothing answered (timeout, refused connection, TLS).
    #[schema(required = true)]
    pub status_code: Option<u16>,
    pub error: &'a str,
}

impl<'a> EndpointStatsView<'a> {
    pub fn new(endpoint: &'a Endpoint, stats: &'a EndpointStats) -> Self {
        Self {
            endpoint_id: endpoint.id.as_str(),
            generated_at: stats.at,
            last_24h: stats.last_24h.into(),
            last_7d: stats.last_7d.into(),
            failing_since: endpoint.failing_since,
            last_failure: stats.last_failure.as_ref().map(|f| LastFailureView {
                at: f.at,
                status_code: f.status_code,
                error: &f.error,
            }),
            hours: stats
                .hours
                .iter()
                .map(|h| PeriodView {
                    start: h.hour,
                    succeeded: h.succeeded,
                    failed: h.failed,
                })
                .collect(),
            days: stats
                .days()
                .into_iter()
                .map(|(start, t)| PeriodView {
                    start,
                    succeeded: t.succeeded,
                    failed: t.failed,
                })
                .collect(),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct DeliveryView<'a> {
    pub id: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub endpoint_id: &'a str,
    #[schema(value_type = DeliveryStatusName)]
    pub status: &'static str,
    pub attempts: u32,
    #[schema(required = true)]
    pub last_status: Option<u16>,
    #[schema(value_type = Option<String>, format = DateTime)]
    #[schema(required = true)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub next_try_at: Option<Timestamp>,
    #[schema(required = true)]
    pub last_error: Option<&'a str>,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
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

/// Deliveries an event's answer (publish, read, erase) lists at most. An account may have
/// 100,000 endpoints, and the AWS function answers 6 MB at most, the body JSON-escaped within
/// it: a delivery's JSON is about 350 bytes, at most about 2.6 KB escaped (a 512-character
/// redirect in `last_error`, 128-character ids), so 1,000 of them and a 256 KiB payload stay
/// well within it (and within what a client wants to read at once).
pub const EVENT_DELIVERIES_SHOWN: usize = crate::service::publish::ANSWER_DELIVERIES as usize;

/// An event and its deliveries, 1,000 of them at most.
#[derive(Serialize, ToSchema)]
pub struct EventView<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub event_type: &'a str,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub created_at: Timestamp,
    /// The event's `data`; null once erased.
    pub data: serde_json::Value,
    /// When its content was erased on request; only present then.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub erased_at: Option<Timestamp>,
    /// Its deliveries, one per endpoint it was sent to, in endpoint-id order: all of them
    /// up to 1,000. An event with more lists the first 1,000 and says so in
    /// `deliveries_partial`; none, should even these make the answer over 5 MB as the AWS
    /// function carries it.
    pub deliveries: Vec<DeliveryView<'a>>,
    /// True when the event has, or may have, more deliveries than `deliveries` lists;
    /// absent otherwise. `GET /v1/accounts/{account}/events/{event}/deliveries` lists them
    /// all, a page at a time.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deliveries_partial: bool,
    /// With a partial list: the `cursor` for `GET …/events/{event}/deliveries` that goes on
    /// where this answer's list stopped. Absent when the answer left its list out to stay
    /// small (start that list from its beginning).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries_next_cursor: Option<String>,
    /// How many deliveries the event has, given with a partial list when the answer knows
    /// it: a publish that created the event and an erasure do; a read and a publish of an id
    /// published before, which read only the deliveries they list, do not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries_total: Option<u64>,
    /// Only in an erasure's answer, and only true: the erasure stopped part-way through the
    /// event's deliveries (on AWS, an event sent to many thousands of endpoints). The payload
    /// is gone and nothing can send it; some response bodies remain until the `DELETE` is
    /// repeated, which goes on where this one stopped, or a sweep goes on with it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub erasure_incomplete: bool,
}

/// The cursor of an event's delivery list after the delivery to `endpoint` (deliveries are
/// listed in endpoint-id order); [`event_page_after`] reads it back.
pub fn event_page_cursor(endpoint: &EndpointId) -> String {
    crate::store::cursor::encode_event_page(endpoint.as_str())
}

/// The endpoint an event's delivery list goes on after, from a cursor of
/// [`event_page_cursor`]; `None` when it is not one (another list's cursor included).
pub fn event_page_after(cursor: &str) -> Option<EndpointId> {
    let endpoint = crate::store::cursor::decode_event_page(cursor)?;
    EndpointId::parse(&endpoint).ok()
}

impl<'a> EventView<'a> {
    /// The event with `deliveries`, all of them: the first [`EVENT_DELIVERIES_SHOWN`] in
    /// endpoint-id order if there are more, then counted.
    pub fn new(event: &'a Event, deliveries: &'a [Delivery]) -> Self {
        let mut shown: Vec<&Delivery> = deliveries.iter().collect();
        shown.sort_by(|a, b| a.endpoint_id.cmp(&b.endpoint_id));
        shown.truncate(EVENT_DELIVERIES_SHOWN);
        let partial = shown.len() < deliveries.len();
        let total = partial.then(|| u64::try_from(deliveries.len()).unwrap_or(u64::MAX));
        let next = partial
            .then(|| shown.last().map(|d| event_page_cursor(&d.endpoint_id)))
            .flatten();
        Self::listing(event, &shown, partial, next, total)
    }

    /// The event with a page of its deliveries as `Store::event_deliveries` reads it (the
    /// first, of at most [`EVENT_DELIVERIES_SHOWN`]), partial when it may have others.
    pub fn first(event: &'a Event, page: &'a EventDeliveries) -> Self {
        Self::first_of(event, &page.deliveries, page.next.as_ref())
    }

    /// The answer to a publish: every delivery it created (see [`EventView::new`]), or for
    /// an id published before, the first stored ones as [`EventView::first`] lists a page.
    pub fn published(published: &'a Published) -> Self {
        match &published.next {
            None => Self::new(&published.event, &published.deliveries),
            Some(next) => Self::first_of(&published.event, &published.deliveries, Some(next)),
        }
    }

    fn first_of(event: &'a Event, deliveries: &'a [Delivery], next: Option<&EndpointId>) -> Self {
        let shown: Vec<&Delivery> = deliveries.iter().take(EVENT_DELIVERIES_SHOWN).collect();
        let next = match (next, deliveries.len() > shown.len()) {
            (_, true) => shown.last().map(|d| &d.endpoint_id),
            (next, false) => next,
        };
        Self::listing(
            event,
            &shown,
            next.is_some(),
            next.map(event_page_cursor),
            None,
        )
    }

    fn listing(
        event: &'a Event,
        shown: &[&'a Delivery],
        partial: bool,
        next_cursor: Option<String>,
        total: Option<u64>,
    ) -> Self {
        Self {
            id: event.id.as_str(),
            event_type: event.event_type.as_str(),
            created_at: event.created_at,
            data: event.data(),
            erased_at: event.erased_at,
            deliveries: shown.iter().map(|d| DeliveryView::from(*d)).collect(),
            deliveries_partial: partial,
            deliveries_next_cursor: next_cursor,
            deliveries_total: total,
            erasure_incomplete: false,
        }
    }

    /// The answer to an erasure (`DELETE …/events/{event}`): the event and its first
    /// deliveries after it, flagged when it is not complete.
    pub fn erased(erased: &'a Erased) -> Self {
        Self {
            erasure_incomplete: !erased.erasure.complete,
            ..Self::first(&erased.erasure.event, &erased.first)
        }
    }

    /// This view with no delivery listed, for an answer too large with them.
    pub fn without_deliveries(mut self) -> Self {
        if !self.deliveries.is_empty() {
            if !self.deliveries_partial {
                self.deliveries_total = u64::try_from(self.deliveries.len()).ok();
            }
            self.deliveries.clear();
            self.deliveries_partial = true;
            self.deliveries_next_cursor = None;
        }
        self
    }
}

#[derive(Serialize, ToSchema)]
pub struct AttemptView<'a> {
    pub number: u32,
    #[schema(value_type = TriggerName)]
    pub trigger: &'static str,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub started_at: Timestamp,
    pub latency_ms: u64,
    #[schema(required = true)]
    pub status_code: Option<u16>,
    /// `[name, value]` pairs as received.
    #[schema(value_type = Vec<Vec<String>>)]
    pub response_headers: &'a [(String, String)],
    pub response_body: &'a str,
    pub response_body_truncated: bool,
    #[schema(required = true)]
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

#[derive(Serialize, ToSchema)]
pub struct TokenView<'a> {
    /// The bearer token; shown only here.
    pub token: &'a str,
    pub token_id: &'a str,
    pub account_id: &'a str,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub expires_at: Timestamp,
}

impl<'a> From<&'a MintedToken> for TokenView<'a> {
    fn from(t: &'a MintedToken) -> Self {
        Self {
            token: &t.token,
            token_id: &t.token_id,
            account_id: t.account_id.as_str(),
            expires_at: t.expires_at,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct WhoamiView<'a> {
    #[schema(value_type = PrincipalKind)]
    pub kind: &'static str,
    /// An account token's account.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub expires_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_id: Option<&'a str>,
    /// What the credential may do.
    #[schema(value_type = Vec<ScopeName>)]
    pub scopes: Vec<&'static str>,
    /// A key limited to some accounts: those.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accounts: Option<Vec<&'a str>>,
}

impl<'a> From<&'a Principal> for WhoamiView<'a> {
    fn from(p: &'a Principal) -> Self {
        let none = Self {
            kind: "admin",
            account_id: None,
            token_id: None,
            expires_at: None,
            key_id: None,
            scopes: Vec::new(),
            accounts: None,
        };
        match p {
            Principal::Admin => Self {
                scopes: vec![Scope::Admin.as_str()],
                ..none
            },
            Principal::Key {
                key_id,
                scopes,
                accounts,
                ..
            } => Self {
                kind: "key",
                key_id: Some(key_id.as_str()),
                scopes: scopes.iter().map(|s| s.as_str()).collect(),
                accounts: accounts
                    .as_ref()
                    .map(|ids| ids.iter().map(|a| a.as_str()).collect()),
                ..none
            },
            Principal::Account {
                account_id,
                token_id,
                expires_at,
                read_only,
            } => Self {
                kind: "account",
                account_id: Some(account_id.as_str()),
                token_id: Some(token_id),
                expires_at: Some(*expires_at),
                scopes: Scope::of_account_token(*read_only)
                    .map(Scope::as_str)
                    .collect(),
                ..none
            },
        }
    }
}

/// A scoped API key; its secret is never shown again.
#[derive(Serialize, ToSchema)]
pub struct KeyView<'a> {
    #[schema(example = "key_0192d1f4a5b67c8d9e0f1a2b3c4d5e6f")]
    pub id: &'a str,
    pub name: &'a str,
    #[schema(value_type = Vec<ScopeName>)]
    pub scopes: Vec<&'static str>,
    /// The accounts it is limited to; null for every account.
    #[schema(required = true)]
    pub accounts: Option<Vec<&'a str>>,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub created_at: Timestamp,
    /// Who made it: `admin` or `key:<key id>`.
    pub created_by: &'a str,
    #[schema(value_type = Option<String>, format = DateTime, required = true)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub expires_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime, required = true)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub revoked_at: Option<Timestamp>,
}

impl<'a> From<&'a ApiKey> for KeyView<'a> {
    fn from(k: &'a ApiKey) -> Self {
        Self {
            id: k.id.as_str(),
            name: &k.name,
            scopes: k.scopes.iter().map(|s| s.as_str()).collect(),
            accounts: k
                .accounts
                .as_ref()
                .map(|ids| ids.iter().map(|a| a.as_str()).collect()),
            created_at: k.created_at,
            created_by: &k.created_by,
            expires_at: k.expires_at,
            revoked_at: k.revoked_at,
        }
    }
}

/// A key just made, with its bearer credential: shown only here.
#[derive(Serialize, ToSchema)]
pub struct NewKeyView<'a> {
    #[serde(flatten)]
    pub details: KeyView<'a>,
    /// The key itself, sent as `Authorization: Bearer <secret>`. Kept only as a digest:
    /// copy it now.
    #[schema(example = "hl_key_0192d1f4a5b67c8d9e0f1a2b3c4d5e6f.x7Q…")]
    pub secret: &'a str,
}

impl<'a> From<&'a MintedKey> for NewKeyView<'a> {
    fn from(m: &'a MintedKey) -> Self {
        Self {
            details: KeyView::from(&m.key),
            secret: &m.credential,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct ReplayView<'a> {
    pub id: &'a str,
    pub account_id: &'a str,
    /// Who asked: `admin`, `key:<key id>` or `token:<token id>`; read by an account token
    /// (a customer, a portal link), `platform` for the admin token and API keys, as in the
    /// audit log.
    pub actor: &'a str,
    #[schema(value_type = ReplayScopeName)]
    pub scope: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_id: Option<&'a str>,
    #[schema(value_type = Option<String>, format = DateTime)]
    #[schema(required = true)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub since: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    #[schema(required = true)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub until: Option<Timestamp>,
    #[schema(value_type = Vec<ReplayableStatus>)]
    pub statuses: Vec<&'static str>,
    #[schema(value_type = Vec<String>)]
    pub event_types: Vec<&'a str>,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub requested_at: Timestamp,
    /// Deliveries put back in the queue for a manual attempt.
    pub count: u32,
    /// Whether the request asked for the events the endpoint missed while disabled.
    pub include_missed: bool,
    /// Deliveries created for events the endpoint missed while disabled (not in `count`).
    pub missed: u32,
    /// More deliveries matched than one request replays: send the same request again.
    pub more: bool,
}

impl<'a> ReplayView<'a> {
    /// The replay as `principal` may read it: an account token does not learn which of the
    /// operator's keys asked (see [`AuditView::shown_to`]).
    pub fn shown_to(r: &'a Replay, principal: &Principal) -> Self {
        let mut view = Self::from(r);
        let customer = matches!(principal, Principal::Account { .. });
        let platform = matches!(
            Actor::parse(&r.actor),
            Some(Actor::Admin | Actor::Key(_)) | None
        );
        if customer && platform {
            view.actor = "platform";
        }
        view
    }
}

impl<'a> From<&'a Replay> for ReplayView<'a> {
    fn from(r: &'a Replay) -> Self {
        let (scope, delivery_id, endpoint_id) = match &r.scope {
            ReplayScope::Delivery(id) => ("delivery", Some(id.as_str()), None),
            ReplayScope::Endpoint(id) => ("endpoint", None, Some(id.as_str())),
        };
        Self {
            id: r.id.as_str(),
            account_id: r.account_id.as_str(),
            actor: &r.actor,
            scope,
            delivery_id,
            endpoint_id,
            since: r.filter.since,
            until: r.filter.until,
            statuses: r.filter.statuses.iter().map(|s| s.as_str()).collect(),
            event_types: r.filter.event_types.iter().map(|t| t.as_str()).collect(),
            requested_at: r.requested_at,
            count: r.count,
            include_missed: r.filter.include_missed,
            missed: r.missed,
            more: r.more,
        }
    }
}

/// One item of a batch's answer, in the order of the request.
#[derive(Serialize, ToSchema)]
pub struct BatchResult<'a> {
    /// False when an event with this id existed: it is returned and nothing was created.
    pub created: bool,
    pub event: BatchEventView<'a>,
}

/// An event of a batch's answer: as a single publish answers it, or, in an abridged answer,
/// without its deliveries, and without its `data` when it was created by this batch (the
/// caller sent it); an event that existed keeps its `data`, to compare with what was sent.
#[derive(Serialize, ToSchema)]
pub struct BatchEventView<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub event_type: &'a str,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub created_at: Timestamp,
    /// The event's `data`; null once erased. Left out of an abridged answer for an event this
    /// batch created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_optional_text")]
    pub erased_at: Option<Timestamp>,
    /// Left out of an abridged answer: read them with `GET …/events/{event}`. An event
    /// this batch created lists all it created; one published before, its first stored ones
    /// (1,000 at most, by endpoint id: see `deliveries_next_cursor`), or with none stored yet,
    /// those its fan-out creates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries: Option<Vec<DeliveryView<'a>>>,
    /// For an event published before that may have more deliveries than `deliveries` lists:
    /// the `cursor` for `GET …/events/{event}/deliveries` that goes on after them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries_next_cursor: Option<String>,
}

impl<'a> BatchEventView<'a> {
    pub fn new(published: &'a Published, abridged: bool) -> Self {
        let event = &published.event;
        Self {
            id: event.id.as_str(),
            event_type: event.event_type.as_str(),
            created_at: event.created_at,
            data: (!abridged || !published.created).then(|| event.data()),
            erased_at: event.erased_at,
            deliveries: (!abridged).then(|| {
                published
                    .deliveries
                    .iter()
                    .map(DeliveryView::from)
                    .collect()
            }),
            deliveries_next_cursor: published
                .next
                .as_ref()
                .filter(|_| !abridged)
                .map(event_page_cursor),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct BatchView<'a> {
    pub results: Vec<BatchResult<'a>>,
    /// True when the whole answer would have been too large (an AWS function answers 6 MB at
    /// most), so each event is given without its deliveries, and without its `data` when
    /// this batch created it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub abridged: bool,
}

/// Up to when an account's tokens are revoked.
#[derive(Serialize, ToSchema)]
pub struct TokensRevokedView<'a> {
    pub account_id: &'a str,
    /// Tokens issued at or before this time are refused.
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub tokens_revoked_before: Timestamp,
}

/// A new admin token; shown only here.
#[derive(Serialize, ToSchema)]
pub struct AdminTokenView<'a> {
    pub token: &'a str,
}

/// One audit-log entry: who changed what, when, from which address. An account token (a
/// customer, a portal link) reads the platform's changes to its account (by the admin token
/// or an API key) with the actor `platform`, no `address`, and no key id or key name (a key's
/// id as a target, a key's name in `details`): the operator's own addresses and keys are not
/// the customer's to see. The admin token and API keys read every entry as recorded.
#[derive(Serialize, ToSchema)]
pub struct AuditView<'a> {
    /// `aud_…`, time-ordered.
    pub id: &'a str,
    /// `null` in the operator's log (changes over no one account).
    #[schema(required = true)]
    pub account_id: Option<&'a str>,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub at: Timestamp,
    pub actor: AuditActorView<'a>,
    /// One of `account.created`, `account.updated`, `endpoint.created`, `endpoint.updated`,
    /// `endpoint.deleted`, `endpoint.disabled`, `endpoint.enabled`,
    /// `endpoint.secret_rotated`, `key.created`, `key.revoked`, `token.created`,
    /// `token.revoked`, `tokens.revoked`, `portal_link.created`, `replay.created`,
    /// `event.erased`, `admin_token.rotated`, `event_type.created`, `event_type.updated`,
    /// `event_type.deleted`.
    #[schema(example = "endpoint.secret_rotated")]
    pub action: &'static str,
    pub target: AuditTargetView<'a>,
    /// The client's IP address; `null` for changes Hooklane made itself, and for the
    /// platform's changes (actor `platform`) read by an account token.
    #[schema(required = true)]
    pub address: Option<&'a str>,
    /// What changed, briefly; never a secret. Read by an account token, a platform change
    /// holds no key name, and any key id in it is `[redacted]`.
    #[schema(value_type = Object)]
    pub details: Cow<'a, serde_json::Map<String, serde_json::Value>>,
}

/// Who made a change.
#[derive(Serialize, ToSchema)]
pub struct AuditActorView<'a> {
    /// `admin` (the admin token), `key` (an API key), `token` (an account token) or
    /// `system` (Hooklane itself, e.g. disabling a failing endpoint). An account token reads
    /// `platform` in place of `admin` and `key`: a change the platform made.
    #[serde(rename = "type")]
    #[schema(example = "key")]
    pub kind: &'static str,
    /// The key's or token's id; `null` for `admin`, `system` and `platform`.
    #[schema(required = true)]
    pub id: Option<&'a str>,
}

/// What a change was made to.
#[derive(Serialize, ToSchema)]
pub struct AuditTargetView<'a> {
    /// `account`, `endpoint`, `key`, `token`, `replay`, `event`, `admin_token` or
    /// `event_type`.
    #[serde(rename = "type")]
    #[schema(example = "endpoint")]
    pub kind: &'static str,
    /// The target's id; a key's is `[redacted]` when an account token reads it.
    pub id: &'a str,
}

impl<'a> From<&'a AuditEntry> for AuditView<'a> {
    fn from(e: &'a AuditEntry) -> Self {
        Self {
            id: e.id.as_str(),
            account_id: e.account_id.as_ref().map(|a| a.as_str()),
            at: e.at,
            actor: AuditActorView {
                kind: e.actor.kind(),
                id: e.actor.id(),
            },
            action: e.action.as_str(),
            target: AuditTargetView {
                kind: e.target.kind.as_str(),
                id: &e.target.id,
            },
            address: e.address.as_deref(),
            details: Cow::Borrowed(&e.details),
        }
    }
}

impl<'a> AuditView<'a> {
    /// The entry as `principal` may read it: see [`AuditView`]. Only the view changes; the
    /// stored entry keeps who made the change and from where, for the operator.
    pub fn shown_to(e: &'a AuditEntry, principal: &Principal) -> Self {
        let mut view = Self::from(e);
        let customer = matches!(principal, Principal::Account { .. });
        if customer && matches!(e.actor, Actor::Admin | Actor::Key(_)) {
            view.actor = AuditActorView {
                kind: "platform",
                id: None,
            };
            view.address = None;
            if e.target.kind == TargetKind::Key || names_a_key(&e.target.id) {
                view.target.id = REDACTED;
            }
            let mut details = e.details.clone();
            // A key's name is the operator's label for it.
            if e.target.kind == TargetKind::Key {
                details.remove("name");
            }
            details.values_mut().for_each(redact_key_ids);
            view.details = Cow::Owned(details);
        }
        view
    }
}

/// Whether `text` holds an API key id (`key_` and 32 hex digits), alone or within it
/// (`key:key_…`).
fn names_a_key(text: &str) -> bool {
    text.match_indices("key_").any(|(at, _)| {
        text.get(at..at + 36)
            .is_some_and(|id| ApiKeyId::parse(id).is_some())
    })
}

/// Replaces every string in `value` that names an API key by `[redacted]`, whatever field
/// holds it: no entry an account token reads tells it which of the operator's keys acted.
fn redact_key_ids(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(text) if names_a_key(text) => *text = REDACTED.to_owned(),
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_key_ids),
        serde_json::Value::Object(map) => map.values_mut().for_each(redact_key_ids),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::domain::{AccountId, AuditAction, AuditTarget, Caller};

    fn entry(actor: Actor, target: AuditTarget, details: Value) -> AuditEntry {
        let Value::Object(details) = details else {
            unreachable!()
        };
        let caller = Caller::new(actor, Some("203.0.113.10".into()));
        let account = AccountId::parse("acme").ok();
        let action = AuditAction::KeyCreated;
        AuditEntry::new(
            account,
            chrono::Utc::now(),
            &caller,
            action,
            target,
            details,
        )
    }

    fn shown(e: &AuditEntry, principal: &Principal) -> Value {
        serde_json::to_value(AuditView::shown_to(e, principal)).unwrap()
    }

    fn customer() -> Principal {
        Principal::Account {
            account_id: AccountId::parse("acme").unwrap(),
            token_id: "tok_1".into(),
            expires_at: chrono::Utc::now(),
            read_only: true,
        }
    }

    #[test]
    fn audit_entries_of_the_platform_name_no_key_to_an_account_token() {
        let key = ApiKeyId::generate();
        let made = entry(
            Actor::Key(key.clone()),
            AuditTarget::new(TargetKind::Key, &key),
            json!({"name": "ops", "scopes": ["endpoints:read"], "via": [format!("key:{key}")]}),
        );
        let view = shown(&made, &customer());
        assert_eq!(view["actor"], json!({"type": "platform", "id": null}));
        assert_eq!(view["address"], Value::Null);
        assert_eq!(view["target"], json!({"type": "key", "id": REDACTED}));
        assert_eq!(
            view["details"],
            json!({"scopes": ["endpoints:read"], "via": [REDACTED]})
        );
        assert!(!view.to_string().contains(key.as_str()), "{view}");
        // The stored entry, and what the admin token reads, keep it all.
        assert_eq!(made.details["name"], "ops");
        let admin = shown(&made, &Principal::Admin);
        assert_eq!(admin, serde_json::to_value(AuditView::from(&made)).unwrap());
        assert_eq!(admin["actor"]["id"], key.as_str());
        assert_eq!(admin["address"], "203.0.113.10");
    }

    #[test]
    fn audit_entries_of_the_account_and_hooklane_are_shown_as_recorded() {
        for actor in [Actor::Token("tok_2".into()), Actor::System] {
            let made = entry(
                actor,
                AuditTarget::new(TargetKind::Endpoint, "ep_1"),
                json!({"changed": ["url"]}),
            );
            let recorded = serde_json::to_value(AuditView::from(&made)).unwrap();
            assert_eq!(shown(&made, &customer()), recorded);
        }
    }

    /// The replay trail tells an account token no more than its audit log does: the
    /// operator's key behind a replay reads as `platform`.
    #[test]
    fn replays_of_the_platform_name_no_key_to_an_account_token() {
        use crate::domain::{DeliveryId, ReplayFilter, ReplayScope};
        let key = ApiKeyId::generate();
        let account = AccountId::parse("acme").unwrap();
        let made_by = |actor: String| {
            let mut replay = crate::fixtures::replay(
                &account,
                ReplayScope::Delivery(DeliveryId::from_trusted("dlv_1".into())),
                ReplayFilter::single(),
                0,
            );
            replay.actor = actor;
            replay
        };
        let by_key = made_by(format!("key:{key}"));
        let shown = ReplayView::shown_to(&by_key, &customer());
        assert_eq!(shown.actor, "platform");
        assert_eq!(made_by("admin".into()).actor, "admin");
        assert_eq!(
            ReplayView::shown_to(&made_by("admin".into()), &customer()).actor,
            "platform"
        );
        assert_eq!(
            ReplayView::shown_to(&by_key, &Principal::Admin).actor,
            format!("key:{key}")
        );
        let by_token = made_by("token:tok_2".into());
        assert_eq!(
            ReplayView::shown_to(&by_token, &customer()).actor,
            "token:tok_2"
        );
    }
}
