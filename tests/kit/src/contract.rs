//! The store contract: what every `Store` adapter must do, as async checks over `&dyn Store`.
//! `store_contract_tests!` turns them into one `#[tokio::test]` each for a given backend;
//! each store's tests run it (DynamoDB's against the emulator). Written with `hooklane::`
//! paths: the core crate compiles this file into its own tests too (see its `lib.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hooklane::store::{
    AuditedChange, DeliveryQuery, DisableRequest, DueCursor, EndpointDeletion, EventDeliveries,
    FannedOut, Notification, PageAfter, PendingRef, PublishOutcome, PutEventOutcome, RecordOutcome,
    Store, StoreError, TokenRef, Unattempted, UnattemptedMove,
};
use hooklane::{
    clock::{add, Timestamp},
    domain::rate::PublishRate,
    domain::{
        AccountId, Decision, Delivery, DeliveryId, DeliveryStatus, EmailAddress, Endpoint,
        EndpointId, EndpointStatus, EndpointUrl, Event, EventId, EventType, EventTypeFilter,
    },
};

// The audit log's checks live in a file of their own; the suite's macro names them here.
pub use crate::audit_contract::{
    audit_log_is_listed_per_account_newest_first_in_pages,
    audited_changes_are_written_with_their_entries,
};
pub use crate::catalog_contract::the_event_type_catalog_is_kept_by_name;
pub use crate::created_contract::every_delivery_written_is_counted_once;
use crate::fixtures::{
    account, account_with_endpoints, attempt_record, delivery, endpoint, event, publish_each,
    publish_one, t0, typed_event,
};
pub use crate::missed_contract::missed_events_are_listed_by_account_and_time;
pub use crate::notification_contract::failed_notifications_wait_or_are_given_up_and_are_read_past;
pub use crate::stats_contract::attempts_are_counted_by_endpoint_and_hour;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Every notification still to send, held by a claim or not: listed as of a year on.
async fn every_unsent(store: &dyn Store) -> Vec<Notification> {
    store
        .unsent_notifications(add(t0(), secs(365 * 86_400)), 10)
        .await
        .unwrap()
}

fn token_ref(account: &AccountId, token_id: &str) -> TokenRef {
    TokenRef {
        account: account.clone(),
        token_id: token_id.to_owned(),
    }
}

fn deletion(ep: &Endpoint, at: Timestamp) -> EndpointDeletion {
    EndpointDeletion {
        account_id: ep.account_id.clone(),
        endpoint_id: ep.id.clone(),
        at,
    }
}

/// Moves `d` on at t0 as if it had been read with `attempts` attempts.
fn seen(d: &Delivery, attempts: u32, change: &Unattempted) -> UnattemptedMove {
    UnattemptedMove {
        expected_attempts: attempts,
        ..UnattemptedMove::of(d, change.clone(), t0())
    }
}

/// An account with one endpoint, and an event with one delivery to it.
async fn seeded(store: &dyn Store) -> (Endpoint, Event, Delivery) {
    let [ep] = account_with_endpoints(store, "acme", ["ep_a"]).await;
    let (ev, d) = publish_one(store, &ep, "evt_1").await;
    (ep, ev, d)
}

/// The delivery as the store holds it now; it must exist.
async fn stored(store: &dyn Store, d: &Delivery) -> Delivery {
    store
        .get_delivery(&d.account_id, &d.id)
        .await
        .unwrap()
        .expect("the delivery is stored")
}

/// The endpoint as the store holds it now; it must exist.
async fn stored_endpoint(store: &dyn Store, ep: &Endpoint) -> Endpoint {
    store
        .get_endpoint(&ep.account_id, &ep.id)
        .await
        .unwrap()
        .expect("the endpoint is stored")
}

/// The first `limit` deliveries due at `at`, in due order.
async fn due_work(store: &dyn Store, at: Timestamp, limit: u32) -> Vec<PendingRef> {
    store
        .pending_deliveries(at, &PageAfter { after: None, limit })
        .await
        .unwrap()
        .refs
}

/// A failed first attempt at `failed_at`, retried at 60 s: the endpoint starts failing then.
async fn fail_first_attempt(store: &dyn Store, d: &Delivery, failed_at: Timestamp) {
    let retry = Decision::RetryAt(add(t0(), secs(60)));
    store
        .record_attempt(&attempt_record(d, 1, retry, false, failed_at))
        .await
        .unwrap();
}

/// Signing secrets, the current and the retiring one, read back as they were written
/// (both stores seal them at rest), through every endpoint read.
pub async fn endpoint_secrets_round_trip(store: &dyn Store) {
    let [mut ep] = account_with_endpoints(store, "acme", ["ep_s"]).await;
    let stored = stored_endpoint(store, &ep).await;
    assert_eq!(stored.secret.expose(), ep.secret.expose());
    let read = ep.version();
    let old = std::mem::replace(&mut ep.secret, hooklane::signing::SigningSecret::generate());
    ep.retiring_secret = Some(hooklane::domain::endpoint::RetiringSecret {
        secret: old,
        until: add(t0(), secs(86_400)),
    });
    store.update_endpoint(&ep, &read).await.unwrap();
    let exposed = |e: &Endpoint| {
        (
            e.secret.expose(),
            e.retiring_secret.as_ref().map(|r| r.secret.expose()),
        )
    };
    assert_eq!(exposed(&stored_endpoint(store, &ep).await), exposed(&ep));
    let listed = store.list_endpoints(&ep.account_id).await.unwrap();
    assert_eq!(
        listed.iter().map(exposed).collect::<Vec<_>>(),
        [exposed(&ep)]
    );

    // Custom headers, a secret one among them, read back through every read, the sender's
    // included; a patch that removes them all leaves none.
    ep.headers = hooklane::domain::headers::CustomHeaders::parse(Some(&serde_json::json!({
        "Authorization": "Bearer abc",
        "X-Tenant": "t_1",
    })))
    .unwrap();
    store.update_endpoint(&ep, &read).await.unwrap();
    assert_eq!(stored_endpoint(store, &ep).await.headers, ep.headers);
    let listed = store.list_endpoints(&ep.account_id).await.unwrap();
    assert_eq!(listed[0].headers, ep.headers);
    let (_, d) = publish_one(store, &ep, "evt_h").await;
    let work = store.load_work(&d.id).await.unwrap().unwrap();
    assert_eq!(work.endpoint.unwrap().headers, ep.headers);
    ep.headers = ep
        .headers
        .patched(Some(
            &serde_json::json!({"authorization": null, "x-tenant": null}),
        ))
        .unwrap();
    store.update_endpoint(&ep, &read).await.unwrap();
    assert!(stored_endpoint(store, &ep).await.headers.is_empty());
}

