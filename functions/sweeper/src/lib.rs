//! The sweeper function: on a schedule, fans out the events whose stream record never
//! completed fan-out (dropped after the stream's retries, or lost), hands every pending
//! delivery that is past its due time by more than the grace period back to the queue (its
//! message was lost, or its schedule never fired), reports the due backlog (the
//! `hooklane_due_backlog` and `hooklane_oldest_due_age_seconds` metrics), and finishes the
//! erasures a `DELETE` left unfinished. The scheduled event's content does not matter.

use hooklane::aws::{
    handlers::{sweep, SWEEP_EVERY},
    shape::AwsShape,
};

pub async fn handle(
    shape: &AwsShape,
    grace: std::time::Duration,
    _event: serde_json::Value,
) -> Result<serde_json::Value, hooklane::service::ServiceError> {
    Ok(match sweep(shape, grace, SWEEP_EVERY).await? {
        Some(report) => serde_json::json!({ "requeued": report.requeued, "due": report.due }),
        None => serde_json::json!({ "skipped": "another sweep is under way" }),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hooklane_testkit::{fixtures, testing::emulated_shape};

    use super::*;

    fn scheduled() -> serde_json::Value {
        serde_json::from_str(include_str!("../fixtures/scheduled-event.json")).unwrap()
    }

    /// The ids of the events still waiting for fan-out, as of a minute after `now`.
    async fn left_unfanned(
        store: &dyn hooklane::store::Store,
        now: hooklane::clock::Timestamp,
    ) -> Vec<String> {
        let cutoff = hooklane::clock::add(now, Duration::from_secs(60));
        let page = store.unfanned_events(None, cutoff, 10).await.unwrap();
        page.events.iter().map(|e| e.id.to_string()).collect()
    }

    /// A shape with account acme and its endpoint ep_1, and the event `id` published, not
    /// fanned out, a day longer ago than the events' retention.
    async fn unfanned_past_the_retention(
        id: &str,
    ) -> (
        hooklane::aws::settings::AwsSettings,
        AwsShape,
        hooklane::domain::Event,
    ) {
        let (settings, shape) = emulated_shape().await;
        let store = shape.app.store.as_ref();
        fixtures::account_with_endpoints(store, "acme", ["ep_1"]).await;
        let retention = hooklane::store::dynamodb::Retention::default().events;
        let long_ago = hooklane::clock::from_millis(
            hooklane::clock::to_millis(shape.app.clock.now())
                - retention.as_millis() as i64
                - 86_400_000,
        );
        let event = fixtures::event("acme", id, long_ago);
        store.put_event(&event).await.unwrap();
        (settings, shape, event)
    }

    #[tokio::test]
    async fn an_event_whose_stream_record_was_lost_is_fanned_out_by_the_sweeper() {
        let (settings, shape) = emulated_shape().await;
        let store = shape.app.store.as_ref();
        fixtures::account_with_endpoints(store, "acme", ["ep_1"]).await;
        // Accepted ten minutes ago; its stream record never reached fan-out (Lambda gave up
        // on the batch, or the local runner died). And one accepted just now, whose record
        // the stream is still to deliver.
        let now = shape.app.clock.now();
        let lost = fixtures::event(
            "acme",
            "evt_lost_record",
            hooklane::clock::from_millis(hooklane::clock::to_millis(now) - 600_000),
        );
        let fresh = fixtures::event("acme", "evt_fresh_record", now);
        for event in [&lost, &fresh] {
            store.put_event(event).await.unwrap();
        }

        let (metrics, log, _recorder) =
            hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
        metrics
            .flushed(handle(&shape, Duration::from_secs(300), scheduled()))
            .await
            .unwrap();
        let deliveries = store.deliveries_of_event(&lost).await.unwrap();
        assert_eq!(deliveries.len(), 1, "the lost event got its delivery");
        assert!(
            store.deliveries_of_event(&fresh).await.unwrap().is_empty(),
            "an event within the grace period is left to the stream"
        );
        assert_eq!(
            log.value(
                "hooklane_events_recovered_total",
                &[("Stack", "hooklane-test")]
            ),
            Some(serde_json::json!(1))
        );
        let queued = hooklane_testkit::testing::receive_queued(&settings.queue_url, 1).await;
        assert_eq!(queued.len(), 1, "its delivery was queued");
        assert!(queued[0]
            .body()
            .unwrap_or_default()
            .contains(deliveries[0].id.as_str()));

        // Marked done: the next sweep leaves it alone.
        assert_eq!(left_unfanned(store, now).await, vec!["evt_fresh_record"]);
    }

    /// An event whose fan-out keeps failing is pending work, which is never removed: TTL
    /// (modelled here; the emulator deletes nothing) leaves it, however far past the
    /// retention, and the sweeper still fans it out. Its TTL is set then, past the retries
    /// its deliveries start.
    #[tokio::test]
    async fn an_event_unfanned_for_longer_than_the_retention_is_still_fanned_out() {
        let (settings, shape, event) = unfanned_past_the_retention("evt_long_unfanned").await;
        let store = shape.app.store.as_ref();
        let now = shape.app.clock.now();
        let retention = hooklane::store::dynamodb::Retention::default();

        let client = shape.store.client();
        let expired =
            hooklane_testkit::testing::expire_as_ttl_would(client, &settings.tables.events, now)
                .await;
        assert_eq!(expired, 0, "TTL deleted the unfanned event");
        handle(&shape, Duration::from_secs(300), scheduled())
            .await
            .unwrap();
        assert_eq!(store.deliveries_of_event(&event).await.unwrap().len(), 1);
        let item =
            hooklane_testkit::testing::stored_event_item(&shape.store, "acme", "evt_long_unfanned")
                .await;
        let expires: i64 = item["expires_at"].as_n().unwrap().parse().unwrap();
        let retries_end =
            hooklane::clock::to_millis(now) / 1000 + retention.retries.as_secs() as i64;
        assert!(
            (retries_end..retries_end + 60).contains(&expires),
            "expires at {expires}, not when its delivery's retries end ({retries_end})"
        );
        let before_the_end = hooklane::clock::from_millis((retries_end - 1) * 1000);
        assert_eq!(
            hooklane_testkit::testing::expire_as_ttl_would(
                client,
                &settings.tables.events,
                before_the_end
            )
            .await,
            0,
            "TTL deleted the event before its delivery's retries end"
        );
    }

    /// An outbox writer's own TTL holds before fan-out. When it comes before the end of the
    /// retries the fan-out starts, on time or late, the fan-out moves it there, as a replay
    /// does (docs/OUTBOX.md): pending work is never removed.
    #[tokio::test]
    async fn a_fan_out_moves_the_writers_ttl_past_its_retries() {
        use hooklane::aws::aws_sdk_dynamodb::types::AttributeValue;
        let (settings, shape) = emulated_shape().await;
        let store = shape.app.store.as_ref();
        fixtures::account_with_endpoints(store, "acme", ["ep_1"]).await;
        let now = shape.app.clock.now();
        let now_secs = hooklane::clock::to_millis(now) / 1000;
        let minutes_ago =
            |m: i64| hooklane::clock::from_millis(hooklane::clock::to_millis(now) - m * 60_000);
        // Both expire in an hour, as their writer set: one created 20 minutes ago, the
        // other long ago (its fan-out is late).
        let recent = fixtures::event("acme", "evt_recent_own_ttl", minutes_ago(20));
        let late = fixtures::event("acme", "evt_late_own_ttl", minutes_ago(40 * 24 * 60));
        for event in [&recent, &late] {
            store.put_event(event).await.unwrap();
            shape
                .store
                .client()
                .update_item()
                .table_name(&settings.tables.events)
                .key("account_id", AttributeValue::S("acme".into()))
                .key("id", AttributeValue::S(event.id.to_string()))
                .update_expression("SET expires_at = :at")
                .expression_attribute_values(
                    ":at",
                    AttributeValue::N((now_secs + 3_600).to_string()),
                )
                .send()
                .await
                .unwrap();
        }

        handle(&shape, Duration::from_secs(300), scheduled())
            .await
            .unwrap();
        let expiry = |id: &'static str| {
            let store = &shape.store;
            async move {
                let item = hooklane_testkit::testing::stored_event_item(store, "acme", id).await;
                item["expires_at"].as_n().unwrap().parse::<i64>().unwrap()
            }
        };
        let retries = hooklane::store::dynamodb::Retention::default()
            .retries
            .as_secs() as i64;
        for id in ["evt_recent_own_ttl", "evt_late_own_ttl"] {
            assert!(
                expiry(id).await >= now_secs + retries,
                "{id} expires before its deliveries' retries end"
            );
        }
    }

    /// A late fan-out (here of an event older than the retention) that fails once its
    /// deliveries exist (the queue refuses them) leaves its event unfanned, and still with no
    /// TTL: had it been given one for its deliveries' retries, a fan-out failing for longer
    /// would lose it all the same.
    #[tokio::test]
    async fn a_late_fan_out_that_fails_leaves_its_event_without_a_ttl() {
        let (settings, shape, event) = unfanned_past_the_retention("evt_late_failing").await;
        let store = shape.app.store.as_ref();
        let now = shape.app.clock.now();
        hooklane::aws::aws_sdk_sqs::Client::new(&hooklane::aws::load_sdk_config().await)
            .delete_queue()
            .queue_url(&settings.queue_url)
            .send()
            .await
            .unwrap();

        let result = handle(&shape, Duration::from_secs(300), scheduled()).await;
        assert!(result.is_err(), "the queue refused the deliveries");
        assert_eq!(store.deliveries_of_event(&event).await.unwrap().len(), 1);
        assert_eq!(left_unfanned(store, now).await, vec!["evt_late_failing"]);
        let item =
            hooklane_testkit::testing::stored_event_item(&shape.store, "acme", "evt_late_failing")
                .await;
        assert_eq!(item.get("expires_at"), None, "an unfanned event has a TTL");
    }

    /// An event the sweeper cannot fan out (its account's endpoints cannot be read) does
    /// not hold back the events behind it.
    #[tokio::test]
    async fn one_event_that_cannot_be_fanned_out_does_not_hold_back_the_others() {
        use hooklane::aws::aws_sdk_dynamodb::types::AttributeValue;
        let (settings, shape) = emulated_shape().await;
        let store = shape.app.store.as_ref();
        fixtures::account_with_endpoints(store, "acme", ["ep_1"]).await;
        // Another account, which exists (an unknown one is rejected before its endpoints
        // are read), with an endpoint item that cannot be read.
        store
            .create_account(&fixtures::account("broken"))
            .await
            .unwrap();
        shape
            .store
            .client()
            .put_item()
            .table_name(&settings.tables.endpoints)
            .item("account_id", AttributeValue::S("broken".into()))
            .item("id", AttributeValue::S("ep_bad".into()))
            .item("status", AttributeValue::N("7".into()))
            .send()
            .await
            .unwrap();
        let now = shape.app.clock.now();
        let minutes_ago =
            |m: i64| hooklane::clock::from_millis(hooklane::clock::to_millis(now) - m * 60_000);
        let stuck = fixtures::event("broken", "evt_stuck", minutes_ago(20));
        let behind = fixtures::event("acme", "evt_behind", minutes_ago(10));
        for event in [&stuck, &behind] {
            store.put_event(event).await.unwrap();
        }

        let result = handle(&shape, Duration::from_secs(300), scheduled()).await;
        assert!(
            result.is_err(),
            "the run reports the event it could not fan out"
        );
        assert_eq!(
            store.deliveries_of_event(&behind).await.unwrap().len(),
            1,
            "the event behind it was fanned out"
        );
        assert_eq!(
            left_unfanned(store, now).await,
            vec!["evt_stuck"],
            "the stuck one waits for the next run"
        );
    }

    #[tokio::test]
    async fn a_scheduled_event_requeues_overdue_deliveries() {
        let (settings, shape) = emulated_shape().await;
        let store = shape.app.store.as_ref();
        let [endpoint] = fixtures::account_with_endpoints(store, "acme", ["ep_1"]).await;
        // Published 7 minutes ago; its queue message was lost.
        let published = shape.app.clock.now() - Duration::from_secs(420);
        let event = fixtures::event("acme", "evt_lost", published);
        let delivery = fixtures::delivery(&event, &endpoint, published);
        store.publish(&event, &[delivery]).await.unwrap();
        let (metrics, log, _recorder) =
            hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
        let result = metrics
            .flushed(handle(&shape, Duration::from_secs(300), scheduled()))
            .await
            .unwrap();
        assert_eq!(result, serde_json::json!({"requeued": 1, "due": 1}));
        // The due backlog, as the dashboard and the overdue alarm read it.
        assert_eq!(
            log.value("hooklane_due_backlog", &[("Stack", "hooklane-test")]),
            Some(serde_json::json!(1.0))
        );
        let overdue = log
            .value(
                "hooklane_oldest_due_age_seconds",
                &[("Stack", "hooklane-test")],
            )
            .and_then(|v| v.as_f64())
            .unwrap();
        let expected = (shape.app.clock.now() - published).num_seconds() as f64;
        assert!(
            (overdue - expected).abs() < 60.0,
            "{overdue} s overdue, expected about {expected}"
        );
        // The next sweep, a moment later, sends no copy: its message is in the queue.
        let again = handle(&shape, Duration::from_secs(300), scheduled()).await;
        assert_eq!(again.unwrap(), serde_json::json!({"requeued": 0, "due": 1}));
        let sqs = hooklane::aws::aws_sdk_sqs::Client::new(&hooklane::aws::load_sdk_config().await);
        let messages = sqs
            .receive_message()
            .queue_url(&settings.queue_url)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        assert_eq!(messages.len(), 1);
        assert!(messages[0]
            .body()
            .unwrap_or_default()
            .contains("\"account_id\":\"acme\""));
    }

    /// A sweep that starts while another holds the run lock (its invocation waited in
    /// Lambda's queue past the next one's start) stops at once; the next sweep runs.
    #[tokio::test]
    async fn a_sweep_started_while_another_runs_does_nothing() {
        let (_settings, shape) = emulated_shape().await;
        let store = shape.app.store.as_ref();
        let [endpoint] = fixtures::account_with_endpoints(store, "acme", ["ep_1"]).await;
        let now = shape.app.clock.now();
        let published = now - Duration::from_secs(420);
        let event = fixtures::event("acme", "evt_lost", published);
        let delivery = fixtures::delivery(&event, &endpoint, published);
        store.publish(&event, &[delivery]).await.unwrap();
        let running = shape
            .store
            .take_run(
                "sweep",
                now,
                hooklane::clock::add(now, Duration::from_secs(240)),
            )
            .await
            .unwrap()
            .expect("no sweep runs yet");
        let result = handle(&shape, Duration::from_secs(300), scheduled()).await;
        assert_eq!(
            result.unwrap(),
            serde_json::json!({"skipped": "another sweep is under way"})
        );
        shape.store.release_run(&running).await.unwrap();
        let result = handle(&shape, Duration::from_secs(300), scheduled()).await;
        assert_eq!(
            result.unwrap(),
            serde_json::json!({"requeued": 1, "due": 1})
        );
    }
}
