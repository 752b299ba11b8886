//! Retention: ended deliveries, their attempts and unreferenced events leave the file once
//! older than `HOOKLANE_RETENTION`, a few hundred rows per transaction.
//!
//! Rows are visited oldest first by rowid (the order they were written), so a pass stops at
//! the first row younger than the cutoff without an index of its own. Pending deliveries and
//! the events they need are never removed. SQLite reuses the freed pages for new rows, so
//! the file stops growing once the oldest data leaves as fast as new data arrives.

use super::worker::*;
use super::*;

/// What one purge removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    pub deliveries: u64,
    pub attempts: u64,
    pub events: u64,
    pub notifications: u64,
}

impl Purged {
    fn add(&mut self, other: Purged) {
        self.deliveries += other.deliveries;
        self.attempts += other.attempts;
        self.events += other.events;
        self.notifications += other.notifications;
    }
}

/// Rows one transaction looks at, at most: small enough that the writes sharing its batch on
/// the store thread wait a few milliseconds. In W6, slices of 500 rows purged 24,000
/// deliveries a second but took the steady traffic's p99 from 25 to 68 ms while they ran;
/// slices of 100 purge 11,000 a second with a p99 of 18 ms.
pub const SLICE_ROWS: u32 = 100;

/// Where a purge has got to within each table (rowids already visited).
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    deliveries: Option<i64>,
    events: Option<i64>,
}

impl SqliteStore {
    /// Removes everything past retention that was created before `cutoff`, in slices of
    /// [`SLICE_ROWS`], pausing `pause` between slices so delivery keeps the store thread.
    pub async fn purge_before(
        &self,
        cutoff: Timestamp,
        pause: std::time::Duration,
    ) -> StoreResult<Purged> {
        let cutoff = to_millis(cutoff);
        let mut total = Purged::default();
        let mut progress = Progress {
            deliveries: Some(0),
            events: Some(0),
        };
        while progress.deliveries.is_some() || progress.events.is_some() {
            let at = progress;
            let (purged, next) = self
                .run(move |conn| {
                    let sp = JobSavepoint::begin(conn).map_err(backend)?;
                    let mut purged = Purged::default();
                    let mut next = Progress::default();
                    if let Some(after) = at.deliveries {
                        next.deliveries = purge_deliveries(&sp, cutoff, after, &mut purged)?;
                    }
                    if let Some(after) = at.events.filter(|_| next.deliveries.is_none()) {
                        next.events = purge_events(&sp, cutoff, after, &mut purged)?;
                    } else {
                        next.events = at.events;
                    }
                    if next.deliveries.is_none() && next.events.is_none() {
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
        Ok(total)
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

/// One slice of the deliveries table from rowid `after`: returns where the next slice
/// starts, or `None` once a row younger than the cutoff (or the end) was reached.
fn purge_deliveries(
    conn: &Connection,
    cutoff: i64,
    after: i64,
    purged: &mut Purged,
) -> StoreResult<Option<i64>> {
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
        // replayed late): the next purge looks at both again.
        if status == DeliveryStatus::Pending.as_str() || updated_at >= cutoff {
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
    Ok((full && !reached_young).then_some(last))
}

/// One slice of the events table: events that no delivery refers to (none matched an
/// endpoint, or theirs were purged in an earlier pass).
fn purge_events(
    conn: &Connection,
    cutoff: i64,
    after: i64,
    purged: &mut Purged,
) -> StoreResult<Option<i64>> {
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
            return Ok(None);
        }
        last = rowid;
        purged.events += delete_unreferenced_event(conn, cutoff, &account, &event)?;
    }
    Ok(full.then_some(last))
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
