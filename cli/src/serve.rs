//! `hooklane serve`: the embedded shape in one process.

use std::{sync::Arc, time::Duration};

use axum::{
    http::{header::CONTENT_TYPE, HeaderMap},
    response::IntoResponse,
    routing::get,
    Router,
};
use hooklane::api::{auth::bearer, ApiError};
use hooklane::{
    api::{self, ApiState},
    dispatcher::{self, DispatcherConfig},
    domain::Scope,
    http::HttpSender,
    limits::MemoryBuckets,
    notify::{smtp::SmtpNotifier, LogNotifier, Notifier},
    queue::embedded::EmbeddedQueue,
    secrets::{generate_key, parse_key, SecretsCipher},
    service::{
        access::{new_admin_token, sha256_hex, Access, AdminToken, ADMIN_TOKEN_DIGEST_SETTING},
        catalog::Catalog,
        tokens,
    },
    store::{sqlite::SqliteStore, Store, StoreError},
    App, PublishMode, SystemClock,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use metrics_util::MetricKindMask;
use tokio::sync::watch;

use crate::config::ServeConfig;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Startup(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Where files from before digests kept a generated admin token, in plain text.
const PLAIN_ADMIN_TOKEN_SETTING: &str = "admin_token";

/// The admin token: configured (fixed for the process), or kept in the database as a digest,
/// generated and printed once on the first start, and replaced by `POST /v1/admin-token`
/// without a restart.
async fn admin_token(
    store: &dyn Store,
    configured: Option<&str>,
) -> Result<AdminToken, ServeError> {
    if let Some(token) = configured {
        if token.len() < 16 {
            return Err(ServeError::Startup(
                "HOOKLANE_ADMIN_TOKEN must be at least 16 characters".into(),
            ));
        }
        return Ok(AdminToken::fixed(token));
    }
    if store
        .get_setting(ADMIN_TOKEN_DIGEST_SETTING)
        .await?
        .is_some()
    {
        return Ok(AdminToken::Stored);
    }
    // A file from before digests: its token goes on working, kept only as a digest now.
    if let Some(token) = store
        .get_setting(PLAIN_ADMIN_TOKEN_SETTING)
        .await?
        .filter(|t| !t.is_empty())
    {
        store
            .put_setting_if_absent(ADMIN_TOKEN_DIGEST_SETTING, &sha256_hex(&token))
            .await?;
        store.put_setting(PLAIN_ADMIN_TOKEN_SETTING, "").await?;
        return Ok(AdminToken::Stored);
    }
    let token = new_admin_token();
    let digest = sha256_hex(&token);
    let stored = store
        .put_setting_if_absent(ADMIN_TOKEN_DIGEST_SETTING, &digest)
        .await?;
    if stored == digest {
        // Printed once, on the start that created it.
        println!(
            "admin token (shown once; POST /v1/admin-token replaces it; or set HOOKLANE_ADMIN_TOKEN to choose your own): {token}"
        );
    }
    Ok(AdminToken::Stored)
}

/// The key file of an embedded shape without `HOOKLANE_SECRETS_KEY`: beside the database,
/// named after it.
pub fn secrets_key_file(database: &std::path::Path) -> std::path::PathBuf {
    let mut name = database.file_name().unwrap_or_default().to_os_string();
    name.push(".secrets-key");
    database.with_file_name(name)
}

/// The cipher of endpoint secrets: `HOOKLANE_SECRETS_KEY` (and `_PREVIOUS`), else the key
/// in the file beside the database, generated (readable by its owner only) on the first
/// start without one.
fn secrets_cipher(config: &ServeConfig) -> Result<SecretsCipher, ServeError> {
    let invalid = |e: hooklane::domain::InvalidField| ServeError::Startup(e.to_string());
    if let Some(cipher) = config.core.secrets.cipher_or(None) {
        return cipher.map_err(invalid);
    }
    let path = secrets_key_file(&config.database);
    let file_error = |e: std::io::Error| {
        ServeError::Startup(format!("secrets key file {}: {e}", path.display()))
    };
    let raw = match std::fs::read_to_string(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let generated = generate_key().map_err(|e| ServeError::Startup(e.to_string()))?;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(&path).map_err(file_error)?;
            std::io::Write::write_all(&mut file, format!("{generated}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(file_error)?;
            tracing::info!(
                path = %path.display(),
                "generated the key that encrypts endpoint secrets; keep it with the database \
                 (without it their secrets are lost) or set HOOKLANE_SECRETS_KEY"
            );
            generated
        }
        Err(e) => return Err(file_error(e)),
    };
    let key = parse_key(&raw, "HOOKLANE_SECRETS_KEY").map_err(|e| {
        ServeError::Startup(format!(
            "secrets key file {}: {}",
            path.display(),
            e.message
        ))
    })?;
    SecretsCipher::new(&key, None).map_err(invalid)
}

const METRIC_BUCKETS: [f64; 17] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0,
    3600.0, 86_400.0,
];

/// How often the recorder folds histogram samples into their buckets. It keeps every sample
/// until then or until `/metrics` is read: on a server nobody scrapes, memory grew by each
/// attempt's timings for as long as it ran.
const METRICS_UPKEEP: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a counter or gauge may go unchanged before `/metrics` stops listing it. The
/// series labelled by endpoint or account (`telemetry::UNBOUNDED_LABELS`) are one per
/// endpoint or account ever active: kept for the life of the process, `/metrics` and the
/// memory behind it grew with every endpoint ever created. An hour is far longer than any
/// scrape interval or `rate()` window, so a series in use is never dropped between two reads
/// of it; an endpoint quiet for an hour costs nothing to drop.
///
/// Which kinds: counters, whose series comes back from 0 at its next increment (`rate()` and
/// `increase()` read that as a counter reset; an endpoint attempted less than hourly loses
/// the first increment after each gap from `increase()`, as a new endpoint does); and
/// gauges, which are set every 15 s (the backlog: never idle) or move up and back down with
/// each attempt (in flight: back at 0 once an endpoint's attempts end, as when it is
/// dropped). Not histograms: ours have no unbounded label, and their distributions stay
/// readable through a quiet hour.
///
/// The series without an unbounded label are bounded, and kept: see [`KeepBounded`].
const METRICS_IDLE: Duration = Duration::from_secs(3600);

/// How often the idle series are dropped where nobody scrapes `/metrics` (the recorder drops
/// them only as it renders).
const METRICS_PRUNE: Duration = Duration::from_secs(600);

/// The recorder of `serve`: Prometheus's, dropping counters and gauges idle for `idle`
/// unless they are bounded.
fn metrics_recorder(idle: Duration) -> Result<KeepBounded, ServeError> {
    let recorder = PrometheusBuilder::new()
        .set_buckets(&METRIC_BUCKETS)
        .map_err(|e| ServeError::Startup(format!("metrics: {e}")))?
        .idle_timeout(MetricKindMask::COUNTER | MetricKindMask::GAUGE, Some(idle))
        .build_recorder();
    Ok(KeepBounded::new(recorder))
}

/// Installs the Prometheus recorder and starts its upkeep (on the current runtime).
pub(crate) fn install_metrics() -> Result<PrometheusHandle, ServeError> {
    let recorder = Arc::new(metrics_recorder(METRICS_IDLE)?);
    let handle = recorder.handle();
    metrics::set_global_recorder(Arc::clone(&recorder))
        .map_err(|e| ServeError::Startup(format!("metrics: {e}")))?;
    hooklane::telemetry::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(METRICS_UPKEEP);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pruned = tokio::time::Instant::now();
        loop {
            ticker.tick().await;
            upkeep.run_upkeep();
            recorder.keep_alive();
            if pruned.elapsed() >= METRICS_PRUNE {
                // Rendering is what drops the idle series.
                drop(upkeep.render());
                pruned = tokio::time::Instant::now();
            }
        }
    });
    Ok(handle)
}

