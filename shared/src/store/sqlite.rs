//! The embedded store: one SQLite file in WAL mode.

use std::{
    fs::{File, OpenOptions},
    path::{Path, PathBuf},
    sync::{mpsc, Arc},
};

use async_trait::async_trait;
use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use rusqlite::{params, types::Value, Connection, OptionalExtension, Row};

use super::{
    AttemptRecord, DeliveryQuery, DeliveryWork, DisableOutcome, DisableRequest, Notification, Page,
    PendingRef, PublishOutcome, PutEventOutcome, RecordOutcome, ReplayOutcome, ReplayRequest,
    Store, StoreError, StoreResult, Unattempted,
};
use crate::{
    clock::{from_millis, to_millis, Timestamp},
    domain::{
        endpoint::RetiringSecret, Account, AccountId, Attempt, Decision, Delivery, DeliveryId,
        DeliveryStatus, EmailAddress, Endpoint, EndpointId, EndpointStatus, EndpointUrl, Event,
        EventId, EventType, EventTypeFilter, Replay, ReplayFilter, ReplayId, ReplayScope, Trigger,
    },
    signing::SigningSecret,
};

mod fresh;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, owner_email TEXT NOT NULL, created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS endpoints (
  id TEXT PRIMARY KEY,
  account_id TEXT NOT NULL REFERENCES accounts(id),
  url TEXT NOT NULL,
  description TEXT NOT NULL,
  secret TEXT NOT NULL,
  retiring_secret TEXT,
  retiring_until INTEGER,
  status TEXT NOT NULL,
  event_types TEXT,
  max_in_flight INTEGER NOT NULL,
  rate_limit INTEGER,
  failing_since INTEGER,
  disabled_reason TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS endpoints_by_account ON endpoints(account_id, created_at);
CREATE INDEX IF NOT EXISTS endpoints_failing ON endpoints(failing_since) WHERE failing_since IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
  account_id TEXT NOT NULL, id TEXT NOT NULL, type TEXT NOT NULL, created_at INTEGER NOT NULL, payload TEXT NOT NULL,
  PRIMARY KEY (account_id, id)
);
CREATE TABLE IF NOT EXISTS deliveries (
  id TEXT PRIMARY KEY,
  account_id TEXT NOT NULL,
  event_id TEXT NOT NULL,
  endpoint_id TEXT NOT NULL,
  event_type TEXT NOT NULL,
  status TEXT NOT NULL,
  attempts INTEGER NOT NULL,
  next_try_at INTEGER,
  last_status INTEGER,
  last_error TEXT,
  client_errors INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (account_id, event_id, endpoint_id)
);
CREATE INDEX IF NOT EXISTS deliveries_pending ON deliveries(next_try_at, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS deliveries_by_endpoint ON deliveries(endpoint_id, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS deliveries_by_account ON deliveries(account_id, created_at DESC, id DESC);
CREATE TABLE IF NOT EXISTS notifications (
  id TEXT PRIMARY KEY,
  account_id TEXT NOT NULL,
  recipient TEXT NOT NULL,
  subject TEXT NOT NULL,
  body TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  sent_at INTEGER
);
CREATE INDEX IF NOT EXISTS notifications_unsent ON notifications(created_at) WHERE sent_at IS NULL;
CREATE TABLE IF NOT EXISTS replays (
  id TEXT PRIMARY KEY,
  account_id TEXT NOT NULL,
  actor TEXT NOT NULL,
  delivery_id TEXT,
  endpoint_id TEXT,
  since INTEGER,
  until INTEGER,
  statuses TEXT NOT NULL,
  event_types TEXT NOT NULL,
  requested_at INTEGER NOT NULL,
  count INTEGER NOT NULL,
  more INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS replays_by_account ON replays(account_id, id DESC);
"#;

const ATTEMPTS_TABLE: &str = r#"
CREATE TABLE IF NOT EXISTS attempts (
  delivery_created_at INTEGER NOT NULL,
  delivery_id TEXT NOT NULL,
  number INTEGER NOT NULL,
  trigger TEXT NOT NULL,
  started_at INTEGER NOT NULL,
  latency_ms INTEGER NOT NULL,
  status_code INTEGER,
  response_headers TEXT NOT NULL,
  response_body TEXT NOT NULL,
  response_body_truncated INTEGER NOT NULL,
  error TEXT,
  PRIMARY KEY (delivery_created_at, delivery_id, number)
) WITHOUT ROWID;
"#;

const ATTEMPT_COLUMNS: &str = "delivery_id, number, trigger, started_at, latency_ms, status_code, \
     response_headers, response_body, response_body_truncated, error";

/// Columns added after the first release, added to older database files on open.
const ADDED_DELIVERY_COLUMNS: &[(&str, &str)] = &[
    ("schedule_start", "INTEGER NOT NULL DEFAULT 0"),
    ("next_trigger", "TEXT NOT NULL DEFAULT 'scheduled'"),
];

const ENDPOINT_COLUMNS: &str = "id, account_id, url, description, secret, retiring_secret, retiring_until, status, \
     event_types, max_in_flight, rate_limit, failing_since, disabled_reason, created_at, updated_at";
const DELIVERY_COLUMNS: &str =
    "id, account_id, event_id, endpoint_id, event_type, status, attempts, next_try_at, \
     last_status, last_error, client_errors, created_at, updated_at, schedule_start, next_trigger";

/// Where reads go and where the store thread signals its commits.
type Helpers = (mpsc::Sender<Job>, Option<mpsc::SyncSender<()>>);

/// An in-memory database is private to its connection: reads share the store thread.
fn reads_on_the_store_thread(_: &Connection, jobs: &mpsc::Sender<Job>) -> StoreResult<Helpers> {
    Ok((jobs.clone(), None))
}

/// The most jobs one transaction groups.
const MAX_BATCH: usize = 256;

/// Sends a job's result once the transaction that ran it has committed (or failed to).
type Reply = Box<dyn FnOnce(Option<&StoreError>) + Send>;
type Job = Box<dyn FnOnce(&mut Connection) -> Reply + Send>;

/// SQLite owned by one thread. Callers queue jobs; the thread runs whatever has queued up
/// in one transaction (each job in its own savepoint) and answers after the commit, so a
/// busy server pays one commit for many writes and no thread hand-off per call.
#[derive(Clone)]
pub struct SqliteStore {
    jobs: mpsc::Sender<Job>,
    /// Where the hot reads go: a reader thread on its own connection for a file database
    /// (WAL lets it read while the store thread writes), the store thread in memory.
    reads: mpsc::Sender<Job>,
    // Held for the life of the store: a second `serve` on the same file is refused.
    _lock: Option<Arc<File>>,
    fresh: Arc<fresh::FreshWork>,
}

/// Checkpoints the WAL into the database file from its own connection and thread, so
/// that copying pages and the fsyncs around it (a tenth of the store thread's time when it
/// did them itself) do not hold up the jobs. A passive checkpoint never blocks the writer.
/// Runs after commits, at most every `CHECKPOINT_PAUSE`; ends when the store thread does.
fn run_checkpoints(conn: Connection, commits: mpsc::Receiver<()>) {
    while commits.recv().is_ok() {
        if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(%error, "WAL checkpoint failed; the store thread checkpoints past the backstop");
        }
        std::thread::sleep(CHECKPOINT_PAUSE);
    }
}

const CHECKPOINT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// WAL pages after which the store thread checkpoints itself, should the checkpoint thread
/// fall behind (SQLite's default is 1000).
const WAL_BACKSTOP_PAGES: i64 = 10_000;

/// Answers read-only jobs as soon as each has run: a read needs no commit, and on its own
/// connection it neither waits for the writer's batch nor adds to it. The jobs queued at
/// one time share one read transaction (one file lock instead of one per statement); it
/// starts after they were all queued, so each sees every write acknowledged before it.
fn run_reads(mut conn: Connection, reads: mpsc::Receiver<Job>) {
    while let Ok(first) = reads.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match reads.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let began = run_cached(&conn, "BEGIN");
        for job in batch {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn))) {
                Ok(reply) => reply(None),
                Err(_) => tracing::error!("a store read panicked; its caller gets an error"),
            }
        }
        // A read transaction left open would keep its snapshot for ever: end it either way.
        if began.is_ok() && run_cached(&conn, "COMMIT").is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
}

