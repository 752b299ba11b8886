//! Reading events-table items from the DynamoDB stream (`NEW_IMAGE`, in DynamoDB JSON).

use serde_json::Value;

use crate::store::dynamodb::outbox::read_outbox_item;
pub use crate::store::dynamodb::outbox::OutboxItem as StreamedEvent;

/// Retries of a failing events-stream record before it is given up (the fan-out trigger's
/// `MaximumRetryAttempts` in the template, checked by its tests): Lambda then sends where
/// it was to the failure queue and reads on; the sweeper fans the event out later.
pub const STREAM_RETRIES: u32 = 10;

/// Parses a stream record's new image of the events table, checked against the item
/// contract of docs/OUTBOX.md; the error is the reason the item is rejected.
pub fn event_from_image(image: &Value) -> Result<StreamedEvent, String> {
    read_outbox_item(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_millis;

    #[test]
    fn images_of_outbox_and_published_events() {
        let image = serde_json::json!({
            "account_id": {"S": "acme"},
            "id": {"S": "evt_1"},
            "type": {"S": "invoice.paid"},
            "created_at": {"N": "1700000000000"},
            "payload": {"S": "{\"id\":\"evt_1\"}"},
            "fanned_out": {"BOOL": false},
            "unfanned_shard": {"S": "1"}
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
