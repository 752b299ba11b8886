//! What only the DynamoDB store does, against the emulator (the store contract runs from
//! the integration tests, `tests/core/stores.rs`).

use super::items::*;
use super::*;

use crate::testing::emulator_store;

/// Account `acme` with one endpoint and one delivery to it, published at second 1.
async fn one_delivery(store: &DynamoStore) -> (AccountId, Delivery) {
    let account = AccountId::from_trusted("acme".into());
    let [ep] = crate::fixtures::account_with_endpoints(store, "acme", ["ep_a"]).await;
    let delivery = crate::fixtures::publish(store, &account, 1, "invoice.paid", &[&ep])
        .await
        .remove(0);
    (account, delivery)
}

/// A store on the emulator's tables that leaves out what is past its expiry, as in
/// production (`emulator_store` shows it, for the contract tests' fixed times).
async fn store_hiding_expired() -> DynamoStore {
    let shown = emulator_store().await;
    DynamoStore::new(
        shown.client().clone(),
        shown.tables().clone(),
        Retention::default(),
        crate::testing::test_secrets(None),
    )
}

/// The audit record and the deliveries set back to pending are written together: when
/// the record cannot be written (a role without write access to the attempts table, as
/// the api's once was), no delivery is left pending, unqueued and unaudited.
#[tokio::test]
async fn a_replay_whose_audit_record_cannot_be_written_changes_nothing() {
    use crate::fixtures::{attempt, failed, replay, status_of};
    let store = emulator_store().await;
    let (account, delivery) = one_delivery(&store).await;
    attempt(&store, &delivery.id, 2, failed()).await;
    let mut tables = store.tables().clone();
    tables.attempts = format!("{}-not-writable", tables.attempts);
    let refused = DynamoStore::new(
        store.client().clone(),
        tables,
        Retention::default(),
        crate::secrets::SecretsCipher::ephemeral().unwrap(),
    );
    let request = |second| ReplayRequest {
        replay: replay(
            &account,
            ReplayScope::Delivery(delivery.id.clone()),
            ReplayFilter::single(),
            second,
        ),
        limit: 1,
    };

    let outcome = refused.replay(&request(3)).await;
    assert!(outcome.is_err(), "{outcome:?}");
    assert_eq!(
        status_of(&store, &account, &delivery.id).await.status,
        DeliveryStatus::Failed
    );
    assert!(store
        .list_replays(&account, &PageAfter::first(10))
        .await
        .unwrap()
        .items
        .is_empty());

    // Asked again where the record can be written, the replay goes through.
    let outcome = store.replay(&request(4)).await.unwrap();
    assert_eq!((outcome.replay.count, outcome.queued.len()), (1, 1));
    assert_eq!(
        status_of(&store, &account, &delivery.id).await.status,
        DeliveryStatus::Pending
    );
}

/// A walk over more endpoints than one run gets through goes on in the next run where
/// the last one stopped, and the watermark moves only once the window is done.
#[tokio::test]
async fn a_walk_longer_than_one_run_is_finished_by_the_next() {
    use crate::fixtures::{account, delivery, endpoint, event, t0};
    let mut store = emulator_store().await;
    store.walk_budget = std::time::Duration::ZERO;
    store.create_account(&account("acme")).await.unwrap();
    let total = WALK_CHUNK + 6;
    for i in 0..total {
        let ep = endpoint("acme", &format!("ep_{i:03}"), t0());
        store.create_endpoint(&ep).await.unwrap();
        let ev = event("acme", &format!("evt_{i:03}"), t0());
        store
            .publish(&ev, &[delivery(&ev, &ep, t0())])
            .await
            .unwrap();
    }
    let now = chrono::Utc::now();
    let first = store.walk_unsent_first_tries(now).await.unwrap();
    assert_eq!(first.len(), WALK_CHUNK, "one chunk, then out of time");
    let state = store
        .get(&store.tables().control, key1("pk", FIRST_TRY_WATERMARK))
        .await
        .unwrap()
        .unwrap();
    assert!(state.contains_key("walked_endpoint") && !state.contains_key("watermark"));
    let second = store.walk_unsent_first_tries(now).await.unwrap();
    assert_eq!(
        second.len(),
        total - WALK_CHUNK,
        "the rest, in the next run"
    );
    let state = store
        .get(&store.tables().control, key1("pk", FIRST_TRY_WATERMARK))
        .await
        .unwrap()
        .unwrap();
    assert!(state.contains_key("watermark") && !state.contains_key("walked_endpoint"));
    assert!(store.walk_unsent_first_tries(now).await.unwrap().is_empty());
}

/// A replay larger than one transaction: its record counts every delivery written.
#[tokio::test]
async fn a_replay_of_more_than_one_transaction_counts_every_delivery() {
    use crate::fixtures::{attempt, failed, publish, replay};
    let store = emulator_store().await;
    let account = AccountId::from_trusted("acme".into());
    let [ep] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_a"]).await;
    for second in 1..=150 {
        let delivery = publish(&store, &account, second, "invoice.paid", &[&ep])
            .await
            .remove(0);
        attempt(&store, &delivery.id, second, failed()).await;
    }
    let outcome = store
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Endpoint(ep.id.clone()),
                ReplayFilter {
                    since: None,
                    until: None,
                    statuses: vec![DeliveryStatus::Failed],
                    event_types: vec![],
                    include_missed: false,
                },
                200,
            ),
            limit: 1000,
        })
        .await
        .unwrap();
    assert_eq!(
        (
            outcome.replay.count,
            outcome.queued.len(),
            outcome.replay.more
        ),
        (150, 150, false)
    );
    let listed = store
        .list_replays(&account, &PageAfter::first(10))
        .await
        .unwrap()
        .items;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].count, listed[0].more), (150, false));
}

#[test]
fn pending_shards_are_stable_and_spread() {
    assert_eq!(pending_shard("dlv_1"), pending_shard("dlv_1"));
    let shards: std::collections::HashSet<String> = (0..200)
        .map(|_| pending_shard(DeliveryId::generate().as_str()))
        .collect();
    assert_eq!(shards.len(), PENDING_SHARDS as usize);
}

#[tokio::test]
async fn a_disable_that_stopped_part_way_is_finished_by_the_next_health_check() {
    use crate::fixtures::{delivery, event, t0};
    let store = emulator_store().await;
    let [ep] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_half"]).await;
    let mut pending = Vec::new();
    for i in 0..120 {
        let ev = event("acme", &format!("evt_{i:03}"), t0());
        let d = delivery(&ev, &ep, t0());
        store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
        pending.push(d);
    }
    // The disabling transaction ran; the abandon after it never did (the process died).
    half_disabled(&store, "ep_half", Some(t0())).await;
    // A change made through the API meanwhile leaves the disable's marker for the check.
    let read = store
        .get_endpoint(&ep.account_id, &ep.id)
        .await
        .unwrap()
        .unwrap();
    let mut described = read.clone();
    described.description = "changed meanwhile".into();
    described.touch(t0());
    store
        .update_endpoint(&described, &read.version())
        .await
        .unwrap();
    // So does an attempt that was in flight, succeeding (which stops the failing clock).
    let sent = pending.remove(0);
    crate::fixtures::attempt(&store, &sent.id, 2, Decision::Delivered).await;
    let now = crate::clock::add(t0(), std::time::Duration::from_secs(4 * 86_400));
    assert!(store.failing_endpoints(now).await.unwrap().is_empty());
    for d in &pending {
        let stored = crate::fixtures::status_of(&store, &d.account_id, &d.id).await;
        assert_eq!(stored.status, DeliveryStatus::Abandoned, "{}", d.id);
        assert_eq!(
            stored.last_error.as_deref(),
            Some("abandoned: failing for 3 days")
        );
    }
    assert_eq!(
        failing_shard_of(&store, "acme", "ep_half").await.as_deref(),
        Some(FAILING_SHARD)
    );
    // Finished: the next check has nothing left to do.
    assert!(store.failing_endpoints(now).await.unwrap().is_empty());
}

/// Acme's endpoint `endpoint` as its disabling transaction leaves it, before the abandon
/// that follows: disabled and marked `disabling` (its failing clock `since`, or the index's 0
/// when it had none, as an owner's disable of an endpoint that was not failing leaves it).
async fn half_disabled(store: &DynamoStore, endpoint: &str, since: Option<Timestamp>) {
    let mut update = store
        .client()
        .update_item()
        .table_name(&store.tables().endpoints)
        .set_key(Some(account_key("acme", endpoint)))
        .expression_attribute_names("#status", "status")
        .expression_attribute_values(":disabled", s("disabled"))
        .expression_attribute_values(":reason", s("failing for 3 days"))
        .expression_attribute_values(":disabling", s(DISABLING_SHARD));
    let set = "SET #status = :disabled, disabled_reason = :reason, failing_shard = :disabling, \
               failing_since = :since";
    let since = since.map_or(INDEX_ONLY_SINCE, to_millis);
    update = update.expression_attribute_values(":since", n(since));
    update.update_expression(set).send().await.unwrap();
}

/// The endpoint's partition of the `failing` index (`disabling` until a disabling is done).
async fn failing_shard_of(store: &DynamoStore, account: &str, endpoint: &str) -> Option<String> {
    let item = store
        .get(&store.tables().endpoints, account_key(account, endpoint))
        .await
        .unwrap()
        .unwrap();
    opt_s(&item, "failing_shard")
}

#[tokio::test]
async fn a_delivery_without_its_derived_id_is_refused() {
    use crate::fixtures::{delivery, event, t0};
    let store = emulator_store().await;
    let [ep] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_a"]).await;
    let ev = event("acme", "evt_1", t0());
    let mut stray = delivery(&ev, &ep, t0());
    stray.id = DeliveryId::generate();
    assert!(store
        .publish(&ev, std::slice::from_ref(&stray))
        .await
        .is_err());
    assert!(store.add_deliveries(&[stray]).await.is_err());
    assert_eq!(store.get_event(&ev.account_id, &ev.id).await.unwrap(), None);
}

/// The ids in the `pending` index.
async fn indexed_pending(store: &DynamoStore) -> Vec<String> {
    let mut ids = Vec::new();
    for shard in 0..PENDING_SHARDS {
        let items = store
            .query_all(
                store
                    .client()
                    .query()
                    .table_name(&store.tables().deliveries)
                    .index_name("pending")
                    .key_condition_expression("pending_shard = :shard")
                    .expression_attribute_values(":shard", s(shard.to_string())),
            )
            .await
            .unwrap();
        ids.extend(items.iter().map(|item| get_s(item, "id").unwrap()));
    }
    ids.sort();
    ids
}

#[tokio::test]
async fn first_tries_enter_the_pending_index_only_when_unsent_or_retried() {
    use crate::clock::add;
    use crate::fixtures::{delivery, event, t0};
    use std::time::Duration;
    let secs = Duration::from_secs;
    let store = emulator_store().await;
    let [ep] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_a"]).await;
    let publish = |name: &'static str, at: Timestamp| {
        let store = store.clone();
        let ep = ep.clone();
        async move {
            let ev = event("acme", name, at);
            let d = delivery(&ev, &ep, at);
            store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
            d
        }
    };
    let record = |d: &Delivery, decision: Decision, at: Timestamp| AttemptRecord {
        attempt: Attempt {
            delivery_id: d.id.clone(),
            number: 1,
            trigger: Trigger::Scheduled,
            started_at: at,
            latency_ms: 5,
            status_code: Some(200),
            response_headers: vec![],
            response_body: String::new(),
            response_body_truncated: false,
            error: None,
        },
        expected_attempts: 0,
        decision,
        client_error_count: 0,
        endpoint_id: d.endpoint_id.clone(),
        account_id: d.account_id.clone(),
        success: true,
        now: at,
    };

    // Delivered at the first try: never in the index.
    let delivered = publish("evt_ok", t0()).await;
    // Retried: enters the index with its retry.
    let retried = publish("evt_retry", t0()).await;
    // Its message lost: no attempt ever.
    let lost = publish("evt_lost", t0()).await;
    assert!(indexed_pending(&store).await.is_empty());
    store
        .record_attempt(&record(&delivered, Decision::Delivered, add(t0(), secs(1))))
        .await
        .unwrap();
    store
        .record_attempt(&record(
            &retried,
            Decision::RetryAt(add(t0(), secs(60))),
            add(t0(), secs(1)),
        ))
        .await
        .unwrap();
    assert_eq!(indexed_pending(&store).await, vec![retried.id.to_string()]);

    // The sweep finds the lost one (and the retry once it is due).
    let swept = store
        .pending_deliveries(add(t0(), secs(10)), &PageAfter::first(100))
        .await
        .unwrap()
        .refs;
    assert_eq!(
        swept.iter().map(|r| &r.delivery_id).collect::<Vec<_>>(),
        vec![&lost.id]
    );
    let mut expected = vec![lost.id.to_string(), retried.id.to_string()];
    expected.sort();
    assert_eq!(indexed_pending(&store).await, expected);

    // Written after the sweep's watermark passed its creation time (a slow writer),
    // within the margin: still found.
    let late = publish("evt_late", add(t0(), secs(5))).await;
    let swept = store
        .pending_deliveries(add(t0(), secs(100)), &PageAfter::first(100))
        .await
        .unwrap()
        .refs;
    let mut ids: Vec<&DeliveryId> = swept.iter().map(|r| &r.delivery_id).collect();
    ids.sort();
    let mut expected = vec![&lost.id, &retried.id, &late.id];
    expected.sort();
    assert_eq!(ids, expected);

    // Deleting the endpoint abandons a new delivery the walk has not seen yet.
    let unseen = publish("evt_unseen", add(t0(), secs(200))).await;
    assert!(store
        .delete_endpoint(&EndpointDeletion {
            account_id: ep.account_id.clone(),
            endpoint_id: ep.id.clone(),
            at: add(t0(), secs(300)),
        })
        .await
        .unwrap());
    for d in [&lost, &retried, &late, &unseen] {
        let stored = crate::fixtures::status_of(&store, &d.account_id, &d.id).await;
        assert_eq!(stored.status, DeliveryStatus::Abandoned, "{}", d.id);
    }
    assert_eq!(
        store
            .get_delivery(&delivered.account_id, &delivered.id)
            .await
            .unwrap()
            .unwrap()
            .status,
        DeliveryStatus::Delivered
    );
}

#[tokio::test]
async fn a_delivery_written_long_after_its_event_enters_the_pending_index_at_once() {
    use crate::fixtures::{account, delivery, endpoint, event};
    let mut store = emulator_store().await;
    store.late_fan_out = Some(LATE_FAN_OUT);
    store.create_account(&account("acme")).await.unwrap();
    let ep = endpoint("acme", "ep_a", chrono::Utc::now());
    store.create_endpoint(&ep).await.unwrap();
    let now = chrono::Utc::now();
    let late_by = chrono::TimeDelta::from_std(LATE_FAN_OUT).unwrap();
    let recent = event("acme", "evt_recent", now - late_by / 2);
    let stale = event("acme", "evt_stale", now - late_by * 2);
    let ahead = event("acme", "evt_ahead", now + late_by * 2);
    let mut indexed = Vec::new();
    for ev in [&recent, &stale, &ahead] {
        let d = delivery(ev, &ep, now);
        store.put_event(ev).await.unwrap();
        store
            .add_deliveries(std::slice::from_ref(&d))
            .await
            .unwrap();
        if ev.id != recent.id {
            indexed.push(d.id.to_string());
        }
    }
    // The walk may be past a stale one's place in the log already, and will not reach
    // one dated far ahead for a long time: both are indexed as they are written.
    indexed.sort();
    assert_eq!(indexed_pending(&store).await, indexed);
}

