//! Owner mail whose send failed: the store holds it for a retry or keeps it given up, and
//! reads past both (the contract check); and `notifications::flush` gives up mail the
//! notifier refuses for good, which then keeps no other mail from being sent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use hooklane::{
    clock::{add, ManualClock, Timestamp},
    domain::{EmailAddress, Endpoint},
    notify::{Notifier, NotifyError},
    service::notifications::flush,
    store::{DisableRequest, Notification, NotificationFailure, Store},
};

use crate::fixtures::{account, app_on, endpoint, t0};

const DAY: Duration = Duration::from_secs(86_400);

/// Disables `ep` with mail to `recipient` queued, made at `at`; returns the mail.
async fn disable_with_mail(
    store: &dyn Store,
    ep: &Endpoint,
    recipient: &str,
    at: Timestamp,
) -> Notification {
    store.create_endpoint(ep).await.unwrap();
    let notification = Notification {
        id: format!("ntf_{}", ep.id),
        account_id: ep.account_id.clone(),
        recipient: EmailAddress::parse(recipient).unwrap(),
        subject: "Webhook endpoint disabled".into(),
        body: "We disabled your endpoint.".into(),
        created_at: at,
    };
    let request = DisableRequest {
        account_id: ep.account_id.clone(),
        endpoint_id: ep.id.clone(),
        reason: "failing for 3 days".into(),
        now: at,
        expected_failing_since: None,
        notification: Some(notification.clone()),
        operational_event: None,
    };
    store.disable_endpoint(&request).await.unwrap().unwrap();
    notification
}

/// A failed send either holds the notification until its retry (read past meanwhile, then
/// read after the mail that was due before it) or gives it up (never read or claimed again);
/// a failure of mail no longer unsent changes nothing.
pub async fn failed_notifications_wait_or_are_given_up_and_are_read_past(store: &dyn Store) {
    store.create_account(&account("acme")).await.unwrap();
    let made = add(t0(), 3 * DAY);
    let second = |n: u64| add(made, Duration::from_secs(n));
    let mut mail = Vec::new();
    for (i, id) in ["ep_a", "ep_b", "ep_c"].into_iter().enumerate() {
        let ep = endpoint("acme", id, t0());
        mail.push(disable_with_mail(store, &ep, "owner@acme.example", second(i as u64)).await);
    }
    let [a, b, c] = <[Notification; 3]>::try_from(mail).unwrap();
    let unsent_at = |at: Timestamp| async move {
        let listed = store.unsent_notifications(at, 10).await.unwrap();
        listed.into_iter().map(|n| n.id).collect::<Vec<_>>()
    };
    let ids = |list: &[&Notification]| list.iter().map(|n| n.id.clone()).collect::<Vec<_>>();
    assert_eq!(
        unsent_at(second(2)).await,
        ids(&[&a, &b, &c]),
        "oldest first"
    );
    assert_eq!(
        unsent_at(second(1)).await,
        ids(&[&a, &b]),
        "not before it is made"
    );

    // `a` failed for now: it waits until 900, read past meanwhile, then behind the others.
    assert!(store
        .claim_notification(&a.id, second(10), second(310))
        .await
        .unwrap());
    let retry = NotificationFailure::Retry {
        at: second(900),
        error: "TooManyRequestsException: slow down".into(),
    };
    store
        .mark_notification_failed(&a.id, second(10), &retry)
        .await
        .unwrap();
    assert_eq!(unsent_at(second(899)).await, ids(&[&b, &c]), "a waits");
    assert!(!store
        .claim_notification(&a.id, second(899), second(1_199))
        .await
        .unwrap());
    assert_eq!(
        unsent_at(second(900)).await,
        ids(&[&b, &c, &a]),
        "due again, after what was due before"
    );
    let first = store.unsent_notifications(second(900), 1).await.unwrap();
    assert_eq!(first, vec![b.clone()], "the limit takes the soonest due");

    // `b` is refused for good: given up, never read or claimed again.
    assert!(store
        .claim_notification(&b.id, second(20), second(320))
        .await
        .unwrap());
    let give_up = NotificationFailure::GiveUp {
        error: "MessageRejected: Email address is not verified.".into(),
    };
    store
        .mark_notification_failed(&b.id, second(20), &give_up)
        .await
        .unwrap();
    let late = add(made, 365 * DAY);
    assert_eq!(unsent_at(late).await, ids(&[&c, &a]));
    assert!(
        !store
            .claim_notification(&b.id, late, add(late, DAY))
            .await
            .unwrap(),
        "given up"
    );
    // A failure recorded for mail given up or sent meanwhile changes nothing.
    store
        .mark_notification_failed(&b.id, late, &retry)
        .await
        .unwrap();
    store
        .mark_notification_sent(&c.id, second(30))
        .await
        .unwrap();
    store
        .mark_notification_failed(&c.id, second(30), &retry)
        .await
        .unwrap();
    assert_eq!(unsent_at(late).await, ids(&[&a]));
    store
        .mark_notification_failed("ntf_unknown", late, &give_up)
        .await
        .unwrap();
}

/// SES's answer to mail it will never send (in the sandbox, to an address not verified).
struct RefusesBad {
    tried: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Notifier for RefusesBad {
    async fn send(&self, n: &Notification) -> Result<(), NotifyError> {
        self.tried.lock().unwrap().push(n.id.clone());
        if n.recipient.as_str().starts_with("bad@") {
            Err(NotifyError::Permanent(
                "MessageRejected: Email address is not verified.".into(),
            ))
        } else {
            Ok(())
        }
    }
}

/// One owner whose address can never be mailed has 101 endpoints disabled together, more
/// than a page of the outbox; another owner's mail, made after, is still sent, and each
/// refused mail is tried once, then given up.
pub async fn mail_refused_for_good_holds_back_no_other(store: Arc<dyn Store>) {
    store.create_account(&account("acme")).await.unwrap();
    store.create_account(&account("zeta")).await.unwrap();
    let made = add(t0(), 3 * DAY);
    for i in 0..101u64 {
        let ep = endpoint("acme", &format!("ep_{i:03}"), t0());
        let at = add(made, Duration::from_millis(i));
        disable_with_mail(&*store, &ep, "bad@acme.example", at).await;
    }
    let good = endpoint("zeta", "ep_good", t0());
    disable_with_mail(&*store, &good, "owner@zeta.example", add(made, DAY)).await;

    let notifier = Arc::new(RefusesBad {
        tried: Mutex::new(Vec::new()),
    });
    let clock = Arc::new(ManualClock::new(add(made, 2 * DAY)));
    let app = hooklane::App {
        notifier: notifier.clone(),
        ..app_on(store.clone(), clock.clone())
    };
    // Two passes, the second past any claim or wait the first left.
    let first = flush(&app).await.unwrap();
    clock.advance(Duration::from_secs(3_600));
    let second = flush(&app).await.unwrap();

    let tried = notifier.tried.lock().unwrap().clone();
    assert_eq!(
        tried.iter().filter(|id| *id == "ntf_ep_good").count(),
        1,
        "the good mail is sent once, behind 101 refused"
    );
    assert_eq!(first + second, 1, "sent");
    assert_eq!(
        tried.len(),
        102,
        "each refused mail is tried once: {tried:?}"
    );
    let late = add(made, 365 * DAY);
    assert!(
        store
            .unsent_notifications(late, 10)
            .await
            .unwrap()
            .is_empty(),
        "the refused mail is given up, no longer read"
    );
    assert!(!store
        .claim_notification("ntf_ep_000", late, add(late, DAY))
        .await
        .unwrap());
}
