//! The checkpointer: the thread that copies the WAL into the database file, and the WAL
//! restart it asks the store thread for (see [`run_checkpoints`]).

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// How the store thread and the checkpointer keep the WAL small.
pub(super) struct Checkpoints {
    /// Signalled after each commit (full means a checkpoint is already asked for).
    pub(super) commits: mpsc::SyncSender<()>,
    pub(super) restart: Arc<Restart>,
}

/// The two threads' side of a WAL restart (see [`run_checkpoints`] and [`run_jobs`]).
pub(super) struct Restart {
    /// Set by the checkpointer when the WAL is past `WAL_RESTART_PAGES`.
    wanted: AtomicBool,
    /// Set by the store thread while it holds the busy lanes back for the restart.
    holding: AtomicBool,
    /// Set by the checkpointer once it has stopped passing for the hold: caught up, or
    /// outpaced, or told to give up.
    caught_up: AtomicBool,
    /// Set by the store thread when the hold has lasted `hold_max`: the checkpointer makes
    /// no further pass (one running is let finish: a RESTART beside it would give up).
    give_up: AtomicBool,
    hold_max: std::time::Duration,
    /// The checkpointer's thread, woken from its pause by a hold.
    checkpointer: std::sync::OnceLock<std::thread::Thread>,
}

impl Default for Restart {
    fn default() -> Self {
        Self::holding_at_most(HOLD_MAX)
    }
}

impl Restart {
    pub(super) fn holding_at_most(hold_max: std::time::Duration) -> Self {
        Self {
            wanted: AtomicBool::new(false),
            holding: AtomicBool::new(false),
            caught_up: AtomicBool::new(false),
            give_up: AtomicBool::new(false),
            hold_max,
            checkpointer: std::sync::OnceLock::new(),
        }
    }
}

/// The store thread's side of a restart: [`run_jobs`] holds the busy lanes back from
/// [`Checkpoints::begin_hold`] until [`Checkpoints::end_hold`] says it is over.
impl Checkpoints {
    /// After a commit: the checkpointer makes a pass (full means one is already asked for).
    pub(super) fn committed(&self) {
        let _ = self.commits.try_send(());
    }

    /// Between batches, outside a hold: begins one if the checkpointer asked for a restart,
    /// and returns when.
    pub(super) fn begin_hold(&self) -> Option<std::time::Instant> {
        let restart = &self.restart;
        if !restart.wanted.swap(false, Ordering::AcqRel) {
            return None;
        }
        restart.caught_up.store(false, Ordering::Release);
        restart.give_up.store(false, Ordering::Release);
        restart.holding.store(true, Ordering::Release);
        // Wakes the checkpointer from its pause, and for its pass if no commit has.
        self.committed();
        if let Some(checkpointer) = restart.checkpointer.get() {
            checkpointer.unpark();
        }
        Some(std::time::Instant::now())
    }

    /// During a hold begun `since`: past `hold_max` the checkpointer is told to give up;
    /// once it has caught up, or past twice `hold_max`, the WAL is restarted and the hold
    /// ends. Returns whether it has.
    pub(super) fn end_hold(&self, conn: &Connection, since: std::time::Instant) -> bool {
        let restart = &self.restart;
        let (done, held) = (restart.caught_up.load(Ordering::Acquire), since.elapsed());
        if !done && held >= restart.hold_max {
            restart.give_up.store(true, Ordering::Release);
        }
        if !(done || held >= restart.hold_max * 2) {
            return false;
        }
        let _ = restart_wal(conn);
        // Asked for again during the hold, by a pass that began before it.
        restart.wanted.store(false, Ordering::Release);
        restart.holding.store(false, Ordering::Release);
        true
    }

