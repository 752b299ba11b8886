use std::time::Duration;

use super::ServiceResult;
use crate::{
    notify::NotifyError,
    store::{Notification, NotificationFailure},
    App,
};

/// How long a sender holds a notification it took: longer than a send takes, short enough
/// that one whose sender died on the way is sent at a later pass.
const CLAIM: Duration = Duration::from_secs(300);
/// How long mail whose send failed for now waits before it is tried again. On AWS the
/// hourly health run is the next try anyway; `serve` passes every 30 s, and this keeps a
/// relay that is down from being asked twice a minute.
pub const RETRY_AFTER: Duration = Duration::from_secs(15 * 60);
/// Mail still failing this long after it was made is given up: past a weekend of an
/// outage or a sending set-up to mend (the alarm fires every hour meanwhile), and an
/// endpoint's disabling is old news.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(3 * 86_400);
/// Notifications read at a time.
const PAGE: u32 = 100;
/// Pages a pass goes through at most, so that one run (the health function's) is bounded;
/// the next pass goes on.
const PAGES: usize = 5;
/// The most of a failure's text kept with the notification.
const ERROR_KEPT: usize = 1_000;

/// Sends queued owner notifications. Each is claimed first, so that two passes at once
/// (serve's mail loop beside a disabling; on AWS, two functions, or a pass whose listing
/// still shows what the last one sent) mail it once. One that fails is tried again after
/// [`RETRY_AFTER`], unless the notifier refused it for good or it is older than
/// [`GIVE_UP_AFTER`]: then it is given up, kept with its error but no longer read. Mail
/// waiting or given up is read past, so it never holds back what is behind it.
pub async fn flush(app: &App) -> ServiceResult<usize> {
    let mut sent = 0;
    for _ in 0..PAGES {
        let page = app
            .store
            .unsent_notifications(app.clock.now(), PAGE)
            .await?;
        let full = page.len() == PAGE as usize;
        let mut taken = 0;
        for notification in page {
            let now = app.clock.now();
            let until = crate::clock::add(now, CLAIM);
            if !app
                .store
                .claim_notification(&notification.id, now, until)
                .await?
            {
                continue;
            }
            taken += 1;
            match app.notifier.send(&notification).await {
                Ok(()) => {
                    app.store
                        .mark_notification_sent(&notification.id, app.clock.now())
                        .await?;
                    sent += 1;
                }
                Err(error @ NotifyError::Unavailable(_)) => {
                    // The service unreachable, silent or throttling: the rest would most
                    // likely wait out the same timeout each. They go at the next pass; this
                    // one waits its `RETRY_AFTER`, so it does not hold them back then.
                    not_sent(app, &notification, &error).await?;
                    return Ok(sent);
                }
                Err(error) => not_sent(app, &notification, &error).await?,
            }
        }
        // A short page was the last. A page none of which could be taken would come back
        // the same: its mail is another sender's, or the index has not caught up yet.
        if !full || taken == 0 {
            break;
        }
    }
    Ok(sent)
}

