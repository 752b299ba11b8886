//! Retention: ended deliveries, their attempts and unreferenced events leave the file once
//! older than `HOOKLANE_RETENTION`, a few hundred rows per transaction.
//!
//! Rows are visited oldest first by rowid (the order they were written), so a pass stops at
//! the first row younger than the cutoff without an index of its own, and the next pass
//! starts there ([`PurgeMark`]). Pending deliveries and the events they need are never
//! removed. SQLite reuses the freed pages for new rows, so the file stops growing once the
//! oldest data leaves as fast as new data arrives.

use super::worker::*;
use super::*;

/// What one purge removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    pub deliveries: u64,
    pub attempts: u64,
    pub events: u64,
    pub notifications: u64,
    /// Deliveries past the cutoff that were looked at and kept: pending, or ended within
    /// the retention (replayed late).
    pub passed_over: u64,
}

impl Purged {
    fn add(&mut self, other: Purged) {
        self.deliveries += other.deliveries;
        self.attempts += other.attempts;
        self.events += other.events;
        self.notifications += other.notifications;
        self.passed_over += other.passed_over;
    }

    /// Whether anything left the file.
    pub fn removed_any(&self) -> bool {
        self.deliveries + self.attempts + self.events + self.notifications > 0
    }
}

/// Rows one transaction looks at, at most: small enough that the writes sharing its batch on
/// the store thread wait a few milliseconds. In W6, slices of 500 rows purged 24,000
/// deliveries a second but took the steady traffic's p99 from 25 to 68 ms while they ran;
/// slices of 100 purge 11,000 a second with a p99 of 18 ms.
pub const SLICE_ROWS: u32 = 100;

/// How far a purge has got through one table.
#[derive(Debug, Clone, Copy)]
struct Walk {
    /// Rows up to this rowid have been visited.
    after: i64,
    /// A row younger than the cutoff, or the end of the table, was reached.
    done: bool,
    /// The table's last row was removed at some point: new rows may then take rowids
    /// already passed (SQLite gives a new row the largest rowid + 1).
    tail_removed: bool,
}

impl Walk {
    fn from(after: i64) -> Self {
        Self {
            after,
            done: false,
            tail_removed: false,
        }
    }

    fn next(self) -> Option<i64> {
        (!self.done).then_some(self.after)
    }

    /// Where the next purge may start: where this one stopped, unless a row written since
    /// may lie behind it.
    fn mark(self) -> i64 {
        if self.tail_removed {
            0
        } else {
            self.after
        }
    }
}

/// Where the last purge stopped, so that a backlog kept past the cutoff (pending, or
/// replayed late) is read once rather than by every purge. The rows before `deliveries`
/// that were kept cannot pass retention while the cutoff is at or before `revisit`: a
/// pending delivery that ends later gets an `updated_at` after the purge that saw it, and a
/// replay only moves `updated_at` later. Once the cutoff passes `revisit`, the walk starts
/// from the first row again. Events before `events` that were kept are referenced by a
/// delivery, and leave with the last of those. Only the purge removes rows, so rows written
/// between two purges come after where the last stopped.
#[derive(Debug, Clone, Copy)]
pub(super) struct PurgeMark {
    deliveries: i64,
    events: i64,
    revisit: i64,
}

impl Default for PurgeMark {
    fn default() -> Self {
        Self {
            deliveries: 0,
            events: 0,
            revisit: i64::MAX,
        }
    }
}

/// Where a purge has got to within each table, and the earliest cutoff at which a delivery
/// it kept may have passed retention.
#[derive(Debug, Clone, Copy)]
struct Progress {
    deliveries: Walk,
    events: Walk,
    revisit: i64,
}

