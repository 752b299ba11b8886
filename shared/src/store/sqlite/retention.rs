//! Retention: ended deliveries, their attempts and unreferenced events leave the file once
//! older than `HOOKLANE_RETENTION`, 50 rows per transaction.
//!
//! Ended deliveries are read through their own partial index, oldest ending first, so a
//! purge reads only what it removes: a backlog of pending work, however old, is never read.
//! Events are visited by rowid (the order they were written), from where the last purge
//! stopped ([`PurgeMark`]) to the first one younger than the cutoff. Pending deliveries and
//! the events they need are never removed. SQLite reuses the freed pages for new rows, so
//! the file stops growing once the oldest data leaves as fast as new data arrives.

use std::time::Duration;

use super::worker::*;
use super::*;

/// What one purge removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    pub deliveries: u64,
    pub attempts: u64,
    pub events: u64,
    pub notifications: u64,
    /// How long before the cutoff the oldest delivery it removed had ended, or the oldest
    /// event it removed was created, whichever is longer: how far behind retention it is.
    pub overdue: Duration,
}

impl Purged {
    fn add(&mut self, other: Purged) {
        self.deliveries += other.deliveries;
        self.attempts += other.attempts;
        self.events += other.events;
        self.notifications += other.notifications;
        self.overdue = self.overdue.max(other.overdue);
    }
}

/// Rows one transaction looks at, at most: small enough that the writes sharing its batch on
/// the store thread wait little (in W6 a slice of 100 rows took 0.9 ms, 1.9 ms at p99). In
/// W6, slices of 500 rows purged 24,000 deliveries a second but took the steady traffic's
/// p99 from 25 to 68 ms while they ran; slices of 50 purge 11,000 a second 2.5 ms apart
/// (see [`PurgePace`]), against 13,000 and a p99 of 5 to 9.5 ms for slices of 100, 5 ms apart.
pub const SLICE_ROWS: u32 = 50;

/// How a purge paces its slices: a pause between two, shorter while what it removes is
/// long past retention (more ends than the gentle pace removes, or the file is old).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgePace {
    pub pause: Duration,
    /// Rows this long past the cutoff, or longer, mean the purge is behind.
    pub behind_by: Duration,
    pub behind_pause: Duration,
}

impl PurgePace {
    /// No pause: for a purge with nothing beside it.
    pub const FLAT_OUT: Self = Self {
        pause: Duration::ZERO,
        behind_by: Duration::ZERO,
        behind_pause: Duration::ZERO,
    };

    /// `serve`'s pace for a purge every `interval`. A purge that keeps up removes what
    /// ended within about an interval before the cutoff, so it counts as behind only past an
    /// hour (or two intervals, if longer). In W6 (steady traffic of 1,000 deliveries a
    /// second beside a purge of some 235,000), 20 ms between slices of 50 rows purge 2,200
    /// deliveries a second (docs/PERFORMANCE.md gives the steady p99 beside them); 5 ms
    /// purged 6,800-7,200 a second and 2.5 ms 10,500-11,300, each with a higher p99 beside
    /// it. Tokio's timer rounds a pause up to its next millisecond.
    pub fn every(interval: Duration) -> Self {
        Self {
            pause: Duration::from_millis(20),
            behind_by: BEHIND_BY.max(interval.saturating_mul(2)),
            behind_pause: Duration::from_micros(2500),
        }
    }

    /// The pause before the next slice, after one whose oldest row was `overdue` past the
    /// cutoff.
    pub fn pause_after(&self, overdue: Duration) -> Duration {
        if overdue >= self.behind_by {
            self.behind_pause
        } else {
            self.pause
        }
    }

    /// The pause after a slice that removed `purged`. One that removed nothing only read (a
    /// walk over events that pending deliveries still need, after a restart): it wrote no
    /// pages for the next writes to wait on, so the next follows at the shorter pause. One
    /// `cut` short for a waiting write rests for its share of the pause, so the purge keeps
    /// its pace in rows.
    pub fn pause_after_slice(&self, purged: &Purged, cut: bool) -> Duration {
        if purged.deliveries == 0 && purged.events == 0 {
            self.behind_pause
        } else if cut {
            let rows = u32::try_from(purged.deliveries).unwrap_or(SLICE_ROWS);
            (self.pause / SLICE_ROWS).saturating_mul(rows.min(SLICE_ROWS))
        } else {
            self.pause_after(purged.overdue)
        }
    }

