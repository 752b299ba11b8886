//! Test support for the core crate's tests, the Lambda crates' handler tests and the
//! end-to-end tests: a local receiver, the AWS shape on the emulator, metrics capture, the
//! template as SAM translates it. Written with `hooklane::` paths, like `contract`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpListener,
};

/// A receiver that answers every request after `delay`, counting how many it is
/// serving at once and noting when each request arrived.
pub struct SlowReceiver {
    pub url: String,
    pub now: Arc<AtomicUsize>,
    pub most: Arc<AtomicUsize>,
    pub served: Arc<AtomicUsize>,
    pub arrivals: Arc<Mutex<Vec<Arrival>>>,
}

/// One request as the receiver saw it: when its headers were complete, and its `webhook-id`.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub at: SystemTime,
    pub webhook_id: Option<String>,
}

impl SlowReceiver {
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().unwrap().clone()
    }
}

fn header_value(head: &[u8], name: &str) -> Option<String> {
    String::from_utf8_lossy(head).lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

pub async fn slow_receiver(delay: Duration) -> SlowReceiver {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let (n, m, s, a) = (now.clone(), most.clone(), served.clone(), arrivals.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let (n, m, s, a) = (n.clone(), m.clone(), s.clone(), a.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => seen.extend_from_slice(&buf[..k]),
                    }
                }
                a.lock().unwrap().push(Arrival {
                    at: SystemTime::now(),
                    webhook_id: header_value(&seen, hooklane::signing::HEADER_ID),
                });
                let inside = n.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(inside, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                n.fetch_sub(1, Ordering::SeqCst);
                s.fetch_add(1, Ordering::SeqCst);
                let _ = socket
                    .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    SlowReceiver {
        url,
        now,
        most,
        served,
        arrivals,
    }
}

/// The address a starting `hooklane serve` reports on its standard output (`hooklane
/// listening on <url>`), waited for up to 30 s; `None` when the output ends first or it takes
/// longer. Once it is found, the rest of the output is read and dropped in the background, so
/// that the process never blocks on a full pipe.
pub async fn serve_address<R>(stdout: R) -> Option<String>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    serve_startup(stdout).await.map(|(base, _)| base)
}

/// [`serve_address`], and the lines printed before it (e.g. a generated admin token).
pub async fn serve_startup<R>(stdout: R) -> Option<(String, Vec<String>)>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let mut lines = BufReader::new(stdout).lines();
    let mut before = Vec::new();
    let base = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(url) = line.strip_prefix("hooklane listening on ") {
                return Some(url.trim().to_owned());
            }
            before.push(line);
        }
        None
    })
    .await
    .ok()
    .flatten()?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Some((base, before))
}

/// Panics with how to get one when no AWS emulator is configured: a skipped AWS test would
/// look like a passing one.
pub fn require_emulator() {
    assert!(
        std::env::var_os("AWS_ENDPOINT_URL").is_some(),
        "AWS_ENDPOINT_URL is not set: the AWS adapter tests need the local AWS emulator \
         (moto_server); run them through scripts/test, which provisions and starts it"
    );
}

/// A DynamoDB client for the emulator, which refuses what DynamoDB refuses in a query's
/// key condition ([`KeyConditionRules`]); fails loudly without an emulator.
#[cfg(feature = "aws")]
pub async fn emulator_client() -> hooklane::aws::aws_sdk_dynamodb::Client {
    require_emulator();
    let config = hooklane::aws::aws_sdk_dynamodb::config::Builder::from(
        &hooklane::aws::load_sdk_config().await,
    )
    .interceptor(KeyConditionRules)
    .build();
    hooklane::aws::aws_sdk_dynamodb::Client::from_conf(config)
}

/// What DynamoDB refuses in a query's key condition and the emulator answers: an empty string
/// as a key value, and a `BETWEEN` whose lower bound is above its upper one (DynamoDB
/// compares strings by their UTF-8 bytes). Installed on [`emulator_client`], so that a store
/// test fails where AWS would.
#[cfg(feature = "aws")]
#[derive(Debug)]
pub struct KeyConditionRules;

