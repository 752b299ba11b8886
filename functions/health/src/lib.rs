//! The health function: on a schedule, disables endpoints that have failed for too long
//! (abandoning their pending deliveries, queueing the owner's mail and `endpoint.disabled`),
//! then sends whatever owner mail is still queued.

use hooklane::{
    aws::{handlers::check_health, shape::AwsShape},
    service::ServiceError,
};

pub async fn handle(
    shape: &AwsShape,
    _event: serde_json::Value,
) -> Result<serde_json::Value, ServiceError> {
    Ok(match check_health(shape).await? {
        Some((disabled, mailed)) => serde_json::json!({ "disabled": disabled, "mailed": mailed }),
        None => serde_json::json!({ "skipped": "another health check is under way" }),
    })
}

#[cfg(test)]
mod tests {
    use hooklane::domain::EndpointStatus;
    use hooklane_testkit::{
        fixtures,
        testing::{emulated_shape, sent_mail_text},
    };

    use super::*;

    #[tokio::test]
    async fn a_scheduled_event_disables_a_long_failing_endpoint_and_mails_the_owner() {
        let (mut settings, _) = emulated_shape().await;
        let from = format!("hooklane-{}@example.com", &uuid_like());
        let ses =
            hooklane::aws::aws_sdk_sesv2::Client::new(&hooklane::aws::load_sdk_config().await);
        ses.create_email_identity()
            .email_identity(&from)
            .send()
            .await
            .unwrap();
        settings.notification_from = Some(from);
        let shape = hooklane::aws::shape::connect(&settings).await.unwrap();
        let store = shape.app.store.as_ref();
        let dying = failing_since_t0("ep_dying");
        let healthy = fixtures::endpoint("acme", "ep_fine", fixtures::t0());
        fixtures::create_account_and_endpoints(store, "acme", [&dying, &healthy]).await;

        let scheduled: serde_json::Value =
            serde_json::from_str(include_str!("../fixtures/scheduled-event.json")).unwrap();
        let result = handle(&shape, scheduled).await.unwrap();
        // Disabling mails the owner at once; the flush after it finds nothing left.
        assert_eq!(result, serde_json::json!({"disabled": 1, "mailed": 0}));
        // Listed as of a year on: held mail too.
        let late = hooklane::clock::add(
            shape.app.clock.now(),
            std::time::Duration::from_secs(365 * 86_400),
        );
        assert!(store
            .unsent_notifications(late, 10)
            .await
            .unwrap()
            .is_empty());
        let after = store
            .get_endpoint(&dying.account_id, &dying.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(after.status, EndpointStatus::Disabled);
        let fine = store
            .get_endpoint(&healthy.account_id, &healthy.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(fine.status, EndpointStatus::Active);
        let mail = sent_mail_text().await;
        assert!(
            mail.contains("https://ep_dying.example.com/hooks"),
            "no owner mail in the emulator"
        );
    }

    #[tokio::test]
    async fn disabling_an_endpoint_is_in_the_emf_log() {
        let (metrics, log, _recorder) =
            hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
        let (_, shape) = emulated_shape().await;
        let store = shape.app.store.as_ref();
        let dying = failing_since_t0("ep_dying");
        fixtures::create_account_and_endpoints(store, "acme", [&dying]).await;
        let event = fixtures::event("acme", "evt_stuck", fixtures::t0());
        store
            .publish(
                &event,
                &[fixtures::delivery(&event, &dying, fixtures::t0())],
            )
            .await
            .unwrap();

        let scheduled: serde_json::Value =
            serde_json::from_str(include_str!("../fixtures/scheduled-event.json")).unwrap();
        let result = metrics.flushed(handle(&shape, scheduled)).await.unwrap();
        assert_eq!(result["disabled"], 1);

        assert_eq!(
            log.value(
                "hooklane_endpoints_disabled_total",
                &[("Stack", "hooklane-test")]
            ),
            Some(serde_json::json!(1))
        );
        assert_eq!(
            log.value(
                "hooklane_deliveries_completed_total",
                &[("status", "abandoned")]
            ),
            Some(serde_json::json!(1))
        );
        assert_eq!(
            log.value(
                "hooklane_account_deliveries_total",
                &[("account", "acme"), ("status", "abandoned")]
            ),
            Some(serde_json::json!(1))
        );
    }

    /// An endpoint of acme that has been failing since `t0`, long enough to be disabled.
    fn failing_since_t0(id: &str) -> hooklane::domain::Endpoint {
        let mut endpoint = fixtures::endpoint("acme", id, fixtures::t0());
        endpoint.failing_since = Some(fixtures::t0());
        endpoint
    }

    fn uuid_like() -> String {
        format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )
    }
}
