//! docs/OUTBOX.md on the AWS shape: the page shows exactly the files under docs/outbox/, and
//! its Python, Node.js and `aws dynamodb transact-write-items` examples, run against the
//! emulator with `serve --backend aws`, deliver their event signed, once, and nothing when the
//! business write's condition fails. Items that break the contract, written from Python, are
//! rejected with their reason, listed and counted, and never hold up the stream.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use hooklane::{
    aws::aws_sdk_dynamodb::types::AttributeValue,
    signing::{verify, SigningSecret},
};
use hooklane_testkit::farm::{Arrival, Farm};
use hooklane_testkit::testing::emulated_shape;
use serde_json::{json, Value};

use crate::{
    aws_pipeline::{create_orders_table, stack_env, unique},
    snippets::assert_page_shows_exactly,
    support::{test_python, Scratch, Server},
};

const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs");
const PAGE: &str = "OUTBOX.md";
const FILES: [&str; 6] = [
    "outbox/place_order.py",
    "outbox/place_order.mjs",
    "outbox/place-order.json",
    "outbox/postgres.sql",
    "outbox/postgres-transaction.sql",
    "outbox/sqlite.sql",
];
/// Code blocks in these languages must be tested files.
const LANGUAGES: [&str; 5] = ["python", "js", "javascript", "json", "sql"];
const HELPER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/outbox_writes.py");

#[test]
fn outbox_md_shows_exactly_the_tested_files() {
    assert_page_shows_exactly(PAGE, &FILES, &LANGUAGES, "outbox");
}

/// DynamoDB refuses a write whose value for an index's key attribute has another type than
/// the table declares (`Type mismatch for Index Key`); the emulator does not check it. This
/// is that rule, over the template's events table, so the documented items are held to it.
fn aws_refuses_index_key_type(item: &Value) -> Option<String> {
    let template = hooklane::aws::stack::template().expect("infra/template.yaml");
    let table = &template["Resources"]["EventsTable"]["Properties"];
    let declared = table["AttributeDefinitions"]
        .as_array()
        .expect("attribute definitions");
    for definition in declared {
        let name = definition["AttributeName"].as_str().expect("name");
        let kind = definition["AttributeType"].as_str().expect("type");
        if let Some(value) = item.get(name).and_then(Value::as_object) {
            if !value.contains_key(kind) {
                return Some(format!(
                    "Type mismatch for Index Key {name} Expected: {kind}"
                ));
            }
        }
    }
    None
}

#[test]
fn the_documented_items_have_the_index_key_types_aws_demands() {
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(DOCS).join("outbox/place-order.json")).expect("read"),
    )
    .expect("JSON");
    let event = &json[1]["Put"]["Item"];
    assert_eq!(aws_refuses_index_key_type(event), None);
    let mut wrong = event.clone();
    wrong["created_at"] = json!({"S": "2026-01-01"});
    assert!(aws_refuses_index_key_type(&wrong).is_some_and(|e| e.contains("created_at")));
    let mut wrong = event.clone();
    wrong["unfanned_shard"] = json!({"N": "1"});
    assert!(aws_refuses_index_key_type(&wrong).is_some());
}

/// `serve --backend aws` on a fresh stack, with account `acme`, an endpoint at the farm and
/// the platform's own `orders` table.
struct Stack {
    server: Server,
    farm: Farm,
    secret: String,
    orders: String,
    events: String,
    client: hooklane::aws::aws_sdk_dynamodb::Client,
    _scratch: Scratch,
}

async fn stack(name: &str) -> Stack {
    let (settings, shape) = emulated_shape().await;
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new(name);
    let server = Server::start_aws(&scratch, &[], &stack_env(&settings)).await;
    server.create_account("acme").await;
    let (_, secret) = server
        .create_endpoint("acme", &farm.url("orders"), json!({}))
        .await;
    let client = shape.store.client().clone();
    let orders = unique("orders");
    create_orders_table(&client, &orders).await;
    Stack {
        server,
        farm,
        secret,
        orders,
        events: settings.tables.events.clone(),
        client,
        _scratch: scratch,
    }
}

