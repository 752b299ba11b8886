//! The store thread and the reader threads: who owns which connection, and how the store
//! thread batches the jobs (the checkpointer is in `checkpoint`).

use super::rows::*;
use super::*;

/// Where each kind of read goes, and the store thread's side of the checkpointer.
pub(super) struct Helpers {
    pub(super) reads: mpsc::Sender<Job>,
    pub(super) sends: mpsc::Sender<Job>,
    pub(super) scans: mpsc::Sender<Job>,
    pub(super) checkpoints: Option<Checkpoints>,
}

/// An in-memory database is private to its connection: reads share the store thread.
pub(super) fn reads_on_the_store_thread(
    _: &Connection,
    jobs: &mpsc::Sender<Job>,
) -> StoreResult<Helpers> {
    Ok(Helpers {
        reads: jobs.clone(),
        sends: jobs.clone(),
        scans: jobs.clone(),
        checkpoints: None,
    })
}

/// The most jobs one transaction groups.
pub(super) const MAX_BATCH: usize = 256;

/// The most rows (see [`Job::rows`]) one transaction groups, unless its first job alone is
/// more: a job is answered when its batch commits, and 32 batch publishes of 10,000
/// deliveries each would otherwise be one transaction that every other write waits for.
/// Smaller caps cost throughput for little: in the W5 outage a cap of 300 rows made
/// publishing a quarter slower and the healthy account's p99 a tenth lower.
pub(super) const MAX_BATCH_ROWS: usize = 2_048;

/// Sends a job's result once the transaction that ran it has committed (or failed to).
pub(super) type Reply = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// Runs a job and gives its reply; `None` when its batch could not begin a transaction:
/// the job then writes nothing and its reply carries that error.
pub(super) type RunJob = Box<dyn FnOnce(Option<&mut Connection>) -> Reply + Send>;

/// Work for a store, reader or scan thread.
pub(super) struct Job {
    /// Whose write this is: the store thread takes each account's jobs in turn.
    pub(super) lane: Lane,
    /// About how many rows it writes, to bound a batch.
    pub(super) rows: usize,
    /// Someone waits for its answer (a publish, or the deliveries an event's fan-out adds):
    /// from a quiet lane, it ends the running batch early (see [`run_jobs`]).
    pub(super) request: bool,
    /// The count of the store thread's jobs not yet begun, which this job is in until it
    /// begins (`None` for reads on their own threads).
    pub(super) queued: Option<Arc<Queued>>,
    pub(super) run: RunJob,
}

/// How many jobs are queued for the store thread and have not begun: whether a write is
/// waiting for the job that runs. A purge slice looks after each row, and ends there when
/// one is (see `retention`).
#[derive(Debug, Default)]
pub(super) struct Queued(std::sync::atomic::AtomicUsize);

impl Queued {
    /// Counts a job about to be queued.
    pub(super) fn add(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// A counted job has begun, or will never run (its queue is gone).
    pub(super) fn begun(&self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// How many jobs wait for the store thread.
    pub(super) fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Some job waits for the store thread.
    pub(super) fn any(&self) -> bool {
        self.count() > 0
    }
}

/// Whose write a job is. An account's publishes take turns apart from the rest of its
/// writes (the deliveries its events fan out to, its attempts' records), so that a publish,
/// which a client waits for, is queued behind neither.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Lane {
    /// Everything not of one account's traffic.
    Shared,
    /// An account's publishes.
    Publish(AccountId),
    /// The rest of an account's traffic.
    Account(AccountId),
}

impl Lane {
    #[cfg(test)]
    fn account(&self) -> Option<&str> {
        match self {
            Self::Shared => None,
            Self::Publish(account) | Self::Account(account) => Some(account.as_str()),
        }
    }
}

/// How long a batch runs before a quiet account's publish, queued since, ends it.
pub(super) const CUT_AFTER: std::time::Duration = std::time::Duration::from_millis(5);

/// A lane with at most this many rows queued is a quiet account's: see
/// [`Waiting::next_batch`]. A publish of one event to 50 endpoints is 51 rows, an attempt's
/// record 3.
pub(super) const QUIET_ROWS: usize = 128;

/// Jobs queued for the store thread, one queue per lane, taken in turn: an account that
/// publishes ten events a second is not answered after another's thousands of deliveries.
/// Within a lane, jobs run in the order they were queued.
#[derive(Default)]
pub(super) struct Waiting {
    lanes: std::collections::HashMap<Lane, LaneQueue>,
    turns: std::collections::VecDeque<Lane>,
    /// The last batch was the quiet lanes': the next is everyone's.
    quiet_went_last: bool,
    /// A quiet lane was queued a request's job since the last batch was taken.
    quiet_request: bool,
}

/// One lane's jobs and the rows they add up to.
#[derive(Default)]
struct LaneQueue {
    jobs: std::collections::VecDeque<Job>,
    rows: usize,
}

impl LaneQueue {
    fn push_back(&mut self, job: Job) {
        self.rows += job.rows;
        self.jobs.push_back(job);
    }

