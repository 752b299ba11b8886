//! `hooklane serve --backend aws`: the five Lambda functions' work in one local process,
//! against the AWS APIs the SDK reaches (`AWS_ENDPOINT_URL`: moto_server or LocalStack; or
//! real AWS). In place of the Lambda triggers it
//! - serves the API router (the `api` function) on a local address;
//! - polls the events table's DynamoDB stream and fans out outbox events (`fanout`);
//! - long-polls the queue and attempts each message (`sender`), deleting the handled ones
//!   and leaving failed ones to come back after the visibility timeout;
//! - fires due one-time schedules of the retry group (an emulator stores schedules but
//!   never fires them): their input goes to the queue with its group id, then the schedule
//!   is deleted;
//! - runs the sweeper and the health check on intervals.
//!
//! `HOOKLANE_LOCAL_TIME_SCALE` (default 1) runs retry timings that many times faster: the
//! retry schedule's delays and SQS's 900 s delay ceiling are both divided by it, so a retry
//! that waits 30 minutes still goes through the Scheduler, but fires within seconds. It is
//! for tests and demos only; the Lambda functions ignore it.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};

use aws_sdk_dynamodbstreams::types::{AttributeValue, OperationType, ShardIteratorType};
use base64::{engine::general_purpose::STANDARD, Engine};
use futures_util::future::join_all;
use serde_json::{Map, Value};
use tokio::{sync::watch, task::JoinHandle};

use super::{
    error_text,
    handlers::{self, MessageOutcome},
    load_sdk_config,
    record::{as_function, RUNNER},
    shape::{admin_token, connect, AwsSettings, AwsShape, SettingsError},
};
use crate::{
    clock::Timestamp,
    config::parse_duration,
    domain::RetrySchedule,
    queue::sqs::{schedule_due_hint, SchedulerTarget, SqsQueue, MAX_SQS_DELAY_SECONDS},
};

/// How the local runner runs, beyond the functions' own settings.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub listen: SocketAddr,
    pub sweep_interval: Duration,
    pub health_interval: Duration,
    /// Concurrent queue consumers (each handles up to 10 messages at once).
    pub sender_loops: usize,
    /// See the module documentation; 1 is real time.
    pub time_scale: f64,
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            sweep_interval: Duration::from_secs(60),
            health_interval: Duration::from_secs(60),
            sender_loops: 2,
            time_scale: 1.0,
        }
    }
}

fn invalid(variable: &'static str, message: impl Into<String>) -> SettingsError {
    SettingsError {
        variable,
        message: message.into(),
    }
}

impl LocalOptions {
    /// `HOOKLANE_LISTEN`, `HOOKLANE_SWEEP_INTERVAL`, `HOOKLANE_HEALTH_INTERVAL`,
    /// `HOOKLANE_WORKERS` (queue consumers) and `HOOKLANE_LOCAL_TIME_SCALE`.
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Self, SettingsError> {
        let get = |name: &str| vars.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
        let mut options = Self::default();
        if let Some(raw) = get("HOOKLANE_LISTEN") {
            options.listen = raw.parse().map_err(|e| {
                invalid(
                    "HOOKLANE_LISTEN",
                    format!("not an address like 127.0.0.1:8080: {e}"),
                )
            })?;
        }
        let duration = |name: &'static str, default: Duration| match get(name) {
            Some(raw) => parse_duration(raw, name)
                .map_err(|e| invalid(name, e.message))
                .and_then(|d| {
                    if d.is_zero() {
                        Err(invalid(name, "must be above 0"))
                    } else {
                        Ok(d)
                    }
                }),
            None => Ok(default),
        };
        options.sweep_interval = duration("HOOKLANE_SWEEP_INTERVAL", options.sweep_interval)?;
        options.health_interval = duration("HOOKLANE_HEALTH_INTERVAL", options.health_interval)?;
        if let Some(raw) = get("HOOKLANE_WORKERS") {
            options.sender_loops = raw
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| invalid("HOOKLANE_WORKERS", "a whole number from 1 to 64"))?;
        }
        if let Some(raw) = get("HOOKLANE_LOCAL_TIME_SCALE") {
            options.time_scale = raw
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && (1.0..=1_000_000.0).contains(s))
                .ok_or_else(|| {
                    invalid(
                        "HOOKLANE_LOCAL_TIME_SCALE",
                        "a number from 1 (real time) to 1000000",
                    )
                })?;
        }
        Ok(options)
    }
}

