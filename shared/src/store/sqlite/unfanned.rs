//! Events stored without their deliveries, waiting for their fan-out: the embedded shape's
//! stand-in for the DynamoDB stream. A publish lists its event in the `unfanned` table in its
//! own transaction; the fan-out (`queue::fan_out`) reads them per account, oldest first, and
//! `mark_fanned_out` takes them off. Being in the file, the list outlives a restart.

use std::{
    collections::HashSet,
    sync::{Mutex, PoisonError},
};

use super::rows::*;
use super::worker::*;
use super::*;

/// The accounts given unfanned events since the fan-out last looked, and the wake-up it
/// waits on.
#[derive(Default)]
pub(super) struct Signal {
    accounts: Mutex<HashSet<AccountId>>,
    woken: tokio::sync::Notify,
}

impl Signal {
    /// Called on the store thread after the commit that listed an event of `account`.
    pub(super) fn signal(&self, account: &AccountId) {
        let mut accounts = self.accounts.lock().unwrap_or_else(PoisonError::into_inner);
        if !accounts.contains(account) {
            accounts.insert(account.clone());
        }
        drop(accounts);
        self.woken.notify_one();
    }

    fn take(&self) -> Vec<AccountId> {
        let mut accounts = self.accounts.lock().unwrap_or_else(PoisonError::into_inner);
        accounts.drain().collect()
    }
}

/// Lists `event` as unfanned, inside the caller's transaction.
pub(super) fn list(conn: &Connection, event: &Event) -> rusqlite::Result<()> {
    on_key(
        conn,
        "INSERT OR IGNORE INTO unfanned (account_id, created_at, id) VALUES (?1, ?2, ?3)",
        event,
    )
}

/// Takes `event` off the list, inside the caller's transaction.
pub(super) fn unlist(conn: &Connection, event: &Event) -> rusqlite::Result<()> {
    on_key(
        conn,
        "DELETE FROM unfanned WHERE account_id = ?1 AND created_at = ?2 AND id = ?3",
        event,
    )
}

/// Runs `sql` on the event's key in the list: account, creation time, id.
fn on_key(conn: &Connection, sql: &str, event: &Event) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?
        .execute(params![
            event.account_id.as_str(),
            to_millis(event.created_at),
            event.id.as_str()
        ])
        .map(|_| ())
}

const EVENTS_OF_UNFANNED: &str =
    "SELECT e.account_id, e.id, e.type, e.created_at, e.payload, e.erased_at \
     FROM unfanned u JOIN events e ON e.account_id = u.account_id AND e.id = u.id";

impl SqliteStore {
    /// Waits until an event has been listed as unfanned since the last call, and returns
    /// the accounts of those listed since (possibly none, after a wake-up that an earlier
    /// call already took).
    pub async fn unfanned_signalled(&self) -> Vec<AccountId> {
        let signalled = self.unfanned.take();
        if !signalled.is_empty() {
            return signalled;
        }
        self.unfanned.woken.notified().await;
        self.unfanned.take()
    }

    /// The accounts with unfanned events, read from the file (at start-up: the list
    /// outlives a restart). One index probe per account.
    pub async fn accounts_with_unfanned(&self) -> StoreResult<Vec<AccountId>> {
        self.read(|conn| {
            let mut next = conn
                .prepare_cached("SELECT account_id FROM unfanned WHERE account_id > ?1 ORDER BY account_id LIMIT 1")
                .map_err(backend)?;
            let mut accounts = Vec::new();
            let mut after = String::new();
            while let Some(account) = next
                .query_row(params![after], |r| r.get::<_, String>(0))
                .optional()
                .map_err(backend)?
            {
                accounts.push(AccountId::from_trusted(account.clone()));
                after = account;
            }
            Ok(accounts)
        })
        .await
    }

