//! A stream batch handled more than once — Lambda retrying it after a crash, and two
//! invocations running it at the same moment — against the emulator: exactly one delivery
//! per (event, endpoint), exactly one queue message per delivery, and a redundant message
//! for a delivery that is already delivered makes no second request.

use std::{
    collections::{BTreeMap, HashMap},
    sync::atomic::Ordering,
    time::Duration,
};

use aws_lambda_events::event::dynamodb::Event as StreamBatch;
use hooklane::{
    aws::{aws_sdk_dynamodb::types::AttributeValue, aws_sdk_sqs, shape::AwsShape},
    domain::{AccountId, Event, EventId, EventType},
    queue::sqs::DeliveryMessage,
    service::sender::{handle_message, Handled, Lanes},
};
use hooklane_testkit::{
    fixtures,
    testing::{
        emulated_shape, receive_queued, slow_receiver, stored_event_item, write_through_outbox,
    },
};
use serde_json::{json, Value};

use super::handle;

const ENDPOINTS: [&str; 3] = ["ep_a", "ep_b", "ep_c"];

/// DynamoDB JSON, as the stream carries item images.
fn dynamodb_json(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        AttributeValue::Null(_) => json!({ "NULL": true }),
        AttributeValue::M(m) => json!({ "M": image(m) }),
        AttributeValue::L(l) => json!({ "L": l.iter().map(dynamodb_json).collect::<Vec<_>>() }),
        AttributeValue::Ss(ss) => json!({ "SS": ss }),
        AttributeValue::Ns(ns) => json!({ "NS": ns }),
        other => panic!("no stream form for {other:?} in this test"),
    }
}

fn image(item: &HashMap<String, AttributeValue>) -> Value {
    Value::Object(
        item.iter()
            .map(|(name, value)| (name.clone(), dynamodb_json(value)))
            .collect(),
    )
}