pub async fn accounts_and_endpoints(store: &dyn Store) {
    let acme = account("acme");
    store.create_account(&acme).await.unwrap();
    assert!(matches!(
        store.create_account(&acme).await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(
        store.get_account(&acme.id).await.unwrap(),
        Some(acme.clone())
    );
    assert_eq!(
        store
            .get_account(&AccountId::parse("nobody").unwrap())
            .await
            .unwrap(),
        None
    );
    // An account's own publish limit is kept, changed and removed.
    let mut limited = acme.clone();
    limited.publish_rate_limit = Some(PublishRate {
        per_second: 5,
        burst: 20,
    });
    limited.name = "Acme Renamed".into();
    store.update_account(&limited).await.unwrap();
    assert_eq!(
        store.get_account(&acme.id).await.unwrap(),
        Some(limited.clone())
    );
    store.update_account(&acme).await.unwrap();
    assert_eq!(
        store.get_account(&acme.id).await.unwrap(),
        Some(acme.clone())
    );
    assert!(matches!(
        store.update_account(&account("nobody")).await,
        Err(StoreError::NotFound(_))
    ));

    let second = endpoint("acme", "ep_b", add(t0(), secs(1)));
    let mut first = endpoint("acme", "ep_a", t0());
    first.event_types = EventTypeFilter::parse(Some(&["invoice.*".to_owned()])).unwrap();
    first.rate_limit_per_second = Some(7);
    store.create_endpoint(&second).await.unwrap();
    store.create_endpoint(&first).await.unwrap();
    assert!(matches!(
        store.create_endpoint(&first).await,
        Err(StoreError::Conflict { .. })
    ));
    let listed = store.list_endpoints(&acme.id).await.unwrap();
    assert_eq!(
        listed,
        vec![first.clone(), second.clone()],
        "oldest first, round-tripped"
    );
    let other = AccountId::parse("other").unwrap();
    assert_eq!(store.get_endpoint(&other, &first.id).await.unwrap(), None);
    assert!(store.list_endpoints(&other).await.unwrap().is_empty());

    let mut changed = first.clone();
    changed.description = "changed".into();
    changed.max_in_flight = 2;
    changed.updated_at = add(t0(), secs(5));
    store
        .update_endpoint(&changed, &first.version())
        .await
        .unwrap();
    assert_eq!(
        store.get_endpoint(&acme.id, &first.id).await.unwrap(),
        Some(changed)
    );
    let missing = endpoint("acme", "ep_missing", t0());
    assert!(matches!(
        store.update_endpoint(&missing, &missing.version()).await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn publish_is_idempotent_on_the_event_id(store: &dyn Store) {
    let [a, b] = account_with_endpoints(store, "acme", ["ep_a", "ep_b"]).await;
    let ev = event("acme", "evt_1", t0());
    let first = vec![delivery(&ev, &a, t0()), delivery(&ev, &b, t0())];
    assert_eq!(
        store.publish(&ev, &first).await.unwrap(),
        PublishOutcome::Created
    );

    let again = event("acme", "evt_1", add(t0(), secs(9)));
    let second = vec![delivery(&again, &a, add(t0(), secs(9)))];
    match store.publish(&again, &second).await.unwrap() {
        PublishOutcome::AlreadyExists { event } => {
            assert_eq!(event, ev, "the first event wins");
            let mut deliveries = store.deliveries_of_event(&ev).await.unwrap();
            deliveries.sort_by(|x, y| x.id.cmp(&y.id));
            let mut expected = first.clone();
            expected.sort_by(|x, y| x.id.cmp(&y.id));
            assert_eq!(deliveries, expected, "nothing new was created");
        }
        other => panic!("second publish created something: {other:?}"),
    }
    assert_eq!(
        store.get_event(&ev.account_id, &ev.id).await.unwrap(),
        Some(ev.clone())
    );
    assert_eq!(store.deliveries_of_event(&ev).await.unwrap().len(), 2);
    let other = AccountId::parse("other").unwrap();
    assert_eq!(store.get_event(&other, &ev.id).await.unwrap(), None);
    assert_eq!(
        store.get_delivery(&other, &first[0].id).await.unwrap(),
        None,
        "a delivery is only visible to its own account"
    );

    // The same event id in another account is another event.
    store.create_account(&account("other")).await.unwrap();
    let theirs = event("other", "evt_1", t0());
    assert_eq!(
        store.publish(&theirs, &[]).await.unwrap(),
        PublishOutcome::Created
    );
}

pub async fn record_attempt_applies_once_per_expected_state(store: &dyn Store) {
    let (ep, ev, d) = seeded(store).await;
    let work = store.load_work(&d.id).await.unwrap().unwrap();
    assert_eq!(work.delivery, d);
    assert_eq!(work.event, Some(ev));
    assert_eq!(work.endpoint.as_ref(), Some(&ep));

    let failed_at = add(t0(), secs(1));
    let retry_at = add(t0(), secs(60));
    let first = attempt_record(&d, 1, Decision::RetryAt(retry_at), false, failed_at);
    assert_eq!(
        store.record_attempt(&first).await.unwrap(),
        RecordOutcome::Recorded {
            endpoint_failing_since: Some(failed_at)
        }
    );
    assert_eq!(
        store.record_attempt(&first).await.unwrap(),
        RecordOutcome::Stale,
        "the same attempt number twice"
    );
    let after = stored(store, &d).await;
    assert_eq!(after.status, DeliveryStatus::Pending);
    assert_eq!(after.attempts, 1);
    assert_eq!(after.next_try_at, Some(retry_at));
    assert_eq!(after.last_status, Some(500));
    assert_eq!(after.last_error.as_deref(), Some("HTTP 500"));

    // A second failure keeps the first failing_since.
    let second = attempt_record(
        &d,
        2,
        Decision::RetryAt(add(t0(), secs(120))),
        false,
        add(t0(), secs(61)),
    );
    assert_eq!(
        store.record_attempt(&second).await.unwrap(),
        RecordOutcome::Recorded {
            endpoint_failing_since: Some(failed_at)
        }
    );
    let third = attempt_record(&d, 3, Decision::Delivered, true, add(t0(), secs(121)));
    assert_eq!(
        store.record_attempt(&third).await.unwrap(),
        RecordOutcome::Recorded {
            endpoint_failing_since: None
        },
        "a success clears failing_since"
    );
    let fourth = attempt_record(&d, 4, Decision::Delivered, true, add(t0(), secs(122)));
    assert_eq!(
        store.record_attempt(&fourth).await.unwrap(),
        RecordOutcome::Stale,
        "a delivered delivery never leaves its final state"
    );
    let done = stored(store, &d).await;
    assert_eq!(done.status, DeliveryStatus::Delivered);
    assert_eq!(done.attempts, 3);
    assert_eq!(done.next_try_at, None);
    assert_eq!(done.last_error, None);
    let attempts = store.list_attempts(&d.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.number).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(attempts[0], first.attempt, "attempts round-trip");
    assert_eq!(stored_endpoint(store, &ep).await.failing_since, None);
    let unknown = attempt_record(
        &delivery(&event("acme", "evt_unknown", t0()), &ep, t0()),
        1,
        Decision::Delivered,
        true,
        t0(),
    );
    assert_eq!(
        store.record_attempt(&unknown).await.unwrap(),
        RecordOutcome::Stale
    );
}

pub async fn failed_is_final(store: &dyn Store) {
    let (_, _, d) = seeded(store).await;
    let failed = attempt_record(
        &d,
        1,
        Decision::Failed {
            reason: "gone".into(),
        },
        false,
        add(t0(), secs(1)),
    );
    assert!(matches!(
        store.record_attempt(&failed).await.unwrap(),
        RecordOutcome::Recorded { .. }
    ));
    let stored = stored(store, &d).await;
    assert_eq!(stored.status, DeliveryStatus::Failed);
    assert_eq!(stored.last_error.as_deref(), Some("HTTP 500 (gone)"));
    assert!(due_work(store, add(t0(), secs(86_400)), 10)
        .await
        .is_empty());
}

pub async fn pending_deliveries_page_in_due_order_and_skip_inactive_endpoints(store: &dyn Store) {
    store.create_account(&account("acme")).await.unwrap();
    let live = endpoint("acme", "ep_live", t0());
    let mut off = endpoint("acme", "ep_off", t0());
    off.status = EndpointStatus::Disabled;
    store.create_endpoint(&live).await.unwrap();
    store.create_endpoint(&off).await.unwrap();
    let mut due = Vec::new();
    for i in 0..7 {
        let ev = event("acme", &format!("evt_{i}"), t0());
        // Due times deliberately out of id order.
        let at = add(t0(), secs(100 - i * 10));
        let d = delivery(&ev, &live, at);
        store
            .publish(&ev, &[d.clone(), delivery(&ev, &off, at)])
            .await
            .unwrap();
        due.push(d);
    }
    let later = event("acme", "evt_later", t0());
    store
        .publish(&later, &[delivery(&later, &live, add(t0(), secs(1000)))])
        .await
        .unwrap();

    let cutoff = add(t0(), secs(100));
    let mut seen = Vec::new();
    let mut after: Option<DueCursor> = None;
    let mut pages = 0;
    loop {
        let page = store
            .pending_deliveries(
                cutoff,
                &PageAfter {
                    after: after.clone(),
                    limit: 3,
                },
            )
            .await
            .unwrap();
        pages += 1;
        assert!(page.refs.len() <= 3);
        for r in &page.refs {
            assert_eq!(r.endpoint_id, live.id, "only active endpoints' work");
            assert_eq!(r.max_in_flight, 4);
            assert!(r.due <= cutoff);
        }
        seen.extend(page.refs.into_iter().map(|r| (r.due, r.delivery_id)));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
        assert!(pages < 10, "the pages never end");
    }
    let mut expected: Vec<(Timestamp, DeliveryId)> = due
        .iter()
        .map(|d| (d.next_try_at.expect("pending"), d.id.clone()))
        .collect();
    expected.sort();
    assert_eq!(seen, expected, "every due delivery once, in due order");
    let early = due_work(store, add(t0(), secs(60)), 100).await;
    assert_eq!(
        early.len(),
        3,
        "only those due at 40, 50 and 60 are due at 60: {early:?}"
    );
}

pub async fn list_deliveries_newest_first_with_filters_and_cursor(store: &dyn Store) {
    store.create_account(&account("acme")).await.unwrap();
    store.create_account(&account("other")).await.unwrap();
    let a = endpoint("acme", "ep_a", t0());
    let b = endpoint("acme", "ep_b", t0());
    let theirs = endpoint("other", "ep_o", t0());
    for e in [&a, &b, &theirs] {
        store.create_endpoint(e).await.unwrap();
    }
    let mut made = Vec::new();
    for i in 0..6u64 {
        let at = add(t0(), secs(i));
        let ev = event("acme", &format!("evt_{i}"), at);
        let target = if i % 2 == 0 { &a } else { &b };
        let d = delivery(&ev, target, at);
        store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
        made.push(d);
    }
    let foreign = event("other", "evt_x", t0());
    store
        .publish(&foreign, &[delivery(&foreign, &theirs, t0())])
        .await
        .unwrap();
    // evt_5 (to b) is delivered.
    let delivered = &made[5];
    store
        .record_attempt(&attempt_record(
            delivered,
            1,
            Decision::Delivered,
            true,
            add(t0(), secs(10)),
        ))
        .await
        .unwrap();

    let acme = AccountId::parse("acme").unwrap();
    let query = |f: &dyn Fn(&mut DeliveryQuery)| {
        let mut q = DeliveryQuery {
            limit: 100,
            ..Default::default()
        };
        f(&mut q);
        q
    };
    let ids = |page: &hooklane::store::Page<Delivery>| {
        page.items.iter().map(|d| d.id.clone()).collect::<Vec<_>>()
    };
    let all = store.list_deliveries(&acme, &query(&|_| {})).await.unwrap();
    let newest_first: Vec<DeliveryId> = made.iter().rev().map(|d| d.id.clone()).collect();
    assert_eq!(ids(&all), newest_first);
    assert_eq!(all.next_cursor, None);

    let of_a = store
        .list_deliveries(&acme, &query(&|q| q.endpoint_id = Some(a.id.clone())))
        .await
        .unwrap();
    assert_eq!(
        ids(&of_a),
        vec![made[4].id.clone(), made[2].id.clone(), made[0].id.clone()]
    );
    let foreign_endpoint = store
        .list_deliveries(&acme, &query(&|q| q.endpoint_id = Some(theirs.id.clone())))
        .await
        .unwrap();
    assert!(
        foreign_endpoint.items.is_empty(),
        "another account's endpoint shows nothing"
    );

    let done = store
        .list_deliveries(
            &acme,
            &query(&|q| q.status = Some(DeliveryStatus::Delivered)),
        )
        .await
        .unwrap();
    assert_eq!(ids(&done), vec![delivered.id.clone()]);
    let ok = store
        .list_deliveries(&acme, &query(&|q| q.status_code = Some(200)))
        .await
        .unwrap();
    assert_eq!(ids(&ok), vec![delivered.id.clone()]);
    let typed = store
        .list_deliveries(&acme, &query(&|q| q.event_type = Some("other.type".into())))
        .await
        .unwrap();
    assert!(typed.items.is_empty());
    let window = store
        .list_deliveries(
            &acme,
            &query(&|q| {
                q.since = Some(add(t0(), secs(1)));
                q.until = Some(add(t0(), secs(3)));
            }),
        )
        .await
        .unwrap();
    assert_eq!(
        ids(&window),
        vec![made[2].id.clone(), made[1].id.clone()],
        "since inclusive, until exclusive"
    );
    let backwards = store
        .list_deliveries(
            &acme,
            &query(&|q| {
                q.since = Some(add(t0(), secs(3)));
                q.until = Some(add(t0(), secs(1)));
            }),
        )
        .await
        .expect("a window that ends before it starts is empty, not an error");
    assert!(backwards.items.is_empty() && backwards.next_cursor.is_none());

    let mut cursor = None;
    let mut paged = Vec::new();
    loop {
        let page = store
            .list_deliveries(
                &acme,
                &query(&|q| {
                    q.limit = 4;
                    q.status = Some(DeliveryStatus::Pending);
                    q.cursor = cursor.clone();
                }),
            )
            .await
            .unwrap();
        assert!(page.items.len() <= 4);
        paged.extend(ids(&page));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(
        paged,
        newest_first[1..].to_vec(),
        "pages of pending, newest first, no gaps"
    );
    let bad = store
        .list_deliveries(&acme, &query(&|q| q.cursor = Some("not-a-cursor".into())))
        .await;
    assert!(bad.is_err());
}

pub async fn failing_endpoints_are_the_active_ones_failing_long_enough(store: &dyn Store) {
    let (ep, _, d) = seeded(store).await;
    let failed_at = add(t0(), secs(10));
    fail_first_attempt(store, &d, failed_at).await;
    assert!(store
        .failing_endpoints(add(t0(), secs(9)))
        .await
        .unwrap()
        .is_empty());
    let failing = store.failing_endpoints(failed_at).await.unwrap();
    assert_eq!(
        failing.iter().map(|e| &e.id).collect::<Vec<_>>(),
        vec![&ep.id]
    );
    assert_eq!(failing[0].failing_since, Some(failed_at));

    let mut disabled = failing[0].clone();
    disabled.status = EndpointStatus::Disabled;
    store
        .update_endpoint(&disabled, &failing[0].version())
        .await
        .unwrap();
    assert!(
        store.failing_endpoints(failed_at).await.unwrap().is_empty(),
        "disabled ones are done"
    );
}

/// What every publish reads, its account and the account's endpoints, is read back as each
/// write left it, whatever was read before: the embedded store keeps both in memory.
pub async fn publish_reads_see_every_change_to_the_account_and_its_endpoints(store: &dyn Store) {
    let later = AccountId::parse("later").unwrap();
    assert_eq!(store.get_account(&later).await.unwrap(), None);
    assert!(store.list_endpoints(&later).await.unwrap().is_empty());
    store.create_account(&account("later")).await.unwrap();
    assert_eq!(
        store.get_account(&later).await.unwrap(),
        Some(account("later")),
        "an account created after it was looked up"
    );

    let [ep] = account_with_endpoints(store, "acme", ["ep_a"]).await;
    let acme = ep.account_id.clone();
    let listed = || async { store.list_endpoints(&acme).await.unwrap() };
    assert_eq!(listed().await, vec![ep.clone()]);
    let second = endpoint("acme", "ep_b", add(t0(), secs(1)));
    store.create_endpoint(&second).await.unwrap();
    assert_eq!(listed().await, vec![ep.clone(), second.clone()], "created");
    let moved = Endpoint {
        url: EndpointUrl::parse("https://moved.example.com/hooks").unwrap(),
        ..second.clone()
    };
    store
        .update_endpoint(&moved, &second.version())
        .await
        .unwrap();
    assert_eq!(listed().await, vec![ep.clone(), moved.clone()], "updated");

    // The failing clock, which attempts start and stop.
    let (_, d) = publish_one(store, &ep, "evt_1").await;
    let failed_at = add(t0(), secs(10));
    fail_first_attempt(store, &d, failed_at).await;
    assert_eq!(listed().await[0].failing_since, Some(failed_at), "started");
    let delivered = attempt_record(&d, 2, Decision::Delivered, true, add(t0(), secs(20)));
    store.record_attempt(&delivered).await.unwrap();
    assert_eq!(listed().await[0].failing_since, None, "stopped");
    let (_, d2) = publish_one(store, &ep, "evt_2").await;
    let failed_again = add(t0(), secs(30));
    fail_first_attempt(store, &d2, failed_again).await;
    assert_eq!(listed().await[0].failing_since, Some(failed_again));
    store
        .disable_endpoint(&disable_request(&ep, Some(failed_again), None))
        .await
        .unwrap()
        .expect("disabled");
    assert_eq!(
        listed().await[0].status,
        EndpointStatus::Disabled,
        "disabled by the sweeper"
    );
    assert!(store
        .delete_endpoint(&deletion(&moved, add(t0(), secs(40))))
        .await
        .unwrap());
    assert_eq!(
        listed().await.iter().map(|e| &e.id).collect::<Vec<_>>(),
        vec![&ep.id],
        "deleted"
    );

    let renamed = hooklane::domain::Account {
        name: "Acme Renamed".into(),
        ..store.get_account(&acme).await.unwrap().unwrap()
    };
    store.update_account(&renamed).await.unwrap();
    assert_eq!(store.get_account(&acme).await.unwrap(), Some(renamed));
}

/// An endpoint is replaced only over the version its change was made from: a change read
/// before another write landed (an API call, a disable) is refused with `Changed` and
/// writes nothing. The sender's failing clock moving meanwhile refuses nothing, and stays.
pub async fn endpoint_updates_apply_only_over_the_version_read(store: &dyn Store) {
    let [ep] = account_with_endpoints(store, "acme", ["ep_v"]).await;
    let stale = |from: &Endpoint| {
        let mut change = from.clone();
        change.description = "stale".into();
        change.touch(add(t0(), secs(1)));
        change
    };
    let mut moved = ep.clone();
    moved.url = EndpointUrl::parse("https://moved.example.com/hooks").unwrap();
    moved.touch(t0());
    assert!(
        moved.updated_at > ep.updated_at,
        "moved on within one millisecond"
    );
    store.update_endpoint(&moved, &ep.version()).await.unwrap();
    let refused = store.update_endpoint(&stale(&ep), &ep.version()).await;
    assert!(
        matches!(refused, Err(StoreError::Changed("endpoint"))),
        "over another change: {refused:?}"
    );
    assert_eq!(
        stored_endpoint(store, &ep).await,
        moved,
        "the first change kept"
    );

    // The sender starting the failing clock after the change was read.
    let (_, d) = publish_one(store, &ep, "evt_v1").await;
    fail_first_attempt(store, &d, add(t0(), secs(10))).await;
    let mut described = moved.clone();
    described.description = "described".into();
    described.touch(add(t0(), secs(1)));
    store
        .update_endpoint(&described, &moved.version())
        .await
        .unwrap();
    let failing = stored_endpoint(store, &ep).await;
    assert_eq!(
        (failing.description.as_str(), failing.failing_since),
        ("described", Some(add(t0(), secs(10)))),
        "the change written, the sender's clock kept"
    );

    // A disable, which does not move the change time when it lands in the same millisecond.
    let mut disable = disable_request(&ep, failing.failing_since, None);
    disable.now = failing.updated_at;
    disable.notification = None;
    store
        .disable_endpoint(&disable)
        .await
        .unwrap()
        .expect("disabled");
    let refused = store
        .update_endpoint(&stale(&failing), &failing.version())
        .await;
    assert!(
        matches!(refused, Err(StoreError::Changed("endpoint"))),
        "over a disable: {refused:?}"
    );
    let disabled = stored_endpoint(store, &ep).await;
    assert_eq!(disabled.status, EndpointStatus::Disabled);
    assert_eq!(
        disabled.description, "described",
        "the refused change wrote nothing"
    );

    // Over the version stored now it is written, the clock restarted; a deleted endpoint
    // is not.
    let mut enabled = disabled.clone();
    enabled.status = EndpointStatus::Active;
    enabled.failing_since = None;
    enabled.disabled_reason = None;
    enabled.touch(add(t0(), secs(2)));
    store
        .update_endpoint(&enabled, &disabled.version())
        .await
        .unwrap();
    assert_eq!(stored_endpoint(store, &ep).await, enabled);
    assert!(store
        .delete_endpoint(&deletion(&ep, add(t0(), secs(3))))
        .await
        .unwrap());
    let gone = store
        .update_endpoint(&stale(&enabled), &enabled.version())
        .await;
    assert!(
        matches!(gone, Err(StoreError::NotFound("endpoint"))),
        "deleted: {gone:?}"
    );
    assert_eq!(
        store.get_endpoint(&ep.account_id, &ep.id).await.unwrap(),
        None
    );
}

/// A create with a limit counts the account's endpoints in its own write: of creates made
/// at once, only as many as there is room for are written; a deleted endpoint gives its
/// place back once.
pub async fn endpoints_are_created_within_their_limit(store: &dyn Store) {
    store.create_account(&account("acme")).await.unwrap();
    let create = |n: u64, limit: usize| AuditedChange::CreateEndpoint {
        endpoint: endpoint("acme", &format!("ep_{n}"), add(t0(), secs(n))),
        limit: Some(limit),
    };
    let changes: Vec<AuditedChange> = (0..5).map(|n| create(n, 2)).collect();
    let write = |n: usize| store.audited_change(&changes[n], &[]);
    let (a, b, c, d, e) = tokio::join!(write(0), write(1), write(2), write(3), write(4));
    let results = [a, b, c, d, e];
    let written: Vec<usize> = (0..5).filter(|&n| results[n].is_ok()).collect();
    assert_eq!(written.len(), 2, "five at once, room for two: {results:?}");
    assert!(
        results
            .iter()
            .flat_map(|r| r.as_ref().err())
            .all(|e| matches!(e, StoreError::LimitReached("endpoints"))),
        "{results:?}"
    );
    let acme = AccountId::parse("acme").unwrap();
    assert_eq!(store.list_endpoints(&acme).await.unwrap().len(), 2);

    // A deletion gives one place back, once however often it is asked.
    let AuditedChange::CreateEndpoint {
        endpoint: first, ..
    } = &changes[written[0]]
    else {
        unreachable!()
    };
    for deleted in [true, false] {
        let at = add(t0(), secs(60));
        assert_eq!(
            store.delete_endpoint(&deletion(first, at)).await.unwrap(),
            deleted
        );
    }
    store.audited_change(&create(7, 2), &[]).await.unwrap();
    let refused = store.audited_change(&create(8, 2), &[]).await;
    assert!(
        matches!(refused, Err(StoreError::LimitReached(_))),
        "{refused:?}"
    );
    // One created without a limit is counted too; a duplicate is a conflict, not counted.
    store
        .create_endpoint(&endpoint("acme", "ep_free", t0()))
        .await
        .unwrap();
    let refused = store.audited_change(&create(8, 3), &[]).await;
    assert!(
        matches!(refused, Err(StoreError::LimitReached(_))),
        "{refused:?}"
    );
    let again = store.audited_change(&create(7, 9), &[]).await;
    assert!(
        matches!(again, Err(StoreError::Conflict { .. })),
        "{again:?}"
    );
    store.audited_change(&create(8, 4), &[]).await.unwrap();
    assert_eq!(store.list_endpoints(&acme).await.unwrap().len(), 4);
}

fn disable_request(
    ep: &Endpoint,
    expected: Option<Timestamp>,
    ops: Option<(Event, Vec<Delivery>)>,
) -> DisableRequest {
    DisableRequest {
        account_id: ep.account_id.clone(),
        endpoint_id: ep.id.clone(),
        reason: "failing for 3 days".into(),
        now: add(t0(), secs(3 * 86_400)),
        expected_failing_since: expected,
        notification: Some(Notification {
            id: format!("ntf_{}", ep.id),
            account_id: ep.account_id.clone(),
            recipient: EmailAddress::parse("owner@example.com").unwrap(),
            subject: "disabled".into(),
            body: "your endpoint".into(),
            created_at: add(t0(), secs(3 * 86_400)),
        }),
        operational_event: ops,
    }
}

pub async fn disable_endpoint_is_conditional_and_complete(store: &dyn Store) {
    let (ep, ev, d) = seeded(store).await;
    // A second delivery that is already final must stay as it is.
    let (_, d2) = publish_one(store, &ep, "evt_2").await;
    store
        .record_attempt(&attempt_record(&d2, 1, Decision::Delivered, true, t0()))
        .await
        .unwrap();
    let failed_at = add(t0(), secs(10));
    fail_first_attempt(store, &d, failed_at).await;

    // The operations account hears about it.
    store.create_account(&account("ops")).await.unwrap();
    let listener = endpoint("ops", "ep_ops", t0());
    store.create_endpoint(&listener).await.unwrap();
    let mut op_event = event("ops", "evt_op", t0());
    op_event.event_type = EventType::parse("endpoint.disabled").unwrap();
    let op_delivery = delivery(&op_event, &listener, t0());
    let ops = Some((op_event.clone(), vec![op_delivery.clone()]));

    let stale = disable_request(&ep, Some(add(failed_at, secs(1))), ops.clone());
    assert_eq!(
        store.disable_endpoint(&stale).await.unwrap(),
        None,
        "failing_since moved on"
    );
    assert!(every_unsent(store).await.is_empty(), "nothing written");
    assert_eq!(
        store
            .get_event(&op_event.account_id, &op_event.id)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        stored_endpoint(store, &ep).await.status,
        EndpointStatus::Active
    );

    let request = disable_request(&ep, Some(failed_at), ops.clone());
    let outcome = store.disable_endpoint(&request).await.unwrap().unwrap();
    assert_eq!(outcome.abandoned, 1);
    let stored = stored_endpoint(store, &ep).await;
    assert_eq!(stored.status, EndpointStatus::Disabled);
    assert_eq!(
        stored.disabled_reason.as_deref(),
        Some("failing for 3 days")
    );
    let abandoned = self::stored(store, &d).await;
    assert_eq!(abandoned.status, DeliveryStatus::Abandoned);
    assert_eq!(abandoned.next_try_at, None);
    assert_eq!(
        abandoned.last_error.as_deref(),
        Some("abandoned: failing for 3 days")
    );
    assert_eq!(
        self::stored(store, &d2).await.status,
        DeliveryStatus::Delivered
    );
    let unsent = every_unsent(store).await;
    assert_eq!(unsent, vec![request.notification.clone().unwrap()]);
    assert_eq!(
        store
            .get_event(&op_event.account_id, &op_event.id)
            .await
            .unwrap(),
        Some(op_event.clone())
    );
    assert_eq!(
        store
            .get_delivery(&op_delivery.account_id, &op_delivery.id)
            .await
            .unwrap(),
        Some(op_delivery)
    );
    let _ = ev;
    assert_eq!(
        store.disable_endpoint(&request).await.unwrap(),
        None,
        "only once"
    );
    assert!(due_work(store, add(t0(), secs(86_400 * 10)), 10)
        .await
        .iter()
        .all(|r| r.endpoint_id != ep.id));
}

/// More work than one DynamoDB transaction holds (100 items): every pending delivery of
/// the disabled endpoint is abandoned, and every operations endpoint gets its delivery.
pub async fn disable_endpoint_handles_more_than_a_transaction_holds(store: &dyn Store) {
    let [ep] = account_with_endpoints(store, "acme", ["ep_many"]).await;
    let pending = publish_each(store, &ep, 230).await;
    let failed_at = add(t0(), secs(10));
    fail_first_attempt(store, &pending[0], failed_at).await;
    store.create_account(&account("ops")).await.unwrap();
    let mut op_event = event("ops", "evt_op_many", t0());
    op_event.event_type = EventType::parse("endpoint.disabled").unwrap();
    let mut op_deliveries = Vec::new();
    for i in 0..150 {
        let listener = endpoint("ops", &format!("ep_ops_{i:03}"), t0());
        store.create_endpoint(&listener).await.unwrap();
        op_deliveries.push(delivery(&op_event, &listener, t0()));
    }
    let request = disable_request(
        &ep,
        Some(failed_at),
        Some((op_event.clone(), op_deliveries.clone())),
    );
    let outcome = store.disable_endpoint(&request).await.unwrap().unwrap();
    assert_eq!(outcome.abandoned, 230);
    for d in &pending {
        let stored = stored(store, d).await;
        assert_eq!(stored.status, DeliveryStatus::Abandoned, "{}", d.id);
    }
    assert!(due_work(store, add(t0(), secs(86_400 * 365)), 1000)
        .await
        .iter()
        .all(|p| p.endpoint_id != ep.id));
    let stored_ops = store.deliveries_of_event(&op_event).await.unwrap();
    assert_eq!(stored_ops.len(), 150);
}

pub async fn notification_outbox(store: &dyn Store) {
    let (ep, _, _) = seeded(store).await;
    let first = disable_request(&ep, None, None);
    store.disable_endpoint(&first).await.unwrap().unwrap();
    let note = first.notification.unwrap();
    let made = note.created_at;
    let unsent_at = |at: u64| async move {
        store
            .unsent_notifications(add(made, secs(at)), 10)
            .await
            .unwrap()
    };
    assert_eq!(unsent_at(0).await, vec![note.clone()], "due once made");
    // One sender at a time: a claim holds until it runs out, and a claim that ran out (its
    // sender died, or failed to send) can be taken again.
    let claim = |at: u64, until: u64| {
        store.claim_notification(&note.id, add(made, secs(at)), add(made, secs(until)))
    };
    assert!(claim(0, 300).await.unwrap(), "unclaimed");
    assert!(unsent_at(299).await.is_empty(), "held by its claim");
    assert!(!claim(299, 599).await.unwrap(), "claimed until 300");
    assert_eq!(
        unsent_at(300).await,
        vec![note.clone()],
        "due again once its claim ran out"
    );
    assert!(claim(300, 600).await.unwrap(), "the claim ran out");
    assert_eq!(
        every_unsent(store).await,
        vec![note.clone()],
        "a claimed notification is not sent yet"
    );
    store
        .mark_notification_sent(&note.id, add(made, secs(1)))
        .await
        .unwrap();
    assert!(every_unsent(store).await.is_empty());
    assert!(
        !claim(900, 1200).await.unwrap(),
        "a sent notification is not sent again, whatever an index still lists"
    );
    assert!(!store
        .claim_notification("ntf_unknown", t0(), add(t0(), secs(300)))
        .await
        .unwrap());
    store
        .mark_notification_sent("ntf_unknown", t0())
        .await
        .unwrap();
}

pub async fn settings_put_if_absent(store: &dyn Store) {
    assert_eq!(store.get_setting("admin_token").await.unwrap(), None);
    assert_eq!(
        store
            .put_setting_if_absent("admin_token", "first")
            .await
            .unwrap(),
        "first"
    );
    assert_eq!(
        store
            .put_setting_if_absent("admin_token", "second")
            .await
            .unwrap(),
        "first"
    );
    assert_eq!(
        store.get_setting("admin_token").await.unwrap().as_deref(),
        Some("first")
    );
}

/// API keys: kept as given (scopes, accounts, digest, times), found by id, listed newest
/// first, revoked once (the first revocation's time stays).
pub async fn api_keys_are_kept_listed_and_revoked(store: &dyn Store) {
    use hooklane::domain::{ApiKey, ApiKeyId, Scope};
    let key = |n: u64, scopes: Vec<Scope>, accounts: Option<Vec<&str>>| ApiKey {
        id: ApiKeyId::generate(),
        name: format!("key {n}"),
        scopes,
        accounts: accounts.map(|ids| {
            ids.into_iter()
                .map(|id| AccountId::parse(id).unwrap())
                .collect()
        }),
        secret_sha256: format!("{n:064x}"),
        created_at: add(t0(), secs(n)),
        created_by: "admin".into(),
        expires_at: (n == 2).then(|| add(t0(), secs(86_400))),
        revoked_at: None,
    };
    let publisher = key(1, vec![Scope::EventsPublish], None);
    let reader = key(
        2,
        vec![Scope::EndpointsRead, Scope::DeliveriesRead],
        Some(vec!["acme", "beta:eu"]),
    );
    assert_eq!(store.get_api_key(&publisher.id).await.unwrap(), None);
    assert!(store.list_api_keys().await.unwrap().is_empty());
    store.create_api_key(&publisher).await.unwrap();
    store.create_api_key(&reader).await.unwrap();
    assert!(matches!(
        store.create_api_key(&publisher).await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(
        store.get_api_key(&reader.id).await.unwrap(),
        Some(reader.clone())
    );
    assert_eq!(
        store.list_api_keys().await.unwrap(),
        vec![reader.clone(), publisher.clone()],
        "newest first"
    );

    let revoked = store
        .revoke_api_key(&publisher.id, add(t0(), secs(60)))
        .await
        .unwrap()
        .expect("the key exists");
    assert_eq!(revoked.revoked_at, Some(add(t0(), secs(60))));
    let again = store
        .revoke_api_key(&publisher.id, add(t0(), secs(90)))
        .await
        .unwrap()
        .expect("the key exists");
    assert_eq!(
        again.revoked_at,
        Some(add(t0(), secs(60))),
        "the first time stays"
    );
    assert_eq!(
        store.get_api_key(&publisher.id).await.unwrap(),
        Some(revoked.clone())
    );
    assert_eq!(
        store.get_api_key(&reader.id).await.unwrap(),
        Some(reader.clone()),
        "another key is untouched"
    );
    assert_eq!(
        store
            .revoke_api_key(&ApiKeyId::generate(), t0())
            .await
            .unwrap(),
        None
    );
}

/// Account tokens revoked one by one (the first time stays, per account) and all of an
/// account's up to a time (only ever moved forward); settings replaced.
pub async fn token_revocations_are_kept_per_account(store: &dyn Store) {
    use hooklane::store::TokenRevocation;
    let acme = AccountId::parse("acme").unwrap();
    let beta = AccountId::parse("beta").unwrap();
    let token = "tok_0192d1f4a5b67c8d9e0f1a2b3c4d5e6f";
    let other = "tok_0192d1f4a5b67c8d9e0f1a2b3c4d5e70";
    assert_eq!(
        store
            .token_revocation(&token_ref(&acme, token))
            .await
            .unwrap(),
        TokenRevocation::default()
    );
    store
        .revoke_token(&token_ref(&acme, token), add(t0(), secs(10)))
        .await
        .unwrap();
    store
        .revoke_token(&token_ref(&acme, token), add(t0(), secs(20)))
        .await
        .unwrap();
    let revoked = store
        .token_revocation(&token_ref(&acme, token))
        .await
        .unwrap();
    assert_eq!(
        revoked.revoked_at,
        Some(add(t0(), secs(10))),
        "the first time stays"
    );
    assert_eq!(revoked.account_tokens_before, None);
    assert!(revoked.revokes(Some(t0())));
    assert_eq!(
        store
            .token_revocation(&token_ref(&acme, other))
            .await
            .unwrap(),
        TokenRevocation::default(),
        "another token is untouched"
    );
    assert_eq!(
        store
            .token_revocation(&token_ref(&beta, token))
            .await
            .unwrap(),
        TokenRevocation::default(),
        "the same id under another account is another token"
    );

    store
        .revoke_account_tokens(&acme, add(t0(), secs(100)))
        .await
        .unwrap();
    store
        .revoke_account_tokens(&acme, add(t0(), secs(50)))
        .await
        .unwrap();
    let all = store
        .token_revocation(&token_ref(&acme, other))
        .await
        .unwrap();
    assert_eq!(all.revoked_at, None);
    assert_eq!(
        all.account_tokens_before,
        Some(add(t0(), secs(100))),
        "an earlier time does not move it back"
    );
    assert!(all.revokes(Some(add(t0(), secs(100)))));
    assert!(
        all.revokes(None),
        "a token that does not say when it was issued"
    );
    assert!(
        !all.revokes(Some(add(t0(), secs(101)))),
        "a token issued afterwards"
    );
    store
        .revoke_account_tokens(&acme, add(t0(), secs(200)))
        .await
        .unwrap();
    assert_eq!(
        store
            .token_revocation(&token_ref(&acme, other))
            .await
            .unwrap()
            .account_tokens_before,
        Some(add(t0(), secs(200)))
    );
    assert_eq!(
        store
            .token_revocation(&token_ref(&beta, other))
            .await
            .unwrap(),
        TokenRevocation::default()
    );

    store
        .put_setting("admin_token_sha256", "one")
        .await
        .unwrap();
    store
        .put_setting("admin_token_sha256", "two")
        .await
        .unwrap();
    assert_eq!(
        store
            .get_setting("admin_token_sha256")
            .await
            .unwrap()
            .as_deref(),
        Some("two")
    );
}

pub async fn delete_endpoint_abandons_pending_and_keeps_history(store: &dyn Store) {
    let (ep, ev, d) = seeded(store).await;
    assert!(store
        .delete_endpoint(&deletion(&ep, add(t0(), secs(5))))
        .await
        .unwrap());
    assert!(!store
        .delete_endpoint(&deletion(&ep, add(t0(), secs(6))))
        .await
        .unwrap());
    assert_eq!(
        store.get_endpoint(&ep.account_id, &ep.id).await.unwrap(),
        None
    );
    let kept = stored(store, &d).await;
    assert_eq!(kept.status, DeliveryStatus::Abandoned);
    assert_eq!(kept.last_error.as_deref(), Some("endpoint deleted"));
    let work = store.load_work(&d.id).await.unwrap().unwrap();
    assert_eq!(work.endpoint, None);
    assert_eq!(work.event, Some(ev.clone()));
    assert!(store
        .list_endpoints(&ep.account_id)
        .await
        .unwrap()
        .is_empty());
    let mut changed = ep.clone();
    changed.description = "back?".into();
    assert!(
        matches!(
            store.update_endpoint(&changed, &ep.version()).await,
            Err(StoreError::NotFound(_))
        ),
        "a deleted endpoint cannot be updated"
    );
    assert_eq!(
        store.deliveries_of_event(&ev).await.unwrap(),
        vec![kept.clone()],
        "a deleted endpoint's deliveries stay the event's"
    );
    // The id can be used again; the old history stays where it was.
    store.create_endpoint(&ep).await.unwrap();
    assert_eq!(
        store.get_endpoint(&ep.account_id, &ep.id).await.unwrap(),
        Some(ep.clone())
    );
    assert!(matches!(
        store.create_endpoint(&ep).await,
        Err(StoreError::Conflict { .. })
    ));
    assert!(due_work(store, add(t0(), secs(86_400)), 10)
        .await
        .is_empty());
}

pub async fn add_deliveries_adds_each_pair_once(store: &dyn Store) {
    let [a, b] = account_with_endpoints(store, "acme", ["ep_a", "ep_b"]).await;
    let ev = event("acme", "evt_outbox", t0());
    assert_eq!(
        store.publish(&ev, &[]).await.unwrap(),
        PublishOutcome::Created
    );
    let first = delivery(&ev, &a, t0());
    let second = delivery(&ev, &b, t0());
    let added = store
        .add_deliveries(std::slice::from_ref(&first))
        .await
        .unwrap();
    assert_eq!(added, vec![first.clone()]);
    let added = store
        .add_deliveries(&[first.clone(), second.clone()])
        .await
        .unwrap();
    assert_eq!(added, vec![second.clone()], "the existing pair is skipped");
    assert!(store
        .add_deliveries(&[first, second])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.deliveries_of_event(&ev).await.unwrap().len(), 2);
    assert_eq!(due_work(store, add(t0(), secs(1)), 10).await.len(), 2);
}

/// A batch answers each item in order: new events are written (with their deliveries, or
/// alone), an id that exists returns the stored event and writes nothing; a second batch
/// over the same ids creates nothing. More than a DynamoDB transaction holds (100) is still one
/// batch to the caller.
pub async fn publish_batch_answers_each_item_once(store: &dyn Store) {
    let [ep] = account_with_endpoints(store, "acme", ["ep_a"]).await;
    let earlier = event("acme", "evt_b0", t0());
    store
        .publish(&earlier, &[delivery(&earlier, &ep, t0())])
        .await
        .unwrap();
    let later = add(t0(), secs(5));
    let events: Vec<Event> = (0..104)
        .map(|i| event("acme", &format!("evt_b{i}"), later))
        .collect();
    let items: Vec<hooklane::store::BatchItem> = events
        .iter()
        .enumerate()
        .map(|(i, ev)| {
            (
                ev.clone(),
                (i % 2 == 0).then(|| vec![delivery(ev, &ep, later)]),
            )
        })
        .collect();
    let outcomes = store.publish_batch(&items).await.unwrap();
    assert_eq!(outcomes.len(), 104);
    match &outcomes[0] {
        PublishOutcome::AlreadyExists { event } => {
            assert_eq!(event, &earlier, "the stored event wins");
            assert_eq!(store.deliveries_of_event(event).await.unwrap().len(), 1);
        }
        other => panic!("evt_b0 existed: {other:?}"),
    }
    assert!(outcomes[1..].iter().all(|o| *o == PublishOutcome::Created));
    for (i, ev) in events.iter().enumerate().skip(1) {
        assert_eq!(
            store
                .get_event(&ev.account_id, &ev.id)
                .await
                .unwrap()
                .as_ref(),
            Some(ev)
        );
        let written = store.deliveries_of_event(ev).await.unwrap().len();
        assert_eq!(written, usize::from(i % 2 == 0), "evt_b{i}");
    }
    let again = store.publish_batch(&items).await.unwrap();
    assert!(
        again
            .iter()
            .all(|o| matches!(o, PublishOutcome::AlreadyExists { .. })),
        "a repeated batch creates nothing"
    );
}

/// An id names one event: another event under a stored id (another type, or other data) is
/// refused with `EventConflict` naming the field, by `publish`, `put_event` and
/// `publish_batch` alike, and writes nothing: of a batch, no item. The same event again (later,
/// its members in another order) is still answered with the stored one; of an erased event
/// only the type is compared.
pub async fn another_event_under_a_stored_id_is_refused_and_writes_nothing(store: &dyn Store) {
    fn refused<T: std::fmt::Debug>(call: &str, result: Result<T, StoreError>, field: &str) {
        match result {
            Err(StoreError::EventConflict(conflict)) => {
                assert_eq!(conflict.field(), field, "{call}: {conflict}");
                assert_eq!(conflict.id().as_str(), "evt_1", "{call}: {conflict}");
            }
            other => panic!("{call}: another event under a stored id was taken: {other:?}"),
        }
    }
    let [ep] = account_with_endpoints(store, "acme", ["ep_a"]).await;
    let acme = AccountId::parse("acme").unwrap();
    let made = |id: &str, kind: &str, data: serde_json::Value| {
        Event::new(
            EventId::parse(id).unwrap(),
            acme.clone(),
            EventType::parse(kind).unwrap(),
            add(t0(), secs(9)),
            &data,
        )
        .unwrap()
    };
    let stored = Event::new(
        EventId::parse("evt_1").unwrap(),
        acme.clone(),
        EventType::parse("invoice.paid").unwrap(),
        t0(),
        &serde_json::json!({"amount": 42.5, "currency": "EUR"}),
    )
    .unwrap();
    let first = delivery(&stored, &ep, t0());
    store
        .publish(&stored, std::slice::from_ref(&first))
        .await
        .unwrap();

    let other_type = made(
        "evt_1",
        "invoice.voided",
        serde_json::json!({"amount": 42.5, "currency": "EUR"}),
    );
    let other_data = made(
        "evt_1",
        "invoice.paid",
        serde_json::json!({"amount": 43, "currency": "EUR"}),
    );
    let later = add(t0(), secs(9));
    for (what, new) in [("type", &other_type), ("data", &other_data)] {
        refused(
            &format!("publish, other {what}"),
            store.publish(new, &[delivery(new, &ep, later)]).await,
            what,
        );
        refused(
            &format!("put_event, other {what}"),
            store.put_event(new).await,
            what,
        );
    }
    // In a batch, whatever its place: nothing of the batch is written.
    let fresh = |id: &str| made(id, "invoice.paid", serde_json::json!({"n": id}));
    let (evt_2, evt_3) = (fresh("evt_2"), fresh("evt_3"));
    refused(
        "publish_batch of events alone",
        store
            .publish_batch(&[
                (evt_2.clone(), None),
                (other_data.clone(), None),
                (evt_3.clone(), None),
            ])
            .await,
        "data",
    );
    refused(
        "publish_batch with deliveries",
        store
            .publish_batch(&[
                (evt_2.clone(), Some(vec![delivery(&evt_2, &ep, later)])),
                (
                    other_type.clone(),
                    Some(vec![delivery(&other_type, &ep, later)]),
                ),
            ])
            .await,
        "type",
    );
    for ev in [&evt_2, &evt_3] {
        assert_eq!(
            store.get_event(&acme, &ev.id).await.unwrap(),
            None,
            "{}: an item of a refused batch was written",
            ev.id
        );
    }
    assert_eq!(
        store.get_event(&acme, &stored.id).await.unwrap(),
        Some(stored.clone()),
        "the stored event is untouched"
    );
    assert_eq!(
        store.deliveries_of_event(&stored).await.unwrap(),
        vec![first.clone()],
        "no delivery was added"
    );

    // The same event again, its members in another order: answered with the stored one.
    let retry = made(
        "evt_1",
        "invoice.paid",
        serde_json::json!({"currency": "EUR", "amount": 42.5}),
    );
    match store
        .publish(&retry, &[delivery(&retry, &ep, later)])
        .await
        .unwrap()
    {
        PublishOutcome::AlreadyExists { event } => {
            assert_eq!(event, stored);
            assert_eq!(
                store.deliveries_of_event(&event).await.unwrap(),
                std::slice::from_ref(&first)
            );
        }
        other => panic!("a retry created something: {other:?}"),
    }
    assert_eq!(
        store.put_event(&retry).await.unwrap(),
        PutEventOutcome::AlreadyExists(stored.clone())
    );
    let outcomes = store
        .publish_batch(&[(retry.clone(), None), (evt_2.clone(), None)])
        .await
        .unwrap();
    assert!(
        matches!(&outcomes[..], [PublishOutcome::AlreadyExists { event, .. }, PublishOutcome::Created] if *event == stored),
        "{outcomes:?}"
    );

    // Erased: its data is gone and cannot be compared; its type still is.
    let at = add(t0(), secs(20));
    store
        .erase_event(&acme, &stored.id, at)
        .await
        .unwrap()
        .unwrap();
    match store.publish(&other_data, &[]).await.unwrap() {
        PublishOutcome::AlreadyExists { event, .. } => assert!(event.is_erased()),
        other => panic!("expected the erased event, got {other:?}"),
    }
    assert!(matches!(
        store.put_event(&other_data).await.unwrap(),
        PutEventOutcome::AlreadyExists(event) if event.is_erased()
    ));
    refused(
        "put_event, erased, other type",
        store.put_event(&other_type).await,
        "type",
    );
    refused(
        "publish_batch, erased, other type",
        store
            .publish_batch(&[(evt_3.clone(), None), (other_type.clone(), None)])
            .await,
        "type",
    );
    assert_eq!(store.get_event(&acme, &evt_3.id).await.unwrap(), None);
}

pub async fn put_event_writes_the_event_alone_once(store: &dyn Store) {
    let [ep] = account_with_endpoints(store, "acme", ["ep_a"]).await;
    let ev = event("acme", "evt_alone", t0());
    assert_eq!(
        store.put_event(&ev).await.unwrap(),
        PutEventOutcome::Created
    );
    assert_eq!(
        store.get_event(&ev.account_id, &ev.id).await.unwrap(),
        Some(ev.clone())
    );
    assert!(
        store.deliveries_of_event(&ev).await.unwrap().is_empty(),
        "no delivery is written with the event"
    );
    assert!(due_work(store, add(t0(), secs(86_400)), 10)
        .await
        .is_empty());

    let again = event("acme", "evt_alone", add(t0(), secs(9)));
    assert_eq!(
        store.put_event(&again).await.unwrap(),
        PutEventOutcome::AlreadyExists(ev.clone()),
        "the first event wins"
    );
    assert_eq!(
        store.get_event(&ev.account_id, &ev.id).await.unwrap(),
        Some(ev.clone())
    );
    // An id published with its deliveries is taken too.
    let published = event("acme", "evt_published", t0());
    store
        .publish(&published, &[delivery(&published, &ep, t0())])
        .await
        .unwrap();
    assert_eq!(
        store.put_event(&published).await.unwrap(),
        PutEventOutcome::AlreadyExists(published.clone())
    );
    // The same id in another account is another event.
    store.create_account(&account("other")).await.unwrap();
    let theirs = event("other", "evt_alone", t0());
    assert_eq!(
        store.put_event(&theirs).await.unwrap(),
        PutEventOutcome::Created
    );
}

/// Paging through filtered listings returns every match once, in order, whatever the page
/// size, across endpoints (a deleted one's history included) and same-millisecond ties.
pub async fn list_deliveries_pages_through_filters_without_gaps(store: &dyn Store) {
    let endpoints = account_with_endpoints(store, "acme", ["ep_a", "ep_b", "ep_c"]).await;
    let mut made = Vec::new();
    for i in 0..18u64 {
        // Pairs of events share a millisecond: ties are ordered by id.
        let at = add(t0(), secs(i / 2));
        let kind = if i % 3 == 1 {
            "order.shipped"
        } else {
            "invoice.paid"
        };
        let ev = typed_event("acme", &format!("evt_{i:02}"), kind, at);
        let targets: Vec<&Endpoint> = if i % 4 == 0 {
            endpoints.iter().collect()
        } else {
            vec![&endpoints[(i % 3) as usize]]
        };
        let ds: Vec<Delivery> = targets.iter().map(|e| delivery(&ev, e, at)).collect();
        store.publish(&ev, &ds).await.unwrap();
        made.extend(ds);
    }
    for d in made.iter().step_by(5) {
        store
            .record_attempt(&attempt_record(
                d,
                1,
                Decision::Delivered,
                true,
                add(t0(), secs(30)),
            ))
            .await
            .unwrap();
    }
    // Others answered 500 and wait for a retry: pending, with a status code.
    for d in made.iter().skip(2).step_by(5) {
        let retry = Decision::RetryAt(add(t0(), secs(90)));
        store
            .record_attempt(&attempt_record(d, 1, retry, false, add(t0(), secs(30))))
            .await
            .unwrap();
    }
    assert!(store
        .delete_endpoint(&deletion(&endpoints[2], add(t0(), secs(40))))
        .await
        .unwrap());

    let acme = AccountId::parse("acme").unwrap();
    let everything = store
        .list_deliveries(
            &acme,
            &DeliveryQuery {
                limit: 500,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut expected_order: Vec<&Delivery> = made.iter().collect();
    expected_order.sort_by(|x, y| (y.created_at, &y.id).cmp(&(x.created_at, &x.id)));
    assert_eq!(
        everything.items.iter().map(|d| &d.id).collect::<Vec<_>>(),
        expected_order.iter().map(|d| &d.id).collect::<Vec<_>>(),
        "the whole log, newest first, ties by id"
    );
    assert_eq!(everything.next_cursor, None);

    let filters: Vec<(&str, DeliveryQuery)> = vec![
        ("none", DeliveryQuery::default()),
        (
            "delivered",
            DeliveryQuery {
                status: Some(DeliveryStatus::Delivered),
                ..Default::default()
            },
        ),
        (
            "abandoned (the deleted endpoint's)",
            DeliveryQuery {
                status: Some(DeliveryStatus::Abandoned),
                ..Default::default()
            },
        ),
        (
            "endpoint b",
            DeliveryQuery {
                endpoint_id: Some(endpoints[1].id.clone()),
                ..Default::default()
            },
        ),
        (
            "deleted endpoint c, status 200",
            DeliveryQuery {
                endpoint_id: Some(endpoints[2].id.clone()),
                status_code: Some(200),
                ..Default::default()
            },
        ),
        (
            "status 200",
            DeliveryQuery {
                status_code: Some(200),
                ..Default::default()
            },
        ),
        (
            "status 500",
            DeliveryQuery {
                status_code: Some(500),
                ..Default::default()
            },
        ),
        (
            "endpoint a, status 500",
            DeliveryQuery {
                endpoint_id: Some(endpoints[0].id.clone()),
                status_code: Some(500),
                ..Default::default()
            },
        ),
        (
            "pending, order.shipped",
            DeliveryQuery {
                status: Some(DeliveryStatus::Pending),
                event_type: Some("order.shipped".into()),
                ..Default::default()
            },
        ),
        (
            "order.shipped, status 200",
            DeliveryQuery {
                event_type: Some("order.shipped".into()),
                status_code: Some(200),
                ..Default::default()
            },
        ),
        (
            "window",
            DeliveryQuery {
                since: Some(add(t0(), secs(2))),
                until: Some(add(t0(), secs(7))),
                status: Some(DeliveryStatus::Pending),
                ..Default::default()
            },
        ),
    ];
    for (name, filter) in filters {
        let expected: Vec<DeliveryId> = everything
            .items
            .iter()
            .filter(|d| {
                filter.status.is_none_or(|s| d.status == s)
                    && filter
                        .endpoint_id
                        .as_ref()
                        .is_none_or(|e| &d.endpoint_id == e)
                    && filter.status_code.is_none_or(|c| d.last_status == Some(c))
                    && filter
                        .event_type
                        .as_deref()
                        .is_none_or(|t| d.event_type.as_str() == t)
                    && filter.since.is_none_or(|t| d.created_at >= t)
                    && filter.until.is_none_or(|t| d.created_at < t)
            })
            .map(|d| d.id.clone())
            .collect();
        assert!(!expected.is_empty(), "{name}: the filter matches something");
        for limit in [1, 2, 5, 100] {
            let mut seen = Vec::new();
            let mut cursor = None;
            for _ in 0..200 {
                let page = store
                    .list_deliveries(
                        &acme,
                        &DeliveryQuery {
                            limit,
                            cursor: cursor.clone(),
                            ..filter.clone()
                        },
                    )
                    .await
                    .unwrap();
                assert!(page.items.len() <= limit as usize, "{name}, limit {limit}");
                seen.extend(page.items.iter().map(|d| d.id.clone()));
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            assert_eq!(
                seen, expected,
                "{name}, limit {limit}: every match once, in order"
            );
        }
    }
}

/// Every attempt comes back from `list_attempts` in order, whatever the store keeps where
/// (DynamoDB keeps a small delivering first try on the delivery itself).
pub async fn list_attempts_returns_every_attempt_in_order(store: &dyn Store) {
    let (ep, _, first_try) = seeded(store).await;
    let delivered = attempt_record(&first_try, 1, Decision::Delivered, true, add(t0(), secs(1)));
    store.record_attempt(&delivered).await.unwrap();
    assert_eq!(
        store.list_attempts(&first_try.id).await.unwrap(),
        vec![delivered.attempt.clone()]
    );
    assert_eq!(
        stored(store, &first_try).await.status,
        DeliveryStatus::Delivered
    );

    let (_, retried) = publish_one(store, &ep, "evt_2").await;
    let failure = attempt_record(
        &retried,
        1,
        Decision::RetryAt(add(t0(), secs(60))),
        false,
        add(t0(), secs(1)),
    );
    let success = attempt_record(&retried, 2, Decision::Delivered, true, add(t0(), secs(61)));
    store.record_attempt(&failure).await.unwrap();
    store.record_attempt(&success).await.unwrap();
    assert_eq!(
        store.list_attempts(&retried.id).await.unwrap(),
        vec![failure.attempt, success.attempt]
    );

    let (_, big) = publish_one(store, &ep, "evt_3").await;
    let mut large = attempt_record(&big, 1, Decision::Delivered, true, add(t0(), secs(2)));
    large.attempt.response_body = "x".repeat(4000);
    store.record_attempt(&large).await.unwrap();
    assert_eq!(
        store.list_attempts(&big.id).await.unwrap(),
        vec![large.attempt]
    );
    assert_eq!(
        store
            .list_attempts(&DeliveryId::parse("dlv_none").unwrap())
            .await
            .unwrap(),
        vec![]
    );
}

/// A delivery's work, read after a publish, reflects every write made since: an endpoint
/// update, the endpoint's failing clock starting, an attempt recorded without a read first.
pub async fn load_work_sees_writes_made_after_the_publish(store: &dyn Store) {
    let (ep, _, d1) = seeded(store).await;
    assert_eq!(
        store
            .load_work(&d1.id)
            .await
            .unwrap()
            .unwrap()
            .endpoint
            .unwrap()
            .url,
        ep.url
    );

    let (ev2, d2) = publish_one(store, &ep, "evt_2").await;
    let moved = Endpoint {
        url: EndpointUrl::parse("https://moved.example.com/hooks").unwrap(),
        updated_at: add(t0(), secs(1)),
        ..ep.clone()
    };
    store.update_endpoint(&moved, &ep.version()).await.unwrap();
    let work = store.load_work(&d2.id).await.unwrap().unwrap();
    assert_eq!(
        work.endpoint.unwrap().url,
        moved.url,
        "the update after the publish is seen"
    );
    assert_eq!(work.event.map(|e| e.id), Some(ev2.id));

    let (_, d3) = publish_one(store, &ep, "evt_3").await;
    let failed_at = add(t0(), secs(2));
    fail_first_attempt(store, &d1, failed_at).await;
    let endpoint = store
        .load_work(&d3.id)
        .await
        .unwrap()
        .unwrap()
        .endpoint
        .unwrap();
    assert_eq!(
        endpoint.failing_since,
        Some(failed_at),
        "the failing clock started after the publish"
    );

    let (_, d4) = publish_one(store, &ep, "evt_4").await;
    // The endpoint is failing already: this attempt changes the delivery alone.
    let retry_at = add(t0(), secs(90));
    let record = attempt_record(
        &d4,
        1,
        Decision::RetryAt(retry_at),
        false,
        add(t0(), secs(3)),
    );
    store.record_attempt(&record).await.unwrap();
    let work = store.load_work(&d4.id).await.unwrap().unwrap();
    assert_eq!(
        work.delivery.attempts, 1,
        "the attempt recorded after the publish is seen"
    );
    assert_eq!(work.delivery.next_try_at, Some(retry_at));
}

/// A pending delivery moved on without an attempt: deferred, it is left out of the due
/// work until its new time; failed, it is final with the reason; either only from the
/// state the caller saw.
pub async fn move_unattempted_changes_only_the_expected_state(store: &dyn Store) {
    let (ep, _, d) = seeded(store).await;
    let due_ids = |at: Timestamp| async move {
        due_work(store, at, 10)
            .await
            .into_iter()
            .map(|r| r.delivery_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(due_ids(add(t0(), secs(1))).await, vec![d.id.clone()]);

    let until = add(t0(), secs(600));
    let defer = Unattempted::Defer(until);
    assert!(
        !store.move_unattempted(&seen(&d, 1, &defer)).await.unwrap(),
        "another attempt count: someone moved it on"
    );
    assert!(store.move_unattempted(&seen(&d, 0, &defer)).await.unwrap());
    assert!(
        due_ids(add(t0(), secs(599))).await.is_empty(),
        "a deferred delivery is not due before its new time"
    );
    assert_eq!(due_ids(add(t0(), secs(601))).await, vec![d.id.clone()]);
    let stored = self::stored(store, &d).await;
    assert_eq!(
        (stored.status, stored.attempts),
        (DeliveryStatus::Pending, 0)
    );

    let fail = Unattempted::Fail("the event is past retention".into());
    assert!(store.move_unattempted(&seen(&d, 0, &fail)).await.unwrap());
    let stored = self::stored(store, &d).await;
    assert_eq!(stored.status, DeliveryStatus::Failed);
    assert_eq!(
        stored.last_error.as_deref(),
        Some("the event is past retention")
    );
    assert!(due_ids(add(t0(), secs(86_400))).await.is_empty());
    assert!(
        !store.move_unattempted(&seen(&d, 0, &defer)).await.unwrap(),
        "failed is final"
    );
    let unknown = DeliveryId::parse("dlv_unknown").unwrap();
    assert!(!store
        .move_unattempted(&UnattemptedMove {
            delivery: unknown.clone(),
            expected_attempts: 0,
            change: defer.clone(),
            at: t0()
        })
        .await
        .unwrap());
    assert_eq!(ep.id, stored.endpoint_id);

    // A delivery its endpoint's disabling missed ends abandoned, and leaves the due work.
    let (_, missed) = publish_one(store, &ep, "evt_missed_by_abandon").await;
    let abandon = Unattempted::Abandon("abandoned: endpoint disabled".into());
    assert!(store
        .move_unattempted(&seen(&missed, 0, &abandon))
        .await
        .unwrap());
    let stored = self::stored(store, &missed).await;
    assert_eq!(stored.status, DeliveryStatus::Abandoned);
    assert_eq!(
        stored.last_error.as_deref(),
        Some("abandoned: endpoint disabled")
    );
    assert!(due_ids(add(t0(), secs(86_400))).await.is_empty());
}

/// Events published with their deliveries never need a fan-out: they are not listed as
/// unfanned, and marking events fanned out (again) is harmless.
pub async fn published_events_are_never_left_unfanned(store: &dyn Store) {
    let (_, ev, d) = seeded(store).await;
    let unfanned = || async {
        let later = add(t0(), secs(86_400));
        store.unfanned_events(None, later, 100).await.unwrap()
    };
    let fanned_out = |event: Event| async move {
        store
            .mark_fanned_out(&[FannedOut {
                event,
                missed: false,
            }])
            .await
            .unwrap();
    };
    let page = unfanned().await;
    assert!(page.events.is_empty(), "{page:?}");
    fanned_out(ev.clone()).await;
    fanned_out(ev.clone()).await;
    assert!(unfanned().await.events.is_empty());
    assert_eq!(store.deliveries_of_event(&ev).await.unwrap(), vec![d]);
    // An event stored alone and then fanned out is not listed either.
    let alone = event("acme", "evt_alone", t0());
    store.put_event(&alone).await.unwrap();
    fanned_out(alone).await;
    assert!(unfanned().await.events.is_empty());
}

/// An event stored alone is listed as unfanned, oldest first and within the window asked
/// for, until its fan-out is marked done; its deliveries, added then, are added once.
/// On DynamoDB the list is a global secondary index, and AWS reads those only eventually
/// consistent (the emulator's reads are consistent at once): an event may be listed a moment
/// after its write, so the listing is polled for. Taking it off is read back from the table
/// itself, consistently.
pub async fn an_event_stored_alone_waits_for_its_fan_out(store: &dyn Store) {
    let [ep] = account_with_endpoints(store, "acme", ["ep_1"]).await;
    let (first, second) = (
        event("acme", "evt_first", t0()),
        event("acme", "evt_second", add(t0(), secs(1))),
    );
    store.put_event(&second).await.unwrap();
    store.put_event(&first).await.unwrap();
    let later = add(t0(), secs(86_400));
    // The page's ids and last time once they are `expected`, or as they were after 5 s.
    let listed = |after: Option<Timestamp>,
                  before: Timestamp,
                  expected: &'static [&'static str]| async move {
        let mut page = store.unfanned_events(after, before, 100).await.unwrap();
        for _ in 0..50 {
            let ids: Vec<&str> = page.events.iter().map(|e| e.id.as_str()).collect();
            if ids == expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            page = store.unfanned_events(after, before, 100).await.unwrap();
        }
        let ids: Vec<String> = page
            .events
            .iter()
            .map(|e| e.id.as_str().to_owned())
            .collect();
        (ids, page.last)
    };
    assert_eq!(
        listed(None, later, &["evt_first", "evt_second"]).await,
        (
            vec!["evt_first".into(), "evt_second".into()],
            Some(second.created_at)
        )
    );
    assert_eq!(
        listed(Some(t0()), later, &["evt_second"]).await.0,
        ["evt_second"],
        "after the first's time"
    );
    assert_eq!(
        listed(None, t0(), &["evt_first"]).await.0,
        ["evt_first"],
        "created at or before t0"
    );
    let d = delivery(&first, &ep, t0());
    assert_eq!(
        store
            .add_deliveries_of(&first, std::slice::from_ref(&d), None)
            .await
            .unwrap(),
        vec![d.clone()]
    );
    assert!(store
        .add_deliveries_of(&first, std::slice::from_ref(&d), None)
        .await
        .unwrap()
        .is_empty());
    store
        .mark_fanned_out(&[FannedOut {
            event: first.clone(),
            missed: false,
        }])
        .await
        .unwrap();
    assert_eq!(listed(None, later, &["evt_second"]).await.0, ["evt_second"]);
    assert_eq!(store.deliveries_of_event(&first).await.unwrap(), vec![d]);
}

/// How far a fan-out cut short got is kept on its event, and only moves forward: a mark at
/// or before the one kept (a second fan-out of the event that is behind) leaves it, as does
/// a mark of an event not stored. Another event's is its own.
pub async fn fan_out_progress_is_kept_and_only_moves_forward(store: &dyn Store) {
    account_with_endpoints(store, "acme", ["ep_1"]).await;
    let (big, other) = (
        event("acme", "evt_big", t0()),
        event("acme", "evt_other", t0()),
    );
    store.put_event(&big).await.unwrap();
    store.put_event(&other).await.unwrap();
    let account = &big.account_id;
    let progress = |id: &'static str| async move {
        store
            .fan_out_progress(account, &EventId::parse(id).unwrap())
            .await
            .unwrap()
            .map(|through| through.as_str().to_owned())
    };
    assert_eq!(progress("evt_big").await, None, "nothing recorded yet");
    let mark = |id: &'static str, through: &'static str| async move {
        store
            .record_fan_out_progress(
                account,
                &EventId::parse(id).unwrap(),
                &EndpointId::parse(through).unwrap(),
            )
            .await
            .unwrap()
    };
    mark("evt_big", "ep_0500").await;
    assert_eq!(progress("evt_big").await.as_deref(), Some("ep_0500"));
    mark("evt_big", "ep_1000").await;
    assert_eq!(progress("evt_big").await.as_deref(), Some("ep_1000"));
    mark("evt_big", "ep_0999").await;
    assert_eq!(
        progress("evt_big").await.as_deref(),
        Some("ep_1000"),
        "a mark behind the kept one leaves it"
    );
    assert_eq!(
        progress("evt_other").await,
        None,
        "another event's is its own"
    );
    mark("evt_missing", "ep_0001").await;
    assert_eq!(progress("evt_missing").await, None, "no event, no mark");
}

/// An event's deliveries a page at a time, in endpoint-id order (neither the endpoints'
/// creation order nor the deliveries' ids), each page up to its limit and with where the next
/// starts while there are more; another event's are not among them. More endpoints than one
/// batch read holds (DynamoDB reads candidates 100 at a time), created in reverse id order.
pub async fn event_deliveries_are_read_a_page_at_a_time(store: &dyn Store) {
    let endpoints: Vec<Endpoint> = (0..230)
        .rev()
        .map(|i| endpoint("acme", &format!("ep_{i:03}"), t0()))
        .collect();
    crate::fixtures::create_account_and_endpoints(store, "acme", &endpoints).await;
    // To every other endpoint: the others are candidates without a delivery.
    let ev = event("acme", "evt_1", t0());
    let mut sent: Vec<Delivery> = endpoints
        .iter()
        .step_by(2)
        .map(|e| delivery(&ev, e, t0()))
        .collect();
    store.publish(&ev, &sent).await.unwrap();
    let other = event("acme", "evt_2", t0());
    let theirs: Vec<Delivery> = endpoints
        .iter()
        .map(|e| delivery(&other, e, t0()))
        .collect();
    store.publish(&other, &theirs).await.unwrap();
    sent.sort_by(|a, b| a.endpoint_id.cmp(&b.endpoint_id));
    assert_ne!(
        sent.iter().map(|d| &d.id).collect::<Vec<_>>(),
        {
            let mut ids: Vec<_> = sent.iter().map(|d| &d.id).collect();
            ids.sort();
            ids
        },
        "the fixture tells endpoint order from id order"
    );
    let ev = &ev;
    let page = |after: Option<&str>, limit: u32| {
        let after = after.map(|a| hooklane::domain::EndpointId::parse(a).unwrap());
        async move {
            store
                .event_deliveries(ev, &PageAfter { after, limit })
                .await
                .unwrap()
        }
    };
    for limit in [1, 7, 60, 114, 115, 500] {
        let mut read: Vec<Delivery> = Vec::new();
        let mut after: Option<String> = None;
        for call in 1.. {
            let got = page(after.as_deref(), limit).await;
            assert!(got.deliveries.len() <= limit as usize, "limit {limit}");
            let end = (read.len() + limit as usize).min(sent.len());
            assert_eq!(
                got.deliveries,
                sent[read.len()..end],
                "limit {limit}, page {call}: the next deliveries by endpoint"
            );
            read.extend(got.deliveries.iter().cloned());
            let Some(next) = got.next else { break };
            assert_eq!(
                Some(&next),
                got.deliveries.last().map(|d| &d.endpoint_id),
                "limit {limit}, page {call}: the next page goes on after its last delivery"
            );
            after = Some(next.as_str().to_owned());
        }
        assert_eq!(read, sent, "limit {limit}: every delivery once");
    }
    // A cursor at an endpoint without a delivery (the event went to ep_001, not ep_000), at
    // one with, or past them all.
    assert_eq!(page(Some("ep_000"), 2).await.deliveries, sent[0..2]);
    assert_eq!(page(Some("ep_001"), 1).await.deliveries, sent[1..2]);
    assert_eq!(page(Some("ep_999"), 10).await, EventDeliveries::default());
    let alone = event("acme", "evt_3", t0());
    store.publish(&alone, &[]).await.unwrap();
    assert_eq!(
        store
            .event_deliveries(&alone, &PageAfter::first(10))
            .await
            .unwrap(),
        EventDeliveries::default()
    );
}

/// Erasure takes the payload and the endpoints' answers, keeps the event and its log, ends
/// what was pending, leaves other events alone, and is idempotent.
pub async fn erase_event_removes_the_content_and_keeps_the_log(store: &dyn Store) {
    let [ep_a, ep_b] = account_with_endpoints(store, "acme", ["ep_a", "ep_b"]).await;
    let ev = event("acme", "evt_gone", t0());
    let (sent, retrying) = (delivery(&ev, &ep_a, t0()), delivery(&ev, &ep_b, t0()));
    store
        .publish(&ev, &[sent.clone(), retrying.clone()])
        .await
        .unwrap();
    let (other, other_delivery) = publish_one(store, &ep_a, "evt_kept").await;
    // A delivered first try (kept inline on DynamoDB), a failed try then a retry pending.
    let mut delivered = attempt_record(&sent, 1, Decision::Delivered, true, add(t0(), secs(1)));
    delivered.attempt.response_body = "echo: {\"n\":\"evt_gone\"}".into();
    store.record_attempt(&delivered).await.unwrap();
    let failure = attempt_record(
        &retrying,
        1,
        Decision::RetryAt(add(t0(), secs(60))),
        false,
        add(t0(), secs(1)),
    );
    store.record_attempt(&failure).await.unwrap();
    let kept = attempt_record(
        &other_delivery,
        1,
        Decision::Delivered,
        true,
        add(t0(), secs(1)),
    );
    store.record_attempt(&kept).await.unwrap();

    let at = add(t0(), secs(5));
    let erasure = store
        .erase_event(&ev.account_id, &ev.id, at)
        .await
        .unwrap()
        .expect("the event exists");
    assert_eq!(erasure.event.erased_at, Some(at));
    assert_eq!(erasure.event.payload, "");
    assert_eq!(erasure.event.data(), serde_json::Value::Null);
    assert_eq!(erasure.ended, 1, "the pending delivery ended");
    assert!(erasure.complete, "two deliveries are erased in one call");
    let stored = store
        .get_event(&ev.account_id, &ev.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, erasure.event);
    assert_eq!(
        (stored.id.clone(), stored.event_type.clone()),
        (ev.id.clone(), ev.event_type.clone())
    );

    let deliveries = store.deliveries_of_event(&ev).await.unwrap();
    assert_eq!(deliveries.len(), 2, "the log keeps both deliveries");
    let ended = deliveries.iter().find(|d| d.id == retrying.id).unwrap();
    assert_eq!(ended.status, DeliveryStatus::Failed);
    assert_eq!(ended.next_try_at, None);
    assert_eq!(
        ended.last_error.as_deref(),
        Some(hooklane::domain::event::EVENT_ERASED)
    );
    let done = deliveries.iter().find(|d| d.id == sent.id).unwrap();
    assert_eq!(done.status, DeliveryStatus::Delivered);
    for d in [&sent, &retrying] {
        let attempts = store.list_attempts(&d.id).await.unwrap();
        assert_eq!(attempts.len(), 1, "attempts stay in the log");
        assert_eq!(attempts[0].response_body, "", "{}", d.id);
        assert_eq!(
            attempts[0].status_code,
            if d.id == sent.id {
                Some(200)
            } else {
                Some(500)
            }
        );
    }
    // Nothing of the ended delivery is due any more.
    let due = due_work(store, add(t0(), secs(3600)), 100).await;
    assert!(due.iter().all(|p| p.delivery_id != retrying.id), "{due:?}");

    // Another event keeps everything.
    assert_eq!(
        store.get_event(&other.account_id, &other.id).await.unwrap(),
        Some(other.clone())
    );
    assert_eq!(
        store.list_attempts(&other_delivery.id).await.unwrap(),
        vec![kept.attempt]
    );

    // Again: nothing changes, the first time stays. Publishing the id again finds it erased.
    let again = store
        .erase_event(&ev.account_id, &ev.id, add(t0(), secs(9)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.event.erased_at, Some(at));
    assert_eq!((again.ended, again.complete), (0, true));
    match store.publish(&ev, &[]).await.unwrap() {
        PublishOutcome::AlreadyExists { event, .. } => assert_eq!(event.erased_at, Some(at)),
        other => panic!("expected the erased event, got {other:?}"),
    }
    assert_eq!(
        store
            .erase_event(&ev.account_id, &EventId::parse("evt_none").unwrap(), at)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .erase_event(&AccountId::parse("other").unwrap(), &ev.id, at)
            .await
            .unwrap(),
        None,
        "another account's event of that id does not exist"
    );
}

/// One `#[tokio::test]` per contract check, each on a fresh store from `$make().await`.
#[macro_export]
macro_rules! store_contract_tests {
    ($make:path) => {
        $crate::store_contract_tests!(@each $make;
            accounts_and_endpoints,
            endpoint_secrets_round_trip,
            publish_is_idempotent_on_the_event_id,
            record_attempt_applies_once_per_expected_state,
            list_attempts_returns_every_attempt_in_order,
            failed_is_final,
            pending_deliveries_page_in_due_order_and_skip_inactive_endpoints,
            list_deliveries_newest_first_with_filters_and_cursor,
            list_deliveries_pages_through_filters_without_gaps,
            failing_endpoints_are_the_active_ones_failing_long_enough,
            disable_endpoint_is_conditional_and_complete,
            disable_endpoint_handles_more_than_a_transaction_holds,
            publish_reads_see_every_change_to_the_account_and_its_endpoints,
            endpoint_updates_apply_only_over_the_version_read,
            endpoints_are_created_within_their_limit,
            notification_outbox,
            failed_notifications_wait_or_are_given_up_and_are_read_past,
            settings_put_if_absent,
            delete_endpoint_abandons_pending_and_keeps_history,
            add_deliveries_adds_each_pair_once,
            put_event_writes_the_event_alone_once,
            another_event_under_a_stored_id_is_refused_and_writes_nothing,
            publish_batch_answers_each_item_once,
            load_work_sees_writes_made_after_the_publish,
            move_unattempted_changes_only_the_expected_state,
            published_events_are_never_left_unfanned,
            an_event_stored_alone_waits_for_its_fan_out,
            erase_event_removes_the_content_and_keeps_the_log,
            event_deliveries_are_read_a_page_at_a_time,
            api_keys_are_kept_listed_and_revoked,
            token_revocations_are_kept_per_account,
            audit_log_is_listed_per_account_newest_first_in_pages,
            audited_changes_are_written_with_their_entries,
            attempts_are_counted_by_endpoint_and_hour,
            the_event_type_catalog_is_kept_by_name,
            missed_events_are_listed_by_account_and_time,
            every_delivery_written_is_counted_once,
            fan_out_progress_is_kept_and_only_moves_forward,
        );
    };
    (@each $make:path; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let store = $make().await;
                $crate::contract::$check(&store).await;
            }
        )*
    };
}
