//! The sweeper function: on a schedule, hands every pending delivery that is past its due
//! time by more than the grace period back to the queue (its message was lost, or its
//! schedule never fired), and reports the due backlog (the `hooklane_due_backlog` and
//! `hooklane_oldest_due_age_seconds` metrics). The scheduled event's content does not matter.

use hooklane::aws::{handlers::sweep, shape::AwsShape};

pub async fn handle(
    shape: &AwsShape,
    grace: std::time::Duration,
    _event: serde_json::Value,
) -> Result<serde_json::Value, hooklane::service::ServiceError> {
    let report = sweep(shape, grace).await?;
    Ok(serde_json::json!({ "requeued": report.requeued, "due": report.due }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hooklane::{store::contract, testing::emulated_shape};

    use super::*;

    #[tokio::test]
    async fn a_scheduled_event_requeues_overdue_deliveries() {
        let (settings, shape) = emulated_shape().await;
        let store = &shape.app.store;
        store
            .create_account(&contract::account("acme"))
            .await
            .unwrap();
        let endpoint = contract::endpoint("acme", "ep_1", contract::t0());
        store.create_endpoint(&endpoint).await.unwrap();
        // Published long ago; its queue message was lost.
        let event = contract::event("acme", "evt_lost", contract::t0());
        let delivery = contract::delivery(&event, &endpoint, contract::t0());
        store.publish(&event, &[delivery]).await.unwrap();
        let scheduled: serde_json::Value =
            serde_json::from_str(include_str!("../fixtures/scheduled-event.json")).unwrap();
        let (metrics, log, _recorder) = hooklane::testing::capture_lambda_metrics("hooklane-test");
        let result = metrics
            .flushed(handle(&shape, Duration::from_secs(300), scheduled.clone()))
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
        let expected = (shape.app.clock.now() - contract::t0()).num_seconds() as f64;
        assert!(
            (overdue - expected).abs() < 60.0,
            "{overdue} s overdue, expected about {expected}"
        );
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
}