    /// Whether a slice after one whose oldest row was `overdue` past the cutoff ends at the
    /// row it is on once a write is queued for the store thread. A write that came during a
    /// slice of 50 rows waited for all of it (about 1 ms), and W4's traffic beside a purge
    /// has a write every millisecond or so. A purge that is behind takes whole slices: cut
    /// short, they removed 5-10 % less a second.
    pub fn yields_after(&self, overdue: Duration) -> bool {
        overdue < self.behind_by
    }
}

/// How far past retention a purge's rows may be before it hurries: an hour's extra disk.
const BEHIND_BY: Duration = Duration::from_secs(3600);

/// Where the last purge's walk of the events stopped, and at which cutoff. The events
/// before it that were kept are referenced by a delivery, and leave with the last of those;
/// only the purge removes events, so events written since come after it. The walk stops its
/// mark before the first event it kept because it was still unfanned: that event's fan-out
/// may end with no delivery, and then only the walk can remove it. A purge that
/// removes the table's last row leaves none: SQLite gives a new row the largest rowid + 1,
/// so new events could then take rowids before it. An earlier cutoff (the clock went back)
/// starts from the first event again.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PurgeMark {
    events: i64,
    cutoff: i64,
}

impl SqliteStore {
    /// Removes everything past retention that was created before `cutoff`, in slices of
    /// [`SLICE_ROWS`], pausing between slices as `pace` says so delivery keeps the store
    /// thread. Once `stop` holds `true` (`serve` is shutting down) it ends after the slice it
    /// is in: a first purge of a year-old file takes hours, and a shutdown waited for it.
    pub async fn purge_before(
        &self,
        cutoff: Timestamp,
        pace: PurgePace,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> StoreResult<Purged> {
        let cutoff = to_millis(cutoff);
        // Taken, not read: a purge that fails leaves the next to start from the first event.
        let mark = std::mem::take(&mut *self.purge_mark());
        let mut events_after = if cutoff >= mark.cutoff {
            mark.events
        } else {
            0
        };
        let mut total = Purged::default();
        let mut deliveries_done = false;
        let mut events_tail_removed = false;
        let mut held: Option<i64> = None;
        // Until a slice shows the purge is behind.
        let mut yielding = pace.yields_after(Duration::ZERO);
        loop {
            let after = events_after;
            let queued = Arc::clone(&self.queued);
            let (purged, slice) = self
                .run_forgetting_nothing(move |conn| {
                    let sp = JobSavepoint::begin(conn).map_err(backend)?;
                    let tail = last_event_rowid(&sp)?;
                    let mut purged = Purged::default();
                    // Events once the deliveries are done: they free the events they held.
                    let write_waits = || yielding && queued.any();
                    let ((deliveries_done, cut), events) = if deliveries_done {
                        ((true, false), Some(purge_events(&sp, cutoff, after, &mut purged)?))
                    } else {
                        (purge_deliveries(&sp, cutoff, &mut purged, write_waits)?, None)
                    };
                    let slice = Slice {
                        deliveries_done,
                        cut,
                        events: events.map(|walked| (walked.last, walked.done)),
                        held: events.and_then(|walked| walked.first_unfanned),
                        tail_removed: last_event_rowid(&sp)? < tail,
                    };
                    if slice.events.is_some_and(|(_, done)| done) {
                        purged.notifications = sp
                            .prepare_cached(
                                "DELETE FROM notifications WHERE sent_at < ?1 OR given_up_at < ?1",
                            )
                            .and_then(|mut s| s.execute(params![cutoff]))
                            .map_err(backend)? as u64;
                        // Hour counts are kept for days, whatever the retention: counted from
                        // the newest hour, so that a stopped clock removes nothing early.
                        sp.prepare_cached(
                            "DELETE FROM endpoint_hours WHERE hour < (SELECT max(hour) FROM endpoint_hours) - ?1",
                        )
                        .and_then(|mut s| s.execute(params![STATS_KEPT.num_milliseconds()]))
                        .map_err(backend)?;
                    }
                    sp.commit().map_err(backend)?;
                    Ok((purged, slice))
                })
                .await?;
            total.add(purged);
            deliveries_done = slice.deliveries_done;
            events_tail_removed |= slice.tail_removed;
            held = held.or(slice.held);
            let finished = match slice.events {
                Some((last, done)) => {
                    events_after = last;
                    done
                }
                None => false,
            };
            // Each slice leaves the walk where the next can go on, so stopping here is as
            // good as finishing: the next purge starts from the mark set below.
            if finished || *stop.borrow() {
                break;
            }
            yielding = pace.yields_after(purged.overdue);
            tokio::time::sleep(pace.pause_after_slice(&purged, slice.cut)).await;
        }
        *self.purge_mark() = PurgeMark {
            events: match (events_tail_removed, held) {
                (true, _) => 0,
                (false, Some(unfanned)) => unfanned - 1,
                (false, None) => events_after,
            },
            cutoff,
        };
        Ok(total)
    }

    fn purge_mark(&self) -> std::sync::MutexGuard<'_, PurgeMark> {
        self.purge_mark
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Pages in the file and pages free for reuse: how the file's size is made up.
    pub async fn page_counts(&self) -> StoreResult<(u64, u64)> {
        self.read(|conn| {
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .map_err(backend)?;
            let free: i64 = conn
                .query_row("PRAGMA freelist_count", [], |r| r.get(0))
                .map_err(backend)?;
            Ok((
                u64::try_from(pages).unwrap_or(0),
                u64::try_from(free).unwrap_or(0),
            ))
        })
        .await
    }
}

/// What one purge transaction did.
#[derive(Debug, Clone, Copy)]
struct Slice {
    deliveries_done: bool,
    /// It ended before its last row because a write was waiting.
    cut: bool,
    /// The last event visited, and whether the walk of the events is done.
    events: Option<(i64, bool)>,
    /// The first event the walk kept because it was still unfanned.
    held: Option<i64>,
    /// The events table's last row was removed.
    tail_removed: bool,
}

/// Ended deliveries by the second they ended in, up to the cutoff's second `?1`, before the
/// cutoff `?2`, through their partial index: every row it reads is removed, oldest first.
/// Within a second the index holds them in rowid order, so a slice takes rows written
/// together, on few pages; ordered by their end time alone, they lay on more pages and
/// slices held the store thread about twice as long.
pub(super) const ENDED_BEFORE_SQL: &str =
    "SELECT rowid, id, account_id, event_id, created_at, updated_at FROM deliveries \
     WHERE status != 'pending' AND updated_at / 1000 <= ?1 AND updated_at < ?2 \
     ORDER BY updated_at / 1000 LIMIT ?3";

/// [`ENDED_BEFORE_SQL`] less the deliveries of events still listed as unfanned. A fan-out
/// that failed part-way leaves the deliveries it wrote, and its next run adds only the rest
/// (`INSERT OR IGNORE`): had those gone meanwhile, it would create and send them again.
/// A delivery's `created_at` is its event's (the log places it by its event), so the list's
/// key is the delivery's own. Every slice reads the ones it keeps again (they are the
/// oldest): only such a failure leaves them, and only a few.
pub(super) const ENDED_BEFORE_KEEPING_UNFANNED_SQL: &str =
    "SELECT d.rowid, d.id, d.account_id, d.event_id, d.created_at, d.updated_at FROM deliveries d \
     WHERE d.status != 'pending' AND d.updated_at / 1000 <= ?1 AND d.updated_at < ?2 \
     AND NOT EXISTS (SELECT 1 FROM unfanned u \
       WHERE u.account_id = d.account_id AND u.created_at = d.created_at AND u.id = d.event_id) \
     ORDER BY d.updated_at / 1000 LIMIT ?3";

/// Whether an event created before the cutoff is still listed as unfanned: only then can a
/// delivery past retention belong to one (it ended after its event was created). A healthy
/// store has none, so the purge's usual query needs no look-up per row.
fn unfanned_before(conn: &Connection, cutoff: i64) -> StoreResult<bool> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM unfanned WHERE created_at < ?1)")
        .and_then(|mut s| s.query_row(params![cutoff], |r| r.get(0)))
        .map_err(backend)
}