/// Writes the events through the outbox helper (the platform's own transaction) and returns
/// the stream batch DynamoDB makes of them: one INSERT record each, with the stored item as
/// its new image.
async fn outbox_batch(
    shape: &AwsShape,
    ids: &[&str],
    first_sequence: u64,
) -> (StreamBatch, Vec<Event>) {
    let template: Value =
        serde_json::from_str(include_str!("../fixtures/events-stream.json")).unwrap();
    let mut records = Vec::new();
    let mut events = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let event = Event::new(
            EventId::parse(id).unwrap(),
            AccountId::parse("acme").unwrap(),
            EventType::parse("invoice.paid").unwrap(),
            fixtures::t0(),
            &json!({ "n": n }),
        )
        .unwrap();
        write_through_outbox(shape, &event).await;
        let stored = stored_event_item(&shape.store, "acme", id).await;
        let mut record = template["Records"][0].clone();
        record["dynamodb"]["Keys"] = json!({ "account_id": {"S": "acme"}, "id": {"S": id} });
        record["dynamodb"]["NewImage"] = image(&stored);
        record["dynamodb"]["SequenceNumber"] = json!((first_sequence + n as u64).to_string());
        record["eventID"] = json!(format!("replay-{id}"));
        records.push(record);
        events.push(event);
    }
    let batch = serde_json::from_value(json!({ "Records": records })).unwrap();
    (batch, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_batch_handled_twice_or_at_once_makes_each_delivery_once_and_one_request_each() {
    let (settings, shape) = emulated_shape().await;
    let receiver = slow_receiver(Duration::from_millis(5)).await;
    let store = shape.app.store.as_ref();
    let endpoints = ENDPOINTS.map(|id| fixtures::endpoint_sending_to("acme", id, &receiver.url));
    fixtures::create_account_and_endpoints(store, "acme", &endpoints).await;

    // Lambda retries a batch after a crash: the same records again, one after the other.
    let (retried, retried_events) =
        outbox_batch(&shape, &["evt_retried_1", "evt_retried_2"], 100).await;
    for _ in 0..2 {
        let response = handle(&shape, retried.clone()).await;
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
    }
    // Two invocations with the same records at the same moment (a retry overlapping a slow
    // first run).
    let (overlapping, overlapping_events) = outbox_batch(
        &shape,
        &["evt_overlap_1", "evt_overlap_2", "evt_overlap_3"],
        200,
    )
    .await;
    let (first, second) = tokio::join!(
        handle(&shape, overlapping.clone()),
        handle(&shape, overlapping.clone())
    );
    assert!(first.batch_item_failures.is_empty(), "{first:?}");
    assert!(second.batch_item_failures.is_empty(), "{second:?}");
    let third = handle(&shape, overlapping).await;
    assert!(third.batch_item_failures.is_empty(), "{third:?}");

    let events: Vec<_> = retried_events.iter().chain(&overlapping_events).collect();
    let mut delivery_ids = Vec::new();
    for event in &events {
        let deliveries = store.deliveries_of_event(event).await.unwrap();
        let mut endpoints: Vec<_> = deliveries
            .iter()
            .map(|d| d.endpoint_id.to_string())
            .collect();
        endpoints.sort();
        assert_eq!(
            endpoints, ENDPOINTS,
            "one delivery per endpoint for {}",
            event.id
        );
        delivery_ids.extend(deliveries.into_iter().map(|d| d.id.to_string()));
    }
    let expected = events.len() * ENDPOINTS.len();
    assert_eq!(delivery_ids.len(), expected);

    // Every delivery is queued, by the run that created it and again by each replay that
    // found it still pending without an attempt (it cannot know whether the first run got
    // as far as queueing it).
    let mut messages = Vec::new();
    for _ in 0..20 {
        let got = receive_queued(&settings.queue_url, 1).await;
        if got.is_empty() && messages.len() >= expected {
            break;
        }
        messages.extend(got);
    }
    let mut per_delivery: BTreeMap<String, usize> = BTreeMap::new();
    for message in &messages {
        let (delivery, _, _) = DeliveryMessage::parse(message.body().unwrap()).unwrap();
        *per_delivery.entry(delivery.to_string()).or_default() += 1;
    }
    // Batch A ran twice, batch B three times: no delivery is queued more often than that.
    assert!(
        per_delivery.values().all(|n| (1..=3).contains(n)),
        "{per_delivery:?}"
    );
    delivery_ids.sort();
    assert_eq!(
        per_delivery.keys().cloned().collect::<Vec<_>>(),
        delivery_ids
    );

    // Every message handled twice (a redelivered copy): one request per delivery, every
    // later copy skipped without a request.
    let lanes = Lanes {
        slots: shape.slots.as_ref(),
        rate: shape.slots.as_ref(),
        sweep_grace: shape.sweep_grace,
        send_by: None,
    };
    let mut skipped = 0;
    let mut attempted = std::collections::BTreeSet::new();
    for _copy in 0..2 {
        for message in &messages {
            let (delivery, endpoint, account) =
                DeliveryMessage::parse(message.body().unwrap()).unwrap();
            let handled = handle_message(&shape.app, lanes, &delivery, &endpoint, &account)
                .await
                .unwrap();
            match handled {
                // A copy of a delivery already done: dropped before it takes a slot.
                Handled::Skipped
                | Handled::Attempted(hooklane::service::deliver::AttemptResult::Skipped) => {
                    skipped += 1
                }
                Handled::Attempted(result) => {
                    assert!(result.follow_up().is_none());
                    assert!(
                        attempted.insert(delivery.to_string()),
                        "{delivery} attempted twice"
                    );
                }
                other => panic!("{delivery}: {other:?}"),
            }
        }
    }
    assert_eq!(attempted.len(), expected);
    assert_eq!(skipped, messages.len() * 2 - expected);
    let arrivals = receiver.arrivals();
    assert_eq!(arrivals.len(), expected, "one request per delivery");
    assert_eq!(receiver.served.load(Ordering::SeqCst), expected);
    let mut per_webhook_id: BTreeMap<String, usize> = BTreeMap::new();
    for arrival in &arrivals {
        *per_webhook_id
            .entry(arrival.webhook_id.clone().unwrap())
            .or_default() += 1;
    }
    assert!(
        per_webhook_id.values().all(|n| *n == ENDPOINTS.len()),
        "{per_webhook_id:?}"
    );
    println!(
        "fan-out replay figures: events={} endpoints={} handler_runs=5 (2 sequential + 2 \
         concurrent + 1) deliveries={} queue_messages={} messages_handled={} requests={}",
        events.len(),
        ENDPOINTS.len(),
        delivery_ids.len(),
        messages.len(),
        messages.len() * 2,
        arrivals.len(),
    );
}

/// Fan-out dies after its deliveries are written but before they are queued; Lambda's retry
/// finds them all existing, still pending without an attempt, and queues them (creating
/// nothing twice). The sweeper would also hand them to the queue once past the grace period.
#[tokio::test]
async fn deliveries_left_unqueued_by_a_dead_fan_out_are_queued_by_its_retry() {
    let (settings, shape) = emulated_shape().await;
    let store = shape.app.store.as_ref();
    fixtures::account_with_endpoints(store, "acme", ENDPOINTS).await;
    let (batch, events) = outbox_batch(&shape, &["evt_half_done"], 300).await;
    let event = &events[0];
    // What fan_out had done when it died: the deliveries, with their one possible id each.
    let written: Vec<_> = ENDPOINTS
        .iter()
        .map(|id| {
            let endpoint = hooklane::domain::EndpointId::parse(id).unwrap();
            hooklane::domain::Delivery::new_pending(event, endpoint.clone(), fixtures::t0())
        })
        .collect();
    assert_eq!(store.add_deliveries(&written).await.unwrap().len(), 3);

    let retry = handle(&shape, batch).await;
    assert!(retry.batch_item_failures.is_empty(), "{retry:?}");
    let receive = || receive_queued(&settings.queue_url, 1);
    let queued_ids = |messages: Vec<aws_sdk_sqs::types::Message>| {
        let mut ids: Vec<String> = messages
            .iter()
            .map(|m| {
                DeliveryMessage::parse(m.body().unwrap())
                    .unwrap()
                    .0
                    .to_string()
            })
            .collect();
        ids.sort();
        ids
    };
    let mut expected: Vec<String> = written.iter().map(|d| d.id.to_string()).collect();
    expected.sort();
    assert_eq!(
        queued_ids(receive().await),
        expected,
        "the retry queued them"
    );
    assert_eq!(
        store.deliveries_of_event(event).await.unwrap().len(),
        3,
        "and created nothing twice"
    );

    let swept = hooklane::service::sweep::enqueue_pending(&shape.app, shape.app.clock.now())
        .await
        .unwrap();
    assert_eq!(swept, 3);
    assert_eq!(
        queued_ids(receive().await),
        expected,
        "the sweeper's safety net"
    );
}

/// More endpoints than a fan-out part (set to 2 here; 1,000 by default).
const FIVE: [&str; 5] = ["ep_a", "ep_b", "ep_c", "ep_d", "ep_e"];

/// A store on the emulator whose fan-out writes `part` deliveries at a time, with the account
/// acme and the endpoints [`FIVE`].
async fn shape_with_parts_of(part: usize) -> (hooklane::aws::settings::AwsSettings, AwsShape) {
    let core = hooklane::config::CoreConfig {
        fan_out_part: part,
        ..Default::default()
    };
    let (settings, shape) = hooklane_testkit::testing::emulated_shape_with(core).await;
    fixtures::account_with_endpoints(shape.app.store.as_ref(), "acme", FIVE).await;
    (settings, shape)
}

/// The ids of the deliveries queued since the last look, sorted.
async fn drain_queued(queue_url: &str) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let got = receive_queued(queue_url, 1).await;
        if got.is_empty() {
            break;
        }
        ids.extend(got.iter().map(|m| {
            DeliveryMessage::parse(m.body().unwrap())
                .unwrap()
                .0
                .to_string()
        }));
    }
    ids.sort();
    ids
}

