//! The sender function: each SQS message names one delivery; they are handled concurrently
//! and the ones that failed are reported back (`ReportBatchItemFailures`) so only they are
//! retried by SQS.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use hooklane::aws::{
    handlers::{handle_queue_batch_until, MessageOutcome},
    shape::AwsShape,
};

pub use hooklane::aws::handlers::send_by;

pub async fn handle(shape: &AwsShape, event: SqsEvent) -> SqsBatchResponse {
    handle_until(shape, event, None).await
}

/// As [`handle`], sending webhooks only until `send_by` (see [`send_by`]): the messages
/// whose webhook would be sent later go back to the queue, to be sent soon by another
/// invocation.
pub async fn handle_until(
    shape: &AwsShape,
    event: SqsEvent,
    send_by: Option<tokio::time::Instant>,
) -> SqsBatchResponse {
    let messages: Vec<(&str, Option<&str>)> = event
        .records
        .iter()
        .map(|record| {
            (
                record.message_id.as_deref().unwrap_or_default(),
                record.body.as_deref(),
            )
        })
        .collect();
    // Handled concurrently; their retries are queued together.
    let outcomes = handle_queue_batch_until(shape, &messages, send_by).await;
    let mut response = SqsBatchResponse::default();
    for ((id, _), outcome) in messages.iter().zip(outcomes) {
        if outcome == MessageOutcome::Retry {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = (*id).to_owned();
            response.batch_item_failures.push(failure);
        }
    }
    response
}

#[cfg(test)]
mod crash_tests;

#[cfg(test)]
mod tests {
    use std::{sync::atomic::Ordering, time::Duration};

    use hooklane::{
        domain::DeliveryStatus,
        service::{
            fan_out::fan_out,
            publish::{publish, NewEvent, Published},
        },
    };
    use hooklane_testkit::{
        fixtures,
        testing::{delivery_message, emulated_shape, slow_receiver},
    };

    use super::*;

    /// Account acme with its endpoint ep_1, which sends to `url`.
    async fn acme_sending_to(shape: &AwsShape, url: &str) -> hooklane::domain::Endpoint {
        let endpoint = fixtures::endpoint_sending_to("acme", "ep_1", url);
        fixtures::create_account_and_endpoints(&*shape.app.store, "acme", [&endpoint]).await;
        endpoint
    }

    /// The event `id` published to acme, then fanned out as the events table's stream does
    /// (its delivery created and queued).
    async fn publish_and_fan_out(shape: &AwsShape, id: &str, data: serde_json::Value) -> Published {
        let account = hooklane::domain::AccountId::parse("acme").unwrap();
        let new = NewEvent {
            id: Some(id.into()),
            event_type: "invoice.paid".into(),
            data,
        };
        let published = publish(&shape.app, &account, new).await.unwrap();
        fan_out(&shape.app, &published.event).await.unwrap();
        published
    }

    /// The fixture batch with the given message bodies in place of its placeholders
    /// (`{{DELIVERY_MESSAGE}}`, `{{UNREACHABLE_MESSAGE}}`), in that order.
    fn fixture_batch(bodies: &[&str]) -> SqsEvent {
        let placeholders = ["\"{{DELIVERY_MESSAGE}}\"", "\"{{UNREACHABLE_MESSAGE}}\""];
        let fixture = placeholders.iter().zip(bodies).fold(
            include_str!("../fixtures/sqs-batch.json").to_owned(),
            |fixture, (placeholder, body)| {
                fixture.replace(placeholder, &serde_json::to_string(body).unwrap())
            },
        );
        serde_json::from_str(&fixture).unwrap()
    }

    /// The fixture batch's record of `message` alone.
    fn batch_of_one(message: &str) -> SqsEvent {
        let mut batch = fixture_batch(&[message]);
        batch.records.retain(|r| r.body.as_deref() == Some(message));
        batch
    }

