//! The events-table item as outbox writers put it (docs/OUTBOX.md, contract version 1), read
//! and checked the same way from a stream image and from the table.

use serde_json::Value;

use super::{Item, UNFANNED_SHARDS};
use crate::{
    clock::from_millis,
    domain::{event::MAX_PAYLOAD_BYTES, AccountId, Event, EventId, EventType, InvalidField},
};
use aws_sdk_dynamodb::types::AttributeValue;

/// `created_at` bounds, in milliseconds: 2001-09-09 to 2286-11-20. A time in seconds (ten
/// digits) or in microseconds (sixteen) is a mistake, and falls outside.
const CREATED_AT_MIN: i64 = 1_000_000_000_000;
const CREATED_AT_MAX: i64 = 9_999_999_999_999;

/// One attribute value, as much of it as the check needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attr<'a> {
    S(&'a str),
    N(&'a str),
    Bool(bool),
    /// Any other type, by its DynamoDB name (`M`, `L`, `NULL`, `B`, `SS`, …).
    Other(&'static str),
}

impl Attr<'_> {
    fn type_name(&self) -> &'static str {
        match self {
            Attr::S(_) => "S",
            Attr::N(_) => "N",
            Attr::Bool(_) => "BOOL",
            Attr::Other(name) => name,
        }
    }
}

/// An item's attributes by name: a table item, or a stream image in DynamoDB JSON.
pub trait Attributes {
    fn attr(&self, name: &str) -> Option<Attr<'_>>;
}

impl Attributes for Item {
    fn attr(&self, name: &str) -> Option<Attr<'_>> {
        Some(match self.get(name)? {
            AttributeValue::S(v) => Attr::S(v),
            AttributeValue::N(v) => Attr::N(v),
            AttributeValue::Bool(v) => Attr::Bool(*v),
            AttributeValue::B(_) => Attr::Other("B"),
            AttributeValue::Bs(_) => Attr::Other("BS"),
            AttributeValue::L(_) => Attr::Other("L"),
            AttributeValue::M(_) => Attr::Other("M"),
            AttributeValue::Ns(_) => Attr::Other("NS"),
            AttributeValue::Null(_) => Attr::Other("NULL"),
            AttributeValue::Ss(_) => Attr::Other("SS"),
            _ => Attr::Other("an unknown type"),
        })
    }
}

impl Attributes for Value {
    fn attr(&self, name: &str) -> Option<Attr<'_>> {
        let typed = self.get(name)?.as_object()?;
        let (kind, value) = typed.iter().next()?;
        Some(match (kind.as_str(), value) {
            ("S", Value::String(v)) => Attr::S(v),
            ("N", Value::String(v)) => Attr::N(v),
            ("BOOL", Value::Bool(v)) => Attr::Bool(*v),
            ("B", _) => Attr::Other("B"),
            ("BS", _) => Attr::Other("BS"),
            ("L", _) => Attr::Other("L"),
            ("M", _) => Attr::Other("M"),
            ("NS", _) => Attr::Other("NS"),
            ("NULL", _) => Attr::Other("NULL"),
            ("SS", _) => Attr::Other("SS"),
            _ => Attr::Other("an unknown type"),
        })
    }
}

/// What an events-table item asks of fan-out.
#[derive(Debug, Clone, PartialEq)]
pub enum OutboxItem {
    /// Written alone (an outbox write, or `publish` on the AWS shape): its deliveries are
    /// still to be made.
    New(Event),
    /// Written together with its deliveries, or already fanned out: nothing to do.
    AlreadyFannedOut,
}

fn missing(name: &str, kind: &str) -> String {
    format!("missing `{name}` ({kind})")
}

fn wrong_type(name: &str, found: Attr<'_>, kind: &str) -> String {
    format!("`{name}` is {}, not {kind}", found.type_name())
}