/// One slice of the ended deliveries past retention (a delivery counts from when it ended:
/// one replayed late is kept that long again), ending early at a row after which
/// `write_waits`: returns whether none are left, and whether it ended early.
pub(super) fn purge_deliveries(
    conn: &Connection,
    cutoff: i64,
    purged: &mut Purged,
    write_waits: impl Fn() -> bool,
) -> StoreResult<(bool, bool)> {
    let sql = if unfanned_before(conn, cutoff)? {
        ENDED_BEFORE_KEEPING_UNFANNED_SQL
    } else {
        ENDED_BEFORE_SQL
    };
    let rows: Vec<(i64, String, String, String, i64, i64)> = conn
        .prepare_cached(sql)
        .and_then(|mut s| {
            s.query_map(params![cutoff.div_euclid(1000), cutoff, SLICE_ROWS], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })?
            .collect()
        })
        .map_err(backend)?;
    let full = rows.len() == SLICE_ROWS as usize;
    let mut cut = false;
    if let Some(oldest) = rows.iter().map(|row| row.5).min() {
        purged.overdue = overdue(cutoff, oldest);
    }
    let mut events = Vec::new();
    for (rowid, id, account, event, created_at, _) in rows {
        purged.attempts += conn
            .prepare_cached(
                "DELETE FROM attempts WHERE delivery_created_at = ?1 AND delivery_id = ?2",
            )
            .and_then(|mut s| s.execute(params![created_at, id]))
            .map_err(backend)? as u64;
        purged.deliveries += conn
            .prepare_cached("DELETE FROM deliveries WHERE rowid = ?1")
            .and_then(|mut s| s.execute(params![rowid]))
            .map_err(backend)? as u64;
        events.push((account, event));
        if write_waits() {
            cut = true;
            break;
        }
    }
    events.sort_unstable();
    events.dedup();
    for (account, event) in events {
        purged.events += delete_unreferenced_event(conn, cutoff, &account, &event)?;
    }
    Ok((!(full || cut), cut))
}