fn run_jobs(
    mut conn: Connection,
    jobs: mpsc::Receiver<Job>,
    commits: Option<mpsc::SyncSender<()>>,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let began = run_cached(&conn, "BEGIN IMMEDIATE").map_err(backend);
        let replies: Vec<Reply> = batch
            .into_iter()
            .map(|job| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn)))
                    .unwrap_or_else(|_| {
                        tracing::error!("a store job panicked; its caller gets an error");
                        Box::new(|_| {})
                    })
            })
            .collect();
        let outcome = began.and_then(|()| run_cached(&conn, "COMMIT").map_err(backend));
        if outcome.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        if let (Ok(()), Some(commits)) = (&outcome, &commits) {
            // Full means a checkpoint is already asked for.
            let _ = commits.try_send(());
        }
        let error = outcome.err();
        for reply in replies {
            reply(error.as_ref());
        }
    }
}

/// Runs a statement without parameters through the statement cache: the batch and
/// savepoint statements run for every job, and parsing them each time showed in profiles.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// A job's savepoint inside the batch transaction, rolled back unless committed, so that
/// the rows one job writes stand or fall together. Like rusqlite's `Savepoint`, but over
/// cached statements.
struct JobSavepoint<'a> {
    conn: &'a Connection,
    open: bool,
}

impl<'a> JobSavepoint<'a> {
    fn begin(conn: &'a Connection) -> rusqlite::Result<Self> {
        run_cached(conn, "SAVEPOINT job")?;
        Ok(Self { conn, open: true })
    }

    fn commit(mut self) -> rusqlite::Result<()> {
        self.open = false;
        run_cached(self.conn, "RELEASE job")
    }
}

impl std::ops::Deref for JobSavepoint<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for JobSavepoint<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = run_cached(self.conn, "ROLLBACK TO job");
            let _ = run_cached(self.conn, "RELEASE job");
        }
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file, refusing if another process has it open.
    pub fn open(path: impl AsRef<Path>) -> StoreResult<Self> {
        let path = path.as_ref();
        let lock = acquire_lock(path)?;
        let open = || {
            Connection::open(path)
                .map_err(|e| StoreError::Backend(format!("cannot open {}: {e}", path.display())))
        };
        let conn = open()?;
        Self::init(conn, Some(lock), |conn, _| {
            let reader = open()?;
            reader
                .busy_timeout(std::time::Duration::from_secs(5))
                .map_err(backend)?;
            reader
                .pragma_update(None, "query_only", "ON")
                .map_err(backend)?;
            let (reads, queue) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("hooklane-sqlite-read".into())
                .spawn(move || run_reads(reader, queue))
                .map_err(|e| StoreError::Backend(format!("cannot start the reader thread: {e}")))?;
            let checkpointer = open()?;
            checkpointer
                .pragma_update(None, "synchronous", "NORMAL")
                .map_err(backend)?;
            conn.pragma_update(None, "wal_autocheckpoint", WAL_BACKSTOP_PAGES)
                .map_err(backend)?;
            let (commits, committed) = mpsc::sync_channel(1);
            std::thread::Builder::new()
                .name("hooklane-checkpoint".into())
                .spawn(move || run_checkpoints(checkpointer, committed))
                .map_err(|e| {
                    StoreError::Backend(format!("cannot start the checkpoint thread: {e}"))
                })?;
            Ok((reads, Some(commits)))
        })
    }

    /// How many deliveries are pending and when the oldest of them was created: the
    /// backlog gauges of the embedded shape.
    pub async fn backlog(&self) -> StoreResult<(u64, Option<Timestamp>)> {
        self.read(|conn| {
            conn.query_row(
                "SELECT COUNT(*), MIN(created_at) FROM deliveries WHERE status = 'pending'",
                [],
                |row| {
                    let count: i64 = row.get(0)?;
                    let oldest: Option<i64> = row.get(1)?;
                    Ok((u64::try_from(count).unwrap_or(0), oldest.map(from_millis)))
                },
            )
            .map_err(backend)
        })
        .await
    }

    async fn insert_event_and_deliveries(
        &self,
        event: &Event,
        deliveries: &[Delivery],
    ) -> StoreResult<PublishOutcome> {
        let published = Arc::new((event.clone(), deliveries.to_vec()));
        let (fresh, kept) = (Arc::clone(&self.fresh), Arc::clone(&published));
        let remember = move |outcome: &StoreResult<PublishOutcome>| {
            if let Ok(PublishOutcome::Created) = outcome {
                fresh.remember_published(&kept.0, &kept.1);
            }
        };
        self.run_then(move |conn| {
            let (event, deliveries) = (&published.0, &published.1);
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            let existing = tx
                .prepare_cached("SELECT account_id, id, type, created_at, payload FROM events WHERE account_id = ?1 AND id = ?2")
                .and_then(|mut s| s.query_row(params![event.account_id.as_str(), event.id.as_str()], event_from_row).optional())
                .map_err(backend)?;
            if let Some(existing) = existing {
                let deliveries = deliveries_of_event(&tx, existing.account_id.as_str(), existing.id.as_str()).map_err(backend)?;
                return Ok(PublishOutcome::AlreadyExists { event: existing, deliveries });
            }
            insert_event(&tx, event).map_err(backend)?;
            insert_deliveries(&tx, deliveries).map_err(backend)?;
            tx.commit().map_err(backend)?;
            Ok(PublishOutcome::Created)
        }, remember)
        .await
    }

    /// A private in-memory database, for tests.
    pub fn in_memory() -> StoreResult<Self> {
        let conn = Connection::open_in_memory().map_err(backend)?;
        Self::init(conn, None, reads_on_the_store_thread)
    }

    /// Sets the connection up and starts the store thread; `helpers` starts the reader and
    /// checkpoint threads of a file database and returns where reads go (given the store
    /// thread's queue) and where to signal commits.
    fn init(
        conn: Connection,
        lock: Option<File>,
        helpers: impl FnOnce(&Connection, &mpsc::Sender<Job>) -> StoreResult<Helpers>,
    ) -> StoreResult<Self> {
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(backend)?;
        // NORMAL in WAL mode survives a process crash (kill -9); only power loss can drop
        // the last commits.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(backend)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(backend)?;
        // Every job runs in a savepoint, and SQLite copies each page a savepoint changes
        // into a statement journal; on disk (past 64 KiB) those copies were a fifth of the
        // store thread's time. They are only needed until the job is released, so memory
        // is the right place; it does not touch what the WAL makes durable.
        conn.pragma_update(None, "temp_store", "MEMORY")
            .map_err(backend)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(backend)?;
        conn.execute_batch(SCHEMA).map_err(backend)?;
        add_missing_columns(&conn, "deliveries", ADDED_DELIVERY_COLUMNS).map_err(backend)?;
        migrate_attempts_to_time_order(&conn).map_err(backend)?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let (reads, commits) = helpers(&conn, &jobs)?;
        std::thread::Builder::new()
            .name("hooklane-sqlite".into())
            .spawn(move || run_jobs(conn, queue, commits))
            .map_err(|e| StoreError::Backend(format!("cannot start the store thread: {e}")))?;
        Ok(Self {
            jobs,
            reads,
            _lock: lock.map(Arc::new),
            fresh: Arc::default(),
        })
    }

    /// Runs `work` on the store thread inside the current batch's transaction. Work that
    /// writes several rows wraps them in a savepoint so that they stand or fall together.
    /// What publishes left for first tries is forgotten, as `work` may have changed it.
    async fn run<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let fresh = Arc::clone(&self.fresh);
        Self::submit(&self.jobs, work, move |_| fresh.forget_all()).await
    }

    /// [`SqliteStore::run`] for the two writes that keep [`fresh::FreshWork`] up to date
    /// themselves (a publish and an attempt), in `after_commit`.
    async fn run_then<T, F, A>(&self, work: F, after_commit: A) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
        A: FnOnce(&StoreResult<T>) + Send + 'static,
    {
        Self::submit(&self.jobs, work, after_commit).await
    }

    /// Runs read-only `work` where reads go (see [`SqliteStore::reads`]).
    async fn read<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        Self::submit(&self.reads, work, |_| {}).await
    }

    /// Queues `work`; `after_commit` runs on the store thread once the batch has committed
    /// (or failed to), before the answer is sent. There it is ordered with every other
    /// job's commit, and it runs even when the caller has stopped waiting (a client that
    /// disconnects drops its request's future).
    async fn submit<T, F, A>(queue: &mpsc::Sender<Job>, work: F, after_commit: A) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
        A: FnOnce(&StoreResult<T>) + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = work(conn);
            Box::new(move |commit_error: Option<&StoreError>| {
                let result = match commit_error {
                    Some(error) => Err(StoreError::Backend(format!("commit failed: {error}"))),
                    None => result,
                };
                after_commit(&result);
                let _ = answer.send(result);
            })
        });
        let stopped = || StoreError::Backend("the store thread has stopped".into());
        queue.send(job).map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