/// Creates the stack `prefix` as the template defines it on the AWS endpoint in use
/// (reusing what exists) and returns the variables that locate it, as the SAM template sets
/// them for the functions.
pub async fn provisioned_vars(
    prefix: &str,
) -> Result<Vec<(String, String)>, super::shape::ProvisionError> {
    let stack = super::stack::deploy(&load_sdk_config().await, prefix, &[]).await?;
    super::shape::stack_vars(&stack)
}

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Connect(#[from] super::shape::ConnectError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    AdminToken(#[from] super::shape::AdminTokenError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Serve(std::io::Error),
}

/// Where the API's admin token came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `HOOKLANE_ADMIN_TOKEN`.
    Variable,
    /// The SSM parameter named by `HOOKLANE_ADMIN_TOKEN_PARAMETER`.
    Parameter(String),
    /// Generated on first use and kept in this (control) table.
    ControlTable(String),
}

/// The runner, started: the API is bound and the background loops are running.
pub struct Local {
    listener: tokio::net::TcpListener,
    router: axum::Router,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    pub local_addr: SocketAddr,
    pub admin_token: String,
    pub token_source: TokenSource,
}

/// Divides the retry schedule's delays by `scale`.
fn scaled_schedule(schedule: &RetrySchedule, scale: f64) -> RetrySchedule {
    let delays = schedule
        .delays()
        .iter()
        .map(|d| d.div_f64(scale).max(Duration::from_millis(1)))
        .collect();
    // Shorter delays of a valid schedule are valid.
    RetrySchedule::new(delays).unwrap_or_else(|_| schedule.clone())
}

