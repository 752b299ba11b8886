//! The test fixtures every store test builds from: accounts, endpoints, events, deliveries
//! and attempts. Written with `hooklane::` paths: the core crate compiles this file into its
//! own unit tests too (see its `lib.rs`), which cannot use this crate.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use hooklane::{
    clock::{from_millis, Timestamp},
    domain::{
        Account, AccountId, Attempt, Decision, Delivery, DeliveryId, EmailAddress, Endpoint,
        EndpointId, EndpointStatus, EndpointUrl, Event, EventId, EventType, EventTypeFilter,
        Replay, ReplayFilter, ReplayId, ReplayScope, Trigger,
    },
    signing::SigningSecret,
    store::{AttemptRecord, RecordOutcome, Store},
};

/// A fixed, millisecond-exact start so stored timestamps compare equal after a round trip.
pub fn t0() -> Timestamp {
    from_millis(1_700_000_000_000)
}

pub fn account(id: &str) -> Account {
    Account {
        id: AccountId::parse(id).unwrap(),
        name: format!("Account {id}"),
        owner_email: EmailAddress::parse("owner@example.com").unwrap(),
        created_at: t0(),
        publish_rate_limit: None,
    }
}

pub fn endpoint(account: &str, id: &str, created_at: Timestamp) -> Endpoint {
    Endpoint {
        id: EndpointId::parse(id).unwrap(),
        account_id: AccountId::parse(account).unwrap(),
        url: EndpointUrl::parse(&format!("https://{id}.example.com/hooks")).unwrap(),
        description: String::new(),
        secret: SigningSecret::generate(),
        retiring_secret: None,
        status: EndpointStatus::Active,
        event_types: EventTypeFilter::all(),
        max_in_flight: 4,
        rate_limit_per_second: None,
        headers: Default::default(),
        failing_since: None,
        disabled_reason: None,
        created_at,
        updated_at: created_at,
    }
}

/// [`endpoint`] created at `t0`, sending to `url` instead of its own example address.
pub fn endpoint_sending_to(account: &str, id: &str, url: &str) -> Endpoint {
    Endpoint {
        url: EndpointUrl::parse(url).unwrap(),
        ..endpoint(account, id, t0())
    }
}

/// Stores the account `id` (as [`account`] makes it), then each of `endpoints`.
pub async fn create_account_and_endpoints(
    store: &dyn Store,
    id: &str,
    endpoints: impl IntoIterator<Item = &Endpoint>,
) {
    store.create_account(&account(id)).await.unwrap();
    for endpoint in endpoints {
        store.create_endpoint(endpoint).await.unwrap();
    }
}

/// Stores the account `id` with an endpoint of each of `endpoint_ids` (as [`endpoint`]
/// makes them, created at `t0`); returns the endpoints.
pub async fn account_with_endpoints<const N: usize>(
    store: &dyn Store,
    id: &str,
    endpoint_ids: [&str; N],
) -> [Endpoint; N] {
    let endpoints = endpoint_ids.map(|endpoint_id| endpoint(id, endpoint_id, t0()));
    create_account_and_endpoints(store, id, &endpoints).await;
    endpoints
}

/// Stores the account `id` with `count` endpoints, `ep_000`, `ep_001`, … (as [`endpoint`]
/// makes them, created at `t0`); returns them in that order.
pub async fn account_with_numbered_endpoints(
    store: &dyn Store,
    id: &str,
    count: usize,
) -> Vec<Endpoint> {
    let endpoints: Vec<Endpoint> = (0..count)
        .map(|i| endpoint(id, &format!("ep_{i:03}"), t0()))
        .collect();
    create_account_and_endpoints(store, id, &endpoints).await;
    endpoints
}

/// Publishes the event `event_id` of their account at `t0` to every one of `endpoints`;
/// returns it and its deliveries, in their order.
pub async fn publish_to_all(
    store: &dyn Store,
    endpoints: &[Endpoint],
    event_id: &str,
) -> (Event, Vec<Delivery>) {
    let account = endpoints.first().map_or("acme", |e| e.account_id.as_str());
    let ev = event(account, event_id, t0());
    let deliveries: Vec<Delivery> = endpoints.iter().map(|e| delivery(&ev, e, t0())).collect();
    store.publish(&ev, &deliveries).await.unwrap();
    (ev, deliveries)
}

pub fn event(account: &str, id: &str, at: Timestamp) -> Event {
    typed_event(account, id, "invoice.paid", at)
}

pub fn typed_event(account: &str, id: &str, event_type: &str, at: Timestamp) -> Event {
    Event::new(
        EventId::parse(id).unwrap(),
        AccountId::parse(account).unwrap(),
        EventType::parse(event_type).unwrap(),
        at,
        &serde_json::json!({"n": id}),
    )
    .unwrap()
}

pub fn delivery(event: &Event, endpoint: &Endpoint, at: Timestamp) -> Delivery {
    Delivery::new_pending(event, endpoint.id.clone(), at)
}

pub fn attempt_record(
    delivery: &Delivery,
    number: u32,
    decision: Decision,
    success: bool,
    now: Timestamp,
) -> AttemptRecord {
    AttemptRecord {
        attempt: Attempt {
            delivery_id: delivery.id.clone(),
            number,
            trigger: Trigger::Scheduled,
            started_at: now,
            latency_ms: 12,
            status_code: Some(if success { 200 } else { 500 }),
            response_headers: vec![("x-test".into(), "1".into())],
            response_body: "body".into(),
            response_body_truncated: false,
            error: (!success).then(|| "HTTP 500".to_owned()),
        },
        expected_attempts: number - 1,
        decision,
        client_error_count: 0,
        endpoint_id: delivery.endpoint_id.clone(),
        account_id: delivery.account_id.clone(),
        success,
        now,
    }
}