/// Attempts are keyed by their delivery's creation time first: the attempts one batch
/// records are for deliveries created moments ago, so their rows land on the few pages at
/// the end of the table. Keyed by the (hashed) delivery id, each went to a random page,
/// and W1 made a fifth more WAL writes (406k against 319k `pwrite` calls).
/// Files from before this layout have their attempts copied over once, on open.
fn migrate_attempts_to_time_order(conn: &Connection) -> rusqlite::Result<()> {
    let columns = table_columns(conn, "attempts")?;
    if columns.is_empty() {
        return conn.execute_batch(ATTEMPTS_TABLE);
    }
    if columns.iter().any(|c| c == "delivery_created_at") {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    tx.execute_batch(&format!(
        "ALTER TABLE attempts RENAME TO attempts_by_id; {ATTEMPTS_TABLE} \
         INSERT OR IGNORE INTO attempts (delivery_created_at, {ATTEMPT_COLUMNS}) \
         SELECT d.created_at, {ATTEMPT_COLUMNS} FROM attempts_by_id a JOIN deliveries d ON d.id = a.delivery_id; \
         DROP TABLE attempts_by_id;"
    ))?;
    tx.commit()
}

fn table_columns(conn: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    conn.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?
        .query_map([], |row| row.get(0))?
        .collect()
}

fn add_missing_columns(
    conn: &Connection,
    table: &str,
    columns: &[(&str, &str)],
) -> rusqlite::Result<()> {
    let existing = table_columns(conn, table)?;
    for (name, definition) in columns {
        if !existing.iter().any(|e| e == name) {
            conn.execute_batch(&format!(
                "ALTER TABLE {table} ADD COLUMN {name} {definition}"
            ))?;
        }
    }
    Ok(())
}

fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".lock");
    db.with_file_name(name)
}

fn acquire_lock(db: &Path) -> StoreResult<File> {
    let path = lock_path(db);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| {
            StoreError::Backend(format!("cannot open lock file {}: {e}", path.display()))
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Locked(format!(
            "{} is in use by another hooklane process (lock file {}); stop it first or use another HOOKLANE_DATABASE",
            db.display(),
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::Backend(format!("cannot lock {}: {e}", path.display()))),
    }
}

fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation)
}

fn opt_millis(at: Option<Timestamp>) -> Option<i64> {
    at.map(to_millis)
}

fn corrupt(what: &str, detail: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Text,
        format!("{what}: {detail}").into(),
    )
}

fn u32_col(row: &Row<'_>, idx: usize) -> rusqlite::Result<u32> {
    let raw: i64 = row.get(idx)?;
    u32::try_from(raw).map_err(|e| corrupt("u32 column", e))
}

fn opt_u16_col(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<u16>> {
    let raw: Option<i64> = row.get(idx)?;
    raw.map(|v| u16::try_from(v).map_err(|e| corrupt("u16 column", e)))
        .transpose()
}

fn account_from_row(row: &Row<'_>) -> rusqlite::Result<Account> {
    Ok(Account {
        id: AccountId::from_trusted(row.get(0)?),
        name: row.get(1)?,
        owner_email: EmailAddress::from_trusted(row.get(2)?),
        created_at: from_millis(row.get(3)?),
    })
}

fn endpoint_from_row(row: &Row<'_>) -> rusqlite::Result<Endpoint> {
    let url: String = row.get(2)?;
    let secret: String = row.get(4)?;
    let retiring_secret: Option<String> = row.get(5)?;
    let retiring_until: Option<i64> = row.get(6)?;
    let status: String = row.get(7)?;
    let event_types: Option<String> = row.get(8)?;
    let patterns: Option<Vec<String>> = event_types
        .map(|raw| serde_json::from_str(&raw).map_err(|e| corrupt("event_types", e)))
        .transpose()?;
    let retiring_secret = match (retiring_secret, retiring_until) {
        (Some(secret), Some(until)) => Some(RetiringSecret {
            secret: SigningSecret::parse(&secret).map_err(|e| corrupt("retiring_secret", e))?,
            until: from_millis(until),
        }),
        _ => None,
    };
    let rate_limit: Option<i64> = row.get(10)?;
    Ok(Endpoint {
        id: EndpointId::from_trusted(row.get(0)?),
        account_id: AccountId::from_trusted(row.get(1)?),
        url: EndpointUrl::parse(&url).map_err(|e| corrupt("url", e))?,
        description: row.get(3)?,
        secret: SigningSecret::parse(&secret).map_err(|e| corrupt("secret", e))?,
        retiring_secret,
        status: EndpointStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
        event_types: EventTypeFilter::parse(patterns.as_deref())
            .map_err(|e| corrupt("event_types", e))?,
        max_in_flight: u32_col(row, 9)?,
        rate_limit_per_second: rate_limit.and_then(|v| u32::try_from(v).ok()),
        failing_since: row.get::<_, Option<i64>>(11)?.map(from_millis),
        disabled_reason: row.get(12)?,
        created_at: from_millis(row.get(13)?),
        updated_at: from_millis(row.get(14)?),
    })
}

fn delivery_from_row(row: &Row<'_>) -> rusqlite::Result<Delivery> {
    let status: String = row.get(5)?;
    Ok(Delivery {
        id: DeliveryId::from_trusted(row.get(0)?),
        account_id: AccountId::from_trusted(row.get(1)?),
        event_id: EventId::from_trusted(row.get(2)?),
        endpoint_id: EndpointId::from_trusted(row.get(3)?),
        event_type: EventType::from_trusted(row.get(4)?),
        status: DeliveryStatus::parse(&status)
            .ok_or_else(|| corrupt("delivery status", &status))?,
        attempts: u32_col(row, 6)?,
        next_try_at: row.get::<_, Option<i64>>(7)?.map(from_millis),
        last_status: opt_u16_col(row, 8)?,
        last_error: row.get(9)?,
        client_error_count: u32_col(row, 10)?,
        queued_until: None,
        created_at: from_millis(row.get(11)?),
        updated_at: from_millis(row.get(12)?),
        schedule_start: u32_col(row, 13)?,
        next_trigger: {
            let raw: String = row.get(14)?;
            Trigger::parse(&raw).ok_or_else(|| corrupt("next_trigger", &raw))?
        },
    })
}

fn statuses_json(statuses: &[DeliveryStatus]) -> String {
    let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
    serde_json::to_string(&names).unwrap_or_else(|_| "[]".into())
}

fn replay_from_row(row: &Row<'_>) -> rusqlite::Result<Replay> {
    let delivery: Option<String> = row.get(3)?;
    let endpoint: Option<String> = row.get(4)?;
    let scope = match (delivery, endpoint) {
        (Some(delivery), _) => ReplayScope::Delivery(DeliveryId::from_trusted(delivery)),
        (None, Some(endpoint)) => ReplayScope::Endpoint(EndpointId::from_trusted(endpoint)),
        (None, None) => return Err(corrupt("replay scope", "neither delivery nor endpoint")),
    };
    let statuses: String = row.get(7)?;
    let statuses: Vec<String> =
        serde_json::from_str(&statuses).map_err(|e| corrupt("replay statuses", e))?;
    let statuses = statuses
        .iter()
        .map(|s| DeliveryStatus::parse(s).ok_or_else(|| corrupt("replay status", s)))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let event_types: String = row.get(8)?;
    let event_types: Vec<String> =
        serde_json::from_str(&event_types).map_err(|e| corrupt("replay event types", e))?;
    Ok(Replay {
        id: ReplayId::from_trusted(row.get(0)?),
        account_id: AccountId::from_trusted(row.get(1)?),
        actor: row.get(2)?,
        scope,
        filter: ReplayFilter {
            since: row.get::<_, Option<i64>>(5)?.map(from_millis),
            until: row.get::<_, Option<i64>>(6)?.map(from_millis),
            statuses,
            event_types: event_types
                .into_iter()
                .map(EventType::from_trusted)
                .collect(),
        },
        requested_at: from_millis(row.get(9)?),
        count: u32_col(row, 10)?,
        more: row.get(11)?,
    })
}

fn event_from_row(row: &Row<'_>) -> rusqlite::Result<Event> {
    Ok(Event {
        account_id: AccountId::from_trusted(row.get(0)?),
        id: EventId::from_trusted(row.get(1)?),
        event_type: EventType::from_trusted(row.get(2)?),
        created_at: from_millis(row.get(3)?),
        payload: row.get(4)?,
    })
}

fn attempt_from_row(row: &Row<'_>) -> rusqlite::Result<Attempt> {
    let trigger: String = row.get(2)?;
    let headers: String = row.get(6)?;
    let latency: i64 = row.get(4)?;
    Ok(Attempt {
        delivery_id: DeliveryId::from_trusted(row.get(0)?),
        number: u32_col(row, 1)?,
        trigger: Trigger::parse(&trigger).ok_or_else(|| corrupt("trigger", &trigger))?,
        started_at: from_millis(row.get(3)?),
        latency_ms: u64::try_from(latency).unwrap_or(0),
        status_code: opt_u16_col(row, 5)?,
        response_headers: serde_json::from_str(&headers)
            .map_err(|e| corrupt("response_headers", e))?,
        response_body: row.get(7)?,
        response_body_truncated: row.get(8)?,
        error: row.get(9)?,
    })
}

fn insert_event(tx: &Connection, event: &Event) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO events (account_id, id, type, created_at, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![event.account_id.as_str(), event.id.as_str(), event.event_type.as_str(), to_millis(event.created_at), event.payload],
    )?;
    Ok(())
}