/// The test's AWS variables, for a program that uses the AWS SDK (the region twice: boto3
/// reads AWS_DEFAULT_REGION, the others AWS_REGION).
fn aws_env(command: &mut Command) -> &mut Command {
    for (key, value) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
        command.env(key, value);
    }
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
    command
        .env("AWS_REGION", &region)
        .env("AWS_DEFAULT_REGION", &region)
}

fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[derive(Clone, Copy, Debug)]
enum Snippet {
    Python,
    Node,
}

/// Runs a snippet as its command line says: `place_order ORDERS EVENTS ACCOUNT ORDER TOTAL`.
fn place_order(
    snippet: Snippet,
    stack: &Stack,
    node_dir: &Path,
    order: &str,
    total: u32,
) -> String {
    run(
        &mut place_order_command(snippet, stack, node_dir, order, total),
        &format!("the {snippet:?} outbox snippet"),
    )
}

/// The snippet's command line, placing `order` of `total` through the emulator.
fn place_order_command(
    snippet: Snippet,
    stack: &Stack,
    node_dir: &Path,
    order: &str,
    total: u32,
) -> Command {
    let args = [
        stack.orders.as_str(),
        stack.events.as_str(),
        "acme",
        order,
        &total.to_string(),
    ]
    .map(str::to_owned);
    let mut command = match snippet {
        Snippet::Python => {
            let mut c = Command::new(test_python());
            c.arg(Path::new(DOCS).join("outbox/place_order.py"));
            c
        }
        Snippet::Node => {
            let mut c = Command::new("node");
            c.arg(node_dir.join("place_order.mjs"));
            c
        }
    };
    command.args(args);
    aws_env(&mut command);
    command
}

/// The Node.js snippet imports `@aws-sdk/client-dynamodb`, which an ES module resolves from
/// its own directory: a copy of it sits beside the tests' node_modules.
fn node_snippet_dir(scratch: &Scratch) -> PathBuf {
    let modules = std::env::var_os("HOOKLANE_TEST_NODE_MODULES").map(PathBuf::from).unwrap_or_else(|| {
        panic!("HOOKLANE_TEST_NODE_MODULES is not set: run the tests with scripts/test, which installs the AWS SDK for the Node.js snippet")
    });
    assert!(
        modules.join("@aws-sdk/client-dynamodb").is_dir(),
        "{} has no @aws-sdk/client-dynamodb: run scripts/test-env-browser",
        modules.display()
    );
    let dir = scratch.path().join("node");
    std::fs::create_dir_all(&dir).expect("node dir");
    std::fs::copy(
        Path::new(DOCS).join("outbox/place_order.mjs"),
        dir.join("place_order.mjs"),
    )
    .expect("copy the snippet");
    std::os::unix::fs::symlink(&modules, dir.join("node_modules")).expect("link node_modules");
    dir
}

fn assert_signed(arrival: &Arrival, secret: &str) {
    let secret = SigningSecret::parse(secret).expect("secret");
    let result = verify(
        &[&secret],
        arrival.webhook_id.as_deref().expect("webhook-id"),
        arrival.webhook_timestamp.as_deref().expect("timestamp"),
        arrival.webhook_signature.as_deref().expect("signature"),
        &arrival.body,
        chrono::Utc::now().timestamp(),
        300,
    );
    assert_eq!(result, Ok(()), "the webhook's signature does not verify");
}