    #[tokio::test]
    async fn a_real_sqs_batch_reports_only_the_failed_item() {
        let (settings, shape) = emulated_shape().await;
        let receiver = slow_receiver(Duration::from_millis(5)).await;
        let store = shape.app.store.as_ref();
        let endpoint = acme_sending_to(&shape, &receiver.url).await;
        let account = endpoint.account_id.clone();
        let good = publish_and_fan_out(&shape, "evt_good", serde_json::json!({})).await;
        let broken = publish_and_fan_out(&shape, "evt_broken", serde_json::json!({})).await;
        // The broken delivery's item cannot be read (its status is not a string): handling
        // it fails inside the sender.
        let broken_delivery = &broken.deliveries[0];
        shape
            .store
            .client()
            .update_item()
            .table_name(&settings.tables.deliveries)
            .key(
                "log",
                aws_sdk_dynamodb_value(&hooklane::domain::delivery_log_partition(
                    &broken_delivery.account_id,
                    &broken_delivery.endpoint_id,
                )),
            )
            .key("id", aws_sdk_dynamodb_value(broken_delivery.id.as_str()))
            .update_expression("SET #status = :seven")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(
                ":seven",
                hooklane::aws::aws_sdk_dynamodb::types::AttributeValue::N("7".into()),
            )
            .send()
            .await
            .unwrap();
        let batch = fixture_batch(&[
            &delivery_message(&good.deliveries[0]),
            &delivery_message(&broken.deliveries[0]),
        ]);

        let (metrics, log, _recorder) =
            hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
        let response = metrics.flushed(handle(&shape, batch)).await;
        // A partial-batch response is a successful invocation: the function counts the item.
        assert_eq!(
            log.value(
                "hooklane_batch_item_failures_total",
                &[("Stack", "hooklane-test"), ("function", "sender")]
            ),
            Some(serde_json::json!(1))
        );
        let failed: Vec<_> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        assert_eq!(failed, vec!["7d9c1f3e-5c2a-4b8e-9f0a-1e2d3c4b5a69"]);
        assert_eq!(receiver.served.load(Ordering::SeqCst), 1);
        let delivered = store
            .get_delivery(&account, &good.deliveries[0].id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(delivered.status, DeliveryStatus::Delivered);
    }

    /// Events expire (TTL), deliveries do not: one whose event is gone ends `failed` at once
    /// and says why, instead of failing in the sender and cycling through the dead-letter
    /// queue and the sweeper for ever; asking to replay it is refused, naming the reason.
    #[tokio::test]
    async fn a_delivery_whose_event_is_past_retention_ends_failed_and_cannot_be_replayed() {
        let (settings, shape) = emulated_shape().await;
        let receiver = slow_receiver(Duration::from_millis(5)).await;
        let store = shape.app.store.as_ref();
        let endpoint = acme_sending_to(&shape, &receiver.url).await;
        let account = endpoint.account_id.clone();
        let published = publish_and_fan_out(&shape, "evt_expired", serde_json::json!({})).await;
        let delivery = store
            .deliveries_of_event(&published.event)
            .await
            .unwrap()
            .remove(0);
        // What TTL does once the event is past retention.
        shape
            .store
            .client()
            .delete_item()
            .table_name(&settings.tables.events)
            .key("account_id", aws_sdk_dynamodb_value("acme"))
            .key("id", aws_sdk_dynamodb_value("evt_expired"))
            .send()
            .await
            .unwrap();
        // Drain the fan-out's message, then hand the sender the delivery's message.
        let _ = hooklane_testkit::testing::receive_queued(&settings.queue_url, 1).await;
        let body = delivery_message(&delivery);
        let outcomes =
            hooklane::aws::handlers::handle_queue_batch(&shape, &[("m-1", Some(&body))]).await;
        assert_eq!(outcomes, vec![MessageOutcome::Done], "handled, not retried");
        assert_eq!(receiver.served.load(Ordering::SeqCst), 0);
        let stored = store
            .get_delivery(&account, &delivery.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.status, DeliveryStatus::Failed);
        assert_eq!(
            stored.last_error.as_deref(),
            Some(hooklane::service::deliver::EVENT_EXPIRED)
        );
        assert!(
            hooklane_testkit::testing::receive_queued(&settings.queue_url, 0)
                .await
                .is_empty(),
            "nothing queued again"
        );
        let replay = hooklane::service::replay::replay_delivery(
            &shape.app,
            &account,
            &delivery.id,
            &hooklane::domain::Caller::new(hooklane::domain::Actor::Admin, None),
        )
        .await;
        assert!(
            matches!(&replay, Err(hooklane::service::ServiceError::Conflict(m)) if m.contains("past retention")),
            "{replay:?}"
        );
    }

    /// Lambda stops the sender at its timeout, and a webhook sent too close to it could be
    /// cut off before its record is written, then be sent again. Past `send_by` (the
    /// invocation's deadline less the request's and its record's time) the sender sends
    /// nothing: the message goes back to the queue, due within seconds, no attempt spent.
    /// With time left, the same message is sent.
    #[tokio::test]
    async fn a_message_whose_send_would_end_past_the_invocation_goes_back_unsent() {
        let (settings, shape) = emulated_shape().await;
        let receiver = slow_receiver(Duration::from_millis(5)).await;
        let store = shape.app.store.as_ref();
        let endpoint = acme_sending_to(&shape, &receiver.url).await;
        let published = publish_and_fan_out(&shape, "evt_late", serde_json::json!({})).await;
        let delivery = &published.deliveries[0];
        // Drain the fan-out's message: the one the sender puts back is the only one.
        let _ = hooklane_testkit::testing::receive_queued(&settings.queue_url, 1).await;

        let batch = batch_of_one(&delivery_message(delivery));
        let late = handle_until(&shape, batch.clone(), Some(tokio::time::Instant::now())).await;
        assert!(
            late.batch_item_failures.is_empty(),
            "queued again, not failed: {:?}",
            late.batch_item_failures
        );
        assert_eq!(receiver.served.load(Ordering::SeqCst), 0, "nothing sent");
        let stored = store
            .get_delivery(&endpoint.account_id, &delivery.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (stored.status, stored.attempts),
            (DeliveryStatus::Pending, 0)
        );
        let waited = hooklane::service::sender::UNSENT_REQUEUE_MAX.as_secs() as i32 + 2;
        let back = hooklane_testkit::testing::receive_queued(&settings.queue_url, waited).await;
        let bodies: Vec<_> = back.iter().filter_map(|m| m.body.as_deref()).collect();
        assert_eq!(bodies, [delivery_message(delivery)], "its message is back");

        let in_an_hour = tokio::time::Instant::now() + Duration::from_secs(3600);
        let sent = handle_until(&shape, batch, Some(in_an_hour)).await;
        assert!(sent.batch_item_failures.is_empty());
        assert_eq!(
            receiver.served.load(Ordering::SeqCst),
            1,
            "sent with time left"
        );
    }

    #[tokio::test]
    async fn one_message_leaves_its_attempt_in_the_emf_log() {
        let (metrics, log, _recorder) =
            hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
        let (_, shape) = emulated_shape().await;
        let receiver = slow_receiver(Duration::from_millis(5)).await;
        acme_sending_to(&shape, &receiver.url).await;
        // The stream's fan-out creates the delivery.
        let published = publish_and_fan_out(&shape, "evt_metered", serde_json::json!({})).await;
        // What publishing recorded is not this invocation's business.
        metrics.publish().unwrap();
        let before = log.documents().len();
        let batch = batch_of_one(&delivery_message(&published.deliveries[0]));
        assert_eq!(batch.records.len(), 1);

        let response = metrics.flushed(handle(&shape, batch)).await;
        assert!(response.batch_item_failures.is_empty());
        assert_eq!(receiver.served.load(Ordering::SeqCst), 1);

        let documents = log.documents().split_off(before);
        let find = |metric: &str| {
            documents
                .iter()
                .find(|d| d.get(metric).is_some())
                .unwrap_or_else(|| panic!("no {metric} in {documents:?}"))
        };
        let dimensions = |d: &serde_json::Value| {
            let definition = &d["_aws"]["CloudWatchMetrics"][0];
            assert_eq!(definition["Namespace"], "Hooklane");
            definition["Dimensions"][0].clone()
        };
        let attempts = find("hooklane_attempts_total");
        assert_eq!(attempts["hooklane_attempts_total"], 1);
        assert_eq!(
            (
                &attempts["Stack"],
                &attempts["outcome"],
                &attempts["attempt"]
            ),
            (
                &serde_json::json!("hooklane-test"),
                &serde_json::json!("success"),
                &serde_json::json!("1")
            )
        );
        assert_eq!(
            dimensions(attempts),
            serde_json::json!(["Stack", "outcome", "attempt"])
        );
        let completed = find("hooklane_deliveries_completed_total");
        assert_eq!(completed["hooklane_deliveries_completed_total"], 1);
        assert_eq!(completed["status"], "delivered");
        let latency = find("hooklane_delivery_latency_seconds");
        let latencies = latency["hooklane_delivery_latency_seconds"]
            .as_array()
            .unwrap();
        assert_eq!(latencies.len(), 1);
        assert!(latencies[0].as_f64().unwrap() >= 0.0);
        assert_eq!(dimensions(latency), serde_json::json!(["Stack"]));
        let durations = find("hooklane_attempt_duration_seconds");
        assert_eq!(
            durations["hooklane_attempt_duration_seconds"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
        // Unbounded labels ride along as fields, not as dimensions.
        let per_endpoint = find("hooklane_endpoint_attempts_total");
        assert_eq!(per_endpoint["endpoint"], "ep_1");
        assert_eq!(dimensions(per_endpoint), serde_json::json!(["Stack"]));
        let per_account = find("hooklane_account_deliveries_total");
        assert_eq!(per_account["account"], "acme");
        assert_eq!(
            dimensions(per_account),
            serde_json::json!(["Stack", "status"])
        );
        assert!(documents
            .iter()
            .all(|d| d.get("hooklane_retries_scheduled_total").is_none()));
        // Everything was written when the handler returned: nothing is left over.
        assert_eq!(metrics.publish().unwrap(), 0);
    }

    /// The Lambda log format as this test binary's global subscriber, as `main` installs it.
    /// Not a scoped one: tracing caches each callsite's interest for the whole process, and
    /// a span callsite first reached by another test's thread while a scoped subscriber was
    /// being installed kept "never" (twice in about twenty runs, the retry line came without
    /// its spans). With one global subscriber there is nothing to race.
    fn global_log() -> hooklane::telemetry::emf::LogCapture {
        static LOG: std::sync::OnceLock<hooklane::telemetry::emf::LogCapture> =
            std::sync::OnceLock::new();
        LOG.get_or_init(|| {
            let log = hooklane::telemetry::emf::LogCapture::default();
            let writer = log.clone();
            tracing::subscriber::set_global_default(hooklane::aws::lambda::lambda_log_subscriber(
                move || writer.clone(),
            ))
            .expect("no other global subscriber in this test binary");
            log
        })
        .clone()
    }

    #[tokio::test]
    async fn a_failed_attempt_logs_its_ids_and_no_payload_or_secret() {
        let log = global_log();
        let (_, shape) = emulated_shape().await;
        // A port nobody listens on: the attempt fails and is retried later.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", closed.local_addr().unwrap());
        drop(closed);
        let endpoint = acme_sending_to(&shape, &url).await;
        let published = publish_and_fan_out(
            &shape,
            "evt_logged",
            serde_json::json!({"card": "payload-marker-4242"}),
        )
        .await;
        let delivery = &published.deliveries[0];
        let batch = batch_of_one(&delivery_message(delivery));

        let response = handle(&shape, batch).await;
        assert!(response.batch_item_failures.is_empty());
        // Every test's lines are here: this one's is the retry line in evt_logged's span.
        let lines = log.documents();
        let in_spans = |line: &serde_json::Value, name: &str| {
            line["spans"]
                .as_array()
                .and_then(|spans| spans.iter().find_map(|s| s.get(name).cloned()))
        };
        let retry = lines
            .iter()
            .find(|l| {
                l["fields"]["message"] == "attempt failed; will retry"
                    && in_spans(l, "event.id") == Some(serde_json::json!("evt_logged"))
            })
            .unwrap_or_else(|| panic!("no retry line in evt_logged's span in {lines:?}"));
        assert_eq!(retry["level"], "INFO");
        let field = |name: &str| in_spans(retry, name);
        assert_eq!(field("endpoint.id"), Some(serde_json::json!("ep_1")));
        assert_eq!(
            field("delivery.id"),
            Some(serde_json::json!(delivery.id.to_string()))
        );
        assert_eq!(field("attempt"), Some(serde_json::json!(1)));
        let text = lines
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            !text.contains("payload-marker-4242"),
            "payload logged: {text}"
        );
        let secret = endpoint.secret.expose();
        assert!(
            !text.contains(&secret["whsec_".len()..]),
            "secret logged: {text}"
        );
        assert!(!text.contains("v1,"), "signature logged: {text}");
    }

    /// A message whose webhook this environment had no descriptor to send (EMFILE; Lambda
    /// allows 1,024) records no attempt against the endpoint and is not reported failed
    /// (SQS would hand it out again only after its visibility timeout): a copy is put back
    /// on the queue for 2–8 s. Handed in with descriptors to spare, that copy is delivered
    /// at its first attempt.
    #[tokio::test]
    async fn a_message_not_sent_for_want_of_descriptors_is_put_back_within_seconds_with_no_attempt()
    {
        let (settings, mut shape) = emulated_shape().await;
        let receiver = slow_receiver(Duration::from_millis(5)).await;
        let endpoint = acme_sending_to(&shape, &receiver.url).await;
        let published = publish_and_fan_out(&shape, "evt_emfile", serde_json::json!({})).await;
        let delivery = &published.deliveries[0];
        let message = delivery_message(delivery);
        // The fan-out's message, as the sender's trigger takes it off the queue.
        let taken = hooklane_testkit::testing::receive_queued(&settings.queue_url, 1).await;
        assert_eq!(taken.len(), 1, "{taken:?}");
        assert_eq!(taken[0].body(), Some(message.as_str()));
        // What the `HttpSender` answers when the environment is out of file descriptors
        // even after dropping its idle connections: nothing was sent.
        let out_of_descriptors = fixtures::Answering(hooklane::http::OutboundResponse {
            error: Some("not sent: out of file descriptors".into()),
            unsent: Some(hooklane::http::LocalFault::ProcessFileLimit),
            ..Default::default()
        });
        let sender = std::mem::replace(
            &mut shape.app.transport,
            std::sync::Arc::new(out_of_descriptors),
        );

        let began = std::time::Instant::now();
        let response = handle(&shape, batch_of_one(&message)).await;
        let handled = std::time::Instant::now();
        assert!(
            response.batch_item_failures.is_empty(),
            "deleted, not reported failed: {:?}",
            response.batch_item_failures
        );
        assert_eq!(receiver.served.load(Ordering::SeqCst), 0);
        let store = shape.app.store.as_ref();
        let stored = store
            .get_delivery(&endpoint.account_id, &delivery.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (stored.status, stored.attempts, stored.last_error),
            (DeliveryStatus::Pending, 0, None)
        );
        let read = store
            .get_endpoint(&endpoint.account_id, &endpoint.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.failing_since, None, "no failure streak");

        // A copy of its message is on the queue, held back at least 2 s and at most 8 s (the
        // emulator makes it visible within a second or so of its delay; more on a loaded
        // machine, hence the slack).
        assert!(
            hooklane_testkit::testing::receive_queued(&settings.queue_url, 0)
                .await
                .is_empty(),
            "the copy waits its delay"
        );
        let back = hooklane_testkit::testing::receive_queued(&settings.queue_url, 18).await;
        let (since_sent, since_handled) = (began.elapsed(), handled.elapsed());
        assert_eq!(back.len(), 1, "the copy came back: {back:?}");
        let body = back[0].body().unwrap_or_default();
        assert_eq!(body, message, "the delivery's own message");
        assert!(
            since_sent >= Duration::from_secs(2) && since_handled <= Duration::from_secs(15),
            "back {since_sent:?} after the batch began, {since_handled:?} after it ended"
        );

        // Handed in with descriptors to spare now: delivered at its first attempt.
        shape.app.transport = sender;
        let response = handle(&shape, batch_of_one(body)).await;
        assert!(response.batch_item_failures.is_empty());
        assert_eq!(receiver.served.load(Ordering::SeqCst), 1);
        let stored = store
            .get_delivery(&endpoint.account_id, &delivery.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (stored.status, stored.attempts),
            (DeliveryStatus::Delivered, 1)
        );
    }

    fn aws_sdk_dynamodb_value(s: &str) -> hooklane::aws::aws_sdk_dynamodb::types::AttributeValue {
        hooklane::aws::aws_sdk_dynamodb::types::AttributeValue::S(s.to_owned())
    }
}
