//! Events and their deliveries: publish and fan-out.

use super::rows::*;
use super::worker::*;
use super::*;

impl SqliteStore {
    /// Every item in the one transaction of a store job: an event id that exists returns
    /// the stored event and its deliveries and writes nothing for that item, or, if the item
    /// is another event, refuses the batch and writes nothing at all. An item without
    /// deliveries is the event alone, listed as unfanned until its fan-out is done.
    pub(super) async fn publish_batch(
        &self,
        items: &[crate::store::BatchItem],
    ) -> StoreResult<Vec<PublishOutcome>> {
        let published: Arc<Vec<crate::store::BatchItem>> = Arc::new(items.to_vec());
        let (fresh, unfanned, kept) = (
            Arc::clone(&self.fresh),
            Arc::clone(&self.unfanned),
            Arc::clone(&published),
        );
        let Some(account) = items.first().map(|(event, _)| event.account_id.clone()) else {
            return Ok(Vec::new());
        };
        let rows = published
            .iter()
            .map(|(_, d)| 1 + d.as_ref().map_or(1, Vec::len))
            .sum();
        let remember = move |outcome: &StoreResult<Vec<PublishOutcome>>| {
            if let Ok(outcomes) = outcome {
                for ((event, deliveries), outcome) in kept.iter().zip(outcomes) {
                    if let PublishOutcome::Created = outcome {
                        match deliveries {
                            Some(deliveries) => fresh.remember_published(event, deliveries),
                            None => unfanned.signal(&event.account_id),
                        }
                    }
                }
            }
        };
        let outcomes = self
            .run_for(
                (Lane::Publish(account), rows, true),
                move |conn| {
                    let tx = JobSavepoint::begin(conn).map_err(backend)?;
                    let outcomes = published
                        .iter()
                        .map(|(event, deliveries)| publish_one(&tx, event, deliveries.as_deref()))
                        .collect::<StoreResult<Vec<_>>>()?;
                    tx.commit().map_err(backend)?;
                    Ok(outcomes)
                },
                remember,
            )
            .await?;
        crate::telemetry::deliveries_created(
            items
                .iter()
                .zip(&outcomes)
                .filter(|(_, outcome)| matches!(outcome, PublishOutcome::Created))
                .map(|((_, deliveries), _)| deliveries.as_ref().map_or(0, Vec::len))
                .sum(),
        );
        Ok(outcomes)
    }

    pub(super) async fn publish(
        &self,
        event: &Event,
        deliveries: &[Delivery],
    ) -> StoreResult<PublishOutcome> {
        self.publish_batch(&[(event.clone(), Some(deliveries.to_vec()))])
            .await?
            .pop()
            .ok_or_else(|| StoreError::Backend("a publish of one event answered nothing".into()))
    }

    /// The event alone, listed as unfanned (the embedded shape's change stream) until
    /// `mark_fanned_out`.
    pub(super) async fn put_event(&self, event: &Event) -> StoreResult<PutEventOutcome> {
        let outcome = self
            .publish_batch(&[(event.clone(), None)])
            .await?
            .pop()
            .ok_or_else(|| StoreError::Backend("a publish of one event answered nothing".into()))?;
        Ok(match outcome {
            PublishOutcome::Created => PutEventOutcome::Created,
            PublishOutcome::AlreadyExists { event } => PutEventOutcome::AlreadyExists(event),
        })
    }

    pub(super) async fn add_deliveries(
        &self,
        deliveries: &[Delivery],
    ) -> StoreResult<Vec<Delivery>> {
        let Some(account) = deliveries.first().map(|d| d.account_id.clone()) else {
            return Ok(Vec::new());
        };
        let (deliveries, rows) = (deliveries.to_vec(), deliveries.len());
        let fresh = Arc::clone(&self.fresh);
        let added = self
            .run_for(
                (Lane::Account(account), rows, false),
                move |conn| add_to(conn, None, deliveries),
                move |_| fresh.forget_all(),
            )
            .await?;
        crate::telemetry::deliveries_created(added.len());
        Ok(added)
    }

    /// Not in the account's publish lane, so that its publishes are not queued behind it;
    /// what it adds is kept for the first try, as a publish's deliveries are.
    pub(super) async fn add_deliveries_of(
        &self,
        event: &Event,
        deliveries: &[Delivery],
        // The file is never throttled.
        _deadline: Option<tokio::time::Instant>,
    ) -> StoreResult<Vec<Delivery>> {
        if deliveries.is_empty() {
            return Ok(Vec::new());
        }
        let (deliveries, rows) = (deliveries.to_vec(), deliveries.len());
        let (fresh, kept) = (Arc::clone(&self.fresh), event.clone());
        let keys = (event.account_id.clone(), event.id.clone());
        // A request: the event's end-to-end time waits for it, so a quiet account's fan-out
        // ends a busy batch as its publish does (a busy account's lane is not quiet).
        let added = self
            .run_for(
                (Lane::Account(event.account_id.clone()), rows, true),
                move |conn| add_to(conn, Some(keys), deliveries),
                move |added| {
                    if let Ok(added) = added {
                        fresh.remember_published(&kept, added);
                    }
                },
            )
            .await?;
        crate::telemetry::deliveries_created(added.len());
        Ok(added)
    }