    fn push_front(&mut self, job: Job) {
        self.rows += job.rows;
        self.jobs.push_front(job);
    }

    fn pop_front(&mut self) -> Option<Job> {
        let job = self.jobs.pop_front()?;
        self.rows -= job.rows;
        Some(job)
    }

    fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

impl Waiting {
    pub(super) fn push(&mut self, job: Job) {
        // A lane is in `lanes` only while it has jobs, and then also in `turns`: a busy
        // account's next job clones nothing.
        if let Some(queue) = self.lanes.get_mut(&job.lane) {
            let request = job.request;
            queue.push_back(job);
            self.quiet_request |= request && queue.rows <= QUIET_ROWS;
            return;
        }
        self.quiet_request |= job.request && job.rows <= QUIET_ROWS;
        self.turns.push_back(job.lane.clone());
        let mut queue = LaneQueue::default();
        let lane = job.lane.clone();
        queue.push_back(job);
        self.lanes.insert(lane, queue);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// The next batch: a job from each lane in turn, up to `max_jobs` jobs and `max_rows`
    /// rows (a first job larger than that is a batch alone). A lane whose job did not fit
    /// is first next time.
    ///
    /// A job is answered when its batch commits, so a healthy account's publish waited for
    /// a whole batch of an outage's thousands of rows. When quiet lanes (at most
    /// [`QUIET_ROWS`] queued) wait beside busy ones, their jobs are a batch of their own
    /// first, committed in a millisecond or two; the batch after that is everyone's, so a
    /// stream of quiet jobs cannot hold the busy lanes up.
    pub(super) fn next_batch(&mut self, max_jobs: usize, max_rows: usize) -> Vec<Job> {
        self.quiet_request = false;
        if !std::mem::take(&mut self.quiet_went_last) {
            let quiet = self.quiet_batch(max_jobs, max_rows);
            if !quiet.is_empty() {
                self.quiet_went_last = true;
                return quiet;
            }
        }
        let mut batch = Vec::new();
        let mut rows = 0;
        while batch.len() < max_jobs {
            let Some(lane) = self.turns.pop_front() else {
                break;
            };
            let Some(queue) = self.lanes.get_mut(&lane) else {
                continue;
            };
            let Some(job) = queue.pop_front() else {
                self.lanes.remove(&lane);
                continue;
            };
            if !batch.is_empty() && rows + job.rows > max_rows {
                queue.push_front(job);
                self.turns.push_front(lane);
                break;
            }
            rows += job.rows;
            batch.push(job);
            if queue.is_empty() {
                self.lanes.remove(&lane);
            } else {
                self.turns.push_back(lane);
            }
        }
        batch
    }

    /// Whether the running batch, everyone's, should commit what it has run so far: a
    /// quiet lane has since been queued a request's job, which the quiet batch after it
    /// then answers. The quiet batch itself is never cut: it is short.
    pub(super) fn a_quiet_request_waits(&self) -> bool {
        self.quiet_request && !self.quiet_went_last
    }

    /// Gives back jobs a cut batch did not run, first in their lanes and in their order.
    pub(super) fn put_back(&mut self, unrun: Vec<Job>) {
        for job in unrun.into_iter().rev() {
            if let Some(queue) = self.lanes.get_mut(&job.lane) {
                queue.push_front(job);
                continue;
            }
            let lane = job.lane.clone();
            self.turns.push_front(lane.clone());
            let mut queue = LaneQueue::default();
            queue.push_front(job);
            self.lanes.insert(lane, queue);
        }
    }

    /// Every job of the quiet lanes (within `max_jobs` and `max_rows`), if a lane that is
    /// not quiet waits too (else the usual batch is the same thing).
    fn quiet_batch(&mut self, max_jobs: usize, max_rows: usize) -> Vec<Job> {
        self.quiet_lanes(max_jobs, max_rows, false)
    }

    /// Every job of the quiet lanes (within `max_jobs` and `max_rows`), and nothing of the
    /// others: the batches while a WAL restart holds the busy lanes back.
    pub(super) fn quiet_only(&mut self, max_jobs: usize, max_rows: usize) -> Vec<Job> {
        self.quiet_request = false;
        let batch = self.quiet_lanes(max_jobs, max_rows, true);
        // The batch after the hold is everyone's: the busy lanes have waited all of it.
        self.quiet_went_last |= !batch.is_empty();
        batch
    }

    fn quiet_lanes(&mut self, max_jobs: usize, max_rows: usize, alone: bool) -> Vec<Job> {
        let (mut jobs, mut rows) = (0, 0);
        let mut quiet = Vec::new();
        for lane in &self.turns {
            let Some(queue) = self.lanes.get(lane) else {
                continue;
            };
            if queue.rows <= QUIET_ROWS
                && jobs + queue.jobs.len() <= max_jobs
                && rows + queue.rows <= max_rows
            {
                jobs += queue.jobs.len();
                rows += queue.rows;
                quiet.push(lane.clone());
            }
        }
        if quiet.is_empty() || (!alone && quiet.len() == self.turns.len()) {
            return Vec::new();
        }
        let batch = quiet
            .iter()
            .filter_map(|lane| self.lanes.remove(lane))
            .flat_map(|queue| queue.jobs)
            .collect();
        // Membership, not a search of `quiet`: thousands of quiet accounts stay linear.
        self.turns.retain(|lane| self.lanes.contains_key(lane));
        batch
    }
}

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
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (job.run)(Some(&mut conn))
            })) {
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
    let mut waiting = Waiting::default();
    // Since when the busy lanes are held back for a WAL restart (see `run_checkpoints`).
    let mut hold: Option<std::time::Instant> = None;
    loop {
        if let (Some(since), Some(checkpoints)) = (hold, &checkpoints) {
            if checkpoints.end_hold(&conn, since) {
                hold = None;
            }
        }
        let batch = if hold.is_some() {
            while let Ok(job) = jobs.try_recv() {
                waiting.push(job);
            }
            let quiet = waiting.quiet_only(MAX_BATCH, MAX_BATCH_ROWS);
            if quiet.is_empty() {
                // The busy lanes wait for the checkpointer, which is looked at every poll.
                match jobs.recv_timeout(HOLD_POLL) {
                    Ok(job) => waiting.push(job),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        // Shutting down: what is queued is written, no restart first.
                        if let Some(checkpoints) = &checkpoints {
                            checkpoints.drop_hold();
                        }
                        hold = None;
                        if waiting.is_empty() {
                            break;
                        }
                    }
                }
                continue;
            }
            quiet
        } else {
            if waiting.is_empty() {
                match jobs.recv() {
                    Ok(job) => waiting.push(job),
                    Err(_) => break,
                }
            }
            while let Ok(job) = jobs.try_recv() {
                waiting.push(job);
            }
            waiting.next_batch(MAX_BATCH, MAX_BATCH_ROWS)
        };
        let mut batch = batch.into_iter();
        let began = run_cached(&conn, "BEGIN IMMEDIATE").map_err(backend);
        let started = std::time::Instant::now();
        let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
        for job in batch.by_ref() {
            if let Some(queued) = &job.queued {
                queued.begun();
            }
            // Without a transaction a job's writes would each commit on their own, and it
            // would still be answered with the batch's failure: it is answered unrun.
            let within = began.is_ok().then_some(&mut conn);
            replies.push(
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.run)(within)))
                    .unwrap_or_else(|_| {
                        tracing::error!("a store job panicked; its caller gets an error");
                        Box::new(|_| {})
                    }),
            );
            // SQLite rolls the whole transaction back on some errors (a full disk, an I/O
            // error in a statement without a journal of its own). The jobs after it would
            // each commit on their own, answered with the batch's failure: they wait for
            // the next batch instead.
            if began.is_ok() && conn.is_autocommit() {
                break;
            }
            // A publish waits for the commit of the batch running when it came, which took
            // up to a quarter of a second in the W5 outage: past `CUT_AFTER`, a quiet
            // account's publish has the batch commit what it ran, and goes next.
            if started.elapsed() >= CUT_AFTER {
                while let Ok(job) = jobs.try_recv() {
                    waiting.push(job);
                }
                if waiting.a_quiet_request_waits() {
                    break;
                }
            }
        }
        waiting.put_back(batch.collect());
        let outcome = began.and_then(|()| run_cached(&conn, "COMMIT").map_err(backend));
        if outcome.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        if let (Ok(()), Some(checkpoints)) = (&outcome, &checkpoints) {
            checkpoints.committed();
        }
        let error = outcome.err();
        for reply in replies {
            reply(error.as_ref());
        }
        if let (None, Some(checkpoints)) = (hold, &checkpoints) {
            hold = checkpoints.begin_hold();
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

/// The lock file held for the life of a store, and the database it guards.
#[derive(Debug)]
pub(super) struct HeldLock {
    db: PathBuf,
    file: std::sync::Mutex<File>,
}

impl HeldLock {
    pub(super) fn new(db: &Path, file: File) -> Self {
        Self {
            db: db.to_owned(),
            file: std::sync::Mutex::new(file),
        }
    }

    /// Takes the lock again if its file was removed or replaced (an operator cleaning up):
    /// a second process started later finds it held. One that started in between holds the
    /// new file: that is an error naming both.
    pub(super) fn keep(&self) -> StoreResult<()> {
        use std::os::unix::fs::MetadataExt;
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let path = lock_path(&self.db);
        let held = file.metadata().map_err(|e| {
            StoreError::Backend(format!("cannot read lock file {}: {e}", path.display()))
        })?;
        if let Ok(now) = std::fs::metadata(&path) {
            if (now.dev(), now.ino()) == (held.dev(), held.ino()) {
                return Ok(());
            }
        }
        match acquire_lock(&self.db) {
            Ok(again) => {
                *file = again;
                tracing::warn!(lock = %path.display(), "the lock file was removed or replaced; it is held again");
                Ok(())
            }
            Err(StoreError::Locked(_)) => Err(StoreError::Locked(format!(
                "the lock file {} was removed and another process now holds a new one: two processes use {}; stop one",
                path.display(),
                self.db.display()
            ))),
            Err(other) => Err(other),
        }
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A job of `lane`, `rows` long, that does nothing.
    pub(in crate::store::sqlite) fn job(lane: Option<&str>, rows: usize) -> Job {
        Job {
            lane: lane.map_or(Lane::Shared, |a| {
                Lane::Account(AccountId::from_trusted(a.into()))
            }),
            rows,
            request: false,
            queued: None,
            run: Box::new(|_| Box::new(|_| {})),
        }
    }

    fn lanes(batch: &[Job]) -> Vec<(Option<&str>, usize)> {
        batch.iter().map(|j| (j.lane.account(), j.rows)).collect()
    }

    #[test]
    fn accounts_take_turns_and_each_keeps_its_order() {
        let mut waiting = Waiting::default();
        // An outage's account has queued its publishes before the healthy account's one.
        for rows in [101, 102, 103, 104] {
            waiting.push(job(Some("down"), rows));
        }
        waiting.push(job(Some("ok"), 150));
        waiting.push(job(None, 200));
        waiting.push(job(Some("ok"), 151));
        let batch = waiting.next_batch(4, 10_000);
        assert_eq!(
            lanes(&batch),
            [
                (Some("down"), 101),
                (Some("ok"), 150),
                (None, 200),
                (Some("down"), 102)
            ]
        );
        let batch = waiting.next_batch(10, 10_000);
        assert_eq!(
            lanes(&batch),
            [(Some("ok"), 151), (Some("down"), 103), (Some("down"), 104)]
        );
        assert!(waiting.is_empty());
        assert!(waiting.next_batch(10, 10_000).is_empty());
    }

    #[test]
    fn a_quiet_accounts_job_is_committed_before_the_busy_lanes_next_batch_but_not_twice_running() {
        let mut waiting = Waiting::default();
        for rows in [101, 3, 3, 101] {
            waiting.push(job(Some("down"), rows));
        }
        waiting.push(job(Some("ok"), 11));
        waiting.push(job(None, 1));
        let batch = waiting.next_batch(256, 2_048);
        assert_eq!(lanes(&batch), [(Some("ok"), 11), (None, 1)], "alone");
        // Another quiet job comes: the busy lane's turn is first.
        waiting.push(job(Some("ok"), 12));
        let batch = waiting.next_batch(256, 2_048);
        assert_eq!(
            lanes(&batch),
            [
                (Some("down"), 101),
                (Some("ok"), 12),
                (Some("down"), 3),
                (Some("down"), 3),
                (Some("down"), 101)
            ]
        );
        // A quiet lane's jobs all go, in their order; a lane past QUIET_ROWS is not quiet.
        waiting.push(job(Some("down"), 101));
        waiting.push(job(Some("down"), 101));
        waiting.push(job(Some("ok"), 11));
        waiting.push(job(Some("ok"), 3));
        waiting.push(job(Some("big"), QUIET_ROWS + 1));
        let batch = waiting.next_batch(256, 2_048);
        assert_eq!(lanes(&batch), [(Some("ok"), 11), (Some("ok"), 3)]);
        let batch = waiting.next_batch(256, 2_048);
        assert_eq!(batch.len(), 3, "{:?}", lanes(&batch));
        // Quiet lanes past the batch's bounds wait for the next.
        waiting.push(job(Some("down"), 201));
        for account in ["q1", "q2", "q3"] {
            waiting.push(job(Some(account), 3));
            waiting.push(job(Some(account), 3));
        }
        let batch = waiting.next_batch(4, 2_048);
        assert_eq!(
            lanes(&batch),
            [
                (Some("q1"), 3),
                (Some("q1"), 3),
                (Some("q2"), 3),
                (Some("q2"), 3)
            ]
        );
        let batch = waiting.next_batch(4, 2_048);
        assert_eq!(
            lanes(&batch),
            [(Some("down"), 201), (Some("q3"), 3), (Some("q3"), 3)]
        );
    }

    #[test]
    fn while_a_wal_restart_holds_the_busy_lanes_only_the_quiet_ones_are_taken() {
        let mut waiting = Waiting::default();
        waiting.push(job(Some("down"), QUIET_ROWS + 1));
        assert!(
            waiting.quiet_only(256, 2_048).is_empty(),
            "only a busy lane"
        );
        waiting.push(job(Some("ok"), 2));
        waiting.push(job(None, 1));
        waiting.push(job(Some("ok"), 3));
        let batch = waiting.quiet_only(256, 2_048);
        assert_eq!(lanes(&batch), [(Some("ok"), 2), (Some("ok"), 3), (None, 1)]);
        let batch = waiting.next_batch(256, 2_048);
        assert_eq!(
            lanes(&batch),
            [(Some("down"), QUIET_ROWS + 1)],
            "after the hold"
        );
        // With no busy lane, every quiet one goes (the usual quiet batch takes none then).
        waiting.push(job(Some("q1"), 3));
        waiting.push(job(Some("q2"), 3));
        assert_eq!(waiting.quiet_only(256, 2_048).len(), 2);
        assert!(waiting.is_empty());
    }

    fn request(lane: &str, rows: usize) -> Job {
        Job {
            request: true,
            ..job(Some(lane), rows)
        }
    }

    #[test]
    fn only_a_quiet_lanes_request_cuts_everyones_batch_and_what_was_not_run_goes_first() {
        let mut waiting = Waiting::default();
        for rows in [101, 102, 103] {
            waiting.push(job(Some("down"), rows));
        }
        let batch = waiting.next_batch(256, 2_048);
        assert_eq!(batch.len(), 3);
        // More of the busy account's work, and its own publish: its lane is not quiet.
        waiting.push(job(Some("down"), 104));
        waiting.push(request("down", 105));
        assert!(!waiting.a_quiet_request_waits(), "the busy lane's publish");
        waiting.push(job(Some("calm"), 3));
        assert!(!waiting.a_quiet_request_waits(), "not a request");
        waiting.push(request("calm", 11));
        assert!(waiting.a_quiet_request_waits());
        // The batch stops after its first job: the others go back, first in their lane.
        let mut batch = batch.into_iter();
        batch.next();
        waiting.put_back(batch.collect());
        let quiet = waiting.next_batch(256, 2_048);
        assert_eq!(lanes(&quiet), [(Some("calm"), 3), (Some("calm"), 11)]);
        assert!(
            !waiting.a_quiet_request_waits(),
            "the quiet batch is not cut"
        );
        waiting.push(request("other", 11));
        assert!(!waiting.a_quiet_request_waits(), "nor cut while it runs");
        let rest = waiting.next_batch(256, 2_048);
        assert_eq!(
            lanes(&rest),
            [
                (Some("down"), 102),
                (Some("other"), 11),
                (Some("down"), 103),
                (Some("down"), 104),
                (Some("down"), 105)
            ]
        );
        assert!(waiting.is_empty());
    }

    #[test]
    fn a_batch_stops_at_its_rows_and_a_larger_job_goes_alone_first_next_time() {
        let mut waiting = Waiting::default();
        waiting.push(job(Some("a"), 600));
        waiting.push(job(Some("b"), 5_000));
        waiting.push(job(Some("c"), 300));
        let batch = waiting.next_batch(10, 1_000);
        assert_eq!(lanes(&batch), [(Some("a"), 600)]);
        let batch = waiting.next_batch(10, 1_000);
        assert_eq!(
            lanes(&batch),
            [(Some("b"), 5_000)],
            "alone, and not skipped"
        );
        let batch = waiting.next_batch(10, 1_000);
        assert_eq!(lanes(&batch), [(Some("c"), 300)]);
    }
}
