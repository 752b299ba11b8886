//! `hooklane bench`: workloads against a Hooklane (started here, or given with `--url`) and
//! the built-in endpoint farm on 127.0.0.1, which counts every arrival, so lost and
//! duplicate deliveries are counted, not assumed.

use std::{
    collections::HashMap,
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

use hooklane_testkit::farm::{Behavior, Farm};

mod outage;
mod purge;
mod sched;
pub use outage::OutageSize;

/// The database file a Hooklane started here uses, in its scratch directory.
const DATABASE: &str = "bench.db";

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot start hooklane serve: {0}")]
    Start(String),
    #[error("farm: {0}")]
    Farm(#[from] std::io::Error),
    #[error("API call failed: {0}")]
    Api(String),
    #[error("unknown workload `{0}` (use w1, w2, w3, w4, w5, w6)")]
    Workload(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Throughput,
    Isolation,
    Flaky,
    SteadyLatency,
    Outage,
    Purge,
}

impl Workload {
    pub fn parse(raw: &str) -> Result<Self, BenchError> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "w1" | "throughput" => Ok(Self::Throughput),
            "w2" | "isolation" => Ok(Self::Isolation),
            "w3" | "flaky" => Ok(Self::Flaky),
            "w4" | "latency" => Ok(Self::SteadyLatency),
            "w5" | "outage" => Ok(Self::Outage),
            "w6" | "purge" => Ok(Self::Purge),
            other => Err(BenchError::Workload(other.to_owned())),
        }
    }

    pub fn all() -> Vec<Self> {
        vec![
            Self::Throughput,
            Self::Isolation,
            Self::Flaky,
            Self::SteadyLatency,
            Self::Outage,
            Self::Purge,
        ]
    }
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// An already running Hooklane; its SSRF allow-list must include 127.0.0.1.
    pub url: Option<String>,
    pub token: Option<String>,
    pub workloads: Vec<Workload>,
    /// Scaled-down sizes that finish in seconds (the test suite's smoke run).
    pub quick: bool,
    /// W1: endpoints each event goes to (`hooklane bench` passes 10 unless told), so the
    /// deliveries a publish call writes: the call's cost grows with them.
    pub throughput_endpoints: usize,
    /// W1: events a second, each published when it is due (an open loop); `None` for 32
    /// publishers that each wait for their call (a closed loop, which runs at saturation).
    pub publish_rate: Option<u32>,
    /// W5's size.
    pub outage: OutageSize,
}

/// A Hooklane to benchmark: a child `serve` on a scratch database, or a given URL.
struct Target {
    base: String,
    token: String,
    child: Option<Child>,
    scratch: Option<PathBuf>,
    env: Vec<(String, String)>,
    /// `serve`'s log lines as they were printed, when kept ([`Target::start_logged`]).
    log: Option<ServeLog>,
}

/// `serve`'s log lines, each with when it was read.
type ServeLog = Arc<Mutex<Vec<(Instant, String)>>>;

impl Target {
    async fn start(options: &BenchOptions, env: &[(&str, &str)]) -> Result<Self, BenchError> {
        Self::launch(options, env, false).await
    }

    /// A `serve` started here whose log lines (JSON) are kept, for [`Target::log_lines`].
    async fn start_logged(
        options: &BenchOptions,
        env: &[(&str, &str)],
    ) -> Result<Self, BenchError> {
        if options.url.is_some() {
            return Err(BenchError::Start(
                "this workload reads the log of a serve it starts itself; it cannot use --url"
                    .into(),
            ));
        }
        let mut env = env.to_vec();
        env.push(("HOOKLANE_LOG_FORMAT", "json"));
        Self::launch(options, &env, true).await
    }

