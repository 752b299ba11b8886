//! The store thread, the reader thread and the checkpointer: who owns which connection.

use super::rows::*;
use super::*;

/// Where reads and scans go, and the store thread's side of the checkpointer.
pub(super) type Helpers = (mpsc::Sender<Job>, mpsc::Sender<Job>, Option<Checkpoints>);

/// How the store thread and the checkpointer keep the WAL small.
pub(super) struct Checkpoints {
    /// Signalled after each commit (full means a checkpoint is already asked for).
    pub(super) commits: mpsc::SyncSender<()>,
    /// Set by the checkpointer when the WAL is past `WAL_RESTART_PAGES`.
    pub(super) restart: Arc<std::sync::atomic::AtomicBool>,
}

/// An in-memory database is private to its connection: reads share the store thread.
pub(super) fn reads_on_the_store_thread(
    _: &Connection,
    jobs: &mpsc::Sender<Job>,
) -> StoreResult<Helpers> {
    Ok((jobs.clone(), jobs.clone(), None))
}

/// The most jobs one transaction groups.
pub(super) const MAX_BATCH: usize = 256;

/// Sends a job's result once the transaction that ran it has committed (or failed to).
pub(super) type Reply = Box<dyn FnOnce(Option<&StoreError>) + Send>;
pub(super) type Job = Box<dyn FnOnce(&mut Connection) -> Reply + Send>;

/// Checkpoints the WAL into the database file from its own connection and thread, so
/// that copying pages and the fsyncs around it (a tenth of the store thread's time when it
/// did them itself) do not hold up the jobs. A passive checkpoint never blocks the writer.
/// Runs after commits, at most every `CHECKPOINT_PAUSE`; ends when the store thread does.
///
/// A passive checkpoint never moves the WAL back to its start, though: that needs the whole
/// WAL copied and no reader in it at the moment a write begins, which a server that writes
/// and reads all the time never has, so the file grew by every page written (851 MB in the
/// W5 outage) and the store thread's backstop checkpoint then ran after every commit. Past
/// `WAL_RESTART_PAGES` the checkpointer asks the store thread, the only writer, for a
/// RESTART checkpoint between two batches (see [`run_jobs`]).
pub(super) fn run_checkpoints(
    conn: Connection,
    commits: mpsc::Receiver<()>,
    restart: &std::sync::atomic::AtomicBool,
) {
    while commits.recv().is_ok() {
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            row.get::<_, i64>(1)
        }) {
            Ok(pages) if pages > WAL_RESTART_PAGES => {
                restart.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "WAL checkpoint failed; the store thread checkpoints past the backstop");
            }
        }
        std::thread::sleep(CHECKPOINT_PAUSE);
    }
}

/// WAL pages (4 KiB) past which the WAL is restarted: 32 MiB.
pub(super) const WAL_RESTART_PAGES: i64 = 8192;

/// The store thread's RESTART checkpoint: it copies what the checkpointer has not (little),
/// waits for the readers of the moment to finish (milliseconds), and starts the WAL over.
fn restart_wal(conn: &Connection) {
    match conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |row| {
        row.get::<_, i64>(0)
    }) {
        Ok(0) => {}
        Ok(_) => {
            tracing::debug!("WAL restart found readers busy; asked again after the next commits")
        }
        Err(error) => tracing::warn!(%error, "WAL restart checkpoint failed"),
    }
}

pub(super) const CHECKPOINT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// WAL pages after which the store thread checkpoints itself, should the checkpoint thread
/// fall behind (SQLite's default is 1000).
pub(super) const WAL_BACKSTOP_PAGES: i64 = 10_000;

/// Answers read-only jobs as soon as each has run: a read needs no commit, and on its own
/// connection it neither waits for the writer's batch nor adds to it. The jobs queued at
/// one time share one read transaction (one file lock instead of one per statement); it
/// starts after they were all queued, so each sees every write acknowledged before it.
pub(super) fn run_reads(mut conn: Connection, reads: mpsc::Receiver<Job>) {
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

pub(super) fn run_jobs(
    mut conn: Connection,
    jobs: mpsc::Receiver<Job>,
    checkpoints: Option<Checkpoints>,
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
        if let (Ok(()), Some(checkpoints)) = (&outcome, &checkpoints) {
            // Full means a checkpoint is already asked for.
            let _ = checkpoints.commits.try_send(());
        }
        let error = outcome.err();
        for reply in replies {
            reply(error.as_ref());
        }
        if let Some(checkpoints) = &checkpoints {
            if checkpoints
                .restart
                .swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                restart_wal(&conn);
            }
        }
    }
}

/// Runs a statement without parameters through the statement cache: the batch and
/// savepoint statements run for every job, and parsing them each time showed in profiles.
pub(super) fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// A job's savepoint inside the batch transaction, rolled back unless committed, so that
/// the rows one job writes stand or fall together. Like rusqlite's `Savepoint`, but over
/// cached statements.
pub(super) struct JobSavepoint<'a> {
    conn: &'a Connection,
    open: bool,
}

impl<'a> JobSavepoint<'a> {
    pub(super) fn begin(conn: &'a Connection) -> rusqlite::Result<Self> {
        run_cached(conn, "SAVEPOINT job")?;
        Ok(Self { conn, open: true })
    }

    pub(super) fn commit(mut self) -> rusqlite::Result<()> {
        self.open = false;
        run_cached(self.conn, "RELEASE job")
    }
}

pub(super) fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".lock");
    db.with_file_name(name)
}

pub(super) fn acquire_lock(db: &Path) -> StoreResult<File> {
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