/// Keeps the series without an unbounded label (`telemetry::UNBOUNDED_LABELS`) from going
/// idle: a few dozen at most, and among them the counters that alarms watch for any
/// increase (endpoints disabled, notifications failed, store writes refused). Dropped after a
/// quiet hour, such a counter would come back at 1, and Prometheus does not count a new
/// series' first value: the first failure after every quiet hour would go unseen.
struct KeepBounded {
    inner: PrometheusRecorder,
    /// The bounded series met so far: the key, and whether it is a counter (else a gauge).
    bounded: std::sync::RwLock<std::collections::HashSet<(metrics::Key, bool)>>,
}

/// The metadata of the recorder's own updates (the exporter does not read it).
static KEEP_ALIVE: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

impl KeepBounded {
    fn new(inner: PrometheusRecorder) -> Self {
        Self {
            inner,
            bounded: std::sync::RwLock::default(),
        }
    }

    fn handle(&self) -> PrometheusHandle {
        self.inner.handle()
    }

    /// Notes a series if it is bounded.
    fn note(&self, key: &metrics::Key, counter: bool) {
        let unbounded = key
            .labels()
            .any(|label| hooklane::telemetry::UNBOUNDED_LABELS.contains(&label.key()));
        if unbounded {
            return;
        }
        let entry = (key.clone(), counter);
        // A set of keys: nothing a panic mid-update could leave harmful.
        let known = self
            .bounded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&entry);
        if !known {
            self.bounded
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(entry);
        }
    }

    /// Marks every bounded series updated (by adding 0). Run more often than the idle timeout.
    fn keep_alive(&self) {
        let bounded = self
            .bounded
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (key, counter) in bounded.iter() {
            if *counter {
                metrics::Recorder::register_counter(&self.inner, key, &KEEP_ALIVE).increment(0);
            } else {
                metrics::Recorder::register_gauge(&self.inner, key, &KEEP_ALIVE).increment(0.0);
            }
        }
    }
}

impl metrics::Recorder for KeepBounded {
    fn describe_counter(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        description: metrics::SharedString,
    ) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        description: metrics::SharedString,
    ) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        description: metrics::SharedString,
    ) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(
        &self,
        key: &metrics::Key,
        metadata: &metrics::Metadata<'_>,
    ) -> metrics::Counter {
        self.note(key, true);
        self.inner.register_counter(key, metadata)
    }

    fn register_gauge(
        &self,
        key: &metrics::Key,
        metadata: &metrics::Metadata<'_>,
    ) -> metrics::Gauge {
        self.note(key, false);
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(
        &self,
        key: &metrics::Key,
        metadata: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        self.inner.register_histogram(key, metadata)
    }
}

