//! A sender that dies in the middle of a batch — cut off by the Lambda timeout, or by a
//! panic — against the emulator: its messages come back after the visibility timeout, the
//! slot leases of its unfinished attempts run out by themselves, and a well-behaved sender
//! then delivers everything without ever exceeding the endpoint's cap.

use std::{
    collections::{BTreeMap, HashSet},
    sync::atomic::Ordering,
    time::{Duration, Instant, SystemTime},
};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use hooklane::{
    aws::{
        aws_sdk_sqs::{
            self,
            types::{DeleteMessageBatchRequestEntry, Message, QueueAttributeName},
        },
        load_sdk_config,
        settings::AwsSettings,
        shape::AwsShape,
    },
    config::CoreConfig,
    domain::{AccountId, DeliveryId, DeliveryStatus, EndpointId},
    service::{
        fan_out::fan_out,
        publish::{publish, NewEvent},
        sender::slot_lease,
    },
    slots::SlotLeases,
};
use hooklane_testkit::{
    fixtures,
    testing::{emulated_shape_with, receive_queued, slow_receiver, SlowReceiver},
};

use super::handle;

const DELIVERIES: usize = 6;
const CAP: u32 = 2;
/// The receiver takes this long per request; the sender is killed well before it answers.
const RECEIVER_DELAY: Duration = Duration::from_millis(1500);
const KILL_AFTER: Duration = Duration::from_millis(700);
/// The request deadline, short so that the slot leases (deadline + margin) end in seconds.
const DEADLINE: Duration = Duration::from_secs(3);
const VISIBILITY_TIMEOUT_SECONDS: i32 = 3;
/// The well-behaved sender gives up (and the test fails) after this long.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy)]
enum Death {
    /// Lambda's timeout: the invocation stops wherever it is.
    Timeout,
    /// A panic in the handler's task (lambda_runtime reports the invocation as failed).
    Panic,
}

struct Stack {
    settings: AwsSettings,
    shape: AwsShape,
    sqs: aws_sdk_sqs::Client,
    account: AccountId,
    endpoint: EndpointId,
    deliveries: Vec<DeliveryId>,
    event_ids: HashSet<String>,
}

async fn stack(receiver: &SlowReceiver) -> Stack {
    let mut core = CoreConfig::default();
    core.sender.deadline = DEADLINE;
    let (settings, shape) = emulated_shape_with(core).await;
    let sqs = aws_sdk_sqs::Client::new(&load_sdk_config().await);
    sqs.set_queue_attributes()
        .queue_url(&settings.queue_url)
        .attributes(
            QueueAttributeName::VisibilityTimeout,
            VISIBILITY_TIMEOUT_SECONDS.to_string(),
        )
        .send()
        .await
        .unwrap();
    let mut endpoint = fixtures::endpoint_sending_to("acme", "ep_crash", &receiver.url);
    endpoint.max_in_flight = CAP;
    fixtures::create_account_and_endpoints(&*shape.app.store, "acme", [&endpoint]).await;
    let account = endpoint.account_id.clone();
    let mut deliveries = Vec::new();
    let mut event_ids = HashSet::new();
    for n in 0..DELIVERIES {
        let new = NewEvent {
            id: Some(format!("evt_crash_{n}")),
            event_type: "invoice.paid".into(),
            data: serde_json::json!({ "n": n }),
        };
        let published = publish(&shape.app, &account, new).await.unwrap();
        // What the events table's stream does: the delivery, queued.
        fan_out(&shape.app, &published.event).await.unwrap();
        event_ids.insert(published.event.id.to_string());
        deliveries.extend(published.deliveries.into_iter().map(|d| d.id));
    }
    assert_eq!(deliveries.len(), DELIVERIES);
    Stack {
        settings,
        shape,
        sqs,
        account,
        endpoint: endpoint.id,
        deliveries,
        event_ids,
    }
}

async fn receive(stack: &Stack, wait_seconds: i32) -> Vec<Message> {
    receive_queued(&stack.settings.queue_url, wait_seconds).await
}

/// The batch Lambda's SQS integration would hand the function.
fn lambda_batch(messages: &[Message]) -> SqsEvent {
    let mut event = SqsEvent::default();
    event.records = messages
        .iter()
        .map(|m| {
            let mut record = SqsMessage::default();
            record.message_id = m.message_id.clone();
            record.receipt_handle = m.receipt_handle.clone();
            record.body = m.body.clone();
            record.event_source = Some("aws:sqs".into());
            record
        })
        .collect();
    event
}

