use serde::Serialize;

use super::{
    ids::{AccountId, EventId},
    InvalidField,
};
use crate::clock::Timestamp;

pub const MAX_EVENT_TYPE_LEN: usize = 128;

/// The largest webhook body (the whole `{"id","type","created","data"}` JSON) an event may
/// have: what a publish accepts and what an outbox item may make.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// What `last_error` says of a delivery ended because its event was erased.
pub const EVENT_ERASED: &str = "its event was erased on request; it cannot be sent";

/// Why an event written straight to the store (the outbox) of an account that does not
/// exist is rejected.
pub fn unknown_account(account: &AccountId) -> String {
    format!("account `{account}` does not exist (create it through the API first)")
}

/// `segment(.segment)*`, each segment of letters, digits, `_` or `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct EventType(String);

impl EventType {
    pub fn parse(raw: &str) -> Result<Self, InvalidField> {
        let field = "type";
        if raw.is_empty() || raw.len() > MAX_EVENT_TYPE_LEN {
            return Err(InvalidField::new(
                field,
                format!("must be 1 to {MAX_EVENT_TYPE_LEN} characters"),
            ));
        }
        let well_formed = raw.split('.').all(|segment| {
            !segment.is_empty()
                && segment
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        });
        if !well_formed {
            return Err(InvalidField::new(
                field,
                "must be dot-separated segments of letters, digits, _ or - (like invoice.paid)",
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn from_trusted(raw: String) -> Self {
        Self(raw)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Something that happened. Immutable but for erasure; `payload` holds the exact bytes
/// every delivery sends.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: EventId,
    pub account_id: AccountId,
    pub event_type: EventType,
    pub created_at: Timestamp,
    /// Empty once the event is erased.
    pub payload: String,
    /// When the payload was erased on request (`DELETE .../events/{event}`): the event and
    /// its log stay, its content is gone and it can no longer be sent.
    pub erased_at: Option<Timestamp>,
}

#[derive(Serialize)]
struct WireBody<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    created: String,
    data: &'a serde_json::Value,
}

impl Event {
    /// Builds the event and its wire body `{"id","type","created","data"}` as compact JSON.
    pub fn new(
        id: EventId,
        account_id: AccountId,
        event_type: EventType,
        created_at: Timestamp,
        data: &serde_json::Value,
    ) -> Result<Self, serde_json::Error> {
        let payload = serde_json::to_string(&WireBody {
            id: id.as_str(),
            event_type: event_type.as_str(),
            created: created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            data,
        })?;
        Ok(Self::unerased(
            id, account_id, event_type, created_at, payload,
        ))
    }

    fn unerased(
        id: EventId,
        account_id: AccountId,
        event_type: EventType,
        created_at: Timestamp,
        payload: String,
    ) -> Self {
        Self {
            id,
            account_id,
            event_type,
            created_at,
            payload,
            erased_at: None,
        }
    }

    /// The event an outbox writer describes with its `data` as JSON text: the body is
    /// `{"id","type","created","data"}` like [`Event::new`]'s, with `data` inserted as
    /// written (less surrounding whitespace), so the bytes signed are the writer's. For
    /// compact `data` the body is byte for byte what a publish of the same event makes.
    pub fn from_data_text(
        id: EventId,
        account_id: AccountId,
        event_type: EventType,
        created_at: Timestamp,
        data: &str,
    ) -> Result<Self, InvalidField> {
        if let Err(error) = serde_json::from_str::<serde::de::IgnoredAny>(data) {
            return Err(InvalidField::new(
                "data",
                format!("is not JSON text: {error}"),
            ));
        }
        let data = data.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
        let quoted = |text: &str| serde_json::Value::from(text).to_string();
        let payload = format!(
            "{{\"id\":{},\"type\":{},\"created\":{},\"data\":{data}}}",
            quoted(id.as_str()),
            quoted(event_type.as_str()),
            quoted(&created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        );
        Ok(Self::unerased(
            id, account_id, event_type, created_at, payload,
        ))
    }

    /// This event with its payload erased at `at` (or when it first was), to the
    /// millisecond as the stores keep it.
    pub fn erased(&self, at: Timestamp) -> Self {
        let at = crate::clock::from_millis(crate::clock::to_millis(at));
        Self {
            payload: String::new(),
            erased_at: Some(self.erased_at.unwrap_or(at)),
            ..self.clone()
        }
    }

    pub fn is_erased(&self) -> bool {
        self.erased_at.is_some()
    }

    /// The `data` member of the payload, for showing the event back through the API.
    pub fn data(&self) -> serde_json::Value {
        self.data_value().unwrap_or(serde_json::Value::Null)
    }

    /// The `data` member, if the payload parses and has one.
    fn data_value(&self) -> Option<serde_json::Value> {
        serde_json::from_str::<serde_json::Value>(&self.payload)
            .ok()
            .and_then(|mut body| body.get_mut("data").map(serde_json::Value::take))
    }
}

/// Why an event published under the id of a stored one is not that event: an id names one
/// event (customers de-duplicate on it), so a publish of it with another `type` or other
/// `data` is refused instead of being answered with the stored event as its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventConflict {
    #[error(
        "event `{id}` was already published with another type (`{}`): an event id names one \
         event; publish this one under a new id",
        .stored.as_str()
    )]
    Type { id: EventId, stored: EventType },
    #[error(
        "event `{id}` was already published with other data: an event id names one event; \
         publish this one under a new id"
    )]
    Data { id: EventId },
}