#[cfg(feature = "aws")]
impl aws_smithy_runtime_api::client::interceptors::Intercept for KeyConditionRules {
    fn name(&self) -> &'static str {
        "KeyConditionRules"
    }

    fn read_before_execution(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef<'_>,
        _: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        use hooklane::aws::aws_sdk_dynamodb::operation::query::QueryInput;
        let Some(query) = context.input().downcast_ref::<QueryInput>() else {
            return Ok(());
        };
        check_key_condition(
            query.key_condition_expression().unwrap_or_default(),
            query.expression_attribute_values(),
        )
        .map_err(|message| format!("ValidationException (as DynamoDB answers): {message}").into())
    }
}

/// [`KeyConditionRules`] over one key condition and its values.
#[cfg(feature = "aws")]
pub fn check_key_condition(
    expression: &str,
    values: Option<
        &std::collections::HashMap<String, hooklane::aws::aws_sdk_dynamodb::types::AttributeValue>,
    >,
) -> Result<(), String> {
    use hooklane::aws::aws_sdk_dynamodb::types::AttributeValue;
    let value = |name: &str| values.and_then(|values| values.get(name));
    let words: Vec<&str> = expression
        .split(|c: char| c.is_whitespace() || matches!(c, '(' | ')' | ','))
        .filter(|w| !w.is_empty())
        .collect();
    for word in &words {
        if let Some(AttributeValue::S(text)) = value(word) {
            if text.is_empty() {
                return Err(format!(
                    "the AttributeValue for a key attribute cannot contain an empty string value ({word})"
                ));
            }
        }
    }
    for w in words.windows(4) {
        if !(w[0].eq_ignore_ascii_case("BETWEEN") && w[2].eq_ignore_ascii_case("AND")) {
            continue;
        }
        let reversed = match (value(w[1]), value(w[3])) {
            (Some(AttributeValue::S(low)), Some(AttributeValue::S(high))) => low > high,
            (Some(AttributeValue::N(low)), Some(AttributeValue::N(high))) => {
                low.parse::<f64>().ok() > high.parse::<f64>().ok()
            }
            _ => false,
        };
        if reversed {
            return Err(format!(
                "Invalid KeyConditionExpression: the BETWEEN operator requires upper bound to be \
                 greater than or equal to lower bound ({} > {})",
                w[1], w[3]
            ));
        }
    }
    Ok(())
}

/// The key the tests' stores seal endpoint secrets with.
pub const TEST_SECRETS_KEY: [u8; 32] = [0x5e; 32];

/// A cipher of [`TEST_SECRETS_KEY`] (and `previous`, if given).
pub fn test_secrets(previous: Option<&[u8; 32]>) -> hooklane::secrets::SecretsCipher {
    hooklane::secrets::SecretsCipher::new(&TEST_SECRETS_KEY, previous).unwrap()
}

/// A DynamoDB store on fresh tables of the emulator, so tests never see each other's items.
/// The late-write rule is off, and the log shows expired deliveries: the fixtures' fixed
/// times lie years back, where every delivery would be indexed as it is written (and the
/// sweeper's walk would go untested), and every ended one would have expired.
#[cfg(feature = "aws")]
pub async fn emulator_store() -> hooklane::store::dynamodb::DynamoStore {
    emulator_store_and_tables().await.0
}

/// [`emulator_store`], with the client and table names it uses: for a test that writes
/// items of its own beside the store's.
#[cfg(feature = "aws")]
pub async fn emulator_store_and_tables() -> (
    hooklane::store::dynamodb::DynamoStore,
    hooklane::aws::aws_sdk_dynamodb::Client,
    hooklane::store::dynamodb::TableNames,
) {
    let client = emulator_client().await;
    let tables = fresh_table_names();
    let store = emulator_store_on(client.clone(), &tables).await;
    (store, client, tables)
}