/// What Lambda does after a successful invocation: deletes the messages not reported failed.
async fn delete_succeeded(stack: &Stack, messages: &[Message], failed: &HashSet<String>) {
    let entries: Vec<_> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| !failed.contains(m.message_id().unwrap()))
        .map(|(n, m)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(n.to_string())
                .receipt_handle(m.receipt_handle().unwrap())
                .build()
                .unwrap()
        })
        .collect();
    if entries.is_empty() {
        return;
    }
    let out = stack
        .sqs
        .delete_message_batch()
        .queue_url(&stack.settings.queue_url)
        .set_entries(Some(entries))
        .send()
        .await
        .unwrap();
    assert!(out.failed().is_empty(), "{:?}", out.failed());
}

/// Receive → handle → delete, once. Returns the messages handled.
async fn run_sender_once(stack: &Stack) -> Vec<Message> {
    let messages = receive(stack, 1).await;
    if messages.is_empty() {
        return messages;
    }
    let response = handle(&stack.shape, lambda_batch(&messages)).await;
    let failed: HashSet<String> = response
        .batch_item_failures
        .into_iter()
        .map(|f| f.item_identifier)
        .collect();
    delete_succeeded(stack, &messages, &failed).await;
    messages
}

async fn queue_is_empty(stack: &Stack) -> bool {
    let attributes = stack
        .sqs
        .get_queue_attributes()
        .queue_url(&stack.settings.queue_url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap_or_default();
    [
        QueueAttributeName::ApproximateNumberOfMessages,
        QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        QueueAttributeName::ApproximateNumberOfMessagesDelayed,
    ]
    .iter()
    .all(|name| attributes.get(name).map(String::as_str) == Some("0"))
}

async fn statuses(stack: &Stack) -> Vec<(DeliveryStatus, u32)> {
    let mut out = Vec::new();
    for id in &stack.deliveries {
        let delivery = stack
            .shape
            .app
            .store
            .get_delivery(&stack.account, id)
            .await
            .unwrap()
            .unwrap();
        out.push((delivery.status, delivery.attempts));
    }
    out
}

/// Runs the sender until every delivery is delivered and the queue is empty. Returns the
/// number of invocations and how often each message id was handled.
async fn drain(stack: &Stack) -> (usize, BTreeMap<String, usize>) {
    let started = Instant::now();
    let mut received: BTreeMap<String, usize> = BTreeMap::new();
    let mut invocations = 0usize;
    loop {
        let handled = run_sender_once(stack).await;
        for m in &handled {
            *received
                .entry(m.message_id().unwrap().to_owned())
                .or_default() += 1;
        }
        if !handled.is_empty() {
            invocations += 1;
            continue;
        }
        let now = statuses(stack).await;
        if now.iter().all(|(s, _)| *s == DeliveryStatus::Delivered) && queue_is_empty(stack).await {
            return (invocations, received);
        }
        assert!(
            started.elapsed() < DRAIN_LIMIT,
            "not drained after {DRAIN_LIMIT:?}: {now:?}"
        );
    }
}

async fn a_sender_dying_mid_batch(death: Death) {
    let receiver = slow_receiver(RECEIVER_DELAY).await;
    let stack = stack(&receiver).await;
    let mut batch = Vec::new();
    for _ in 0..10 {
        batch.extend(receive(&stack, 1).await);
        if batch.len() == DELIVERIES {
            break;
        }
    }
    assert_eq!(batch.len(), DELIVERIES, "all published messages received");
    let killed_batch: HashSet<String> = batch
        .iter()
        .map(|m| m.message_id().unwrap().to_owned())
        .collect();

    // The first sender: takes both slots, starts both POSTs, re-queues the other four, and
    // dies before any answer comes back. Nothing of its batch is deleted.
    let event = lambda_batch(&batch);
    match death {
        Death::Timeout => {
            let cut = tokio::time::timeout(KILL_AFTER, handle(&stack.shape, event)).await;
            assert!(
                cut.is_err(),
                "the handler finished before its timeout: {cut:?}"
            );
        }
        Death::Panic => {
            let shape = stack.shape.clone();
            let task = tokio::spawn(async move {
                tokio::select! {
                    response = handle(&shape, event) => response,
                    () = tokio::time::sleep(KILL_AFTER) => panic!("the sender crashed mid-batch (on purpose)"),
                }
            });
            let joined = task.await;
            assert!(
                joined.as_ref().is_err_and(|e| e.is_panic()),
                "the handler task did not panic: {joined:?}"
            );
        }
    }
    let killed_at = SystemTime::now();
    assert_eq!(
        receiver.now.load(Ordering::SeqCst),
        CAP as usize,
        "killed while both attempts were at the receiver"
    );
    let leases = stack
        .shape
        .slots
        .live_leases(&stack.endpoint)
        .await
        .unwrap();
    assert_eq!(
        leases.len(),
        CAP as usize,
        "the dead sender's leases are still held"
    );
    let first_lease_end = SystemTime::from(leases[0]);
    let killed_holders = receiver.arrivals().len();
    assert_eq!(killed_holders, CAP as usize);

    // A well-behaved sender takes over and runs until every delivery is delivered and the
    // queue is empty (re-queued copies included).
    let drain_started = Instant::now();
    let (invocations, received) = drain(&stack).await;
    let drain_time = drain_started.elapsed();

    let came_back: HashSet<_> = received.keys().cloned().collect();
    assert!(
        killed_batch.is_subset(&came_back),
        "every message of the dead sender's batch came back"
    );
    let final_statuses = statuses(&stack).await;
    assert!(final_statuses
        .iter()
        .all(|(s, attempts)| *s == DeliveryStatus::Delivered && *attempts >= 1));
    let peak = receiver.most.load(Ordering::SeqCst);
    assert!(
        peak <= CAP as usize,
        "peak concurrency {peak} over the cap {CAP}"
    );

    let arrivals = receiver.arrivals();
    let after_kill: Vec<_> = arrivals.iter().filter(|a| a.at > killed_at).collect();
    assert_eq!(after_kill.len() + killed_holders, arrivals.len());
    let first_after = after_kill.iter().map(|a| a.at).min().unwrap();
    assert!(
        first_after >= first_lease_end,
        "a new attempt reached the endpoint before the dead sender's lease ran out"
    );
    let waited = first_after.duration_since(killed_at).unwrap();
    let lease_left_at_kill = first_lease_end.duration_since(killed_at).unwrap();
    let mut per_event: BTreeMap<String, usize> = BTreeMap::new();
    for arrival in &after_kill {
        let id = arrival.webhook_id.clone().unwrap();
        assert!(stack.event_ids.contains(&id), "unknown webhook-id {id}");
        *per_event.entry(id).or_default() += 1;
    }
    assert_eq!(
        per_event.len(),
        DELIVERIES,
        "every delivery reached the endpoint"
    );
    let duplicates = after_kill.len() - DELIVERIES;
    // The requests the dead sender had in flight reached the endpoint too: their deliveries
    // were sent again, with the same webhook-id (at least once, duplicates recognisable).
    for killed in arrivals.iter().filter(|a| a.at <= killed_at) {
        let id = killed.webhook_id.as_ref().unwrap();
        assert!(
            per_event.contains_key(id),
            "{id} was sent again after the kill"
        );
    }
    let seen_twice_by_endpoint = arrivals.len() - DELIVERIES;

    // Duplicated messages for delivered deliveries: handled, deleted, no request made.
    let duplicate_refs: Vec<_> = stack
        .deliveries
        .iter()
        .map(|id| hooklane::store::PendingRef {
            delivery_id: id.clone(),
            endpoint_id: stack.endpoint.clone(),
            account_id: stack.account.clone(),
            due: fixtures::t0(),
            max_in_flight: CAP,
            rate_limit_per_second: None,
        })
        .collect();
    stack.shape.app.queue.enqueue(duplicate_refs).await.unwrap();
    let (_, redundant) = drain(&stack).await;
    let redundant_handled: usize = redundant.values().sum();
    // Each copy is handled at least once; one that finds both slots taken by the others is
    // re-queued and handled again later.
    assert!(redundant.len() >= DELIVERIES, "{redundant:?}");
    assert_eq!(
        receiver.arrivals().len(),
        arrivals.len(),
        "a message for a delivered delivery made a request"
    );

    println!(
        "crash figures ({death:?}): deliveries={DELIVERIES} cap={CAP} lease={:?} \
         killed_mid_attempt={killed_holders} messages_back={}/{} \
         lease_left_at_kill={lease_left_at_kill:?} first_request_after_kill={waited:?} requests_after_kill={} duplicates_after_kill={duplicates} \
         requests_total={} seen_twice_by_endpoint={seen_twice_by_endpoint} \
         peak_in_flight={peak} invocations={invocations} messages_handled={} \
         drain_time={drain_time:?} attempts={:?} redundant_messages={DELIVERIES} handled={redundant_handled} requests=0",
        slot_lease(DEADLINE),
        killed_batch.len(),
        DELIVERIES,
        after_kill.len(),
        arrivals.len(),
        received.values().sum::<usize>(),
        final_statuses.iter().map(|(_, a)| a).collect::<Vec<_>>(),
    );
}

#[tokio::test]
async fn a_sender_cut_off_by_its_timeout_loses_nothing_and_its_leases_run_out() {
    a_sender_dying_mid_batch(Death::Timeout).await;
}

#[tokio::test]
async fn a_sender_that_panics_mid_batch_loses_nothing_and_its_leases_run_out() {
    a_sender_dying_mid_batch(Death::Panic).await;
}