async fn put_order(stack: &Stack, order: &str) {
    stack
        .client
        .put_item()
        .table_name(&stack.orders)
        .item("id", AttributeValue::S(order.into()))
        .send()
        .await
        .expect("an existing order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_snippets_deliver_signed_once_and_nothing_when_the_business_write_fails() {
    let started = std::time::Instant::now();
    let stack = stack("outbox-snippets").await;
    let scratch = Scratch::new("outbox-node");
    let node_dir = node_snippet_dir(&scratch);
    // Orders that exist already: placing them again must write nothing, event included.
    put_order(&stack, "ord_py_2").await;
    put_order(&stack, "ord_js_2").await;

    let mut expected = HashSet::new();
    for (snippet, prefix) in [(Snippet::Python, "ord_py"), (Snippet::Node, "ord_js")] {
        let first = format!("{prefix}_1");
        assert_eq!(
            place_order(snippet, &stack, &node_dir, &first, 42),
            "placed"
        );
        // The same call again (a retry after a timeout, say): the transaction is refused on
        // the event's condition, and the snippet knows it as done.
        assert_eq!(
            place_order(snippet, &stack, &node_dir, &first, 42),
            "already placed",
            "{snippet:?}"
        );
        assert_eq!(
            place_order(snippet, &stack, &node_dir, &format!("{prefix}_2"), 7),
            "refused",
            "{snippet:?}"
        );
        expected.insert(format!("{first}.placed"));
        // The event there without its order (written some other way): the call is not done,
        // and the snippet says so rather than answering "already placed".
        let orphan = format!("{prefix}_3");
        stack
            .client
            .put_item()
            .table_name(&stack.events)
            .item("account_id", AttributeValue::S("acme".into()))
            .item("id", AttributeValue::S(format!("{orphan}.placed")))
            .send()
            .await
            .expect("an event without its order");
        let output = place_order_command(snippet, &stack, &node_dir, &orphan, 5)
            .output()
            .expect("run the snippet");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        assert!(
            !output.status.success()
                && !stdout.contains("already placed")
                && stderr.contains("TransactionCanceled"),
            "{snippet:?}: {stdout}\n{stderr}"
        );
        let order = stack
            .client
            .get_item()
            .table_name(&stack.orders)
            .key("id", AttributeValue::S(orphan.clone()))
            .send()
            .await
            .expect("read the order");
        assert!(order.item.is_none(), "{snippet:?}: the order was written");
    }
    // The CLI's JSON form, sent as the CLI sends it (through boto3: the AWS CLI is not
    // installed here), twice.
    let cli = |what: &str| {
        let mut command = Command::new(test_python());
        command.args([
            HELPER,
            "cli-json",
            &Path::new(DOCS)
                .join("outbox/place-order.json")
                .display()
                .to_string(),
            &stack.orders,
            &stack.events,
        ]);
        let out: Value = serde_json::from_str(&run(aws_env(&mut command), what)).expect("JSON");
        out
    };
    assert_eq!(cli("the CLI form")["outcome"], "written");
    let again = cli("the CLI form, again");
    assert_eq!(again["outcome"], "canceled", "{again}");
    assert_eq!(again["codes"][1], "ConditionalCheckFailed", "{again}");
    expected.insert("ord_1003.placed".to_owned());

    assert!(
        stack
            .farm
            .wait_until(Duration::from_secs(20), |f| f
                .distinct_ids_succeeded("orders")
                == expected.len())
            .await,
        "not every outbox event arrived: {:?}; serve log:\n{}",
        stack
            .farm
            .arrivals("orders")
            .iter()
            .map(|a| a.webhook_id.clone())
            .collect::<Vec<_>>(),
        stack.server.log_text()
    );
    // Time for a second delivery of the repeats, or one of a refused order, to show up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let arrivals = stack.farm.arrivals("orders");
    let ids: Vec<String> = arrivals
        .iter()
        .filter_map(|a| a.webhook_id.clone())
        .collect();
    assert_eq!(
        ids.len(),
        expected.len(),
        "one webhook per placed order: {ids:?}"
    );
    assert_eq!(ids.iter().cloned().collect::<HashSet<_>>(), expected);
    for arrival in &arrivals {
        assert_signed(arrival, &stack.secret);
        let body: Value = serde_json::from_slice(&arrival.body).expect("JSON body");
        let id = body["id"].as_str().expect("id");
        assert_eq!(body["type"], "order.placed");
        assert_eq!(
            body["data"]["order"].as_str(),
            id.strip_suffix(".placed"),
            "{body}"
        );
        assert_eq!(body["data"]["total"], 42, "{body}");
    }
    for refused in ["ord_py_2.placed", "ord_js_2.placed"] {
        let (status, body) = stack
            .server
            .get(&format!("/v1/accounts/acme/events/{refused}"))
            .await;
        assert_eq!(status, 404, "a refused transaction left an event: {body}");
    }
    for id in &expected {
        let delivered = crate::aws_pipeline::eventually_delivered(&stack.server, "acme", id).await;
        assert_eq!(delivered["attempts"], 1, "{delivered}");
    }
    println!(
        "outbox snippets: Python, Node.js and the CLI JSON form each delivered their event once, \
         signed; their repeats and the refused orders delivered nothing ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

async fn rejected_metric(server: &Server) -> Option<u64> {
    let text = reqwest::Client::new()
        .get(format!("{}/metrics", server.base))
        .bearer_auth(crate::support::ADMIN_TOKEN)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with("hooklane_events_rejected_total"))
        .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .map(|v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_outbox_items_are_rejected_listed_and_counted_and_never_block_the_stream() {
    let started = std::time::Instant::now();
    let stack = stack("outbox-malformed").await;
    let helper = |args: &[&str], what: &str| -> Value {
        let mut command = Command::new(test_python());
        command.arg(HELPER).args(args);
        serde_json::from_str(&run(aws_env(&mut command), what)).expect("JSON")
    };
    let written = helper(
        &["malformed", &stack.events, "acme"],
        "writing malformed items",
    );
    // Then a good event, behind them in the stream.
    let node_unused = PathBuf::new();
    assert_eq!(
        place_order(Snippet::Python, &stack, &node_unused, "ord_after", 42),
        "placed"
    );
    assert!(
        stack
            .farm
            .wait_until(Duration::from_secs(20), |f| f
                .arrivals("orders")
                .iter()
                .any(|a| a.webhook_id.as_deref() == Some("ord_after.placed")))
            .await,
        "the good event behind the malformed ones never arrived; serve log:\n{}",
        stack.server.log_text()
    );
    let expected = [
        ("missing field", "missing `type`"),
        ("wrong type", "`data` is M, not a string"),
        ("created_at a string", "`created_at` is S, not a number"),
        ("created_at in seconds", "not milliseconds"),
        ("oversize payload", "the limit is 262144"),
        (
            "unknown account",
            "account `no-such-account` does not exist",
        ),
    ];
    let mut listed = Vec::new();
    let wait = std::time::Instant::now();
    while wait.elapsed() < Duration::from_secs(10) {
        listed = helper(&["rejected", &stack.events], "listing rejected items")
            .as_array()
            .cloned()
            .unwrap_or_default();
        if listed.len() >= expected.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut rejections = 0;
    for (kind, reason) in expected {
        let item = &written[kind];
        let id = item["id"].as_str().expect("id");
        if item["written"] == false {
            // Only DynamoDB itself refuses an item at the write (an index key of the wrong
            // type); the platform's transaction fails, and nothing is left to reject.
            println!(
                "outbox malformed: {kind}: refused at the write: {}",
                item["error"]
            );
            continue;
        }
        let entry = listed
            .iter()
            .find(|e| e["id"] == id)
            .unwrap_or_else(|| panic!("{kind} ({id}) is not listed as rejected: {listed:?}"));
        let recorded = entry["rejected"].as_str().unwrap_or_default();
        assert!(
            recorded.contains(reason),
            "{kind}: rejected for {recorded:?}, not {reason:?}"
        );
        println!("outbox malformed: {kind}: rejected: {recorded}");
        rejections += 1;
        if item["account"] == "acme" {
            let (status, body) = stack
                .server
                .get(&format!("/v1/accounts/acme/events/{id}"))
                .await;
            assert_eq!(status, 422, "{body}");
            assert_eq!(body["error"]["code"], "event_rejected", "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(recorded)),
                "GET names the rejection's reason: {body}"
            );
        }
    }
    // On AWS the string `created_at` never gets written (see the rule above); here it does,
    // and fan-out rejects it instead.
    assert!(aws_refuses_index_key_type(&json!({"created_at": {"S": "2026-01-01"}})).is_some());
    assert_eq!(
        listed.len(),
        rejections,
        "only the malformed items are listed: {listed:?}"
    );
    assert_eq!(
        rejected_metric(&stack.server).await,
        Some(rejections as u64),
        "hooklane_events_rejected_total counts each rejected item"
    );
    let ids: Vec<_> = stack
        .farm
        .arrivals("orders")
        .iter()
        .filter_map(|a| a.webhook_id.clone())
        .collect();
    assert_eq!(
        ids,
        ["ord_after.placed"],
        "only the good event was delivered"
    );
    // Looking the unknown account up is within the fanout's grants.
    crate::iam::assert_allowed(&stack.server);
    println!(
        "outbox malformed: {rejections} kinds rejected, listed and counted; the good event behind \
         them delivered ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}