/// The id of the delivery of `event` to each of `endpoints`, sorted.
fn delivery_ids(event: &Event, endpoints: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = endpoints
        .iter()
        .map(|id| {
            let endpoint = hooklane::domain::EndpointId::parse(id).unwrap();
            hooklane::service::fan_out::delivery_id_for(event, &endpoint).to_string()
        })
        .collect();
    ids.sort();
    ids
}

/// Lambda ends an invocation at its timeout; the local runner never does. An event to more
/// endpoints than a part, whose every invocation is out of time from its start: each writes,
/// queues and records one part more and reports the record for a retry; none begins again at
/// the first endpoint, and the last one marks the event done. (Written whole, an event too
/// large for one invocation began again with each retry and never ended.)
#[tokio::test]
async fn an_event_cut_short_at_every_deadline_goes_on_a_part_per_invocation() {
    let (settings, shape) = shape_with_parts_of(2).await;
    let store = shape.app.store.as_ref();
    let (batch, events) = outbox_batch(&shape, &["evt_big"], 400).await;
    let event = &events[0];
    let sequence = batch.records[0].change.sequence_number.clone().unwrap();
    let mut queued = Vec::new();
    for (run, (through, done)) in [("ep_b", ["ep_a", "ep_b"]), ("ep_d", ["ep_c", "ep_d"])]
        .into_iter()
        .enumerate()
    {
        let out_of_time = Some(tokio::time::Instant::now());
        let response = super::handle_until(&shape, batch.clone(), out_of_time).await;
        let failed: Vec<_> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.clone().unwrap_or_default())
            .collect();
        assert_eq!(
            failed,
            std::slice::from_ref(&sequence),
            "run {run}: retried from the event"
        );
        assert_eq!(
            store
                .fan_out_progress(&event.account_id, &event.id)
                .await
                .unwrap()
                .map(|ep| ep.to_string())
                .as_deref(),
            Some(through),
            "run {run}"
        );
        assert_eq!(
            store.deliveries_of_event(event).await.unwrap().len(),
            2 * (run + 1),
            "run {run}: one part more"
        );
        let this_run = drain_queued(&settings.queue_url).await;
        assert_eq!(
            this_run,
            delivery_ids(event, &done),
            "run {run} queued its part"
        );
        queued.extend(this_run);
    }
    let last = super::handle(&shape, batch).await;
    assert!(last.batch_item_failures.is_empty(), "{last:?}");
    queued.extend(drain_queued(&settings.queue_url).await);
    queued.sort();
    assert_eq!(
        queued,
        delivery_ids(event, &FIVE),
        "each delivery queued once"
    );
    assert_eq!(store.deliveries_of_event(event).await.unwrap().len(), 5);
    let later = hooklane::clock::add(fixtures::t0(), std::time::Duration::from_secs(86_400));
    let unfanned = store.unfanned_events(None, later, 100).await.unwrap();
    assert!(
        unfanned.events.iter().all(|e| e.id != event.id),
        "marked done once whole: {unfanned:?}"
    );
}

