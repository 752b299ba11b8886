//! The five Lambda bootstraps the workspace builds, run the way Lambda runs them: each behind a
//! local Lambda Runtime API, with exactly the environment variables the template gives its
//! function (resolved for a stack on the emulator) beside the ones the Lambda service sets,
//! and handed the events Lambda would hand it: API Gateway HTTP API requests, the events
//! table's stream records, the queue's messages, the schedules' events. A variable the
//! template forgets, or one a bootstrap reads that the template does not give, fails here.
//!
//! One variable is added to the template's: `HOOKLANE_ALLOW_CIDRS` for the api and the sender,
//! since the endpoint is on 127.0.0.1, which the SSRF guard refuses by default.

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    body::Bytes,
    extract::{Path as UrlPath, State},
    http::{HeaderMap, HeaderValue, StatusCode},
    response::IntoResponse,
    routing::{get, post},
    Router,
};
use hooklane::{
    aws::{
        aws_sdk_dynamodbstreams, aws_sdk_sqs, load_sdk_config,
        local::{self, image_json},
        stack::Stack,
    },
    config::CoreConfig,
};
use hooklane_testkit::farm::Farm;
use hooklane_testkit::testing::require_emulator;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, Mutex};

use crate::{aws_pipeline::unique, support::Scratch};

const PREFIX: &str = "/2018-06-01/runtime";

type Answer = Result<Value, String>;

struct RuntimeState {
    next: Mutex<mpsc::Receiver<(String, Value)>>,
    answers: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
    init_error: Mutex<Option<String>>,
}

/// The Lambda Runtime API for one function: events go in, the bootstrap's answers come out.
struct Runtime {
    addr: SocketAddr,
    events: mpsc::Sender<(String, Value)>,
    state: Arc<RuntimeState>,
}

async fn next(State(state): State<Arc<RuntimeState>>) -> impl IntoResponse {
    let Some((id, event)) = state.next.lock().await.recv().await else {
        return (StatusCode::GONE, HeaderMap::new(), String::new());
    };
    let deadline = chrono::Utc::now().timestamp_millis() + 60_000;
    let mut headers = HeaderMap::new();
    let mut put = |name: &'static str, value: String| {
        headers.insert(name, HeaderValue::from_str(&value).unwrap());
    };
    put("lambda-runtime-aws-request-id", id);
    put("lambda-runtime-deadline-ms", deadline.to_string());
    put(
        "lambda-runtime-invoked-function-arn",
        "arn:aws:lambda:us-east-1:123456789012:function:bootstrap-test".into(),
    );
    put(
        "lambda-runtime-trace-id",
        "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1".into(),
    );
    put("content-type", "application/json".into());
    (StatusCode::OK, headers, event.to_string())
}

async fn answered(state: &RuntimeState, id: &str, answer: Answer) -> StatusCode {
    if let Some(waiting) = state.answers.lock().await.remove(id) {
        let _ = waiting.send(answer);
    }
    StatusCode::ACCEPTED
}

async fn response(
    State(state): State<Arc<RuntimeState>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    let answer = serde_json::from_slice(&body).map_err(|e| format!("not JSON ({e}): {body:?}"));
    answered(&state, &id, answer).await
}

async fn error(
    State(state): State<Arc<RuntimeState>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    answered(
        &state,
        &id,
        Err(String::from_utf8_lossy(&body).into_owned()),
    )
    .await
}

async fn init_error(State(state): State<Arc<RuntimeState>>, body: Bytes) -> StatusCode {
    *state.init_error.lock().await = Some(String::from_utf8_lossy(&body).into_owned());
    StatusCode::ACCEPTED
}

impl Runtime {
    async fn start() -> Self {
        let (events, received) = mpsc::channel(16);
        let state = Arc::new(RuntimeState {
            next: Mutex::new(received),
            answers: Mutex::new(HashMap::new()),
            init_error: Mutex::new(None),
        });
        let router = Router::new()
            .route(&format!("{PREFIX}/invocation/next"), get(next))
            .route(
                &format!("{PREFIX}/invocation/{{id}}/response"),
                post(response),
            )
            .route(&format!("{PREFIX}/invocation/{{id}}/error"), post(error))
            .route(&format!("{PREFIX}/init/error"), post(init_error))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self {
            addr,
            events,
            state,
        }
    }
}

/// A bootstrap running behind its runtime.
struct Bootstrap {
    function: &'static str,
    runtime: Runtime,
    child: tokio::process::Child,
    log: PathBuf,
}

/// Where cargo put the workspace's binaries (scripts/test builds them before the tests).
fn binary(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_hooklane")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is not built: scripts/test builds the Lambda bootstraps (cargo build --workspace \
         --all-features --bins) before the tests",
        path.display()
    );
    path
}

