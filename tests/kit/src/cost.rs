//! Cost per delivery of the AWS shape, measured end to end against the emulator with the
//! request meter: publish (API or outbox) → fan-out over stream batches → sender over SQS
//! batches of 10 → a loopback receiver. Prints the figures; asserts they stay under bounds
//! (a regression guard). `cargo test -p hooklane-testkit --features aws cost_per -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)]

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use aws_sdk_dynamodb::types::TransactWriteItem;

use crate::{
    fixtures,
    meter::{table_layouts, Meter, Reading},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use hooklane::aws::{
    clients,
    local::provision,
    shape::{connect_with, AwsShape},
};
use hooklane::{
    config::CoreConfig,
    domain::{AccountId, EndpointUrl, Event, EventId, EventType, EventTypeFilter, RetrySchedule},
    http::AddressPolicy,
    queue::sqs::DeliveryMessage,
    service::{
        fan_out::fan_out_batch,
        publish::{publish, NewEvent},
        sender::{handle_batch, Lanes},
    },
};

/// DynamoDB Streams' default batch size for the fan-out trigger (the template's).
const STREAM_BATCH: usize = 100;
/// The sender's SQS batch size (the template's).
const SQS_BATCH: i32 = 10;

/// A receiver on 127.0.0.1 that answers 500 to the first `failures_per_id` requests of each
/// `webhook-id` and 200 after, counting the 200s.
struct Receiver {
    url: String,
    delivered: Arc<AtomicUsize>,
}

async fn receiver(failures_per_id: u32) -> Receiver {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let delivered = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let counter = delivered.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let (counter, seen) = (counter.clone(), seen.clone());
            tokio::spawn(async move {
                let mut data = Vec::new();
                let mut buf = [0u8; 8192];
                let head_end = loop {
                    if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => data.extend_from_slice(&buf[..k]),
                    }
                };
                let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
                let header = |name: &str| {
                    head.lines().find_map(|l| {
                        l.strip_prefix(&format!("{name}:"))
                            .map(|v| v.trim().to_owned())
                    })
                };
                let length: usize = header("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                while data.len() < head_end + length {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => data.extend_from_slice(&buf[..k]),
                    }
                }
                let id = header(hooklane::signing::HEADER_ID).unwrap_or_default();
                let tries = {
                    let mut seen = seen.lock().unwrap();
                    let tries = seen.entry(id).or_default();
                    *tries += 1;
                    *tries
                };
                let answer: &[u8] = if tries <= failures_per_id {
                    b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                } else {
                    counter.fetch_add(1, Ordering::SeqCst);
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                };
                let _ = socket.write_all(answer).await;
            });
        }
    });
    Receiver { url, delivered }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publisher {
    /// `POST /v1/events` (the api function) → `service::publish`: the event alone (the AWS
    /// shape's `PublishMode::ThroughStream`) → stream → fan-out.
    Api,
    /// The platform's own `TransactWriteItems` with the outbox put → stream → fan-out.
    Outbox,
}

struct Measured {
    deliveries: usize,
    /// Everything, the sweep included.
    reading: Reading,
    /// The one sweep at the end.
    sweep: Reading,
    sender_batches: usize,
    /// Time spent inside each function's handler work, for the GB-seconds.
    api_time: Duration,
    fan_out_time: Duration,
    sender_time: Duration,
}

impl Measured {
    fn per_delivery(&self, value: f64) -> f64 {
        value / self.deliveries as f64
    }

    fn print(&self, title: &str) {
        let r = &self.reading;
        let dynamodb = r.service("DynamoDB");
        let sqs = r.service("SQS");
        let scheduler = r.service("Scheduler");
        let lambda = r.service("Lambda");
        println!("\n== {title}: {} deliveries ==", self.deliveries);
        println!(
            "per delivery: WCU {:.2}  RCU {:.2}  DynamoDB requests {:.2}  SQS requests {:.2}  \
             Scheduler calls {:.2}  Lambda invocations {:.3}",
            self.per_delivery(dynamodb.write_units),
            self.per_delivery(dynamodb.read_units),
            self.per_delivery(dynamodb.calls as f64),
            self.per_delivery(sqs.billed_requests as f64),
            self.per_delivery(scheduler.calls as f64),
            self.per_delivery(lambda.calls as f64),
        );
        println!(
            "of which one sweep: WCU {:.3}  RCU {:.3}",
            self.per_delivery(self.sweep.service("DynamoDB").write_units),
            self.per_delivery(self.sweep.service("DynamoDB").read_units),
        );
        let per = |time: Duration, calls: u64| time.as_secs_f64() * 1000.0 / calls.max(1) as f64;
        let invocations = |f: &str| {
            r.operations
                .get(&format!("Lambda.{f}"))
                .map_or(0, |u| u.calls)
        };
        println!(
            "handler time against the emulator: api {:.1} ms per call, fanout {:.1} ms per batch, \
             sender {:.1} ms per batch ({} batches)",
            per(self.api_time, invocations("api")),
            per(self.fan_out_time, invocations("fanout")),
            per(self.sender_time, invocations("sender")),
            self.sender_batches,
        );
        for (operation, usage) in &r.operations {
            println!(
                "  {operation:<36} calls/delivery {:.3}  billed {:.3}  RCU {:.3}  WCU {:.3}",
                self.per_delivery(usage.calls as f64),
                self.per_delivery(usage.billed_requests as f64),
                self.per_delivery(usage.read_units),
                self.per_delivery(usage.write_units),
            );
        }
        for (table, usage) in &r.tables {
            println!(
                "  table {table:<30} RCU {:.3}  WCU {:.3}",
                self.per_delivery(usage.read_units),
                self.per_delivery(usage.write_units),
            );
        }
    }