/// How long `serve` may use what it read of a credential. Revocations go through this
/// process, which forgets what it read at once; the bound holds whatever the path.
const CREDENTIAL_CACHE: std::time::Duration = std::time::Duration::from_secs(1);

/// `GET /metrics`: Prometheus text, for the admin token or a key with the `admin` scope.
pub(crate) fn metrics_route(handle: PrometheusHandle, access: Arc<Access>) -> Router {
    Router::new().route(
        "/metrics",
        get(move |headers: HeaderMap| {
            let handle = handle.clone();
            let access = Arc::clone(&access);
            async move {
                let allowed = match bearer(&headers) {
                    Ok(credential) => match access.authenticate(credential).await {
                        Ok(principal) => principal
                            .authorize(Some(Scope::Admin), None)
                            .map_err(ApiError::from),
                        Err(error) => Err(ApiError::from(error)),
                    },
                    Err(error) => Err(error),
                };
                if let Err(error) = allowed {
                    return error.into_response();
                }
                (
                    [(CONTENT_TYPE, "text/plain; version=0.0.4")],
                    handle.render(),
                )
                    .into_response()
            }
        }),
    )
}

/// Refreshes the backlog gauges every few seconds.
fn spawn_backlog_gauges(
    store: Arc<SqliteStore>,
    queue: Arc<EmbeddedQueue>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        // Counting the backlog reads every pending row's index entry, and its oldest
        // creation time each row: over a second at a million pending, on the connection the
        // API's reads share. Every 15 s that is a few per cent of it.
        let mut ticker = tokio::time::interval(std::time::Duration::from_secs(15));
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.changed() => break,
            }
            match store.backlog().await {
                Ok((pending, oldest)) => {
                    let age = oldest
                        .and_then(|at| (chrono::Utc::now() - at).to_std().ok())
                        .unwrap_or_default();
                    let stats = queue.stats();
                    hooklane::telemetry::backlog(pending, age, stats.due, stats.in_flight);
                }
                Err(error) => tracing::warn!(%error, "cannot read the backlog for metrics"),
            }
        }
    });
}

/// Turns transparent huge pages off for this process. Where the kernel hands them out
/// (`always`, or `madvise` with the allocator asking), one live object held a whole 2 MiB
/// page: W5 at a fifth of its size peaked at 180 MB of RSS with them and 162 MB without,
/// at the same rates. Pages already mapped are covered too (the kernel checks at each fault).
/// `hooklane bench` turns them off for its own process too.
pub fn small_pages() {
    #[cfg(target_os = "linux")]
    if let Err(error) = nix::sys::prctl::set_thp_disable(true) {
        tracing::warn!(%error, "cannot turn transparent huge pages off; memory use may be higher");
    }
}

/// Raises this process's soft limit on open files to its hard limit, and answers the limit
/// now in force (`None` where it cannot be read). Each connection a client holds open is a
/// descriptor, and so is each webhook's connection, each idle one kept for reuse and each
/// name lookup: the soft limit a service manager gives is often 1,024 (systemd's default,
/// whose hard limit is 524,288), which a few hundred customers' endpoints and clients
/// reach. What Go does at start for the same reason.
pub fn raise_open_files_limit() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getrlimit, setrlimit, Resource};
        let limit = getrlimit(Resource::Nofile);
        let (Some(current), Some(hard)) = (limit.current, limit.maximum) else {
            // Unlimited (`None`) either way: nothing to raise, or no bound to keep under.
            return limit.current.or(limit.maximum);
        };
        if current < hard {
            let raised = rustix::process::Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => return Some(hard),
                Err(error) => {
                    tracing::warn!(%error, soft = current, hard, "cannot raise the open-files limit to its hard limit");
                }
            }
        }
        Some(current)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The most client connections `serve` holds open at once under an open-files limit of
/// `limit`: half of it, the other half left for the webhooks' connections, the database
/// and name lookups. Past it, new connections wait in the listen backlog (and are taken as
/// others close) rather than take the descriptors that sends need: at the limit, every
/// send's connect() fails (`Too many open files`), and would be recorded against the
/// customers' endpoints.
fn connection_cap(limit: Option<u64>) -> usize {
    limit.map_or(usize::MAX, |limit| {
        usize::try_from(limit / 2)
            .unwrap_or(usize::MAX)
            .max(MIN_CONNECTIONS)
    })
}

/// Client connections allowed however low the open-files limit: `serve` needs a few to be
/// reached at all.
const MIN_CONNECTIONS: usize = 16;

/// How much lower than the API's the background runtime's CPU priority is, in nice steps.
/// At 5 a busy API thread gets about three times a busy background thread's share of a
/// core (the kernel's weights are 1024 and 335); alone, a background thread runs at full speed.
const BACKGROUND_NICENESS: i32 = 5;

/// The runtime of the dispatcher: attempts, the fan-out, the window and the periodic jobs.
/// Its threads run at a lower CPU priority than the API's and the store's, so that on a
/// busy machine a publish call waits for the store, not for a core the sends hold (on two
/// cores, with the endpoints beside it, 1.4 of serve's threads waited for a core on average
/// while publishing at full rate). Nice values are per thread on Linux; elsewhere the
/// threads run at the process's priority.
pub fn background_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_name("hooklane-dispatch")
        .on_thread_start(lower_priority)
        .enable_all()
        .build()
}

fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let thread = rustix::thread::gettid();
        let now = rustix::process::getpriority_process(Some(thread)).unwrap_or(0);
        if let Err(error) =
            rustix::process::setpriority_process(Some(thread), now + BACKGROUND_NICENESS)
        {
            // Once: blocking threads come and go for as long as the process runs.
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(%error, "cannot lower the dispatcher threads' CPU priority; they run at the API's");
            });
        }
    }
}

pub async fn run(
    config: ServeConfig,
    background: tokio::runtime::Handle,
) -> Result<(), ServeError> {
    small_pages();
    let open_files = raise_open_files_limit();
    let max_connections = connection_cap(open_files);
    let metrics = install_metrics()?;
    let secrets = secrets_cipher(&config)?;
    let store = Arc::new(SqliteStore::open(&config.database, secrets.clone())?);
    let resealed = store.reseal_secrets().await.map_err(|e| match e {
        // Only a secret that does not open is the key's fault; a lock held past the busy
        // wait or an I/O error is the file's.
        StoreError::Corrupt(_) => ServeError::Startup(format!(
            "endpoint signing secrets in {} do not open with the configured key (key id {}): \
             {e}; give the key that sealed them as HOOKLANE_SECRETS_KEY (during a rotation, \
             as HOOKLANE_SECRETS_KEY_PREVIOUS) or restore {} (docs/OPERATIONS.md, \
             \"Secrets at rest\")",
            config.database.display(),
            secrets.key_id(),
            secrets_key_file(&config.database).display(),
        )),
        other => ServeError::Startup(format!(
            "cannot seal the endpoint signing secrets in {} again: {other}",
            config.database.display(),
        )),
    })?;
    tracing::info!(
        key_id = secrets.key_id(),
        resealed,
        "endpoint secrets are encrypted at rest"
    );
    let admin = admin_token(store.as_ref(), config.admin_token.as_deref()).await?;
    let sender = HttpSender::new(config.core.sender.clone())
        .map_err(|e| ServeError::Startup(e.to_string()))?;
    let notifier: Arc<dyn Notifier> = match &config.smtp {
        Some(smtp) => Arc::new(
            SmtpNotifier::new(&smtp.url, &smtp.from)
                .map_err(|e| ServeError::Startup(e.to_string()))?,
        ),
        None => Arc::new(LogNotifier),
    };
    let queue = Arc::new(EmbeddedQueue::new());
    let app = App {
        store: store.clone(),
        queue: queue.clone(),
        transport: Arc::new(sender),
        notifier,
        clock: Arc::new(SystemClock),
        config: Arc::new(config.core.clone()),
        // A publish writes its event alone and answers; the dispatcher's fan-out creates
        // the deliveries right after, as the stream does on AWS.
        publish: PublishMode::ThroughStream,
    };
    let (stop, stopped) = watch::channel(false);
    let queue_for_gauges = queue.clone();
    let dispatcher_config = DispatcherConfig {
        workers: config.workers,
        sweep_interval: config.sweep_interval,
        health_interval: config.health_interval,
        purge_interval: config.purge_interval,
        ..DispatcherConfig::default()
    };
    // The attempts in flight at a shutdown get this long; the whole shutdown a little more.
    let drain_timeout = dispatcher_config.drain_timeout;
    // Started on the background runtime, so that every task it spawns runs there, and so do
    // the connections its sends open.
    let running = background
        .spawn(dispatcher::start(
            app.clone(),
            queue,
            store.clone(),
            dispatcher_config,
            stopped,
        ))
        .await
        .map_err(|e| ServeError::Startup(format!("the dispatcher did not start: {e}")))?
        .map_err(|e| ServeError::Startup(format!("cannot load pending deliveries: {e}")))?;
    {
        let _on = background.enter();
        spawn_backlog_gauges(store, queue_for_gauges, stop.subscribe());
    }
    let token_key = tokens::signing_key(app.store.as_ref())
        .await
        .map_err(|e| ServeError::Startup(format!("cannot load the token signing key: {e}")))?;
    let access = Arc::new(Access::new(
        Arc::clone(&app.store),
        Arc::clone(&app.clock),
        token_key,
        admin,
        CREDENTIAL_CACHE,
    ));
    let publish_limits = Arc::new(MemoryBuckets::new(app.clock.clone()));
    let catalog = Arc::new(Catalog::new(
        app.config.strict_event_types,
        CREDENTIAL_CACHE,
    ));
    let router = api::router(ApiState {
        app,
        access: Arc::clone(&access),
        publish_limits,
        catalog,
    })
    .merge(metrics_route(metrics, access));
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: config.listen,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServeError::Listen {
        addr: config.listen,
        source,
    })?;
    tracing::info!(
        database = %config.database.display(),
        workers = config.workers,
        open_files_limit = open_files,
        max_connections,
        "hooklane serve started"
    );
    let allowed = config.core.address_policy().allow_list();
    if !allowed.is_empty() {
        // The SSRF guard lets webhooks reach these: right for a laptop or a private network,
        // wrong where customers set the URLs and the server's own network is not theirs.
        let networks: Vec<String> = allowed.iter().map(ToString::to_string).collect();
        tracing::warn!(
            networks = %networks.join(", "),
            "HOOKLANE_ALLOW_CIDRS lets webhooks reach these networks: meant for local testing and private deployments"
        );
    }
    // Before the line below, a signal ends a start at once (the default action); from it on,
    // it ends the server gracefully, and a second one at once.
    let mut signals = StopSignals::listen();
    // Tests and scripts read this line to learn the port when listening on port 0.
    println!("hooklane listening on http://{local}");
    let router = router.layer(axum::middleware::from_fn(|request, next| {
        body_read_deadline(BODY_READ_TIMEOUT, request, next)
    }));
    let (signal, http) = serve_http(
        listener,
        router,
        HttpLimits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_connections,
        },
        signals.next(),
    )
    .await;
    let deadline = tokio::time::Instant::now() + drain_timeout + AFTER_THE_DRAIN;
    exit_if_still_running_at(deadline + EXIT_WATCHDOG);
    tokio::spawn(async move {
        let again = signals.next().await;
        tracing::warn!(
            signal = again.name(),
            "a second signal: exiting at once; attempts cut short are sent again after the restart"
        );
        std::process::exit(again.exit_code());
    });
    tracing::info!(
        signal = signal.name(),
        "shutting down: no new connections; finishing the requests and attempts in flight"
    );
    // The dispatcher stops with the server, not after it: the attempts' drain runs during the
    // requests' grace, so that neither waits on the other. A publish answered in the grace is
    // stored, and fanned out at the next start if its fan-out has not begun.
    let _ = stop.send(true);
    tokio::join!(
        http.finish(REQUEST_GRACE.min(drain_timeout + AFTER_THE_DRAIN)),
        finish_background(running, deadline),
    );
    Ok(())
}