    pub(super) async fn mark_missed(&self, events: &[Event]) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let keys: Vec<(String, String)> = events
            .iter()
            .map(|e| (e.account_id.as_str().to_owned(), e.id.as_str().to_owned()))
            .collect();
        // The mark changes nothing a first try reads: what `fresh` keeps stays good.
        self.run_then(
            move |conn| {
                let tx = JobSavepoint::begin(conn).map_err(backend)?;
                for (account, id) in &keys {
                    mark_missed_in(&tx, account, id).map_err(backend)?;
                }
                tx.commit().map_err(backend)
            },
            |_| {},
        )
        .await
    }

    pub(super) async fn missed_events(
        &self,
        query: &crate::store::MissedQuery,
    ) -> StoreResult<Vec<MissedEvent>> {
        let account = query.account.as_str().to_owned();
        let since = to_millis(query.since);
        let until = query.until.map_or(i64::MAX, to_millis);
        // Past (time, id) of the previous page's last event, or from the window's start.
        let (after_time, after_id) = match &query.after {
            Some((at, id)) => (to_millis(*at), id.as_str().to_owned()),
            None => (since, String::new()),
        };
        let limit = query.limit.clamp(1, 10_000);
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT account_id, id, type, created_at FROM events INDEXED BY events_missed \
                     WHERE account_id = ?1 AND missed IS NOT NULL AND created_at >= ?2 AND created_at < ?3 \
                     AND (created_at, id) > (?4, ?5) ORDER BY created_at, id LIMIT ?6",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map(
                    params![account, since, until, after_time, after_id, limit],
                    |row| {
                        Ok(MissedEvent {
                            account_id: AccountId::from_trusted(row.get(0)?),
                            id: EventId::from_trusted(row.get(1)?),
                            event_type: EventType::from_trusted(row.get(2)?),
                            created_at: from_millis(row.get(3)?),
                        })
                    },
                )
                .map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    pub(super) async fn get_event(
        &self,
        account: &AccountId,
        id: &EventId,
    ) -> StoreResult<Option<Event>> {
        let (account, id) = (account.clone(), id.clone());
        self.read(move |conn| {
            conn.query_row(
                &format!("SELECT {EVENT_COLUMNS} FROM events WHERE account_id = ?1 AND id = ?2"),
                params![account.as_str(), id.as_str()],
                event_from_row,
            )
            .optional()
            .map_err(backend)
        })
        .await
    }

    pub(super) async fn erase_event(
        &self,
        account: &AccountId,
        id: &EventId,
        now: Timestamp,
    ) -> StoreResult<Option<super::super::Erasure>> {
        let (account, id) = (account.clone(), id.clone());
        self.run(move |conn| {
            let job = JobSavepoint::begin(conn).map_err(backend)?;
            let keys = params![account.as_str(), id.as_str()];
            let Some(event) = job
                .prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE account_id = ?1 AND id = ?2"))
                .and_then(|mut s| s.query_row(keys, event_from_row).optional())
                .map_err(backend)?
            else {
                return Ok(None);
            };
            // Erased before its fan-out: it gets no deliveries.
            super::unfanned::unlist(&job, &event).map_err(backend)?;
            let event = event.erased(now);
            let erased_at = event.erased_at.map(to_millis);
            job.execute(
                "UPDATE events SET payload = '', erased_at = ?3, missed = NULL WHERE account_id = ?1 AND id = ?2",
                params![account.as_str(), id.as_str(), erased_at],
            )
            .map_err(backend)?;
            let ended = job
                .execute(
                    "UPDATE deliveries SET status = 'failed', next_try_at = NULL, last_error = ?3, updated_at = ?4 \
                     WHERE account_id = ?1 AND event_id = ?2 AND status = 'pending'",
                    params![account.as_str(), id.as_str(), crate::domain::event::EVENT_ERASED, to_millis(now)],
                )
                .map_err(backend)?;
            // The endpoints' answers may quote what they were sent.
            job.execute(
                "UPDATE attempts SET response_body = '', response_body_truncated = 0 \
                 WHERE (delivery_created_at, delivery_id) IN \
                   (SELECT created_at, id FROM deliveries WHERE account_id = ?1 AND event_id = ?2) \
                 AND response_body != ''",
                keys,
            )
            .map_err(backend)?;
            job.commit().map_err(backend)?;
            // One transaction: all of it or nothing.
            Ok(Some(super::super::Erasure {
                event,
                ended: u32::try_from(ended).unwrap_or(u32::MAX),
                complete: true,
            }))
        })
        .await
    }

    pub(super) async fn deliveries_of_event(&self, event: &Event) -> StoreResult<Vec<Delivery>> {
        let (account, id) = (event.account_id.clone(), event.id.clone());
        self.read(move |conn| {
            deliveries_of_event(conn, account.as_str(), id.as_str()).map_err(backend)
        })
        .await
    }

    pub(super) async fn event_deliveries(
        &self,
        event: &Event,
        page: &PageAfter<EndpointId>,
    ) -> StoreResult<crate::store::EventDeliveries> {
        let (account, id) = (event.account_id.clone(), event.id.clone());
        let (after, limit) = (page.after.clone(), page.limit);
        self.read(move |conn| {
            // One more than asked for tells whether there are more.
            let read = event_deliveries_after(
                conn,
                account.as_str(),
                id.as_str(),
                after.as_ref().map(EndpointId::as_str),
                u64::from(limit) + 1,
            )
            .map_err(backend)?;
            Ok(crate::store::EventDeliveries::first(read, limit))
        })
        .await
    }
}