/// How long before `cutoff` (milliseconds) a row of time `at` is.
fn overdue(cutoff: i64, at: i64) -> Duration {
    Duration::from_millis(u64::try_from(cutoff.saturating_sub(at)).unwrap_or(0))
}

/// Where a slice of the events walk got to.
#[derive(Debug, Clone, Copy)]
struct Walked {
    /// The last event visited.
    last: i64,
    done: bool,
    /// The first event kept because it is still unfanned.
    first_unfanned: Option<i64>,
}

/// One slice of the events table: events that no delivery refers to (none matched an
/// endpoint, or theirs were purged in an earlier pass).
fn purge_events(
    conn: &Connection,
    cutoff: i64,
    after: i64,
    purged: &mut Purged,
) -> StoreResult<Walked> {
    let rows: Vec<(i64, String, String, i64)> = conn
        .prepare_cached(
            "SELECT rowid, account_id, id, created_at FROM events WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
        )
        .and_then(|mut s| {
            s.query_map(params![after, SLICE_ROWS], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect()
        })
        .map_err(backend)?;
    let full = rows.len() == SLICE_ROWS as usize;
    let mut walked = Walked {
        last: after,
        done: !full,
        first_unfanned: None,
    };
    let any_unfanned = unfanned_before(conn, cutoff)?;
    for (rowid, account, event, created_at) in rows {
        if created_at >= cutoff {
            walked.done = true;
            break;
        }
        walked.last = rowid;
        let removed = delete_unreferenced_event(conn, cutoff, &account, &event)?;
        if removed > 0 {
            // In rowid order, not creation order: the oldest is the largest overdue.
            purged.overdue = purged.overdue.max(overdue(cutoff, created_at));
        } else if any_unfanned
            && walked.first_unfanned.is_none()
            && is_unfanned(conn, &account, created_at, &event)?
        {
            walked.first_unfanned = Some(rowid);
        }
        purged.events += removed;
    }
    Ok(walked)
}

fn is_unfanned(
    conn: &Connection,
    account: &str,
    created_at: i64,
    event: &str,
) -> StoreResult<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM unfanned WHERE account_id = ?1 AND created_at = ?2 AND id = ?3)",
    )
    .and_then(|mut s| s.query_row(params![account, created_at, event], |r| r.get(0)))
    .map_err(backend)
}

/// The events table's largest rowid (0 when empty).
fn last_event_rowid(conn: &Connection) -> StoreResult<i64> {
    conn.prepare_cached("SELECT coalesce(max(rowid), 0) FROM events")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(backend)
}

fn delete_unreferenced_event(
    conn: &Connection,
    cutoff: i64,
    account: &str,
    event: &str,
) -> StoreResult<u64> {
    conn.prepare_cached(
        "DELETE FROM events WHERE account_id = ?1 AND id = ?2 AND created_at < ?3 \
         AND NOT EXISTS (SELECT 1 FROM deliveries WHERE account_id = ?1 AND event_id = ?2) \
         AND NOT EXISTS (SELECT 1 FROM unfanned u WHERE u.account_id = ?1 AND u.created_at = events.created_at AND u.id = ?2)",
    )
    .and_then(|mut s| s.execute(params![account, event, cutoff]))
    .map(|n| n as u64)
    .map_err(backend)
}