impl Bootstrap {
    async fn start(
        function: &'static str,
        name: &str,
        stack: &Stack,
        scratch: &Scratch,
        extra: &[(&str, &str)],
    ) -> Self {
        let runtime = Runtime::start().await;
        let log = scratch.path().join(format!("{name}.log"));
        let mut command = tokio::process::Command::new(binary(name));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            // What the Lambda service sets.
            .env("AWS_LAMBDA_RUNTIME_API", runtime.addr.to_string())
            .env(
                "AWS_LAMBDA_FUNCTION_NAME",
                format!("{}-{function}", stack.name),
            )
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env(
                "AWS_LAMBDA_LOG_GROUP_NAME",
                format!("/aws/lambda/{}/{function}", stack.name),
            )
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "bootstrap-test")
            .env("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
            .kill_on_drop(true);
        // The region and credentials Lambda gives, and the emulator in place of AWS.
        for (key, value) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
            command.env(key, value);
        }
        for (key, value) in stack
            .function_env(function)
            .expect("the function's environment")
        {
            command.env(key, value);
        }
        for (key, value) in extra {
            command.env(key, value);
        }
        let child = command.spawn().expect("start the bootstrap");
        Self {
            function,
            runtime,
            child,
            log,
        }
    }

    fn output(&self) -> String {
        format!(
            "{}{}",
            std::fs::read_to_string(&self.log).unwrap_or_default(),
            std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default()
        )
    }

    /// Hands the bootstrap one event and returns its answer.
    async fn invoke(&mut self, event: Value) -> Value {
        let id = unique("invocation");
        let (answer, answered) = oneshot::channel();
        self.runtime
            .state
            .answers
            .lock()
            .await
            .insert(id.clone(), answer);
        self.runtime.events.send((id, event)).await.unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(60), answered).await;
        let init = self.runtime.state.init_error.lock().await.clone();
        let exited = self.child.try_wait().ok().flatten();
        match outcome {
            Ok(Ok(Ok(answer))) => answer,
            Ok(Ok(Err(error))) => panic!(
                "{} answered with an error: {error}\n{}",
                self.function,
                self.output()
            ),
            _ => panic!(
                "{} did not answer (init error: {init:?}, exited: {exited:?}):\n{}",
                self.function,
                self.output()
            ),
        }
    }
}