/// Marks one event missed (see `Store::mark_missed`), inside the caller's transaction.
pub(super) fn mark_missed_in(conn: &Connection, account: &str, id: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE events SET missed = 1 WHERE account_id = ?1 AND id = ?2 AND missed IS NULL \
         AND erased_at IS NULL",
    )?
    .execute(params![account, id])
    .map(|_| ())
}

/// Inserts the deliveries not there yet and returns those; none if `event` (account, id)
/// is given and that event has been erased.
///
/// An event's fan-out (`event` given) runs without a savepoint, which copied every page its
/// inserts touched (7 % of the store thread's time while W1 publishes). Its only writes are
/// one `INSERT OR IGNORE` per delivery, and SQLite undoes a statement that fails part-way,
/// or the whole transaction, so at worst a failure leaves the first deliveries of the event
/// in place and answers an error: the event stays unfanned, and its next fan-out adds the
/// rest (the ids are derived, so nothing twice) and queues the first ones with them, as it
/// does any delivery an earlier run created but never tried. A replay's rows (`event` none)
/// keep their savepoint: it counts what it adds.
fn add_to(
    conn: &mut Connection,
    event: Option<(AccountId, EventId)>,
    deliveries: Vec<Delivery>,
) -> StoreResult<Vec<Delivery>> {
    let added = match event {
        Some((account, id)) => {
            let erased = conn
                .prepare_cached(
                    "SELECT erased_at IS NOT NULL FROM events WHERE account_id = ?1 AND id = ?2",
                )
                .and_then(|mut s| {
                    s.query_row(params![account.as_str(), id.as_str()], |r| {
                        r.get::<_, bool>(0)
                    })
                    .optional()
                })
                .map_err(backend)?;
            if erased == Some(true) {
                return Ok(Vec::new());
            }
            insert_deliveries(conn, &deliveries).map_err(backend)?
        }
        None => {
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            // Only deliveries of events still stored: a purge may have removed the event
            // since the caller read it (a missed event a resend recovers), and a delivery
            // whose event is gone could never be sent.
            let mut stored = tx
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM events WHERE account_id = ?1 AND id = ?2)",
                )
                .map_err(backend)?;
            let live = deliveries
                .iter()
                .map(|d| {
                    stored.query_row(params![d.account_id.as_str(), d.event_id.as_str()], |r| {
                        r.get::<_, bool>(0)
                    })
                })
                .collect::<rusqlite::Result<Vec<bool>>>()
                .map_err(backend)?;
            drop(stored);
            let kept: Vec<Delivery> = deliveries
                .iter()
                .zip(&live)
                .filter(|(_, live)| **live)
                .map(|(d, _)| d.clone())
                .collect();
            let mut inserted = insert_deliveries(&tx, &kept).map_err(backend)?.into_iter();
            tx.commit().map_err(backend)?;
            live.into_iter()
                .map(|live| live && inserted.next().unwrap_or(false))
                .collect()
        }
    };
    Ok(deliveries
        .into_iter()
        .zip(added)
        .filter_map(|(d, new)| new.then_some(d))
        .collect())
}

/// One event and its deliveries inside the caller's transaction; without deliveries
/// (`None`), the event is listed as unfanned. An id that exists is answered with the stored
/// event if `event` is the same one, and is `StoreError::EventConflict` if it is another.
fn publish_one(
    conn: &Connection,
    event: &Event,
    deliveries: Option<&[Delivery]>,
) -> StoreResult<PublishOutcome> {
    let existing = conn
        .prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE account_id = ?1 AND id = ?2"
        ))
        .and_then(|mut s| {
            s.query_row(
                params![event.account_id.as_str(), event.id.as_str()],
                event_from_row,
            )
            .optional()
        })
        .map_err(backend)?;
    if let Some(existing) = existing {
        // Another event under this id: the caller's transaction is not committed, so nothing
        // of the batch is written.
        if let Some(conflict) = existing.conflict_with(event) {
            return Err(conflict.into());
        }
        return Ok(PublishOutcome::AlreadyExists { event: existing });
    }
    insert_event(conn, event).map_err(backend)?;
    match deliveries {
        Some(deliveries) => {
            insert_deliveries(conn, deliveries).map_err(backend)?;
        }
        None => super::unfanned::list(conn, event).map_err(backend)?,
    }
    Ok(PublishOutcome::Created)
}