pub async fn start(mut settings: AwsSettings, options: LocalOptions) -> Result<Local, LocalError> {
    let scale = options.time_scale;
    if scale > 1.0 {
        settings.core.retry.schedule = scaled_schedule(&settings.core.retry.schedule, scale);
    }
    let sdk = load_sdk_config().await;
    let mut shape = connect(&settings).await?;
    let scheduler = super::clients::scheduler(&sdk, None);
    let sqs = super::clients::sqs(&sdk, None);
    if scale > 1.0 {
        let target = settings
            .scheduler
            .as_ref()
            .map(|(group, role)| SchedulerTarget {
                client: scheduler.clone(),
                group: group.clone(),
                role_arn: role.clone(),
                dead_letter_arn: settings.schedule_dead_letter_arn.clone(),
            });
        let ceiling = Duration::from_secs_f64(MAX_SQS_DELAY_SECONDS as f64 / scale);
        let queue = SqsQueue::new(
            sqs.clone(),
            &settings.queue_url,
            &settings.queue_arn,
            target,
            shape.app.clock.clone(),
        )
        .with_max_delay(ceiling);
        shape.app.queue = Arc::new(queue);
    }

    let token = as_function(API, admin_token(&shape, &settings)).await?;
    let token_source = if let Some(parameter) = &settings.admin_token_parameter {
        TokenSource::Parameter(parameter.clone())
    } else if settings.admin_token.is_some() {
        TokenSource::Variable
    } else {
        TokenSource::ControlTable(settings.tables.control.clone())
    };
    let router = as_function(API, handlers::api_router_with_token(&shape, token.clone()))
        .await?
        // Each request is the api function's work (axum runs it on a task of its own).
        .layer(axum::middleware::from_fn(
            |request: axum::extract::Request, next: axum::middleware::Next| {
                as_function(API, next.run(request))
            },
        ));
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|source| LocalError::Listen {
            addr: options.listen,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| LocalError::Listen {
        addr: options.listen,
        source,
    })?;

    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let stream = StreamPoller {
        shape: shape.clone(),
        dynamodb: super::clients::dynamodb(&sdk, None),
        streams: super::clients::dynamodbstreams(&sdk, None),
        table: settings.tables.events.clone(),
        checkpoints: settings.tables.control.clone(),
    };
    tasks.push(tokio::spawn(as_function(
        FANOUT,
        stream.run(stopped.clone()),
    )));
    for _ in 0..options.sender_loops {
        let consumer = QueueConsumer {
            shape: shape.clone(),
            sqs: sqs.clone(),
            queue_url: settings.queue_url.clone(),
        };
        tasks.push(tokio::spawn(as_function(
            SENDER,
            consumer.run(stopped.clone()),
        )));
    }
    if let Some((group, _)) = &settings.scheduler {
        let firer = ScheduleFirer {
            scheduler: scheduler.clone(),
            sqs: sqs.clone(),
            group: group.clone(),
            queue_url: settings.queue_url.clone(),
            queue_arn: settings.queue_arn.clone(),
        };
        tasks.push(tokio::spawn(as_function(
            RUNNER,
            firer.run(stopped.clone()),
        )));
    }
    let grace = settings.sweep_grace;
    let sweeper = shape.clone();
    tasks.push(tokio::spawn(every(
        options.sweep_interval,
        stopped.clone(),
        move || {
            let shape = sweeper.clone();
            async move {
                // EventBridge Scheduler invokes the function with the schedule's role.
                super::record::note(
                    "schedule:SweeperFunction",
                    "lambda:InvokeFunction",
                    "${SweeperFunction.Arn}",
                );
                if let Err(error) = as_function(SWEEPER, handlers::sweep(&shape, grace)).await {
                    tracing::warn!(%error, "sweep failed; next interval tries again");
                }
            }
        },
    )));
    let checker = shape.clone();
    tasks.push(tokio::spawn(every(
        options.health_interval,
        stopped,
        move || {
            let shape = checker.clone();
            async move {
                super::record::note(
                    "schedule:HealthFunction",
                    "lambda:InvokeFunction",
                    "${HealthFunction.Arn}",
                );
                if let Err(error) = as_function(HEALTH, handlers::check_health(&shape)).await {
                    tracing::warn!(%error, "health check failed; next interval tries again");
                }
            }
        },
    )));
    Ok(Local {
        listener,
        router,
        stop,
        tasks,
        local_addr,
        admin_token: token,
        token_source,
    })
}

impl Local {
    /// Serves the API until `shutdown` completes, then stops the loops (letting the
    /// attempts in flight finish).
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), LocalError> {
        let served = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await;
        tracing::info!("shutting down: finishing the work in hand");
        let _ = self.stop.send(true);
        let joined = tokio::time::timeout(Duration::from_secs(30), join_all(self.tasks)).await;
        if joined.is_err() {
            tracing::warn!("background work did not finish within 30 s; leaving it");
        }
        served.map_err(LocalError::Serve)
    }
}

/// Sleeps `duration`; false when told to stop first.
async fn pause(duration: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return false;
    }
    tokio::select! {
        _ = tokio::time::sleep(duration) => true,
        _ = stop.changed() => false,
    }
}

/// Runs `work` now and then every `interval`, until told to stop.
async fn every<F, Fut>(interval: Duration, mut stop: watch::Receiver<bool>, work: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        work().await;
        if !pause(interval, &mut stop).await {
            return;
        }
    }
}

// Whose work is whose, by the template's names: the function, or the role AWS acts with.
const API: &str = "ApiFunction";
const FANOUT: &str = "FanoutFunction";
const SENDER: &str = "SenderFunction";
const SWEEPER: &str = "SweeperFunction";
const HEALTH: &str = "HealthFunction";
const SCHEDULER_ROLE: &str = "SchedulerSendRole";