/// Table names no other test uses.
#[cfg(feature = "aws")]
pub fn fresh_table_names() -> hooklane::store::dynamodb::TableNames {
    hooklane::store::dynamodb::TableNames::with_prefix(&format!(
        "t{}",
        uuid::Uuid::new_v4().simple()
    ))
}

/// [`emulator_store`] on `tables`, created through `client` (one that counts its calls,
/// say).
#[cfg(feature = "aws")]
pub async fn emulator_store_on(
    client: hooklane::aws::aws_sdk_dynamodb::Client,
    tables: &hooklane::store::dynamodb::TableNames,
) -> hooklane::store::dynamodb::DynamoStore {
    use hooklane::store::dynamodb::{create_tables, DynamoStore, Retention};
    create_tables(&client, tables).await.unwrap();
    DynamoStore::new(
        client,
        tables.clone(),
        Retention::default(),
        test_secrets(None),
    )
    .without_late_write_rule()
    .showing_expired()
}

/// Writes `items` to `table` directly, 25 to a request (BatchWriteItem's most): thousands
/// of items a test needs only to exist, where the store's own writes would take the
/// emulator minutes.
#[cfg(feature = "aws")]
pub async fn put_items(
    client: &hooklane::aws::aws_sdk_dynamodb::Client,
    table: &str,
    items: impl IntoIterator<
        Item = std::collections::HashMap<
            String,
            hooklane::aws::aws_sdk_dynamodb::types::AttributeValue,
        >,
    >,
) {
    use hooklane::aws::aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
    let requests: Vec<WriteRequest> = items
        .into_iter()
        .map(|item| {
            let put = PutRequest::builder().set_item(Some(item)).build().unwrap();
            WriteRequest::builder().put_request(put).build()
        })
        .collect();
    for chunk in requests.chunks(25) {
        let out = client
            .batch_write_item()
            .request_items(table, chunk.to_vec())
            .send()
            .await
            .unwrap();
        assert!(out.unprocessed_items().is_none_or(|u| u.is_empty()));
    }
}

/// A whole AWS shape on fresh tables, queue and schedule group of the emulator, sending to
/// loopback receivers.
#[cfg(feature = "aws")]
pub async fn emulated_shape() -> (
    hooklane::aws::settings::AwsSettings,
    hooklane::aws::shape::AwsShape,
) {
    emulated_shape_with(hooklane::config::CoreConfig::default()).await
}

/// Up to ten messages from a queue on the emulator, waiting up to `wait_seconds` for the
/// first (0: answer at once). What is received is hidden for the queue's visibility timeout.
#[cfg(feature = "aws")]
pub async fn receive_queued(
    queue_url: &str,
    wait_seconds: i32,
) -> Vec<hooklane::aws::aws_sdk_sqs::types::Message> {
    hooklane::aws::aws_sdk_sqs::Client::new(&hooklane::aws::load_sdk_config().await)
        .receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(wait_seconds)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default()
}

/// The body of the queue message that names `delivery`, as fan-out and the sweeper send it.
#[cfg(feature = "aws")]
pub fn delivery_message(delivery: &hooklane::domain::Delivery) -> String {
    serde_json::to_string(&hooklane::queue::sqs::DeliveryMessage {
        delivery_id: delivery.id.to_string(),
        endpoint_id: delivery.endpoint_id.to_string(),
        account_id: delivery.account_id.to_string(),
    })
    .unwrap()
}

/// Writes `event` as the platform does: through the outbox helper, in its own transaction
/// (here alone in it). The events table's stream then carries it to fan-out.
#[cfg(feature = "aws")]
pub async fn write_through_outbox(
    shape: &hooklane::aws::shape::AwsShape,
    event: &hooklane::domain::Event,
) {
    shape
        .store
        .client()
        .transact_write_items()
        .transact_items(
            hooklane::aws::aws_sdk_dynamodb::types::TransactWriteItem::builder()
                .put(shape.store.outbox_put(event).unwrap())
                .build(),
        )
        .send()
        .await
        .unwrap();
}

