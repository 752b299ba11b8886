//! Replays: the re-queue of one delivery or a filtered range of them.

use super::rows::*;
use super::worker::*;
use super::*;

impl SqliteStore {
    pub(super) async fn replay(&self, request: &ReplayRequest) -> StoreResult<ReplayOutcome> {
        let request = request.clone();
        self.run(move |conn| {
            let mut replay = request.replay;
            let filter = &replay.filter;
            let now = to_millis(replay.requested_at);
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            // The scope and the window narrow the read through an index; which of those
            // deliveries go back is `Replay::selects`, the rule every store applies.
            let mut sql = String::from(
                "SELECT d.id, d.endpoint_id, d.account_id, d.status, d.event_type, d.created_at, \
                 e.status, e.max_in_flight, e.rate_limit FROM deliveries d \
                 JOIN endpoints e ON e.id = d.endpoint_id WHERE d.account_id = ?",
            );
            let mut args: Vec<Value> = vec![Value::Text(replay.account_id.as_str().to_owned())];
            match &replay.scope {
                ReplayScope::Delivery(id) => {
                    sql.push_str(" AND d.id = ?");
                    args.push(Value::Text(id.as_str().to_owned()));
                }
                ReplayScope::Endpoint(id) => {
                    sql.push_str(" AND d.endpoint_id = ?");
                    args.push(Value::Text(id.as_str().to_owned()));
                }
            }
            if let Some(since) = filter.since {
                sql.push_str(" AND d.created_at >= ?");
                args.push(Value::Integer(to_millis(since)));
            }
            if let Some(until) = filter.until {
                sql.push_str(" AND d.created_at < ?");
                args.push(Value::Integer(to_millis(until)));
            }
            sql.push_str(" ORDER BY d.created_at, d.id");
            let mut matched = Vec::new();
            {
                let mut stmt = tx.prepare(&sql).map_err(backend)?;
                let rows = stmt
                    .query_map(rusqlite::params_from_iter(args), |row| {
                        let status: String = row.get(3)?;
                        let endpoint_status: String = row.get(6)?;
                        let rate: Option<i64> = row.get(8)?;
                        let work = PendingRef {
                            delivery_id: DeliveryId::from_trusted(row.get(0)?),
                            endpoint_id: EndpointId::from_trusted(row.get(1)?),
                            account_id: AccountId::from_trusted(row.get(2)?),
                            due: replay.requested_at,
                            max_in_flight: u32_col(row, 7)?,
                            rate_limit_per_second: rate.and_then(|v| u32::try_from(v).ok()),
                        };
                        let status = DeliveryStatus::parse(&status)
                            .ok_or_else(|| corrupt("delivery status", &status))?;
                        let event_type = EventType::from_trusted(row.get(4)?);
                        let created_at = from_millis(row.get(5)?);
                        Ok((work, status, event_type, created_at, endpoint_status == "active"))
                    })
                    .map_err(backend)?;
                // Read one row at a time: the scan stops once the limit is passed.
                for row in rows {
                    let (work, status, event_type, created_at, endpoint_active) =
                        row.map_err(backend)?;
                    let candidate = ReplayCandidate {
                        delivery_id: &work.delivery_id,
                        endpoint_id: &work.endpoint_id,
                        account_id: &work.account_id,
                        status,
                        event_type: &event_type,
                        created_at,
                        endpoint_active,
                        // An event stays in the file while a delivery refers to it.
                        event_kept: true,
                    };
                    if replay.selects(&candidate) {
                        matched.push(work);
                        if matched.len() > request.limit as usize {
                            break;
                        }
                    }
                }
            }
            replay.more = replay.more || matched.len() > request.limit as usize;
            matched.truncate(request.limit as usize);
            {
                let mut update = tx
                    .prepare_cached(
                        "UPDATE deliveries SET status = 'pending', next_try_at = ?2, schedule_start = attempts, \
                         client_errors = 0, next_trigger = 'manual', updated_at = ?2 \
                         WHERE id = ?1 AND status != 'pending'",
                    )
                    .map_err(backend)?;
                for item in &matched {
                    update.execute(params![item.delivery_id.as_str(), now]).map_err(backend)?;
                }
            }
            replay.count = u32::try_from(matched.len()).unwrap_or(u32::MAX);
            let (delivery_id, endpoint_id) = match &replay.scope {
                ReplayScope::Delivery(id) => (Some(id.as_str().to_owned()), None),
                ReplayScope::Endpoint(id) => (None, Some(id.as_str().to_owned())),
            };
            let event_types: Vec<&str> = filter.event_types.iter().map(EventType::as_str).collect();
            tx.execute(
                "INSERT INTO replays (id, account_id, actor, delivery_id, endpoint_id, since, until, statuses, \
                 event_types, requested_at, count, more, include_missed, missed) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                params![
                    replay.id.as_str(),
                    replay.account_id.as_str(),
                    replay.actor,
                    delivery_id,
                    endpoint_id,
                    opt_millis(filter.since),
                    opt_millis(filter.until),
                    statuses_json(&filter.statuses),
                    serde_json::to_string(&event_types).unwrap_or_else(|_| "[]".into()),
                    now,
                    replay.count,
                    replay.more,
                    filter.include_missed,
                    replay.missed,
                ],
            )
            .map_err(|e| {
                if is_unique_violation(&e) {
                    StoreError::Conflict { entity: "replay", id: replay.id.to_string() }
                } else {
                    backend(e)
                }
            })?;
            tx.commit().map_err(backend)?;
            Ok(ReplayOutcome { replay, queued: matched })
        })
        .await
    }

    pub(super) async fn list_replays(
        &self,
        account: &AccountId,
        page: &PageAfter<ReplayId>,
    ) -> StoreResult<Page<Replay>> {
        let account = account.clone();
        // The first page starts after every id there can be (ids are ASCII, and this
        // character's UTF-8 bytes sort after all of ASCII), so that the read seeks either way.
        let after = page
            .after
            .as_ref()
            .map_or_else(|| char::MAX.to_string(), |a| a.as_str().to_owned());
        let limit = page.limit.clamp(1, 500);
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(REPLAYS_PAGE_SQL).map_err(backend)?;
            let mut items = stmt
                .query_map(
                    params![account.as_str(), after, i64::from(limit) + 1],
                    replay_from_row,
                )
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?;
            let next_cursor = if items.len() > limit as usize {
                items.truncate(limit as usize);
                items.last().map(|r| r.id.as_str().to_owned())
            } else {
                None
            };
            Ok(Page { items, next_cursor })
        })
        .await
    }
}

/// One page of an account's replays, newest first, before the id `?2`. Replay ids are
/// time-ordered, so id order is request order.
pub(super) const REPLAYS_PAGE_SQL: &str =
    "SELECT id, account_id, actor, delivery_id, endpoint_id, since, until, statuses, event_types, \
     requested_at, count, more, include_missed, missed FROM replays WHERE account_id = ?1 AND id < ?2 \
     ORDER BY id DESC LIMIT ?3";