/// A fan-out that died within a part (the first part recorded, one delivery of the second
/// written but neither queued nor recorded): the retry goes on from the recorded part,
/// queues the delivery it finds written and still unattempted, writes the rest, and queues
/// nothing of the part recorded before.
#[tokio::test]
async fn a_fan_out_that_died_within_a_part_goes_on_from_the_last_part_recorded() {
    let (settings, shape) = shape_with_parts_of(2).await;
    let store = shape.app.store.as_ref();
    let (batch, events) = outbox_batch(&shape, &["evt_died"], 500).await;
    let event = &events[0];
    let pending = |endpoints: &[&str]| -> Vec<hooklane::domain::Delivery> {
        endpoints
            .iter()
            .map(|id| {
                let endpoint = hooklane::domain::EndpointId::parse(id).unwrap();
                hooklane::domain::Delivery::new_pending(event, endpoint, fixtures::t0())
            })
            .collect()
    };
    store
        .add_deliveries_of(event, &pending(&["ep_a", "ep_b"]), None)
        .await
        .unwrap();
    let through = hooklane::domain::EndpointId::parse("ep_b").unwrap();
    store
        .record_fan_out_progress(&event.account_id, &event.id, &through)
        .await
        .unwrap();
    store
        .add_deliveries_of(event, &pending(&["ep_c"]), None)
        .await
        .unwrap();

    let retry = super::handle(&shape, batch).await;
    assert!(retry.batch_item_failures.is_empty(), "{retry:?}");
    assert_eq!(
        drain_queued(&settings.queue_url).await,
        delivery_ids(event, &["ep_c", "ep_d", "ep_e"])
    );
    assert_eq!(store.deliveries_of_event(event).await.unwrap().len(), 5);
}