fn fixture(path: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../functions")
        .join(path);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// An API Gateway HTTP API (payload 2.0) request, as the fixture's but for `method path`.
fn http_request(method: &str, path: &str, body: Option<Value>, token: &str) -> Value {
    let mut event = fixture("api/fixtures/http-api-create-account.json");
    event["rawPath"] = json!(path);
    event["requestContext"]["http"]["method"] = json!(method);
    event["requestContext"]["http"]["path"] = json!(path);
    event["pathParameters"]["proxy"] = json!(path.trim_start_matches('/'));
    event["headers"]["authorization"] = json!(format!("Bearer {token}"));
    let headers = event["headers"].as_object_mut().unwrap();
    headers.remove("content-length");
    match body {
        Some(body) => event["body"] = json!(body.to_string()),
        None => {
            event.as_object_mut().unwrap().remove("body");
        }
    }
    event
}

async fn call(
    api: &mut Bootstrap,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: &str,
) -> (u64, Value) {
    let answer = api.invoke(http_request(method, path, body, token)).await;
    let status = answer["statusCode"].as_u64().unwrap_or_default();
    let body = answer["body"]
        .as_str()
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_five_bootstraps_run_on_the_template_environment_behind_a_runtime_api() {
    require_emulator();
    let started = Instant::now();
    let prefix = unique("boot");
    let (_, mut stack) = local::provision_stack(&prefix, CoreConfig::default())
        .await
        .expect("provision");
    let sdk = load_sdk_config().await;
    // What the deployer creates beside the stack, named by the stack's parameters.
    let token = "hl_admin_bootstrap_test_0123456789";
    let setup = crate::iam::deployer_setup(&prefix, token).await;
    stack.parameters.insert(
        "AdminTokenParameterName".into(),
        setup.admin_token_parameter,
    );
    stack
        .parameters
        .insert("NotificationFrom".into(), setup.from);
    // The key of endpoint secrets, which only the api and the sender read from its
    // parameter when they start; the same key as the other end-to-end stacks'.
    stack.parameters.insert(
        "SecretsKeyParameterName".into(),
        setup.secrets_key_parameter,
    );

    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("bootstraps");
    let loopback = [("HOOKLANE_ALLOW_CIDRS", "127.0.0.0/8")];
    let mut api =
        Bootstrap::start("ApiFunction", "hooklane-api", &stack, &scratch, &loopback).await;
    let mut fanout =
        Bootstrap::start("FanoutFunction", "hooklane-fanout", &stack, &scratch, &[]).await;
    let mut sender = Bootstrap::start(
        "SenderFunction",
        "hooklane-sender",
        &stack,
        &scratch,
        &loopback,
    )
    .await;
    let mut sweeper =
        Bootstrap::start("SweeperFunction", "hooklane-sweeper", &stack, &scratch, &[]).await;
    let mut health =
        Bootstrap::start("HealthFunction", "hooklane-health", &stack, &scratch, &[]).await;

    // The api: an account, an endpoint, an event.
    let account = json!({"id": "acme", "name": "Acme", "owner_email": "ops@acme.example"});
    let (status, body) = call(&mut api, "POST", "/v1/accounts", Some(account), token).await;
    assert_eq!(status, 201, "{body}");
    // A portal link names the address API Gateway was called at (the event's Host, https):
    // `PublicUrl` is left empty, as the template's default.
    let (status, link) = call(
        &mut api,
        "POST",
        "/v1/accounts/acme/portal",
        Some(json!({"read_only": true})),
        token,
    )
    .await;
    assert_eq!(status, 201, "{link}");
    let host = fixture("api/fixtures/http-api-create-account.json")["headers"]["host"].clone();
    let page = format!(
        "https://{}/ui#token=hl_acct_",
        host.as_str().unwrap_or_default()
    );
    assert!(
        link["url"]
            .as_str()
            .is_some_and(|url| url.starts_with(&page)),
        "{link} is not under {page}"
    );
    let endpoint = json!({"url": farm.url("hooks")});
    let (status, body) = call(
        &mut api,
        "POST",
        "/v1/accounts/acme/endpoints",
        Some(endpoint),
        token,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let event = json!({"type": "invoice.paid", "data": {"amount": 42}});
    let (status, body) = call(
        &mut api,
        "POST",
        "/v1/accounts/acme/events",
        Some(event),
        token,
    )
    .await;
    assert!(status == 201 || status == 202, "publish: {status} {body}");
    let event_id = body["id"].as_str().unwrap().to_owned();

    // The fan-out: the stream's records of the events table, as Lambda's poller hands them.
    let streams = aws_sdk_dynamodbstreams::Client::new(&sdk);
    let stream_arn = stack.resources["EventsTable"].attributes["StreamArn"].clone();
    let described = streams
        .describe_stream()
        .stream_arn(&stream_arn)
        .send()
        .await
        .unwrap();
    let template = fixture("fanout/fixtures/events-stream.json")["Records"][0].clone();
    let mut records = Vec::new();
    for shard in described
        .stream_description()
        .map(|d| d.shards())
        .unwrap_or_default()
    {
        let iterator = streams
            .get_shard_iterator()
            .stream_arn(&stream_arn)
            .shard_id(shard.shard_id().unwrap())
            .shard_iterator_type(aws_sdk_dynamodbstreams::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap()
            .shard_iterator
            .unwrap();
        let batch = streams
            .get_records()
            .shard_iterator(iterator)
            .send()
            .await
            .unwrap();
        for record in batch.records() {
            let change = record.dynamodb().unwrap();
            let mut lambda = template.clone();
            lambda["eventID"] = json!(record.event_id());
            lambda["eventName"] = json!(record.event_name().map(|n| n.as_str()));
            lambda["eventSourceARN"] = json!(stream_arn);
            lambda["dynamodb"]["Keys"] = image_json(change.keys().unwrap());
            lambda["dynamodb"]["NewImage"] = image_json(change.new_image().unwrap());
            lambda["dynamodb"]["SequenceNumber"] = json!(change.sequence_number());
            records.push(lambda);
        }
    }
    assert_eq!(records.len(), 1, "one stream record, the event's");
    let answer = fanout.invoke(json!({"Records": records})).await;
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");

    // The sender: the queue's message, as Lambda's poller hands it; handled ones deleted.
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = &stack.resources["DeliveryQueue"];
    let received = sqs
        .receive_message()
        .queue_url(&queue.reference)
        .max_number_of_messages(10)
        .wait_time_seconds(5)
        .send()
        .await
        .unwrap();
    let messages = received.messages();
    assert_eq!(messages.len(), 1, "the delivery's message");
    let template = fixture("sender/fixtures/sqs-batch.json")["Records"][0].clone();
    let records: Vec<Value> = messages
        .iter()
        .map(|m| {
            let mut record = template.clone();
            record["messageId"] = json!(m.message_id());
            record["receiptHandle"] = json!(m.receipt_handle());
            record["body"] = json!(m.body());
            record["md5OfBody"] = json!(m.md5_of_body());
            record["eventSourceARN"] = json!(queue.attributes["Arn"]);
            record["attributes"]
                .as_object_mut()
                .unwrap()
                .remove("MessageGroupId");
            record
        })
        .collect();
    let answer = sender.invoke(json!({"Records": records})).await;
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    for message in messages {
        sqs.delete_message()
            .queue_url(&queue.reference)
            .receipt_handle(message.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }
    assert_eq!(
        farm.success_count("hooks"),
        1,
        "the event reached the endpoint"
    );
    let (status, body) = call(
        &mut api,
        "GET",
        &format!("/v1/accounts/acme/events/{event_id}"),
        None,
        token,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["deliveries"][0]["status"], "delivered", "{body}");

    // The sweeper and the health check, as their schedules invoke them.
    let scheduled = fixture("sweeper/fixtures/scheduled-event.json");
    sweeper.invoke(scheduled.clone()).await;
    health
        .invoke(fixture("health/fixtures/scheduled-event.json"))
        .await;
    eprintln!(
        "bootstraps: api, fanout, sender, sweeper and health answered in {:?}",
        started.elapsed()
    );
}