#[tokio::test]
async fn creating_the_tables_twice_is_harmless() {
    let store = emulator_store().await;
    create_tables(store.client(), store.tables()).await.unwrap();
}

/// DynamoDB's TTL reads a Number of epoch *seconds* (the emulator deletes nothing, so the
/// test models the rule): an ended delivery carries `expires_at` at its end plus the
/// retention, a pending one none, and a replay that makes it pending again takes it off.
#[tokio::test]
async fn an_ended_delivery_expires_in_epoch_seconds_and_a_pending_one_never() {
    use crate::fixtures::{at, attempt, failed};
    let store = emulator_store().await;
    let (account, delivery) = one_delivery(&store).await;
    let expires_at = || {
        let key = delivery_key(&delivery.id).unwrap();
        stored_expiry(&store, &store.tables().deliveries, key)
    };
    assert_eq!(expires_at().await, None, "pending when published");
    let retry = Decision::RetryAt(at(60));
    attempt(&store, &delivery.id, 2, retry).await;
    assert_eq!(expires_at().await, None, "pending while retried");
    attempt(&store, &delivery.id, 3, failed()).await;
    let retention = Retention::default().deliveries.as_secs() as i64;
    let ended_secs = to_millis(at(3)) / 1000;
    assert_eq!(expires_at().await, Some(ended_secs + retention));
    replay_one(&store, &account, &delivery.id, 4).await;
    assert_eq!(expires_at().await, None, "pending again after a replay");
}

/// An endpoint's hour counts are items of the delivery-log table that TTL removes 8 days
/// after their hour, in epoch seconds (DynamoDB's TTL reads no other unit; the emulator
/// never deletes, so the value is checked here).
#[tokio::test]
async fn an_hour_count_expires_in_epoch_seconds_eight_days_after_its_hour() {
    use crate::fixtures::{at, attempt};
    let store = emulator_store().await;
    let (_, delivery) = one_delivery(&store).await;
    attempt(&store, &delivery.id, 2, Decision::Delivered).await;
    store.flush_hour_counts().await.unwrap();
    let hour = crate::domain::stats::hour_of(at(2));
    let item = store
        .client()
        .get_item()
        .table_name(&store.tables().deliveries)
        .set_key(Some(key2(
            "log",
            &format!("hours#{}", delivery.endpoint_id),
            "id",
            &format!("{:013}", to_millis(hour)),
        )))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("the hour's item");
    let expires: i64 = item["expires_at"].as_n().unwrap().parse().unwrap();
    assert_eq!(expires, to_millis(hour) / 1000 + 8 * 86_400);
    assert_eq!(item["succeeded"].as_n().unwrap(), "1");
}

/// Hour counts that cannot be written (here: a table that is not there; on AWS, a throttled
/// item) are kept and written by the next flush, so a failed write loses nothing.
#[tokio::test]
async fn hour_counts_a_flush_could_not_write_go_with_the_next() {
    use crate::fixtures::{at, attempt};
    let store = emulator_store().await;
    let (_, delivery) = one_delivery(&store).await;
    attempt(&store, &delivery.id, 2, Decision::Delivered).await;
    // A clone shares the gathered counts; this one writes to a table that does not exist.
    let mut tables = store.tables().clone();
    tables.deliveries = format!("{}-missing", tables.deliveries);
    let broken = DynamoStore {
        tables,
        ..store.clone()
    };
    assert!(broken.flush_hour_counts().await.is_err());
    let since = crate::domain::stats::hour_of(at(2));
    assert_eq!(
        store
            .endpoint_hours(&delivery.endpoint_id, since)
            .await
            .unwrap(),
        []
    );
    store.flush_hour_counts().await.unwrap();
    let counts = store
        .endpoint_hours(&delivery.endpoint_id, since)
        .await
        .unwrap();
    assert_eq!(
        counts
            .iter()
            .map(|c| (c.succeeded, c.failed))
            .collect::<Vec<_>>(),
        [(1, 0)]
    );
}

/// Replays one delivery of `account` at `second`, as its admin.
async fn replay_one(
    store: &DynamoStore,
    account: &AccountId,
    delivery: &DeliveryId,
    second: i64,
) -> ReplayOutcome {
    store
        .replay(&ReplayRequest {
            replay: crate::fixtures::replay(
                account,
                ReplayScope::Delivery(delivery.clone()),
                ReplayFilter::single(),
                second,
            ),
            limit: 1,
        })
        .await
        .unwrap()
}

/// The TTL value (`expires_at`, epoch seconds) of the item at `key` in `table`, if it has one.
async fn stored_expiry(store: &DynamoStore, table: &str, key: Item) -> Option<i64> {
    let item = store.get(table, key).await.unwrap().expect("the item");
    item.get("expires_at")
        .map(|v| v.as_n().unwrap().parse::<i64>().unwrap())
}

/// The event item's TTL value, in epoch seconds.
async fn event_expires_at(store: &DynamoStore, account: &str, event: &str) -> i64 {
    let key = Item::from([
        ("account_id".to_owned(), s(account)),
        ("id".to_owned(), s(event)),
    ]);
    stored_expiry(store, &store.tables().events, key)
        .await
        .expect("an expiry")
}

/// An event's TTL is set when it is written, so a replay late in the retention would make
/// its delivery pending again with the event due to go before the retries end (TTL deletes
/// on its own schedule; the emulator never does, so the test reads the value). A replay
/// keeps the event for the whole retry schedule, and a day, from the replay on.
#[tokio::test]
async fn a_replay_keeps_its_event_for_the_retries_it_starts() {
    use crate::fixtures::{at, attempt, failed};
    let store = emulator_store().await;
    let (account, delivery) = one_delivery(&store).await;
    attempt(&store, &delivery.id, 2, failed()).await;
    let retention = Retention::default();
    let kept = retention.events.as_secs() as i64;
    let written = event_expires_at(&store, "acme", delivery.event_id.as_str()).await;
    assert_eq!(written, to_millis(at(1)) / 1000 + kept);

    // A day before the event expires, well inside the retention.
    let second = 1 + kept - 86_400;
    let outcome = replay_one(&store, &account, &delivery.id, second).await;
    assert_eq!(outcome.queued.len(), 1);
    let retries = retention.retries.as_secs() as i64;
    assert_eq!(
        event_expires_at(&store, "acme", delivery.event_id.as_str()).await,
        to_millis(at(second)) / 1000 + retries,
        "kept until the replayed delivery's retries are over"
    );

    // A replay early in the retention leaves the event's TTL as it was.
    let (account, early) = {
        let [ep] = crate::fixtures::account_with_endpoints(&store, "early", ["ep_e"]).await;
        let account = AccountId::from_trusted("early".into());
        let d = crate::fixtures::publish(&store, &account, 1, "invoice.paid", &[&ep])
            .await
            .remove(0);
        (account, d)
    };
    attempt(&store, &early.id, 2, failed()).await;
    replay_one(&store, &account, &early.id, 3).await;
    assert_eq!(
        event_expires_at(&store, "early", early.event_id.as_str()).await,
        written
    );
}

/// Account `acme` with endpoint `ep_a`, and the event `id` published (without deliveries) a
/// day before the retention it is written with ends; returns them and the publish time.
async fn event_a_day_from_expiry(store: &DynamoStore, id: &str) -> (Endpoint, Event, Timestamp) {
    let [ep] = crate::fixtures::account_with_endpoints(store, "acme", ["ep_a"]).await;
    let published =
        chrono::Utc::now() - (Retention::default().events - std::time::Duration::from_secs(86_400));
    let event = crate::fixtures::typed_event("acme", id, "invoice.paid", published);
    store.publish(&event, &[]).await.unwrap();
    (ep, event, published)
}

/// A delivery added for an event published long ago (a resend with `include_missed`
/// reaches back the whole retention) keeps that event for its retries too.
#[tokio::test]
async fn a_delivery_added_late_keeps_its_event_for_its_retries() {
    use crate::fixtures::delivery;
    let store = emulator_store().await;
    let retention = Retention::default();
    let (ep, event, published) = event_a_day_from_expiry(&store, "evt_old").await;
    let written = event_expires_at(&store, "acme", "evt_old").await;
    assert_eq!(
        written,
        to_millis(published) / 1000 + retention.events.as_secs() as i64
    );

    let before = chrono::Utc::now();
    let added = store
        .add_deliveries(&[delivery(&event, &ep, published)])
        .await
        .unwrap();
    assert_eq!(added.len(), 1);
    let kept = event_expires_at(&store, "acme", "evt_old").await;
    let retries = retention.retries.as_secs() as i64;
    assert!(
        kept >= to_millis(before) / 1000 + retries,
        "kept {kept}, written {written}: not past the retries of a delivery added now"
    );
}

/// Puts owner mail `ntf_1` to acme's owner, made at second 1, in the control table, as the
/// disabling that queues it does.
async fn queued_mail(store: &DynamoStore) {
    let mail = Notification {
        id: "ntf_1".into(),
        account_id: AccountId::from_trusted("acme".into()),
        recipient: EmailAddress::from_trusted("owner@example.com".into()),
        subject: "endpoint disabled".into(),
        body: "…".into(),
        created_at: crate::fixtures::at(1),
    };
    store
        .client()
        .put_item()
        .table_name(&store.tables().control)
        .set_item(Some(notification_item(&mail)))
        .send()
        .await
        .unwrap();
}

/// Owner mail is an item of the control table, kept until sent; once sent it expires with
/// the retention (epoch seconds from when it was sent), as the SQLite store's purge
/// removes sent mail. Unsent mail carries no expiry.
#[tokio::test]
async fn sent_owner_mail_expires_with_the_retention_and_unsent_never() {
    use crate::fixtures::at;
    let store = emulator_store().await;
    queued_mail(&store).await;
    let expires_at = || {
        let key = Item::from([("pk".to_owned(), s("notification#ntf_1"))]);
        stored_expiry(&store, &store.tables().control, key)
    };
    assert_eq!(expires_at().await, None, "unsent");
    store.mark_notification_sent("ntf_1", at(5)).await.unwrap();
    let retention = Retention::default().deliveries.as_secs() as i64;
    assert_eq!(
        expires_at().await,
        Some(to_millis(at(5)) / 1000 + retention)
    );
}

/// A batch of events whose items are more than one transaction's 4 MB together (DynamoDB
/// refuses such a transaction whole; the emulator takes it, so `transact` applies the rule)
/// is written in several, every event answered and stored.
#[tokio::test]
async fn a_batch_larger_than_one_transaction_is_written_whole() {
    use crate::fixtures::{account_with_endpoints, at};
    let store = emulator_store().await;
    account_with_endpoints(&store, "acme", ["ep_a"]).await;
    let body = "x".repeat(250_000);
    let events: Vec<Event> = (0..20)
        .map(|i| {
            Event::new(
                EventId::parse(&format!("evt_big{i}")).unwrap(),
                AccountId::parse("acme").unwrap(),
                EventType::parse("invoice.paid").unwrap(),
                at(1),
                &serde_json::json!({ "body": body }),
            )
            .unwrap()
        })
        .collect();
    let items: Vec<crate::store::BatchItem> = events.iter().map(|e| (e.clone(), None)).collect();
    let outcomes = store.publish_batch(&items).await.unwrap();
    assert_eq!(outcomes.len(), 20);
    assert!(outcomes.iter().all(|o| *o == PublishOutcome::Created));
    for event in &events {
        assert_eq!(
            store
                .get_event(&event.account_id, &event.id)
                .await
                .unwrap()
                .as_ref(),
            Some(event)
        );
    }
}

/// With a retention shorter than the retry schedule (the template takes `1h`), a delivery
/// still being retried would lose its attempts (TTL from each attempt's start) and its event
/// from the log: both are kept at least through the retries, and a day.
#[test]
fn a_short_retention_keeps_attempts_and_events_through_the_retries() {
    let core = crate::config::CoreConfig {
        retention: std::time::Duration::from_secs(3_600),
        ..crate::config::CoreConfig::default()
    };
    let retention = Retention::from_core(&core);
    let retries = core.retry.longest_span() + std::time::Duration::from_secs(86_400);
    assert_eq!(retention.retries, retries);
    assert_eq!(retention.events, retries);
    assert_eq!(retention.attempts, core.retention + retries);
    assert_eq!(
        retention.deliveries, core.retention,
        "from when a delivery ends"
    );
    let long = Retention::default();
    let thirty_days = crate::config::CoreConfig::default().retention;
    assert_eq!(long.events, thirty_days);
    assert_eq!(long.attempts, thirty_days + retries);
}

/// DynamoDB's TTL deletes an expired item within days, not at once, and reads return it
/// until then: the delivery log, and a read of one delivery, leave out a delivery past its
/// `expires_at`, so they keep to the retention as the SQLite store's purge makes them. The
/// emulator never deletes; the test sets the expiry in the past.
#[tokio::test]
async fn the_log_leaves_out_a_delivery_past_its_expiry_that_ttl_has_not_deleted_yet() {
    use crate::fixtures::{attempt, failed};
    let store = store_hiding_expired().await;
    let (account, delivery) = one_delivery(&store).await;
    attempt(&store, &delivery.id, 2, failed()).await;
    let log = || async {
        store
            .list_deliveries(
                &account,
                &DeliveryQuery {
                    limit: 50,
                    ..DeliveryQuery::default()
                },
            )
            .await
            .unwrap()
            .items
            .len()
    };
    assert_eq!(log().await, 1, "ended, its expiry ahead");
    let by_id = || async { store.get_delivery(&account, &delivery.id).await.unwrap() };
    assert!(by_id().await.is_some());
    let past = chrono::Utc::now().timestamp() - 60;
    store
        .client()
        .update_item()
        .table_name(&store.tables().deliveries)
        .set_key(delivery_key(&delivery.id))
        .update_expression("SET expires_at = :past")
        .expression_attribute_values(":past", n(past))
        .send()
        .await
        .unwrap();
    assert_eq!(log().await, 0, "expired, not yet deleted");
    assert_eq!(by_id().await, None, "nor read by its id");
}

/// A resend's missed events leave out those older than the retention: TTL has them
/// expired and deletes them within days, and a delivery recovered for one would keep it
/// (adding a delivery moves its event's TTL) past the retention SQLite's purge keeps to.
#[tokio::test]
async fn missed_events_older_than_the_retention_are_not_recovered() {
    use crate::fixtures::typed_event;
    let store = store_hiding_expired().await;
    let account = AccountId::from_trusted(format!("acme_{}", uuid::Uuid::new_v4().simple()));
    // Whole milliseconds, as the store keeps times.
    let now = from_millis(to_millis(chrono::Utc::now()));
    let day = chrono::Duration::days(1);
    let retention = chrono::Duration::from_std(Retention::default().events).unwrap();
    let old = typed_event(
        account.as_str(),
        "evt_old",
        "invoice.paid",
        now - retention - day,
    );
    let recent = typed_event(account.as_str(), "evt_recent", "invoice.paid", now - day);
    for event in [&old, &recent] {
        store.publish(event, &[]).await.unwrap();
    }
    store
        .mark_missed(&[old.clone(), recent.clone()])
        .await
        .unwrap();
    let query = crate::store::MissedQuery {
        account,
        since: now - retention * 2,
        until: None,
        after: None,
        limit: 10,
    };
    assert_eq!(
        store.missed_events(&query).await.unwrap(),
        [recent.as_missed()],
        "only the event within the retention"
    );
}

