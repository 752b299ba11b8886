//! The fan-out function: events written alone (by the api function's publish, or through the
//! outbox helper) arrive on the events table's stream and get their deliveries here. Records are handled in order; the first
//! one that fails is reported (`ReportBatchItemFailures`), so Lambda retries from it and
//! no record is dropped. Replays are harmless (see `service::fan_out`).

use aws_lambda_events::event::{
    dynamodb::Event,
    streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse},
};
pub use hooklane::aws::handlers::fan_out_deadline;
use hooklane::aws::{handlers::fan_out_images_until, shape::AwsShape};

pub async fn handle(shape: &AwsShape, event: Event) -> DynamoDbEventResponse {
    handle_until(shape, event, None).await
}

/// As [`handle`], fanning out until `deadline` (see [`fan_out_deadline`]): the events not
/// done by then are reported from the first of them, and Lambda's next invocation begins
/// there (a retry under the trigger's `MaximumRetryAttempts`; past them, the sweeper fans out
/// what is left).
pub async fn handle_until(
    shape: &AwsShape,
    event: Event,
    deadline: Option<tokio::time::Instant>,
) -> DynamoDbEventResponse {
    let mut response = DynamoDbEventResponse::default();
    // The batch's new images, in order, with the sequence number to report if one fails.
    let mut images = Vec::new();
    let mut sequences = Vec::new();
    let mut unreadable = None;
    for record in &event.records {
        if record.event_name != "INSERT" {
            continue;
        }
        let sequence = record.change.sequence_number.clone();
        match serde_json::to_value(&record.change.new_image) {
            Ok(image) => {
                images.push(image);
                sequences.push(sequence);
            }
            Err(error) => {
                tracing::warn!(sequence = ?sequence, %error, "unreadable stream record; Lambda retries from it");
                unreadable = Some(sequence);
                break;
            }
        }
    }
    // All new deliveries of the batch are queued together (ten to an SQS request).
    match fan_out_images_until(shape, &images, deadline).await {
        Ok(_) => {
            if let Some(sequence) = unreadable {
                fail_at(&mut response, sequence);
            }
        }
        // The earliest failure decides where Lambda resumes.
        Err((position, error)) => {
            let sequence = sequences.get(position).cloned().flatten();
            tracing::warn!(sequence = ?sequence, %error, "fan-out failed; Lambda retries from this record");
            fail_at(&mut response, sequence);
        }
    }
    // A partial-batch response is a successful invocation: Lambda's Errors never counts it.
    hooklane::telemetry::batch_item_failures("fanout", response.batch_item_failures.len());
    response
}

fn fail_at(response: &mut DynamoDbEventResponse, sequence: Option<String>) {
    let mut failure = DynamoDbBatchItemFailure::default();
    failure.item_identifier = sequence;
    response.batch_item_failures.push(failure);
}

#[cfg(test)]
mod replay_tests;

#[cfg(test)]
mod tests {
    use hooklane::domain::{AccountId, EventId, EventType};
    use hooklane_testkit::{
        fixtures,
        testing::{emulated_shape, stored_event_item, write_through_outbox},
    };

    use super::*;

    fn fixture() -> Event {
        serde_json::from_str(include_str!("../fixtures/events-stream.json")).unwrap()
    }

    async fn queued(settings: &hooklane::aws::settings::AwsSettings) -> usize {
        hooklane_testkit::testing::receive_queued(&settings.queue_url, 0)
            .await
            .len()
    }

    /// An account with one endpoint, and the event the fixture's first stream record is the
    /// image of, written by the platform through the outbox helper in its own transaction.
    async fn the_fixtures_outbox_event() -> (
        hooklane::aws::settings::AwsSettings,
        AwsShape,
        hooklane::domain::Event,
    ) {
        let (settings, shape) = emulated_shape().await;
        fixtures::account_with_endpoints(shape.app.store.as_ref(), "acme", ["ep_1"]).await;
        let outbox_event = hooklane::domain::Event::new(
            EventId::parse("evt_outbox_1").unwrap(),
            AccountId::parse("acme").unwrap(),
            EventType::parse("invoice.paid").unwrap(),
            hooklane::clock::from_millis(1_796_011_200_000),
            &serde_json::json!({"amount": 42}),
        )
        .unwrap();
        write_through_outbox(&shape, &outbox_event).await;
        (settings, shape, outbox_event)
    }