/// Inserts the deliveries whose (event, endpoint) has none yet; returns which were new.
fn insert_deliveries(tx: &Connection, deliveries: &[Delivery]) -> rusqlite::Result<Vec<bool>> {
    let mut insert = tx.prepare_cached(&format!(
        "INSERT OR IGNORE INTO deliveries ({DELIVERY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
    ))?;
    let mut added = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        let inserted = insert.execute(params![
            d.id.as_str(),
            d.account_id.as_str(),
            d.event_id.as_str(),
            d.endpoint_id.as_str(),
            d.event_type.as_str(),
            d.status.as_str(),
            d.attempts,
            opt_millis(d.next_try_at),
            d.last_status,
            d.last_error,
            d.client_error_count,
            to_millis(d.created_at),
            to_millis(d.updated_at),
            d.schedule_start,
            d.next_trigger.as_str(),
        ])?;
        added.push(inserted == 1);
    }
    Ok(added)
}

fn deliveries_of_event(
    conn: &Connection,
    account: &str,
    event: &str,
) -> rusqlite::Result<Vec<Delivery>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE account_id = ?1 AND event_id = ?2 ORDER BY id"
    ))?;
    let rows = stmt.query_map(params![account, event], delivery_from_row)?;
    rows.collect()
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Cursor {
    c: i64,
    i: String,
}

fn encode_cursor(delivery: &Delivery) -> String {
    let cursor = Cursor {
        c: to_millis(delivery.created_at),
        i: delivery.id.as_str().to_owned(),
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&cursor).unwrap_or_default())
}