/// The same for an event read by its id (the API's `GET …/events/{event}`, and a resend's
/// check that the event is still kept): past its `expires_at`, it is not found, as on SQLite
/// once the purge has run.
#[tokio::test]
async fn an_event_past_its_expiry_that_ttl_has_not_deleted_yet_is_not_found() {
    let store = store_hiding_expired().await;
    let (account, delivery) = one_delivery(&store).await;
    let read = || async {
        store
            .get_event(&account, &delivery.event_id)
            .await
            .unwrap()
            .map(|event| event.id)
    };
    assert_eq!(read().await.as_ref(), Some(&delivery.event_id));
    store
        .client()
        .update_item()
        .table_name(&store.tables().events)
        .set_key(Some(account_key(
            account.as_str(),
            delivery.event_id.as_str(),
        )))
        .update_expression("SET expires_at = :past")
        .expression_attribute_values(":past", n(chrono::Utc::now().timestamp() - 60))
        .send()
        .await
        .unwrap();
    assert_eq!(read().await, None, "expired, not yet deleted");
}

/// The list of replays (kept for ever) reads from its cursor on, not the account's whole
/// history: each page of 7 among 170 records reads 8, also among records made in the same
/// millisecond. The pages together are every record once, newest first.
#[tokio::test]
async fn a_page_of_replays_reads_from_its_cursor() {
    use super::replay::replay_sort;
    let store = emulator_store().await;
    let account = AccountId::from_trusted("acme".into());
    let base: i64 = 1_900_000_000_000;
    // 150 records 10 ms apart, and 20 more in one of those milliseconds, their counters
    // (the UUIDv7's bits after the millisecond) in turn.
    let mut ids: Vec<ReplayId> = (0..150)
        .map(|i| (base + i * 10, 0x2f1_0000_0000_i64))
        .chain((1..=20).map(|k| (base + 750, 0x2f1_0000_0000 + k)))
        .map(|(millis, counter)| {
            ReplayId::from_trusted(format!("rpl_{millis:012x}7{counter:011x}9e3779b9"))
        })
        .collect();
    for id in &ids {
        put_replay_record(&store, &account, id, |at| replay_sort(id, at)).await;
    }
    ids.sort_by(|a, b| b.cmp(a));

    let limit = 7;
    let (listed, most_read) = list_every_replay(&store, &account, limit).await;
    assert!(
        most_read <= limit + 1,
        "{most_read} records read for one page"
    );
    assert_eq!(listed, ids, "every record once, newest first");
}

/// Writes the audit record of a replay `id` of `account` with the sort key `sort` gives
/// for its request time.
async fn put_replay_record(
    store: &DynamoStore,
    account: &AccountId,
    id: &ReplayId,
    sort: impl FnOnce(Timestamp) -> u128,
) {
    let mut replay = crate::fixtures::replay(
        account,
        ReplayScope::Endpoint(EndpointId::from_trusted("ep_a".into())),
        ReplayFilter::single(),
        1,
    );
    replay.id = id.clone();
    let sort = sort(replay.requested_at);
    store
        .client()
        .put_item()
        .table_name(&store.tables().attempts)
        .set_item(Some(super::items::replay_item(&replay, sort)))
        .send()
        .await
        .unwrap();
}

/// Every replay of `account`, listed page by page (`limit` a page), and the most records
/// DynamoDB returned for one page.
async fn list_every_replay(
    store: &DynamoStore,
    account: &AccountId,
    limit: usize,
) -> (Vec<ReplayId>, usize) {
    let (mut listed, mut most_read) = (Vec::new(), 0);
    let mut after: Option<ReplayId> = None;
    loop {
        let (_, read) = store
            .replays_before(account, after.as_ref(), limit)
            .await
            .unwrap();
        most_read = most_read.max(read);
        let page = store
            .list_replays(
                account,
                &PageAfter {
                    after,
                    limit: limit as u32,
                },
            )
            .await
            .unwrap();
        listed.extend(page.items.into_iter().map(|r| r.id));
        match page.next_cursor {
            Some(cursor) => after = Some(ReplayId::from_trusted(cursor)),
            None => break,
        }
    }
    (listed, most_read)
}

/// Records written with the earlier sort key (the time × 1000 and a random 0..999, in no
/// id order within a millisecond) are still listed, each once and newest first, after the
/// records keyed by their ids.
#[tokio::test]
async fn replays_recorded_with_the_earlier_sort_key_are_still_listed_in_order() {
    use super::replay::replay_sort;
    let store = emulator_store().await;
    let account = AccountId::from_trusted("acme".into());
    let base: i64 = 1_900_000_000_000;
    let mut ids = Vec::new();
    for i in 0..40_i64 {
        // Three records a millisecond; the first 30 with the earlier key.
        let millis = base + i / 3;
        let id = ReplayId::from_trusted(format!("rpl_{millis:012x}7{:011x}5bd1e995", 0x100 + i));
        put_replay_record(&store, &account, &id, |at| {
            if i < 30 {
                u128::try_from(millis * 1000 + (997 * i) % 1000).unwrap()
            } else {
                replay_sort(&id, at)
            }
        })
        .await;
        ids.push(id);
    }
    ids.sort_by(|a, b| b.cmp(a));
    let (listed, _) = list_every_replay(&store, &account, 4).await;
    assert_eq!(listed, ids, "every record once, newest first");
}

/// DynamoDB keeps 38 significant digits of a number and refuses more (the emulator keeps
/// any): the largest sort key a replay can get fits, generated id or not.
#[test]
fn a_replay_sort_key_fits_dynamodb_numbers() {
    use super::replay::replay_sort;
    let largest = ReplayId::from_trusted(format!("rpl_{}7{}", "f".repeat(12), "f".repeat(19)));
    let elsewhere = ReplayId::from_trusted("rpl_imported".into());
    let far = crate::clock::from_millis(i64::MAX);
    for sort in [replay_sort(&largest, far), replay_sort(&elsewhere, far)] {
        assert!(sort.to_string().len() <= 38, "{sort}");
    }
    assert_eq!(
        replay_sort(&largest, far),
        u128::from_str_radix(&format!("{}7{}", "f".repeat(12), "f".repeat(11)), 16).unwrap()
    );
}

/// A replay that moved its event's TTL later (above) makes the delivery replayable until that
/// later time: a second replay after the event's first expiry, while the event is still kept,
/// goes through; one after the later expiry does not.
#[tokio::test]
async fn a_delivery_is_replayable_while_its_event_is_kept_however_its_ttl_was_set() {
    use crate::fixtures::{attempt, failed};
    let store = emulator_store().await;
    let (account, delivery) = one_delivery(&store).await;
    attempt(&store, &delivery.id, 2, failed()).await;
    let retention = Retention::default();
    let kept = retention.events.as_secs() as i64;
    let first = 1 + kept - 86_400;
    assert_eq!(
        replay_one(&store, &account, &delivery.id, first)
            .await
            .queued
            .len(),
        1
    );
    attempt(&store, &delivery.id, first + 1, failed()).await;
    let extended = event_expires_at(&store, "acme", delivery.event_id.as_str()).await;

    // An hour past the TTL the event was written with, well before the one the replay set.
    let second = 1 + kept + 3_600;
    assert!(crate::fixtures::at(second).timestamp() < extended);
    assert_eq!(
        replay_one(&store, &account, &delivery.id, second)
            .await
            .queued
            .len(),
        1,
        "the event is still kept"
    );
    attempt(&store, &delivery.id, second + 1, failed()).await;
    // Past the TTL the second replay set: the event is gone (or about to be).
    let extended = event_expires_at(&store, "acme", delivery.event_id.as_str()).await;
    let late = extended - crate::fixtures::at(0).timestamp() + 60;
    assert_eq!(
        replay_one(&store, &account, &delivery.id, late)
            .await
            .queued
            .len(),
        0,
        "past the event's retention"
    );
}

/// An event item marked done may have no `expires_at` (an outbox writer's, written as fanned
/// out). A delivery added late in the retention (a resend with `include_missed`) still keeps
/// the event for its retries: in a condition, DynamoDB compares a missing attribute as false.
#[tokio::test]
async fn a_late_delivery_keeps_an_event_written_without_a_ttl() {
    use crate::fixtures::delivery;
    let store = emulator_store().await;
    let retention = Retention::default();
    let (ep, event, published) = event_a_day_from_expiry(&store, "evt_no_ttl").await;
    let key = Item::from([
        ("account_id".to_owned(), s("acme")),
        ("id".to_owned(), s("evt_no_ttl")),
    ]);
    store
        .client()
        .update_item()
        .table_name(&store.tables().events)
        .set_key(Some(key.clone()))
        .update_expression("REMOVE expires_at")
        .send()
        .await
        .unwrap();
    assert_eq!(
        stored_expiry(&store, &store.tables().events, key.clone()).await,
        None
    );

    let before = chrono::Utc::now();
    store
        .add_deliveries(&[delivery(&event, &ep, published)])
        .await
        .unwrap();
    let kept = stored_expiry(&store, &store.tables().events, key).await;
    let retries = retention.retries.as_secs() as i64;
    assert!(
        kept.is_some_and(|kept| kept >= to_millis(before) / 1000 + retries),
        "{kept:?}: not past the retries of a delivery added now"
    );
}

/// Refuses every request whose input is a `T` (`TransactWriteItemsInput`, `PutItemInput`)
/// after the first `allowed`, as a throttled or failing table would.
#[derive(Debug)]
struct RefusedAfter<T>(
    std::sync::atomic::AtomicUsize,
    std::marker::PhantomData<fn() -> T>,
);

impl<T: std::fmt::Debug + Send + Sync + 'static>
    aws_smithy_runtime_api::client::interceptors::Intercept for RefusedAfter<T>
{
    fn name(&self) -> &'static str {
        "RefusedAfter"
    }

    fn read_before_execution(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef<'_>,
        _: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        use std::sync::atomic::Ordering;
        if context.input().downcast_ref::<T>().is_none() {
            return Ok(());
        }
        match self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            }) {
            Ok(_) => Ok(()),
            Err(_) => Err(format!("{} refused by the test", std::any::type_name::<T>()).into()),
        }
    }
}

/// The store on the same tables through a client that refuses requests of input `T` after
/// the first `allowed`.
fn refusing_after<T: std::fmt::Debug + Send + Sync + 'static>(
    store: &DynamoStore,
    allowed: usize,
) -> DynamoStore {
    let refused = RefusedAfter::<T>(
        std::sync::atomic::AtomicUsize::new(allowed),
        std::marker::PhantomData,
    );
    intercepted(store, refused)
}

/// The store on the same tables through a client with `interceptor` too.
fn intercepted(
    store: &DynamoStore,
    interceptor: impl aws_smithy_runtime_api::client::interceptors::Intercept + 'static,
) -> DynamoStore {
    let config = store
        .client()
        .config()
        .to_builder()
        .interceptor(interceptor)
        .build();
    DynamoStore {
        client: aws_sdk_dynamodb::Client::from_conf(config),
        ..store.clone()
    }
}

/// Refuses every abandon of an endpoint's pending work: the transactions that check the
/// endpoint is still disabled (`ConditionCheck`).
#[derive(Debug)]
struct RefusedAbandons;

impl aws_smithy_runtime_api::client::interceptors::Intercept for RefusedAbandons {
    fn name(&self) -> &'static str {
        "RefusedAbandons"
    }

    fn read_before_execution(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef<'_>,
        _: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput;
        let Some(input) = context.input().downcast_ref::<TransactWriteItemsInput>() else {
            return Ok(());
        };
        if input
            .transact_items()
            .iter()
            .any(|item| item.condition_check().is_some())
        {
            return Err("an abandon refused by the test".into());
        }
        Ok(())
    }
}

/// The store on the same tables through a client that refuses every abandon.
fn refusing_abandons(store: &DynamoStore) -> DynamoStore {
    intercepted(store, RefusedAbandons)
}

/// Marks the endpoint disabled and nothing else, as the disable's own transaction leaves it
/// for its abandon.
async fn mark_disabled(store: &DynamoStore, account: &AccountId, endpoint: &EndpointId) {
    store
        .client()
        .update_item()
        .table_name(&store.tables().endpoints)
        .set_key(Some(account_key(account.as_str(), endpoint.as_str())))
        .update_expression("SET #status = :disabled")
        .expression_attribute_names("#status", "status")
        .expression_attribute_values(":disabled", s("disabled"))
        .send()
        .await
        .unwrap();
}

fn refusing_transactions_after(store: &DynamoStore, allowed: usize) -> DynamoStore {
    refusing_after::<aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput>(
        store, allowed,
    )
}

/// A fan-out whose puts fail part-way answers the error, and counts the deliveries it did
/// write: its retry finds those written and counts only the rest, so the count is exact.
#[tokio::test]
async fn a_fan_out_that_fails_part_way_counts_what_it_wrote() {
    use crate::fixtures::{delivery, endpoint, event, t0};
    use crate::testing::deliveries_counted;
    let store = emulator_store().await;
    let ev = event("acme", "evt_partial", t0());
    let [first] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_000"]).await;
    let mut deliveries = vec![delivery(&ev, &first, t0())];
    for i in 1..40 {
        let ep = endpoint("acme", &format!("ep_{i:03}"), t0());
        store.create_endpoint(&ep).await.unwrap();
        deliveries.push(delivery(&ev, &ep, t0()));
    }
    store.put_event(&ev).await.unwrap();
    let recorder = crate::telemetry::emf::EmfRecorder::new("Hooklane", Vec::new());
    let _local = metrics::set_default_local_recorder(&recorder);
    let failing = refusing_after::<aws_sdk_dynamodb::operation::put_item::PutItemInput>(&store, 25);
    assert!(failing
        .add_deliveries_of(&ev, &deliveries, None)
        .await
        .is_err());
    let written = store.deliveries_of_event(&ev).await.unwrap().len();
    assert_eq!(written, 25, "the puts the table took");
    assert_eq!(
        deliveries_counted(&recorder),
        25,
        "what the failed fan-out wrote"
    );
    let added = store
        .add_deliveries_of(&ev, &deliveries, None)
        .await
        .unwrap();
    assert_eq!(added.len(), 15);
    assert_eq!(deliveries_counted(&recorder), 15, "what its retry wrote");
}

