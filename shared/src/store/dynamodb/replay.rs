//! Replays: the conditional re-queue of one delivery or a filtered range of them.

use super::items::*;
use super::*;
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use std::collections::HashSet;

impl DynamoStore {
    /// A final delivery back to `pending`, due now, its next try manual (see `Store::replay`).
    pub(super) fn replay_delivery_update(
        &self,
        delivery: &Delivery,
        now: Timestamp,
    ) -> StoreResult<TransactWriteItem> {
        let id = delivery.id.as_str();
        let update = Update::builder()
            .table_name(&self.tables.deliveries)
            .set_key(delivery_key(&delivery.id))
            .update_expression(
                "SET #status = :pending, next_try_at = :now, due_key = :due_key, pending_shard = :shard, \
                 schedule_start = attempts, client_errors = :zero, \
                 next_trigger = :manual, updated_at = :now REMOVE expires_at",
            )
            .condition_expression("#status <> :pending")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":pending", s("pending"))
            .expression_attribute_values(":now", n(to_millis(now)))
            .expression_attribute_values(":due_key", s(time_key(now, id)))
            .expression_attribute_values(":shard", s(pending_shard(id)))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":manual", s(Trigger::Manual.as_str()))
            .build()
            .map_err(build_error)?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Adds `count` to the audit record of a replay written by an earlier transaction.
    pub(super) fn replay_count_update(
        &self,
        replay: &Replay,
        sort: u128,
        count: u32,
    ) -> StoreResult<TransactWriteItem> {
        let update = Update::builder()
            .table_name(&self.tables.attempts)
            .set_key(Some(replay_key(replay, sort)))
            .update_expression("ADD #count :count")
            .condition_expression("attribute_exists(replay_id)")
            .expression_attribute_names("#count", "count")
            .expression_attribute_values(":count", n(count))
            .build()
            .map_err(build_error)?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    pub(super) async fn replay(&self, request: &ReplayRequest) -> StoreResult<ReplayOutcome> {
        let mut replay = request.replay.clone();
        let limit = request.limit as usize;
        let mut selected = Selected::default();
        match &replay.scope {
            ReplayScope::Delivery(id) => {
                let candidates = self.get_logged_delivery(id).await?.into_iter().collect();
                self.select_for_replay(&replay, candidates, &mut selected, limit)
                    .await?;
            }
            ReplayScope::Endpoint(endpoint) => {
                self.select_from_log(&replay, endpoint, &mut selected, limit)
                    .await?;
            }
        }
        let mut matched = selected.matched;
        replay.more = replay.more || matched.len() > limit;
        matched.truncate(limit);
        let now = replay.requested_at;
        self.keep_events_for_retries(matched.iter().map(|(delivery, _, _)| delivery), now)
            .await?;
        let sort = replay_sort(&replay.id, now);
        let mut queued = Vec::with_capacity(matched.len());
        let mut audit_written = false;
        // Each transaction sets up to 99 deliveries back to pending together with the audit
        // record (put by the first, its count raised by the others): a write that fails
        // leaves neither a delivery pending without its audit record nor a record counting
        // deliveries that were not replayed.
        for chunk in matched.chunks(MAX_TRANSACTION_ITEMS - 1) {
            let mut remaining: Vec<&(Delivery, u32, Option<u32>)> = chunk.iter().collect();
            loop {
                let count = u32::try_from(remaining.len()).unwrap_or(u32::MAX);
                let audit = if audit_written {
                    self.replay_count_update(&replay, sort, count)?
                } else {
                    let mut first = replay.clone();
                    first.count = count;
                    TransactWriteItem::builder()
                        .put(
                            Put::builder()
                                .table_name(&self.tables.attempts)
                                .set_item(Some(replay_item(&first, sort)))
                                .condition_expression(NO_RECORD_YET)
                                .build()
                                .map_err(build_error)?,
                        )
                        .build()
                };
                let mut items = vec![audit];
                for (delivery, _, _) in &remaining {
                    items.push(self.replay_delivery_update(delivery, now)?);
                }
                match self.transact(items).await {
                    Ok(()) => break,
                    // Some went back to pending meanwhile (another replay): those are left
                    // out, not counted, and the rest is written again.
                    Err(TransactionFailure::Conditions(failed))
                        if failed.iter().all(|&i| i > 0) =>
                    {
                        let mut position = 0;
                        remaining.retain(|_| {
                            position += 1;
                            !failed.contains(&position)
                        });
                    }
                    Err(TransactionFailure::Conditions(failed))
                        if !audit_written && failed.contains(&0) =>
                    {
                        return Err(replay_taken(&replay));
                    }
                    Err(failure) if !audit_written => return Err(failure.into_store_error()),
                    Err(failure) => {
                        // What was written stands and is queued; the caller (and, if this
                        // write goes through, the record) is told there is more to replay.
                        tracing::error!(replay.id = %replay.id, error = %failure.into_store_error(), "replay cut short");
                        replay.more = true;
                        replay.count = u32::try_from(queued.len()).unwrap_or(u32::MAX);
                        let mark = self
                            .client
                            .update_item()
                            .table_name(&self.tables.attempts)
                            .set_key(Some(replay_key(&replay, sort)))
                            .update_expression("SET more = :more")
                            .condition_expression("attribute_exists(replay_id)")
                            .expression_attribute_values(":more", AttributeValue::Bool(true))
                            .send()
                            .await;
                        if let Err(error) = mark {
                            tracing::warn!(replay.id = %replay.id, error = %sdk(error), "replay record not marked `more`");
                        }
                        return Ok(ReplayOutcome { replay, queued });
                    }
                }
            }
            audit_written = true;
            queued.extend(remaining.iter().map(
                |(delivery, max_in_flight, rate_limit_per_second)| PendingRef {
                    delivery_id: delivery.id.clone(),
                    endpoint_id: delivery.endpoint_id.clone(),
                    account_id: delivery.account_id.clone(),
                    due: now,
                    max_in_flight: *max_in_flight,
                    rate_limit_per_second: *rate_limit_per_second,
                },
            ));
        }
        replay.count = u32::try_from(queued.len()).unwrap_or(u32::MAX);
        if !audit_written {
            // Nothing matched: the request is still on record.
            let put = self
                .client
                .put_item()
                .table_name(&self.tables.attempts)
                .condition_expression(NO_RECORD_YET);
            let item = with_put_token(replay_item(&replay, sort));
            if put_once(put, item).await?.is_none() {
                return Err(replay_taken(&replay));
            }
        }
        Ok(ReplayOutcome { replay, queued })
    }

    /// Selects from the endpoint's log, oldest first, until `limit + 1` are selected (the one
    /// past the limit tells the caller there is more) or the window ends. Read a page at a
    /// time, with the status and event-type clauses in the query's filter, so what is held
    /// is the selection and one page, not the window (a month of an endpoint's deliveries is
    /// more than the api function's memory). `Replay::selects` still decides each one.
    async fn select_from_log(
        &self,
        replay: &Replay,
        endpoint: &EndpointId,
        selected: &mut Selected,
        limit: usize,
    ) -> StoreResult<()> {
        let filter = &replay.filter;
        if filter.statuses.is_empty() {
            // Selects nothing (and DynamoDB refuses an empty `IN`).
            return Ok(());
        }
        // Nothing of an endpoint that is not active is selected: no need to read its log.
        let current = self.get_endpoint(&replay.account_id, endpoint).await?;
        let active = current
            .as_ref()
            .is_some_and(|e| e.status == EndpointStatus::Active);
        selected.endpoints.insert(endpoint.clone(), current);
        if !active {
            return Ok(());
        }
        let Some((mut request, mut condition)) = self.endpoint_log_query(
            &replay.account_id,
            endpoint,
            filter.since,
            filter.until,
            LogFilter::All,
            true,
        ) else {
            return Ok(());
        };
        let mut statuses = Vec::with_capacity(filter.statuses.len());
        for (i, status) in filter.statuses.iter().enumerate() {
            let name = format!(":status{i}");
            request = request.expression_attribute_values(&name, s(status.as_str()));
            statuses.push(name);
        }
        condition.push_str(&format!(" AND #status IN ({})", statuses.join(", ")));
        request = request.expression_attribute_names("#status", "status");
        // DynamoDB takes at most 100 operands in an `IN`; past that the types are checked
        // on the deliveries read alone.
        if !filter.event_types.is_empty() && filter.event_types.len() <= MAX_IN_OPERANDS {
            let mut types = Vec::with_capacity(filter.event_types.len());
            for (i, event_type) in filter.event_types.iter().enumerate() {
                let name = format!(":type{i}");
                request = request.expression_attribute_values(&name, s(event_type.as_str()));
                types.push(name);
            }
            condition.push_str(&format!(" AND event_type IN ({})", types.join(", ")));
        }
        let request = request.filter_expression(condition);
        let mut start: Option<Item> = None;
        loop {
            // `Limit` counts the items read before the filter: what is still wanted (all of
            // them may match), but no fewer than a page, so that a filter matching few of
            // a long window takes pages (DynamoDB ends one at 1 MB first), not a round trip
            // per delivery.
            let wanted = (limit + 1).saturating_sub(selected.matched.len());
            let page = wanted.max((limit + 1).min(REPLAY_PAGE_ITEMS));
            let out = request
                .clone()
                .set_exclusive_start_key(start.take())
                .limit(i32::try_from(page).unwrap_or(i32::MAX))
                .send()
                .await
                .map_err(sdk)?;
            let candidates = out
                .items
                .unwrap_or_default()
                .iter()
                .map(delivery_from_item)
                .collect::<StoreResult<Vec<_>>>()?;
            if self
                .select_for_replay(replay, candidates, selected, limit)
                .await?
            {
                return Ok(());
            }
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(()),
            }
        }
    }

    /// Adds to `selected` those of `candidates` (in their order) the replay selects, until it
    /// holds `limit + 1`; whether it does.
    async fn select_for_replay(
        &self,
        replay: &Replay,
        candidates: Vec<Delivery>,
        selected: &mut Selected,
        limit: usize,
    ) -> StoreResult<bool> {
        let kept_longer = self
            .events_kept_past_their_retention(&candidates, replay.requested_at)
            .await?;
        for delivery in candidates {
            if !selected.endpoints.contains_key(&delivery.endpoint_id) {
                let endpoint = self
                    .get_endpoint(&delivery.account_id, &delivery.endpoint_id)
                    .await?;
                selected
                    .endpoints
                    .insert(delivery.endpoint_id.clone(), endpoint);
            }
            let endpoint = selected
                .endpoints
                .get(&delivery.endpoint_id)
                .and_then(Option::as_ref);
            let candidate = ReplayCandidate {
                delivery_id: &delivery.id,
                endpoint_id: &delivery.endpoint_id,
                account_id: &delivery.account_id,
                status: delivery.status,
                event_type: &delivery.event_type,
                created_at: delivery.created_at,
                endpoint_active: endpoint.is_some_and(|e| e.status == EndpointStatus::Active),
                // An event past retention is gone (TTL): its deliveries cannot be sent again,
                // unless a replay or a late delivery kept it longer.
                event_kept: crate::clock::add(delivery.created_at, self.retention.events)
                    > replay.requested_at
                    || kept_longer
                        .contains(&(delivery.account_id.clone(), delivery.event_id.clone())),
            };
            let Some(endpoint) = endpoint.filter(|_| replay.selects(&candidate)) else {
                continue;
            };
            let (max_in_flight, rate_limit) =
                (endpoint.max_in_flight, endpoint.rate_limit_per_second);
            selected.matched.push((delivery, max_in_flight, rate_limit));
            if selected.matched.len() > limit {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Of the events of `deliveries` past the retention they were written with at `at`, those
    /// whose TTL a replay or a late delivery moved past `at` (`keep_events_for_retries`):
    /// read, since only the item knows.
    async fn events_kept_past_their_retention(
        &self,
        deliveries: &[Delivery],
        at: Timestamp,
    ) -> StoreResult<HashSet<(AccountId, EventId)>> {
        let mut old: Vec<(&str, &str)> = deliveries
            .iter()
            .filter(|d| crate::clock::add(d.created_at, self.retention.events) <= at)
            .map(|d| (d.account_id.as_str(), d.event_id.as_str()))
            .collect();
        // DynamoDB refuses a BatchGetItem that names one key twice.
        old.sort_unstable();
        old.dedup();
        let keys: Vec<Item> = old
            .into_iter()
            .map(|(account, event)| account_key(account, event))
            .collect();
        let items = self
            .batch_get(
                &self.tables.events,
                &keys,
                Some("account_id, id, expires_at"),
            )
            .await?;
        let at = to_millis(at).div_euclid(1000);
        Ok(items
            .iter()
            // Without a TTL (an outbox item fan-out has yet to mark), nothing removes it.
            .filter(|item| expiry(item).is_none_or(|expires| expires > at))
            .filter_map(|item| {
                Some((
                    AccountId::from_trusted(get_s(item, "account_id").ok()?),
                    EventId::from_trusted(get_s(item, "id").ok()?),
                ))
            })
            .collect())
    }

    pub(super) async fn list_replays(
        &self,
        account: &AccountId,
        page: &PageAfter<ReplayId>,
    ) -> StoreResult<Page<Replay>> {
        let limit = page.limit.clamp(1, 500) as usize;
        let (mut replays, _) = self
            .replays_before(account, page.after.as_ref(), limit)
            .await?;
        // Replay ids are time-ordered: newest first, then strictly older than the cursor.
        replays.sort_by(|a, b| b.id.cmp(&a.id));
        if let Some(after) = &page.after {
            replays.retain(|r| r.id < *after);
        }
        let next_cursor = if replays.len() > limit {
            replays.truncate(limit);
            replays.last().map(|r| r.id.as_str().to_owned())
        } else {
            None
        };
        Ok(Page {
            items: replays,
            next_cursor,
        })
    }

    /// An account's replay records, newest first, those with a sort key below `below` only.
    fn replays_query(&self, account: &AccountId, below: Option<u128>) -> QueryFluentBuilder {
        let request = self
            .client
            .query()
            .table_name(&self.tables.attempts)
            .expression_attribute_values(":pk", s(replays_partition(account)))
            .scan_index_forward(false);
        match below {
            None => request.key_condition_expression("delivery_id = :pk"),
            Some(bound) => request
                .key_condition_expression("delivery_id = :pk AND #sort < :bound")
                .expression_attribute_names("#sort", "number")
                .expression_attribute_values(":bound", n(bound)),
        }
    }

    /// The `limit + 1` newest of an account's replay records older than `after` (the
    /// sort key is id order), and how many records DynamoDB returned to find them.
    pub(super) async fn replays_before(
        &self,
        account: &AccountId,
        after: Option<&ReplayId>,
        limit: usize,
    ) -> StoreResult<(Vec<Replay>, usize)> {
        let (request, wanted) = match after.map(generated_sort) {
            None => (self.replays_query(account, None), limit + 1),
            Some(Some(bound)) => (self.replays_query(account, Some(bound)), limit + 1),
            // A cursor that is no generated id says nothing of where to start: read all.
            Some(None) => (self.replays_query(account, None), usize::MAX),
        };
        let mut items = self.query_at_most(request, wanted).await?;
        // Records written when the sort key was the time × 1000 and a random 0..999 (all
        // below `OLD_KEYS_END`) are in no id order among themselves: once a page reaches
        // them, they are read whole. Their ids are older than every id-ordered record's.
        if items.len() == wanted && items.last().is_some_and(has_old_key) {
            let old = self
                .query_all(self.replays_query(account, Some(OLD_KEYS_END)))
                .await?;
            items.retain(|item| !has_old_key(item));
            items.extend(old);
        }
        let replays = items
            .iter()
            .map(replay_from_item)
            .collect::<StoreResult<Vec<_>>>()?;
        Ok((replays, items.len()))
    }
}

/// The fewest deliveries one page of a bulk replay's read asks for (when its limit is
/// higher): about 1 MB of deliveries, where DynamoDB ends a page anyway.
const REPLAY_PAGE_ITEMS: usize = 1_000;

/// DynamoDB's limit of operands in a condition's `IN`.
const MAX_IN_OPERANDS: usize = 100;

/// What a replay has selected so far: the deliveries, each with its endpoint's
/// `max_in_flight` and rate limit, and the endpoints read (`None`: gone).
#[derive(Default)]
struct Selected {
    matched: Vec<(Delivery, u32, Option<u32>)>,
    endpoints: HashMap<EndpointId, Option<Endpoint>>,
}

/// Below this, a replay record's sort key is of the earlier kind (milliseconds × 1000 and a
/// random 0..999); every id-ordered key (milliseconds << 48 and more) is above it.
const OLD_KEYS_END: u128 = 1 << 64;

/// A replay's record is put only where none is: its key is 96 bits of its id, and two ids
/// that share them must not overwrite one another's record (the SQLite store refuses a
/// second row with the same id the same way).
const NO_RECORD_YET: &str = "attribute_not_exists(replay_id)";

fn replay_taken(replay: &Replay) -> StoreError {
    StoreError::Conflict {
        entity: "replay",
        id: replay.id.to_string(),
    }
}

fn has_old_key(item: &Item) -> bool {
    matches!(item.get("number"), Some(AttributeValue::N(key)) if key.parse::<u128>().is_ok_and(|key| key < OLD_KEYS_END))
}

/// The sort key of a replay's audit record. For a generated id (a UUIDv7: the Unix
/// milliseconds of its making, then a counter that orders ids made in the same millisecond)
/// its first 96 bits, so that record order is id order and a page of the list starts
/// reading at its cursor. An id made elsewhere counts from `now`, with random bits after.
pub(super) fn replay_sort(id: &ReplayId, now: Timestamp) -> u128 {
    generated_sort(id).unwrap_or_else(|| {
        let millis = u128::try_from(to_millis(now)).unwrap_or(0);
        (millis << 48) | (7 << 44) | u128::from(rand::random::<u64>() >> 20)
    })
}

/// The first 96 bits of a generated replay id: `rpl_` and a UUIDv7 in 32 lower-case hex
/// digits.
fn generated_sort(id: &ReplayId) -> Option<u128> {
    let hex = id.as_str().strip_prefix("rpl_")?;
    let lower_hex = hex
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if hex.len() != 32 || !lower_hex || hex.get(12..13) != Some("7") {
        return None;
    }
    u128::from_str_radix(hex.get(..24)?, 16).ok()
}