/// Decodes a cursor from a previous page; `None` when it was not one of ours.
pub fn decode_cursor(raw: &str) -> Option<(i64, String)> {
    let bytes = URL_SAFE_NO_PAD.decode(raw).ok()?;
    let cursor: Cursor = serde_json::from_slice(&bytes).ok()?;
    Some((cursor.c, cursor.i))
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_account(&self, account: &Account) -> StoreResult<()> {
        let account = account.clone();
        self.run(move |conn| {
            conn.execute(
                "INSERT INTO accounts (id, name, owner_email, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![
                    account.id.as_str(),
                    account.name,
                    account.owner_email.as_str(),
                    to_millis(account.created_at)
                ],
            )
            .map_err(|e| {
                if is_unique_violation(&e) {
                    StoreError::Conflict {
                        entity: "account",
                        id: account.id.to_string(),
                    }
                } else {
                    backend(e)
                }
            })?;
            Ok(())
        })
        .await
    }

    async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        let id = id.clone();
        self.read(move |conn| {
            conn.prepare_cached(
                "SELECT id, name, owner_email, created_at FROM accounts WHERE id = ?1",
            )
            .and_then(|mut s| {
                s.query_row(params![id.as_str()], account_from_row)
                    .optional()
            })
            .map_err(backend)
        })
        .await
    }

    async fn create_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()> {
        let e = endpoint.clone();
        self.run(move |conn| {
            let event_types = e.event_types.patterns().map(|p| serde_json::to_string(p).unwrap_or_default());
            conn.execute(
                &format!("INSERT INTO endpoints ({ENDPOINT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"),
                params![
                    e.id.as_str(),
                    e.account_id.as_str(),
                    e.url.as_str(),
                    e.description,
                    e.secret.expose(),
                    e.retiring_secret.as_ref().map(|r| r.secret.expose()),
                    e.retiring_secret.as_ref().map(|r| to_millis(r.until)),
                    e.status.as_str(),
                    event_types,
                    e.max_in_flight,
                    e.rate_limit_per_second,
                    opt_millis(e.failing_since),
                    e.disabled_reason,
                    to_millis(e.created_at),
                    to_millis(e.updated_at),
                ],
            )
            .map_err(|err| {
                if is_unique_violation(&err) {
                    StoreError::Conflict { entity: "endpoint", id: e.id.to_string() }
                } else {
                    backend(err)
                }
            })?;
            Ok(())
        })
        .await
    }

    async fn get_endpoint(
        &self,
        account: &AccountId,
        id: &EndpointId,
    ) -> StoreResult<Option<Endpoint>> {
        let (account, id) = (account.clone(), id.clone());
        self.read(move |conn| {
            conn.query_row(
                &format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE id = ?1 AND account_id = ?2"
                ),
                params![id.as_str(), account.as_str()],
                endpoint_from_row,
            )
            .optional()
            .map_err(backend)
        })
        .await
    }

    async fn list_endpoints(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
        let account = account.clone();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(&format!("SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE account_id = ?1 ORDER BY created_at, id"))
                .map_err(backend)?;
            let rows = stmt.query_map(params![account.as_str()], endpoint_from_row).map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()> {
        let e = endpoint.clone();
        self.run(move |conn| {
            let event_types = e.event_types.patterns().map(|p| serde_json::to_string(p).unwrap_or_default());
            let changed = conn
                .execute(
                    "UPDATE endpoints SET url = ?3, description = ?4, secret = ?5, retiring_secret = ?6, retiring_until = ?7, \
                     status = ?8, event_types = ?9, max_in_flight = ?10, rate_limit = ?11, failing_since = ?12, \
                     disabled_reason = ?13, updated_at = ?14 WHERE id = ?1 AND account_id = ?2",
                    params![
                        e.id.as_str(),
                        e.account_id.as_str(),
                        e.url.as_str(),
                        e.description,
                        e.secret.expose(),
                        e.retiring_secret.as_ref().map(|r| r.secret.expose()),
                        e.retiring_secret.as_ref().map(|r| to_millis(r.until)),
                        e.status.as_str(),
                        event_types,
                        e.max_in_flight,
                        e.rate_limit_per_second,
                        opt_millis(e.failing_since),
                        e.disabled_reason,
                        to_millis(e.updated_at),
                    ],
                )
                .map_err(backend)?;
            if changed == 0 {
                return Err(StoreError::NotFound("endpoint"));
            }
            Ok(())
        })
        .await
    }

    async fn delete_endpoint(
        &self,
        account: &AccountId,
        id: &EndpointId,
        now: Timestamp,
    ) -> StoreResult<bool> {
        let (account, id) = (account.clone(), id.clone());
        self.run(move |conn| {
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            let deleted = tx
                .execute("DELETE FROM endpoints WHERE id = ?1 AND account_id = ?2", params![id.as_str(), account.as_str()])
                .map_err(backend)?;
            if deleted > 0 {
                tx.execute(
                    "UPDATE deliveries SET status = 'abandoned', next_try_at = NULL, last_error = 'endpoint deleted', updated_at = ?2 \
                     WHERE endpoint_id = ?1 AND status = 'pending'",
                    params![id.as_str(), to_millis(now)],
                )
                .map_err(backend)?;
            }
            tx.commit().map_err(backend)?;
            Ok(deleted > 0)
        })
        .await
    }

    async fn publish(&self, event: &Event, deliveries: &[Delivery]) -> StoreResult<PublishOutcome> {
        self.insert_event_and_deliveries(event, deliveries).await
    }

    async fn put_event(&self, event: &Event) -> StoreResult<PutEventOutcome> {
        // No change stream here: the event alone is a publish without deliveries.
        Ok(match self.publish(event, &[]).await? {
            PublishOutcome::Created => PutEventOutcome::Created,
            PublishOutcome::AlreadyExists { event, .. } => PutEventOutcome::AlreadyExists(event),
        })
    }

    async fn add_deliveries(&self, deliveries: &[Delivery]) -> StoreResult<Vec<Delivery>> {
        let deliveries = deliveries.to_vec();
        self.run(move |conn| {
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            let added = insert_deliveries(&tx, &deliveries).map_err(backend)?;
            tx.commit().map_err(backend)?;
            Ok(deliveries
                .into_iter()
                .zip(added)
                .filter_map(|(d, new)| new.then_some(d))
                .collect())
        })
        .await
    }

    async fn unfanned_events(
        &self,
        _after: Option<Timestamp>,
        _created_before: Timestamp,
        _limit: u32,
    ) -> StoreResult<super::UnfannedPage> {
        // No change stream: an event is written with its deliveries, never left to fan out.
        Ok(super::UnfannedPage::default())
    }

    async fn mark_fanned_out(&self, _events: &[Event]) -> StoreResult<()> {
        Ok(())
    }

    async fn get_event(&self, account: &AccountId, id: &EventId) -> StoreResult<Option<Event>> {
        let (account, id) = (account.clone(), id.clone());
        self.read(move |conn| {
            conn.query_row(
                "SELECT account_id, id, type, created_at, payload FROM events WHERE account_id = ?1 AND id = ?2",
                params![account.as_str(), id.as_str()],
                event_from_row,
            )
            .optional()
            .map_err(backend)
        })
        .await
    }

    async fn deliveries_of_event(&self, event: &Event) -> StoreResult<Vec<Delivery>> {
        let (account, id) = (event.account_id.clone(), event.id.clone());
        self.read(move |conn| {
            deliveries_of_event(conn, account.as_str(), id.as_str()).map_err(backend)
        })
        .await
    }

    async fn load_work(&self, delivery: &DeliveryId) -> StoreResult<Option<DeliveryWork>> {
        if let Some(work) = self.fresh.take(delivery) {
            return Ok(Some(work));
        }
        let generation = self.fresh.generation();
        let id = delivery.clone();
        let work = self.read(move |conn| {
            let Some(delivery) = conn
                .prepare_cached(&format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = ?1"))
                .and_then(|mut s| s.query_row(params![id.as_str()], delivery_from_row).optional())
                .map_err(backend)?
            else {
                return Ok(None);
            };
            let event = conn
                .prepare_cached("SELECT account_id, id, type, created_at, payload FROM events WHERE account_id = ?1 AND id = ?2")
                .and_then(|mut s| {
                    s.query_row(params![delivery.account_id.as_str(), delivery.event_id.as_str()], event_from_row)
                        .optional()
                })
                .map_err(backend)?;
            let endpoint = conn
                .prepare_cached(&format!("SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE id = ?1"))
                .and_then(|mut s| s.query_row(params![delivery.endpoint_id.as_str()], endpoint_from_row).optional())
                .map_err(backend)?;
            Ok(Some(DeliveryWork { delivery, event, endpoint }))
        })
        .await?;
        if let Some(endpoint) = work.as_ref().and_then(|w| w.endpoint.as_ref()) {
            self.fresh.remember_endpoint(generation, endpoint);
        }
        Ok(work)
    }

    async fn move_unattempted(
        &self,
        delivery: &DeliveryId,
        expected_attempts: u32,
        change: &Unattempted,
        now: Timestamp,
    ) -> StoreResult<bool> {
        let (id, change) = (delivery.clone(), change.clone());
        let (fresh, moved) = (Arc::clone(&self.fresh), delivery.clone());
        self.run_then(
            move |conn| {
                let changed = match change {
                    // One due time here, and the embedded dispatcher never defers (it takes
                    // only work whose endpoint has room): the next try moves.
                    Unattempted::Defer(until) => conn.execute(
                        "UPDATE deliveries SET next_try_at = ?3, updated_at = ?4 \
                         WHERE id = ?1 AND status = 'pending' AND attempts = ?2",
                        params![id.as_str(), expected_attempts, to_millis(until), to_millis(now)],
                    ),
                    Unattempted::Fail(reason) => conn.execute(
                        "UPDATE deliveries SET status = 'failed', next_try_at = NULL, last_error = ?3, \
                         updated_at = ?4 WHERE id = ?1 AND status = 'pending' AND attempts = ?2",
                        params![id.as_str(), expected_attempts, reason, to_millis(now)],
                    ),
                }
                .map_err(backend)?;
                Ok(changed > 0)
            },
            // Only this delivery changed.
            move |_| fresh.forget_delivery(&moved),
        )
        .await
    }

    async fn record_attempt(&self, record: &AttemptRecord) -> StoreResult<RecordOutcome> {
        let r = record.clone();
        let (fresh, attempted) = (Arc::clone(&self.fresh), record.attempt.delivery_id.clone());
        let forget = move |recorded: &StoreResult<(RecordOutcome, bool)>| match recorded {
            Ok((_, false)) => fresh.forget_delivery(&attempted),
            Ok((_, true)) | Err(_) => fresh.forget_all(),
        };
        let recorded = self.run_then(move |conn| {
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            let (status, next_try_at, last_error) = match &r.decision {
                Decision::Delivered => (DeliveryStatus::Delivered, None, None),
                Decision::RetryAt(at) => (DeliveryStatus::Pending, Some(to_millis(*at)), r.attempt.error.clone()),
                Decision::Failed { reason } => (
                    DeliveryStatus::Failed,
                    None,
                    Some(match &r.attempt.error {
                        Some(error) => format!("{error} ({reason})"),
                        None => reason.clone(),
                    }),
                ),
            };
            let delivery_created_at = tx
                .prepare_cached(
                    "UPDATE deliveries SET status = ?3, attempts = ?4, next_try_at = ?5, last_status = ?6, last_error = ?7, \
                     client_errors = ?8, updated_at = ?9, next_trigger = 'scheduled' \
                     WHERE id = ?1 AND status = 'pending' AND attempts = ?2 RETURNING created_at",
                )
                .and_then(|mut s| {
                    s.query_row(params![
                        r.attempt.delivery_id.as_str(),
                        r.expected_attempts,
                        status.as_str(),
                        r.attempt.number,
                        next_try_at,
                        r.attempt.status_code,
                        last_error,
                        r.client_error_count,
                        to_millis(r.now),
                    ], |row| row.get::<_, i64>(0))
                    .optional()
                })
                .map_err(backend)?;
            let Some(delivery_created_at) = delivery_created_at else {
                return Ok((RecordOutcome::Stale, false));
            };
            let headers = serde_json::to_string(&r.attempt.response_headers).unwrap_or_else(|_| "[]".into());
            tx.prepare_cached(&format!(
                "INSERT OR REPLACE INTO attempts (delivery_created_at, {ATTEMPT_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    delivery_created_at,
                    r.attempt.delivery_id.as_str(),
                    r.attempt.number,
                    r.attempt.trigger.as_str(),
                    to_millis(r.attempt.started_at),
                    i64::try_from(r.attempt.latency_ms).unwrap_or(i64::MAX),
                    r.attempt.status_code,
                    headers,
                    r.attempt.response_body,
                    r.attempt.response_body_truncated,
                    r.attempt.error,
                ])
            })
            .map_err(backend)?;
            // Health changes rarely: write the endpoint row only when the clock starts or stops,
            // not on every attempt.
            let (failing_since, endpoint_changed): (Option<i64>, bool) = if r.success {
                let changed = tx
                    .prepare_cached("UPDATE endpoints SET failing_since = NULL WHERE id = ?1 AND failing_since IS NOT NULL")
                    .and_then(|mut s| s.execute(params![r.endpoint_id.as_str()]))
                    .map_err(backend)?;
                (None, changed > 0)
            } else {
                let changed = tx
                    .prepare_cached("UPDATE endpoints SET failing_since = ?2 WHERE id = ?1 AND failing_since IS NULL")
                    .and_then(|mut s| s.execute(params![r.endpoint_id.as_str(), to_millis(r.now)]))
                    .map_err(backend)?;
                let since = tx
                    .prepare_cached("SELECT failing_since FROM endpoints WHERE id = ?1")
                    .and_then(|mut s| s.query_row(params![r.endpoint_id.as_str()], |row| row.get(0)).optional())
                    .map_err(backend)?
                    .flatten();
                (since, changed > 0)
            };
            tx.commit().map_err(backend)?;
            Ok((
                RecordOutcome::Recorded {
                    endpoint_failing_since: failing_since.map(from_millis),
                },
                endpoint_changed,
            ))
        }, forget)
        .await;
        recorded.map(|(outcome, _)| outcome)
    }

    async fn pending_deliveries(
        &self,
        due_before: Timestamp,
        after: Option<&DeliveryId>,
        limit: u32,
    ) -> StoreResult<Vec<PendingRef>> {
        let after = after.map(|a| a.as_str().to_owned());
        self.read(move |conn| {
            // Paging is by delivery id (unique) so a page boundary never skips rows.
            let mut stmt = conn
                .prepare_cached(
                    "SELECT d.id, d.endpoint_id, d.account_id, d.next_try_at, e.max_in_flight, e.rate_limit \
                     FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
                     WHERE d.status = 'pending' AND d.next_try_at <= ?1 AND d.id > ?2 AND e.status = 'active' \
                     ORDER BY d.id LIMIT ?3",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map(params![to_millis(due_before), after.unwrap_or_default(), limit], |row| {
                    let rate: Option<i64> = row.get(5)?;
                    Ok(PendingRef {
                        delivery_id: DeliveryId::from_trusted(row.get(0)?),
                        endpoint_id: EndpointId::from_trusted(row.get(1)?),
                        account_id: AccountId::from_trusted(row.get(2)?),
                        due: from_millis(row.get(3)?),
                        max_in_flight: u32_col(row, 4)?,
                        rate_limit_per_second: rate.and_then(|v| u32::try_from(v).ok()),
                    })
                })
                .map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    async fn get_delivery(
        &self,
        account: &AccountId,
        id: &DeliveryId,
    ) -> StoreResult<Option<Delivery>> {
        let (account, id) = (account.clone(), id.clone());
        self.read(move |conn| {
            conn.query_row(
                &format!(
                    "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = ?1 AND account_id = ?2"
                ),
                params![id.as_str(), account.as_str()],
                delivery_from_row,
            )
            .optional()
            .map_err(backend)
        })
        .await
    }

    async fn list_deliveries(
        &self,
        account: &AccountId,
        query: &DeliveryQuery,
    ) -> StoreResult<Page<Delivery>> {
        let (account, query) = (account.clone(), query.clone());
        self.read(move |conn| {
            let mut sql = format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE account_id = ?");
            let mut args: Vec<Value> = vec![Value::Text(account.as_str().to_owned())];
            if let Some(endpoint) = &query.endpoint_id {
                sql.push_str(" AND endpoint_id = ?");
                args.push(Value::Text(endpoint.as_str().to_owned()));
            }
            if let Some(status) = query.status {
                sql.push_str(" AND status = ?");
                args.push(Value::Text(status.as_str().to_owned()));
            }
            if let Some(event_type) = &query.event_type {
                sql.push_str(" AND event_type = ?");
                args.push(Value::Text(event_type.clone()));
            }
            if let Some(since) = query.since {
                sql.push_str(" AND created_at >= ?");
                args.push(Value::Integer(to_millis(since)));
            }
            if let Some(until) = query.until {
                sql.push_str(" AND created_at < ?");
                args.push(Value::Integer(to_millis(until)));
            }
            if let Some(code) = query.status_code {
                sql.push_str(" AND last_status = ?");
                args.push(Value::Integer(i64::from(code)));
            }
            if let Some(cursor) = &query.cursor {
                let (created, id) = decode_cursor(cursor).ok_or(StoreError::NotFound("cursor"))?;
                sql.push_str(" AND (created_at < ? OR (created_at = ? AND id < ?))");
                args.push(Value::Integer(created));
                args.push(Value::Integer(created));
                args.push(Value::Text(id));
            }
            let limit = query.limit.clamp(1, 500);
            sql.push_str(" ORDER BY created_at DESC, id DESC LIMIT ?");
            args.push(Value::Integer(i64::from(limit) + 1));
            let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
            let mut items = stmt
                .query_map(rusqlite::params_from_iter(args), delivery_from_row)
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?;
            let next_cursor = if items.len() > limit as usize {
                items.truncate(limit as usize);
                items.last().map(encode_cursor)
            } else {
                None
            };
            Ok(Page { items, next_cursor })
        })
        .await
    }

    async fn list_attempts(&self, delivery: &DeliveryId) -> StoreResult<Vec<Attempt>> {
        let id = delivery.clone();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {ATTEMPT_COLUMNS} FROM attempts \
                     WHERE delivery_created_at = (SELECT created_at FROM deliveries WHERE id = ?1) \
                     AND delivery_id = ?1 ORDER BY number"
                ))
                .map_err(backend)?;
            let rows = stmt
                .query_map(params![id.as_str()], attempt_from_row)
                .map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    async fn replay(&self, request: &ReplayRequest) -> StoreResult<ReplayOutcome> {
        let request = request.clone();
        self.run(move |conn| {
            let mut replay = request.replay;
            let filter = &replay.filter;
            let now = to_millis(replay.requested_at);
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            let mut sql = String::from(
                "SELECT d.id, d.endpoint_id, e.max_in_flight, e.rate_limit FROM deliveries d \
                 JOIN endpoints e ON e.id = d.endpoint_id \
                 WHERE d.account_id = ? AND e.status = 'active'",
            );
            let mut args: Vec<Value> = vec![Value::Text(replay.account_id.as_str().to_owned())];
            match &replay.scope {
                ReplayScope::Delivery(id) => {
                    sql.push_str(" AND d.id = ?");
                    args.push(Value::Text(id.as_str().to_owned()));
                }
                ReplayScope::Endpoint(id) => {
                    sql.push_str(" AND d.endpoint_id = ?");
                    args.push(Value::Text(id.as_str().to_owned()));
                }
            }
            let final_statuses: Vec<_> = filter.statuses.iter().filter(|s| s.is_final()).collect();
            sql.push_str(&format!(" AND d.status IN ({})", vec!["?"; final_statuses.len()].join(", ")));
            args.extend(final_statuses.iter().map(|s| Value::Text(s.as_str().to_owned())));
            if let Some(since) = filter.since {
                sql.push_str(" AND d.created_at >= ?");
                args.push(Value::Integer(to_millis(since)));
            }
            if let Some(until) = filter.until {
                sql.push_str(" AND d.created_at < ?");
                args.push(Value::Integer(to_millis(until)));
            }
            if !filter.event_types.is_empty() {
                sql.push_str(&format!(" AND d.event_type IN ({})", vec!["?"; filter.event_types.len()].join(", ")));
                args.extend(filter.event_types.iter().map(|t| Value::Text(t.as_str().to_owned())));
            }
            sql.push_str(" ORDER BY d.created_at, d.id LIMIT ?");
            args.push(Value::Integer(i64::from(request.limit) + 1));
            let mut matched = {
                let mut stmt = tx.prepare(&sql).map_err(backend)?;
                let rows = stmt
                    .query_map(rusqlite::params_from_iter(args), |row| {
                        let rate: Option<i64> = row.get(3)?;
                        Ok(PendingRef {
                            delivery_id: DeliveryId::from_trusted(row.get(0)?),
                            endpoint_id: EndpointId::from_trusted(row.get(1)?),
                            account_id: replay.account_id.clone(),
                            due: replay.requested_at,
                            max_in_flight: u32_col(row, 2)?,
                            rate_limit_per_second: rate.and_then(|v| u32::try_from(v).ok()),
                        })
                    })
                    .map_err(backend)?;
                rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)?
            };
            replay.more = matched.len() > request.limit as usize;
            matched.truncate(request.limit as usize);
            {
                let mut update = tx
                    .prepare_cached(
                        "UPDATE deliveries SET status = 'pending', next_try_at = ?2, schedule_start = attempts, \
                         client_errors = 0, next_trigger = 'manual', updated_at = ?2 \
                         WHERE id = ?1 AND status != 'pending'",
                    )
                    .map_err(backend)?;
                for item in &matched {
                    update.execute(params![item.delivery_id.as_str(), now]).map_err(backend)?;
                }
            }
            replay.count = u32::try_from(matched.len()).unwrap_or(u32::MAX);
            let (delivery_id, endpoint_id) = match &replay.scope {
                ReplayScope::Delivery(id) => (Some(id.as_str().to_owned()), None),
                ReplayScope::Endpoint(id) => (None, Some(id.as_str().to_owned())),
            };
            let event_types: Vec<&str> = filter.event_types.iter().map(EventType::as_str).collect();
            tx.execute(
                "INSERT INTO replays (id, account_id, actor, delivery_id, endpoint_id, since, until, statuses, \
                 event_types, requested_at, count, more) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                params![
                    replay.id.as_str(),
                    replay.account_id.as_str(),
                    replay.actor,
                    delivery_id,
                    endpoint_id,
                    opt_millis(filter.since),
                    opt_millis(filter.until),
                    statuses_json(&filter.statuses),
                    serde_json::to_string(&event_types).unwrap_or_else(|_| "[]".into()),
                    now,
                    replay.count,
                    replay.more,
                ],
            )
            .map_err(|e| {
                if is_unique_violation(&e) {
                    StoreError::Conflict { entity: "replay", id: replay.id.to_string() }
                } else {
                    backend(e)
                }
            })?;
            tx.commit().map_err(backend)?;
            Ok(ReplayOutcome { replay, queued: matched })
        })
        .await
    }

    async fn list_replays(
        &self,
        account: &AccountId,
        after: Option<&ReplayId>,
        limit: u32,
    ) -> StoreResult<Page<Replay>> {
        let account = account.clone();
        let after = after.map(|a| a.as_str().to_owned());
        self.run(move |conn| {
            let limit = limit.clamp(1, 500);
            // Replay ids are time-ordered, so id order is request order.
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, account_id, actor, delivery_id, endpoint_id, since, until, statuses, event_types, \
                     requested_at, count, more FROM replays WHERE account_id = ?1 AND (?2 IS NULL OR id < ?2) \
                     ORDER BY id DESC LIMIT ?3",
                )
                .map_err(backend)?;
            let mut items = stmt
                .query_map(params![account.as_str(), after, i64::from(limit) + 1], replay_from_row)
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?;
            let next_cursor = if items.len() > limit as usize {
                items.truncate(limit as usize);
                items.last().map(|r| r.id.as_str().to_owned())
            } else {
                None
            };
            Ok(Page { items, next_cursor })
        })
        .await
    }

    async fn failing_endpoints(&self, failing_before: Timestamp) -> StoreResult<Vec<Endpoint>> {
        self.run(move |conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE failing_since IS NOT NULL AND failing_since <= ?1 \
                     AND status = 'active' ORDER BY failing_since"
                ))
                .map_err(backend)?;
            let rows = stmt.query_map(params![to_millis(failing_before)], endpoint_from_row).map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    async fn disable_endpoint(
        &self,
        request: &DisableRequest,
    ) -> StoreResult<Option<DisableOutcome>> {
        let r = request.clone();
        self.run(move |conn| {
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            let changed = tx
                .execute(
                    "UPDATE endpoints SET status = 'disabled', disabled_reason = ?3, updated_at = ?4 \
                     WHERE id = ?1 AND account_id = ?2 AND status = 'active' AND failing_since IS ?5",
                    params![
                        r.endpoint_id.as_str(),
                        r.account_id.as_str(),
                        r.reason,
                        to_millis(r.now),
                        opt_millis(r.expected_failing_since)
                    ],
                )
                .map_err(backend)?;
            if changed == 0 {
                return Ok(None);
            }
            let abandoned = tx
                .execute(
                    "UPDATE deliveries SET status = 'abandoned', next_try_at = NULL, last_error = ?2, updated_at = ?3 \
                     WHERE endpoint_id = ?1 AND status = 'pending'",
                    params![r.endpoint_id.as_str(), format!("abandoned: {}", r.reason), to_millis(r.now)],
                )
                .map_err(backend)?;
            if let Some(n) = &r.notification {
                tx.execute(
                    "INSERT INTO notifications (id, account_id, recipient, subject, body, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![n.id, n.account_id.as_str(), n.recipient.as_str(), n.subject, n.body, to_millis(n.created_at)],
                )
                .map_err(backend)?;
            }
            if let Some((event, deliveries)) = &r.operational_event {
                insert_event(&tx, event).map_err(backend)?;
                insert_deliveries(&tx, deliveries).map_err(backend)?;
            }
            tx.commit().map_err(backend)?;
            Ok(Some(DisableOutcome {
                abandoned: u64::try_from(abandoned).unwrap_or(0),
            }))
        })
        .await
    }

    async fn unsent_notifications(&self, limit: u32) -> StoreResult<Vec<Notification>> {
        self.run(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, account_id, recipient, subject, body, created_at FROM notifications \
                     WHERE sent_at IS NULL ORDER BY created_at LIMIT ?1",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map(params![limit], |row| {
                    Ok(Notification {
                        id: row.get(0)?,
                        account_id: AccountId::from_trusted(row.get(1)?),
                        recipient: EmailAddress::from_trusted(row.get(2)?),
                        subject: row.get(3)?,
                        body: row.get(4)?,
                        created_at: from_millis(row.get(5)?),
                    })
                })
                .map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    async fn mark_notification_sent(&self, id: &str, now: Timestamp) -> StoreResult<()> {
        let id = id.to_owned();
        self.run(move |conn| {
            conn.execute(
                "UPDATE notifications SET sent_at = ?2 WHERE id = ?1",
                params![id, to_millis(now)],
            )
            .map_err(backend)?;
            Ok(())
        })
        .await
    }

    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        let key = key.to_owned();
        self.run(move |conn| {
            conn.query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |row| row.get(0),
            )
            .optional()
            .map_err(backend)
        })
        .await
    }

    async fn put_setting_if_absent(&self, key: &str, value: &str) -> StoreResult<String> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.run(move |conn| {
            conn.execute(
                "INSERT OR IGNORE INTO settings (key, value) VALUES (?1, ?2)",
                params![key, value],
            )
            .map_err(backend)?;
            conn.query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |row| row.get(0),
            )
            .map_err(backend)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract checks again on a file, where reads take the reader connection and a
    /// thread checkpoints the WAL (the in-memory store the contract suite uses has neither).
    #[tokio::test]
    async fn a_file_store_keeps_the_contract_with_its_reader_and_checkpoint_threads() {
        let dir = std::env::temp_dir().join(format!(
            "hooklane-sqlite-file-contract-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        macro_rules! on_fresh_files {
            ($($check:ident),* $(,)?) => {$(
                let store = SqliteStore::open(dir.join(concat!(stringify!($check), ".db"))).unwrap();
                crate::store::contract::$check(&store).await;
                drop(store);
            )*};
        }
        on_fresh_files!(
            accounts_and_endpoints,
            publish_is_idempotent_on_the_event_id,
            record_attempt_applies_once_per_expected_state,
            failed_is_final,
            pending_deliveries_page_by_id_and_skip_inactive_endpoints,
            list_deliveries_newest_first_with_filters_and_cursor,
            failing_endpoints_are_the_active_ones_failing_long_enough,
            disable_endpoint_is_conditional_and_complete,
            notification_outbox,
            settings_put_if_absent,
            delete_endpoint_abandons_pending_and_keeps_history,
            add_deliveries_adds_each_pair_once,
        );
        let store = SqliteStore::open(dir.join("replays.db")).unwrap();
        crate::store::replay_contract::replays_follow_the_contract(&store).await;
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn replays_follow_the_store_contract() {
        let store = SqliteStore::in_memory().unwrap();
        crate::store::replay_contract::replays_follow_the_contract(&store).await;
    }

    /// The deliveries table of the first release, before any column was added.
    const FIRST_RELEASE_DELIVERIES: &str =
        "CREATE TABLE deliveries (id TEXT PRIMARY KEY, account_id TEXT NOT NULL, event_id TEXT NOT NULL, \
         endpoint_id TEXT NOT NULL, event_type TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL, \
         next_try_at INTEGER, last_status INTEGER, last_error TEXT, client_errors INTEGER NOT NULL, \
         created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);";

    async fn poll_once<F: std::future::Future>(
        future: std::pin::Pin<&mut F>,
    ) -> std::task::Poll<F::Output> {
        let mut future = Some(future);
        std::future::poll_fn(|cx| {
            let future = future.take().expect("polled once");
            std::task::Poll::Ready(future.poll(cx))
        })
        .await
    }

    /// A store with one endpoint, which a first try has read (so the store keeps it), and
    /// a second event with its delivery, not yet published.
    async fn store_that_knows_its_endpoint() -> (SqliteStore, Endpoint, Event, Delivery) {
        use crate::store::contract::{account, delivery, endpoint, event, t0};
        let store = SqliteStore::in_memory().unwrap();
        store.create_account(&account("acme")).await.unwrap();
        let ep = endpoint("acme", "ep_a", t0());
        store.create_endpoint(&ep).await.unwrap();
        let (ev1, ev2) = (event("acme", "evt_1", t0()), event("acme", "evt_2", t0()));
        let (d1, d2) = (delivery(&ev1, &ep, t0()), delivery(&ev2, &ep, t0()));
        store
            .publish(&ev1, std::slice::from_ref(&d1))
            .await
            .unwrap();
        store.load_work(&d1.id).await.unwrap().unwrap();
        (store, ep, ev2, d2)
    }

    #[tokio::test]
    async fn a_first_try_takes_what_the_publish_wrote_without_reading_it() {
        let (store, _, ev2, d2) = store_that_knows_its_endpoint().await;
        store
            .publish(&ev2, std::slice::from_ref(&d2))
            .await
            .unwrap();
        // Behind the store's back (no store write does this), so the kept copy is not forgotten.
        store
            .run_then(
                |conn| {
                    conn.execute("UPDATE events SET payload = '{\"changed\":1}'", [])
                        .map_err(backend)
                },
                |_| {},
            )
            .await
            .unwrap();
        let kept = store.load_work(&d2.id).await.unwrap().unwrap();
        assert_eq!(
            kept.event.unwrap().payload,
            ev2.payload,
            "the first try used the kept copy"
        );
        let read = store.load_work(&d2.id).await.unwrap().unwrap();
        assert_eq!(
            read.event.unwrap().payload,
            "{\"changed\":1}",
            "a second load reads the database"
        );
    }

    #[tokio::test]
    async fn a_write_whose_caller_stopped_waiting_is_still_seen_by_the_next_first_try() {
        let (store, ep, ev2, d2) = store_that_knows_its_endpoint().await;
        let moved = Endpoint {
            url: EndpointUrl::parse("https://moved.example.com/hooks").unwrap(),
            ..ep.clone()
        };
        // Hold the store thread in a job of its own, so that the update is surely queued and
        // unanswered when it is dropped, as when an API client disconnects.
        let (started, has_started) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let mut holder = std::pin::pin!(store.run_then(
            move |_| {
                let _ = started.send(());
                let _ = released.recv();
                Ok(())
            },
            |_| {},
        ));
        assert!(poll_once(holder.as_mut()).await.is_pending());
        has_started.recv().unwrap();
        {
            let mut update = std::pin::pin!(store.update_endpoint(&moved));
            assert!(poll_once(update.as_mut()).await.is_pending());
        }
        release.send(()).unwrap();
        holder.await.unwrap();
        store
            .publish(&ev2, std::slice::from_ref(&d2))
            .await
            .unwrap();
        let work = store.load_work(&d2.id).await.unwrap().unwrap();
        assert_eq!(work.endpoint.unwrap().url, moved.url);
    }

    #[tokio::test]
    async fn an_older_file_keeps_its_attempts_in_the_time_ordered_table() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&format!(
            "{FIRST_RELEASE_DELIVERIES} \
             CREATE TABLE attempts (delivery_id TEXT NOT NULL, number INTEGER NOT NULL, trigger TEXT NOT NULL, \
             started_at INTEGER NOT NULL, latency_ms INTEGER NOT NULL, status_code INTEGER, \
             response_headers TEXT NOT NULL, response_body TEXT NOT NULL, response_body_truncated INTEGER NOT NULL, \
             error TEXT, PRIMARY KEY (delivery_id, number)); \
             INSERT INTO deliveries VALUES ('dlv_1', 'acme', 'evt_1', 'ep_1', 'a.b', 'pending', 2, 5000, 500, 'x', 0, 1000, 2); \
             INSERT INTO attempts VALUES ('dlv_1', 1, 'scheduled', 1000, 12, 500, '[]', 'no', 0, NULL); \
             INSERT INTO attempts VALUES ('dlv_1', 2, 'scheduled', 3000, 15, 503, '[]', 'later', 0, NULL);"
        ))
        .unwrap();
        let store = SqliteStore::init(conn, None, reads_on_the_store_thread).unwrap();
        let attempts = store
            .list_attempts(&DeliveryId::from_trusted("dlv_1".into()))
            .await
            .unwrap();
        assert_eq!(
            attempts
                .iter()
                .map(|a| (a.number, a.status_code, a.response_body.as_str()))
                .collect::<Vec<_>>(),
            vec![(1, Some(500), "no"), (2, Some(503), "later")]
        );
        let layout = store
            .run(|conn| table_columns(conn, "attempts").map_err(backend))
            .await
            .unwrap();
        assert_eq!(
            layout.first().map(String::as_str),
            Some("delivery_created_at")
        );
    }

    #[tokio::test]
    async fn an_older_file_gains_the_replay_columns() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&format!(
            "{FIRST_RELEASE_DELIVERIES} \
             INSERT INTO deliveries VALUES ('dlv_1', 'acme', 'evt_1', 'ep_1', 'a.b', 'failed', 3, NULL, 500, 'x', 0, 1, 2);"
        ))
        .unwrap();
        let store = SqliteStore::init(conn, None, reads_on_the_store_thread).unwrap();
        let delivery = store
            .run(|conn| {
                conn.query_row(
                    &format!("SELECT {DELIVERY_COLUMNS} FROM deliveries"),
                    [],
                    delivery_from_row,
                )
                .map_err(backend)
            })
            .await
            .unwrap();
        assert_eq!(delivery.schedule_start, 0);
        assert_eq!(delivery.next_trigger, Trigger::Scheduled);
    }
}