impl EventConflict {
    /// The id both events have.
    pub fn id(&self) -> &EventId {
        match self {
            Self::Type { id, .. } | Self::Data { id } => id,
        }
    }

    /// The field of the publish that differs from the stored event: `type` or `data`.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Type { .. } => "type",
            Self::Data { .. } => "data",
        }
    }
}

impl Event {
    /// What makes `new`, published under this stored event's id, another event: `None` when
    /// it is this one again (a retry), of the same type and with JSON-equal `data` (members
    /// in any order, numbers as parsed). Of an erased event only the type is compared: its
    /// data is gone. Neither `created` nor the deliveries count: a retry is made later, and
    /// to the endpoints subscribed then.
    pub fn conflict_with(&self, new: &Event) -> Option<EventConflict> {
        if self.event_type != new.event_type {
            return Some(EventConflict::Type {
                id: self.id.clone(),
                stored: self.event_type.clone(),
            });
        }
        if self.is_erased() || new.is_erased() {
            return None;
        }
        // A payload that does not parse (an outbox item's number past a double's range) is
        // compared as another event's, not as `data: null`.
        if let (Some(stored), Some(new)) = (self.data_value(), new.data_value()) {
            if stored == new {
                return None;
            }
        }
        Some(EventConflict::Data {
            id: self.id.clone(),
        })
    }
}

/// An event an endpoint did not get because it was disabled when the event was fanned out.
/// The stores keep such events findable by time, so that a resend that asks for them
/// (`include_missed`) creates the deliveries the endpoint never had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissedEvent {
    pub account_id: AccountId,
    pub id: EventId,
    pub event_type: EventType,
    pub created_at: Timestamp,
}

impl Event {
    /// Whether a disabled endpoint among `endpoints` would have received this event had it
    /// been active: then the stores mark the event missed (see [`MissedEvent`]).
    pub fn missed_by_any(&self, endpoints: &[super::Endpoint]) -> bool {
        endpoints.iter().any(|endpoint| {
            endpoint.status == super::EndpointStatus::Disabled
                && endpoint.subscribed_at(&self.event_type, self.created_at)
        })
    }

