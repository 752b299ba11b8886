//! Failing endpoints: the failing clock, disabling, abandoning their pending work.

use super::items::*;
use super::*;

/// The condition of the failing clock's writes: an endpoint that exists and is not being
/// disabled. An attempt in flight when the endpoint was disabled must not write over the
/// `disabling` marker, or a disable that stopped part way is never finished; on an endpoint
/// enabled again the marker is stale, and the clock writes over it.
const NOT_DISABLING: &str = "attribute_exists(id) AND attribute_not_exists(#deleted) \
     AND (attribute_not_exists(failing_shard) OR failing_shard <> :disabling \
     OR #status = :active)";

/// How long an endpoint's disable or delete spends abandoning its pending work: well inside
/// the api function's 30 s (API Gateway's longest wait), with the transaction and the audit
/// entry around it.
const ABANDON_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// How long one health check spends finishing disables that stopped part way.
const FINISHING_BUDGET: std::time::Duration = std::time::Duration::from_secs(60);

/// What an abandon got through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Abandoned {
    pub count: u64,
    /// Every pending delivery found was handled.
    pub complete: bool,
}

impl DynamoStore {
    /// An endpoint's deliveries created in [`from`, `until`] (unbounded where `None`) that
    /// are pending without an attempt and outside the `pending` index.
    pub(super) async fn unindexed_pending_of(
        &self,
        account: &AccountId,
        endpoint: &EndpointId,
        from: Option<Timestamp>,
        until: Option<Timestamp>,
    ) -> StoreResult<Vec<Item>> {
        self.endpoint_log(
            account,
            endpoint,
            from,
            until,
            LogFilter::UnindexedFirstTries,
            false,
        )
        .await
    }