    fn wcu(&self) -> f64 {
        self.per_delivery(self.reading.service("DynamoDB").write_units)
    }

    fn sqs_requests(&self) -> f64 {
        self.per_delivery(self.reading.service("SQS").billed_requests as f64)
    }
}

fn payload(i: usize) -> serde_json::Value {
    // A typical small webhook body (~300 bytes).
    serde_json::json!({
        "invoice": {
            "id": format!("in_{i:08}"),
            "customer": "cus_4f9a2b7c1d",
            "amount_due": 12_900,
            "currency": "eur",
            "status": "paid",
            "lines": [{"description": "Pro plan, monthly", "amount": 12_900, "quantity": 1}],
            "paid_at": "2026-11-30T06:00:00Z"
        }
    })
}

async fn setup(
    failures_per_id: u32,
    destinations: Destinations,
) -> (
    AwsShape,
    Meter,
    hooklane::aws::settings::AwsSettings,
    Receiver,
) {
    crate::testing::require_emulator();
    let mut core = CoreConfig::default();
    core.sender.policy = AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()], false);
    // The first retry comes after ~1 s instead of 30 s.
    core.retry.schedule = RetrySchedule::new(vec![Duration::from_secs(1)]).unwrap();
    core.secrets.current = Some(crate::testing::TEST_SECRETS_KEY);
    let prefix = format!("c{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let settings = provision(&prefix, core).await.unwrap();
    let meter = Meter::new(table_layouts(&settings.tables));
    let shape = connect_with(&settings, Some(&meter.shared()))
        .await
        .unwrap();
    let receiver = receiver(failures_per_id).await;
    let store = &shape.app.store;
    store
        .create_account(&fixtures::account("acme"))
        .await
        .unwrap();
    match destinations {
        Destinations::OneEndpoint => {
            let mut endpoint = fixtures::endpoint("acme", "ep_cost", chrono::Utc::now());
            endpoint.url = EndpointUrl::parse(&receiver.url).unwrap();
            // As many in flight as one SQS batch holds: no message waits for a slot.
            endpoint.max_in_flight = 10;
            store.create_endpoint(&endpoint).await.unwrap();
        }
        Destinations::TenEndpoints => {
            for lane in 0..SPREAD_LANES {
                let mut endpoint =
                    fixtures::endpoint("acme", &format!("ep_cost_{lane}"), chrono::Utc::now());
                endpoint.url = EndpointUrl::parse(&receiver.url).unwrap();
                // The default cap (4), and only its own event type.
                endpoint.event_types =
                    EventTypeFilter::parse(Some(&[event_type_for(destinations, lane)])).unwrap();
                store.create_endpoint(&endpoint).await.unwrap();
            }
        }
    }
    (shape, meter, settings, receiver)
}

/// Where the deliveries go: all to one endpoint (an SQS batch of ten shares one slot take
/// and one give-back), or each event to the next of ten endpoints (every message of a batch
/// is for another endpoint and takes and gives back its own slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Destinations {
    OneEndpoint,
    TenEndpoints,
}

const SPREAD_LANES: usize = 10;

fn event_type_for(destinations: Destinations, index: usize) -> String {
    match destinations {
        Destinations::OneEndpoint => "invoice.paid".into(),
        Destinations::TenEndpoints => format!("invoice.lane{}", index % SPREAD_LANES),
    }
}

/// Everything one measurement drives: the stack, its meter and the receiver.
struct Pipeline {
    shape: AwsShape,
    meter: Meter,
    settings: hooklane::aws::settings::AwsSettings,
    receiver: Receiver,
    sqs: hooklane::aws::aws_sdk_sqs::Client,
    destinations: Destinations,
}