/// Records a failed send: given up, or held for [`RETRY_AFTER`]. The metric counts both,
/// making a notifier that keeps failing (an unverified SES identity, a denied send) and mail
/// given up visible; the log says which, with the notifier's error.
async fn not_sent(
    app: &App,
    notification: &Notification,
    error: &NotifyError,
) -> ServiceResult<()> {
    crate::telemetry::notification_failed();
    let now = app.clock.now();
    let text = crate::domain::attempt::cut_to(&error.to_string(), ERROR_KEPT).to_owned();
    let too_old = now
        .signed_duration_since(notification.created_at)
        .to_std()
        .is_ok_and(|age| age >= GIVE_UP_AFTER);
    let failure = if error.is_permanent() || too_old {
        tracing::error!(
            notification.id = %notification.id,
            account.id = %notification.account_id,
            recipient = %notification.recipient.as_str(),
            %error,
            refused_for_good = error.is_permanent(),
            "notification given up: it will not be sent"
        );
        NotificationFailure::GiveUp { error: text }
    } else {
        let at = crate::clock::add(now, RETRY_AFTER);
        tracing::warn!(notification.id = %notification.id, %error, retry_at = %at, "notification not sent; will retry");
        NotificationFailure::Retry { at, error: text }
    };
    app.store
        .mark_notification_failed(&notification.id, now, &failure)
        .await?;
    Ok(())
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
                Err(NotifyError::Unavailable(
                    "AccessDenied: not authorized to send from this identity".into(),
                ))
            } else {
                Ok(())
            }
        }
    }

    /// Every notification still to send, waiting or not.
    async fn every_unsent(store: &dyn Store) -> Vec<Notification> {
        let late = crate::clock::add(fixtures::t0(), 100 * GIVE_UP_AFTER);
        store.unsent_notifications(late, 10).await.unwrap()
    }

    #[tokio::test]
    async fn a_mail_that_cannot_be_sent_for_now_is_counted_and_tried_again_later() {
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
        assert_eq!(every_unsent(&*store).await.len(), 1, "kept");

        notifier.0.store(false, Ordering::SeqCst);
        assert_eq!(flush(&app).await.unwrap(), 0, "it waits");
        clock.advance(CLAIM);
        assert_eq!(flush(&app).await.unwrap(), 0, "longer than a claim");
        clock.advance(RETRY_AFTER - CLAIM);
        assert_eq!(flush(&app).await.unwrap(), 1, "sent once its wait is over");
        assert!(every_unsent(&*store).await.is_empty());
    }

    /// A mail service unavailable ends the pass: a relay that takes 30 s to time out would
    /// take that for every mail. The next pass goes on with the others. A mail failing for
    /// now on its own (its mailbox busy) does not.
    #[tokio::test]
    async fn a_mail_failing_for_now_ends_the_pass_and_the_next_goes_on() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let notifier = Arc::new(Refusing(AtomicBool::new(true)));
        let clock = Arc::new(ManualClock::new(fixtures::t0()));
        let app = App {
            notifier: notifier.clone(),
            ..fixtures::app_on(store.clone(), clock.clone())
        };
        disable_with_mail(&*store).await;
        disable_one_with_mail(&*store, "ep_2", "ntf_2").await;
        disable_one_with_mail(&*store, "ep_3", "ntf_3").await;
        let waiting = |store: Arc<SqliteStore>, at| async move {
            store.unsent_notifications(at, 10).await.unwrap().len()
        };
        assert_eq!(flush(&app).await.unwrap(), 0);
        assert_eq!(
            waiting(store.clone(), fixtures::t0()).await,
            2,
            "one tried, two left untried"
        );
        notifier.0.store(false, Ordering::SeqCst);
        clock.advance(CLAIM);
        assert_eq!(
            flush(&app).await.unwrap(),
            2,
            "the next pass sends the others"
        );

        struct BusyMailbox;
        #[async_trait::async_trait]
        impl Notifier for BusyMailbox {
            async fn send(&self, n: &Notification) -> Result<(), NotifyError> {
                match n.id.as_str() {
                    "ntf_4" => Err(NotifyError::Temporary("452 mailbox busy".into())),
                    _ => Ok(()),
                }
            }
        }
        let app = App {
            notifier: Arc::new(BusyMailbox),
            ..fixtures::app_on(store.clone(), clock.clone())
        };
        disable_one_with_mail(&*store, "ep_4", "ntf_4").await;
        disable_one_with_mail(&*store, "ep_5", "ntf_5").await;
        assert_eq!(
            flush(&app).await.unwrap(),
            1,
            "one busy mailbox holds back none"
        );
    }

    /// A refusal for good is not tried again; nor is mail still failing for now once it is
    /// older than `GIVE_UP_AFTER`. Both are counted.
    #[tokio::test]
    async fn mail_refused_for_good_or_failing_too_long_is_given_up() {
        struct RefusingForGood;
        #[async_trait::async_trait]
        impl Notifier for RefusingForGood {
            async fn send(&self, _: &Notification) -> Result<(), NotifyError> {
                Err(NotifyError::Permanent(
                    "MessageRejected: not verified".into(),
                ))
            }
        }
        for (notifier, age) in [
            (Arc::new(RefusingForGood) as Arc<dyn Notifier>, CLAIM),
            (Arc::new(Refusing(AtomicBool::new(true))), GIVE_UP_AFTER),
        ] {
            let recorder = EmfRecorder::new("Hooklane", Vec::new());
            let _local = metrics::set_default_local_recorder(&recorder);
            let store = Arc::new(SqliteStore::in_memory().unwrap());
            let clock = Arc::new(ManualClock::new(crate::clock::add(fixtures::t0(), age)));
            let app = App {
                notifier,
                ..fixtures::app_on(store.clone(), clock.clone())
            };
            disable_with_mail(&*store).await;
            assert_eq!(flush(&app).await.unwrap(), 0);
            assert!(every_unsent(&*store).await.is_empty(), "given up");
            let late = crate::clock::add(fixtures::t0(), 100 * GIVE_UP_AFTER);
            assert!(!store.claim_notification("ntf_1", late, late).await.unwrap());
            let documents = recorder.flush(0);
            assert!(
                documents
                    .iter()
                    .any(|d| d.get(telemetry::NOTIFICATIONS_FAILED) == Some(&serde_json::json!(1))),
                "{documents:?}"
            );
        }
    }

    /// An endpoint of `acme` disabled with mail for its owner queued.
    async fn disable_with_mail(store: &dyn Store) {
        store
            .create_account(&fixtures::account("acme"))
            .await
            .unwrap();
        disable_one_with_mail(store, "ep_1", "ntf_1").await;
    }

    /// Disables a new failing endpoint `id` of acme, with a mail to its owner, `mail`.
    async fn disable_one_with_mail(store: &dyn Store, id: &str, mail: &str) {
        let mut endpoint = fixtures::endpoint("acme", id, fixtures::t0());
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
                    id: mail.into(),
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
        assert!(every_unsent(&*store).await.is_empty());
    }
}