impl SqliteStore {
    /// Removes everything past retention that was created before `cutoff`, in slices of
    /// [`SLICE_ROWS`], pausing `pause` between slices so delivery keeps the store thread.
    /// `now` is the time the cutoff was taken at.
    pub async fn purge_before(
        &self,
        cutoff: Timestamp,
        now: Timestamp,
        pause: std::time::Duration,
    ) -> StoreResult<Purged> {
        let (cutoff, now) = (to_millis(cutoff), to_millis(now));
        // Taken, not read: a purge that fails leaves the next to start from the first rows.
        let mark = std::mem::take(&mut *self.purge_mark());
        let mark = if cutoff > mark.revisit {
            PurgeMark::default()
        } else {
            mark
        };
        let mut total = Purged::default();
        let mut progress = Progress {
            deliveries: Walk::from(mark.deliveries),
            events: Walk::from(mark.events),
            revisit: mark.revisit,
        };
        while progress.deliveries.next().is_some() || progress.events.next().is_some() {
            let at = progress;
            let (purged, next) = self
                .run(move |conn| {
                    let sp = JobSavepoint::begin(conn).map_err(backend)?;
                    let tails = last_rowids(&sp)?;
                    let mut purged = Purged::default();
                    let mut next = at;
                    if let Some(after) = at.deliveries.next() {
                        (next.deliveries.after, next.deliveries.done) = purge_deliveries(
                            &sp,
                            (cutoff, now),
                            after,
                            &mut purged,
                            &mut next.revisit,
                        )?;
                    }
                    // Events once the deliveries are done: they free the events they held.
                    let events = at.events.next().filter(|_| next.deliveries.done);
                    if let Some(after) = events {
                        (next.events.after, next.events.done) =
                            purge_events(&sp, cutoff, after, &mut purged)?;
                    }
                    let (deliveries_tail, events_tail) = last_rowids(&sp)?;
                    next.deliveries.tail_removed |= deliveries_tail < tails.0;
                    next.events.tail_removed |= events_tail < tails.1;
                    if next.deliveries.done && next.events.done {
                        purged.notifications = sp
                            .prepare_cached(
                                "DELETE FROM notifications WHERE sent_at IS NOT NULL AND created_at < ?1",
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
                    Ok((purged, next))
                })
                .await?;
            total.add(purged);
            progress = next;
            tokio::time::sleep(pause).await;
        }
        let (deliveries, events) = (progress.deliveries, progress.events);
        *self.purge_mark() = PurgeMark {
            deliveries: deliveries.mark(),
            events: events.mark(),
            revisit: if deliveries.tail_removed {
                i64::MAX
            } else {
                progress.revisit
            },
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

/// One slice of the deliveries table from rowid `after`: returns the last rowid visited and
/// whether the walk is done. `revisit` is lowered to the earliest cutoff at which a
/// delivery it keeps may pass retention.
fn purge_deliveries(
    conn: &Connection,
    (cutoff, now): (i64, i64),
    after: i64,
    purged: &mut Purged,
    revisit: &mut i64,
) -> StoreResult<(i64, bool)> {
    let rows: Vec<(i64, String, String, String, i64, String, i64)> = conn
        .prepare_cached(
            "SELECT rowid, id, account_id, event_id, created_at, status, updated_at FROM deliveries \
             WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
        )
        .and_then(|mut s| {
            s.query_map(params![after, SLICE_ROWS], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            })?
            .collect()
        })
        .map_err(backend)?;
    let full = rows.len() == SLICE_ROWS as usize;
    let mut last = after;
    let mut reached_young = false;
    let mut events = Vec::new();
    for (rowid, id, account, event, created_at, status, updated_at) in rows {
        if created_at >= cutoff {
            reached_young = true;
            break;
        }
        last = rowid;
        // Pending work stays, and so does a delivery that ended within the retention (one
        // replayed late): a later purge looks at both again once they may have aged.
        let pending = status == DeliveryStatus::Pending.as_str();
        if pending || updated_at >= cutoff {
            purged.passed_over += 1;
            *revisit = (*revisit).min(if pending { now } else { updated_at });
            continue;
        }
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
    }
    events.dedup();
    for (account, event) in events {
        purged.events += delete_unreferenced_event(conn, cutoff, &account, &event)?;
    }
    Ok((last, reached_young || !full))
}

/// One slice of the events table: events that no delivery refers to (none matched an
/// endpoint, or theirs were purged in an earlier pass).
fn purge_events(
    conn: &Connection,
    cutoff: i64,
    after: i64,
    purged: &mut Purged,
) -> StoreResult<(i64, bool)> {
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
    let mut last = after;
    for (rowid, account, event, created_at) in rows {
        if created_at >= cutoff {
            return Ok((last, true));
        }
        last = rowid;
        purged.events += delete_unreferenced_event(conn, cutoff, &account, &event)?;
    }
    Ok((last, !full))
}

/// The largest rowid of the deliveries and of the events (0 when empty).
fn last_rowids(conn: &Connection) -> StoreResult<(i64, i64)> {
    conn.prepare_cached(
        "SELECT (SELECT coalesce(max(rowid), 0) FROM deliveries), \
                (SELECT coalesce(max(rowid), 0) FROM events)",
    )
    .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
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
         AND NOT EXISTS (SELECT 1 FROM deliveries WHERE account_id = ?1 AND event_id = ?2)",
    )
    .and_then(|mut s| s.execute(params![account, event, cutoff]))
    .map(|n| n as u64)
    .map_err(backend)
}