    /// Moves the pending deliveries of an endpoint to `abandoned`, each by a conditional
    /// write (so one that was delivered meanwhile stays delivered), until `deadline`: the
    /// owner's disable or delete runs in an API request (30 s on AWS), so each spends
    /// [`ABANDON_BUDGET`] at most. What it leaves is inert (no sender sends to a disabled
    /// or deleted endpoint) and is abandoned at its next try, or by the health check's
    /// finishing pass. With `whole_log`, the endpoint's whole log is read for what is outside
    /// the index, not only what the sweeper's walk has not reached: the walk passes over a
    /// deleted endpoint, so its first tries below the watermark were never indexed.
    pub(super) async fn abandon_pending_within(
        &self,
        account: &AccountId,
        endpoint: &EndpointId,
        reason: &str,
        now: Timestamp,
        (deadline, whole_log): (std::time::Instant, bool),
    ) -> StoreResult<Abandoned> {
        // Rare (an endpoint disabled or deleted), so it reads the whole `pending` index
        // rather than every delivery paying for an index of its own (two index writes each);
        // over a large backlog that read alone is long, so it gets half the time, and what
        // it found is abandoned with the rest. Each pass starts at another shard, and what it
        // abandons leaves the index: passes over a backlog longer than one get through it.
        let read_until = std::time::Instant::now()
            + deadline.saturating_duration_since(std::time::Instant::now()) / 2;
        let first = rand::Rng::random_range(&mut rand::rng(), 0..PENDING_SHARDS);
        let mut read_all = true;
        let mut keys = Vec::new();
        'shards: for turn in 0..PENDING_SHARDS {
            let shard = (first + turn) % PENDING_SHARDS;
            let request = self
                .client
                .query()
                .table_name(&self.tables.deliveries)
                .index_name("pending")
                .key_condition_expression("pending_shard = :shard")
                .filter_expression("account_id = :a AND endpoint_id = :e")
                .expression_attribute_values(":shard", s(shard.to_string()))
                .expression_attribute_values(":a", s(account.as_str()))
                .expression_attribute_values(":e", s(endpoint.as_str()));
            let mut start: Option<Item> = None;
            loop {
                if std::time::Instant::now() >= read_until {
                    read_all = false;
                    break 'shards;
                }
                let out = request
                    .clone()
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .map_err(sdk)?;
                keys.extend(out.items.unwrap_or_default());
                match out.last_evaluated_key {
                    Some(key) if !key.is_empty() => start = Some(key),
                    _ => break,
                }
            }
        }
        if read_all {
            // New deliveries perhaps not yet in the index: the walk has looked at everything
            // below its watermark (less the margin for late writes); the rest is read from
            // the endpoint's log, strongly consistent and whether indexed or not (the index
            // is read eventually consistent, so an entry just written may be missing from it).
            let watermark = if whole_log {
                None
            } else {
                self.get(&self.tables.control, key1("pk", FIRST_TRY_WATERMARK))
                    .await?
                    .map(|item| opt_n::<i64>(&item, "watermark"))
                    .transpose()?
                    .flatten()
            };
            let from = watermark.map(|w| {
                from_millis(w) - chrono::TimeDelta::from_std(LATE_WRITE_MARGIN).unwrap_or_default()
            });
            keys.extend(
                self.endpoint_log(account, endpoint, from, None, LogFilter::Pending, true)
                    .await?,
            );
        }
        let mut seen = std::collections::HashSet::new();
        keys.retain(|item| seen.insert(opt_s(item, "id")));
        // In transactions of up to 99 deliveries, each with a check that the endpoint is
        // still disabled (a deleted one's tombstone is too): an enable meanwhile stops the
        // abandon, which would otherwise go on for the rest of its budget abandoning what the
        // owner enabled the endpoint again for. A delivery moves only if still pending: one
        // that is not is left out and the rest written again, so running this again after a
        // failure part-way finishes the rest and changes nothing else. One transaction at a
        // time: two holding the same endpoint check would conflict.
        let still_disabled = aws_sdk_dynamodb::types::ConditionCheck::builder()
            .table_name(&self.tables.endpoints)
            .set_key(Some(account_key(account.as_str(), endpoint.as_str())))
            .condition_expression("#status = :disabled")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":disabled", s("disabled"))
            .build()
            .map_err(build_error)?;
        let mut abandoned = Abandoned {
            count: 0,
            complete: read_all,
        };
        for chunk in keys.chunks(MAX_TRANSACTION_ITEMS - 1) {
            if std::time::Instant::now() >= deadline {
                abandoned.complete = false;
                break;
            }
            let mut remaining: Vec<&Item> = chunk.iter().collect();
            while !remaining.is_empty() {
                let check = TransactWriteItem::builder().condition_check(still_disabled.clone());
                let mut items = vec![check.build()];
                for item in &remaining {
                    items.push(self.abandon_update(item, reason, now)?);
                }
                match self.transact(items).await {
                    Ok(()) => {
                        abandoned.count += remaining.len() as u64;
                        break;
                    }
                    // Enabled again (or another endpoint made under a deleted one's id).
                    Err(TransactionFailure::Conditions(failed)) if failed.contains(&0) => {
                        return Ok(abandoned);
                    }
                    // No longer pending (delivered meanwhile): left as they are.
                    Err(TransactionFailure::Conditions(failed)) => {
                        let mut position = 0;
                        remaining.retain(|_| {
                            position += 1;
                            !failed.contains(&position)
                        });
                    }
                    Err(failure) => return Err(failure.into_store_error()),
                }
            }
        }
        Ok(abandoned)
    }

    /// The write that abandons a delivery of the log (`item`, as read) if it is still pending.
    fn abandon_update(
        &self,
        item: &Item,
        reason: &str,
        now: Timestamp,
    ) -> StoreResult<TransactWriteItem> {
        let update = Update::builder()
            .table_name(&self.tables.deliveries)
            .set_key(Some(stored_delivery_key(item)?))
            .update_expression(
                "SET #status = :abandoned, last_error = :reason, updated_at = :now, \
                 expires_at = :expires REMOVE next_try_at, pending_shard, due_key",
            )
            .expression_attribute_values(":expires", self.log_expiry(now))
            .condition_expression("#status = :pending")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":abandoned", s("abandoned"))
            .expression_attribute_values(":pending", s("pending"))
            .expression_attribute_values(":reason", s(reason))
            .expression_attribute_values(":now", n(to_millis(now)))
            .build()
            .map_err(build_error)?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Abandons a disabled endpoint's pending deliveries, then moves the endpoint back from
    /// the `disabling` partition of the `failing` index (where the disabling transaction put
    /// it) to the `failing` one. Until that last write the endpoint stays findable, so the
    /// next health check (`failing_endpoints`) finishes an abandon that failed part-way.
    pub(super) async fn finish_disabling(
        &self,
        account: &AccountId,
        endpoint: &EndpointId,
        reason: &str,
        now: Timestamp,
    ) -> StoreResult<u64> {
        let deadline = std::time::Instant::now() + ABANDON_BUDGET;
        let abandoned = self
            .abandon_pending_within(
                account,
                endpoint,
                &format!("abandoned: {reason}"),
                now,
                (deadline, false),
            )
            .await?;
        if !abandoned.complete {
            // The marker stays: the next health check goes on with the rest.
            tracing::info!(endpoint.id = %endpoint, abandoned = abandoned.count, "the disabled endpoint's pending work is abandoned part way; the rest at its next try or the next health check");
            return Ok(abandoned.count);
        }
        let abandoned = abandoned.count;
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.endpoints)
            .set_key(Some(account_key(account.as_str(), endpoint.as_str())))
            .update_expression("SET failing_shard = :failing")
            // A delete meanwhile made it a tombstone whose own finishing is still to do.
            .condition_expression("failing_shard = :disabling AND attribute_not_exists(#deleted)")
            .expression_attribute_names("#deleted", DELETED_AT)
            .expression_attribute_values(":failing", s(FAILING_SHARD))
            .expression_attribute_values(":disabling", s(DISABLING_SHARD))
            .send()
            .await;
        // Not written: already finished, or the endpoint was deleted or rewritten meanwhile.
        written(result)?;
        Ok(abandoned)
    }

    /// Abandons a deleted endpoint's pending deliveries, then takes its tombstone out of the
    /// `failing` index, where the delete put it; until then the next health check finds it
    /// and goes on, as for a disable (a delivery whose message was lost has no next try of
    /// its own, and pending work is never removed by retention).
    pub(super) async fn finish_deleting(
        &self,
        account: &AccountId,
        endpoint: &EndpointId,
        deleted_at: Timestamp,
    ) -> StoreResult<u64> {
        let deadline = std::time::Instant::now() + ABANDON_BUDGET;
        let abandoned = self
            .abandon_pending_within(
                account,
                endpoint,
                "endpoint deleted",
                deleted_at,
                (deadline, true),
            )
            .await?;
        if !abandoned.complete {
            tracing::info!(endpoint.id = %endpoint, abandoned = abandoned.count, "the deleted endpoint's pending work is abandoned part way; the rest at its next try or the next health check");
            return Ok(abandoned.count);
        }
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.endpoints)
            .set_key(Some(account_key(account.as_str(), endpoint.as_str())))
            .update_expression("REMOVE failing_shard, failing_since")
            .condition_expression("attribute_exists(#deleted) AND failing_shard = :disabling")
            .expression_attribute_names("#deleted", DELETED_AT)
            .expression_attribute_values(":disabling", s(DISABLING_SHARD))
            .send()
            .await;
        written(result)?;
        Ok(abandoned.count)
    }

    /// The endpoint's failing clock after an attempt, written only when it starts or stops
    /// (like the SQLite store): a healthy endpoint's row is read, not rewritten, per attempt.
    /// The read is strongly consistent, so an attempt recorded after another one sees it.
    pub(super) async fn track_failing_clock(
        &self,
        account: &AccountId,
        r: &AttemptRecord,
    ) -> StoreResult<Option<Timestamp>> {
        let Some(endpoint) = self.get_endpoint_item(account, &r.endpoint_id).await? else {
            return Ok(None);
        };
        let key = account_key(account.as_str(), r.endpoint_id.as_str());
        match (r.success, endpoint.failing_since) {
            (true, None) => Ok(None),
            (false, Some(since)) => Ok(Some(since)),
            (true, Some(_)) => {
                let result = self
                    .client
                    .update_item()
                    .table_name(&self.tables.endpoints)
                    .set_key(Some(key))
                    .update_expression("REMOVE failing_since, failing_shard")
                    // Only touch an endpoint that still exists (an update would create it),
                    // and not one being disabled: its marker is the health check's to-do.
                    .condition_expression(NOT_DISABLING)
                    .expression_attribute_names("#deleted", DELETED_AT)
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":active", s("active"))
                    .expression_attribute_values(":disabling", s(DISABLING_SHARD))
                    .send()
                    .await;
                written(result)?;
                Ok(None)
            }
            (false, None) => {
                let result = self
                    .client
                    .update_item()
                    .table_name(&self.tables.endpoints)
                    .set_key(Some(key))
                    .update_expression(
                        "SET failing_since = if_not_exists(failing_since, :now), failing_shard = :shard",
                    )
                    .condition_expression(NOT_DISABLING)
                    .expression_attribute_names("#deleted", DELETED_AT)
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":active", s("active"))
                    .expression_attribute_values(":disabling", s(DISABLING_SHARD))
                    .expression_attribute_values(":now", n(to_millis(r.now)))
                    .expression_attribute_values(":shard", s(FAILING_SHARD))
                    .return_values(ReturnValue::AllNew)
                    .send()
                    .await;
                Ok(written(result)?
                    .and_then(|out| out.attributes)
                    .map(|item| opt_n::<i64>(&item, "failing_since"))
                    .transpose()?
                    .flatten()
                    .map(from_millis))
            }
        }
    }

    pub(super) async fn failing_endpoints(
        &self,
        failing_before: Timestamp,
    ) -> StoreResult<Vec<Endpoint>> {
        let items = self
            .query_all(
                self.client
                    .query()
                    .table_name(&self.tables.endpoints)
                    .index_name("failing")
                    .key_condition_expression("failing_shard = :f AND failing_since <= :before")
                    .filter_expression("#status = :active")
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":f", s(FAILING_SHARD))
                    .expression_attribute_values(":before", n(to_millis(failing_before)))
                    .expression_attribute_values(":active", s("active")),
            )
            .await?;
        let active = items
            .iter()
            .map(|item| endpoint_from_item(item, &self.secrets))
            .collect::<StoreResult<Vec<_>>>()?;
        // Endpoints whose disabling or deleting did not finish (see `finish_disabling`,
        // `finish_deleting`): finish it now.
        let unfinished = self
            .query_all(
                self.client
                    .query()
                    .table_name(&self.tables.endpoints)
                    .index_name("failing")
                    .key_condition_expression("failing_shard = :f")
                    .expression_attribute_values(":f", s(DISABLING_SHARD)),
            )
            .await?;
        // Each takes up to ABANDON_BUDGET; past FINISHING_BUDGET the rest wait for the next
        // check, which must still disable and mail within the function's 300 s.
        let started = std::time::Instant::now();
        for listed in &unfinished {
            if started.elapsed() >= FINISHING_BUDGET {
                tracing::info!(
                    left = unfinished.len(),
                    "disables to finish left for the next health check"
                );
                break;
            }
            // The index lags its table: since the copy it listed, the endpoint may have been
            // enabled again, or a new one created under a deleted one's id. What the table
            // says now decides, or the abandon would take what is pending now.
            let key = account_key(&get_s(listed, "account_id")?, &get_s(listed, "id")?);
            let Some(item) = self.get(&self.tables.endpoints, key).await? else {
                continue;
            };
            if opt_s(&item, "failing_shard").as_deref() != Some(DISABLING_SHARD) {
                continue;
            }
            let item = &item;
            if is_tombstone(item) {
                // No secret left to open: its keys and when it was deleted are enough.
                let account = AccountId::from_trusted(get_s(item, "account_id")?);
                let id = EndpointId::from_trusted(get_s(item, "id")?);
                let deleted_at = from_millis(get_n::<i64>(item, DELETED_AT)?);
                self.finish_deleting(&account, &id, deleted_at).await?;
                continue;
            }
            let endpoint = endpoint_from_item(item, &self.secrets)?;
            let reason = endpoint
                .disabled_reason
                .clone()
                .unwrap_or_else(|| "endpoint disabled".into());
            self.finish_disabling(
                &endpoint.account_id,
                &endpoint.id,
                &reason,
                endpoint.updated_at,
            )
            .await?;
        }
        Ok(active)
    }

    pub(super) async fn disable_endpoint(
        &self,
        r: &DisableRequest,
    ) -> StoreResult<Option<DisableOutcome>> {
        if let Some((_, deliveries)) = &r.operational_event {
            derived_ids_only(deliveries)?;
        }
        let mut update = Update::builder()
            .table_name(&self.tables.endpoints)
            .set_key(Some(account_key(
                r.account_id.as_str(),
                r.endpoint_id.as_str(),
            )))
            // The `failing` index is keyed by the shard and `failing_since`: an endpoint that
            // was not failing gets a clock of 0 for the index alone (read as none, removed by
            // an enable), so that a disable that stops part way is found and finished.
            .update_expression(
                "SET #status = :disabled, disabled_reason = :reason, updated_at = :now, \
                 failing_shard = :disabling, \
                 failing_since = if_not_exists(failing_since, :index_only)",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":index_only", n(INDEX_ONLY_SINCE))
            .expression_attribute_values(":disabling", s(DISABLING_SHARD))
            .expression_attribute_values(":disabled", s("disabled"))
            .expression_attribute_values(":active", s("active"))
            .expression_attribute_values(":reason", s(&r.reason))
            .expression_attribute_values(":now", n(to_millis(r.now)));
        update = match r.expected_failing_since {
            Some(since) => update
                .condition_expression("#status = :active AND failing_since = :since")
                .expression_attribute_values(":since", n(to_millis(since))),
            None => update
                .condition_expression("#status = :active AND attribute_not_exists(failing_since)"),
        };
        let mut items = vec![TransactWriteItem::builder()
            .update(update.build().map_err(build_error)?)
            .build()];
        if let Some(notification) = &r.notification {
            items.push(put_if_absent(
                &self.tables.control,
                notification_item(notification),
                "pk",
            )?);
        }
        let mut later: Option<(&Event, Vec<&Delivery>)> = None;
        let mut first = 0;
        if let Some((event, deliveries)) = &r.operational_event {
            let room = MAX_TRANSACTION_ITEMS - items.len() - 1;
            first = deliveries.len().min(room);
            // Deliveries that do not fit are written after the transaction; until they are,
            // the event is left unfanned, so if that fails the stream's fan-out (or the
            // sweeper's) writes the rest rather than no one.
            items.push(put_if_absent(
                &self.tables.events,
                self.event_item(event, deliveries.len() <= room),
                "id",
            )?);
            for delivery in deliveries.iter().take(room) {
                items.push(put_if_absent(
                    &self.tables.deliveries,
                    self.delivery_item(delivery)?,
                    "id",
                )?);
            }
            later = Some((event, deliveries.iter().skip(room).collect()));
        }
        match self.transact(items).await {
            Ok(()) => crate::telemetry::deliveries_created(first),
            Err(TransactionFailure::Conditions(failed)) if failed.contains(&0) => return Ok(None),
            Err(other) => return Err(other.into_store_error()),
        }
        // More operations endpoints than one transaction holds: the rest. The event's stream
        // record then fans it out again, which finds these written (and queues the pending
        // ones again; a sender takes a delivery once) and marks the event. If they cannot be
        // written now, that fan-out writes them; the disabling goes on (its abandon, audit
        // entry and mail do not wait for them).
        if let Some((event, rest)) = later {
            if let Err(error) = self.put_deliveries_if_absent(&rest).await {
                tracing::warn!(event.id = %event.id, %error, "the operational event's other deliveries were not written; its fan-out writes them");
            }
        }
        // The endpoint is disabled (so its pending deliveries are inert: no sender takes
        // them and the sweeper skips them); abandon them now, one conditional write each.
        // The disable is made: what its abandon could not do, the health check finishes.
        let abandoned = match self
            .finish_disabling(&r.account_id, &r.endpoint_id, &r.reason, r.now)
            .await
        {
            Ok(abandoned) => abandoned,
            Err(error) => {
                tracing::warn!(endpoint.id = %r.endpoint_id, %error, "the disabled endpoint's pending work is left for the health check");
                0
            }
        };
        Ok(Some(DisableOutcome { abandoned }))
    }
}