/// The item under `key` in `table`, read consistently; panics when there is none.
#[cfg(feature = "aws")]
pub async fn stored_item(
    client: &hooklane::aws::aws_sdk_dynamodb::Client,
    table: &str,
    key: std::collections::HashMap<String, hooklane::aws::aws_sdk_dynamodb::types::AttributeValue>,
) -> std::collections::HashMap<String, hooklane::aws::aws_sdk_dynamodb::types::AttributeValue> {
    let read = client
        .get_item()
        .table_name(table)
        .set_key(Some(key))
        .consistent_read(true)
        .send()
        .await;
    read.unwrap()
        .item
        .unwrap_or_else(|| panic!("no such item in {table}"))
}

/// The item of the event `id` of `account` as `store`'s events table holds it.
#[cfg(feature = "aws")]
pub async fn stored_event_item(
    store: &hooklane::store::dynamodb::DynamoStore,
    account: &str,
    id: &str,
) -> std::collections::HashMap<String, hooklane::aws::aws_sdk_dynamodb::types::AttributeValue> {
    use hooklane::aws::aws_sdk_dynamodb::types::AttributeValue;
    let key = [("account_id", account), ("id", id)]
        .map(|(name, value)| (name.to_owned(), AttributeValue::S(value.to_owned())));
    stored_item(store.client(), &store.tables().events, key.into()).await
}

/// Deletes what DynamoDB's TTL would from `table` by `now`: every item whose `expires_at` is
/// a Number of epoch seconds before it. The emulator never expires anything, so tests that
/// depend on what TTL leaves behind apply the rule themselves. Returns how many it deleted.
#[cfg(feature = "aws")]
pub async fn expire_as_ttl_would(
    client: &hooklane::aws::aws_sdk_dynamodb::Client,
    table: &str,
    now: hooklane::clock::Timestamp,
) -> usize {
    let now_secs = hooklane::clock::to_millis(now).div_euclid(1000);
    let described = client.describe_table().table_name(table).send().await;
    let key_names: Vec<String> = described
        .unwrap()
        .table
        .expect("the table")
        .key_schema()
        .iter()
        .map(|k| k.attribute_name().to_owned())
        .collect();
    let mut deleted = 0;
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        for item in page.items() {
            // TTL ignores an attribute that is not a Number (or is missing).
            let expired = item
                .get("expires_at")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<i64>().ok())
                .is_some_and(|at| at < now_secs);
            if expired {
                let key = key_names
                    .iter()
                    .map(|name| (name.clone(), item[name].clone()))
                    .collect();
                client
                    .delete_item()
                    .table_name(table)
                    .set_key(Some(key))
                    .send()
                    .await
                    .unwrap();
                deleted += 1;
            }
        }
        match page.last_evaluated_key {
            Some(key) => start = Some(key),
            None => return deleted,
        }
    }
}