/// How long a client may take to send a request's head, and so how long a kept-alive
/// connection may stay idle: longer than the 60 s after which the proxies in front usually
/// drop an idle connection of theirs (nginx's upstream `keepalive_timeout`, a load
/// balancer's idle timeout), so that it is they who close it, not `serve` while they send
/// a request on it.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(75);

/// How long a client may take to send a request's body once its head is in: over 60 KB/s
/// for the largest batch. A body still unfinished then is answered `408` and its
/// connection closed: a client sending a byte a second held a connection (and `serve`'s
/// shutdown) for as long as it liked.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// After SIGTERM or Ctrl-C, how long the requests in progress get to finish; then their
/// connections are closed, unanswered. A publish is committed before it is answered, so
/// what a client was told is stored; what it was not told, it sends again.
const REQUEST_GRACE: Duration = Duration::from_secs(10);

/// After the dispatcher's drain of the attempts in flight (12 s, `DispatcherConfig`), how
/// long the rest of the background work (the periodic jobs) gets to stop before `serve`
/// returns without it: a job that does not watch for shutdown (mail to a relay that says
/// nothing) does not hold the process.
const AFTER_THE_DRAIN: Duration = Duration::from_secs(2);

/// How long past that deadline the process exits, whatever it still waits for (the
/// runtimes' teardown waits for every blocking task, a name lookup among them): within the
/// documented 15 s of the signal.
const EXIT_WATCHDOG: Duration = Duration::from_millis(500);

/// The signals that stop `serve`: SIGTERM and Ctrl-C (SIGINT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    Terminate,
    Interrupt,
}

impl StopSignal {
    pub fn name(self) -> &'static str {
        match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
        }
    }

    /// The exit code of a process ended by this signal, as a shell reports it (128 + its
    /// number): what a second signal exits with.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Terminate => 143,
            Self::Interrupt => 130,
        }
    }
}

/// SIGTERM and Ctrl-C, listened for from [`StopSignals::listen`] on, for as long as this
/// lives: every one that comes after is heard, the first and any later one.
pub struct StopSignals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Call it inside the runtime. From here on neither signal ends the process by itself.
    pub fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                terminate: signal(SignalKind::terminate()).ok(),
                interrupt: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next signal.
    pub async fn next(&mut self) -> StopSignal {
        #[cfg(unix)]
        {
            async fn recv(listener: &mut Option<tokio::signal::unix::Signal>) {
                match listener {
                    Some(listener) => {
                        if listener.recv().await.is_none() {
                            // The runtime is going away: that is no signal.
                            std::future::pending::<()>().await;
                        }
                    }
                    // Not listening for this one: the other may still come.
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                () = recv(&mut self.terminate) => StopSignal::Terminate,
                () = recv(&mut self.interrupt) => StopSignal::Interrupt,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            StopSignal::Interrupt
        }
    }
}

/// Ctrl-C or SIGTERM, listened for from the moment this is called rather than from the
/// returned future's first poll: until a listener exists, SIGTERM's default action ends the
/// process at once, and `serve` printed that it listens before its server polled the future,
/// so a SIGTERM right after that line killed it with its work in flight. Call it inside the
/// runtime, before saying that the process listens.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut signals = StopSignals::listen();
    async move {
        signals.next().await;
    }
}

/// Exits the process at `deadline` if it is still running then.
fn exit_if_still_running_at(deadline: tokio::time::Instant) {
    let deadline = deadline.into_std();
    let watchdog = std::thread::Builder::new()
        .name("hooklane-shutdown".into())
        .spawn(move || {
            std::thread::sleep(deadline.saturating_duration_since(std::time::Instant::now()));
            tracing::error!(
                "shutdown: still running past its deadline (a blocking task the runtime waits \
                 for); exiting now"
            );
            std::process::exit(0);
        });
    if let Err(error) = watchdog {
        tracing::warn!(%error, "cannot start the shutdown watchdog");
    }
}

