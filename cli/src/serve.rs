//! `hooklane serve`: the embedded shape in one process.

use std::sync::Arc;

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
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
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

/// Installs the Prometheus recorder and starts its upkeep (on the current runtime).
pub(crate) fn install_metrics() -> Result<PrometheusHandle, ServeError> {
    let handle = PrometheusBuilder::new()
        .set_buckets(&METRIC_BUCKETS)
        .map_err(|e| ServeError::Startup(format!("metrics: {e}")))?
        .install_recorder()
        .map_err(|e| ServeError::Startup(format!("metrics: {e}")))?;
    hooklane::telemetry::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(METRICS_UPKEEP);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
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
    let metrics = install_metrics()?;
    let secrets = secrets_cipher(&config)?;
    let store = Arc::new(SqliteStore::open(&config.database, secrets.clone())?);
    let resealed = store.reseal_secrets().await.map_err(|e| {
        ServeError::Startup(format!(
            "endpoint signing secrets in {} do not open with the configured key (key id {}): \
             {e}; give the key that sealed them as HOOKLANE_SECRETS_KEY (during a rotation, \
             as HOOKLANE_SECRETS_KEY_PREVIOUS) or restore {} (docs/OPERATIONS.md, \
             \"Secrets at rest\")",
            config.database.display(),
            secrets.key_id(),
            secrets_key_file(&config.database).display(),
        ))
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
    // Started on the background runtime, so that every task it spawns runs there, and so do
    // the connections its sends open.
    let running = background
        .spawn(dispatcher::start(
            app.clone(),
            queue,
            store.clone(),
            DispatcherConfig {
                workers: config.workers,
                sweep_interval: config.sweep_interval,
                health_interval: config.health_interval,
                purge_interval: config.purge_interval,
                ..DispatcherConfig::default()
            },
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
    tracing::info!(database = %config.database.display(), workers = config.workers, "hooklane serve started");
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
    // it ends the server gracefully.
    let shutdown = shutdown_signal();
    // Tests and scripts read this line to learn the port when listening on port 0.
    println!("hooklane listening on http://{local}");
    // With the peer's address, which the audit log records of each change.
    let router = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| ServeError::Startup(format!("server error: {e}")))?;
    tracing::info!("shutting down: finishing attempts in flight");
    let _ = stop.send(true);
    running.join().await;
    Ok(())
}

/// Ctrl-C or SIGTERM, listened for from the moment this is called rather than from the
/// returned future's first poll: until a listener exists, SIGTERM's default action ends the
/// process at once, and `serve` printed that it listens before its server polled the future,
/// so a SIGTERM right after that line killed it with its work in flight. Call it inside the
/// runtime, before saying that the process listens.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let listeners = [SignalKind::terminate(), SignalKind::interrupt()].map(signal);
        async move {
            let [terminate, interrupt] = listeners.map(|listener| async move {
                match listener {
                    Ok(mut listener) => {
                        listener.recv().await;
                    }
                    // Not listening for this one: the other may still come.
                    Err(_) => std::future::pending::<()>().await,
                }
            });
            tokio::select! {
                () = terminate => {}
                () = interrupt => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
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