const IDLE_POLL: Duration = Duration::from_millis(250);
const ERROR_BACKOFF: Duration = Duration::from_secs(1);
const SHARD_REFRESH: Duration = Duration::from_secs(10);

/// The fan-out function's trigger: reads the events table's stream shard by shard. Like
/// Lambda's event source mapping, it keeps where it got to in each shard (in the control
/// table, `stream#{shard}`), so a restarted runner goes on from there instead of fanning
/// out the whole stream again.
struct StreamPoller {
    shape: AwsShape,
    dynamodb: aws_sdk_dynamodb::Client,
    streams: aws_sdk_dynamodbstreams::Client,
    table: String,
    /// The control table, where the checkpoints are kept.
    checkpoints: String,
}

/// Where to (re)start reading a shard.
#[derive(Debug, Clone)]
enum ShardStart {
    Beginning,
    After(String),
    At(String),
}

struct ShardCursor {
    iterator: Option<String>,
    start: ShardStart,
}

impl StreamPoller {
    async fn stream_arn(&self) -> Result<String, String> {
        let described = as_function(
            RUNNER,
            self.dynamodb
                .describe_table()
                .table_name(&self.table)
                .send(),
        )
        .await
        .map_err(|e| error_text(&e))?;
        described
            .table()
            .and_then(|t| t.latest_stream_arn())
            .map(str::to_owned)
            .ok_or_else(|| format!("table {} has no stream", self.table))
    }

    /// Adds the shards not seen yet; a child shard waits until its parent is read to the end.
    async fn discover(
        &self,
        arn: &str,
        cursors: &mut HashMap<String, ShardCursor>,
        finished: &HashSet<String>,
    ) -> Result<(), String> {
        let mut after: Option<String> = None;
        loop {
            let described = self
                .streams
                .describe_stream()
                .stream_arn(arn)
                .set_exclusive_start_shard_id(after.clone())
                .send()
                .await
                .map_err(|e| error_text(&e))?;
            let Some(description) = described.stream_description() else {
                return Ok(());
            };
            for shard in description.shards() {
                let Some(id) = shard.shard_id() else { continue };
                if cursors.contains_key(id) || finished.contains(id) {
                    continue;
                }
                let parent_unread = shard
                    .parent_shard_id()
                    .is_some_and(|parent| cursors.contains_key(parent));
                if !parent_unread {
                    let start = match self.checkpoint(id).await {
                        Some(sequence) => ShardStart::After(sequence),
                        None => ShardStart::Beginning,
                    };
                    cursors.insert(
                        id.to_owned(),
                        ShardCursor {
                            iterator: None,
                            start,
                        },
                    );
                }
            }
            match description.last_evaluated_shard_id() {
                Some(last) => after = Some(last.to_owned()),
                None => return Ok(()),
            }
        }
    }

    /// The last sequence number of `shard` a previous run fanned out, if any.
    async fn checkpoint(&self, shard: &str) -> Option<String> {
        let read = as_function(
            RUNNER,
            self.dynamodb
                .get_item()
                .table_name(&self.checkpoints)
                .key(
                    "pk",
                    aws_sdk_dynamodb::types::AttributeValue::S(format!("stream#{shard}")),
                )
                .consistent_read(true)
                .send(),
        )
        .await;
        match read {
            Ok(out) => match out.item.as_ref().and_then(|item| item.get("after")) {
                Some(aws_sdk_dynamodb::types::AttributeValue::S(sequence)) => {
                    Some(sequence.clone())
                }
                _ => None,
            },
            Err(e) => {
                // Reading from the start again is harmless (fan-out is idempotent), only slower.
                tracing::warn!(shard, error = %error_text(&e), "cannot read the stream checkpoint; reading the shard from its start");
                None
            }
        }
    }

