//! The embedded store: one SQLite file in WAL mode.

use std::{
    fs::{File, OpenOptions},
    path::{Path, PathBuf},
    sync::{mpsc, Arc},
};

use rusqlite::{params, types::Value, Connection, OptionalExtension, Row};

use super::{
    AttemptRecord, DeliveryQuery, DeliveryWork, DisableOutcome, DisableRequest, DueCursor,
    EndpointDeletion, Notification, Page, PageAfter, PendingPage, PendingRef, PublishOutcome,
    PutEventOutcome, RecordOutcome, ReplayOutcome, ReplayRequest, StoreError, StoreResult,
    Unattempted, UnattemptedMove,
};
use crate::{
    clock::{from_millis, to_millis, Timestamp},
    domain::{
        endpoint::RetiringSecret,
        stats::{HourCount, LastFailure, STATS_KEPT},
        Account, AccountId, Attempt, Delivery, DeliveryId, DeliveryStatus, EmailAddress, Endpoint,
        EndpointId, EndpointStatus, EndpointUrl, EndpointVersion, Event, EventId, EventType,
        EventTypeFilter, MissedEvent, Replay, ReplayCandidate, ReplayFilter, ReplayId, ReplayScope,
        Trigger,
    },
    secrets::{SecretsAccess, SecretsCipher},
    signing::SigningSecret,
};

mod access;
mod accounts;
mod audit;
mod catalog;
mod checkpoint;
mod deliveries;
mod events;
mod fresh;
mod replay;
mod retention;
mod rows;
mod schema;
#[cfg(test)]
mod tests;
mod unfanned;
mod worker;

use checkpoint::*;
pub use retention::{PurgePace, Purged, SLICE_ROWS};
use rows::*;
use schema::*;
use worker::*;

/// The name of the one thread that writes, as `top -H` and `/proc/<pid>/task` show it: every
/// publish and every attempt's record waits for it, and `hooklane bench` prints how busy it
/// was.
pub const STORE_THREAD: &str = "sqlite-store";

/// Pending rows one read of the backlog gauge counts.
const BACKLOG_SLICE: u64 = 10_000;

/// How long a connection waits for a lock another holds before it answers an error.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The store thread's page cache, in KiB (SQLite's negative `cache_size`).
const STORE_CACHE_KIB: i64 = -8 * 1024;

/// SQLite owned by one thread. Callers queue jobs; the thread runs whatever has queued up
/// in one transaction (each job in its own savepoint) and answers after the commit, so a
/// busy server pays one commit for many writes and no thread hand-off per call.
#[derive(Clone)]
pub struct SqliteStore {
    jobs: mpsc::Sender<Job>,
    /// The jobs queued for the store thread that have not begun.
    queued: Arc<Queued>,
    /// Where the API's reads go (log pages, gets): a reader thread on its own connection
    /// for a file database (WAL lets it read while the store thread writes), the store
    /// thread in memory.
    reads: mpsc::Sender<Job>,
    /// Where the dispatcher reads what it sends: a reader of its own, so that a log page
    /// never waits behind the thousands of these a second a backlog makes.
    sends: mpsc::Sender<Job>,
    /// Where the dispatcher's scans go (window pages of up to thousands of rows, the
    /// backlog count): a second reader, so that a log page or the work for the next
    /// attempt never queues behind one.
    scans: mpsc::Sender<Job>,
    // Held for the life of the store: a second `serve` on the same file is refused.
    lock: Option<Arc<HeldLock>>,
    fresh: Arc<fresh::FreshWork>,
    /// Accounts whose events have been stored without their deliveries since the fan-out
    /// last looked.
    unfanned: Arc<unfanned::Signal>,
    /// `store::LIST_EXAMINE_BUDGET`, smaller in tests.
    list_examine_budget: usize,
    /// Where the last purge stopped.
    purge_mark: Arc<std::sync::Mutex<retention::PurgeMark>>,
    /// Seals endpoint signing secrets as they are written and opens them as they are read.
    secrets: SecretsCipher,
}

impl SqliteStore {
    /// Keeps the file's lock held: takes it again if its lock file was removed, and fails
    /// if another process took a new one meanwhile. `serve` checks every second.
    pub fn keep_lock(&self) -> StoreResult<()> {
        self.lock.as_ref().map_or(Ok(()), |lock| lock.keep())
    }