/// An event published with more deliveries than one transaction holds is written unfanned,
/// so when a follow-up transaction fails the fan-out still writes the rest.
#[tokio::test]
async fn an_event_whose_other_deliveries_cannot_be_written_is_left_to_the_fan_out() {
    use crate::fixtures::{delivery, endpoint, event, t0};
    use crate::testing::deliveries_counted;
    let store = emulator_store().await;
    let [first] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_000"]).await;
    let ev = event("acme", "evt_wide", t0());
    let mut deliveries = vec![delivery(&ev, &first, t0())];
    for i in 1..150 {
        let ep = endpoint("acme", &format!("ep_{i:03}"), t0());
        store.create_endpoint(&ep).await.unwrap();
        deliveries.push(delivery(&ev, &ep, t0()));
    }
    let recorder = crate::telemetry::emf::EmfRecorder::new("Hooklane", Vec::new());
    let _local = metrics::set_default_local_recorder(&recorder);
    let failing = refusing_transactions_after(&store, 1);
    assert!(failing.publish(&ev, &deliveries).await.is_err());
    let written = store.deliveries_of_event(&ev).await.unwrap().len();
    assert!((1..150).contains(&written), "{written} written");
    assert_eq!(
        deliveries_counted(&recorder),
        written as u64,
        "what the publish wrote"
    );
    // Its fan-out writes and counts the rest.
    store
        .add_deliveries_of(&ev, &deliveries, None)
        .await
        .unwrap();
    assert_eq!(deliveries_counted(&recorder), 150 - written as u64);
    let later = crate::clock::add(t0(), std::time::Duration::from_secs(60));
    let unfanned = store.unfanned_events(None, later, 10).await.unwrap();
    assert_eq!(
        unfanned.events.iter().map(|e| &e.id).collect::<Vec<_>>(),
        [&ev.id],
        "the event is left for the fan-out"
    );
    // An event whose deliveries fit in its transaction is written fanned out.
    let narrow = event("acme", "evt_narrow", t0());
    store
        .publish(&narrow, &[delivery(&narrow, &first, t0())])
        .await
        .unwrap();
    let unfanned = store.unfanned_events(None, later, 10).await.unwrap();
    assert_eq!(unfanned.events.len(), 1);
}

/// An operations event with more deliveries than the disabling transaction holds is written
/// unfanned, so when the rest of its deliveries cannot be written the fan-out (its stream
/// record, or the sweeper) still writes them; marked fanned out, they would never be. The
/// disabling does not fail for them.
#[tokio::test]
async fn an_operational_event_whose_other_deliveries_cannot_be_written_is_left_to_the_fan_out() {
    use crate::fixtures::{account, delivery, endpoint, t0, typed_event};
    use crate::testing::deliveries_counted;
    let store = emulator_store().await;
    let [ep] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_down"]).await;
    store.create_account(&account("ops")).await.unwrap();
    let op_event = typed_event("ops", "evt_op_rest", "endpoint.disabled", t0());
    let mut op_deliveries = Vec::new();
    for i in 0..150 {
        let listener = endpoint("ops", &format!("ep_ops_{i:03}"), t0());
        store.create_endpoint(&listener).await.unwrap();
        op_deliveries.push(delivery(&op_event, &listener, t0()));
    }
    let now = crate::clock::add(t0(), std::time::Duration::from_secs(3 * 86_400));
    let request = DisableRequest {
        account_id: ep.account_id.clone(),
        endpoint_id: ep.id.clone(),
        reason: "failing for 3 days".into(),
        now,
        expected_failing_since: None,
        notification: None,
        operational_event: Some((op_event.clone(), op_deliveries.clone())),
    };
    // The disabling transaction goes through; the follow-up with the other deliveries fails,
    // and the disabling is finished all the same.
    let recorder = crate::telemetry::emf::EmfRecorder::new("Hooklane", Vec::new());
    let _local = metrics::set_default_local_recorder(&recorder);
    let failing = refusing_transactions_after(&store, 1);
    let outcome = failing.disable_endpoint(&request).await.unwrap();
    assert!(outcome.is_some(), "disabled");
    assert_eq!(
        failing_shard_of(&store, "acme", "ep_down").await.as_deref(),
        Some(FAILING_SHARD),
        "the disabling finished"
    );
    let stored = store.get_endpoint(&ep.account_id, &ep.id).await.unwrap();
    assert_eq!(
        stored.map(|e| e.status),
        Some(crate::domain::EndpointStatus::Disabled)
    );
    let written = store.deliveries_of_event(&op_event).await.unwrap().len();
    assert!((1..150).contains(&written), "{written} written");
    assert_eq!(
        deliveries_counted(&recorder),
        written as u64,
        "what the disabling wrote"
    );
    let unfanned = store.unfanned_events(None, now, 10).await.unwrap();
    assert_eq!(
        unfanned.events.iter().map(|e| &e.id).collect::<Vec<_>>(),
        [&op_event.id],
        "the event is left for the fan-out"
    );

    // What the fan-out does with it: the rest written, the event marked.
    store
        .add_deliveries_of(&op_event, &op_deliveries, None)
        .await
        .unwrap();
    assert_eq!(
        deliveries_counted(&recorder),
        150 - written as u64,
        "what the fan-out wrote"
    );
    store
        .mark_fanned_out(&[crate::store::FannedOut {
            event: op_event.clone(),
            missed: false,
        }])
        .await
        .unwrap();
    assert_eq!(
        store.deliveries_of_event(&op_event).await.unwrap().len(),
        150
    );
    assert!(store
        .unfanned_events(None, now, 10)
        .await
        .unwrap()
        .events
        .is_empty());
}