    async fn save_checkpoint(&self, shard: &str, sequence: &str) {
        let written = as_function(
            RUNNER,
            self.dynamodb
                .put_item()
                .table_name(&self.checkpoints)
                .item(
                    "pk",
                    aws_sdk_dynamodb::types::AttributeValue::S(format!("stream#{shard}")),
                )
                .item(
                    "after",
                    aws_sdk_dynamodb::types::AttributeValue::S(sequence.to_owned()),
                )
                .send(),
        )
        .await;
        if let Err(e) = written {
            tracing::warn!(shard, error = %error_text(&e), "cannot save the stream checkpoint; a restart reads these records again");
        }
    }

    async fn iterator(&self, arn: &str, shard: &str, start: &ShardStart) -> Result<String, String> {
        let request = self
            .streams
            .get_shard_iterator()
            .stream_arn(arn)
            .shard_id(shard);
        let request = match start {
            ShardStart::Beginning => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            ShardStart::After(sequence) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(sequence),
            ShardStart::At(sequence) => request
                .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                .sequence_number(sequence),
        };
        request
            .send()
            .await
            .map_err(|e| error_text(&e))?
            .shard_iterator
            .ok_or_else(|| format!("no iterator for shard {shard}"))
    }

    /// Reads one batch of a shard and fans out its records in order. Returns how many
    /// records it took, and whether the shard has ended. After an error the cursor is left
    /// where the next read must start (the failed record, as Lambda retries it).
    async fn read(
        &self,
        arn: &str,
        shard: &str,
        cursor: &mut ShardCursor,
    ) -> Result<(usize, bool), String> {
        let iterator = match cursor.iterator.take() {
            Some(iterator) => iterator,
            None => self.iterator(arn, shard, &cursor.start).await?,
        };
        let batch = match self
            .streams
            .get_records()
            .shard_iterator(iterator)
            .limit(100)
            .send()
            .await
        {
            Ok(batch) => batch,
            // An iterator lives 15 minutes; the next read asks for a new one.
            Err(e) => return Err(error_text(&e)),
        };
        let mut images = Vec::new();
        let mut sequences = Vec::new();
        let mut last = None;
        for record in batch.records() {
            let Some(change) = record.dynamodb() else {
                continue;
            };
            let sequence = change.sequence_number().unwrap_or_default().to_owned();
            if record.event_name() == Some(&OperationType::Insert) {
                images.push(change.new_image().map(image_json).unwrap_or(Value::Null));
                sequences.push(sequence.clone());
            }
            last = Some(sequence);
        }
        if let Err((position, error)) = handlers::fan_out_images(&self.shape, &images).await {
            let sequence = sequences.get(position).cloned().unwrap_or_default();
            let failed = format!("fan-out of record {sequence} failed: {error}");
            cursor.start = ShardStart::At(sequence);
            return Err(failed);
        }
        let taken = batch.records().len();
        if let Some(sequence) = last {
            self.save_checkpoint(shard, &sequence).await;
            cursor.start = ShardStart::After(sequence);
        }
        match batch.next_shard_iterator {
            Some(next) => {
                cursor.iterator = Some(next);
                Ok((taken, false))
            }
            None => Ok((taken, true)),
        }
    }