    /// Opens (creating if needed) the database file, refusing if another process has it
    /// open. Endpoint secrets are sealed with `secrets`.
    pub fn open(path: impl AsRef<Path>, secrets: SecretsCipher) -> StoreResult<Self> {
        let path = path.as_ref();
        let lock = HeldLock::new(path, acquire_lock(path)?);
        let open = || {
            Connection::open(path)
                .map_err(|e| StoreError::Backend(format!("cannot open {}: {e}", path.display())))
        };
        let conn = open()?;
        Self::init(conn, Some(lock), secrets, |conn, _| {
            let reader = |name: &str| -> StoreResult<mpsc::Sender<Job>> {
                let reader = open()?;
                reader.busy_timeout(BUSY_TIMEOUT).map_err(backend)?;
                reader
                    .pragma_update(None, "query_only", "ON")
                    .map_err(backend)?;
                // SQLite opens the WAL and its index at a connection's first read: done here,
                // a reader that cannot is an error at start, not at its first job.
                reader
                    .query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))
                    .map_err(backend)?;
                let (reads, queue) = mpsc::channel::<Job>();
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || run_reads(reader, queue))
                    .map_err(|e| StoreError::Backend(format!("cannot start {name}: {e}")))?;
                Ok(reads)
            };
            let reads = reader("sqlite-read")?;
            let sends = reader("sqlite-send")?;
            let scans = reader("sqlite-scan")?;
            let checkpointer = open()?;
            checkpointer
                .pragma_update(None, "synchronous", "NORMAL")
                .map_err(backend)?;
            conn.pragma_update(None, "wal_autocheckpoint", WAL_BACKSTOP_PAGES)
                .map_err(backend)?;
            let (commits, committed) = mpsc::sync_channel(1);
            let restart = Arc::new(Restart::default());
            let shared = Arc::clone(&restart);
            std::thread::Builder::new()
                .name("sqlite-checkpoint".into())
                .spawn(move || run_checkpoints(checkpointer, committed, &shared))
                .map_err(|e| {
                    StoreError::Backend(format!("cannot start the checkpoint thread: {e}"))
                })?;
            Ok(Helpers {
                reads,
                sends,
                scans,
                checkpoints: Some(Checkpoints { commits, restart }),
            })
        })
    }

    /// How many deliveries are pending and when the oldest of them was created: the
    /// backlog gauges of the embedded shape. Counted in slices of [`BACKLOG_SLICE`] rows in
    /// due order, each its own read: one count of a million rows held a read snapshot for
    /// over a second, and the store thread's WAL restart cannot go through while one is
    /// held. Rows that move while it counts may be counted twice or missed: a gauge.
    pub async fn backlog(&self) -> StoreResult<(u64, Option<Timestamp>)> {
        let (mut pending, mut oldest) = (0u64, None::<i64>);
        let mut after: (i64, String) = (i64::MIN, String::new());
        loop {
            let from = after.clone();
            let (rows, slice_oldest, last) = self
                .scan(move |conn| {
                    let mut stmt = conn
                        .prepare_cached(
                            "SELECT next_try_at, id, created_at FROM deliveries \
                             WHERE status = 'pending' AND (next_try_at, id) > (?1, ?2) \
                             ORDER BY next_try_at, id LIMIT ?3",
                        )
                        .map_err(backend)?;
                    let mut rows = stmt
                        .query(params![from.0, from.1, BACKLOG_SLICE])
                        .map_err(backend)?;
                    let (mut count, mut oldest, mut last) = (0u64, None::<i64>, None);
                    while let Some(row) = rows.next().map_err(backend)? {
                        let created: i64 = row.get(2).map_err(backend)?;
                        count += 1;
                        oldest = Some(oldest.map_or(created, |o| o.min(created)));
                        last = Some((row.get(0).map_err(backend)?, row.get(1).map_err(backend)?));
                    }
                    Ok((count, oldest, last))
                })
                .await?;
            pending += rows;
            oldest = oldest.into_iter().chain(slice_oldest).min();
            match last {
                Some(last) if rows >= BACKLOG_SLICE => after = last,
                _ => return Ok((pending, oldest.map(from_millis))),
            }
        }
    }

    /// A private in-memory database, for tests: its secrets are sealed with a key that
    /// lives as long as the process, as the database does.
    pub fn in_memory() -> StoreResult<Self> {
        let conn = Connection::open_in_memory().map_err(backend)?;
        let secrets = SecretsCipher::ephemeral().map_err(|e| StoreError::Backend(e.to_string()))?;
        Self::init(conn, None, secrets, reads_on_the_store_thread)
    }

    /// Opens every endpoint secret and seals again those that are plaintext (written before
    /// encryption) or sealed under a key other than the current one, in one transaction;
    /// returns how many endpoints changed. A secret that does not open (under a key the
    /// cipher does not have, altered, or moved from another endpoint) is an error naming
    /// the endpoint and the reason, and nothing changes. They are read first, without the
    /// write lock: usually none needs sealing again, and `serve` then starts while another
    /// process (a backup, the `sqlite3` shell) holds the lock.
    pub async fn reseal_secrets(&self) -> StoreResult<usize> {
        let cipher = self.secrets.clone();
        let needed = self
            .read(move |conn| Ok(resealed(conn, &cipher)?.len()))
            .await?;
        if needed == 0 {
            return Ok(0);
        }
        let cipher = self.secrets.clone();
        self.run(move |conn| {
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            // Again under the lock: what was read may have changed since.
            let changes = resealed(&tx, &cipher)?;
            for change in &changes {
                let (account, id) = (change.account.as_str(), change.id.as_str());
                if let Some((secret, retiring)) = &change.secrets {
                    tx.execute(
                        "UPDATE endpoints SET secret = ?3, retiring_secret = ?4 WHERE id = ?1 AND account_id = ?2",
                        params![id, account, secret, retiring],
                    )
                    .map_err(backend)?;
                }
                if let Some(headers) = &change.headers {
                    tx.execute(
                        "UPDATE endpoints SET headers = ?3 WHERE id = ?1 AND account_id = ?2",
                        params![id, account, headers],
                    )
                    .map_err(backend)?;
                }
            }
            tx.commit().map_err(backend)?;
            Ok(changes.len())
        })
        .await
    }

    /// With another bound on the deliveries one log page reads (`store::LIST_EXAMINE_BUDGET`):
    /// tests make short pages with a few rows.
    pub fn with_list_examine_budget(mut self, budget: usize) -> Self {
        self.list_examine_budget = budget.max(1);
        self
    }

    /// Sets the connection up and starts the store thread; `helpers` starts the reader and
    /// checkpoint threads of a file database and returns where reads go (given the store
    /// thread's queue) and where to signal commits.
    fn init(
        conn: Connection,
        lock: Option<HeldLock>,
        secrets: SecretsCipher,
        helpers: impl FnOnce(&Connection, &mpsc::Sender<Job>) -> StoreResult<Helpers>,
    ) -> StoreResult<Self> {
        // Before anything is written to it, even the journal mode.
        schema::schema_version(&conn)?;
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
        // The pages an insert or an attempt touches are spread over the indexes' per-endpoint
        // ranges (a few thousand hot leaves with a thousand endpoints): SQLite's default
        // 2 MiB cache re-read them from the file for every batch. 8 MiB kept W1's rate
        // where 16 MiB had it (A/B), for 8 MB less memory.
        conn.pragma_update(None, "cache_size", STORE_CACHE_KIB)
            .map_err(backend)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(backend)?;
        migrate(&conn)?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let Helpers {
            reads,
            sends,
            scans,
            checkpoints,
        } = helpers(&conn, &jobs)?;
        std::thread::Builder::new()
            .name(STORE_THREAD.into())
            .spawn(move || run_jobs(conn, queue, checkpoints))
            .map_err(|e| StoreError::Backend(format!("cannot start the store thread: {e}")))?;
        Ok(Self {
            jobs,
            queued: Arc::default(),
            reads,
            sends,
            scans,
            lock: lock.map(Arc::new),
            fresh: Arc::default(),
            unfanned: Arc::default(),
            list_examine_budget: super::LIST_EXAMINE_BUDGET,
            purge_mark: Arc::default(),
            secrets,
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
        Self::submit(
            self.store_thread(),
            (Lane::Shared, 1, false),
            work,
            move |_| fresh.forget_all(),
        )
        .await
    }

    /// [`SqliteStore::run`] for retention's writes, which remove nothing kept: ended
    /// deliveries with their attempts, events no pending delivery needs, sent notifications
    /// and old hour counts, never an account, an endpoint or pending work. Forgetting at
    /// each of a purge's slices had the publishes and first tries beside it read back what
    /// they had written.
    async fn run_forgetting_nothing<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        Self::submit(self.store_thread(), (Lane::Shared, 1, false), work, |_| {}).await
    }

    /// A read on the store thread, which sees every write acknowledged before it (the
    /// sweeper's reads of what it acts on): it changes nothing, so nothing kept is forgotten.
    async fn read_on_the_store_thread<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        Self::submit(self.store_thread(), (Lane::Shared, 0, false), work, |_| {}).await
    }

    /// [`SqliteStore::run`] for the two writes that keep [`fresh::FreshWork`] up to date
    /// themselves (a publish and an attempt), in `after_commit`.
    async fn run_then<T, F, A>(&self, work: F, after_commit: A) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
        A: FnOnce(&StoreResult<T>) + Send + 'static,
    {
        Self::submit(
            self.store_thread(),
            (Lane::Shared, 1, false),
            work,
            after_commit,
        )
        .await
    }

    /// [`SqliteStore::run_then`] for one account's traffic (a publish, an attempt) of
    /// about `rows` rows: the store thread takes the accounts' writes in turn. A `request`
    /// (a publish) is answered soon even beside a busy account's (see `Job::request`).
    async fn run_for<T, F, A>(
        &self,
        (lane, rows, request): (Lane, usize, bool),
        work: F,
        after_commit: A,
    ) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
        A: FnOnce(&StoreResult<T>) + Send + 'static,
    {
        Self::submit(
            self.store_thread(),
            (lane, rows, request),
            work,
            after_commit,
        )
        .await
    }

    /// Runs read-only `work` where reads go (see [`SqliteStore::reads`]).
    async fn read<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        Self::submit((&self.reads, None), (Lane::Shared, 0, false), work, |_| {}).await
    }

    /// Runs the dispatcher's read of what it sends where those go (see [`SqliteStore::sends`]).
    async fn read_for_send<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        Self::submit((&self.sends, None), (Lane::Shared, 0, false), work, |_| {}).await
    }

    /// Runs a read-only scan where scans go (see [`SqliteStore::scans`]).
    async fn scan<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        Self::submit((&self.scans, None), (Lane::Shared, 0, false), work, |_| {}).await
    }

    /// The store thread's queue, and its count of the jobs that have not begun.
    fn store_thread(&self) -> (&mpsc::Sender<Job>, Option<&Arc<Queued>>) {
        (&self.jobs, Some(&self.queued))
    }

    /// Queues `work`; `after_commit` runs on the store thread once the batch has committed
    /// (or failed to), before the answer is sent. There it is ordered with every other
    /// job's commit, and it runs even when the caller has stopped waiting (a client that
    /// disconnects drops its request's future).
    async fn submit<T, F, A>(
        (queue, queued): (&mpsc::Sender<Job>, Option<&Arc<Queued>>),
        (lane, rows, request): (Lane, usize, bool),
        work: F,
        after_commit: A,
    ) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
        A: FnOnce(&StoreResult<T>) + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let run: RunJob = Box::new(move |conn| {
            // None: the batch could not begin, and `work` does not run.
            let result = conn.map(work);
            Box::new(move |commit_error: Option<&StoreError>| {
                let result = match (commit_error, result) {
                    (None, Some(result)) => result,
                    // The job's own error says more: SQLite may have rolled the batch back
                    // because of it (a full disk), and its savepoint undid it anyway.
                    (Some(_), Some(Err(own))) => Err(own),
                    (Some(error), Some(Ok(_))) => {
                        Err(StoreError::Backend(format!("commit failed: {error}")))
                    }
                    (Some(error), None) => Err(StoreError::Backend(format!(
                        "not written, the store could not begin a transaction: {error}"
                    ))),
                    (None, None) => Err(StoreError::Backend("not written".into())),
                };
                after_commit(&result);
                let _ = answer.send(result);
            })
        });
        let job = Job {
            lane,
            rows,
            request,
            queued: queued.cloned(),
            run,
        };
        if let Some(queued) = queued {
            queued.add();
        }
        let stopped = || StoreError::Backend("the store thread has stopped".into());
        queue.send(job).map_err(|_| {
            if let Some(queued) = queued {
                queued.begun();
            }
            stopped()
        })?;
        answered.await.map_err(|_| stopped())?
    }
}