/// An outbox item written already fanned out but with a shard (the contract allows both)
/// leaves the `unfanned` index at the sweeper's first look, so later sweeps do not read it
/// again; it keeps its writer's TTL and gets no deliveries.
#[tokio::test]
async fn an_item_written_fanned_out_with_a_shard_leaves_the_sweepers_index() {
    use crate::fixtures::t0;
    let store = emulator_store().await;
    crate::fixtures::account_with_endpoints(&store, "acme", ["ep_a"]).await;
    let created = to_millis(t0());
    store
        .client()
        .put_item()
        .table_name(&store.tables().events)
        .item("account_id", s("acme"))
        .item("id", s("evt_done"))
        .item("type", s("invoice.paid"))
        .item("created_at", n(created))
        .item("payload", s("{}"))
        .item("fanned_out", AttributeValue::Bool(true))
        .item(UNFANNED_SHARD, s("2"))
        .item("expires_at", n(created / 1000 + 3600))
        .send()
        .await
        .unwrap();
    let later = crate::clock::add(t0(), std::time::Duration::from_secs(60));
    let page = store.unfanned_events(None, later, 10).await.unwrap();
    assert!(page.events.is_empty());
    let item = store
        .get(&store.tables().events, account_key("acme", "evt_done"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        !item.contains_key(UNFANNED_SHARD),
        "still in the sweeper's index: {item:?}"
    );
    assert_eq!(
        opt_n::<i64>(&item, "expires_at").unwrap(),
        Some(created / 1000 + 3600)
    );
    assert_eq!(
        store.unfanned_events(None, later, 10).await.unwrap().last,
        None
    );
    assert!(store
        .deliveries_of_event(&crate::fixtures::event("acme", "evt_done", t0()))
        .await
        .unwrap()
        .is_empty());
}

/// The TTLs hold for the longest a delivery can be retried: every try answered 503 with a
/// `Retry-After` past the longest allowed stretches each delay to it. An event outlives those
/// retries from when they start, and an attempt outlives its delivery's log row.
#[test]
fn events_and_attempts_outlive_retries_stretched_by_retry_after() {
    let core = crate::config::CoreConfig::default();
    let retention = Retention::from_core(&core);
    let asked = std::time::Duration::from_secs(30 * 86_400);
    let longest = crate::domain::outcome::tests::span_answered_with(&core.retry, Some(asked));
    assert!(
        retention.retries > longest,
        "events kept {:?} past a replay; its retries can take {longest:?}",
        retention.retries
    );
    assert!(retention.events >= retention.retries);
    assert!(
        retention.attempts >= longest + retention.deliveries,
        "an attempt kept {:?}; its delivery may end {longest:?} later and is kept {:?} more",
        retention.attempts,
        retention.deliveries
    );
}

/// The largest batch the API takes on AWS (100 events, ids and types as long as allowed,
/// the body at its limit) is one transaction: its event items fit DynamoDB's 4 MB, so a
/// batch is never written part-way.
#[tokio::test]
async fn the_largest_batch_the_api_takes_is_one_transaction() {
    let store = emulator_store().await;
    let limit = crate::config::CoreConfig::default().batch_body_limit();
    let long_id = |i: usize| format!("evt_{i:03}_{}", "x".repeat(128 - 8));
    let kind = format!(
        "a.{}",
        "b".repeat(crate::domain::event::MAX_EVENT_TYPE_LEN - 2)
    );
    // The body with empty payloads, then the payloads share what is left of the limit.
    let body = |payload: &str| {
        let events: Vec<String> = (0..100)
            .map(|i| {
                format!(
                    r#"{{"id":"{}","type":"{kind}","data":{{"v":"{payload}"}}}}"#,
                    long_id(i)
                )
            })
            .collect();
        format!(r#"{{"events":[{}]}}"#, events.join(","))
    };
    let room = (limit - body("").len()) / 100;
    let payload = "p".repeat(room);
    assert!(body(&payload).len() <= limit);
    let items: usize = (0..100)
        .map(|i| {
            let mut ev =
                crate::fixtures::typed_event("acme", &long_id(i), &kind, crate::fixtures::t0());
            ev.payload = format!(r#"{{"v":"{payload}"}}"#);
            item_size(&store.event_item(&ev, false))
        })
        .sum();
    assert!(
        items <= MAX_TRANSACTION_BYTES,
        "{items} bytes of items from a {} byte body; one transaction holds {MAX_TRANSACTION_BYTES}",
        body(&payload).len()
    );
}

/// A batch written in more than one step (here 101 events alone: two transactions; and an
/// event with deliveries before another) is refused whole by an item under another event's
/// id, wherever it is: none of the steps before it is written.
#[tokio::test]
async fn a_batch_of_several_transactions_with_another_event_under_a_stored_id_writes_nothing() {
    use crate::fixtures::{account_with_endpoints, delivery, t0};
    let store = emulator_store().await;
    let [ep] = account_with_endpoints(&store, "acme", ["ep_a"]).await;
    let stored = crate::fixtures::event("acme", "evt_stored", t0());
    store.publish(&stored, &[]).await.unwrap();
    let other = crate::fixtures::typed_event("acme", "evt_stored", "invoice.voided", t0());

    let mut alone: Vec<crate::store::BatchItem> = (0..MAX_TRANSACTION_ITEMS)
        .map(|i| {
            (
                crate::fixtures::event("acme", &format!("evt_{i:03}"), t0()),
                None,
            )
        })
        .collect();
    alone.push((other.clone(), None));
    let fresh = crate::fixtures::event("acme", "evt_fresh", t0());
    let with_deliveries: Vec<crate::store::BatchItem> = vec![
        (fresh.clone(), Some(vec![delivery(&fresh, &ep, t0())])),
        (other.clone(), Some(vec![delivery(&other, &ep, t0())])),
    ];
    for (what, batch) in [("101 alone", alone), ("with deliveries", with_deliveries)] {
        match store.publish_batch(&batch).await {
            Err(StoreError::EventConflict(conflict)) => assert_eq!(conflict.field(), "type"),
            other => panic!("{what}: another event under a stored id was taken: {other:?}"),
        }
        for (event, _) in &batch[..batch.len() - 1] {
            assert_eq!(
                store.get_event(&event.account_id, &event.id).await.unwrap(),
                None,
                "{what}: {} of the refused batch was written",
                event.id
            );
        }
    }
}

/// An outbox write that fan-out rejected keeps its `data` for the operator; a deletion
/// request for it removes that as it would an event's payload, and answers what the item
/// says of the event (it has no deliveries).
#[tokio::test]
async fn erasing_a_rejected_outbox_write_removes_its_data() {
    use crate::fixtures::{account_with_endpoints, at};
    let store = emulator_store().await;
    account_with_endpoints(&store, "acme", ["ep_a"]).await;
    // One that fan-out rejected, and one it has not marked (yet, or ever: the rejection's
    // write failed, or its stream record was given up).
    for (id, rejected) in [("evt_rejected", true), ("evt_unmarked", false)] {
        let key = account_key("acme", id);
        let mut item = key.clone();
        item.extend([
            ("id".to_owned(), s(id)),
            ("account_id".to_owned(), s("acme")),
            ("type".to_owned(), s("customer.updated")),
            // In seconds, not milliseconds: the kind of write fan-out rejects.
            ("created_at".to_owned(), n(1_700_000_000)),
        ]);
        // The unmarked one also has its `data` as a map, which no read takes for an event.
        let data = if rejected {
            s(r#"{"email":"someone@example.com"}"#)
        } else {
            AttributeValue::M([("email".to_owned(), s("someone@example.com"))].into())
        };
        item.insert("data".to_owned(), data);
        if !rejected {
            // Waiting for the sweeper, as an outbox write does.
            item.insert(UNFANNED_SHARD.to_owned(), s("0"));
        }
        put_event_item(&store, item).await;
        if rejected {
            store
                .reject_event("acme", id, "created_at is in seconds")
                .await
                .unwrap();
        }

        let account = AccountId::from_trusted("acme".into());
        let event = EventId::from_trusted(id.into());
        let erasure = store.erase_event(&account, &event, at(9)).await;
        let erasure = erasure.unwrap().expect("the write is found");
        assert_eq!(
            (erasure.event.id.as_str(), erasure.event.event_type.as_str()),
            (id, "customer.updated")
        );
        assert!(erasure.event.is_erased() && erasure.ended == 0 && erasure.complete);
        let stored = store
            .client()
            .get_item()
            .table_name(&store.tables().events)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
            .unwrap();
        assert!(
            !stored.contains_key("data") && !stored.contains_key("payload"),
            "erased, yet kept: {stored:?}"
        );
        assert!(stored.contains_key("erased_at"));
        // It stays refused: without its data, it must not read as an erased event that
        // fan-out would give deliveries.
        assert!(stored.contains_key("rejected"), "{stored:?}");
        assert!(!stored.contains_key(UNFANNED_SHARD), "{stored:?}");
        let read = store.get_event(&account, &event).await;
        assert!(matches!(read, Err(StoreError::Rejected(_))), "{read:?}");
    }
}

/// Account `acme` with an active endpoint and a disabled one.
async fn live_and_disabled_endpoints(store: &DynamoStore) -> (Endpoint, Endpoint) {
    let [live] = crate::fixtures::account_with_endpoints(store, "acme", ["ep_live"]).await;
    let mut off = crate::fixtures::endpoint("acme", "ep_off", crate::fixtures::t0());
    off.status = EndpointStatus::Disabled;
    store.create_endpoint(&off).await.unwrap();
    (live, off)
}

/// Every delivery due by `due_before`, walked in pages of `limit` as the sweeper walks
/// them; and how many pages that took.
async fn walk_due(
    store: &DynamoStore,
    due_before: Timestamp,
    limit: u32,
) -> (usize, Vec<PendingRef>) {
    let (mut page, mut pages, mut walked) = (PageAfter::first(limit), 0, Vec::new());
    loop {
        let found = store.pending_deliveries(due_before, &page).await.unwrap();
        pages += 1;
        walked.extend(found.refs);
        match found.next {
            Some(next) => page.after = Some(next),
            None => return (pages, walked),
        }
        assert!(pages <= 1000, "the walk never ends");
    }
}

/// The sweeper walks a due backlog a page at a time; each page reads about its own length
/// from the `pending` index (a few entries per shard), not every due entry again, so a walk
/// of N due deliveries costs O(N) reads, not O(N²/page).
#[tokio::test]
async fn a_walk_of_due_deliveries_reads_each_page_not_the_whole_backlog() {
    use crate::clock::add;
    use crate::fixtures::{delivery, event, t0};
    use std::time::Duration;
    let store = emulator_store().await;
    let (live, off) = live_and_disabled_endpoints(&store).await;
    const DUE: i64 = 100;
    let mut expected = Vec::new();
    for i in 0..DUE {
        // Ids in the reverse of due order.
        let at = add(t0(), Duration::from_secs(i as u64));
        let ev = event("acme", &format!("evt_{:03}", DUE - i), at);
        let d = delivery(&ev, &live, at);
        store
            .publish(&ev, &[d.clone(), delivery(&ev, &off, at)])
            .await
            .unwrap();
        expected.push((at, d.id));
    }
    let (counted, reads) = counting_reads(&store);

    let due_before = add(t0(), Duration::from_secs(3600));
    let limit = 10;
    let (pages, walked) = walk_due(&counted, due_before, limit).await;
    let seen: Vec<_> = walked.into_iter().map(|r| (r.due, r.delivery_id)).collect();
    assert_eq!(seen, expected, "every due delivery once, in due order");
    // The first page walks the new deliveries' log once (both endpoints'); the walk then
    // reads each index entry (both endpoints') about once, and each page a few more from
    // every shard: its first read of each, and the one entry BETWEEN brings back.
    let (shards, limit_items) = (PENDING_SHARDS as usize, limit as usize);
    let per_shard = limit_items.div_ceil(shards) + 2;
    let most = 2 * DUE as usize + 2 * DUE as usize + pages * shards * per_shard;
    let queried = Reads::get(&reads.returned);
    assert!(
        queried <= most,
        "{pages} pages of {limit} read {queried} items; at most {most} were needed"
    );

    // A cursor past the end answers nothing, and asks DynamoDB nothing it refuses.
    let past = PageAfter {
        after: Some(DueCursor {
            due: add(due_before, Duration::from_secs(1)),
            id: DeliveryId::from_trusted("dlv_zzz".into()),
        }),
        limit,
    };
    let found = store.pending_deliveries(due_before, &past).await.unwrap();
    assert_eq!(found, PendingPage::default());
}

/// Writes `item` into the events table as an outbox writer would: as it is, unchecked.
async fn put_event_item(store: &DynamoStore, item: Item) {
    store
        .client()
        .put_item()
        .table_name(&store.tables().events)
        .set_item(Some(item))
        .send()
        .await
        .unwrap();
}

/// An outbox writer may set the event's TTL itself (docs/OUTBOX.md); one that comes before
/// the retries its fan-out starts could end would let DynamoDB delete the event while they
/// are left, so the fan-out's mark moves it to their end, as a replay does. A later one is
/// kept.
#[tokio::test]
async fn a_writer_s_ttl_sooner_than_the_retries_is_moved_past_them_by_the_fan_out() {
    use crate::store::FannedOut;
    let store = emulator_store().await;
    crate::fixtures::account_with_endpoints(&store, "acme", ["ep_a"]).await;
    let now = chrono::Utc::now();
    let retries = Retention::default().retries.as_secs() as i64;
    let now_secs = to_millis(now) / 1000;
    for (id, writers) in [
        ("evt_soon", now_secs + 3600),
        ("evt_late", now_secs + 2 * retries),
    ] {
        let event = crate::fixtures::typed_event("acme", id, "invoice.paid", now);
        let mut item = store.event_item(&event, false);
        item.insert("expires_at".into(), n(writers));
        put_event_item(&store, item).await;
        store
            .mark_fanned_out(&[FannedOut {
                event,
                missed: false,
            }])
            .await
            .unwrap();
    }
    let soon = event_expires_at(&store, "acme", "evt_soon").await;
    assert!(
        soon >= now_secs + retries,
        "kept until {soon}: the retries started now may last until {}",
        now_secs + retries
    );
    let late = event_expires_at(&store, "acme", "evt_late").await;
    assert_eq!(
        late,
        now_secs + 2 * retries,
        "a later TTL of the writer's is kept"
    );
    // Marked done either way: out of the sweeper's index.
    for id in ["evt_soon", "evt_late"] {
        let key = account_key("acme", id);
        let item = store
            .get(&store.tables().events, key)
            .await
            .unwrap()
            .unwrap();
        assert!(!item.contains_key(UNFANNED_SHARD), "{id} still unfanned");
    }
}

/// The same for the rows of a delivery's attempts: one past its `expires_at` (an old
/// attempt of a delivery replayed late in its retention) is left out until TTL deletes it.
#[tokio::test]
async fn an_attempt_past_its_expiry_that_ttl_has_not_deleted_yet_is_not_listed() {
    use crate::fixtures::{attempt, failed};
    let store = store_hiding_expired().await;
    let (_, delivery) = one_delivery(&store).await;
    attempt(&store, &delivery.id, 2, failed()).await;
    let numbers = || async {
        let attempts = store.list_attempts(&delivery.id).await.unwrap();
        attempts.iter().map(|a| a.number).collect::<Vec<_>>()
    };
    assert_eq!(numbers().await, [1]);
    store
        .client()
        .update_item()
        .table_name(&store.tables().attempts)
        .key("delivery_id", s(delivery.id.as_str()))
        .key("number", n(1))
        .update_expression("SET expires_at = :past")
        .expression_attribute_values(":past", n(chrono::Utc::now().timestamp() - 60))
        .send()
        .await
        .unwrap();
    assert_eq!(
        numbers().await,
        Vec::<u32>::new(),
        "expired, not yet deleted"
    );
}

/// Due entries of an inactive endpoint are passed over, not listed: a page looks at four
/// times its length at most, so a walk over thousands of them (an endpoint disabled while
/// its deliveries were still being abandoned) costs each page little, and goes on.
#[tokio::test]
async fn a_page_passes_over_a_bounded_number_of_inactive_endpoints_entries() {
    use crate::clock::add;
    use crate::fixtures::{delivery, event, t0};
    use std::time::Duration;
    let store = emulator_store().await;
    let (live, off) = live_and_disabled_endpoints(&store).await;
    for i in 0..30_u64 {
        let ev = event(
            "acme",
            &format!("evt_off_{i:02}"),
            add(t0(), Duration::from_secs(i)),
        );
        store
            .publish(&ev, &[delivery(&ev, &off, ev.created_at)])
            .await
            .unwrap();
    }
    let last = event("acme", "evt_live", add(t0(), Duration::from_secs(100)));
    let live_delivery = delivery(&last, &live, last.created_at);
    store
        .publish(&last, std::slice::from_ref(&live_delivery))
        .await
        .unwrap();

    let (pages, walked) = walk_due(&store, add(t0(), Duration::from_secs(3600)), 2).await;
    let listed: Vec<_> = walked.into_iter().map(|r| r.delivery_id).collect();
    assert_eq!(listed, [live_delivery.id]);
    assert!(
        pages >= 4,
        "31 entries looked at 8 a page take 4 pages, not {pages}"
    );
}

/// Where the sweeper's walk goes on is kept between runs, and forgotten once a walk ends.
#[tokio::test]
async fn the_due_walk_s_resume_point_is_kept_and_cleared() {
    let store = emulator_store().await;
    assert_eq!(store.due_walk_resume().await.unwrap(), None);
    let at = DueCursor {
        due: crate::fixtures::at(7),
        id: DeliveryId::from_trusted("dlv_7".into()),
    };
    store.set_due_walk_resume(Some(&at)).await.unwrap();
    assert_eq!(store.due_walk_resume().await.unwrap(), Some(at));
    store.set_due_walk_resume(None).await.unwrap();
    assert_eq!(store.due_walk_resume().await.unwrap(), None);
}

/// DynamoDB's cancellation reasons, one per item ("None" for an item that was fine): a
/// transaction that only met another one on the same item is tried again; one whose
/// condition failed is refused with the items at fault, whatever else was wrong.
#[test]
fn a_transaction_that_only_met_another_is_tried_again() {
    let conflict = Some("TransactionConflict");
    let failed = Some("ConditionalCheckFailed");
    assert_eq!(
        cancellation(&[Some("None"), conflict, None]),
        Cancellation::Conflict
    );
    assert_eq!(
        cancellation(&[conflict, failed, Some("None")]),
        Cancellation::Conditions(vec![1])
    );
    assert_eq!(
        cancellation(&[conflict, Some("ValidationError")]),
        Cancellation::Other
    );
    assert_eq!(cancellation(&[Some("None")]), Cancellation::Other);
    assert_eq!(cancellation(&[]), Cancellation::Other);
}

/// A transaction cancelled because a table or an index was over its throughput is tried
/// again after a pause; a condition that failed still refuses it.
#[test]
fn a_transaction_over_the_throughput_is_tried_again() {
    for throttled in ["ThrottlingError", "ProvisionedThroughputExceeded"] {
        assert_eq!(
            cancellation(&[Some("None"), Some(throttled)]),
            Cancellation::Throttled,
            "{throttled}"
        );
        assert_eq!(
            cancellation(&[Some("TransactionConflict"), Some(throttled), None]),
            Cancellation::Throttled,
            "{throttled} beside a conflict"
        );
        assert_eq!(
            cancellation(&[Some(throttled), Some("ConditionalCheckFailed")]),
            Cancellation::Conditions(vec![1])
        );
        assert_eq!(
            cancellation(&[Some(throttled), Some("ItemCollectionSizeLimitExceeded")]),
            Cancellation::Other
        );
    }
}

/// An owner's disable of an endpoint that was not failing leaves a `disabling` marker
/// without a failing clock; if its abandoning stopped part way and the owner enabled the
/// endpoint again, the marker is stale: the next failure still starts the clock.
#[tokio::test]
async fn a_stale_disabling_marker_does_not_stop_the_failing_clock() {
    use crate::fixtures::{attempt_record, publish_one, t0};
    let store = emulator_store().await;
    let [ep] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_again"]).await;
    half_disabled(&store, "ep_again", None).await;
    enable_again(&store, &ep.account_id, &ep.id, t0()).await;
    let (_, d) = publish_one(&store, &ep, "evt_after").await;
    let failed_at = crate::clock::add(t0(), std::time::Duration::from_secs(10));
    let retry = Decision::RetryAt(crate::clock::add(t0(), std::time::Duration::from_secs(60)));
    let outcome = store
        .record_attempt(&attempt_record(&d, 1, retry, false, failed_at))
        .await
        .unwrap();
    assert_eq!(
        store
            .get_endpoint(&ep.account_id, &ep.id)
            .await
            .unwrap()
            .unwrap()
            .failing_since,
        Some(failed_at),
        "{outcome:?}"
    );
}

/// The scheduled functions' run lock: one holder at a time; a holder that died is out of
/// the way once its time is up; giving back a lock lost to the next run leaves theirs.
#[tokio::test]
async fn a_run_lock_has_one_holder_until_it_is_given_back_or_its_time_is_up() {
    let store = emulator_store().await;
    let at = |second: i64| crate::clock::from_millis(1_700_000_000_000 + second * 1000);
    let first = store.take_run("sweep", at(0), at(240)).await.unwrap();
    let first = first.expect("a lock no one holds is taken");
    assert_eq!(
        store.take_run("sweep", at(10), at(250)).await.unwrap(),
        None,
        "a second run while the first holds the lock"
    );
    assert!(
        store
            .take_run("health", at(10), at(310))
            .await
            .unwrap()
            .is_some(),
        "each name has its own lock"
    );
    store.release_run(&first).await.unwrap();
    let second = store.take_run("sweep", at(20), at(260)).await.unwrap();
    let second = second.expect("a lock given back is taken");
    // The second run dies holding it: the next one waits until its time is up, then takes it.
    assert_eq!(
        store.take_run("sweep", at(259), at(499)).await.unwrap(),
        None
    );
    let third = store.take_run("sweep", at(260), at(500)).await.unwrap();
    let third = third.expect("a lock past its time is taken");
    // The second run, late, gives back what it no longer holds: the third's lock stays.
    store.release_run(&second).await.unwrap();
    assert_eq!(
        store.take_run("sweep", at(300), at(540)).await.unwrap(),
        None
    );
    store.release_run(&third).await.unwrap();
}

/// An endpoint that always answers as largely as it can still has its attempts recorded and
/// its failing clock started (so it can be disabled): DynamoDB refuses an item over 400 KiB,
/// and a refused attempt row would fail the attempt after the delivery's update.
#[tokio::test]
async fn the_largest_answer_is_recorded_and_starts_the_failing_clock() {
    use crate::fixtures::{account_with_endpoints, app_on, largest_answer, publish_one, t0};
    use crate::service::deliver::{attempt, AttemptResult};
    use std::sync::Arc;
    let store = emulator_store().await;
    let app = crate::App {
        transport: Arc::new(crate::fixtures::Answering(largest_answer())),
        ..app_on(
            Arc::new(store.clone()),
            Arc::new(crate::clock::ManualClock::new(t0())),
        )
    };
    let [ep] = account_with_endpoints(&store, "acme", ["ep_hostile"]).await;
    let (_, d) = publish_one(&store, &ep, "evt_hostile").await;

    let result = attempt(&app, &d.id, Trigger::Scheduled).await;
    assert!(
        matches!(result, Ok(AttemptResult::Attempted { .. })),
        "{result:?}"
    );
    assert_eq!(store.list_attempts(&d.id).await.unwrap().len(), 1);
    let endpoint = store
        .get_endpoint(&ep.account_id, &ep.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(endpoint.failing_since, Some(t0()));
}

/// Answers the first `rounds` BatchGetItem requests as DynamoDB does when over its
/// throughput: nothing read, every key unprocessed.
#[derive(Debug)]
struct LeftUnprocessed {
    rounds: std::sync::atomic::AtomicUsize,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The keys of the batch read in flight (the test reads one batch at a time).
    asked: std::sync::Mutex<Option<serde_json::Value>>,
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for LeftUnprocessed {
    fn name(&self) -> &'static str {
        "LeftUnprocessed"
    }

    fn read_before_transmit(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let request = context.request();
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        let asked = match target.ends_with("BatchGetItem") {
            true => Some(serde_json::from_slice(
                request.body().bytes().unwrap_or_default(),
            )?),
            false => None,
        };
        *self.asked.lock().unwrap() = asked;
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut<'_>,
        _: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        use std::sync::atomic::Ordering::SeqCst;
        let Some(asked) = self.asked.lock().unwrap().take() else {
            return Ok(());
        };
        self.requests.fetch_add(1, SeqCst);
        if self
            .rounds
            .fetch_update(SeqCst, SeqCst, |left| left.checked_sub(1))
            .is_err()
        {
            return Ok(());
        }
        let answer = serde_json::json!({"Responses": {}, "UnprocessedKeys": asked["RequestItems"]});
        *context.response_mut().body_mut() =
            aws_smithy_types::body::SdkBody::from(answer.to_string());
        Ok(())
    }
}

/// The store on the same tables, its first `rounds` batch reads left unprocessed; and the
/// count of batch reads it makes.
fn leaving_unprocessed(
    store: &DynamoStore,
    rounds: usize,
) -> (DynamoStore, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let interceptor = LeftUnprocessed {
        rounds: std::sync::atomic::AtomicUsize::new(rounds),
        requests: requests.clone(),
        asked: std::sync::Mutex::new(None),
    };
    let config = store
        .client()
        .config()
        .to_builder()
        .interceptor(interceptor)
        .build();
    let store = DynamoStore {
        client: aws_sdk_dynamodb::Client::from_conf(config),
        ..store.clone()
    };
    (store, requests)
}

/// Keys a batch read leaves unprocessed are asked for again, a bounded number of times:
/// a table that stays over its throughput is an error, not a loop until the function's
/// timeout.
#[tokio::test]
async fn a_batch_read_asks_again_for_unprocessed_keys_a_bounded_number_of_times() {
    use std::sync::atomic::Ordering::SeqCst;
    let store = emulator_store().await;
    let (_, delivery) = one_delivery(&store).await;
    let (twice, requests) = leaving_unprocessed(&store, 2);
    let read = twice
        .get_deliveries(std::slice::from_ref(&delivery.id))
        .await
        .unwrap();
    assert_eq!(read.len(), 1, "read once the table answered");
    assert_eq!(
        requests.load(SeqCst),
        3,
        "two rounds unprocessed, then read"
    );

    let (always, requests) = leaving_unprocessed(&store, usize::MAX);
    let read = always
        .get_deliveries(std::slice::from_ref(&delivery.id))
        .await;
    assert!(read.is_err(), "{read:?}");
    assert_eq!(requests.load(SeqCst), 1 + UNPROCESSED_ROUNDS as usize);
}

/// Owner mail whose send failed keeps the error in `last_error`, for an operator to read in
/// the control table: mail waiting for a retry stays unexpired, with its `unsent` key moved
/// to when it is due; mail given up leaves the `unsent` index, keeps `given_up_at` and
/// expires with the retention, as sent mail does.
#[tokio::test]
async fn owner_mail_given_up_keeps_its_error_and_expires_with_the_retention() {
    use crate::fixtures::at;
    use crate::store::NotificationFailure;
    let store = emulator_store().await;
    queued_mail(&store).await;
    let stored = || async {
        let key = Item::from([("pk".to_owned(), s("notification#ntf_1"))]);
        store
            .get(&store.tables().control, key)
            .await
            .unwrap()
            .expect("the item")
    };
    let retry = NotificationFailure::Retry {
        at: at(900),
        error: "TooManyRequestsException".into(),
    };
    store
        .mark_notification_failed("ntf_1", at(5), &retry)
        .await
        .unwrap();
    let waiting = stored().await;
    assert_eq!(
        opt_s(&waiting, "last_error").as_deref(),
        Some("TooManyRequestsException")
    );
    assert_eq!(
        opt_s(&waiting, "created_key"),
        Some(time_key(at(900), "ntf_1"))
    );
    assert!(waiting.contains_key(UNSENT));
    assert!(!waiting.contains_key("expires_at"));

    let give_up = NotificationFailure::GiveUp {
        error: "MessageRejected: Email address is not verified.".into(),
    };
    store
        .mark_notification_failed("ntf_1", at(10), &give_up)
        .await
        .unwrap();
    let given_up = stored().await;
    assert_eq!(
        opt_s(&given_up, "last_error").as_deref(),
        Some("MessageRejected: Email address is not verified.")
    );
    assert_eq!(
        given_up
            .get("given_up_at")
            .and_then(|v| v.as_n().ok())
            .cloned(),
        Some(to_millis(at(10)).to_string())
    );
    assert!(!given_up.contains_key(UNSENT), "out of the index");
    let retention = Retention::default().deliveries.as_secs() as i64;
    assert_eq!(
        given_up
            .get("expires_at")
            .and_then(|v| v.as_n().ok())
            .cloned(),
        Some((to_millis(at(10)) / 1000 + retention).to_string())
    );
}

/// A resend of an endpoint's log leaves out a delivery past its expiry that TTL has not
/// deleted yet (DynamoDB deletes within days, and reads return it until then): the log no
/// longer shows it, and sending it again would bring back what retention removed.
#[tokio::test]
async fn a_resend_leaves_out_a_delivery_past_its_expiry_that_ttl_has_not_deleted_yet() {
    use crate::fixtures::{attempt, failed, replay};
    let store = store_hiding_expired().await;
    let (account, delivery) = one_delivery(&store).await;
    attempt(&store, &delivery.id, 2, failed()).await;
    let past = chrono::Utc::now().timestamp() - 60;
    store
        .client()
        .update_item()
        .table_name(&store.tables().deliveries)
        .set_key(delivery_key(&delivery.id))
        .update_expression("SET expires_at = :past")
        .expression_attribute_values(":past", n(past))
        .send()
        .await
        .unwrap();
    let request = ReplayRequest {
        replay: replay(
            &account,
            ReplayScope::Endpoint(delivery.endpoint_id.clone()),
            ReplayFilter::single(),
            3,
        ),
        limit: 100,
    };
    let outcome = store.replay(&request).await.unwrap();
    assert_eq!(outcome.queued, Vec::new(), "expired, not yet deleted");
    assert_eq!(outcome.replay.count, 0);
}

/// An owner's disable or delete abandons the endpoint's pending work within a budget (it
/// runs in an API request, 30 s at most on AWS); out of time, it says so and leaves the rest
/// pending, for the sender to abandon at its next try.
#[tokio::test]
async fn abandoning_an_endpoints_work_stops_at_its_deadline_and_says_so() {
    use crate::fixtures::status_of;
    let store = emulator_store().await;
    let (account, delivery) = one_delivery(&store).await;
    mark_disabled(&store, &account, &delivery.endpoint_id).await;
    let now = crate::fixtures::at(5);
    let out_of_time = store
        .abandon_pending_within(
            &account,
            &delivery.endpoint_id,
            "endpoint deleted",
            now,
            (std::time::Instant::now(), false),
        )
        .await
        .unwrap();
    assert_eq!(
        out_of_time,
        disable::Abandoned {
            count: 0,
            complete: false
        }
    );
    let left = status_of(&store, &account, &delivery.id).await;
    assert_eq!(left.status, DeliveryStatus::Pending);
    let in_time = store
        .abandon_pending_within(
            &account,
            &delivery.endpoint_id,
            "endpoint deleted",
            now,
            (
                std::time::Instant::now() + std::time::Duration::from_secs(10),
                false,
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        in_time,
        disable::Abandoned {
            count: 1,
            complete: true
        }
    );
    let done = status_of(&store, &account, &delivery.id).await;
    assert_eq!(done.status, DeliveryStatus::Abandoned);
}

/// A delete whose abandon stopped part way is made all the same (no error: it is committed),
/// and the health check finishes it, however old the delivery: the sweeper's walk passes
/// over a deleted endpoint, so a first try below its watermark was never indexed.
#[tokio::test]
async fn a_delete_that_stopped_part_way_is_finished_by_the_health_check() {
    use crate::fixtures::{at, status_of};
    let store = emulator_store().await;
    let (account, delivery) = one_delivery(&store).await;
    let abandon_fails = refusing_abandons(&store);
    let deletion = EndpointDeletion {
        account_id: account.clone(),
        endpoint_id: delivery.endpoint_id.clone(),
        at: at(5),
    };
    // A first try written in step with its event: outside the `pending` index.
    store
        .client()
        .update_item()
        .table_name(&store.tables().deliveries)
        .set_key(delivery_key(&delivery.id))
        .update_expression("REMOVE pending_shard, due_key")
        .send()
        .await
        .unwrap();
    assert!(abandon_fails.delete_endpoint(&deletion).await.unwrap());
    // The walk has gone past it.
    let past = to_millis(delivery.created_at) + 3_600_000;
    store
        .client()
        .put_item()
        .table_name(&store.tables().control)
        .set_item(Some(walk_state(Some(past), None)))
        .send()
        .await
        .unwrap();
    assert!(store
        .get_endpoint(&account, &delivery.endpoint_id)
        .await
        .unwrap()
        .is_none());
    let left = status_of(&store, &account, &delivery.id).await;
    assert_eq!(
        left.status,
        DeliveryStatus::Pending,
        "the abandon was refused"
    );

    // Its message lost, nothing else would ever end it (retention keeps pending work).
    assert!(store.failing_endpoints(at(10)).await.unwrap().is_empty());
    let done = status_of(&store, &account, &delivery.id).await;
    assert_eq!(
        (done.status, done.last_error.as_deref()),
        (DeliveryStatus::Abandoned, Some("endpoint deleted")),
        "finished by the check"
    );
    assert_eq!(
        failing_shard_of(&store, "acme", "ep_a").await,
        None,
        "out of the index once finished"
    );
    let item = store
        .get(&store.tables().endpoints, account_key("acme", "ep_a"))
        .await
        .unwrap()
        .unwrap();
    assert!(!item.contains_key("failing_since"), "{item:?}");
}

/// A deleted endpoint's id may be taken again, but not while its delete is unfinished (its
/// abandon stopped part way): the new endpoint's item would replace the tombstone and its
/// marker, and the old endpoint's pending deliveries, in the same log, would then be sent
/// to the new one's URL. Once the health check has finished the delete, the id is free.
#[tokio::test]
async fn an_id_whose_delete_is_unfinished_is_not_taken_again_until_it_is() {
    use crate::fixtures::{at, status_of};
    let store = emulator_store().await;
    let (account, delivery) = one_delivery(&store).await;
    let abandon_fails = refusing_abandons(&store);
    let deletion = EndpointDeletion {
        account_id: account.clone(),
        endpoint_id: delivery.endpoint_id.clone(),
        at: at(5),
    };
    assert!(abandon_fails.delete_endpoint(&deletion).await.unwrap());
    assert_eq!(
        status_of(&store, &account, &delivery.id).await.status,
        DeliveryStatus::Pending
    );
    let again = crate::fixtures::endpoint("acme", "ep_a", at(6));
    let refused = store.create_endpoint(&again).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::Conflict {
                entity: "endpoint",
                ..
            })
        ),
        "{refused:?}"
    );

    assert!(store.failing_endpoints(at(10)).await.unwrap().is_empty());
    assert_eq!(
        status_of(&store, &account, &delivery.id).await.status,
        DeliveryStatus::Abandoned
    );
    store.create_endpoint(&again).await.unwrap();
    let taken = store.get_endpoint(&account, &again.id).await.unwrap();
    assert_eq!(taken.map(|e| e.created_at), Some(again.created_at));
}

/// The owner's disable of the delivery's endpoint at 5 s, its abandon refused: the endpoint
/// is disabled, and its marker left for the health check to finish.
async fn disable_stopped_part_way(store: &DynamoStore, delivery: &Delivery) {
    let abandon_fails = refusing_abandons(store);
    let request = DisableRequest {
        account_id: delivery.account_id.clone(),
        endpoint_id: delivery.endpoint_id.clone(),
        reason: "disabled by its owner".into(),
        now: crate::fixtures::at(5),
        expected_failing_since: None,
        notification: None,
        operational_event: None,
    };
    assert!(abandon_fails.disable_endpoint(&request).await.is_ok());
}

/// The owner enables the endpoint again at `at`.
async fn enable_again(
    store: &DynamoStore,
    account: &AccountId,
    endpoint: &EndpointId,
    at: Timestamp,
) {
    let read = store
        .get_endpoint(account, endpoint)
        .await
        .unwrap()
        .unwrap();
    let mut enabled = read.clone();
    enabled.status = EndpointStatus::Active;
    enabled.disabled_reason = None;
    enabled.touch(at);
    store
        .update_endpoint(&enabled, &read.version())
        .await
        .unwrap();
}

/// An owner's disable of an endpoint that was not failing, stopped part way (its abandon
/// out of time, or failed), is found and finished by the health check: the disable gives it
/// a clock of 0 for the `failing` index alone, which reads as none and which an enable
/// removes.
#[tokio::test]
async fn an_owners_disable_of_a_healthy_endpoint_that_stopped_part_way_is_finished() {
    use crate::fixtures::{at, status_of};
    let store = emulator_store().await;
    let (account, delivery) = one_delivery(&store).await;
    disable_stopped_part_way(&store, &delivery).await;
    let read = store
        .get_endpoint(&account, &delivery.endpoint_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (read.status, read.failing_since),
        (EndpointStatus::Disabled, None)
    );
    let left = status_of(&store, &account, &delivery.id).await;
    assert_eq!(left.status, DeliveryStatus::Pending);

    // A check finishes what its time allows and the next goes on: on a loaded host the
    // emulator can take the abandon's whole budget, so a few checks, not one.
    for _ in 0..5 {
        assert!(store.failing_endpoints(at(10)).await.unwrap().is_empty());
        if failing_shard_of(&store, "acme", "ep_a").await.as_deref() == Some(FAILING_SHARD) {
            break;
        }
    }
    let done = status_of(&store, &account, &delivery.id).await;
    assert_eq!(
        done.status,
        DeliveryStatus::Abandoned,
        "finished by the check"
    );
    assert_eq!(
        failing_shard_of(&store, "acme", "ep_a").await.as_deref(),
        Some(FAILING_SHARD)
    );
    // Enabled again: no clock left, for the index or the sender.
    enable_again(&store, &account, &delivery.endpoint_id, at(20)).await;
    assert_eq!(failing_shard_of(&store, "acme", "ep_a").await, None);
    let item = store
        .get(&store.tables().endpoints, account_key("acme", "ep_a"))
        .await
        .unwrap()
        .unwrap();
    assert!(!item.contains_key("failing_since"), "{item:?}");
}

/// The `failing` index lags its table on AWS (every read of a GSI is eventually consistent;
/// the emulator's indexes never lag). An endpoint whose disable stopped part way, and that
/// its owner has enabled again since, may still be listed in the index as being disabled:
/// the health check must not finish that disable and abandon what the endpoint has pending
/// now (its owner's resend, say). The same goes for a deleted endpoint's id taken again.
#[tokio::test]
async fn a_disable_undone_since_is_not_finished_from_a_lagging_index() {
    use crate::fixtures::{at, status_of};
    let lag = crate::faults::LaggingIndex::of("failing");
    let on_time = emulator_store().await;
    let config = on_time
        .client()
        .config()
        .to_builder()
        .interceptor(lag.clone())
        .build();
    let store = DynamoStore {
        client: aws_sdk_dynamodb::Client::from_conf(config),
        ..on_time
    };
    let (account, delivery) = one_delivery(&store).await;
    disable_stopped_part_way(&store, &delivery).await;
    assert_eq!(
        failing_shard_of(&store, "acme", "ep_a").await.as_deref(),
        Some(DISABLING_SHARD)
    );
    // What the index shows of it until it catches up.
    let as_indexed = store
        .get(&store.tables().endpoints, account_key("acme", "ep_a"))
        .await
        .unwrap()
        .unwrap();
    enable_again(&store, &account, &delivery.endpoint_id, at(20)).await;
    assert_eq!(failing_shard_of(&store, "acme", "ep_a").await, None);

    lag.showing(vec![as_indexed]);
    store.failing_endpoints(at(30)).await.unwrap();
    assert_eq!(
        status_of(&store, &account, &delivery.id).await.status,
        DeliveryStatus::Pending,
        "an enabled endpoint's delivery abandoned from the index's old copy"
    );
    assert_eq!(failing_shard_of(&store, "acme", "ep_a").await, None);
}

/// What a client's requests did: the most in flight at once, and the queries, the items
/// they read (before their filters: what DynamoDB charges for) and the items they answered.
#[derive(Debug, Default)]
struct Reads {
    in_flight: std::sync::atomic::AtomicUsize,
    most_in_flight: std::sync::atomic::AtomicUsize,
    queries: std::sync::atomic::AtomicUsize,
    scanned: std::sync::atomic::AtomicUsize,
    returned: std::sync::atomic::AtomicUsize,
}

impl Reads {
    fn get(field: &std::sync::atomic::AtomicUsize) -> usize {
        field.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct CountReads(std::sync::Arc<Reads>);

impl aws_smithy_runtime_api::client::interceptors::Intercept for CountReads {
    fn name(&self) -> &'static str {
        "CountReads"
    }

    // A try's start and end are paired even when it times out (a slow host's emulator).
    fn read_before_attempt(
        &self,
        _: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.0.in_flight.fetch_add(1, SeqCst) + 1;
        self.0.most_in_flight.fetch_max(now, SeqCst);
        Ok(())
    }

    fn read_after_attempt(
        &self,
        _: &aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextRef<
            '_,
        >,
        _: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        self.0
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::AfterDeserializationInterceptorContextRef<'_>,
        _: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        use std::sync::atomic::Ordering::SeqCst;
        let output = context.output_or_error().ok();
        if let Some(query) =
            output.and_then(|o| o.downcast_ref::<aws_sdk_dynamodb::operation::query::QueryOutput>())
        {
            self.0.queries.fetch_add(1, SeqCst);
            let scanned = usize::try_from(query.scanned_count()).unwrap_or_default();
            self.0.scanned.fetch_add(scanned, SeqCst);
            let returned = usize::try_from(query.count()).unwrap_or_default();
            self.0.returned.fetch_add(returned, SeqCst);
        }
        Ok(())
    }
}

/// The store on the same tables through a client whose requests are counted.
fn counting_reads(store: &DynamoStore) -> (DynamoStore, std::sync::Arc<Reads>) {
    let reads = std::sync::Arc::new(Reads::default());
    let config = store
        .client()
        .config()
        .to_builder()
        .interceptor(CountReads(reads.clone()))
        .build();
    let counted = DynamoStore {
        client: aws_sdk_dynamodb::Client::from_conf(config),
        ..store.clone()
    };
    (counted, reads)
}

/// Every page of the account's log, `limit` at a time, newest first.
async fn whole_account_log(store: &DynamoStore, account: &AccountId, limit: u32) -> Vec<Delivery> {
    let mut query = DeliveryQuery {
        limit,
        ..DeliveryQuery::default()
    };
    let mut listed = Vec::new();
    for _ in 0..100 {
        let page = store.list_deliveries(account, &query).await.unwrap();
        listed.extend(page.items);
        match page.next_cursor {
            Some(cursor) => query.cursor = Some(cursor),
            None => return listed,
        }
    }
    panic!("the log never ends");
}

/// A store on the emulator with the account acme in it.
async fn acme_store() -> (DynamoStore, AccountId) {
    let store = emulator_store().await;
    store
        .create_account(&crate::fixtures::account("acme"))
        .await
        .unwrap();
    (store, AccountId::from_trusted("acme".into()))
}

/// The account's log reads a partition per endpoint it ever had, deleted ones included:
/// a bounded number at once, not all of them (each query in flight holds a connection, and
/// a Lambda execution environment has 1,024 file descriptors), with the same pages.
#[tokio::test]
async fn the_account_log_reads_a_bounded_number_of_partitions_at_once() {
    use crate::fixtures::{at, endpoint, publish, t0};
    let (store, account) = acme_store().await;
    const ENDPOINTS: i64 = 300;
    let mut expected = Vec::new();
    for i in 0..ENDPOINTS {
        let ep = endpoint("acme", &format!("ep_{i:03}"), t0());
        store.create_endpoint(&ep).await.unwrap();
        if i % 10 == 0 {
            let d = publish(&store, &account, i + 1, "invoice.paid", &[&ep]).await;
            expected.extend(d.into_iter().map(|d| (d.id, i % 30 == 0)));
        }
        // All but one in thirty deleted (their pending deliveries abandoned).
        if i % 30 != 0 {
            let deletion = EndpointDeletion {
                account_id: account.clone(),
                endpoint_id: ep.id.clone(),
                at: at(1_000),
            };
            assert!(store.delete_endpoint(&deletion).await.unwrap());
        }
    }
    expected.reverse();

    let (counted, reads) = counting_reads(&store);
    let listed: Vec<_> = whole_account_log(&counted, &account, 7)
        .await
        .into_iter()
        .map(|d| (d.id, d.status == DeliveryStatus::Pending))
        .collect();
    assert_eq!(listed, expected, "every delivery once, newest first");
    let most = Reads::get(&reads.most_in_flight);
    assert!(
        most > 1 && most <= LOG_READ_CONCURRENCY,
        "{most} queries in flight at once; at most {LOG_READ_CONCURRENCY}"
    );
}

/// A page of the account's log reads about a page from its partitions, not a page from
/// each: the first query in each asks for an equal part, and a partition whose deliveries
/// the page shows is read further, twice as many each time. The pages are the same.
#[tokio::test]
async fn a_page_of_the_account_log_reads_about_a_page_not_a_page_per_endpoint() {
    use crate::fixtures::{endpoint, publish, t0};
    let (store, account) = acme_store().await;
    const ENDPOINTS: usize = 40;
    let mut endpoints = Vec::new();
    for i in 0..ENDPOINTS {
        let ep = endpoint("acme", &format!("ep_{i:02}"), t0());
        store.create_endpoint(&ep).await.unwrap();
        endpoints.push(ep);
    }
    let receivers: Vec<&Endpoint> = endpoints.iter().collect();
    // 12 events to all 40: 480 deliveries, each endpoint's newest of the same event.
    let mut expected = Vec::new();
    for event in 1..=12 {
        let mut created = publish(&store, &account, event, "invoice.paid", &receivers).await;
        created.sort_by(|a, b| b.id.cmp(&a.id));
        expected.splice(0..0, created.into_iter().map(|d| d.id));
    }

    let (counted, reads) = counting_reads(&store);
    let page = counted
        .list_deliveries(
            &account,
            &DeliveryQuery {
                limit: 10,
                ..DeliveryQuery::default()
            },
        )
        .await
        .unwrap();
    let shown: Vec<_> = page.items.iter().map(|d| d.id.clone()).collect();
    assert_eq!(shown, expected[..10], "the newest ten");
    let scanned = Reads::get(&reads.scanned);
    assert!(
        scanned <= 2 * ENDPOINTS + 4 * 11,
        "read {scanned} deliveries for a page of 10 from {ENDPOINTS} endpoints"
    );
    let listed: Vec<_> = whole_account_log(&counted, &account, 25)
        .await
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(listed, expected, "every delivery once, newest first");
}

/// A bulk replay reads the endpoint's log a page at a time and stops once it has found one
/// more matching delivery than it replays (which tells it there is more), rather than
/// reading the whole window first: a month of deliveries is more than the api's memory.
#[tokio::test]
async fn a_bulk_replay_stops_reading_once_it_has_found_one_more_than_its_limit() {
    use crate::fixtures::{attempt, failed, publish, replay};
    let store = emulator_store().await;
    let account = AccountId::from_trusted("acme".into());
    let [ep] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_a"]).await;
    const WINDOW: i64 = 60;
    let mut matching = Vec::new();
    for second in 1..=WINDOW {
        // Failed, but one in three delivered; one in four of another type.
        let event_type = if second % 4 == 0 {
            "user.created"
        } else {
            "invoice.paid"
        };
        let d = publish(&store, &account, second, event_type, &[&ep])
            .await
            .remove(0);
        let decision = if second % 3 == 0 {
            Decision::Delivered
        } else {
            failed()
        };
        attempt(&store, &d.id, second, decision).await;
        if second % 3 != 0 && second % 4 != 0 {
            matching.push((second, d.id));
        }
    }
    let filter = ReplayFilter::bulk(
        crate::fixtures::at(0),
        None,
        Some(vec![DeliveryStatus::Failed]),
        vec![EventType::parse("invoice.paid").unwrap()],
        false,
    )
    .unwrap();
    let (counted, reads) = counting_reads(&store);
    let limit = 5;
    let outcome = counted
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Endpoint(ep.id.clone()),
                filter.clone(),
                WINDOW + 10,
            ),
            limit,
        })
        .await
        .unwrap();
    let queued: Vec<_> = outcome
        .queued
        .iter()
        .map(|p| p.delivery_id.clone())
        .collect();
    let oldest: Vec<_> = matching[..5].iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(queued, oldest, "the oldest matching ones");
    assert_eq!((outcome.replay.count, outcome.replay.more), (5, true));
    // The sixth match tells there is more; what is read past it is one page at most.
    let (sixth, _) = matching[5];
    let scanned = Reads::get(&reads.scanned);
    let most = usize::try_from(sixth).unwrap() + 2 * (limit as usize + 1);
    assert!(
        scanned <= most,
        "read {scanned} deliveries of the {WINDOW} in the window; the sixth match is the {sixth}th"
    );

    // Asked again, it goes on with the next ones (the first five are pending now).
    let outcome = counted
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Endpoint(ep.id.clone()),
                filter,
                WINDOW + 11,
            ),
            limit,
        })
        .await
        .unwrap();
    let queued: Vec<_> = outcome
        .queued
        .iter()
        .map(|p| p.delivery_id.clone())
        .collect();
    let next: Vec<_> = matching[5..10].iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(queued, next);
    assert!(outcome.replay.more);
}