/// Time spent in each function's handler and the sender batches run, for one drive.
#[derive(Default)]
struct Driven {
    api_time: Duration,
    fan_out_time: Duration,
    sender_time: Duration,
    sender_batches: usize,
}

impl Pipeline {
    /// Publishes the events numbered `numbers` and runs fan-out and sender until the
    /// receiver has counted `delivered_total` 200s.
    async fn drive(
        &self,
        publisher: Publisher,
        numbers: std::ops::Range<usize>,
        delivered_total: usize,
    ) -> Driven {
        let app = &self.shape.app;
        let account = AccountId::parse("acme").unwrap();
        let mut driven = Driven::default();
        let mut published = Vec::new();
        for i in numbers {
            match publisher {
                Publisher::Api => {
                    self.meter.invoked("api");
                    let new = NewEvent {
                        id: None,
                        event_type: event_type_for(self.destinations, i),
                        data: payload(i),
                    };
                    let began = Instant::now();
                    let event = publish(app, &account, new).await.unwrap().event;
                    driven.api_time += began.elapsed();
                    published.push(event);
                }
                Publisher::Outbox => {
                    let event = Event::new(
                        EventId::generate(),
                        account.clone(),
                        EventType::parse(&event_type_for(self.destinations, i)).unwrap(),
                        chrono::Utc::now(),
                        &payload(i),
                    )
                    .unwrap();
                    self.shape
                        .store
                        .client()
                        .transact_write_items()
                        .transact_items(
                            TransactWriteItem::builder()
                                .put(self.shape.store.outbox_put(&event).unwrap())
                                .build(),
                        )
                        .send()
                        .await
                        .unwrap();
                    published.push(event);
                }
            }
        }
        // The events table's stream: Lambda hands the fan-out function batches of up to 100
        // records (what functions/fanout's handler does with a batch: `fan_out_batch`).
        for batch in published.chunks(STREAM_BATCH) {
            self.meter.invoked("fanout");
            let began = Instant::now();
            let outcome = fan_out_batch(app, batch).await;
            driven.fan_out_time += began.elapsed();
            assert!(outcome.error.is_none(), "{:?}", outcome.error);
        }

        // The SQS event source: receive up to 10, run the sender over them, delete the handled.
        let lanes = Lanes {
            slots: self.shape.slots.as_ref(),
            rate: self.shape.slots.as_ref(),
            sweep_grace: self.shape.sweep_grace,
            send_by: None,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.receiver.delivered.load(Ordering::SeqCst) < delivered_total {
            assert!(
                Instant::now() < deadline,
                "deliveries did not drain in time"
            );
            let received = self
                .sqs
                .receive_message()
                .queue_url(&self.settings.queue_url)
                .max_number_of_messages(SQS_BATCH)
                .wait_time_seconds(1)
                .send()
                .await
                .unwrap();
            let messages = received.messages.unwrap_or_default();
            if messages.is_empty() {
                continue;
            }
            self.meter.invoked("sender");
            driven.sender_batches += 1;
            let began = Instant::now();
            let parsed: Vec<_> = messages
                .iter()
                .map(|m| DeliveryMessage::parse(m.body().unwrap()).unwrap())
                .collect();
            let handled = handle_batch(app, lanes, &parsed).await;
            driven.sender_time += began.elapsed();
            let mut delete = self
                .sqs
                .delete_message_batch()
                .queue_url(&self.settings.queue_url);
            for (i, (message, outcome)) in messages.iter().zip(handled).enumerate() {
                outcome.unwrap();
                let receipt = message.receipt_handle().unwrap();
                delete = delete.entries(
                    hooklane::aws::aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(receipt)
                        .build()
                        .unwrap(),
                );
            }
            delete.send().await.unwrap();
        }
        driven
    }
}

/// Whether the endpoints have had a delivery before the metered run: their first one also
/// creates the endpoint's slot item (a conditional write that fails on the missing item,
/// then the creating put), a cost paid once per endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoints {
    New,
    DeliveredToBefore,
}

