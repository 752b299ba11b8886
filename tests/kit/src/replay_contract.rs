//! What every `Store` must do for replays, as a test any adapter can run:
//! `replays_follow_the_contract(&store).await`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use hooklane::{
    clock::Timestamp,
    domain::{
        Account, AccountId, Decision, DeliveryId, DeliveryStatus, EmailAddress, Endpoint,
        EndpointId, EventType, ReplayFilter, ReplayId, ReplayScope, Trigger,
    },
    store::{DisableRequest, PendingRef, ReplayOutcome, ReplayRequest, Store, StoreError},
};

use crate::fixtures::{at, attempt, endpoint, failed, publish, replay, status_of};

/// Replays what `filter` picks of the endpoint's deliveries, requested at `second`, up to
/// `limit` of them.
async fn replay_endpoint(
    store: &dyn Store,
    account: &AccountId,
    endpoint: &EndpointId,
    filter: ReplayFilter,
    second: i64,
    limit: u32,
) -> ReplayOutcome {
    let scope = ReplayScope::Endpoint(endpoint.clone());
    let replay = replay(account, scope, filter, second);
    store
        .replay(&ReplayRequest { replay, limit })
        .await
        .expect("replay")
}

/// Replays the one delivery, requested at `second`.
async fn replay_delivery(
    store: &dyn Store,
    account: &AccountId,
    delivery: &DeliveryId,
    second: i64,
) -> ReplayOutcome {
    let scope = ReplayScope::Delivery(delivery.clone());
    let replay = replay(account, scope, ReplayFilter::single(), second);
    store
        .replay(&ReplayRequest { replay, limit: 1 })
        .await
        .expect("replay")
}