/// Tombstones never expire, but the account's log passes over the partitions of endpoints
/// deleted so long ago that none of their deliveries can still be shown; not those of one
/// deleted lately, nor of one whose delete has yet to abandon its pending work.
#[tokio::test]
async fn the_account_log_passes_over_endpoints_deleted_longer_ago_than_it_shows() {
    let store = store_hiding_expired().await;
    let account = AccountId::from_trusted("acme".into());
    let [_, old, recent, unfinished] = crate::fixtures::account_with_endpoints(
        &store,
        "acme",
        ["ep_live", "ep_old", "ep_recent", "ep_unfinished"],
    )
    .await;
    let now = chrono::Utc::now();
    let shown_for = store.retention.retries + store.retention.deliveries;
    let long_ago = crate::clock::sub(now, shown_for + std::time::Duration::from_secs(3_600));
    let lately = crate::clock::sub(now, shown_for - std::time::Duration::from_secs(3_600));
    for (endpoint, at) in [(&old, long_ago), (&recent, lately), (&unfinished, long_ago)] {
        let deletion = EndpointDeletion {
            account_id: account.clone(),
            endpoint_id: endpoint.id.clone(),
            at,
        };
        assert!(store.delete_endpoint(&deletion).await.unwrap());
        // As the health check would: a busy emulator can outlast the delete's own finishing.
        store
            .finish_deleting(&account, &endpoint.id, at)
            .await
            .unwrap();
    }
    // As a delete that stopped before abandoning its work leaves it.
    store
        .client()
        .update_item()
        .table_name(&store.tables().endpoints)
        .set_key(Some(account_key("acme", "ep_unfinished")))
        .update_expression("SET failing_shard = :disabling")
        .expression_attribute_values(":disabling", s(DISABLING_SHARD))
        .send()
        .await
        .unwrap();

    let ids = |ids: Vec<EndpointId>| ids.into_iter().map(|id| id.to_string()).collect::<Vec<_>>();
    let read = store.endpoints_with_a_log(&account).await.unwrap();
    assert_eq!(ids(read), ["ep_live", "ep_recent", "ep_unfinished"]);
    let (counted, reads) = counting_reads(&store);
    let query = DeliveryQuery {
        limit: 10,
        ..DeliveryQuery::default()
    };
    counted.list_deliveries(&account, &query).await.unwrap();
    assert_eq!(
        Reads::get(&reads.queries),
        1 + 3,
        "the endpoints, then three log partitions"
    );
    // A store showing what has expired (the contract tests') reads every one.
    let showing = store.clone().showing_expired();
    let read = showing.endpoints_with_a_log(&account).await.unwrap();
    assert_eq!(read.len(), 4);
}