/// Fails unless the emulator refuses writes to `table` past its capacity (a `throttled…`
/// stack's delivery log, a `saturated…` stack's attempts): 40 deletes of an item that does
/// not exist, sent at once with the SDK's retries off, must meet
/// `ProvisionedThroughputExceededException`. A test
/// of behaviour under throttling calls it first, so that it cannot pass against an emulator
/// that never throttles. It waits a second after, for the capacity to come back.
#[cfg(feature = "aws")]
pub async fn assert_emulator_throttles(table: &str) {
    use hooklane::aws::aws_sdk_dynamodb::{
        config::{retry::RetryConfig, Builder},
        error::ProvideErrorMetadata,
        types::AttributeValue,
        Client,
    };
    let config = Builder::from(&hooklane::aws::load_sdk_config().await)
        .retry_config(RetryConfig::disabled())
        .build();
    let client = Client::from_conf(config);
    // The probe's key, of the table's own attributes and types.
    let described = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .unwrap_or_else(|e| panic!("describe {table}: {e:?}"));
    let description = described.table().expect("a table description");
    let key: Vec<(String, bool)> = description
        .key_schema()
        .iter()
        .map(|k| {
            let numeric = description.attribute_definitions().iter().any(|a| {
                a.attribute_name() == k.attribute_name() && a.attribute_type().as_str() == "N"
            });
            (k.attribute_name().to_owned(), numeric)
        })
        .collect();
    // At once, not one after the other: on a loaded host 40 calls in a row may take over a
    // second, and then never exceed 20 in one.
    let mut deletes = tokio::task::JoinSet::new();
    for n in 0..40 {
        let mut delete = client.delete_item().table_name(table);
        for (name, numeric) in &key {
            let value = if *numeric {
                AttributeValue::N(n.to_string())
            } else {
                AttributeValue::S(format!("capacity-probe-{n}"))
            };
            delete = delete.key(name, value);
        }
        deletes.spawn(delete.send());
    }
    let mut refused = 0;
    while let Some(answer) = deletes.join_next().await {
        match answer.expect("a probe's task") {
            Ok(_) => {}
            Err(error) if error.code() == Some("ProvisionedThroughputExceededException") => {
                refused += 1
            }
            Err(error) => panic!("probe of {table}: {error:?}"),
        }
    }
    assert!(
        refused > 0,
        "{table} took 40 writes at once: the emulator does not throttle it (scripts/moto_server_atomic.py)"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
}

/// [`emulated_shape`] with chosen settings (e.g. a short request deadline, so that slot
/// leases run out within a test); loopback receivers are allowed whatever `core` says.
#[cfg(feature = "aws")]
pub async fn emulated_shape_with(
    core: hooklane::config::CoreConfig,
) -> (
    hooklane::aws::settings::AwsSettings,
    hooklane::aws::shape::AwsShape,
) {
    emulated_shape_named("f", core).await
}

/// [`emulated_shape_with`] for a stack whose name begins with `start`: `throttled` gives its
/// delivery log a write capacity the emulator enforces (see `scripts/moto_server_atomic.py`).
#[cfg(feature = "aws")]
pub async fn emulated_shape_named(
    start: &str,
    mut core: hooklane::config::CoreConfig,
) -> (
    hooklane::aws::settings::AwsSettings,
    hooklane::aws::shape::AwsShape,
) {
    require_emulator();
    core.sender.policy =
        hooklane::http::AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()], false);
    // The key of endpoint secrets, which `Server::start_aws` of the end-to-end tests also gives.
    core.secrets.current.get_or_insert(TEST_SECRETS_KEY);
    let prefix = format!(
        "{start}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let settings = hooklane::aws::local::provision(&prefix, core)
        .await
        .unwrap();
    let shape = hooklane::aws::shape::connect(&settings).await.unwrap();
    (settings, shape)
}

