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

mod provision;
mod queue_consumer;
mod schedule_firer;
mod stream_poller;
#[cfg(test)]
mod tests;

pub use provision::{provision, provision_stack, stack_vars, ProvisionError};
use queue_consumer::*;
pub use schedule_firer::parse_at_expression;
use schedule_firer::*;
pub use stream_poller::image_json;
use stream_poller::*;

use super::{
    admin_token::admin_token,
    error_text,
    handlers::{self, MessageOutcome},
    load_sdk_config,
    record::{as_function, RUNNER},
    settings::{AwsSettings, SettingsError},
    shape::{connect, AwsShape},
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
        variable: variable.into(),
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
) -> Result<Vec<(String, String)>, super::local::ProvisionError> {
    let stack = super::stack::deploy(&load_sdk_config().await, prefix, &[]).await?;
    super::local::stack_vars(&stack)
}

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Connect(#[from] super::shape::ConnectError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    AdminToken(#[from] super::admin_token::AdminTokenError),
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
    /// Checks credentials, as the API does (for routes served beside it).
    pub access: Arc<crate::service::access::Access>,
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
    // The api function's start: it reads the key of endpoint secrets (as the sender does).
    let mut shape = as_function(API, connect(&settings)).await?;
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
    let state = as_function(API, handlers::api_state_with_token(&shape, &token)).await?;
    let access = Arc::clone(&state.access);
    let router = crate::api::router(state)
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
    let (grace, every) = (settings.sweep_grace, options.sweep_interval);
    tasks.push(scheduled(
        SWEEPER,
        options.sweep_interval,
        stopped.clone(),
        shape.clone(),
        move |shape| async move { handlers::sweep(&shape, grace, every).await },
    ));
    tasks.push(scheduled(
        HEALTH,
        options.health_interval,
        stopped,
        shape.clone(),
        |shape| async move { handlers::check_health(&shape).await },
    ));
    Ok(Local {
        listener,
        router,
        stop,
        tasks,
        local_addr,
        admin_token: token,
        token_source,
        access,
    })
}

impl Local {
    /// Serves these routes beside the API's (the binary's `/metrics`).
    pub fn with_routes(mut self, routes: axum::Router) -> Self {
        self.router = self.router.merge(routes);
        self
    }

    /// Serves the API until `shutdown` completes, then stops the loops (letting the
    /// attempts in flight finish).
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), LocalError> {
        // With the peer's address, which the audit log records of each change.
        let router = self
            .router
            .into_make_service_with_connect_info::<std::net::SocketAddr>();
        let served = axum::serve(self.listener, router)
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
/// Runs `handler` every `interval` as the template's schedule invokes the function
/// `function` (recorded as the schedule's role invoking it, for the permission check).
fn scheduled<F, Fut, T, E>(
    function: &'static str,
    interval: Duration,
    stop: watch::Receiver<bool>,
    shape: AwsShape,
    handler: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(AwsShape) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<T, E>> + Send + 'static,
    E: std::fmt::Display,
{
    tokio::spawn(every(interval, stop, move || {
        let work = handler(shape.clone());
        async move {
            super::record::note(
                &format!("schedule:{function}"),
                "lambda:InvokeFunction",
                &format!("${{{function}.Arn}}"),
            );
            if let Err(error) = as_function(function, work).await {
                tracing::warn!(%error, function, "scheduled run failed; the next interval tries again");
            }
        }
    }))
}

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