/// An erasure of an event sent to more endpoints than one call gets through stops after a
/// page, records where on the event item, and the next call goes on from there; once one has
/// been through them all, a repeat starts over from the first.
#[tokio::test]
async fn an_erasure_longer_than_one_call_is_finished_by_the_next() {
    use crate::clock::add;
    use crate::fixtures::{
        account_with_numbered_endpoints, attempt_record, publish_to_all, status_of, t0,
    };
    use std::time::Duration;
    let mut store = emulator_store().await;
    store.erase_budget = Duration::ZERO;
    let endpoints = account_with_numbered_endpoints(&store, "acme", 130).await;
    let (ev, deliveries) = publish_to_all(&store, &endpoints, "evt_wide").await;
    // One delivery in each page of 100 delivered, its answer quoting the payload.
    let (early, late) = (&deliveries[5], &deliveries[120]);
    for d in [early, late] {
        let mut record = attempt_record(
            d,
            1,
            Decision::Delivered,
            true,
            add(t0(), Duration::from_secs(1)),
        );
        record.attempt.response_body = "echo: evt_wide".into();
        store.record_attempt(&record).await.unwrap();
    }
    let body = |d: &Delivery| {
        let (store, id) = (&store, d.id.clone());
        async move {
            store.list_attempts(&id).await.unwrap()[0]
                .response_body
                .clone()
        }
    };
    let waiting = &deliveries[110];
    let erase = |second: u64| {
        store.erase_event(
            &ev.account_id,
            &ev.id,
            add(t0(), Duration::from_secs(second)),
        )
    };

    let first = erase(5).await.unwrap().unwrap();
    assert!(first.event.is_erased());
    assert_eq!(
        (first.ended, first.complete),
        (99, false),
        "the first page only"
    );
    assert_eq!(body(early).await, "");
    assert_eq!(body(late).await, "echo: evt_wide", "past the first page");
    assert_eq!(
        status_of(&store, &ev.account_id, &waiting.id).await.status,
        DeliveryStatus::Pending
    );

    let second = erase(6).await.unwrap().unwrap();
    assert_eq!((second.ended, second.complete), (29, true), "the rest");
    assert_eq!(second.event.erased_at, first.event.erased_at);
    assert_eq!(body(late).await, "");
    assert_eq!(
        status_of(&store, &ev.account_id, &waiting.id).await.status,
        DeliveryStatus::Failed
    );

    let again = erase(7).await.unwrap().unwrap();
    assert_eq!(
        (again.ended, again.complete),
        (0, false),
        "from the first page"
    );
}