/// Publishes `events` events to `destinations` and runs the pipeline until each is delivered.
async fn measure(
    publisher: Publisher,
    events: usize,
    failures_per_id: u32,
    destinations: Destinations,
    endpoints: Endpoints,
) -> Measured {
    let (shape, meter, settings, receiver) = setup(failures_per_id, destinations).await;
    let sdk = hooklane::aws::load_sdk_config().await;
    let sqs = clients::sqs(&sdk, Some(&meter.shared()));
    let pipeline = Pipeline {
        shape,
        meter,
        settings,
        receiver,
        sqs,
        destinations,
    };
    let warm_up = match (endpoints, destinations) {
        (Endpoints::New, _) => 0,
        (Endpoints::DeliveredToBefore, Destinations::OneEndpoint) => 1,
        (Endpoints::DeliveredToBefore, Destinations::TenEndpoints) => SPREAD_LANES,
    };
    if warm_up > 0 {
        pipeline.drive(Publisher::Api, 0..warm_up, warm_up).await;
    }

    let start = pipeline.meter.reading();
    let driven = pipeline
        .drive(publisher, warm_up..warm_up + events, warm_up + events)
        .await;
    // One scheduled sweep: its walk is the safety net for first tries outside the `pending`
    // index, and reads every new delivery once (a sweep every 5 minutes re-reads the last
    // 2 minutes' again: LATE_WRITE_MARGIN).
    let before_sweep = pipeline.meter.reading();
    pipeline.meter.invoked("sweeper");
    let report = hooklane::aws::handlers::sweep(
        &pipeline.shape,
        Duration::from_secs(300),
        hooklane::aws::handlers::SWEEP_EVERY,
    )
    .await
    .unwrap()
    .expect("no other sweep runs");
    assert_eq!(report.requeued, 0, "everything was delivered");
    let sweep = pipeline.meter.reading().since(&before_sweep);
    Measured {
        deliveries: events,
        sweep,
        reading: pipeline.meter.reading().since(&start),
        sender_batches: driven.sender_batches,
        api_time: driven.api_time,
        fan_out_time: driven.fan_out_time,
        sender_time: driven.sender_time,
    }
}

// Regression guards per first-try (or once-retried) delivery (docs/PERFORMANCE.md, "Cost
// per delivery"), with room for the emulator's partly filled SQS receives and the
// endpoints' first slot takes. 3 of each event's units are its place in the `unfanned`
// index (the entry's put, the fan-out's mark of the event, the entry's delete), which is
// what lets the sweeper recover an event whose stream record was lost.
const API_WCU_GUARD: f64 = 6.5;
const OUTBOX_WCU_GUARD: f64 = 7.5;
const RETRIED_WCU_GUARD: f64 = 13.2;
// Every message of a batch for another endpoint: its own slot take and give-back (2 units)
// and its own hour count (1 unit: the counts are written once per endpoint per batch).
const SPREAD_WCU_GUARD: f64 = 9.35;
// 9.00, and the sweep's 4 units (its watermark, its run lock taken and given back, and when
// it ran) over the measurement's 50 deliveries.
const SPREAD_STEADY_WCU_GUARD: f64 = 9.15;

#[tokio::test]
async fn cost_per_first_try_and_retried_delivery() {
    let api = measure(
        Publisher::Api,
        50,
        0,
        Destinations::OneEndpoint,
        Endpoints::New,
    )
    .await;
    api.print("first try, published through the API");
    let outbox = measure(
        Publisher::Outbox,
        100,
        0,
        Destinations::OneEndpoint,
        Endpoints::New,
    )
    .await;
    outbox.print("first try, published through the outbox");
    let retried = measure(
        Publisher::Api,
        30,
        1,
        Destinations::OneEndpoint,
        Endpoints::New,
    )
    .await;
    retried.print("retried once (500, then 200), published through the API");
    let spread = measure(
        Publisher::Api,
        50,
        0,
        Destinations::TenEndpoints,
        Endpoints::New,
    )
    .await;
    spread.print("first try, published through the API, each to the next of ten new endpoints");
    let spread_steady = measure(
        Publisher::Api,
        50,
        0,
        Destinations::TenEndpoints,
        Endpoints::DeliveredToBefore,
    )
    .await;
    spread_steady.print(
        "first try, published through the API, each to the next of ten endpoints delivered to before",
    );

    // ≤ 0.3 SQS requests is met by both paths (every publish goes through the stream's
    // fan-out) up to the emulator's partly filled receives.
    assert!(
        api.wcu() <= API_WCU_GUARD,
        "API first try: {} WCU",
        api.wcu()
    );
    assert!(
        api.sqs_requests() <= 0.5,
        "API first try: {} SQS requests",
        api.sqs_requests()
    );
    assert!(
        outbox.wcu() <= OUTBOX_WCU_GUARD,
        "outbox first try: {} WCU",
        outbox.wcu()
    );
    assert!(
        outbox.sqs_requests() <= 0.5,
        "outbox first try: {} SQS requests",
        outbox.sqs_requests()
    );
    assert!(
        spread.wcu() <= SPREAD_WCU_GUARD,
        "API first try, spread over endpoints: {} WCU",
        spread.wcu()
    );
    assert!(
        spread_steady.wcu() <= SPREAD_STEADY_WCU_GUARD,
        "API first try, spread over endpoints delivered to before: {} WCU",
        spread_steady.wcu()
    );
    assert!(
        retried.wcu() <= RETRIED_WCU_GUARD,
        "retried once: {} WCU",
        retried.wcu()
    );
}