/// A batch whose last event ends past the deadline is done: nothing is left for a retry, so
/// no record is reported. (Reported, Lambda ran the whole batch again from its first record.)
#[tokio::test]
async fn a_batch_whose_last_event_ends_past_the_deadline_is_not_retried() {
    let (_settings, shape) = emulated_shape().await;
    fixtures::account_with_endpoints(shape.app.store.as_ref(), "acme", ENDPOINTS).await;
    let (batch, _) = outbox_batch(&shape, &["evt_late_1", "evt_late_2"], 600).await;
    // Out of time from the start: the first event runs to its end, the second is left over.
    let response =
        super::handle_until(&shape, batch.clone(), Some(tokio::time::Instant::now())).await;
    let second = batch.records[1].change.sequence_number.clone();
    let failed: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    assert_eq!(failed, [second], "retried from the second event");
    let (last, _) = outbox_batch(&shape, &["evt_late_3"], 700).await;
    let response = super::handle_until(&shape, last, Some(tokio::time::Instant::now())).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "a batch whose one event ran to its end: {response:?}"
    );
}

/// DynamoDB refuses a write past a table's capacity (ProvisionedThroughputExceeded; a write
/// whose condition fails still uses its unit), and the SDK gives up after three tries. The
/// emulator enforces 20 writes a second on a `throttled…` stack's delivery log (see
/// `scripts/moto_server_atomic.py`). An event to 80 endpoints, in parts of 40, handled
/// again each time it reports its record, as the stream retries it: it ends whole within a
/// few runs, every delivery written once and queued, and the event marked done. (When a
/// throttled put failed the whole part, every run put the part's 40 again, using up the
/// second's capacity on those already written: twelve runs wrote nothing more.)
#[tokio::test]
async fn a_fan_out_over_the_delivery_logs_capacity_ends_whole_with_each_delivery_queued() {
    const ENDPOINTS: usize = 80;
    const RUNS: usize = 12;
    let core = hooklane::config::CoreConfig {
        fan_out_part: 40,
        ..Default::default()
    };
    let (settings, shape) =
        hooklane_testkit::testing::emulated_shape_named("throttled", core).await;
    hooklane_testkit::testing::assert_emulator_throttles(&settings.tables.deliveries).await;
    let store = shape.app.store.as_ref();
    let endpoints = fixtures::account_with_numbered_endpoints(store, "acme", ENDPOINTS).await;
    let (batch, events) = outbox_batch(&shape, &["evt_throttled"], 800).await;
    let event = &events[0];
    let (mut reported, mut queued) = (0, Vec::new());
    let mut done = false;
    let began = std::time::Instant::now();
    for _ in 0..RUNS {
        let response = super::handle(&shape, batch.clone()).await;
        queued.extend(drain_queued(&settings.queue_url).await);
        if response.batch_item_failures.is_empty() {
            done = true;
            break;
        }
        reported += 1;
    }
    println!(
        "throttled fan-out: {:?}, {reported} runs reported the record, {} messages queued for {ENDPOINTS} deliveries",
        began.elapsed(),
        queued.len()
    );
    assert!(done, "still reporting the record after {RUNS} runs");
    let ids: Vec<&str> = endpoints.iter().map(|e| e.id.as_str()).collect();
    let all = delivery_ids(event, &ids);
    assert_eq!(
        store.deliveries_of_event(event).await.unwrap().len(),
        ENDPOINTS
    );
    let mut distinct = queued.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct, all, "every delivery queued");
    let later = hooklane::clock::add(fixtures::t0(), std::time::Duration::from_secs(86_400));
    let unfanned = store.unfanned_events(None, later, 100).await.unwrap();
    assert!(
        unfanned.events.iter().all(|e| e.id != event.id),
        "marked done: {unfanned:?}"
    );
}