    /// Shutting down during a hold: what is queued is written, with no restart first.
    pub(super) fn drop_hold(&self) {
        self.restart.holding.store(false, Ordering::Release);
    }
}

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
/// RESTART checkpoint between two batches.
///
/// The RESTART copies what no pass has yet, while every write waits. In the W5 outage the
/// writer outpaced the passes, and each restart copied 1,000–8,000 frames in 50–170 ms,
/// once a second: the healthy account's publishes waited behind it. So the store thread
/// first holds back the busy lanes and goes on with the quiet ones (see [`run_jobs`]),
/// and the checkpointer, seeing the hold, passes until it has caught up: the RESTART then
/// has next to nothing to copy.
pub(super) fn run_checkpoints(conn: Connection, commits: mpsc::Receiver<()>, restart: &Restart) {
    // The WAL's frames, and those copied into the database file.
    let pass = || {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
        })
    };
    let _ = restart.checkpointer.set(std::thread::current());
    while commits.recv().is_ok() {
        if restart.holding.load(Ordering::Acquire) {
            catch_up_passes(|| {
                if restart.give_up.load(Ordering::Acquire) {
                    return None;
                }
                pass().ok()
            });
            restart.caught_up.store(true, Ordering::Release);
            // No pass while the store thread restarts: its RESTART would find the
            // checkpoint lock taken and give up.
            let since = std::time::Instant::now();
            while restart.holding.load(Ordering::Acquire) && since.elapsed() < restart.hold_max * 4
            {
                std::thread::sleep(HOLD_POLL);
            }
        } else {
            match pass() {
                // Not during a hold that began while this pass ran: that restart answers it.
                Ok((pages, _))
                    if pages > WAL_RESTART_PAGES && !restart.holding.load(Ordering::Acquire) =>
                {
                    restart.wanted.store(true, Ordering::Release);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "WAL checkpoint failed; the store thread checkpoints past the backstop");
                }
            }
        }
        // The pause between passes (after a hold too), cut short by a hold: the store
        // thread unparks this thread when one begins.
        let since = std::time::Instant::now();
        while !restart.holding.load(Ordering::Acquire) {
            let Some(left) = CHECKPOINT_PAUSE.checked_sub(since.elapsed()) else {
                break;
            };
            std::thread::park_timeout(left);
        }
    }
}

/// [`run_checkpoints`]' passes during a hold: `pass` checkpoints and returns the WAL's
/// frames and those copied (`None` when it failed or the hold gave up). They stop once
/// what a RESTART would be left to copy is at most [`CAUGHT_UP_FRAMES`]: what the last
/// pass could not copy (a reader's snapshot holds it back) and about as much as was written
/// while it ran (the quiet lanes still write). They stop too once a pass finds no fewer new
/// frames than the one before (the writes keep pace: the RESTART copies the rest), and
/// after [`CATCH_UP_PASSES`]. Returns how many passes ran.
pub(super) fn catch_up_passes(mut pass: impl FnMut() -> Option<(i64, i64)>) -> usize {
    let Some((mut log, _)) = pass() else {
        return 1;
    };
    let mut before = i64::MAX;
    for ran in 2..=CATCH_UP_PASSES {
        let Some((now, copied)) = pass() else {
            return ran;
        };
        let new = now - log;
        log = now;
        if (now - copied) + new <= CAUGHT_UP_FRAMES || new >= before {
            return ran;
        }
        before = new;
    }
    CATCH_UP_PASSES
}

/// Frames a RESTART may be left to copy for the WAL to count as caught up.
pub(super) const CAUGHT_UP_FRAMES: i64 = 64;

/// Passes of a hold at most: under writes that outpace them, the RESTART copies the rest.
pub(super) const CATCH_UP_PASSES: usize = 5;

/// How long the store thread holds the busy lanes back before it tells the checkpointer to
/// make no further pass (see [`Restart::give_up`]); past twice this it restarts whatever
/// the checkpointer does, copying what is left.
pub(super) const HOLD_MAX: std::time::Duration = std::time::Duration::from_millis(250);

/// How often a thread waiting on the other during a hold looks again.
pub(super) const HOLD_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// WAL pages (4 KiB) past which the WAL is restarted: 32 MiB.
pub(super) const WAL_RESTART_PAGES: i64 = 8192;

/// The store thread's RESTART checkpoint: it copies what the checkpointer has not (little),
/// waits up to [`RESTART_WAIT`] for the readers of the moment to finish, and starts the WAL
/// over. Returns whether it did.
pub(super) fn restart_wal(conn: &Connection) -> bool {
    let _ = conn.busy_timeout(RESTART_WAIT);
    let restarted = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |row| {
        row.get::<_, i64>(0)
    });
    let _ = conn.busy_timeout(BUSY_TIMEOUT);
    match restarted {
        Ok(0) => true,
        Ok(_) => {
            tracing::debug!("WAL restart found readers busy; asked again after the next commits");
            false
        }
        Err(error) => {
            tracing::warn!(%error, "WAL restart checkpoint failed");
            false
        }
    }
}

/// How long the RESTART checkpoint waits for readers. Every write waits with it (the store
/// thread runs it between batches): with the connection's 5 s, one long read stalled
/// publishing and log pages alike. Given up, it is asked again after the next commits, so
/// no read may hold its snapshot for long (see `SqliteStore::backlog`): in the W5 outage the
/// WAL then stayed at 152 MB.
const RESTART_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