super::delegate_store!(SqliteStore);

/// An endpoint whose secrets or headers [`SqliteStore::reseal_secrets`] seals again, with
/// them sealed.
struct Resealed {
    account: AccountId,
    id: EndpointId,
    secrets: Option<(String, Option<String>)>,
    headers: Option<String>,
}

/// Every endpoint whose secrets or headers need sealing again. Every value is opened,
/// re-sealed or not: a start with the wrong key fails here, before serving, rather than at
/// the endpoint's next delivery.
fn resealed(conn: &Connection, cipher: &SecretsCipher) -> StoreResult<Vec<Resealed>> {
    type Row = (String, String, String, Option<String>, Option<String>);
    let rows: Vec<Row> = {
        let mut stmt = conn
            .prepare("SELECT id, account_id, secret, retiring_secret, headers FROM endpoints")
            .map_err(backend)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .map_err(backend)?;
        rows.collect::<rusqlite::Result<_>>().map_err(backend)?
    };
    let mut changes = Vec::new();
    for (id, account, secret, retiring, headers) in rows {
        let (account, id) = (
            AccountId::from_trusted(account),
            EndpointId::from_trusted(id),
        );
        let corrupt = |e: crate::secrets::SecretsError| {
            StoreError::Corrupt(format!("endpoint {id} of account {account}: {e}"))
        };
        let secrets = cipher
            .reseal((&secret, retiring.as_deref()), &account, &id)
            .map_err(corrupt)?;
        let headers = headers
            .map(|h| cipher.reseal_headers(&h, &account, &id))
            .transpose()
            .map_err(corrupt)?
            .flatten();
        if secrets.is_some() || headers.is_some() {
            changes.push(Resealed {
                account,
                id,
                secrets,
                headers,
            });
        }
    }
    Ok(changes)
}