    /// The fixture's outbox record and a second outbox event after it (`evt_outbox_2`,
    /// sequence number …093), as one stream batch; or, with `from_second`, the batch Lambda
    /// retries from the second.
    fn two_outbox_records(from_second: bool) -> Event {
        let mut batch: serde_json::Value =
            serde_json::from_str(include_str!("../fixtures/events-stream.json")).unwrap();
        let records = batch["Records"].as_array_mut().unwrap();
        let text = serde_json::to_string(&records[0])
            .unwrap()
            .replace("evt_outbox_1", "evt_outbox_2")
            .replace(
                "4421584500000000017450439091",
                "4421584500000000017450439093",
            );
        let second: serde_json::Value = serde_json::from_str(&text).unwrap();
        if from_second {
            *records = vec![second];
        } else {
            records.truncate(1);
            records.push(second);
        }
        serde_json::from_value(batch).unwrap()
    }

    /// An invocation whose time runs out reports the events it did not fan out, from the
    /// first of them, rather than run into Lambda's timeout with nothing queued or marked;
    /// the next invocation, from there, fans them out. The first event always runs to its
    /// end (a retry of it would begin again from nothing).
    #[tokio::test]
    async fn out_of_time_the_rest_is_left_to_the_next_invocation() {
        let (settings, shape, first) = the_fixtures_outbox_event().await;
        let store = shape.app.store.as_ref();
        let second = hooklane::domain::Event::new(
            EventId::parse("evt_outbox_2").unwrap(),
            first.account_id.clone(),
            first.event_type.clone(),
            first.created_at,
            &serde_json::json!({"amount": 42}),
        )
        .unwrap();
        write_through_outbox(&shape, &second).await;
        // No time left at all.
        let batch = two_outbox_records(false);
        let late = handle_until(&shape, batch, Some(tokio::time::Instant::now())).await;
        let failures: Vec<_> = late
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.clone())
            .collect();
        assert_eq!(
            failures,
            [Some("4421584500000000017450439093".to_owned())],
            "the second event's record is where the next invocation begins"
        );
        assert_eq!(store.deliveries_of_event(&first).await.unwrap().len(), 1);
        assert_eq!(queued(&settings).await, 1, "the first event's delivery");
        let in_30_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            + 30_000;
        let retry = two_outbox_records(true);
        let next = handle_until(&shape, retry, Some(fan_out_deadline(in_30_s))).await;
        assert!(next.batch_item_failures.is_empty(), "{next:?}");
        assert_eq!(store.deliveries_of_event(&second).await.unwrap().len(), 1);
        assert_eq!(queued(&settings).await, 1, "the second event's delivery");
    }

    #[tokio::test]
    async fn an_outbox_event_from_the_stream_gets_its_deliveries_once() {
        let (settings, shape, outbox_event) = the_fixtures_outbox_event().await;
        let store = shape.app.store.as_ref();

        let (metrics, log, _recorder) =
            hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
        let response = metrics.flushed(handle(&shape, fixture())).await;
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
        assert_eq!(
            log.value(
                "hooklane_deliveries_created_total",
                &[("Stack", "hooklane-test")]
            ),
            Some(serde_json::json!(1))
        );
        let account = AccountId::parse("acme").unwrap();
        let deliveries = store.deliveries_of_event(&outbox_event).await.unwrap();
        assert_eq!(deliveries.len(), 1);
        assert_eq!(
            queued(&settings).await,
            1,
            "one message for the new delivery"
        );
        // The published (already fanned-out) record made nothing.
        let published = hooklane::domain::Event::new(
            EventId::parse("evt_api_1").unwrap(),
            account.clone(),
            EventType::parse("invoice.paid").unwrap(),
            hooklane::clock::from_millis(1_796_011_201_000),
            &serde_json::json!({}),
        )
        .unwrap();
        assert!(store
            .deliveries_of_event(&published)
            .await
            .unwrap()
            .is_empty());

        // Lambda replays the batch: nothing new, and nothing counted.
        let written = log.documents().len();
        let replay = metrics.flushed(handle(&shape, fixture())).await;
        assert!(replay.batch_item_failures.is_empty());
        assert_eq!(log.documents().len(), written);
        assert_eq!(
            store
                .deliveries_of_event(&outbox_event)
                .await
                .unwrap()
                .len(),
            1
        );
    }

    /// The local runner polls the stream several times a second: an empty poll is silent.
    #[tokio::test]
    async fn an_idle_stream_poll_logs_nothing_at_info() {
        let (_, shape) = emulated_shape().await;
        let log = hooklane::telemetry::emf::LogCapture::default();
        let writer = log.clone();
        let _subscriber = tracing::subscriber::set_default(
            hooklane::aws::lambda::lambda_log_subscriber(move || writer.clone()),
        );
        for _ in 0..3 {
            hooklane::aws::handlers::fan_out_images(&shape, &[])
                .await
                .unwrap();
        }
        let loud: Vec<_> = log
            .documents()
            .into_iter()
            .filter(|line| line["level"] != "DEBUG" && line["level"] != "TRACE")
            .collect();
        assert!(loud.is_empty(), "{loud:?}");
    }

    #[tokio::test]
    async fn a_failing_record_is_reported_by_its_sequence_number_and_counted() {
        let (mut settings, _) = emulated_shape().await;
        settings.tables = hooklane::store::dynamodb::TableNames::with_prefix("no-such-stack");
        let broken = hooklane::aws::shape::connect(&settings).await.unwrap();
        let (metrics, log, _recorder) =
            hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
        let response = metrics.flushed(handle(&broken, fixture())).await;
        let failed: Vec<_> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_deref())
            .collect();
        assert_eq!(failed, vec![Some("4421584500000000017450439091")]);
        // The invocation itself succeeds (a partial-batch response), so Lambda's Errors
        // metric never sees this: the function counts it.
        assert_eq!(
            log.value(
                "hooklane_batch_item_failures_total",
                &[("Stack", "hooklane-test"), ("function", "fanout")]
            ),
            Some(serde_json::json!(1))
        );
    }

    #[tokio::test]
    async fn a_malformed_outbox_item_is_rejected_on_record_and_never_blocks_the_stream() {
        use hooklane::aws::aws_sdk_dynamodb::types::AttributeValue;
        let (settings, shape) = emulated_shape().await;
        let s = |v: &str| AttributeValue::S(v.to_owned());
        // Written by hand through the outbox without its `data`. (A creation time of the
        // wrong type never gets this far on AWS: it is a key of the `unfanned` index, so
        // DynamoDB refuses the write, and the platform's transaction with it.)
        shape
            .store
            .client()
            .put_item()
            .table_name(&settings.tables.events)
            .item("account_id", s("acme"))
            .item("id", s("evt_outbox_1"))
            .item("type", s("invoice.paid"))
            .item("created_at", AttributeValue::N("1796011200000".into()))
            .item("fanned_out", AttributeValue::Bool(false))
            .item("unfanned_shard", s("0"))
            .send()
            .await
            .unwrap();
        let mut batch: serde_json::Value =
            serde_json::from_str(include_str!("../fixtures/events-stream.json")).unwrap();
        let image = batch["Records"][0]["dynamodb"]["NewImage"]
            .as_object_mut()
            .unwrap();
        image.remove("payload");
        let batch: Event = serde_json::from_value(batch).unwrap();

        let (metrics, log, _recorder) =
            hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
        let response = metrics.flushed(handle(&shape, batch)).await;
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
        assert_eq!(
            log.value(
                "hooklane_events_rejected_total",
                &[("Stack", "hooklane-test")]
            ),
            Some(serde_json::json!(1))
        );
        let item = stored_event_item(&shape.store, "acme", "evt_outbox_1").await;
        let reason = item.get("rejected").and_then(|v| v.as_s().ok()).cloned();
        assert!(
            reason
                .as_deref()
                .is_some_and(|r| r.contains("missing `data`")),
            "the item says why it was rejected: {reason:?}"
        );
        assert!(
            !item.contains_key("unfanned_shard"),
            "it left the sweeper's index"
        );
        // Reading it says it was rejected, and why, instead of passing for an outage.
        let read = shape
            .app
            .store
            .get_event(
                &AccountId::parse("acme").unwrap(),
                &EventId::parse("evt_outbox_1").unwrap(),
            )
            .await;
        assert!(
            matches!(&read, Err(hooklane::store::StoreError::Rejected(m)) if m.contains("missing `data`")),
            "{read:?}"
        );
    }
}