    async fn launch(
        options: &BenchOptions,
        env: &[(&str, &str)],
        keep_log: bool,
    ) -> Result<Self, BenchError> {
        if let Some(url) = &options.url {
            let token = options
                .token
                .clone()
                .ok_or_else(|| BenchError::Start("--url needs --token".into()))?;
            return Ok(Self {
                base: url.trim_end_matches('/').to_owned(),
                token,
                child: None,
                scratch: None,
                env: Vec::new(),
                log: None,
            });
        }
        let scratch = std::env::temp_dir().join(format!(
            "hooklane-bench-{}-{}",
            std::process::id(),
            uuid_fragment()
        ));
        std::fs::create_dir_all(&scratch).map_err(|e| BenchError::Start(e.to_string()))?;
        let mut target = Self {
            base: String::new(),
            token: format!("bench-token-{}", uuid_fragment()),
            child: None,
            scratch: Some(scratch),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            log: keep_log.then(Arc::default),
        };
        target.spawn().await?;
        Ok(target)
    }

    /// The log lines `serve` has printed so far, with when each was read.
    fn log_lines(&self) -> Vec<(Instant, String)> {
        self.log
            .as_ref()
            .and_then(|log| log.lock().ok().map(|lines| lines.clone()))
            .unwrap_or_default()
    }