fn string<'a>(item: &'a impl Attributes, name: &str) -> Result<&'a str, String> {
    match item.attr(name) {
        Some(Attr::S(v)) => Ok(v),
        Some(other) => Err(wrong_type(name, other, "a string (S)")),
        None => Err(missing(name, "a string (S)")),
    }
}

fn field_error(error: InvalidField) -> String {
    format!("`{}` {}", error.field, error.message)
}

/// Checks an events-table item against the contract and reads the event it describes. The
/// error is the reason recorded on a rejected item: it names the attribute and the rule.
/// Whether the account exists is fan-out's check, not this one.
pub fn read_outbox_item(item: &impl Attributes) -> Result<OutboxItem, String> {
    match item.attr("fanned_out") {
        Some(Attr::Bool(true)) => return Ok(OutboxItem::AlreadyFannedOut),
        Some(Attr::Bool(false)) | None => {}
        Some(other) => return Err(wrong_type("fanned_out", other, "a boolean (BOOL)")),
    }
    let account_id = AccountId::parse(string(item, "account_id")?).map_err(field_error)?;
    let id = EventId::parse(string(item, "id")?).map_err(field_error)?;
    let event_type = EventType::parse(string(item, "type")?).map_err(field_error)?;
    let created_at = match item.attr("created_at") {
        Some(Attr::N(raw)) => raw
            .parse::<i64>()
            .map_err(|_| format!("`created_at` {raw} is not a whole number of milliseconds"))?,
        Some(other) => return Err(wrong_type("created_at", other, "a number (N)")),
        None => {
            return Err(missing(
                "created_at",
                "a number (N), milliseconds since 1970",
            ))
        }
    };
    if !(CREATED_AT_MIN..=CREATED_AT_MAX).contains(&created_at) {
        return Err(format!(
            "`created_at` {created_at} is not milliseconds since 1970 (13 digits, like 1767225600000)"
        ));
    }
    match item.attr("unfanned_shard") {
        Some(Attr::S(shard))
            if shard
                .parse::<u32>()
                .is_ok_and(|s| s < UNFANNED_SHARDS && shard.len() == 1) => {}
        Some(Attr::S(shard)) => {
            return Err(format!(
                "`unfanned_shard` is {shard:?}; it must be one of \"0\" to \"{}\"",
                UNFANNED_SHARDS - 1
            ))
        }
        Some(other) => return Err(wrong_type("unfanned_shard", other, "a string (S)")),
        None => return Err(missing("unfanned_shard", "a string, \"0\" to \"3\"")),
    }
    // DynamoDB's TTL reads epoch seconds: milliseconds would keep the event for ever, and a
    // time before the event would have TTL delete it before it is sent.
    match item.attr("expires_at") {
        Some(Attr::N(raw)) => {
            let seconds = raw
                .parse::<i64>()
                .map_err(|_| format!("`expires_at` {raw} is not a whole number of seconds"))?;
            if seconds > CREATED_AT_MAX / 1000 {
                return Err(format!(
                    "`expires_at` {seconds} is not epoch seconds (10 digits, like 1769817600)"
                ));
            }
            if seconds < created_at / 1000 {
                return Err(format!(
                    "`expires_at` {seconds} is before the event's `created_at`: TTL would delete it before it is sent"
                ));
            }
        }
        None => {}
        Some(other) => return Err(wrong_type("expires_at", other, "a number (N)")),
    }
    let created_at = from_millis(created_at);
    // Erased on request before its fan-out (the sweeper reads the item as it is now): its
    // content is gone, as for any erased event.
    if let Some(erased) = item.attr("erased_at") {
        let Attr::N(at) = erased else {
            return Err(wrong_type("erased_at", erased, "a number (N)"));
        };
        let at = at
            .parse::<i64>()
            .map_err(|_| format!("`erased_at` {at} is not a whole number"))?;
        if !(CREATED_AT_MIN..=CREATED_AT_MAX).contains(&at) {
            return Err(format!(
                "`erased_at` {at} is not milliseconds since 1970 (13 digits, like 1767225600000)"
            ));
        }
        return Ok(OutboxItem::New(Event {
            id,
            account_id,
            event_type,
            created_at,
            payload: String::new(),
            erased_at: Some(from_millis(at)),
        }));
    }
    let event = match (item.attr("data"), item.attr("payload")) {
        (Some(_), Some(_)) => {
            return Err("an item has `data` or `payload` (Hooklane's own), not both".into())
        }
        (Some(Attr::S(data)), None) => {
            Event::from_data_text(id, account_id, event_type, created_at, data)
                .map_err(field_error)?
        }
        (Some(other), None) => {
            return Err(wrong_type("data", other, "a string (S) of JSON text"));
        }
        // Hooklane's own form (the API, `DynamoStore::outbox_put`): the body made already.
        (None, Some(Attr::S(payload))) => Event {
            id,
            account_id,
            event_type,
            created_at,
            payload: payload.to_owned(),
            erased_at: None,
        },
        (None, Some(other)) => return Err(wrong_type("payload", other, "a string (S)")),
        (None, None) => return Err(missing("data", "a string (S) of JSON text")),
    };
    if event.payload.len() > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "the webhook body would be {} bytes; the limit is {MAX_PAYLOAD_BYTES}",
            event.payload.len()
        ));
    }
    Ok(OutboxItem::New(event))
}