    async fn run(self, mut stop: watch::Receiver<bool>) {
        let arn = loop {
            match self.stream_arn().await {
                Ok(arn) => break arn,
                Err(error) => {
                    tracing::warn!(%error, "cannot find the events stream; retrying");
                    if !pause(ERROR_BACKOFF, &mut stop).await {
                        return;
                    }
                }
            }
        };
        let mut cursors: HashMap<String, ShardCursor> = HashMap::new();
        let mut finished: HashSet<String> = HashSet::new();
        let mut refreshed: Option<tokio::time::Instant> = None;
        loop {
            if refreshed.is_none_or(|at| at.elapsed() >= SHARD_REFRESH) {
                match self.discover(&arn, &mut cursors, &finished).await {
                    Ok(()) => refreshed = Some(tokio::time::Instant::now()),
                    Err(error) => tracing::warn!(%error, "cannot list the stream's shards"),
                }
            }
            let mut busy = false;
            let mut failed = false;
            let shards: Vec<String> = cursors.keys().cloned().collect();
            for shard in shards {
                let Some(cursor) = cursors.get_mut(&shard) else {
                    continue;
                };
                match self.read(&arn, &shard, cursor).await {
                    Ok((taken, ended)) => {
                        busy |= taken > 0;
                        if ended {
                            cursors.remove(&shard);
                            finished.insert(shard);
                            refreshed = None;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(shard = %shard, %error, "stream not read to the end; retrying from where it stopped");
                        failed = true;
                    }
                }
            }
            let wait = if failed {
                ERROR_BACKOFF
            } else if busy {
                Duration::ZERO
            } else {
                IDLE_POLL
            };
            if !pause(wait, &mut stop).await {
                return;
            }
        }
    }
}

/// A stream image in the DynamoDB JSON the Lambda event carries (`{"S": ...}` and so on).
pub fn image_json(image: &HashMap<String, AttributeValue>) -> Value {
    Value::Object(
        image
            .iter()
            .map(|(name, value)| (name.clone(), attribute_json(value)))
            .collect::<Map<_, _>>(),
    )
}

fn attribute_json(value: &AttributeValue) -> Value {
    let typed = |kind: &str, inner: Value| {
        let mut object = Map::new();
        object.insert(kind.to_owned(), inner);
        Value::Object(object)
    };
    let strings =
        |items: &[String]| Value::Array(items.iter().cloned().map(Value::String).collect());
    match value {
        AttributeValue::S(s) => typed("S", Value::String(s.clone())),
        AttributeValue::N(n) => typed("N", Value::String(n.clone())),
        AttributeValue::Bool(b) => typed("BOOL", Value::Bool(*b)),
        AttributeValue::Null(n) => typed("NULL", Value::Bool(*n)),
        AttributeValue::B(blob) => typed("B", Value::String(STANDARD.encode(blob.as_ref()))),
        AttributeValue::Ss(items) => typed("SS", strings(items)),
        AttributeValue::Ns(items) => typed("NS", strings(items)),
        AttributeValue::Bs(items) => typed(
            "BS",
            Value::Array(
                items
                    .iter()
                    .map(|b| Value::String(STANDARD.encode(b.as_ref())))
                    .collect(),
            ),
        ),
        AttributeValue::L(items) => typed(
            "L",
            Value::Array(items.iter().map(attribute_json).collect()),
        ),
        AttributeValue::M(map) => typed("M", image_json(map)),
        // A type newer than this SDK: nothing here reads it.
        _ => Value::Null,
    }
}

const RECEIVE_WAIT_SECONDS: i32 = 2;

/// The sender function's trigger: long-polls the queue.
struct QueueConsumer {
    shape: AwsShape,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
}

impl QueueConsumer {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            let received = tokio::select! {
                received = self
                    .sqs
                    .receive_message()
                    .queue_url(&self.queue_url)
                    .max_number_of_messages(10)
                    .wait_time_seconds(RECEIVE_WAIT_SECONDS)
                    .send() => received,
                _ = stop.changed() => return,
            };
            let messages = match received {
                Ok(out) => out.messages.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(error = %error_text(&e), "cannot receive from the queue");
                    if !pause(ERROR_BACKOFF, &mut stop).await {
                        return;
                    }
                    continue;
                }
            };
            let batch: Vec<(&str, Option<&str>)> = messages
                .iter()
                .map(|m| (m.message_id().unwrap_or_default(), m.body()))
                .collect();
            let outcomes = handlers::handle_queue_batch(&self.shape, &batch).await;
            let handled: Vec<&str> = messages
                .iter()
                .zip(outcomes)
                .filter(|(_, outcome)| *outcome == MessageOutcome::Done)
                .filter_map(|(message, _)| message.receipt_handle())
                .collect();
            self.delete(&handled).await;
            if *stop.borrow() {
                return;
            }
        }
    }

    async fn delete(&self, receipts: &[&str]) {
        if receipts.is_empty() {
            return;
        }
        let mut request = self.sqs.delete_message_batch().queue_url(&self.queue_url);
        for (index, receipt) in receipts.iter().enumerate() {
            match aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                .id(index.to_string())
                .receipt_handle(*receipt)
                .build()
            {
                Ok(entry) => request = request.entries(entry),
                Err(error) => tracing::warn!(%error, "cannot build a delete entry"),
            }
        }
        match request.send().await {
            // An undeleted message comes back and finds its delivery already handled.
            Ok(out) if !out.failed().is_empty() => {
                tracing::warn!(
                    failed = out.failed().len(),
                    "some handled messages were not deleted"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %error_text(&e), "cannot delete handled messages"),
        }
    }
}

