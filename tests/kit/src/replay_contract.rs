//! What every `Store` must do for replays, as a test any adapter can run:
//! `replays_follow_the_contract(&store).await`. Written with `hooklane::` paths, like
//! `contract`, so that the core crate's own tests compile it too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use hooklane::{
    clock::{from_millis, Timestamp},
    domain::{
        Account, AccountId, Attempt, Decision, Delivery, DeliveryId, DeliveryStatus, EmailAddress,
        Endpoint, EndpointId, EndpointStatus, EndpointUrl, Event, EventId, EventType,
        EventTypeFilter, Replay, ReplayFilter, ReplayId, ReplayScope, Trigger,
    },
    signing::SigningSecret,
    store::{AttemptRecord, DisableRequest, PendingRef, RecordOutcome, ReplayRequest, Store},
};

pub fn at(seconds: i64) -> Timestamp {
    from_millis(1_900_000_000_000 + seconds * 1000)
}

pub fn endpoint(account: &AccountId, name: &str, max_in_flight: u32) -> Endpoint {
    Endpoint {
        id: EndpointId::from_trusted(format!("ep_{name}")),
        account_id: account.clone(),
        url: EndpointUrl::parse(&format!("https://{name}.example/hook")).expect("url"),
        description: String::new(),
        secret: SigningSecret::generate(),
        retiring_secret: None,
        status: EndpointStatus::Active,
        event_types: EventTypeFilter::parse(None).expect("filter"),
        max_in_flight,
        rate_limit_per_second: None,
        failing_since: None,
        disabled_reason: None,
        created_at: at(0),
        updated_at: at(0),
    }
}

/// Publishes an event at `second` to `endpoints`; returns its deliveries in that order.
pub async fn publish(
    store: &dyn Store,
    account: &AccountId,
    second: i64,
    event_type: &str,
    endpoints: &[&Endpoint],
) -> Vec<Delivery> {
    let event = Event::new(
        EventId::from_trusted(format!("evt_{second}")),
        account.clone(),
        EventType::parse(event_type).expect("type"),
        at(second),
        &serde_json::json!({"at": second}),
    )
    .expect("event");
    let deliveries: Vec<Delivery> = endpoints
        .iter()
        .map(|e| Delivery::new_pending(&event, e.id.clone(), at(second)))
        .collect();
    store.publish(&event, &deliveries).await.expect("publish");
    deliveries
}

/// One attempt; `decision` decides what the delivery becomes.
pub async fn attempt(
    store: &dyn Store,
    delivery: &DeliveryId,
    endpoint: &EndpointId,
    second: i64,
    decision: Decision,
) -> RecordOutcome {
    let current = store
        .load_work(delivery)
        .await
        .expect("load")
        .expect("work")
        .delivery;
    let success = decision == Decision::Delivered;
    store
        .record_attempt(&AttemptRecord {
            attempt: Attempt {
                delivery_id: delivery.clone(),
                number: current.attempts + 1,
                trigger: current.next_trigger,
                started_at: at(second),
                latency_ms: 5,
                status_code: Some(if success { 200 } else { 500 }),
                response_headers: vec![],
                response_body: String::new(),
                response_body_truncated: false,
                error: (!success).then(|| "HTTP 500".to_owned()),
            },
            expected_attempts: current.attempts,
            decision,
            client_error_count: current.client_error_count + 1,
            endpoint_id: endpoint.clone(),
            success,
            now: at(second),
        })
        .await
        .expect("record")
}

pub fn failed() -> Decision {
    Decision::Failed {
        reason: "retry schedule exhausted".into(),
    }
}

pub fn replay(
    account: &AccountId,
    scope: ReplayScope,
    filter: ReplayFilter,
    second: i64,
) -> Replay {
    Replay {
        id: ReplayId::generate(),
        account_id: account.clone(),
        actor: "admin".into(),
        scope,
        filter,
        requested_at: at(second),
        count: 0,
        more: false,
    }
}

