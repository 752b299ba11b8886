//! The event-type catalog: the types a platform publishes, described for its customers, each
//! with an optional JSON Schema its events' `data` must match and an example payload.

use crate::clock::Timestamp;

use super::{EventType, InvalidField};

/// The most types a catalog holds: it is read whole, by the page and by publishing.
pub const MAX_EVENT_TYPES: usize = 500;
/// The largest schema or example, serialised.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
pub const MAX_DESCRIPTION_CHARS: usize = 1000;

/// One entry of the catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct EventTypeDef {
    pub name: EventType,
    pub description: String,
    /// A JSON Schema (the subset `json_schema` implements) the `data` of events of this type
    /// must match when published through the API.
    pub schema: Option<serde_json::Value>,
    pub example: Option<serde_json::Value>,
    /// Still accepted; shown as deprecated to customers choosing what to subscribe to.
    pub deprecated: bool,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

pub fn parse_name(raw: &str) -> Result<EventType, InvalidField> {
    EventType::parse(raw).map_err(|e| InvalidField::new("name", e.message))
}

pub fn parse_description(raw: &str) -> Result<String, InvalidField> {
    if raw.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(InvalidField::new(
            "description",
            format!("at most {MAX_DESCRIPTION_CHARS} characters"),
        ));
    }
    Ok(raw.trim().to_owned())
}

/// A schema or example no larger than [`MAX_SCHEMA_BYTES`] serialised.
pub fn bounded(field: &'static str, value: &serde_json::Value) -> Result<(), InvalidField> {
    let size = serde_json::to_vec(value).map_or(usize::MAX, |bytes| bytes.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(InvalidField::new(
            field,
            format!("at most {MAX_SCHEMA_BYTES} bytes serialised ({size} given)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_descriptions_and_sizes_are_bounded() {
        assert_eq!(
            parse_name("invoice.paid").map(|t| t.as_str().to_owned()),
            Ok("invoice.paid".to_owned())
        );
        assert_eq!(
            parse_name("invoice..paid").map_err(|e| e.field.into_owned()),
            Err("name".to_owned())
        );
        assert_eq!(parse_description("  Paid.  ").as_deref(), Ok("Paid."));
        assert!(parse_description(&"x".repeat(MAX_DESCRIPTION_CHARS + 1)).is_err());
        let big = serde_json::Value::String("x".repeat(MAX_SCHEMA_BYTES));
        assert_eq!(
            bounded("example", &big).map_err(|e| e.field.into_owned()),
            Err("example".to_owned())
        );
        assert!(bounded("example", &serde_json::json!({"ok": true})).is_ok());
    }
}