const SCHEDULE_POLL: Duration = Duration::from_millis(500);

/// What EventBridge Scheduler does for the retry group: at a schedule's `at(...)` time,
/// sends its input to the queue, then deletes it (`ActionAfterCompletion: DELETE`).
struct ScheduleFirer {
    scheduler: aws_sdk_scheduler::Client,
    sqs: aws_sdk_sqs::Client,
    group: String,
    queue_url: String,
    queue_arn: String,
}

/// The time of an `at(yyyy-mm-ddThh:mm:ss)` expression in UTC.
pub fn parse_at_expression(expression: &str) -> Option<Timestamp> {
    let inner = expression.trim().strip_prefix("at(")?.strip_suffix(')')?;
    let naive = chrono::NaiveDateTime::parse_from_str(inner, "%Y-%m-%dT%H:%M:%S").ok()?;
    Some(naive.and_utc())
}

impl ScheduleFirer {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            match self.fire_due(chrono::Utc::now()).await {
                Ok(0) => {}
                Ok(fired) => tracing::info!(fired, group = %self.group, "fired due schedules"),
                Err(error) => tracing::warn!(%error, "cannot fire schedules"),
            }
            if !pause(SCHEDULE_POLL, &mut stop).await {
                return;
            }
        }
    }

    /// Fires the schedules of the group that are due at `now`. Returns how many.
    async fn fire_due(&self, now: Timestamp) -> Result<usize, String> {
        let mut names = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let page = self
                .scheduler
                .list_schedules()
                .group_name(&self.group)
                .set_next_token(next.clone())
                .send()
                .await
                .map_err(|e| error_text(&e))?;
            names.extend(
                page.schedules()
                    .iter()
                    .filter_map(|s| s.name())
                    // Hooklane names its schedules after their time: skip the future ones
                    // without reading them.
                    .filter(|name| schedule_due_hint(name).is_none_or(|due| due <= now))
                    .map(str::to_owned),
            );
            match page.next_token {
                Some(token) if !token.is_empty() => next = Some(token),
                _ => break,
            }
        }
        let mut fired = 0;
        for name in names {
            if self.fire_if_due(&name, now).await? {
                fired += 1;
            }
        }
        Ok(fired)
    }

    async fn fire_if_due(&self, name: &str, now: Timestamp) -> Result<bool, String> {
        let schedule = match self
            .scheduler
            .get_schedule()
            .group_name(&self.group)
            .name(name)
            .send()
            .await
        {
            Ok(schedule) => schedule,
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                return Ok(false)
            }
            Err(e) => return Err(error_text(&e)),
        };
        let timezone = schedule.schedule_expression_timezone().unwrap_or("UTC");
        let Some(at) = schedule
            .schedule_expression()
            .filter(|_| timezone == "UTC")
            .and_then(parse_at_expression)
        else {
            tracing::debug!(schedule = %name, "not a one-time UTC schedule; left alone");
            return Ok(false);
        };
        if at > now {
            return Ok(false);
        }
        let Some(target) = schedule.target().filter(|t| t.arn() == self.queue_arn) else {
            tracing::debug!(schedule = %name, "targets another resource; left alone");
            return Ok(false);
        };
        let Some(input) = target.input() else {
            tracing::warn!(schedule = %name, "schedule without input; left alone");
            return Ok(false);
        };
        let group_id = target
            .sqs_parameters()
            .and_then(|p| p.message_group_id())
            .map(str::to_owned);
        // Sent by EventBridge Scheduler with the schedule's role.
        let sent = self
            .sqs
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(input)
            .set_message_group_id(group_id)
            .send();
        as_function(SCHEDULER_ROLE, sent)
            .await
            .map_err(|e| error_text(&e))?;
        // Sent first, deleted after: a failure in between sends the message twice, which
        // the sender shrugs off (the delivery is no longer pending, or not yet due).
        match self
            .scheduler
            .delete_schedule()
            .group_name(&self.group)
            .name(name)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                Ok(true)
            }
            Err(e) => Err(error_text(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_millis;

    #[test]
    fn options_from_variables() {
        let vars: HashMap<String, String> = [
            ("HOOKLANE_LISTEN", "127.0.0.1:0"),
            ("HOOKLANE_SWEEP_INTERVAL", "500ms"),
            ("HOOKLANE_LOCAL_TIME_SCALE", "600"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let options = LocalOptions::from_vars(&vars).unwrap();
        assert_eq!(options.listen.port(), 0);
        assert_eq!(options.sweep_interval, Duration::from_millis(500));
        assert_eq!(options.health_interval, Duration::from_secs(60));
        assert_eq!(options.time_scale, 600.0);
        for (name, bad) in [
            ("HOOKLANE_LOCAL_TIME_SCALE", "0.5"),
            ("HOOKLANE_LOCAL_TIME_SCALE", "fast"),
            ("HOOKLANE_HEALTH_INTERVAL", "0s"),
            ("HOOKLANE_WORKERS", "0"),
        ] {
            let mut broken = vars.clone();
            broken.insert(name.to_owned(), bad.to_owned());
            let err = LocalOptions::from_vars(&broken).unwrap_err();
            assert_eq!(err.variable, name, "{bad}");
        }
    }

    #[test]
    fn a_scaled_schedule_keeps_its_shape() {
        let schedule = RetrySchedule::parse("30,1800").unwrap();
        assert_eq!(
            scaled_schedule(&schedule, 600.0).delays(),
            &[Duration::from_millis(50), Duration::from_secs(3)]
        );
    }

    #[test]
    fn at_expressions_are_read_back() {
        let due = from_millis(1_700_000_000_001);
        let expression = crate::queue::sqs::at_expression(due);
        assert_eq!(
            parse_at_expression(&expression),
            Some(from_millis(1_700_000_001_000))
        );
        assert_eq!(parse_at_expression("rate(5 minutes)"), None);
        assert_eq!(parse_at_expression("at(yesterday)"), None);
    }

    #[test]
    fn stream_images_become_dynamodb_json() {
        let image: HashMap<String, AttributeValue> = [
            ("id".to_owned(), AttributeValue::S("evt_1".into())),
            ("created_at".to_owned(), AttributeValue::N("17".into())),
            ("fanned_out".to_owned(), AttributeValue::Bool(false)),
            (
                "tags".to_owned(),
                AttributeValue::L(vec![AttributeValue::M(
                    [("k".to_owned(), AttributeValue::Null(true))].into(),
                )]),
            ),
        ]
        .into();
        assert_eq!(
            image_json(&image),
            serde_json::json!({
                "id": {"S": "evt_1"},
                "created_at": {"N": "17"},
                "fanned_out": {"BOOL": false},
                "tags": {"L": [{"M": {"k": {"NULL": true}}}]}
            })
        );
    }
}
