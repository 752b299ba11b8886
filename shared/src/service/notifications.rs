use super::ServiceResult;
use crate::App;

/// How long a sender holds a notification it took: longer than a send takes, short enough
/// that one whose sender died on the way is sent at a later pass.
const CLAIM: std::time::Duration = std::time::Duration::from_secs(300);

/// Sends queued owner notifications; a failed one stays queued, for the first pass after its
/// claim has run out. Each is claimed first, so that two passes at once (serve's mail loop
/// beside a disabling; on AWS, two functions, or a pass whose listing still shows what the
/// last one sent) mail it once.
pub async fn flush(app: &App) -> ServiceResult<usize> {
    let mut sent = 0;
    for notification in app.store.unsent_notifications(100).await? {
        let now = app.clock.now();
        let until = crate::clock::add(now, CLAIM);
        if !app
            .store
            .claim_notification(&notification.id, now, until)
            .await?
        {
            continue;
        }
        match app.notifier.send(&notification).await {
            Ok(()) => {
                app.store
                    .mark_notification_sent(&notification.id, app.clock.now())
                    .await?;
                sent += 1;
            }
            // Kept in the outbox: the next run tries it again. The metric makes a notifier
            // that keeps failing (an unverified SES identity, a denied send) visible.
            Err(error) => {
                crate::telemetry::notification_failed();
                tracing::warn!(notification.id = %notification.id, %error, "notification not sent; will retry");
            }
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };

    use super::*;
    use crate::{
        clock::ManualClock,
        domain::EmailAddress,
        fixtures,
        notify::{Notifier, NotifyError},
        store::{sqlite::SqliteStore, DisableRequest, Notification, Store},
        telemetry::{self, emf::EmfRecorder},
    };

    /// Refuses to send until told otherwise, as SES does for an identity it has not verified.
    struct Refusing(AtomicBool);

    #[async_trait::async_trait]
    impl Notifier for Refusing {
        async fn send(&self, _: &Notification) -> Result<(), NotifyError> {
            if self.0.load(Ordering::SeqCst) {
                Err(NotifyError(
                    "AccessDenied: not authorized to send from this identity".into(),
                ))
            } else {
                Ok(())
            }
        }
    }

    #[tokio::test]
    async fn a_mail_that_cannot_be_sent_is_counted_and_kept_for_the_next_run() {
        let recorder = EmfRecorder::new("Hooklane", Vec::new());
        let _local = metrics::set_default_local_recorder(&recorder);
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let notifier = Arc::new(Refusing(AtomicBool::new(true)));
        let clock = Arc::new(ManualClock::new(fixtures::t0()));
        let app = App {
            notifier: notifier.clone(),
            ..fixtures::app_on(store.clone(), clock.clone())
        };
        disable_with_mail(&*store).await;

        assert_eq!(flush(&app).await.unwrap(), 0);
        let documents = recorder.flush(0);
        assert!(
            documents
                .iter()
                .any(|d| d.get(telemetry::NOTIFICATIONS_FAILED) == Some(&serde_json::json!(1))),
            "{documents:?}"
        );
        assert_eq!(
            store.unsent_notifications(10).await.unwrap().len(),
            1,
            "kept"
        );

        notifier.0.store(false, Ordering::SeqCst);
        assert_eq!(flush(&app).await.unwrap(), 0, "its claim has not run out");
        clock.advance(CLAIM);
        assert_eq!(flush(&app).await.unwrap(), 1, "sent on the next run");
        assert!(store.unsent_notifications(10).await.unwrap().is_empty());
    }

    /// An endpoint of `acme` disabled with mail for its owner queued.
    async fn disable_with_mail(store: &dyn Store) {
        store
            .create_account(&fixtures::account("acme"))
            .await
            .unwrap();
        let mut endpoint = fixtures::endpoint("acme", "ep_1", fixtures::t0());
        endpoint.failing_since = Some(fixtures::t0());
        store.create_endpoint(&endpoint).await.unwrap();
        store
            .disable_endpoint(&DisableRequest {
                account_id: endpoint.account_id.clone(),
                endpoint_id: endpoint.id.clone(),
                reason: "failing for 3 days".into(),
                now: fixtures::t0(),
                expected_failing_since: Some(fixtures::t0()),
                notification: Some(Notification {
                    id: "ntf_1".into(),
                    account_id: endpoint.account_id.clone(),
                    recipient: EmailAddress::parse("owner@acme.example").unwrap(),
                    subject: "Webhook endpoint disabled".into(),
                    body: "…".into(),
                    created_at: fixtures::t0(),
                }),
                operational_event: None,
            })
            .await
            .unwrap();
    }

    /// Takes a while to send, as SES does, and counts what it sent.
    struct Slow(std::sync::atomic::AtomicUsize);

    #[async_trait::async_trait]
    impl Notifier for Slow {
        async fn send(&self, _: &Notification) -> Result<(), NotifyError> {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// Two passes at once (serve's mail loop and a disabling's own pass) both list the mail;
    /// its owner gets it once.
    #[tokio::test]
    async fn two_passes_at_once_send_a_mail_once() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let notifier = Arc::new(Slow(std::sync::atomic::AtomicUsize::new(0)));
        let app = App {
            notifier: notifier.clone(),
            ..fixtures::app_on(store.clone(), Arc::new(ManualClock::new(fixtures::t0())))
        };
        disable_with_mail(&*store).await;
        let (first, second) = tokio::join!(flush(&app), flush(&app));
        assert_eq!(first.unwrap() + second.unwrap(), 1);
        assert_eq!(notifier.0.load(Ordering::SeqCst), 1, "mails sent");
        assert!(store.unsent_notifications(10).await.unwrap().is_empty());
    }
}