    /// The event as the missed-event list names it.
    pub fn as_missed(&self) -> MissedEvent {
        MissedEvent {
            account_id: self.account_id.clone(),
            id: self.id.clone(),
            event_type: self.event_type.clone(),
            created_at: self.created_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_millis;

    #[test]
    fn event_type_grammar() {
        for good in ["invoice.paid", "a", "user-v2.created_at.x", "A.B"] {
            assert!(EventType::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "invoice.",
            ".paid",
            "invoice..paid",
            "invoice paid",
            "invoice/paid",
            "ünicode",
        ] {
            assert!(EventType::parse(bad).is_err(), "{bad}");
        }
        assert!(EventType::parse(&"a".repeat(129)).is_err());
    }

    #[test]
    fn an_outbox_body_keeps_the_data_text_and_matches_a_publish_when_compact() {
        let at = from_millis(1_614_265_330_123);
        let parts = || {
            (
                EventId::parse("evt_1").unwrap(),
                AccountId::parse("acme").unwrap(),
                EventType::parse("invoice.paid").unwrap(),
            )
        };
        let (id, account, kind) = parts();
        let published = Event::new(
            id,
            account,
            kind,
            at,
            &serde_json::json!({"amount": 42, "note": "ü \"q\""}),
        )
        .unwrap();
        let (id, account, kind) = parts();
        let compact = r#"{"amount":42,"note":"ü \"q\""}"#;
        let outbox = Event::from_data_text(id, account, kind, at, compact).unwrap();
        assert_eq!(outbox.payload, published.payload);
        let (id, account, kind) = parts();
        let spaced = Event::from_data_text(id, account, kind, at, " {\"a\": 1.50}\n").unwrap();
        assert!(
            spaced.payload.ends_with(r#""data":{"a": 1.50}}"#),
            "{}",
            spaced.payload
        );
        assert_eq!(spaced.data(), serde_json::json!({"a": 1.5}));
        for bad in ["", "{", "NaN", "{'a': 1}", "1 2"] {
            let (id, account, kind) = parts();
            assert!(
                Event::from_data_text(id, account, kind, at, bad).is_err(),
                "{bad}"
            );
        }
    }

    /// A publish under a stored event's id is the same event (a retry) when its type is the
    /// same and its data JSON-equal; otherwise the conflict names the field that differs. An
    /// erased event is compared by its type alone.
    #[test]
    fn an_id_published_again_is_the_same_event_only_with_the_same_type_and_data() {
        let at = from_millis(1_614_265_330_123);
        let made = |kind: &str, data: serde_json::Value, created: i64| {
            Event::new(
                EventId::parse("evt_1").unwrap(),
                AccountId::parse("acme").unwrap(),
                EventType::parse(kind).unwrap(),
                from_millis(created),
                &data,
            )
            .unwrap()
        };
        let stored = made(
            "invoice.paid",
            serde_json::json!({"amount": 42.5, "lines": [{"sku": "a"}], "currency": "EUR"}),
            1_614_265_330_123,
        );
        // Members in another order, published later: the same event.
        let retry: serde_json::Value = serde_json::from_str(
            r#"{"currency": "EUR", "lines": [{"sku": "a"}], "amount": 42.50}"#,
        )
        .unwrap();
        assert_eq!(
            stored.conflict_with(&made("invoice.paid", retry, 1_614_265_999_000)),
            None
        );
        // An outbox row's data text, as written, is compared as JSON too.
        let outbox = Event::from_data_text(
            EventId::parse("evt_1").unwrap(),
            AccountId::parse("acme").unwrap(),
            EventType::parse("invoice.paid").unwrap(),
            at,
            r#" {"lines":[{"sku":"a"}],"amount":4.25e1,"currency":"EUR"} "#,
        )
        .unwrap();
        assert_eq!(outbox.conflict_with(&stored), None);

        let other_type = made(
            "invoice.voided",
            serde_json::json!({"amount": 42.5, "lines": [{"sku": "a"}], "currency": "EUR"}),
            1_614_265_330_123,
        );
        let conflict = stored.conflict_with(&other_type).expect("another type");
        assert_eq!(
            conflict,
            EventConflict::Type {
                id: EventId::parse("evt_1").unwrap(),
                stored: EventType::parse("invoice.paid").unwrap(),
            }
        );
        assert_eq!(conflict.field(), "type");
        assert_eq!(
            conflict.to_string(),
            "event `evt_1` was already published with another type (`invoice.paid`): an event \
             id names one event; publish this one under a new id"
        );
        for data in [
            serde_json::json!({"amount": 43, "lines": [{"sku": "a"}], "currency": "EUR"}),
            serde_json::json!({"amount": 42.5, "lines": [{"sku": "b"}], "currency": "EUR"}),
            serde_json::json!({"amount": 42.5, "lines": [{"sku": "a"}]}),
            serde_json::json!({"amount": 42.5, "lines": [{"sku": "a"}], "currency": "EUR", "x": null}),
            serde_json::json!(null),
        ] {
            let conflict = stored
                .conflict_with(&made("invoice.paid", data.clone(), 1_614_265_330_123))
                .unwrap_or_else(|| panic!("other data taken for the same: {data}"));
            assert_eq!(
                conflict,
                EventConflict::Data {
                    id: EventId::parse("evt_1").unwrap()
                },
                "{data}"
            );
            assert_eq!(conflict.field(), "data");
        }
        // A stored payload that does not parse (an outbox item's `1e400`) is not `null`.
        let unreadable = Event::from_data_text(
            EventId::parse("evt_1").unwrap(),
            AccountId::parse("acme").unwrap(),
            EventType::parse("invoice.paid").unwrap(),
            at,
            r#"{"amount": 1e400}"#,
        )
        .unwrap();
        let null = made("invoice.paid", serde_json::Value::Null, 1_614_265_330_123);
        assert_eq!(
            unreadable.conflict_with(&null).map(|c| c.field()),
            Some("data")
        );
        // Numbers as parsed: an integer and a float are other data.
        let float = made(
            "invoice.paid",
            serde_json::json!({"n": 1.0}),
            1_614_265_330_123,
        );
        let integer = made(
            "invoice.paid",
            serde_json::json!({"n": 1}),
            1_614_265_330_123,
        );
        assert_eq!(
            float.conflict_with(&integer).map(|c| c.field()),
            Some("data")
        );
        // The type is compared first: both differing is answered for the type.
        let both = made("invoice.voided", serde_json::json!({}), 1_614_265_330_123);
        assert_eq!(stored.conflict_with(&both).map(|c| c.field()), Some("type"));

        // Erased, the data cannot be compared; the type still is.
        let erased = stored.erased(at);
        let other_data = made(
            "invoice.paid",
            serde_json::json!({"n": 1}),
            1_614_265_330_123,
        );
        assert_eq!(erased.conflict_with(&other_data), None);
        assert_eq!(
            erased.conflict_with(&other_type).map(|c| c.field()),
            Some("type")
        );
    }

    #[test]
    fn wire_body_is_compact_and_ordered() {
        let event = Event::new(
            EventId::parse("evt_1").unwrap(),
            AccountId::parse("acme").unwrap(),
            EventType::parse("invoice.paid").unwrap(),
            from_millis(1_614_265_330_123),
            &serde_json::json!({"amount": 42, "currency": "EUR"}),
        )
        .unwrap();
        assert_eq!(
            event.payload,
            r#"{"id":"evt_1","type":"invoice.paid","created":"2021-02-25T15:02:10.123Z","data":{"amount":42,"currency":"EUR"}}"#
        );
        assert_eq!(
            event.data(),
            serde_json::json!({"amount": 42, "currency": "EUR"})
        );
    }
}