/// The sender against the same throttled delivery log: 60 deliveries sent at once, each
/// attempt's record a write of the delivery log. Every record is written, and so every
/// webhook sent once: a record refused for the table's capacity once the SDK's tries are
/// spent is tried again, not left failed (the queue would hand its message out again, and
/// the endpoint that had answered 2xx would get the webhook twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_recorded_in_a_throttled_delivery_log_are_each_sent_once() {
    const ENDPOINTS: usize = 60;
    let (settings, shape) = hooklane_testkit::testing::emulated_shape_named(
        "throttled",
        hooklane::config::CoreConfig::default(),
    )
    .await;
    hooklane_testkit::testing::assert_emulator_throttles(&settings.tables.deliveries).await;
    let receiver = slow_receiver(Duration::from_millis(5)).await;
    let store = shape.app.store.as_ref();
    let endpoints: Vec<_> = (0..ENDPOINTS)
        .map(|i| fixtures::endpoint_sending_to("acme", &format!("ep_{i:03}"), &receiver.url))
        .collect();
    fixtures::create_account_and_endpoints(store, "acme", &endpoints).await;
    let (batch, _) = outbox_batch(&shape, &["evt_recorded"], 900).await;
    let fanned = handle(&shape, batch).await;
    assert!(fanned.batch_item_failures.is_empty(), "{fanned:?}");
    let mut messages = Vec::new();
    loop {
        let got = receive_queued(&settings.queue_url, 1).await;
        if got.is_empty() {
            break;
        }
        messages.extend(
            got.iter()
                .map(|m| DeliveryMessage::parse(m.body().unwrap()).unwrap()),
        );
    }
    assert_eq!(messages.len(), ENDPOINTS);
    let lanes = Lanes {
        slots: shape.slots.as_ref(),
        rate: shape.slots.as_ref(),
        sweep_grace: shape.sweep_grace,
        send_by: None,
    };
    // One batch of them all, the endpoints side by side (a sender's batch is ten).
    let handled = hooklane::service::sender::handle_batch(&shape.app, lanes, &messages).await;
    let not_recorded: Vec<_> = handled
        .iter()
        .filter(|h| !matches!(h, Ok(Handled::Attempted(_))))
        .collect();
    println!(
        "throttled records: {} of {ENDPOINTS} not recorded, {} requests",
        not_recorded.len(),
        receiver.arrivals().len()
    );
    assert!(
        not_recorded.is_empty(),
        "{} of {ENDPOINTS} not recorded, the first: {:?}",
        not_recorded.len(),
        not_recorded.first()
    );
    assert_eq!(receiver.arrivals().len(), ENDPOINTS);
}

/// A stack named `start…`, whose `table` the emulator throttles, connected with a count of
/// the puts sent to that table.
async fn throttled_stack_counting_puts(
    start: &str,
    table: fn(&hooklane::store::dynamodb::TableNames) -> &String,
) -> (
    hooklane::aws::settings::AwsSettings,
    hooklane::aws::shape::AwsShape,
    hooklane_testkit::faults::PutTries,
) {
    let (settings, _) = hooklane_testkit::testing::emulated_shape_named(
        start,
        hooklane::config::CoreConfig::default(),
    )
    .await;
    let table = table(&settings.tables);
    hooklane_testkit::testing::assert_emulator_throttles(table).await;
    let tries = hooklane_testkit::faults::PutTries::of(table);
    let watched = hooklane::aws::clients::SharedInterceptor::new(tries.clone());
    let shape = hooklane::aws::shape::connect_with(&settings, Some(&watched))
        .await
        .unwrap();
    (settings, shape, tries)
}

/// How many times the SDK tries one request.
async fn sdk_tries() -> usize {
    let sdk = hooklane::aws::load_sdk_config().await;
    let retry = sdk.retry_config().expect("a retry configuration");
    usize::try_from(retry.max_attempts()).unwrap()
}

