//! Reading events-table items from the DynamoDB stream (`NEW_IMAGE`, in DynamoDB JSON).

use serde_json::Value;

use crate::{
    clock::from_millis,
    domain::{AccountId, Event, EventId, EventType},
};

/// What a stream record of the events table asks of fan-out.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamedEvent {
    /// Written alone (the outbox helper, or `publish` on the AWS shape): its deliveries are
    /// still to be made.
    New(Event),
    /// Written together with its deliveries (`Store::publish`): nothing to do.
    AlreadyFannedOut,
}

fn attribute<'a>(image: &'a Value, name: &str, kind: &str) -> Option<&'a Value> {
    image.get(name)?.get(kind)
}

fn string(image: &Value, name: &str) -> Result<String, String> {
    attribute(image, name, "S")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("event image has no string `{name}`"))
}

/// Parses a stream record's new image of the events table.
pub fn event_from_image(image: &Value) -> Result<StreamedEvent, String> {
    if attribute(image, "fanned_out", "BOOL").and_then(Value::as_bool) == Some(true) {
        return Ok(StreamedEvent::AlreadyFannedOut);
    }
    let created_at = attribute(image, "created_at", "N")
        .and_then(Value::as_str)
        .and_then(|raw| raw.parse::<i64>().ok())
        .ok_or("event image has no numeric `created_at`")?;
    Ok(StreamedEvent::New(Event {
        account_id: AccountId::parse(&string(image, "account_id")?).map_err(|e| e.to_string())?,
        id: EventId::parse(&string(image, "id")?).map_err(|e| e.to_string())?,
        event_type: EventType::parse(&string(image, "type")?).map_err(|e| e.to_string())?,
        created_at: from_millis(created_at),
        payload: string(image, "payload")?,
        erased_at: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_of_outbox_and_published_events() {
        let image = serde_json::json!({
            "account_id": {"S": "acme"},
            "id": {"S": "evt_1"},
            "type": {"S": "invoice.paid"},
            "created_at": {"N": "1700000000000"},
            "payload": {"S": "{\"id\":\"evt_1\"}"},
            "fanned_out": {"BOOL": false}
        });
        let StreamedEvent::New(event) = event_from_image(&image).unwrap() else {
            panic!("an outbox event needs fan-out");
        };
        assert_eq!(event.id.as_str(), "evt_1");
        assert_eq!(event.created_at, from_millis(1_700_000_000_000));
        let mut published = image.clone();
        published["fanned_out"] = serde_json::json!({"BOOL": true});
        assert_eq!(
            event_from_image(&published).unwrap(),
            StreamedEvent::AlreadyFannedOut
        );
        let mut broken = image;
        broken["type"] = serde_json::json!({"S": "not a type"});
        assert!(event_from_image(&broken).is_err());
    }
}