pub async fn replays_follow_the_contract(store: &dyn Store) {
    let account = AccountId::from_trusted("acme".into());
    let other_account = AccountId::from_trusted("other".into());
    for id in [&account, &other_account] {
        store
            .create_account(&Account {
                id: id.clone(),
                name: id.to_string(),
                owner_email: EmailAddress::from_trusted(format!("ops@{id}.example")),
                created_at: at(0),
                publish_rate_limit: None,
            })
            .await
            .expect("account");
    }
    let main = Endpoint {
        max_in_flight: 7,
        ..endpoint("acme", "ep_main", at(0))
    };
    let second = endpoint("acme", "ep_second", at(0));
    let closed = endpoint("acme", "ep_closed", at(0));
    for e in [&main, &second, &closed] {
        store.create_endpoint(e).await.expect("endpoint");
    }
    // main: 10 failed, 20 delivered, 30 failed (user.created), 40 still pending.
    let d10 = publish(store, &account, 10, "invoice.paid", &[&main, &second]).await;
    let d20 = publish(store, &account, 20, "invoice.paid", &[&main]).await;
    let d30 = publish(store, &account, 30, "user.created", &[&main, &second]).await;
    let d40 = publish(store, &account, 40, "invoice.paid", &[&main, &closed]).await;
    attempt(store, &d10[0].id, 11, failed()).await;
    attempt(store, &d10[1].id, 11, failed()).await;
    attempt(store, &d20[0].id, 21, Decision::Delivered).await;
    attempt(store, &d30[0].id, 31, failed()).await;
    attempt(store, &d30[1].id, 31, failed()).await;
    // closed: disabled while its delivery was pending, so that one is abandoned.
    store
        .disable_endpoint(&DisableRequest {
            account_id: account.clone(),
            endpoint_id: closed.id.clone(),
            reason: "test".into(),
            now: at(45),
            expected_failing_since: None,
            notification: None,
            operational_event: None,
        })
        .await
        .expect("disable")
        .expect("disabled");
    assert_eq!(
        status_of(store, &account, &d40[1].id).await.status,
        DeliveryStatus::Abandoned
    );

    // Bulk on main since 15: failed ones only (the delivered and the pending stay).
    let bulk = ReplayFilter::bulk(at(15), None, None, vec![], false).expect("filter");
    let outcome = replay_endpoint(store, &account, &main.id, bulk, 50, 100).await;
    assert_eq!((outcome.replay.count, outcome.replay.more), (1, false));
    assert_eq!(
        outcome.queued,
        vec![PendingRef {
            delivery_id: d30[0].id.clone(),
            endpoint_id: main.id.clone(),
            account_id: account.clone(),
            due: at(50),
            max_in_flight: 7,
            rate_limit_per_second: None,
        }]
    );
    let replayed = status_of(store, &account, &d30[0].id).await;
    assert_eq!(replayed.status, DeliveryStatus::Pending);
    assert_eq!(replayed.next_try_at, Some(at(50)));
    assert_eq!(replayed.attempts, 1, "attempt numbers keep counting");
    assert_eq!(replayed.schedule_start, 1, "the schedule starts over");
    assert_eq!(replayed.next_trigger, Trigger::Manual);
    assert_eq!(replayed.client_error_count, 0);
    for untouched in [&d10[0].id, &d20[0].id, &d40[0].id, &d30[1].id] {
        let d = status_of(store, &account, untouched).await;
        assert_eq!(d.next_trigger, Trigger::Scheduled, "{untouched}");
    }
    assert!(store
        .pending_deliveries(at(50), &hooklane::store::PageAfter::first(100))
        .await
        .expect("pending")
        .refs
        .iter()
        .any(|p| p.delivery_id == d30[0].id));

    // The manual attempt is recorded as such, and the next one is scheduled again.
    attempt(store, &d30[0].id, 51, Decision::RetryAt(at(80))).await;
    let attempts = store.list_attempts(&d30[0].id).await.expect("attempts");
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.number, a.trigger))
            .collect::<Vec<_>>(),
        [(1, Trigger::Scheduled), (2, Trigger::Manual)]
    );
    let after = status_of(store, &account, &d30[0].id).await;
    assert_eq!(
        (after.attempts, after.next_trigger),
        (2, Trigger::Scheduled)
    );
    assert_eq!(after.schedule_start, 1);

    // Event-type and time filters, and `until`.
    let filter = ReplayFilter::bulk(
        at(5),
        Some(at(25)),
        Some(vec![DeliveryStatus::Failed, DeliveryStatus::Delivered]),
        vec![EventType::parse("invoice.paid").expect("type")],
        false,
    )
    .expect("filter");
    let outcome = replay_endpoint(store, &account, &main.id, filter.clone(), 60, 100).await;
    let mut queued: Vec<_> = outcome.queued.iter().map(|p| &p.delivery_id).collect();
    queued.sort();
    let mut expected = vec![&d10[0].id, &d20[0].id];
    expected.sort();
    assert_eq!(queued, expected);

    // A single delivery: any final status, but not on a disabled endpoint.
    let outcome = replay_delivery(store, &account, &d40[1].id, 70).await;
    assert_eq!(outcome.replay.count, 0, "the endpoint is disabled");
    let outcome = replay_delivery(store, &account, &d10[1].id, 71).await;
    assert_eq!(outcome.replay.count, 1);
    // Already pending now: a second request touches nothing.
    let outcome = replay_delivery(store, &account, &d10[1].id, 72).await;
    assert_eq!(outcome.replay.count, 0);

    // The limit is honoured oldest first, and `more` says there is more.
    let everything = ReplayFilter::bulk(at(0), None, None, vec![], false).expect("filter");
    attempt(store, &d10[1].id, 73, failed()).await;
    let outcome = replay_endpoint(store, &account, &second.id, everything.clone(), 80, 1).await;
    assert_eq!((outcome.replay.count, outcome.replay.more), (1, true));
    assert_eq!(outcome.queued[0].delivery_id, d10[1].id);
    let outcome = replay_endpoint(store, &account, &second.id, everything, 81, 1).await;
    assert_eq!((outcome.replay.count, outcome.replay.more), (1, false));
    assert_eq!(outcome.queued[0].delivery_id, d30[1].id);

    // The audit trail: every request, newest first, paged, this account's only.
    let nowhere = EndpointId::from_trusted("ep_none".into());
    replay_endpoint(
        store,
        &other_account,
        &nowhere,
        ReplayFilter::single(),
        90,
        10,
    )
    .await;
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_replays(
                &account,
                &hooklane::store::PageAfter {
                    after: after.clone(),
                    limit: 3,
                },
            )
            .await
            .expect("list");
        all.extend(page.items);
        match page.next_cursor {
            Some(cursor) => after = Some(ReplayId::from_trusted(cursor)),
            None => break,
        }
    }
    assert_eq!(all.len(), 7);
    let times: Vec<Timestamp> = all.iter().map(|r| r.requested_at).collect();
    assert_eq!(
        times,
        [81, 80, 72, 71, 70, 60, 50].map(at).to_vec(),
        "newest first"
    );
    assert_eq!(
        all.iter().map(|r| r.count).collect::<Vec<_>>(),
        [1, 1, 0, 1, 0, 2, 1]
    );
    let filtered = &all[5];
    assert_eq!(filtered.scope, ReplayScope::Endpoint(main.id.clone()));
    assert_eq!(filtered.filter, filter);
    assert_eq!(filtered.actor, "admin");
    assert_eq!(all[4].scope, ReplayScope::Delivery(d40[1].id.clone()));

    // A replay whose id is already on record is refused and changes nothing, whether it
    // matches deliveries (d20's, failed again) or none (d40's, on the disabled endpoint).
    attempt(store, &d20[0].id, 91, failed()).await;
    for (taken, delivery) in [(&all[0], &d20[0].id), (&all[1], &d40[1].id)] {
        let mut again = replay(
            &account,
            ReplayScope::Delivery(delivery.clone()),
            ReplayFilter::single(),
            92,
        );
        again.id = taken.id.clone();
        let refused = store
            .replay(&ReplayRequest {
                replay: again,
                limit: 1,
            })
            .await;
        assert!(
            matches!(
                refused,
                Err(StoreError::Conflict {
                    entity: "replay",
                    ..
                })
            ),
            "{refused:?}"
        );
    }
    assert_eq!(
        status_of(store, &account, &d20[0].id).await.status,
        DeliveryStatus::Failed
    );
    let first = store
        .list_replays(&account, &hooklane::store::PageAfter::first(10))
        .await
        .expect("list");
    assert_eq!(first.items, all, "the records on file are as they were");
}