/// Waits until `deadline` for the dispatcher's tasks to end after the stop (its workers
/// give the attempts in flight their drain time); the ones still running then are left.
async fn finish_background(running: dispatcher::Running, deadline: tokio::time::Instant) {
    let mut handles = running.handles;
    let ended = tokio::time::timeout_at(deadline, async {
        for handle in &mut handles {
            let _ = handle.await;
        }
    })
    .await
    .is_ok();
    if !ended {
        let running = handles.iter().filter(|h| !h.is_finished()).count();
        tracing::warn!(
            tasks = running,
            "shutdown: background tasks still running at the deadline (a periodic job that \
             does not stop, such as mail to a relay that says nothing); exiting without them"
        );
        for handle in &handles {
            handle.abort();
        }
    }
}

/// The connections [`serve_http`] accepted, each served on its own task.
struct Connections {
    tasks: tokio::task::JoinSet<()>,
    close: watch::Sender<bool>,
}

impl Connections {
    /// Closes every connection gracefully: an idle one at once, one with a request in
    /// progress once it is answered. Those still open after `grace` are closed as they are.
    async fn finish(mut self, grace: Duration) {
        let _ = self.close.send(true);
        let open = self.tasks.len();
        let ended = tokio::time::timeout(grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        if !ended {
            tracing::warn!(
                connections = self.tasks.len(),
                at_the_signal = open,
                grace_s = grace.as_secs(),
                "shutdown: connections with a request still unfinished after the grace; \
                 closing them unanswered (what was answered is stored; their clients send the \
                 rest again)"
            );
            self.tasks.shutdown().await;
        }
    }
}

/// The bounds [`serve_http`] keeps to.
#[derive(Debug, Clone, Copy)]
struct HttpLimits {
    /// How long a client may take to send a request's head (and so how long a kept-alive
    /// connection stays idle).
    header_read_timeout: Duration,
    /// The most connections open at once; more wait to be accepted.
    max_connections: usize,
}

/// Serves `router` on `listener` over HTTP/1 until `stop` resolves; then stops accepting
/// and hands back what `stop` gave and the connections still open. What `axum::serve` does,
/// plus the bounds of `limits`, and connections that a shutdown can close at its deadline
/// rather than wait for.
async fn serve_http<T>(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: HttpLimits,
    stop: impl std::future::Future<Output = T>,
) -> (T, Connections) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let (close, closing) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    // Warned once each time the connections reach the bound.
    let mut full = false;
    let stopped = loop {
        let room = tasks.len() < limits.max_connections;
        if room {
            full = false;
        } else if !full {
            full = true;
            tracing::warn!(
                connections = tasks.len(),
                "as many client connections as allowed are open; new ones wait until one closes"
            );
        }
        tokio::select! {
            biased;
            stopped = &mut stop => break stopped,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept(), if room => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    // The peer gave up before it was accepted: nothing to do.
                    Err(error) if matches!(
                        error.kind(),
                        std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::ConnectionRefused
                    ) => continue,
                    // Out of file descriptors, say: accepting again at once would spin.
                    Err(error) => {
                        tracing::error!(%error, "cannot accept a connection; trying again in a second");
                        tokio::select! {
                            stopped = &mut stop => break stopped,
                            () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        }
                    }
                };
                serve_connection(&mut tasks, &http, router.clone(), stream, peer, closing.clone());
            }
        }
    };
    // Closed here: a connection from now on is refused.
    drop(listener);
    (stopped, Connections { tasks, close })
}

/// Serves one connection on a task of `tasks`, until its client closes it or `closing` says
/// to (then once its request in progress, if any, is answered).
fn serve_connection(
    tasks: &mut tokio::task::JoinSet<()>,
    http: &hyper::server::conn::http1::Builder,
    router: Router,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    mut closing: watch::Receiver<bool>,
) {
    let app = hyper_util::service::TowerToHyperService::new(router);
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            // The peer's address, which the audit log records of each change.
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            hyper::service::Service::call(&app, request)
        });
    let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tasks.spawn(async move {
        let mut connection = std::pin::pin!(connection);
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(error) = ended {
                    tracing::debug!(%error, %peer, "connection ended with an error");
                }
                return;
            }
            _ = closing.wait_for(|close| *close) => {}
        }
        connection.as_mut().graceful_shutdown();
        if let Err(error) = connection.await {
            tracing::debug!(%error, %peer, "connection ended with an error");
        }
    });
}

/// A request body that must arrive whole by a deadline; past it, the next read fails and
/// `timed_out` is set.
struct ReadDeadline {
    body: axum::body::Body,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    timed_out: Arc<std::sync::atomic::AtomicBool>,
    limit: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0} s")]
struct BodyReadTimedOut(u64);

