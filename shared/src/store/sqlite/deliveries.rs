//! Deliveries: work to send, attempts, due work and the delivery log.

use super::rows::*;
use super::worker::*;
use super::*;

impl SqliteStore {
    pub(super) async fn load_work(
        &self,
        delivery: &DeliveryId,
    ) -> StoreResult<Option<DeliveryWork>> {
        if let Some(work) = self.fresh.take(delivery) {
            return Ok(Some(work));
        }
        let generation = self.fresh.generation();
        let id = delivery.clone();
        let cipher = self.secrets.clone();
        let work = self
            .read_for_send(move |conn| {
                let Some(delivery) = conn
                    .prepare_cached(&format!(
                        "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = ?1"
                    ))
                    .and_then(|mut s| {
                        s.query_row(params![id.as_str()], delivery_from_row)
                            .optional()
                    })
                    .map_err(backend)?
                else {
                    return Ok(None);
                };
                let event = conn
                    .prepare_cached(&format!(
                        "SELECT {EVENT_COLUMNS} FROM events WHERE account_id = ?1 AND id = ?2"
                    ))
                    .and_then(|mut s| {
                        s.query_row(
                            params![delivery.account_id.as_str(), delivery.event_id.as_str()],
                            event_from_row,
                        )
                        .optional()
                    })
                    .map_err(backend)?;
                let endpoint = conn
                    .prepare_cached(&format!(
                        "SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE id = ?1"
                    ))
                    .and_then(|mut s| {
                        s.query_row(params![delivery.endpoint_id.as_str()], |row| {
                            endpoint_from_row(row, &cipher)
                        })
                        .optional()
                    })
                    .map_err(backend)?;
                Ok(Some(DeliveryWork {
                    delivery,
                    event,
                    endpoint,
                }))
            })
            .await?;
        if let Some(endpoint) = work.as_ref().and_then(|w| w.endpoint.as_ref()) {
            self.fresh.remember_endpoint(generation, endpoint);
        }
        Ok(work)
    }

    pub(super) async fn move_unattempted(&self, request: &UnattemptedMove) -> StoreResult<bool> {
        let UnattemptedMove {
            delivery: id,
            expected_attempts,
            change,
            at: now,
        } = request.clone();
        let (fresh, moved) = (Arc::clone(&self.fresh), id.clone());
        self.run_then(
            move |conn| {
                let end = |status: DeliveryStatus, reason: String| {
                    conn.execute(
                        "UPDATE deliveries SET status = ?5, next_try_at = NULL, last_error = ?3, \
                         updated_at = ?4 WHERE id = ?1 AND status = 'pending' AND attempts = ?2",
                        params![
                            id.as_str(),
                            expected_attempts,
                            reason,
                            to_millis(now),
                            status.as_str()
                        ],
                    )
                };
                let changed = match change {
                    // One due time here, and the embedded dispatcher never defers (it takes
                    // only work whose endpoint has room): the next try moves.
                    Unattempted::Defer(until) => conn.execute(
                        "UPDATE deliveries SET next_try_at = ?3, updated_at = ?4 \
                         WHERE id = ?1 AND status = 'pending' AND attempts = ?2",
                        params![
                            id.as_str(),
                            expected_attempts,
                            to_millis(until),
                            to_millis(now)
                        ],
                    ),
                    Unattempted::Fail(reason) => end(DeliveryStatus::Failed, reason),
                    Unattempted::Abandon(reason) => end(DeliveryStatus::Abandoned, reason),
                }
                .map_err(backend)?;
                Ok(changed > 0)
            },
            // Only this delivery changed.
            move |_| fresh.forget_delivery(&moved),
        )
        .await
    }