/// A table that takes no writes for longer than a caller can wait: the emulator refuses
/// every write to a `saturated…` stack's attempts table, where an attempt's detail goes
/// unless it is a first try's small enough to keep on the delivery itself. The sender's
/// record of such an attempt (a 2xx with a 4 KiB body) waits for the table at most
/// `RECORD_THROTTLE_WAIT` and the SDK's own tries of its last write: the message is
/// answered well inside the sender's longest batch, which its function's timeout covers,
/// not cut off by that timeout. The delivery's own record went through before, so the
/// message handled again sends nothing. What it sends past the wait is counted, not timed,
/// as in the jammed fan-out below.
#[tokio::test]
async fn an_attempt_whose_detail_a_saturated_table_refuses_is_answered_within_the_records_wait() {
    use hooklane::store::RECORD_THROTTLE_WAIT;
    use hooklane_testkit::farm::{Behavior, Farm};
    let (settings, shape, tries) =
        throttled_stack_counting_puts("saturated", |t| &t.attempts).await;
    let farm = Farm::start().await.unwrap();
    farm.configure("ep_1", Behavior::ok().with_body(vec![b'x'; 4096]));
    let store = shape.app.store.as_ref();
    let endpoint = fixtures::endpoint_sending_to("acme", "ep_1", &farm.url("ep_1"));
    fixtures::create_account_and_endpoints(store, "acme", [&endpoint]).await;
    let (batch, _) = outbox_batch(&shape, &["evt_saturated"], 1000).await;
    let fanned = handle(&shape, batch).await;
    assert!(fanned.batch_item_failures.is_empty(), "{fanned:?}");
    let queued = receive_queued(&settings.queue_url, 1).await;
    assert_eq!(queued.len(), 1);
    let (delivery, endpoint_id, account) =
        DeliveryMessage::parse(queued[0].body().unwrap()).unwrap();
    let lanes = Lanes {
        slots: shape.slots.as_ref(),
        rate: shape.slots.as_ref(),
        sweep_grace: shape.sweep_grace,
        send_by: None,
    };

    let (metrics, log, _recorder) =
        hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
    let began = std::time::Instant::now();
    let handled = metrics
        .flushed(handle_message(
            &shape.app,
            lanes,
            &delivery,
            &endpoint_id,
            &account,
        ))
        .await;
    let took = began.elapsed();
    // The wait begins before the detail's first put (with the delivery's own record).
    let first = tries.first().expect("the attempt's detail was put");
    let past = tries.sent_from(first + RECORD_THROTTLE_WAIT);
    println!(
        "saturated attempts table: answered in {took:?}, {} put tries, {past} past the wait: {handled:?}",
        tries.sent()
    );
    assert!(
        past <= sdk_tries().await,
        "{past} put tries past the record's wait of {RECORD_THROTTLE_WAIT:?}, more than one call's"
    );
    // Recorded, as its delivery was: only the attempt's detail is missing from the log,
    // and the operator is told so.
    assert!(matches!(handled, Ok(Handled::Attempted(_))), "{handled:?}");
    assert_eq!(
        log.value(
            "hooklane_records_incomplete_total",
            &[("Stack", "hooklane-test"), ("part", "detail")]
        ),
        Some(json!(1))
    );
    assert_eq!(farm.arrival_count("ep_1"), 1);
    let stored = store
        .get_delivery(&account, &delivery)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, hooklane::domain::DeliveryStatus::Delivered);

    let again = handle_message(&shape.app, lanes, &delivery, &endpoint_id, &account).await;
    assert!(matches!(again, Ok(Handled::Skipped)), "{again:?}");
    assert_eq!(farm.arrival_count("ep_1"), 1, "the webhook was sent again");
}

/// A delivery log that takes no write for longer than an invocation runs: the emulator
/// refuses every write to a `jammed…` stack's. Its fan-out stops waiting for the table at
/// its deadline and reports the event, for Lambda to retry from it, with a third of the
/// invocation left; it does not go through every round of every put, which a part of many
/// deliveries runs past the function's timeout, after which Lambda retries the whole
/// batch, the events fanned out before it included. What it sends past the deadline is
/// counted, not timed (an emulator loaded by the other tests answers every try late): each
/// put's call under way, at most the SDK's tries of it, and no new round.
#[tokio::test]
async fn a_fan_out_whose_delivery_log_takes_no_writes_reports_its_event_by_the_deadline() {
    let (_, shape, tries) = throttled_stack_counting_puts("jammed", |t| &t.deliveries).await;
    fixtures::account_with_endpoints(shape.app.store.as_ref(), "acme", ENDPOINTS).await;
    let (batch, _) = outbox_batch(&shape, &["evt_jammed"], 1100).await;
    let wait = Duration::from_secs(1);
    let began = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + wait;
    let response = super::handle_until(&shape, batch.clone(), Some(deadline)).await;
    let took = began.elapsed();
    let past = tries.sent_from(deadline);
    println!(
        "jammed delivery log: reported after {took:?}, {} put tries, {past} past the deadline: {response:?}",
        tries.sent()
    );
    let failed: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    assert_eq!(failed, [batch.records[0].change.sequence_number.clone()]);
    let most = ENDPOINTS.len() * sdk_tries().await;
    assert!(
        past <= most,
        "{past} put tries past the deadline, more than the {most} of one call per delivery"
    );
}