/// An erasure a call left unfinished is listed for the sweeper, whose run finishes it and
/// drops it from the list; one whose event is gone meanwhile (retention) is dropped too.
#[tokio::test]
async fn an_erasure_left_unfinished_is_finished_by_the_sweeper() {
    use crate::clock::add;
    use crate::fixtures::{account_with_numbered_endpoints, attempt_record, publish_to_all, t0};
    use std::time::Duration;
    let mut store = emulator_store().await;
    store.erase_budget = Duration::ZERO;
    let endpoints = account_with_numbered_endpoints(&store, "acme", 101).await;
    let (wide, sent) = publish_to_all(&store, &endpoints, "evt_wide").await;
    let (gone, _) = publish_to_all(&store, &endpoints, "evt_gone").await;
    // The last delivery, on the second page, has an answer quoting the payload.
    let last = sent[100].clone();
    let mut record = attempt_record(
        &last,
        1,
        Decision::Delivered,
        true,
        add(t0(), Duration::from_secs(1)),
    );
    record.attempt.response_body = "echo: evt_wide".into();
    store.record_attempt(&record).await.unwrap();
    let body = || async {
        store.list_attempts(&last.id).await.unwrap()[0]
            .response_body
            .clone()
    };
    let at = |second: u64| add(t0(), Duration::from_secs(second));
    for ev in [&wide, &gone] {
        let call = store
            .erase_event(&ev.account_id, &ev.id, at(5))
            .await
            .unwrap();
        assert!(!call.unwrap().complete, "{}: one page a call", ev.id);
    }
    let mut listed = store.unfinished_erasures().await.unwrap();
    listed.sort();
    assert_eq!(
        listed,
        [&gone, &wide].map(|e| (e.account_id.clone(), e.id.clone()))
    );
    assert_eq!(body().await, "echo: evt_wide");
    // Retention removes one of the events before the sweeper comes.
    store
        .client
        .delete_item()
        .table_name(&store.tables.events)
        .set_key(Some(account_key("acme", "evt_gone")))
        .send()
        .await
        .unwrap();

    assert_eq!(
        store.finish_erasures(at(300), Duration::MAX).await.unwrap(),
        1
    );
    assert_eq!(body().await, "", "the second page is erased");
    assert_eq!(store.unfinished_erasures().await.unwrap(), []);
    assert_eq!(
        store.finish_erasures(at(600), Duration::MAX).await.unwrap(),
        0
    );

    // Listed, but its place never written (the call stopped between the two writes): the
    // sweeper erases it from the first delivery, and once that is done, drops it too.
    let (small, _) = publish_to_all(&store, &endpoints[..1], "evt_small").await;
    store
        .list_unfinished(&small.account_id, &small.id, None, at(700))
        .await
        .unwrap();
    assert_eq!(
        store.finish_erasures(at(700), Duration::MAX).await.unwrap(),
        1
    );
    assert_eq!(store.unfinished_erasures().await.unwrap(), []);
    // One that fails (its delivery item is unreadable) stays listed; the one after it in
    // the list is finished all the same, and the sweep goes on.
    let (broken, sent) = publish_to_all(&store, &endpoints[..1], "evt_broken").await;
    let (fine, _) = publish_to_all(&store, &endpoints[..1], "evt_fine").await;
    store
        .client
        .update_item()
        .table_name(&store.tables.deliveries)
        .set_key(delivery_key(&sent[0].id))
        .update_expression("SET #status = :bogus")
        .expression_attribute_names("#status", "status")
        .expression_attribute_values(":bogus", s("bogus"))
        .send()
        .await
        .unwrap();
    for (ev, second) in [(&broken, 800), (&fine, 801)] {
        store
            .list_unfinished(&ev.account_id, &ev.id, None, at(second))
            .await
            .unwrap();
    }
    assert_eq!(
        store.finish_erasures(at(900), Duration::MAX).await.unwrap(),
        1
    );
    assert_eq!(
        store.unfinished_erasures().await.unwrap(),
        [(broken.account_id.clone(), broken.id.clone())]
    );
}

/// A write DynamoDB keeps refusing for throughput is sent again after pauses, none of which
/// ends past the caller's `until`: a sender's record gives the refusal back in time for its
/// batch to end inside the function's timeout. Past `until` already, it is sent once; with
/// no `until`, it is sent again [`UNPROCESSED_ROUNDS`] times. (Time is paused: the pauses
/// take none.)
#[tokio::test(start_paused = true)]
async fn a_throttled_write_is_sent_again_until_its_callers_time_runs_out() {
    use aws_sdk_dynamodb::{
        operation::put_item::PutItemError, types::error::ProvisionedThroughputExceededException,
    };
    use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let refused = || {
        let meta = aws_smithy_types::error::ErrorMetadata::builder()
            .code("ProvisionedThroughputExceededException")
            .build();
        let error = ProvisionedThroughputExceededException::builder()
            .meta(meta)
            .build();
        SdkError::service_error(
            PutItemError::ProvisionedThroughputExceededException(error),
            HttpResponse::new(
                400.try_into().unwrap(),
                aws_smithy_types::body::SdkBody::empty(),
            ),
        )
    };
    let sends = AtomicUsize::new(0);
    let send = || {
        sends.fetch_add(1, SeqCst);
        std::future::ready(Err::<(), _>(refused()))
    };
    let wait = std::time::Duration::from_secs(6);
    let mut most = std::time::Duration::ZERO;
    // The pauses are drawn at random: many runs, each within the wait.
    for _ in 0..50 {
        sends.store(0, SeqCst);
        let began = tokio::time::Instant::now();
        let answer = sent_through_throttling(Some(began + wait), send).await;
        assert!(is_throttled(&answer.unwrap_err()));
        let took = began.elapsed();
        assert!(
            took <= wait,
            "the pauses ended {took:?} after the first send"
        );
        assert!(sends.load(SeqCst) >= 2, "no pause within {wait:?}");
        most = most.max(took);
    }
    assert!(
        most > wait / 2,
        "the pauses stopped long before the wait: {most:?}"
    );

    // Past `until` already (at it, a pause drawn as 0 ms would not end past it): sent once,
    // whatever the pause drawn.
    for _ in 0..100 {
        sends.store(0, SeqCst);
        let began = tokio::time::Instant::now();
        let past = began - std::time::Duration::from_millis(1);
        let answer = sent_through_throttling(Some(past), send).await;
        assert!(answer.is_err());
        assert_eq!(
            (sends.load(SeqCst), began.elapsed()),
            (1, std::time::Duration::ZERO)
        );
    }

    sends.store(0, SeqCst);
    let answer = sent_through_throttling(None, send).await;
    assert!(answer.is_err());
    assert_eq!(sends.load(SeqCst), 1 + UNPROCESSED_ROUNDS as usize);
}

/// An attempt is recorded when its endpoint's failing clock cannot be written: the
/// delivery's own update decides, and the clock starts at the next attempt, as after a
/// crash between the two writes. (When the clock's failure failed the record, the attempt
/// read as unrecorded though its delivery had moved on: its message came back for
/// nothing, and its follow-up was not queued.)
#[tokio::test]
async fn an_attempt_is_recorded_when_its_endpoints_failing_clock_cannot_be_written() {
    use crate::fixtures::t0;
    let store = emulator_store().await;
    let (account, delivery) = one_delivery(&store).await;
    // The delivery's update goes through; the next, the clock's, is refused.
    let refusing =
        refusing_after::<aws_sdk_dynamodb::operation::update_item::UpdateItemInput>(&store, 1);
    let later = |secs: i64| t0() + chrono::Duration::seconds(secs);
    let first = crate::fixtures::attempt_record(
        &delivery,
        1,
        Decision::RetryAt(later(60)),
        false,
        later(1),
    );
    let (metrics, log, _recorder) = crate::testing::capture_lambda_metrics("hooklane-test");
    let outcome = metrics.flushed(refusing.record_attempt(&first)).await;
    assert!(
        matches!(
            outcome,
            Ok(RecordOutcome::Recorded {
                endpoint_failing_since: None
            })
        ),
        "{outcome:?}"
    );
    assert_eq!(
        log.value(
            crate::telemetry::RECORDS_INCOMPLETE,
            &[("Stack", "hooklane-test"), ("part", "failing_clock")]
        ),
        Some(serde_json::json!(1))
    );
    let stored = store
        .get_delivery(&account, &delivery.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stored.attempts, stored.next_try_at), (1, Some(later(60))));
    let endpoint = store
        .get_endpoint(&account, &delivery.endpoint_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        endpoint.failing_since, None,
        "the clock was written after all"
    );

    let second = crate::fixtures::attempt_record(
        &delivery,
        2,
        Decision::RetryAt(later(120)),
        false,
        later(61),
    );
    let outcome = store.record_attempt(&second).await.unwrap();
    assert_eq!(
        outcome,
        RecordOutcome::Recorded {
            endpoint_failing_since: Some(later(61))
        }
    );
}

/// A sender's record of an attempt is a conditional update of the delivery: pending, at the
/// attempt count it read. Sent again after its late answer, it finds the delivery moved on
/// by its own first try, with its call's token: recorded (the endpoint's failing clock
/// started), not taken for another sender's record. A second call of the same record is.
#[tokio::test]
async fn an_attempt_record_answered_late_is_taken_as_recorded() {
    use crate::fixtures::{attempt_record, t0};
    crate::testing::require_emulator();
    // A `late…` stack: the emulator holds back its first answer to each write past the SDK's
    // read timeout (`scripts/moto_server_atomic.py`).
    let tables = TableNames::with_prefix(&format!("late{}", uuid::Uuid::new_v4().simple()));
    let client = crate::aws::clients::dynamodb(&crate::aws::load_sdk_config().await, None);
    let store = crate::testing::emulator_store_on(client, &tables).await;
    let (_, delivery) = one_delivery(&store).await;
    let failed_at = crate::clock::add(t0(), std::time::Duration::from_secs(1));
    let retry_at = crate::clock::add(t0(), std::time::Duration::from_secs(60));
    let record = attempt_record(&delivery, 1, Decision::RetryAt(retry_at), false, failed_at);
    assert_eq!(
        store.record_attempt(&record).await.unwrap(),
        RecordOutcome::Recorded {
            endpoint_failing_since: Some(failed_at)
        }
    );
    assert_eq!(
        store.record_attempt(&record).await.unwrap(),
        RecordOutcome::Stale
    );
    let stored = store
        .get_delivery(&delivery.account_id, &delivery.id)
        .await
        .unwrap();
    assert_eq!(
        stored.map(|d| (d.attempts, d.next_try_at)),
        Some((1, Some(retry_at)))
    );
}

/// The SDK sends a write again when the answer to its try has not begun after the read
/// timeout, though the try may have been applied. The first answer to each `PutItem` and
/// `TransactWriteItems` of a `late…` stack comes after that (`scripts/moto_server_atomic.py`),
/// so each is sent again: an account (one conditional put) and an endpoint (a transaction,
/// with the account's count) are each created once, not refused as a conflict with
/// themselves on the second try; a run's lock is taken, and a replay recorded. DynamoDB answers a transaction's try as the first was, by
/// the `ClientRequestToken` they share; a put, which has none, finds its own item and is
/// taken as written. The emulator refuses the token again with other items, as DynamoDB does.
#[tokio::test]
async fn a_write_whose_answer_came_too_late_is_tried_again_and_applied_once() {
    use aws_sdk_dynamodb::{error::ProvideErrorMetadata, types::Put, types::TransactWriteItem};
    crate::testing::require_emulator();
    let tables = TableNames::with_prefix(&format!("late{}", uuid::Uuid::new_v4().simple()));
    let tokens = crate::aws::clients::tests::TransactTokens::default();
    let puts = crate::faults::PutTries::of(&tables.accounts);
    let sdk = crate::aws::load_sdk_config().await;
    let client = crate::aws::clients::dynamodb(
        &sdk,
        Some(&crate::aws::clients::SharedInterceptor::new(tokens.clone())),
    );
    let client = client
        .config()
        .to_builder()
        .interceptor(puts.clone())
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(client);
    let store = crate::testing::emulator_store_on(client.clone(), &tables).await;

    let [endpoint] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_a"]).await;
    assert!(
        puts.sent() >= 2,
        "the account's late put was not sent again: {}",
        puts.sent()
    );
    let tries = tokens.of_transactions();
    let mut distinct = tries.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 1, "{tries:?}");
    assert!(
        tries.len() >= 2,
        "the late transaction was not sent again: {tries:?}"
    );
    let account = AccountId::from_trusted("acme".into());
    assert!(store.get_account(&account).await.unwrap().is_some());
    let stored = store.get_endpoint(&account, &endpoint.id).await.unwrap();
    assert_eq!(stored.map(|e| e.url), Some(endpoint.url));
    // An event published through the stream, a run's lock and a replay that matched
    // nothing: puts of the same kind.
    let event = crate::fixtures::event("acme", "evt_late", crate::fixtures::t0());
    assert_eq!(
        store.put_event(&event).await.unwrap(),
        PutEventOutcome::Created
    );
    assert!(matches!(
        store.put_event(&event).await.unwrap(),
        PutEventOutcome::AlreadyExists(_)
    ));
    let (now, until) = (crate::fixtures::at(1), crate::fixtures::at(60));
    assert!(store.take_run("sweep", now, until).await.unwrap().is_some());
    let scope = crate::domain::ReplayScope::Endpoint(endpoint.id.clone());
    let filter = crate::domain::ReplayFilter::single();
    let replay = crate::fixtures::replay(&account, scope, filter, 2);
    let request = crate::store::ReplayRequest { replay, limit: 10 };
    let outcome = store.replay(&request).await.unwrap();
    assert!(outcome.queued.is_empty());
    assert!(matches!(
        store.replay(&request).await,
        Err(StoreError::Conflict { .. })
    ));

    let put = |id: &str| {
        let item = Put::builder()
            .table_name(&tables.control)
            .item("pk", AttributeValue::S(format!("token-probe-{id}")))
            .build()
            .unwrap();
        TransactWriteItem::builder().put(item).build()
    };
    let token = uuid::Uuid::new_v4().to_string();
    let send = |id: &str| {
        client
            .transact_write_items()
            .client_request_token(&token)
            .transact_items(put(id))
            .send()
    };
    send("a").await.unwrap();
    let other = send("b").await.unwrap_err();
    assert_eq!(
        other.code(),
        Some("IdempotentParameterMismatchException"),
        "{other:?}"
    );
}

/// A disable abandons its endpoint's pending deliveries for up to `ABANDON_BUDGET` after the
/// endpoint is disabled, and the owner may enable it again meanwhile. Each abandon write is
/// checked against the endpoint, in its transaction: once it is enabled again, what is still
/// pending stays pending, for the endpoint to get. (Here the abandon's writes come after the
/// enable: the endpoint was never disabled.)
#[tokio::test]
async fn an_abandon_stops_once_its_endpoint_is_enabled_again() {
    let store = emulator_store().await;
    let account = AccountId::from_trusted("acme".into());
    let [ep] = crate::fixtures::account_with_endpoints(&store, "acme", ["ep_a"]).await;
    let mut deliveries = Vec::new();
    for second in 1..=3 {
        deliveries.extend(
            crate::fixtures::publish(&store, &account, second, "invoice.paid", &[&ep]).await,
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let abandoned = store
        .abandon_pending_within(
            &account,
            &ep.id,
            "endpoint disabled",
            crate::fixtures::at(9),
            (deadline, false),
        )
        .await
        .unwrap();
    assert_eq!(abandoned.count, 0, "{abandoned:?}");
    for delivery in &deliveries {
        let stored = store
            .get_delivery(&account, &delivery.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.status, DeliveryStatus::Pending, "{}", delivery.id);
    }
}