pub async fn status_of(store: &dyn Store, account: &AccountId, id: &DeliveryId) -> Delivery {
    store
        .get_delivery(account, id)
        .await
        .expect("get")
        .expect("delivery")
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
            })
            .await
            .expect("account");
    }
    let main = endpoint(&account, "main", 7);
    let second = endpoint(&account, "second", 4);
    let closed = endpoint(&account, "closed", 4);
    for e in [&main, &second, &closed] {
        store.create_endpoint(e).await.expect("endpoint");
    }
    // main: 10 failed, 20 delivered, 30 failed (user.created), 40 still pending.
    let d10 = publish(store, &account, 10, "invoice.paid", &[&main, &second]).await;
    let d20 = publish(store, &account, 20, "invoice.paid", &[&main]).await;
    let d30 = publish(store, &account, 30, "user.created", &[&main, &second]).await;
    let d40 = publish(store, &account, 40, "invoice.paid", &[&main, &closed]).await;
    attempt(store, &d10[0].id, &main.id, 11, failed()).await;
    attempt(store, &d10[1].id, &second.id, 11, failed()).await;
    attempt(store, &d20[0].id, &main.id, 21, Decision::Delivered).await;
    attempt(store, &d30[0].id, &main.id, 31, failed()).await;
    attempt(store, &d30[1].id, &second.id, 31, failed()).await;
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
    let bulk = ReplayFilter::bulk(at(15), None, None, vec![]).expect("filter");
    let outcome = store
        .replay(&ReplayRequest {
            replay: replay(&account, ReplayScope::Endpoint(main.id.clone()), bulk, 50),
            limit: 100,
        })
        .await
        .expect("replay");
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
        .pending_deliveries(at(50), None, 100)
        .await
        .expect("pending")
        .iter()
        .any(|p| p.delivery_id == d30[0].id));

    // The manual attempt is recorded as such, and the next one is scheduled again.
    attempt(store, &d30[0].id, &main.id, 51, Decision::RetryAt(at(80))).await;
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
    )
    .expect("filter");
    let outcome = store
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Endpoint(main.id.clone()),
                filter.clone(),
                60,
            ),
            limit: 100,
        })
        .await
        .expect("replay");
    let mut queued: Vec<_> = outcome.queued.iter().map(|p| &p.delivery_id).collect();
    queued.sort();
    let mut expected = vec![&d10[0].id, &d20[0].id];
    expected.sort();
    assert_eq!(queued, expected);

    // A single delivery: any final status, but not on a disabled endpoint.
    let outcome = store
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Delivery(d40[1].id.clone()),
                ReplayFilter::single(),
                70,
            ),
            limit: 1,
        })
        .await
        .expect("replay");
    assert_eq!(outcome.replay.count, 0, "the endpoint is disabled");
    let outcome = store
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Delivery(d10[1].id.clone()),
                ReplayFilter::single(),
                71,
            ),
            limit: 1,
        })
        .await
        .expect("replay");
    assert_eq!(outcome.replay.count, 1);
    // Already pending now: a second request touches nothing.
    let outcome = store
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Delivery(d10[1].id.clone()),
                ReplayFilter::single(),
                72,
            ),
            limit: 1,
        })
        .await
        .expect("replay");
    assert_eq!(outcome.replay.count, 0);

    // The limit is honoured oldest first, and `more` says there is more.
    let everything = ReplayFilter::bulk(at(0), None, None, vec![]).expect("filter");
    attempt(store, &d10[1].id, &second.id, 73, failed()).await;
    let outcome = store
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Endpoint(second.id.clone()),
                everything.clone(),
                80,
            ),
            limit: 1,
        })
        .await
        .expect("replay");
    assert_eq!((outcome.replay.count, outcome.replay.more), (1, true));
    assert_eq!(outcome.queued[0].delivery_id, d10[1].id);
    let outcome = store
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Endpoint(second.id.clone()),
                everything,
                81,
            ),
            limit: 1,
        })
        .await
        .expect("replay");
    assert_eq!((outcome.replay.count, outcome.replay.more), (1, false));
    assert_eq!(outcome.queued[0].delivery_id, d30[1].id);

    // The audit trail: every request, newest first, paged, this account's only.
    store
        .replay(&ReplayRequest {
            replay: replay(
                &other_account,
                ReplayScope::Endpoint(EndpointId::from_trusted("ep_none".into())),
                ReplayFilter::single(),
                90,
            ),
            limit: 10,
        })
        .await
        .expect("replay of another account");
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_replays(&account, after.as_ref(), 3)
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
}