impl hyper::body::Body for ReadDeadline {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::{future::Future as _, task::Poll};
        let this = &mut *self;
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.timed_out
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return Poll::Ready(Some(Err(BodyReadTimedOut(this.limit.as_secs()).into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Gives a request's body `limit` from its head to arrive whole; one later is answered
/// `408` (whatever the route made of the failed read) and its connection closed.
async fn body_read_deadline(
    limit: Duration,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use hyper::body::Body as _;
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let request = request.map(|body| {
        axum::body::Body::new(ReadDeadline {
            body,
            deadline: Box::pin(tokio::time::sleep(limit)),
            timed_out: Arc::clone(&timed_out),
            limit,
        })
    });
    let response = next.run(request).await;
    if !timed_out.load(std::sync::atomic::Ordering::Relaxed) {
        return response;
    }
    let mut response = ApiError::new(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        BodyReadTimedOut(limit.as_secs()).to_string(),
    )
    .into_response();
    // The rest of the body may still be on its way: the connection cannot carry another
    // request.
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::Duration;

    /// SIGTERM between the call and the first poll (where `serve` printed that it listens)
    /// is heard by the future; it does not end the process.
    #[tokio::test]
    async fn a_sigterm_before_the_first_poll_ends_the_wait_not_the_process() {
        let shutdown = super::shutdown_signal();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM: {sent}");
        // Time for the signal to land before the future is first polled.
        std::thread::sleep(Duration::from_millis(200));
        tokio::time::timeout(Duration::from_secs(5), shutdown)
            .await
            .expect("the SIGTERM was not heard");
    }

    /// Serves `router` as `serve` does, with `header_read_timeout`, until the test ends.
    async fn serving(
        router: axum::Router,
        header_read_timeout: Duration,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        serving_within(
            router,
            super::HttpLimits {
                header_read_timeout,
                max_connections: usize::MAX,
            },
        )
        .await
    }

    /// Serves `router` as `serve` does, with `limits`, until the test ends.
    #[allow(clippy::expect_used)] // test code: a panic is a failed test
    async fn serving_within(
        router: axum::Router,
        limits: super::HttpLimits,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let ((), connections) = super::serve_http(listener, router, limits, async {
                let _ = stopped.await;
            })
            .await;
            connections.finish(Duration::ZERO).await;
        });
        (address, stop)
    }

    /// Past the bound on open connections, a new one waits to be accepted (its request
    /// unanswered) until one of those open closes; then it is served.
    #[tokio::test]
    async fn past_the_connection_bound_a_client_waits_for_one_to_close() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (address, _stop) = serving_within(
            router,
            super::HttpLimits {
                header_read_timeout: Duration::from_secs(60),
                max_connections: 2,
            },
        )
        .await;
        let request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
        let mut open = Vec::new();
        for _ in 0..2 {
            let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
            stream.write_all(request).await.unwrap();
            let mut answer = [0u8; 12];
            stream.read_exact(&mut answer).await.unwrap();
            assert_eq!(&answer, b"HTTP/1.1 200");
            open.push(stream);
        }
        let mut third = tokio::net::TcpStream::connect(address).await.unwrap();
        third.write_all(request).await.unwrap();
        let mut answer = [0u8; 12];
        let waited =
            tokio::time::timeout(Duration::from_millis(500), third.read_exact(&mut answer)).await;
        assert!(
            waited.is_err(),
            "a third connection was served with 2 allowed"
        );
        drop(open.pop());
        tokio::time::timeout(Duration::from_secs(5), third.read_exact(&mut answer))
            .await
            .expect("the third connection was not served once one closed")
            .unwrap();
        assert_eq!(&answer, b"HTTP/1.1 200");
    }

    #[test]
    fn half_the_open_files_limit_goes_to_client_connections() {
        assert_eq!(super::connection_cap(Some(1024)), 512);
        assert_eq!(super::connection_cap(Some(10)), super::MIN_CONNECTIONS);
        assert_eq!(super::connection_cap(None), usize::MAX);
    }

    /// `serve` starts with its soft open-files limit raised to the hard one.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let hard = getrlimit(Resource::Nofile).maximum;
        // Started low, as a service manager's 1,024 would be (this test's process only).
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard.unwrap_or(1024).min(1024)),
                maximum: hard,
            },
        )
        .unwrap();
        let raised = super::raise_open_files_limit();
        assert_eq!(raised, hard.or(raised));
        assert_eq!(getrlimit(Resource::Nofile).current, hard.or(raised));
    }

    /// Everything the server sends until it closes the connection, within `bound`.
    async fn until_closed(stream: &mut tokio::net::TcpStream, bound: Duration) -> String {
        use tokio::io::AsyncReadExt;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(bound, stream.read_to_end(&mut answer)).await;
        assert!(
            read.is_ok(),
            "the connection was still open after {bound:?}; it sent {:?}",
            String::from_utf8_lossy(&answer)
        );
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// A client that does not finish a request's head in time, or sends none on a connection
    /// it keeps, has its connection closed.
    #[tokio::test]
    async fn a_head_not_sent_in_time_closes_the_connection() {
        use tokio::io::AsyncWriteExt;
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (address, _stop) = serving(router, Duration::from_millis(300)).await;
        let mut idle = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let mut partial = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        partial
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n")
            .await
            .expect("part of a head");
        until_closed(&mut idle, Duration::from_secs(3)).await;
        until_closed(&mut partial, Duration::from_secs(3)).await;
        // A whole head in time is answered.
        let mut whole = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        whole
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .expect("head");
        let answer = until_closed(&mut whole, Duration::from_secs(3)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    /// A body not all in by the deadline is answered 408 and its connection closed; one in
    /// time is read as usual.
    #[tokio::test]
    async fn a_body_not_sent_in_time_is_answered_408() {
        use tokio::io::AsyncWriteExt;
        let router = axum::Router::new()
            .route(
                "/",
                axum::routing::post(
                    |body: axum::body::Bytes| async move { body.len().to_string() },
                ),
            )
            .layer(axum::middleware::from_fn(|request, next| {
                super::body_read_deadline(Duration::from_millis(1000), request, next)
            }));
        let (address, _stop) = serving(router, Duration::from_secs(30)).await;
        let mut slow = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        slow.write_all(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n1")
            .await
            .expect("head and a byte");
        let answer = until_closed(&mut slow, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("request_timeout"), "{answer}");
        let mut prompt = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        prompt
            .write_all(
                b"POST / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 10\r\n\r\n0123456789",
            )
            .await
            .expect("request");
        let answer = until_closed(&mut prompt, Duration::from_secs(3)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("10"), "{answer}");
    }

    /// The peer's address reaches the handlers, as `ConnectInfo` (the audit log's).
    #[tokio::test]
    async fn handlers_see_the_peer_address() {
        use tokio::io::AsyncWriteExt;
        let router = axum::Router::new().route(
            "/",
            axum::routing::get(
                |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<
                    std::net::SocketAddr,
                >| async move { peer.to_string() },
            ),
        );
        let (address, _stop) = serving(router, Duration::from_secs(30)).await;
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let local = stream.local_addr().expect("local address");
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .expect("head");
        let answer = until_closed(&mut stream, Duration::from_secs(3)).await;
        assert!(answer.ends_with(&local.to_string()), "{answer}");
    }

    /// Counters and gauges of an endpoint or account idle past the timeout leave `/metrics`
    /// (and come back from 0 when used again); the bounded series stay.
    #[test]
    fn idle_series_of_endpoints_and_accounts_go_and_the_rest_stay() {
        use hooklane::telemetry::{
            ACCOUNT_DELIVERIES, ATTEMPTS, ATTEMPT_DURATION, ENDPOINTS_DISABLED, ENDPOINT_ATTEMPTS,
            ENDPOINT_IN_FLIGHT, PENDING_DELIVERIES,
        };
        let recorder = super::metrics_recorder(Duration::from_millis(300)).expect("recorder");
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!(ENDPOINT_ATTEMPTS, "endpoint" => "ep_1").increment(3);
            metrics::counter!(ACCOUNT_DELIVERIES, "account" => "acme", "status" => "delivered")
                .increment(3);
            metrics::gauge!(ENDPOINT_IN_FLIGHT, "endpoint" => "ep_1").increment(0.0);
            metrics::counter!(ENDPOINTS_DISABLED).increment(1);
            metrics::counter!(ATTEMPTS, "outcome" => "success", "attempt" => "1").increment(3);
            metrics::gauge!(PENDING_DELIVERIES).set(7.0);
            metrics::histogram!(ATTEMPT_DURATION).record(0.2);
        });
        let before = handle.render();
        for series in [
            format!("{ENDPOINT_ATTEMPTS}{{endpoint=\"ep_1\"}} 3"),
            format!("{ACCOUNT_DELIVERIES}{{account=\"acme\",status=\"delivered\"}} 3"),
            format!("{ENDPOINT_IN_FLIGHT}{{endpoint=\"ep_1\"}} 0"),
        ] {
            assert!(before.contains(&series), "{series} missing:\n{before}");
        }
        // Idle past the timeout, the bounded series kept alive as the upkeep does.
        std::thread::sleep(Duration::from_millis(500));
        recorder.keep_alive();
        let after = handle.render();
        for gone in ["ep_1", "acme"] {
            assert!(!after.contains(gone), "{gone} still listed:\n{after}");
        }
        for kept in [
            format!("{ENDPOINTS_DISABLED} 1"),
            format!("{ATTEMPTS}{{outcome=\"success\",attempt=\"1\"}} 3"),
            format!("{PENDING_DELIVERIES} 7"),
            format!("{ATTEMPT_DURATION}_count 1"),
        ] {
            assert!(after.contains(&kept), "{kept} dropped:\n{after}");
        }
        // An endpoint used again comes back, from 0.
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!(ENDPOINT_ATTEMPTS, "endpoint" => "ep_1").increment(1);
        });
        let again = handle.render();
        let series = format!("{ENDPOINT_ATTEMPTS}{{endpoint=\"ep_1\"}} 1");
        assert!(again.contains(&series), "{series} missing:\n{again}");
    }

    /// The dispatcher's runtime runs its workers and its blocking threads (name lookups of
    /// the sends) at a lower CPU priority than the thread that built it.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_background_runtime_runs_below_its_callers_priority() {
        fn priority() -> i32 {
            rustix::process::getpriority_process(Some(rustix::thread::gettid()))
                .expect("read this thread's priority")
        }
        let own = priority();
        let background = super::background_runtime().expect("build the runtime");
        let (worker, blocking) = background.block_on(async {
            let worker = tokio::spawn(async { priority() }).await.expect("worker");
            let blocking = tokio::task::spawn_blocking(priority)
                .await
                .expect("blocking");
            (worker, blocking)
        });
        let lowered = (own + super::BACKGROUND_NICENESS).min(19);
        assert_eq!((worker, blocking), (lowered, lowered), "caller at {own}");
        assert_eq!(priority(), own, "the caller's own priority changed");
    }
}