    /// Starts `serve` on the scratch database and waits for its address.
    async fn spawn(&mut self) -> Result<(), BenchError> {
        let scratch = self.scratch.as_ref().ok_or_else(|| {
            BenchError::Start("a Hooklane given with --url cannot be restarted".into())
        })?;
        let exe = std::env::current_exe().map_err(|e| BenchError::Start(e.to_string()))?;
        let mut command = Command::new(exe);
        command
            .arg("serve")
            .env("HOOKLANE_LISTEN", "127.0.0.1:0")
            .env("HOOKLANE_DATABASE", scratch.join(DATABASE))
            .env("HOOKLANE_ADMIN_TOKEN", &self.token)
            .env("HOOKLANE_ALLOW_CIDRS", "127.0.0.0/8")
            // Sizes are the bench's flags, not the default endpoint limit's.
            .env("HOOKLANE_MAX_ENDPOINTS", "100000")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(if self.log.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true);
        for (key, value) in &self.env {
            command.env(key, value);
        }
        let mut child = command
            .spawn()
            .map_err(|e| BenchError::Start(e.to_string()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| BenchError::Start("no stdout".into()))?;
        if let (Some(log), Some(stderr)) = (&self.log, child.stderr.take()) {
            let log = Arc::clone(log);
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(mut log) = log.lock() {
                        log.push((Instant::now(), line));
                    }
                }
            });
        }
        let base = hooklane_testkit::testing::serve_address(stdout)
            .await
            .ok_or_else(|| BenchError::Start("serve did not report its address".into()))?;
        self.base = base;
        self.child = Some(child);
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Kills `serve` with SIGKILL: a crash, with no shutdown work done.
    async fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Starts `serve` again on the same database; returns how long it took until
    /// `/health` answered 200.
    async fn restart(&mut self) -> Result<Duration, BenchError> {
        let started = Instant::now();
        self.spawn().await?;
        let http = reqwest::Client::new();
        let health = format!("{}/health", self.base);
        while started.elapsed() < Duration::from_secs(60) {
            if let Ok(response) = http.get(&health).send().await {
                if response.status().is_success() {
                    return Ok(started.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(BenchError::Start(
            "/health did not answer within 60 s of a restart".into(),
        ))
    }

    /// Bytes of the database file and of its WAL, for a Hooklane started here.
    fn database_bytes(&self) -> Option<(u64, u64)> {
        let dir = self.scratch.as_ref()?;
        let size = |name: &str| {
            std::fs::metadata(dir.join(name))
                .map(|m| m.len())
                .unwrap_or(0)
        };
        Some((size(DATABASE), size(&format!("{DATABASE}-wal"))))
    }

    /// Bytes of the database file once `serve` is stopped (killed) and its WAL copied into
    /// the file: what the rows take on disk, which the live file and WAL only bound.
    async fn checkpointed_database_bytes(&mut self) -> Option<u64> {
        let db = self.scratch.as_ref()?.join(DATABASE);
        self.crash().await;
        tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(&db).ok()?;
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .ok()?;
            drop(conn);
            std::fs::metadata(&db).ok().map(|m| m.len())
        })
        .await
        .ok()
        .flatten()
    }

    async fn stop(mut self) {
        self.crash().await;
        if let Some(dir) = &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The JSON of a successful answer to `path`; an error with the status and text otherwise.
fn json_answer(path: &str, status: reqwest::StatusCode, text: &str) -> Result<Value, BenchError> {
    if !status.is_success() {
        return Err(BenchError::Api(format!("{path}: {status} {text}")));
    }
    serde_json::from_str(text).map_err(|e| BenchError::Api(format!("{path}: {e}")))
}

fn uuid_fragment() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{nanos:08x}")
}

/// CPU time (user + system) of a process, from /proc (Linux clock ticks of 10 ms).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    Some((user + system) / 100.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    fn new(target: &Target) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()
                .unwrap_or_default(),
            base: target.base.clone(),
            token: target.token.clone(),
        }
    }

    /// Sends `request` (to `path`) with the token; the answer's status and text.
    async fn send(
        &self,
        path: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, String), BenchError> {
        let failed = |e: reqwest::Error| BenchError::Api(format!("{path}: {e}"));
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(failed)?;
        let status = response.status();
        let text = response.text().await.map_err(failed)?;
        Ok((status, text))
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, BenchError> {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        let (status, text) = self.send(path, request).await?;
        json_answer(path, status, &text)
    }

    /// A GET and how long it took to answer, in milliseconds.
    async fn get_timed(&self, path: &str) -> Result<(Value, f64), BenchError> {
        let started = Instant::now();
        let request = self.http.get(format!("{}{path}", self.base));
        let (status, text) = self.send(path, request).await?;
        let took = started.elapsed().as_secs_f64() * 1000.0;
        Ok((json_answer(path, status, &text)?, took))
    }

    /// The server's count of deliveries created so far (its `/metrics`).
    async fn deliveries_created(&self) -> Result<u64, BenchError> {
        let path = "/metrics";
        let request = self.http.get(format!("{}{path}", self.base));
        let (status, text) = self.send(path, request).await?;
        if !status.is_success() {
            return Err(BenchError::Api(format!("{path}: {status}: {text}")));
        }
        Ok(text
            .lines()
            .filter_map(|line| line.strip_prefix(hooklane::telemetry::DELIVERIES_CREATED))
            .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }

    /// Waits until the server has created `deliveries` deliveries (publishes answer before
    /// their fan-out has created them); an error once `limit` has passed.
    async fn wait_for_deliveries(
        &self,
        deliveries: u64,
        limit: Duration,
    ) -> Result<(), BenchError> {
        let started = Instant::now();
        loop {
            let created = self.deliveries_created().await?;
            if created >= deliveries {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(BenchError::Api(format!(
                    "{created} of {deliveries} deliveries created after {limit:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn setup(
        &self,
        account: &str,
        farm: &Farm,
        endpoints: &[String],
    ) -> Result<Vec<String>, BenchError> {
        let body = json!({"id": account, "name": account, "owner_email": format!("bench@{account}.example")});
        self.post("/v1/accounts", body).await?;
        let mut ids = Vec::with_capacity(endpoints.len());
        for name in endpoints {
            let created = self
                .post(
                    &format!("/v1/accounts/{account}/endpoints"),
                    json!({"url": farm.url(name)}),
                )
                .await?;
            ids.push(created["id"].as_str().unwrap_or_default().to_owned());
        }
        Ok(ids)
    }

    /// Publishes the bench event `id` (data `{"i": i}`) to the account, its call's start
    /// noted on `clock`.
    async fn publish_bench_event(
        &self,
        clock: &PublishClock,
        account: &str,
        id: String,
        i: usize,
    ) -> Result<f64, BenchError> {
        clock.start(&id);
        let started = Instant::now();
        self.post(
            &format!("/v1/accounts/{account}/events"),
            json!({"id": id, "type": "bench.event", "data": {"i": i}}),
        )
        .await?;
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }
}

/// When each event's publish call started, by event id.
#[derive(Clone, Default)]
struct PublishClock(Arc<Mutex<HashMap<String, Instant>>>);

impl PublishClock {
    fn start(&self, id: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(id.to_owned(), Instant::now());
        }
    }

    fn get(&self, id: &str) -> Option<Instant> {
        self.0.lock().ok().and_then(|map| map.get(id).copied())
    }

    fn first(&self) -> Option<Instant> {
        self.0
            .lock()
            .ok()
            .and_then(|map| map.values().min().copied())
    }
}

async fn publish_many(
    api: &Api,
    account: &str,
    prefix: &str,
    events: usize,
    concurrency: usize,
    clock: &PublishClock,
) -> Result<(Duration, Vec<f64>), BenchError> {
    let started = Instant::now();
    let results: Vec<Result<f64, BenchError>> = futures_util::stream::iter(0..events)
        .map(|i| api.publish_bench_event(clock, account, format!("{prefix}-{i}"), i))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let took = started.elapsed();
    let mut calls = results.into_iter().collect::<Result<Vec<f64>, _>>()?;
    calls.sort_by(f64::total_cmp);
    Ok((took, calls))
}

/// Publishes `events` bench events to `account`, `rate` a second, each when it is due
/// whatever the calls before it are doing: an open loop, as a platform's traffic arrives.
/// A call's time counts from when it was due, so the bench's own lag in starting it counts
/// against the call rather than hiding it. Returns the time until the last call answered
/// and each call's time in milliseconds, sorted.
async fn publish_at_rate(
    api: &Arc<Api>,
    account: &str,
    events: usize,
    rate: u32,
    clock: &PublishClock,
) -> Result<(Duration, Vec<f64>), BenchError> {
    let started = tokio::time::Instant::now();
    let every = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let mut calls = Vec::with_capacity(events);
    for i in 0..events {
        let due = started + every.mul_f64(i as f64);
        tokio::time::sleep_until(due).await;
        let (api, clock, account) = (Arc::clone(api), clock.clone(), account.to_owned());
        calls.push(tokio::spawn(async move {
            api.publish_bench_event(&clock, &account, format!("{account}-{i}"), i)
                .await?;
            Ok::<_, BenchError>(due.elapsed().as_secs_f64() * 1000.0)
        }));
    }
    let took = answered(calls).await?;
    Ok((started.elapsed(), took))
}

/// Each spawned call's time in milliseconds, sorted, once all have answered.
async fn answered(
    calls: Vec<tokio::task::JoinHandle<Result<f64, BenchError>>>,
) -> Result<Vec<f64>, BenchError> {
    let mut took = Vec::with_capacity(calls.len());
    for call in calls {
        took.push(call.await.map_err(|e| BenchError::Api(e.to_string()))??);
    }
    took.sort_by(f64::total_cmp);
    Ok(took)
}

/// Publishes an event to `account` every `interval` until `stop`; returns how many it
/// published and each publish call's time in milliseconds, sorted.
async fn publish_steadily(
    api: Arc<Api>,
    account: String,
    interval: Duration,
    clock: PublishClock,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Result<(usize, Vec<f64>), BenchError> {
    let mut ticker = tokio::time::interval(interval);
    let mut calls = Vec::new();
    let mut published = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        ticker.tick().await;
        let (api, clock, account) = (Arc::clone(&api), clock.clone(), account.clone());
        let id = format!("{account}-{published}");
        published += 1;
        calls.push(tokio::spawn(async move {
            clock.start(&id);
            let started = Instant::now();
            api.post(
                &format!("/v1/accounts/{account}/events"),
                json!({"id": id, "type": "bench.steady", "data": {}}),
            )
            .await
            .map(|_| started.elapsed().as_secs_f64() * 1000.0)
        }));
    }
    Ok((published, answered(calls).await?))
}

/// End-to-end latencies (publish call start → arrival) of the first successful arrival
/// of each delivery at `endpoints`, in milliseconds, sorted.
fn latencies_ms(farm: &Farm, endpoints: &[String], clock: &PublishClock) -> Vec<f64> {
    let mut latencies: Vec<f64> = timed_arrivals(farm, endpoints, clock)
        .into_iter()
        .map(|(published, arrived)| ms_between(published, arrived))
        .collect();
    latencies.sort_by(f64::total_cmp);
    latencies
}

/// When each delivery to `endpoints` was published (its publish call's start) and when it
/// first arrived with success.
fn timed_arrivals(
    farm: &Farm,
    endpoints: &[String],
    clock: &PublishClock,
) -> Vec<(Instant, Instant)> {
    let mut timed = Vec::new();
    for name in endpoints {
        let mut seen = std::collections::HashSet::new();
        for arrival in farm.arrivals(name) {
            let Some(id) = arrival.webhook_id.as_deref() else {
                continue;
            };
            if !(200..300).contains(&arrival.status) || !seen.insert(id.to_owned()) {
                continue;
            }
            if let Some(start) = clock.get(id) {
                timed.push((start, arrival.instant));
            }
        }
    }
    timed
}

fn ms_between(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn last_arrival(farm: &Farm, endpoints: &[String]) -> Option<Instant> {
    endpoints
        .iter()
        .flat_map(|n| farm.arrivals(n))
        .filter(|a| (200..300).contains(&a.status))
        .map(|a| a.instant)
        .max()
}

fn delivered(farm: &Farm, endpoints: &[String]) -> usize {
    endpoints
        .iter()
        .map(|n| farm.distinct_ids_succeeded(n))
        .sum()
}

fn duplicates(farm: &Farm, endpoints: &[String]) -> usize {
    endpoints
        .iter()
        .map(|n| {
            farm.success_count(n)
                .saturating_sub(farm.distinct_ids_succeeded(n))
        })
        .sum()
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

fn round(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

async fn throughput(options: &BenchOptions) -> Result<Value, BenchError> {
    let (events, publishers) = if options.quick { (100, 8) } else { (5000, 32) };
    let farm = Farm::start().await?;
    let endpoints = names("w1", options.throughput_endpoints.max(1));
    let mut target = Target::start(options, &[]).await?;
    let api = Arc::new(Api::new(&target));
    let account = format!("bench-w1-{}", uuid_fragment());
    api.setup(&account, &farm, &endpoints).await?;
    let clock = PublishClock::default();
    let cpu_before = target.pid().and_then(cpu_seconds);
    let threads = sched::Phase::start(target.pid());
    let (publish_time, calls) = match options.publish_rate {
        Some(rate) => publish_at_rate(&api, &account, events, rate, &clock).await?,
        None => publish_many(&api, &account, &account, events, publishers, &clock).await?,
    };
    let threads = threads.end();
    let expected = events * endpoints.len();
    farm.wait_until(
        Duration::from_secs(if options.quick { 30 } else { 180 }),
        |f| delivered(f, &endpoints) >= expected,
    )
    .await;
    let arrived = delivered(&farm, &endpoints);
    let span = match (clock.first(), last_arrival(&farm, &endpoints)) {
        (Some(first), Some(last)) => last.saturating_duration_since(first),
        _ => Duration::ZERO,
    };
    // Every delivery's CPU in the serve process, publish and send: what a machine's cores
    // buy, whatever the host's speed does to the rate.
    let cpu_per_delivery_us = match (cpu_before, target.pid().and_then(cpu_seconds)) {
        (Some(before), Some(after)) if arrived > 0 => {
            Some(round((after - before) * 1e6 / arrived as f64))
        }
        _ => None,
    };
    let latencies = latencies_ms(&farm, &endpoints, &clock);
    let database_bytes = target.checkpointed_database_bytes().await;
    target.stop().await;
    Ok(json!({
        "workload": "W1 throughput",
        "events": events,
        "endpoints": endpoints.len(),
        "deliveries": expected,
        "publishers": options.publish_rate.is_none().then_some(publishers),
        "publish_rate": options.publish_rate,
        "publish_per_s": round(events as f64 / publish_time.as_secs_f64()),
        "publish_call_p50_ms": round(percentile(&calls, 50.0)),
        "publish_call_p99_ms": round(percentile(&calls, 99.0)),
        "deliveries_per_s": round(arrived as f64 / span.as_secs_f64().max(1e-9)),
        "serve_cpu_us_per_delivery": cpu_per_delivery_us,
        "store_thread_on_cpu_publishing": threads.store_on_cpu,
        "store_thread_waiting_publishing": threads.store_waiting,
        "serve_threads_waiting_publishing": threads.serve_waiting,
        "p50_ms": round(percentile(&latencies, 50.0)),
        "p95_ms": round(percentile(&latencies, 95.0)),
        "p99_ms": round(percentile(&latencies, 99.0)),
        "lost": expected - arrived.min(expected),
        "duplicates": duplicates(&farm, &endpoints),
        "checkpointed_bytes_per_delivery": database_bytes.map(|b| b / expected.max(1) as u64),
    }))
}

async fn isolation_run(
    options: &BenchOptions,
    with_slow: bool,
) -> Result<(usize, usize, Vec<f64>, usize), BenchError> {
    let (events, slow_latency, budget) = if options.quick {
        (10, Duration::from_secs(3), Duration::from_secs(5))
    } else {
        (200, Duration::from_secs(30), Duration::from_secs(40))
    };
    let farm = Farm::start().await?;
    let healthy = names("w2-ok", 50);
    let mut endpoints = healthy.clone();
    if with_slow {
        farm.configure("w2-slow", Behavior::slow(slow_latency));
        endpoints.push("w2-slow".into());
    }
    let target = Target::start(options, &[]).await?;
    let api = Api::new(&target);
    let account = format!("bench-w2-{}", uuid_fragment());
    api.setup(&account, &farm, &endpoints).await?;
    let clock = PublishClock::default();
    let started = Instant::now();
    publish_many(&api, &account, &account, events, 8, &clock).await?;
    let expected = events * healthy.len();
    let remaining = budget.saturating_sub(started.elapsed());
    farm.wait_until(remaining, |f| delivered(f, &healthy) >= expected)
        .await;
    let arrived = delivered(&farm, &healthy);
    let latencies = latencies_ms(&farm, &healthy, &clock);
    let peak = farm.peak_concurrency("w2-slow");
    target.stop().await;
    Ok((expected, arrived, latencies, peak))
}

async fn isolation(options: &BenchOptions) -> Result<Value, BenchError> {
    let (expected, arrived, with_slow, peak) = isolation_run(options, true).await?;
    let (_, _, without_slow, _) = isolation_run(options, false).await?;
    let p99 = percentile(&with_slow, 99.0);
    let baseline_p99 = percentile(&without_slow, 99.0);
    Ok(json!({
        "workload": "W2 isolation",
        "healthy_deliveries": expected,
        "healthy_arrived_share": round3(arrived as f64 / expected as f64),
        "healthy_p50_ms": round(percentile(&with_slow, 50.0)),
        "healthy_p99_ms": round(p99),
        "baseline_p99_ms": round(baseline_p99),
        "p99_ratio": round3(p99 / baseline_p99),
        "slow_peak_concurrency": peak,
    }))
}

async fn flaky(options: &BenchOptions) -> Result<Value, BenchError> {
    let events = if options.quick { 50 } else { 1000 };
    let farm = Farm::start().await?;
    let endpoints = names("w3", 10);
    for name in &endpoints {
        farm.configure(name, Behavior::flaky(0.3));
    }
    // The schedule scaled down so that the run drains in seconds; 16 retries at 30 %
    // failure leave about one delivery in 10^8 failed.
    let schedule = "0.1,0.2,0.4,0.8,1,1,1,1,1,1,1,1,1,1,1,1";
    let target = Target::start(options, &[("HOOKLANE_RETRY_SCHEDULE", schedule)]).await?;
    let api = Api::new(&target);
    let account = format!("bench-w3-{}", uuid_fragment());
    api.setup(&account, &farm, &endpoints).await?;
    let clock = PublishClock::default();
    let started = Instant::now();
    publish_many(&api, &account, &account, events, 8, &clock).await?;
    let expected = events * endpoints.len();
    farm.wait_until(
        Duration::from_secs(if options.quick { 30 } else { 120 }),
        |f| delivered(f, &endpoints) >= expected,
    )
    .await;
    let drained = started.elapsed();
    let arrived = delivered(&farm, &endpoints);
    let attempts: usize = endpoints.iter().map(|n| farm.arrival_count(n)).sum();
    target.stop().await;
    Ok(json!({
        "workload": "W3 flaky",
        "deliveries": expected,
        "delivered_share": round3(arrived as f64 / expected as f64),
        "attempts_per_delivery": round3(attempts as f64 / expected as f64),
        "duplicates": duplicates(&farm, &endpoints),
        "drain_s": round(drained.as_secs_f64()),
        "lost": expected - arrived.min(expected),
    }))
}

async fn steady_latency(options: &BenchOptions) -> Result<Value, BenchError> {
    let (rate, seconds) = if options.quick { (50, 2) } else { (100, 30) };
    let farm = Farm::start().await?;
    let endpoints = names("w4", 10);
    let target = Target::start(options, &[]).await?;
    let api = Arc::new(Api::new(&target));
    let account = format!("bench-w4-{}", uuid_fragment());
    api.setup(&account, &farm, &endpoints).await?;
    let clock = PublishClock::default();
    let cpu_before = target.pid().and_then(cpu_seconds);
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / rate);
    let mut calls = Vec::with_capacity(rate as usize * seconds);
    for i in 0..(rate as usize * seconds) {
        ticker.tick().await;
        let (api, clock, account) = (Arc::clone(&api), clock.clone(), account.clone());
        calls.push(tokio::spawn(async move {
            let id = format!("{account}-{i}");
            api.publish_bench_event(&clock, &account, id, i).await
        }));
    }
    for call in calls {
        call.await.map_err(|e| BenchError::Api(e.to_string()))??;
    }
    let expected = rate as usize * seconds * endpoints.len();
    farm.wait_until(Duration::from_secs(30), |f| {
        delivered(f, &endpoints) >= expected
    })
    .await;
    let wall = started.elapsed();
    let cpu = match (cpu_before, target.pid().and_then(cpu_seconds)) {
        (Some(before), Some(after)) => Some(round((after - before) / wall.as_secs_f64() * 100.0)),
        _ => None,
    };
    let latencies = latencies_ms(&farm, &endpoints, &clock);
    let arrived = delivered(&farm, &endpoints);
    target.stop().await;
    Ok(json!({
        "workload": "W4 steady latency",
        "deliveries_per_s_offered": rate as usize * endpoints.len(),
        "seconds": seconds,
        "p50_ms": round(percentile(&latencies, 50.0)),
        "p99_ms": round(percentile(&latencies, 99.0)),
        "hooklane_cpu_percent": cpu,
        "lost": expected - arrived.min(expected),
    }))
}

/// Runs the workloads, printing a table as it goes and one JSON line per workload.
pub async fn run(options: BenchOptions) -> Result<Vec<Value>, BenchError> {
    // The farm and the publishers share the cores with `serve`. With huge pages, the
    // farm's growing record of arrivals faulted in zeroed 2 MiB pages: a third of this
    // process's CPU in W1, taken from the server being measured.
    crate::serve::small_pages();
    println!(
        "hooklane bench{} — {} cores, load average {} at start",
        if options.quick { " --quick" } else { "" },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        load_average()
    );
    let mut results = Vec::new();
    for workload in &options.workloads {
        let result = match workload {
            Workload::Throughput => throughput(&options).await?,
            Workload::Isolation => isolation(&options).await?,
            Workload::Flaky => flaky(&options).await?,
            Workload::SteadyLatency => steady_latency(&options).await?,
            Workload::Outage => outage::outage(&options).await?,
            Workload::Purge => purge::purge_latency(&options).await?,
        };
        if let Some(fields) = result.as_object() {
            let line = fields
                .iter()
                .filter(|(k, _)| k.as_str() != "workload")
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("  ");
            println!("{:<20} {line}", result["workload"].as_str().unwrap_or(""));
        }
        println!("{result}");
        results.push(result);
    }
    println!("load average {} at end", load_average());
    Ok(results)
}