/// The webhook body of a stored item written with `data` rather than `payload`.
pub(super) fn payload_from_data(item: &Item, event: &Event) -> Option<String> {
    let AttributeValue::S(data) = item.get("data")? else {
        return None;
    };
    Event::from_data_text(
        event.id.clone(),
        event.account_id.clone(),
        event.event_type.clone(),
        event.created_at,
        data,
    )
    .ok()
    .map(|e| e.payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn good() -> Value {
        json!({
            "account_id": {"S": "acme"},
            "id": {"S": "ord_1.placed"},
            "type": {"S": "order.placed"},
            "created_at": {"N": "1767225600000"},
            "data": {"S": "{\"order\":\"ord_1\",\"total\":42}"},
            "unfanned_shard": {"S": "2"}
        })
    }

    fn reason(change: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
        let mut image = good();
        change(image.as_object_mut().unwrap());
        read_outbox_item(&image).expect_err("must be rejected")
    }

    #[test]
    fn a_contract_item_reads_as_the_event_a_publish_would_make() {
        let OutboxItem::New(event) = read_outbox_item(&good()).unwrap() else {
            panic!("an outbox item needs fan-out");
        };
        let published = Event::new(
            EventId::parse("ord_1.placed").unwrap(),
            AccountId::parse("acme").unwrap(),
            EventType::parse("order.placed").unwrap(),
            from_millis(1_767_225_600_000),
            &json!({"order": "ord_1", "total": 42}),
        )
        .unwrap();
        assert_eq!(event, published);
        let mut done = good();
        done["fanned_out"] = json!({"BOOL": true});
        assert_eq!(read_outbox_item(&done), Ok(OutboxItem::AlreadyFannedOut));
        let mut erased = good();
        erased.as_object_mut().unwrap().remove("data");
        erased["erased_at"] = json!({"N": "1767225700000"});
        let Ok(OutboxItem::New(event)) = read_outbox_item(&erased) else {
            panic!("an erased item is still an event");
        };
        assert!(event.is_erased() && event.payload.is_empty());
        let mut optional = good();
        optional["fanned_out"] = json!({"BOOL": false});
        optional["expires_at"] = json!({"N": "1769817600"});
        optional["note"] = json!({"M": {}});
        assert!(matches!(
            read_outbox_item(&optional),
            Ok(OutboxItem::New(_))
        ));
    }

    #[test]
    fn each_broken_rule_is_named_in_the_reason() {
        let cases: Vec<(String, &str)> = vec![
            (reason(|i| drop(i.remove("type"))), "missing `type`"),
            (reason(|i| drop(i.remove("data"))), "missing `data`"),
            (
                reason(|i| drop(i.remove("unfanned_shard"))),
                "missing `unfanned_shard`",
            ),
            (
                reason(|i| drop(i.insert("data".into(), json!({"M": {"a": {"N": "1"}}})))),
                "`data` is M, not a string",
            ),
            (
                reason(|i| drop(i.insert("created_at".into(), json!({"S": "2026-01-01"})))),
                "`created_at` is S, not a number",
            ),
            (
                reason(|i| drop(i.insert("created_at".into(), json!({"N": "1767225600"})))),
                "not milliseconds",
            ),
            (
                reason(|i| drop(i.insert("created_at".into(), json!({"N": "1767225600000.5"})))),
                "not a whole number",
            ),
            (
                reason(|i| drop(i.insert("fanned_out".into(), json!({"S": "false"})))),
                "`fanned_out` is S",
            ),
            // DynamoDB's TTL reads epoch seconds: milliseconds would keep the event for
            // ever, and a time before the event would have TTL delete it before it is sent.
            (
                reason(|i| drop(i.insert("expires_at".into(), json!({"N": "1769817600000"})))),
                "`expires_at` 1769817600000 is not epoch seconds",
            ),
            (
                reason(|i| drop(i.insert("expires_at".into(), json!({"N": "1767225599"})))),
                "before the event's `created_at`",
            ),
            (
                reason(|i| drop(i.insert("expires_at".into(), json!({"N": "1769817600.5"})))),
                "`expires_at` 1769817600.5 is not a whole number",
            ),
            // Milliseconds, as `created_at`: out of range, it read as the year -262143.
            (
                reason(|i| drop(i.insert("erased_at".into(), json!({"N": "-99999999999999999"})))),
                "`erased_at` -99999999999999999 is not milliseconds since 1970",
            ),
            (
                reason(|i| drop(i.insert("unfanned_shard".into(), json!({"S": "7"})))),
                "`unfanned_shard` is \"7\"",
            ),
            (
                reason(|i| drop(i.insert("data".into(), json!({"S": "{'a': 1}"})))),
                "`data` is not JSON text",
            ),
            (
                reason(|i| drop(i.insert("type".into(), json!({"S": "order placed"})))),
                "`type` must be dot-separated",
            ),
            (
                reason(|i| drop(i.insert("id".into(), json!({"S": "ord/1"})))),
                "`id` may only contain",
            ),
            (
                reason(|i| drop(i.insert("payload".into(), json!({"S": "{}"})))),
                "not both",
            ),
            (
                reason(|i| {
                    let big = format!("\"{}\"", "x".repeat(MAX_PAYLOAD_BYTES));
                    i.insert("data".into(), json!({ "S": big }));
                }),
                "the limit is 262144",
            ),
        ];
        for (reason, expected) in cases {
            assert!(
                reason.contains(expected),
                "{reason:?} should say {expected:?}"
            );
        }
    }

    #[test]
    fn a_table_item_is_read_like_its_stream_image() {
        let item: Item = [
            ("account_id", AttributeValue::S("acme".into())),
            ("id", AttributeValue::S("ord_1.placed".into())),
            ("type", AttributeValue::S("order.placed".into())),
            ("created_at", AttributeValue::N("1767225600000".into())),
            (
                "data",
                AttributeValue::S("{\"order\":\"ord_1\",\"total\":42}".into()),
            ),
            ("unfanned_shard", AttributeValue::S("2".into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(read_outbox_item(&item), read_outbox_item(&good()));
        let mut broken = item;
        broken.insert("data".into(), AttributeValue::M(Default::default()));
        assert_eq!(
            read_outbox_item(&broken).unwrap_err(),
            "`data` is M, not a string (S) of JSON text"
        );
    }
}