/// Seconds after a second fixed start (later than `t0`), for tests that count in seconds.
pub fn at(seconds: i64) -> Timestamp {
    from_millis(1_900_000_000_000 + seconds * 1000)
}

/// Publishes an event at `second` to `endpoints`; returns its deliveries in that order.
pub async fn publish(
    store: &dyn Store,
    account: &AccountId,
    second: i64,
    event_type: &str,
    endpoints: &[&Endpoint],
) -> Vec<Delivery> {
    let event = typed_event(
        account.as_str(),
        &format!("evt_{second}"),
        event_type,
        at(second),
    );
    let deliveries: Vec<Delivery> = endpoints
        .iter()
        .map(|e| delivery(&event, e, at(second)))
        .collect();
    store.publish(&event, &deliveries).await.expect("publish");
    deliveries
}

/// Publishes the event `event_id` of `endpoint`'s account at `t0`, with one delivery: to
/// `endpoint`.
pub async fn publish_one(
    store: &dyn Store,
    endpoint: &Endpoint,
    event_id: &str,
) -> (Event, Delivery) {
    let ev = event(endpoint.account_id.as_str(), event_id, t0());
    let d = delivery(&ev, endpoint, t0());
    store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
    (ev, d)
}

/// Publishes `count` events (`evt_000`, `evt_001`, …) as [`publish_one`] does; returns their
/// deliveries in that order.
pub async fn publish_each(store: &dyn Store, endpoint: &Endpoint, count: usize) -> Vec<Delivery> {
    let mut deliveries = Vec::with_capacity(count);
    for i in 0..count {
        let (_, d) = publish_one(store, endpoint, &format!("evt_{i:03}")).await;
        deliveries.push(d);
    }
    deliveries
}

/// One attempt at `second` on the delivery as it stands; `decision` decides what it becomes.
pub async fn attempt(
    store: &dyn Store,
    delivery: &DeliveryId,
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
    let mut record = attempt_record(
        &current,
        current.attempts + 1,
        decision,
        success,
        at(second),
    );
    record.attempt.trigger = current.next_trigger;
    record.client_error_count = current.client_error_count + 1;
    store.record_attempt(&record).await.expect("record")
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
        missed: 0,
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

/// An environment of `(name, value)` pairs, as the settings parsers read one.
pub fn environment(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

/// An embedded `App` over `store`, reading `clock`: the in-process queue, a real HTTP sender,
/// mail to the log, default rules. It publishes an event with its deliveries, in one
/// transaction, as no fan-out task runs beside it (`serve` publishes through one:
/// `PublishMode::ThroughStream`). Tests change a part with `App { …, ..app }`.
pub fn app_on(
    store: std::sync::Arc<dyn Store>,
    clock: std::sync::Arc<dyn hooklane::Clock>,
) -> hooklane::App {
    use std::sync::Arc;
    let config = hooklane::CoreConfig::default();
    hooklane::App {
        store,
        queue: Arc::new(hooklane::queue::embedded::EmbeddedQueue::new()),
        transport: Arc::new(hooklane::http::HttpSender::new(config.sender.clone()).unwrap()),
        notifier: Arc::new(hooklane::notify::LogNotifier),
        clock,
        config: Arc::new(config),
        publish: hooklane::PublishMode::WithDeliveries,
    }
}

/// A transport that gives every request the same answer, as a scripted receiver would.
pub struct Answering(pub hooklane::http::OutboundResponse);

#[async_trait::async_trait]
impl hooklane::http::Transport for Answering {
    async fn post(&self, _: hooklane::http::OutboundRequest) -> hooklane::http::OutboundResponse {
        self.0.clone()
    }
}

/// A hostile receiver's answer, larger in every part than what an attempt keeps: a 500 whose
/// body is bytes that are not UTF-8 (each decodes to 3 bytes of text), read up to the
/// sender's cap with more behind it, and 100 headers with 1000-byte names and 3 KiB values,
/// decoded from bytes that are not UTF-8 or all quotes (which JSON doubles).
pub fn largest_answer() -> hooklane::http::OutboundResponse {
    let not_utf8 = |len: usize| String::from_utf8_lossy(&vec![0xFF; len]).into_owned();
    let headers = (0..100)
        .map(|i| {
            let name = format!("x-{i:03}-{}", "a".repeat(994));
            let value = if i % 2 == 0 {
                not_utf8(3 * 1024)
            } else {
                "\"".repeat(3 * 1024)
            };
            (name, value)
        })
        .collect();
    hooklane::http::OutboundResponse {
        status: Some(500),
        headers,
        body: vec![0xFF; hooklane::http::SenderConfig::default().max_response_body],
        body_truncated: true,
        latency: std::time::Duration::from_millis(5),
        error: None,
        unsent: None,
    }
}

/// A SQLite store on a new file `hooklane.db` in a fresh scratch directory named after
/// `name`, its secrets under a key that lives as long as the process: for tests that reach
/// the file from a second connection (a lock, a backup).
pub fn sqlite_file_store(
    name: &str,
) -> (
    std::sync::Arc<hooklane::store::sqlite::SqliteStore>,
    std::path::PathBuf,
) {
    let dir = std::env::temp_dir().join(format!("hooklane-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let database = dir.join("hooklane.db");
    let store = hooklane::store::sqlite::SqliteStore::open(
        &database,
        hooklane::secrets::SecretsCipher::ephemeral().unwrap(),
    )
    .unwrap();
    (std::sync::Arc::new(store), database)
}