pub(super) const CHECKPOINT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// WAL pages (160 MiB) after which the store thread checkpoints itself, should the
/// checkpointer fail or its restarts keep being given up (SQLite's default is 1000). Far
/// past `WAL_RESTART_PAGES`: a checkpoint at commit fsyncs and copies what the checkpointer
/// has not while every write waits, and at 10,000 pages W1's writes reached it before the
/// restart came, holding all 32 publishers 13–30 ms, two to four times a run.
pub(super) const WAL_BACKSTOP_PAGES: i64 = 40_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::worker::tests::job;

    /// A directory removed when the test ends, however it ends.
    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// An empty directory of its own for a test, and the database file to make in it.
    fn scratch(name: &str) -> (TempDir, PathBuf) {
        let dir =
            TempDir(std::env::temp_dir().join(format!("hooklane-{name}-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0).unwrap();
        let path = dir.0.join(format!("{name}.db"));
        (dir, path)
    }

    /// A connection to `path` in WAL mode, without fsync: these tests are about who waits
    /// for whom, not the disk.
    fn open_wal(path: &Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "OFF").unwrap();
        conn
    }

    /// The store thread and the checkpointer around a WAL restart, on a file: asked for a
    /// restart, the store thread holds a busy lane's job back while a quiet lane's is
    /// written, until the checkpointer has caught up (well before a hold limit of 10 s);
    /// then the WAL starts over and the busy job is written. Without a checkpointer the
    /// hold ends after twice its limit all the same.
    #[test]
    fn a_wal_restart_holds_the_busy_lanes_until_the_checkpointer_has_caught_up() {
        let (_dir, path) = scratch("hold");
        let open = || open_wal(&path);
        open()
            .execute_batch("CREATE TABLE t (lane TEXT, body BLOB)")
            .unwrap();
        let written = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let write = |lane: &str, rows: usize| {
            let (done, answered) = mpsc::channel();
            let (name, written) = (lane.to_owned(), Arc::clone(&written));
            let job = Job {
                run: Box::new(move |conn| {
                    let conn = conn.unwrap();
                    for _ in 0..rows.min(200) {
                        conn.execute(
                            "INSERT INTO t VALUES (?1, zeroblob(4000))",
                            params![name.clone()],
                        )
                        .unwrap();
                    }
                    written.lock().unwrap().push(name);
                    Box::new(move |_| {
                        let _ = done.send(());
                    })
                }),
                ..job(Some(lane), rows)
            };
            (job, answered)
        };
        let answered = |done: &mpsc::Receiver<()>, what: &str| {
            done.recv_timeout(std::time::Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("{what} not answered within 30 s"));
        };
        let frames = |conn: &Connection| -> i64 {
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
                .unwrap()
        };

        for (with_checkpointer, hold_max) in [
            (true, std::time::Duration::from_secs(10)),
            (false, std::time::Duration::from_millis(100)),
        ] {
            let (jobs, queue) = mpsc::channel();
            let (commits, committed) = mpsc::sync_channel(1);
            let restart = Arc::new(Restart::holding_at_most(hold_max));
            let store_thread = {
                let checkpoints = Checkpoints {
                    commits,
                    restart: Arc::clone(&restart),
                };
                let conn = open();
                std::thread::spawn(move || run_jobs(conn, queue, Some(checkpoints)))
            };
            // Fill the WAL, then ask for a restart: the next commit starts the hold.
            let (fill, filled) = write("fill", 200);
            jobs.send(fill).unwrap();
            answered(&filled, "the fill");
            let before = frames(&open());
            assert!(before >= 200, "{before} frames in the WAL");
            restart.wanted.store(true, Ordering::Release);
            let (first, first_done) = write("first", 1);
            // Timed from before the hold can begin: timed from when this thread sees it
            // begun, it read 199.6 ms on a loaded host where the hold had lasted its 200.
            let held_at = std::time::Instant::now();
            jobs.send(first).unwrap();
            answered(&first_done, "the first job");
            // The hold begins once the first job's batch has answered.
            while !restart.holding.load(Ordering::Acquire) {
                assert!(
                    held_at.elapsed() < std::time::Duration::from_secs(10),
                    "no hold"
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let (busy, busy_done) = write("busy", QUIET_ROWS + 1);
            jobs.send(busy).unwrap();
            let (quiet, quiet_done) = write("quiet", 1);
            jobs.send(quiet).unwrap();
            answered(&quiet_done, "the quiet job");
            let checkpointer = with_checkpointer.then(|| {
                let (conn, restart) = (open(), Arc::clone(&restart));
                std::thread::spawn(move || run_checkpoints(conn, committed, &restart))
            });
            answered(&busy_done, "the busy job");
            let held = held_at.elapsed();
            assert!(
                !restart.holding.load(Ordering::Acquire),
                "the busy job was written while the hold was on"
            );
            let order: Vec<String> = std::mem::take(&mut *written.lock().unwrap());
            assert_eq!(order, ["fill", "first", "quiet", "busy"]);
            // Started over: the WAL holds only what the busy job wrote after the restart.
            let after = frames(&open());
            assert!(
                after < before,
                "{after} frames after the restart, {before} before"
            );
            if with_checkpointer {
                assert!(
                    held < hold_max / 2,
                    "held {held:?}: the hold did not end when the checkpointer caught up"
                );
                assert!(restart.caught_up.load(Ordering::Acquire));
            } else {
                assert!(held >= hold_max * 2, "held {held:?} with no checkpointer");
            }
            drop(jobs);
            store_thread.join().unwrap();
            if let Some(checkpointer) = checkpointer {
                checkpointer.join().unwrap();
            }
        }
    }

    /// A hold the checkpointer cannot end (writes outpace its passes) has a limit: past
    /// `hold_max` the checkpointer is told to give up. It makes no further pass and says it
    /// is done, and the store thread restarts the WAL, copying what is left.
    #[test]
    fn a_hold_past_its_limit_stops_the_passes_then_restarts_anyway() {
        let (_dir, path) = scratch("give-up");
        let open = || open_wal(&path);
        let store = open();
        store
            .execute_batch("CREATE TABLE t (body BLOB); PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        for _ in 0..200 {
            store
                .execute("INSERT INTO t VALUES (zeroblob(4000))", [])
                .unwrap();
        }
        let file_bytes = || std::fs::metadata(&path).unwrap().len();
        let wal_bytes = || {
            std::fs::metadata(path.with_extension("db-wal"))
                .unwrap()
                .len()
        };
        let before = file_bytes();

        let hold_max = std::time::Duration::from_millis(50);
        let (commits, committed) = mpsc::sync_channel(1);
        let restart = Arc::new(Restart::holding_at_most(hold_max));
        let checkpoints = Checkpoints {
            commits,
            restart: Arc::clone(&restart),
        };
        restart.wanted.store(true, Ordering::Release);
        let since = checkpoints.begin_hold().expect("a restart was asked for");
        assert!(!checkpoints.end_hold(&store, since), "ended at once");
        // Past the limit: the checkpointer is told to give up; the hold goes on.
        let past =
            |limit: std::time::Duration| std::time::Instant::now().checked_sub(limit).unwrap();
        assert!(!checkpoints.end_hold(&store, past(hold_max * 3 / 2)));
        assert!(restart.give_up.load(Ordering::Acquire));
        assert!(restart.holding.load(Ordering::Acquire));
        // Woken for the hold, the checkpointer makes no pass: nothing reaches the file.
        let checkpointer = {
            let (conn, restart) = (open(), Arc::clone(&restart));
            std::thread::spawn(move || run_checkpoints(conn, committed, &restart))
        };
        let woken = std::time::Instant::now();
        while !restart.caught_up.load(Ordering::Acquire) {
            assert!(
                woken.elapsed() < std::time::Duration::from_secs(10),
                "the checkpointer did not stop passing"
            );
            std::thread::sleep(HOLD_POLL);
        }
        assert_eq!(
            file_bytes(),
            before,
            "told to give up, the checkpointer still copied the WAL into the file"
        );
        // Having given up, it says it is done: the store thread restarts the WAL at once,
        // copying what is left, and starts it over. (Past twice the limit it would restart
        // with no word from the checkpointer: see the test above.)
        let wal_before = wal_bytes();
        assert!(checkpoints.end_hold(&store, since));
        assert!(!restart.holding.load(Ordering::Acquire));
        assert!(file_bytes() > before, "the restart copied nothing");
        store
            .execute("INSERT INTO t VALUES (zeroblob(4000))", [])
            .unwrap();
        let frames: i64 = store
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
            .unwrap();
        assert!(
            frames < 10,
            "{frames} frames after the restart: the WAL did not start over ({wal_before} bytes)"
        );
        drop(checkpoints);
        checkpointer.join().unwrap();
    }
}