    /// An account's oldest unfanned events, at most `limit`.
    pub async fn unfanned_of(&self, account: &AccountId, limit: u32) -> StoreResult<Vec<Event>> {
        let account = account.clone();
        self.read(move |conn| {
            conn.prepare_cached(&format!(
                "{EVENTS_OF_UNFANNED} WHERE u.account_id = ?1 ORDER BY u.created_at, u.id LIMIT ?2"
            ))
            .and_then(|mut s| {
                s.query_map(params![account.as_str(), limit], event_from_row)?
                    .collect()
            })
            .map_err(backend)
        })
        .await
    }

    pub(super) async fn unfanned_events(
        &self,
        after: Option<Timestamp>,
        created_before: Timestamp,
        limit: u32,
    ) -> StoreResult<crate::store::UnfannedPage> {
        let after = after.map_or(i64::MIN, to_millis);
        let before = to_millis(created_before);
        let events: Vec<Event> = self
            .read(move |conn| {
                conn.prepare_cached(&format!(
                    "{EVENTS_OF_UNFANNED} WHERE u.created_at > ?1 AND u.created_at <= ?2 \
                     ORDER BY u.created_at, u.account_id, u.id LIMIT ?3"
                ))
                .and_then(|mut s| {
                    s.query_map(params![after, before, limit.max(1)], event_from_row)?
                        .collect()
                })
                .map_err(backend)
            })
            .await?;
        let last = events.last().map(|e| e.created_at);
        Ok(crate::store::UnfannedPage { events, last })
    }

    /// Takes the events off the list and marks those a disabled endpoint missed, in one
    /// transaction, in the first event's account's lane (not its publishes').
    pub(super) async fn mark_fanned_out(
        &self,
        events: &[crate::store::FannedOut],
    ) -> StoreResult<()> {
        let Some(first) = events.first() else {
            return Ok(());
        };
        let lane = Lane::Account(first.event.account_id.clone());
        let done: Vec<crate::store::FannedOut> = events.to_vec();
        let rows = done.len();
        // Neither change touches what `fresh` keeps: the list is not kept, and the missed
        // mark changes nothing a first try reads.
        self.run_for(
            (lane, rows, false),
            move |conn| {
                let tx = JobSavepoint::begin(conn).map_err(backend)?;
                for done in &done {
                    unlist(&tx, &done.event).map_err(backend)?;
                    if done.missed {
                        let event = &done.event;
                        super::events::mark_missed_in(
                            &tx,
                            event.account_id.as_str(),
                            event.id.as_str(),
                        )
                        .map_err(backend)?;
                    }
                }
                tx.commit().map_err(backend)?;
                Ok(())
            },
            |_| {},
        )
        .await
    }

    pub(super) async fn fan_out_progress(
        &self,
        account: &AccountId,
        event: &EventId,
    ) -> StoreResult<Option<EndpointId>> {
        let (account, event) = (account.clone(), event.clone());
        self.read(move |conn| {
            conn.query_row(
                "SELECT fanned_through FROM events WHERE account_id = ?1 AND id = ?2",
                params![account.as_str(), event.as_str()],
                |row| row.get::<_, Option<String>>(0),
            )
            .optional()
            .map_err(backend)
            .map(|through| through.flatten().map(EndpointId::from_trusted))
        })
        .await
    }

    pub(super) async fn record_fan_out_progress(
        &self,
        account: &AccountId,
        event: &EventId,
        through: &EndpointId,
    ) -> StoreResult<()> {
        let keys = (account.as_str().to_owned(), event.as_str().to_owned());
        let through = through.as_str().to_owned();
        // Only forward, as on DynamoDB; nothing a first try reads changes.
        self.run_for(
            (Lane::Account(account.clone()), 1, false),
            move |conn| {
                conn.prepare_cached(
                    "UPDATE events SET fanned_through = ?3 WHERE account_id = ?1 AND id = ?2 \
                     AND (fanned_through IS NULL OR fanned_through < ?3)",
                )
                .and_then(|mut update| update.execute(params![keys.0, keys.1, through]))
                .map(|_| ())
                .map_err(backend)
            },
            |_| {},
        )
        .await
    }
}