    pub(super) async fn record_attempt(
        &self,
        record: &AttemptRecord,
    ) -> StoreResult<RecordOutcome> {
        let r = record.clone();
        let (fresh, attempted) = (Arc::clone(&self.fresh), record.attempt.delivery_id.clone());
        let forget = move |recorded: &StoreResult<(RecordOutcome, bool)>| match recorded {
            Ok((_, false)) => fresh.forget_delivery(&attempted),
            Ok((_, true)) | Err(_) => fresh.forget_all(),
        };
        // The delivery's row, the attempt's and the endpoint's hour.
        let recorded = self.run_for((Lane::Account(record.account_id.clone()), 3, false), move |conn| {
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            let update = r.decision.update(r.attempt.error.as_deref());
            let (status, next_try_at, last_error) =
                (update.status, update.next_try_at.map(to_millis), update.last_error);
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
            add_hour_count(&tx, &r)?;
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

    pub(super) async fn pending_deliveries(
        &self,
        due_before: Timestamp,
        page: &PageAfter<DueCursor>,
    ) -> StoreResult<PendingPage> {
        // From the last one looked at, in (due, id) order: `deliveries_pending` holds that
        // order, so a page reads its own rows and no more.
        let (after_due, after_id) = match &page.after {
            Some(cursor) => (to_millis(cursor.due), cursor.id.as_str().to_owned()),
            None => (i64::MIN, String::new()),
        };
        let limit = page.limit;
        let mut refs = self
            .scan(move |conn| {
                let mut stmt = conn
                    .prepare_cached(&format!(
                        "SELECT {PENDING_COLUMNS} FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
                         WHERE d.status = 'pending' AND d.next_try_at <= ?1 \
                         AND (d.next_try_at, d.id) > (?2, ?3) AND e.status = 'active' \
                         ORDER BY d.next_try_at, d.id LIMIT ?4"
                    ))
                    .map_err(backend)?;
                let rows = stmt
                    .query_map(
                        // One more than a page: whether there is a next one.
                        params![to_millis(due_before), after_due, after_id, limit + 1],
                        pending_from_row,
                    )
                    .map_err(backend)?;
                rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
            })
            .await?;
        let more = refs.len() > limit as usize;
        refs.truncate(limit as usize);
        let next = refs.last().filter(|_| more).map(|last| DueCursor {
            due: last.due,
            id: last.delivery_id.clone(),
        });
        Ok(PendingPage { refs, next })
    }

    pub(super) async fn get_delivery(
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

    pub(super) async fn list_deliveries(
        &self,
        account: &AccountId,
        query: &DeliveryQuery,
    ) -> StoreResult<Page<Delivery>> {
        let (account, query) = (account.clone(), query.clone());
        let budget = self.list_examine_budget;
        self.read(move |conn| {
            let (sql, args) = list_sql(&account, &query)?;
            let limit = query.limit.clamp(1, 500) as usize;
            let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
            let mut rows = stmt
                .query(rusqlite::params_from_iter(args))
                .map_err(backend)?;
            // The index's own terms narrow the read; SQLite tries the other filters on each
            // row (the `hit` column), at most `budget` of them. Only the rows that match are
            // decoded: a sparse filter reads its budget of rows at a fraction of the cost.
            let mut items = Vec::new();
            let mut last_read: Option<(i64, String)> = None;
            let mut read = 0;
            let mut cut_short = false;
            while let Some(row) = rows.next().map_err(backend)? {
                read += 1;
                if row.get::<_, bool>(LIST_HIT_COLUMN).map_err(backend)? {
                    let delivery = delivery_from_row(row).map_err(backend)?;
                    debug_assert!(
                        query.matches(&delivery),
                        "the SQL filter and `matches` differ"
                    );
                    items.push(delivery);
                    if items.len() > limit {
                        break;
                    }
                }
                let created_at: i64 = row.get(11).map_err(backend)?;
                let id = row
                    .get_ref(0)
                    .and_then(|v| Ok(v.as_str()?))
                    .map_err(backend)?;
                match &mut last_read {
                    Some((at, last_id)) => {
                        *at = created_at;
                        last_id.clear();
                        last_id.push_str(id);
                    }
                    None => last_read = Some((created_at, id.to_owned())),
                }
                if read >= budget {
                    cut_short = true;
                    break;
                }
            }
            let next_cursor = if items.len() > limit {
                items.truncate(limit);
                items
                    .last()
                    .map(|d| (to_millis(d.created_at), d.id.as_str().to_owned()))
            } else if cut_short {
                // A short page: the next one continues after the last row read.
                last_read
            } else {
                None
            };
            let next_cursor =
                next_cursor.map(|(at, id)| crate::store::cursor::encode(at, id.as_str()));
            Ok(Page { items, next_cursor })
        })
        .await
    }

    pub(super) async fn list_attempts(&self, delivery: &DeliveryId) -> StoreResult<Vec<Attempt>> {
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
}

/// Counts the attempt in its endpoint's hour, in the transaction that records it.
fn add_hour_count(tx: &Connection, r: &AttemptRecord) -> StoreResult<()> {
    let count = r.hour_count();
    let failure = count.last_failure.as_ref();
    // SET reads the row as it was: each `last_failure_*` compares with the old time.
    tx.prepare_cached(
        "INSERT INTO endpoint_hours (endpoint_id, hour, succeeded, failed, last_failure_at, last_failure_status, last_failure_error) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
         ON CONFLICT (endpoint_id, hour) DO UPDATE SET \
         succeeded = succeeded + excluded.succeeded, failed = failed + excluded.failed, \
         last_failure_at = CASE WHEN excluded.last_failure_at >= coalesce(last_failure_at, 0) THEN excluded.last_failure_at ELSE last_failure_at END, \
         last_failure_status = CASE WHEN excluded.last_failure_at >= coalesce(last_failure_at, 0) THEN excluded.last_failure_status ELSE last_failure_status END, \
         last_failure_error = CASE WHEN excluded.last_failure_at >= coalesce(last_failure_at, 0) THEN excluded.last_failure_error ELSE last_failure_error END",
    )
    .and_then(|mut s| {
        s.execute(params![
            r.endpoint_id.as_str(),
            to_millis(count.hour),
            count.succeeded,
            count.failed,
            failure.map(|f| to_millis(f.at)),
            failure.and_then(|f| f.status_code),
            failure.map(|f| f.error.as_str()),
        ])
    })
    .map_err(backend)?;
    Ok(())
}

impl SqliteStore {
    pub(super) async fn endpoint_hours(
        &self,
        endpoint: &EndpointId,
        since: Timestamp,
    ) -> StoreResult<Vec<HourCount>> {
        let (id, since) = (
            endpoint.clone(),
            to_millis(crate::domain::stats::hour_of(since)),
        );
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT hour, succeeded, failed, last_failure_at, last_failure_status, last_failure_error \
                     FROM endpoint_hours WHERE endpoint_id = ?1 AND hour >= ?2 ORDER BY hour",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map(params![id.as_str(), since], |row| {
                    let failed_at: Option<i64> = row.get(3)?;
                    Ok(HourCount {
                        hour: from_millis(row.get(0)?),
                        succeeded: row.get(1)?,
                        failed: row.get(2)?,
                        last_failure: match failed_at {
                            Some(at) => Some(LastFailure {
                                at: from_millis(at),
                                status_code: row.get(4)?,
                                error: row.get::<_, Option<String>>(5)?.unwrap_or_default(),
                            }),
                            None => None,
                        },
                    })
                })
                .map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    /// Counted with each attempt, in its transaction: nothing waits.
    pub(super) async fn flush_hour_counts(&self) -> StoreResult<()> {
        Ok(())
    }
}

/// The columns [`pending_from_row`] reads, over `deliveries d JOIN endpoints e`.
const PENDING_COLUMNS: &str =
    "d.id, d.endpoint_id, d.account_id, d.next_try_at, e.max_in_flight, e.rate_limit";

fn pending_from_row(row: &Row<'_>) -> rusqlite::Result<PendingRef> {
    let rate: Option<i64> = row.get(5)?;
    Ok(PendingRef {
        delivery_id: DeliveryId::from_trusted(row.get(0)?),
        endpoint_id: EndpointId::from_trusted(row.get(1)?),
        account_id: AccountId::from_trusted(row.get(2)?),
        due: from_millis(row.get(3)?),
        max_in_flight: u32_col(row, 4)?,
        rate_limit_per_second: rate.and_then(|v| u32::try_from(v).ok()),
    })
}

/// The window's page from a due key: `(due, id, limit)`.
pub(super) fn pending_from_sql() -> String {
    format!(
        "SELECT {PENDING_COLUMNS} FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
         WHERE d.status = 'pending' AND (d.next_try_at, d.id) >= (?1, ?2) AND e.status = 'active' \
         ORDER BY d.next_try_at, d.id LIMIT ?3"
    )
}

/// One endpoint's due rows: `(endpoint, due_before, limit)`.
pub(super) fn pending_of_endpoint_sql() -> String {
    format!(
        "SELECT {PENDING_COLUMNS} FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
         WHERE d.endpoint_id = ?1 AND d.status = 'pending' AND d.next_try_at <= ?2 \
         AND e.status = 'active' ORDER BY d.next_try_at, d.id LIMIT ?3"
    )
}

/// The embedded queue's window pages its work from here, in due order, over the partial
/// indexes of pending rows (`deliveries_pending`, `deliveries_pending_by_endpoint`).
#[async_trait::async_trait]
impl crate::queue::window::PendingSource for SqliteStore {
    async fn pending_from(
        &self,
        from: &crate::queue::embedded::DueKey,
        limit: u32,
    ) -> StoreResult<Vec<PendingRef>> {
        let (due, id) = (from.0, from.1.as_str().to_owned());
        self.scan(move |conn| {
            let mut stmt = conn.prepare_cached(&pending_from_sql()).map_err(backend)?;
            let rows = stmt
                .query_map(params![due, id, limit], pending_from_row)
                .map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    async fn pending_of_endpoint(
        &self,
        endpoint: &EndpointId,
        due_before: Timestamp,
        limit: u32,
    ) -> StoreResult<Vec<PendingRef>> {
        let endpoint = endpoint.as_str().to_owned();
        self.scan(move |conn| {
            let mut stmt = conn
                .prepare_cached(&pending_of_endpoint_sql())
                .map_err(backend)?;
            let rows = stmt
                .query_map(
                    params![endpoint, to_millis(due_before), limit],
                    pending_from_row,
                )
                .map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }
}

const FAILURE_TERM: &str = " AND status IN ('failed', 'abandoned')";
const ERROR_CODE_TERM: &str = " AND last_status >= 300";

/// The delivery log's query for `query`: each filter narrows an index that starts with the
/// account or the endpoint and ends in the log's order (`created_at DESC, id DESC`), so a
/// page reads its rows in order and never sorts (`tests::every_log_query_reads_an_index_in_order`).
/// Where [`list_sql`] puts its `hit` column: after the delivery's own.
const LIST_HIT_COLUMN: usize = 15;

pub(super) fn list_sql(
    account: &AccountId,
    query: &DeliveryQuery,
) -> StoreResult<(String, Vec<Value>)> {
    // Chosen here rather than by the planner: without table statistics it took the
    // account's index for one endpoint's log, reading the whole account to fill a page.
    // Failures (failed, abandoned, status codes from 300) have partial indexes: delivered
    // rows, the bulk of the log, never enter them, so publishing and sending pay nothing
    // for them. The common values (delivered, pending, 2xx) read the account's or the
    // endpoint's log in order, where they are most of the rows.
    let failure = query
        .status
        .filter(|s| matches!(s, DeliveryStatus::Failed | DeliveryStatus::Abandoned));
    let error_code = query.status_code.filter(|code| *code >= 300);
    let (index, implied) = match (&query.endpoint_id, failure, &query.event_type, error_code) {
        (Some(_), Some(_), _, _) => ("deliveries_by_endpoint_failure", FAILURE_TERM),
        (Some(_), None, _, _) => ("deliveries_by_endpoint", ""),
        (None, Some(_), _, _) => ("deliveries_by_account_failure", FAILURE_TERM),
        (None, None, Some(_), _) => ("deliveries_by_account_type", ""),
        (None, None, None, Some(_)) => ("deliveries_by_account_error_code", ERROR_CODE_TERM),
        (None, None, None, None) => ("deliveries_by_account", ""),
    };
    // The whole filter as the `hit` column, which `list_deliveries` reads before it decodes
    // a row: it is `DeliveryQuery::matches`, term for term.
    let mut hit = Vec::new();
    let mut args: Vec<Value> = Vec::new();
    if let Some(endpoint) = &query.endpoint_id {
        hit.push("endpoint_id = ?");
        args.push(Value::Text(endpoint.as_str().to_owned()));
    }
    if let Some(status) = query.status {
        hit.push("status = ?");
        args.push(Value::Text(status.as_str().to_owned()));
    }
    if let Some(event_type) = &query.event_type {
        hit.push("event_type = ?");
        args.push(Value::Text(event_type.clone()));
    }
    if let Some(code) = query.status_code {
        hit.push("last_status = ?");
        args.push(Value::Integer(i64::from(code)));
    }
    let hit = if hit.is_empty() {
        "1".to_owned()
    } else {
        format!("coalesce({}, 0)", hit.join(" AND "))
    };
    // The partial index's own term, verbatim: SQLite uses a partial index only for a query
    // whose WHERE contains it (a bound parameter proves nothing).
    let mut sql = format!(
        "SELECT {DELIVERY_COLUMNS}, {hit} FROM deliveries INDEXED BY {index} WHERE account_id = ?{implied}"
    );
    args.push(Value::Text(account.as_str().to_owned()));
    // The chosen index's key terms (the index is read in order only with its second column
    // fixed); the rest of the filter is the `hit` column, tried on each row read (see
    // `list_deliveries`).
    if let Some(endpoint) = &query.endpoint_id {
        sql.push_str(" AND endpoint_id = ?");
        args.push(Value::Text(endpoint.as_str().to_owned()));
    }
    match (index, failure, &query.event_type, error_code) {
        (
            "deliveries_by_endpoint_failure" | "deliveries_by_account_failure",
            Some(status),
            _,
            _,
        ) => {
            sql.push_str(" AND status = ?");
            args.push(Value::Text(status.as_str().to_owned()));
        }
        ("deliveries_by_account_type", _, Some(event_type), _) => {
            sql.push_str(" AND event_type = ?");
            args.push(Value::Text(event_type.clone()));
        }
        ("deliveries_by_account_error_code", _, _, Some(code)) => {
            sql.push_str(" AND last_status = ?");
            args.push(Value::Integer(i64::from(code)));
        }
        _ => {}
    }
    // The window and the cursor are bounds on the index's (created_at, id), written as row
    // values so that the index seeks to them: `created_at < until` is `(created_at, id) <
    // (until, '')`, and the cursor is a tighter upper bound. A page deep in the log then
    // costs what the first one does, rather than reading every newer row first.
    if let Some(since) = query.since {
        sql.push_str(" AND (created_at, id) >= (?, '')");
        args.push(Value::Integer(to_millis(since)));
    }
    let mut upper = query.until.map(|until| (to_millis(until), String::new()));
    if let Some(cursor) = &query.cursor {
        let position =
            crate::store::cursor::decode(cursor).ok_or(StoreError::NotFound("cursor"))?;
        if upper.as_ref().is_none_or(|u| position < *u) {
            upper = Some(position);
        }
    }
    if let Some((created, id)) = upper {
        sql.push_str(" AND (created_at, id) < (?, ?)");
        args.push(Value::Integer(created));
        args.push(Value::Text(id));
    }
    sql.push_str(" ORDER BY created_at DESC, id DESC");
    Ok((sql, args))
}