/// The text of the mail the emulator accepted: moto lists it under `/moto-api/data.json`,
/// LocalStack under `/_aws/ses`.
pub async fn sent_mail_text() -> String {
    require_emulator();
    let base = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let http = reqwest::Client::new();
    // moto answers 500 when another test changes its state while it dumps it: ask again.
    for _ in 0..5 {
        for path in ["/moto-api/data.json", "/_aws/ses"] {
            if let Ok(response) = http.get(format!("{base}{path}")).send().await {
                if response.status().is_success() {
                    return response.text().await.unwrap();
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    panic!("the emulator at {base} shows no sent mail");
}

/// The Lambda functions' metrics publisher, writing to memory and installed as this
/// thread's recorder (a `#[tokio::test]` runs every task on its one thread). Keep the guard
/// alive for the test; the recorder is leaked so that the guard can outlive this call.
pub fn capture_lambda_metrics(
    stack: &str,
) -> (
    hooklane::telemetry::emf::EmfPublisher,
    hooklane::telemetry::emf::LogCapture,
    metrics::LocalRecorderGuard<'static>,
) {
    let capture = hooklane::telemetry::emf::LogCapture::default();
    let publisher = hooklane::telemetry::emf::EmfPublisher::new(
        hooklane::telemetry::lambda_recorder(stack),
        capture.clone(),
    );
    let recorder: &'static hooklane::telemetry::emf::EmfRecorder =
        Box::leak(Box::new(publisher.recorder().clone()));
    let guard = metrics::set_default_local_recorder(recorder);
    hooklane::telemetry::describe();
    (publisher, capture, guard)
}

/// What `recorder` counted in `hooklane_deliveries_created_total` since its last flush.
pub fn deliveries_counted(recorder: &hooklane::telemetry::emf::EmfRecorder) -> u64 {
    recorder
        .flush(0)
        .iter()
        .find_map(|document| {
            document
                .get(hooklane::telemetry::DELIVERIES_CREATED)?
                .as_u64()
        })
        .unwrap_or(0)
}

/// `infra/template.yaml` as CloudFormation deploys it, translated by aws-sam-translator
/// (`tests/sam_translate.py` in the test venv, `HOOKLANE_TEST_PYTHON`); with
/// `--managed-policies ARN...` as `args`, those AWS managed policies' documents instead.
pub fn sam_translated(args: &[&str]) -> serde_json::Value {
    let python = std::env::var("HOOKLANE_TEST_PYTHON").expect(
        "HOOKLANE_TEST_PYTHON is not set: this test translates the template with \
         aws-sam-translator from the test environment (scripts/test-env prints its python)",
    );
    let output = std::process::Command::new(python)
        .current_dir(repository_root())
        .arg("tests/sam_translate.py")
        .args(args)
        .output()
        .expect("run tests/sam_translate.py");
    assert!(
        output.status.success(),
        "tests/sam_translate.py failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON from tests/sam_translate.py")
}

/// The repository's root (where `infra/template.yaml` is), from the crate being tested.
fn repository_root() -> std::path::PathBuf {
    let mut dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !dir.join("infra/template.yaml").exists() {
        assert!(
            dir.pop(),
            "no infra/template.yaml above {}",
            env!("CARGO_MANIFEST_DIR")
        );
    }
    dir
}

#[cfg(all(test, feature = "aws"))]
mod key_condition_rules {
    use super::check_key_condition;
    use hooklane::aws::aws_sdk_dynamodb::types::AttributeValue;

    fn values(
        pairs: &[(&str, AttributeValue)],
    ) -> std::collections::HashMap<String, AttributeValue> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn a_reversed_between_and_an_empty_key_value_are_refused_as_dynamodb_does() {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let n = |v: &str| AttributeValue::N(v.to_owned());
        let between = "pk = :p AND sk BETWEEN :a AND :b";
        let ok = values(&[(":p", s("x")), (":a", s("0001#a")), (":b", s("0002#~"))]);
        assert_eq!(check_key_condition(between, Some(&ok)), Ok(()));
        let reversed = values(&[(":p", s("x")), (":a", s("0003#a")), (":b", s("0002#~"))]);
        assert!(check_key_condition(between, Some(&reversed)).is_err());
        let numbers = values(&[(":p", s("x")), (":a", n("10")), (":b", n("9"))]);
        assert!(
            check_key_condition(between, Some(&numbers)).is_err(),
            "10 > 9, not as text"
        );
        let empty = values(&[(":p", s("x")), (":a", s("")), (":b", s("0002#~"))]);
        assert!(check_key_condition(between, Some(&empty)).is_err());
        let prefix = values(&[(":p", s("x")), (":a", s(""))]);
        assert!(check_key_condition("pk = :p AND begins_with(sk, :a)", Some(&prefix)).is_err());
    }
}
