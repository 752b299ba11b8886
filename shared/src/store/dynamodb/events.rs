//! Events and their deliveries: publish, the outbox put, fan-out and its recovery walk.

use super::items::*;
use super::*;

impl DynamoStore {
    /// The `Put` of an event, for a platform to add to its own `TransactWriteItems` next
    /// to its business write (the transactional outbox). The events table's stream then
    /// hands the event to fan-out. Idempotent: the put only succeeds for a new event id.
    ///
    /// ```no_run
    /// # async fn example(store: &hooklane::store::dynamodb::DynamoStore, event: &hooklane::domain::Event) -> Result<(), Box<dyn std::error::Error>> {
    /// use hooklane::aws::aws_sdk_dynamodb::types::{Put, TransactWriteItem};
    /// let order_write = Put::builder().table_name("orders") /* … */ .build()?;
    /// store
    ///     .client()
    ///     .transact_write_items()
    ///     .transact_items(TransactWriteItem::builder().put(order_write).build())
    ///     .transact_items(TransactWriteItem::builder().put(store.outbox_put(event)?).build())
    ///     .send()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn outbox_put(&self, event: &Event) -> StoreResult<Put> {
        Put::builder()
            .table_name(&self.tables.events)
            .set_item(Some(self.event_item(event, false)))
            .condition_expression("attribute_not_exists(id)")
            .build()
            .map_err(build_error)
    }

    /// The TTL (epoch seconds) of an event created at `created_at`.
    fn event_expiry(&self, created_at: Timestamp) -> i64 {
        to_millis(created_at) / 1000
            + i64::try_from(self.retention.events.as_secs()).unwrap_or(i64::MAX / 2)
    }

    pub(super) fn event_item(&self, event: &Event, fanned_out: bool) -> Item {
        let mut item = Item::new();
        item.insert("account_id".into(), s(event.account_id.as_str()));
        item.insert("id".into(), s(event.id.as_str()));
        item.insert("type".into(), s(event.event_type.as_str()));
        item.insert("created_at".into(), n(to_millis(event.created_at)));
        item.insert("payload".into(), s(&event.payload));
        // Written together with its deliveries: the stream's fan-out has nothing to do.
        item.insert("fanned_out".into(), AttributeValue::Bool(fanned_out));
        if fanned_out {
            item.insert("expires_at".into(), n(self.event_expiry(event.created_at)));
        } else {
            // In the `unfanned` index until fan-out marks it done: if its stream record is
            // lost, the sweeper finds it there. No TTL until then (the mark sets it): pending
            // work is never removed, and an event whose fan-out fails for longer than the
            // retention would otherwise leave the index, and its endpoints never get it.
            item.insert(UNFANNED_SHARD.into(), s(unfanned_shard(event.id.as_str())));
        }
        item
    }

    pub(super) fn delivery_item(&self, d: &Delivery) -> StoreResult<Item> {
        new_delivery_item(d, chrono::Utc::now(), self.late_fan_out)
    }

    /// The deliveries of an event whose own write (with the first of them) is done, in
    /// transactions as large as allowed, each put only if absent: writing them again, or
    /// after a crash part-way, is harmless.
    pub(super) async fn put_deliveries_if_absent(
        &self,
        deliveries: &[&Delivery],
    ) -> StoreResult<()> {
        for chunk in deliveries.chunks(MAX_TRANSACTION_ITEMS) {
            let items = chunk
                .iter()
                .map(|d| put_if_absent(&self.tables.deliveries, self.delivery_item(d)?, "id"))
                .collect::<StoreResult<Vec<_>>>()?;
            match self.transact(items).await {
                Ok(()) => crate::telemetry::deliveries_created(chunk.len()),
                // Some exist (a concurrent fan-out wrote them): the transaction wrote none,
                // and that fan-out writes the rest.
                Err(TransactionFailure::Conditions(_)) => {}
                Err(TransactionFailure::Other(e)) => return Err(e),
            }
        }
        Ok(())
    }

    /// The safety net for new deliveries, which are not in the `pending` index (see
    /// `delivery_item`): reads the log partition of every endpoint from the persisted
    /// watermark (less `LATE_WRITE_MARGIN`) up to deliveries created at `until`, and brings
    /// each one still pending without an attempt and outside the index into it (a
    /// conditional write, so one delivered meanwhile stays out). Returns those items. Then
    /// the watermark moves to `until` (never past the present): below it every delivery is
    /// final, attempted, or in the index, so a first try whose queue message was lost
    /// (publish crashed before sending, purge, dead-letter queue, retention) is found by the
    /// sweeper like any due delivery. Its reads (an eventually consistent query of each
    /// endpoint's new deliveries) cost a fraction of the two index writes.
    pub(super) async fn walk_unsent_first_tries(&self, until: Timestamp) -> StoreResult<Vec<Item>> {
        let state = self
            .get(&self.tables.control, key1("pk", FIRST_TRY_WATERMARK))
            .await?;
        let watermark = state
            .as_ref()
            .map(|item| opt_n::<i64>(item, "watermark"))
            .transpose()?
            .flatten();
        // A walk that an earlier run left part-way goes on where it stopped, over the same
        // window; otherwise a new window ends now.
        let resume = match &state {
            Some(item) => match (
                opt_n::<i64>(item, "walking_until")?,
                opt_s(item, "walked_account"),
                opt_s(item, "walked_endpoint"),
            ) {
                (Some(end), Some(account), Some(endpoint)) => Some((end, (account, endpoint))),
                _ => None,
            },
            None => None,
        };
        let (window_end, after) = match resume {
            Some((end, after)) => (from_millis(end), Some(after)),
            None => (until.min(chrono::Utc::now()), None),
        };
        let from = watermark.map(|w| {
            crate::clock::from_millis(w)
                - chrono::TimeDelta::from_std(LATE_WRITE_MARGIN).unwrap_or_default()
        });
        let mut endpoints = self.all_endpoints().await?;
        if let Some((account, endpoint)) = &after {
            endpoints
                .retain(|(a, e)| (a.as_str(), e.as_str()) > (account.as_str(), endpoint.as_str()));
        }
        let started = std::time::Instant::now();
        let mut unsent = Vec::new();
        let mut chunks = endpoints.chunks(WALK_CHUNK).peekable();
        while let Some(chunk) = chunks.next() {
            unsent.extend(self.index_unsent_of(chunk, from, window_end).await?);
            let Some((account, endpoint)) = chunk.last() else {
                continue;
            };
            if chunks.peek().is_none() {
                break;
            }
            // Saved as the walk goes: a run cut off by its timeout loses one chunk's work.
            self.client
                .put_item()
                .table_name(&self.tables.control)
                .set_item(Some(walk_state(
                    watermark,
                    Some((window_end, account.as_str(), endpoint.as_str())),
                )))
                .send()
                .await
                .map_err(sdk)?;
            if started.elapsed() >= self.walk_budget {
                // The rest is the next run's: the window's end, and so the watermark, wait.
                return Ok(unsent);
            }
        }
        let done = watermark.map_or(to_millis(window_end), |w| w.max(to_millis(window_end)));
        if watermark != Some(done) || after.is_some() {
            self.client
                .put_item()
                .table_name(&self.tables.control)
                .set_item(Some(walk_state(Some(done), None)))
                .send()
                .await
                .map_err(sdk)?;
        }
        Ok(unsent)
    }

    /// Puts the unsent first tries of these endpoints' logs within the window into the
    /// `pending` index; returns the ones it put there.
    pub(super) async fn index_unsent_of(
        &self,
        endpoints: &[(AccountId, EndpointId)],
        from: Option<Timestamp>,
        until: Timestamp,
    ) -> StoreResult<Vec<Item>> {
        let found: Vec<StoreResult<Vec<Item>>> = futures_util::stream::iter(endpoints.to_vec())
            .map(|(account, endpoint)| async move {
                self.unindexed_pending_of(&account, &endpoint, from, Some(until))
                    .await
            })
            .buffer_unordered(WALK_CONCURRENCY)
            .collect()
            .await;
        let mut unsent = Vec::new();
        for items in found {
            for item in items? {
                let id = get_s(&item, "id")?;
                let due = opt_n::<i64>(&item, "next_try_at")?
                    .map(from_millis)
                    .unwrap_or(until);
                let result = self
                    .client
                    .update_item()
                    .table_name(&self.tables.deliveries)
                    .set_key(Some(stored_delivery_key(&item)?))
                    .update_expression("SET pending_shard = :shard, due_key = :due_key")
                    .condition_expression(
                        "#status = :pending AND attempts = :zero AND attribute_not_exists(pending_shard)",
                    )
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":pending", s("pending"))
                    .expression_attribute_values(":zero", n(0))
                    .expression_attribute_values(":shard", s(pending_shard(&id)))
                    .expression_attribute_values(":due_key", s(time_key(due, &id)))
                    .send()
                    .await;
                if written(result)?.is_some() {
                    unsent.push(item);
                }
            }
        }
        Ok(unsent)
    }

    /// Records that an events-table item cannot be read as an event (a malformed outbox
    /// write): the reason on the item, which leaves the `unfanned` index, and a metric. The
    /// item is kept for the operator to look at (docs/OPERATIONS.md lists them).
    pub async fn reject_event(&self, account: &str, id: &str, reason: &str) -> StoreResult<()> {
        tracing::error!(
            event.account = account,
            event.id = id,
            reason,
            "event item rejected: it cannot be read as an event"
        );
        crate::telemetry::event_rejected();
        let update = self
            .client
            .update_item()
            .table_name(&self.tables.events)
            .set_key(Some(account_key(account, id)))
            // Kept for the events' retention, like any event, for the operator to list.
            .update_expression(
                "SET rejected = :reason, fanned_out = :done, \
                 expires_at = if_not_exists(expires_at, :expires) REMOVE #shard",
            )
            .condition_expression("attribute_exists(id)")
            .expression_attribute_names("#shard", UNFANNED_SHARD)
            .expression_attribute_values(":reason", s(reason))
            .expression_attribute_values(":done", AttributeValue::Bool(true))
            .expression_attribute_values(":expires", n(self.event_expiry(chrono::Utc::now())))
            .send()
            .await;
        written(update)?;
        Ok(())
    }

    pub(super) async fn publish(
        &self,
        event: &Event,
        deliveries: &[Delivery],
    ) -> StoreResult<PublishOutcome> {
        derived_ids_only(deliveries)?;
        // The event and its first deliveries in one transaction; an account with more
        // endpoints than one transaction holds gets the rest in follow-up transactions,
        // each put conditional, so repeating them is harmless. Such an event is written
        // unfanned: if a follow-up fails, the stream's fan-out (or the sweeper's) writes the
        // rest, and otherwise finds them written and marks the event.
        let fits = deliveries.len() < MAX_TRANSACTION_ITEMS;
        let mut items = vec![put_if_absent(
            &self.tables.events,
            self.event_item(event, fits),
            "id",
        )?];
        let mut rest = deliveries.iter();
        for delivery in rest.by_ref().take(MAX_TRANSACTION_ITEMS - 1) {
            items.push(put_if_absent(
                &self.tables.deliveries,
                self.delivery_item(delivery)?,
                "id",
            )?);
        }
        let first = items.len() - 1;
        match self.transact(items).await {
            Ok(()) => crate::telemetry::deliveries_created(first),
            Err(TransactionFailure::Conditions(failed)) if failed.contains(&0) => {
                let existing = self
                    .get_event_item(event.account_id.as_str(), event.id.as_str())
                    .await?
                    .ok_or_else(|| StoreError::Backend("event vanished during publish".into()))?;
                if let Some(conflict) = existing.conflict_with(event) {
                    return Err(conflict.into());
                }
                return Ok(PublishOutcome::AlreadyExists { event: existing });
            }
            Err(other) => return Err(other.into_store_error()),
        }
        self.put_deliveries_if_absent(&rest.collect::<Vec<_>>())
            .await?;
        Ok(PublishOutcome::Created)
    }

    /// Events alone share transactions (at most 100 items and 4 MB each, DynamoDB's limits
    /// for one `TransactWriteItems`); an event with deliveries is its own publish, as its
    /// deliveries alone can fill a transaction. A batch written in more than one step is
    /// first compared with the events stored under its ids ([`Self::refuse_conflicts`]), so
    /// that an item under another event's id refuses it before any step is written.
    pub(super) async fn publish_batch(
        &self,
        items: &[crate::store::BatchItem],
    ) -> StoreResult<Vec<PublishOutcome>> {
        enum Step {
            Alone(usize),
            Together(Vec<(usize, Item)>),
        }
        let mut steps = Vec::new();
        let mut chunk: Vec<(usize, Item)> = Vec::new();
        let mut bytes = 0;
        for (index, (event, deliveries)) in items.iter().enumerate() {
            if deliveries.is_some() {
                steps.push(Step::Alone(index));
                continue;
            }
            let item = self.event_item(event, false);
            let size = item_size(&item);
            if !chunk.is_empty()
                && (chunk.len() == MAX_TRANSACTION_ITEMS || bytes + size > MAX_TRANSACTION_BYTES)
            {
                steps.push(Step::Together(std::mem::take(&mut chunk)));
                bytes = 0;
            }
            bytes += size;
            chunk.push((index, item));
        }
        if !chunk.is_empty() {
            steps.push(Step::Together(chunk));
        }
        if steps.len() > 1 {
            self.refuse_conflicts(items).await?;
        }
        let mut outcomes: Vec<Option<PublishOutcome>> = vec![None; items.len()];
        for step in steps {
            match step {
                Step::Alone(index) => {
                    let (event, deliveries) = &items[index];
                    let deliveries = deliveries.as_deref().unwrap_or_default();
                    outcomes[index] = Some(self.publish(event, deliveries).await?);
                }
                Step::Together(chunk) => {
                    self.put_events_together(items, chunk, &mut outcomes)
                        .await?
                }
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.ok_or_else(|| StoreError::Backend("a batch item was not written".into())))
            .collect()
    }

    /// Reads the events stored under the batch's ids (strongly consistent) and refuses the
    /// batch if one is another event than its item. Each step compares again as it writes:
    /// another publish of one of these ids landing after this read still refuses the batch
    /// at that step, with the steps before it written.
    async fn refuse_conflicts(&self, items: &[crate::store::BatchItem]) -> StoreResult<()> {
        let mut keys: Vec<Item> = Vec::with_capacity(items.len());
        let mut seen = std::collections::HashSet::new();
        for (event, _) in items {
            // DynamoDB refuses a BatchGetItem that names one key twice.
            if seen.insert((event.account_id.as_str(), event.id.as_str())) {
                keys.push(account_key(event.account_id.as_str(), event.id.as_str()));
            }
        }
        for stored in self.batch_get(&self.tables.events, &keys, None).await? {
            let stored = event_from_item(&stored)?;
            let conflict = items
                .iter()
                .filter(|(event, _)| event.id == stored.id && event.account_id == stored.account_id)
                .find_map(|(event, _)| stored.conflict_with(event));
            if let Some(conflict) = conflict {
                return Err(conflict.into());
            }
        }
        Ok(())
    }

    /// One transaction of conditional event puts. Those whose id exists are answered with
    /// the stored event, and the transaction is tried again without them; if one of them is
    /// another event than its item's (`items[index].0`), the chunk is refused with
    /// `StoreError::EventConflict` and nothing of it is written.
    async fn put_events_together(
        &self,
        items: &[crate::store::BatchItem],
        mut chunk: Vec<(usize, Item)>,
        outcomes: &mut [Option<PublishOutcome>],
    ) -> StoreResult<()> {
        while !chunk.is_empty() {
            let puts = chunk
                .iter()
                .map(|(_, item)| put_if_absent(&self.tables.events, item.clone(), "id"))
                .collect::<StoreResult<Vec<_>>>()?;
            match self.transact(puts).await {
                Ok(()) => {
                    for (index, _) in chunk.drain(..) {
                        outcomes[index] = Some(PublishOutcome::Created);
                    }
                }
                Err(TransactionFailure::Conditions(failed)) if !failed.is_empty() => {
                    let mut position = 0;
                    let mut existing = Vec::new();
                    chunk.retain(|entry| {
                        let keep = !failed.contains(&position);
                        position += 1;
                        if !keep {
                            existing.push(entry.clone());
                        }
                        keep
                    });
                    for (index, item) in existing {
                        let stored = self
                            .get_event_item(&get_s(&item, "account_id")?, &get_s(&item, "id")?)
                            .await?
                            .ok_or_else(|| {
                                StoreError::Backend("event vanished during publish".into())
                            })?;
                        // The transaction was cancelled: refused here, nothing of the chunk
                        // is written.
                        if let Some((event, _)) = items.get(index) {
                            if let Some(conflict) = stored.conflict_with(event) {
                                return Err(conflict.into());
                            }
                        }
                        outcomes[index] = Some(PublishOutcome::AlreadyExists { event: stored });
                    }
                }
                Err(other) => return Err(other.into_store_error()),
            }
        }
        Ok(())
    }

    pub(super) async fn put_event(&self, event: &Event) -> StoreResult<PutEventOutcome> {
        // A try answered late and sent again finds its own event: created, not a repeat.
        let put = self
            .client
            .put_item()
            .table_name(&self.tables.events)
            .condition_expression("attribute_not_exists(id)");
        match put_once(put, with_put_token(self.event_item(event, false))).await? {
            Some(_) => Ok(PutEventOutcome::Created),
            None => {
                let stored = self
                    .get_event_item(event.account_id.as_str(), event.id.as_str())
                    .await?
                    .ok_or_else(|| StoreError::Backend("event vanished during publish".into()))?;
                match stored.conflict_with(event) {
                    Some(conflict) => Err(conflict.into()),
                    None => Ok(PutEventOutcome::AlreadyExists(stored)),
                }
            }
        }
    }

    /// Moves the TTL of the events of `deliveries`, made pending at `now`, to the end of
    /// their retries (`Retention::retries` from `now`) where it comes sooner. A fanned-out
    /// event's TTL runs from its creation, and a delivery replayed or added late in the
    /// retention would otherwise find its event gone part way through its retries. Runs
    /// before the deliveries are written, so none is pending with its event due to go first.
    pub(super) async fn keep_events_for_retries<'a>(
        &self,
        deliveries: impl IntoIterator<Item = &'a Delivery>,
        now: Timestamp,
    ) -> StoreResult<()> {
        let until = crate::clock::add(now, self.retention.retries);
        let events = deliveries
            .into_iter()
            // A delivery's `created_at` is its event's, from which its event's TTL runs.
            .filter(|d| crate::clock::add(d.created_at, self.retention.events) < until)
            .map(|d| (d.account_id.to_string(), d.event_id.to_string()))
            .collect();
        self.keep_events_until(events, until).await
    }

    /// Moves the TTL of these events (account, id) to `until` where it comes sooner. A TTL
    /// already later is left (the write's condition), and so is an event that is gone, or
    /// still unfanned (its fan-out's mark sets its TTL, as far ahead as its retries need).
    async fn keep_events_until(
        &self,
        mut events: Vec<(String, String)>,
        until: Timestamp,
    ) -> StoreResult<()> {
        events.sort_unstable();
        events.dedup();
        let expires = to_millis(until).div_euclid(1000);
        let updates: Vec<_> = events
            .into_iter()
            .map(|(account, event)| {
                self.client
                    .update_item()
                    .table_name(&self.tables.events)
                    .key("account_id", s(account))
                    .key("id", s(event))
                    .update_expression("SET expires_at = :expires")
                    // An event still unfanned has no TTL, and gets none here. One marked
                    // done without one (an outbox writer's, written as fanned out) is kept
                    // for the retries: a comparison with a missing attribute is false.
                    .condition_expression(
                        "attribute_exists(id) AND attribute_not_exists(#shard) \
                         AND (attribute_not_exists(expires_at) OR expires_at < :expires)",
                    )
                    .expression_attribute_names("#shard", UNFANNED_SHARD)
                    .expression_attribute_values(":expires", n(expires))
            })
            .collect();
        conditional_updates(updates).await
    }

    pub(super) async fn add_deliveries_of(
        &self,
        _event: &Event,
        deliveries: &[Delivery],
        deadline: Option<tokio::time::Instant>,
    ) -> StoreResult<Vec<Delivery>> {
        self.add_deliveries_until(deliveries, deadline).await
    }

    pub(super) async fn add_deliveries(
        &self,
        deliveries: &[Delivery],
    ) -> StoreResult<Vec<Delivery>> {
        self.add_deliveries_until(deliveries, None).await
    }

    async fn add_deliveries_until(
        &self,
        deliveries: &[Delivery],
        deadline: Option<tokio::time::Instant>,
    ) -> StoreResult<Vec<Delivery>> {
        derived_ids_only(deliveries)?;
        self.keep_events_for_retries(deliveries, chrono::Utc::now())
            .await?;
        let puts = deliveries
            .iter()
            .map(|delivery| {
                Ok(self
                    .client
                    .put_item()
                    .table_name(&self.tables.deliveries)
                    .set_item(Some(self.delivery_item(delivery)?))
                    .condition_expression("attribute_not_exists(id)"))
            })
            .collect::<StoreResult<Vec<_>>>()?;
        // Several at a time: an event fanned out to a hundred endpoints, or a resend that
        // recovers thousands of missed events, is not a hundred or thousands of round trips.
        // A put over the table's capacity is sent again on its own: failed, it failed the
        // call, whose retry (a part of a fan-out written again) put every delivery again,
        // each using capacity even where its condition fails, so under a steady limit a part
        // never got through.
        let results: Vec<_> = futures_util::stream::iter(puts)
            .map(
                |put| async move { sent_through_throttling(deadline, || put.clone().send()).await },
            )
            .buffered(WRITE_CONCURRENCY)
            .collect()
            .await;
        // Every put has run: those written are counted even when another failed (its retry
        // finds them written and counts only the rest).
        let mut added = Vec::new();
        let mut failure = None;
        for (delivery, result) in deliveries.iter().zip(results) {
            match written(result) {
                Ok(Some(_)) => added.push(delivery.clone()),
                Ok(None) => {}
                Err(error) => failure = failure.or(Some(error)),
            }
        }
        crate::telemetry::deliveries_created(added.len());
        match failure {
            Some(error) => Err(error),
            None => Ok(added),
        }
    }

    pub(super) async fn get_event(
        &self,
        account: &AccountId,
        id: &EventId,
    ) -> StoreResult<Option<Event>> {
        // Past its expiry, as the delivery log leaves such deliveries out.
        self.get(
            &self.tables.events,
            account_key(account.as_str(), id.as_str()),
        )
        .await?
        .filter(|item| self.is_shown(item))
        .map(|item| event_from_item(&item))
        .transpose()
    }

    pub(super) async fn deliveries_of_event(&self, event: &Event) -> StoreResult<Vec<Delivery>> {
        let endpoints = self.endpoint_ids_ever(&event.account_id).await?;
        let mut deliveries = self.deliveries_to(event, &endpoints).await?;
        deliveries.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(deliveries)
    }

    pub(super) async fn event_deliveries(
        &self,
        event: &Event,
        page: &PageAfter<EndpointId>,
    ) -> StoreResult<crate::store::EventDeliveries> {
        let limit = usize::try_from(page.limit).unwrap_or(usize::MAX);
        // The candidates a page looks at, in id order after the cursor (the endpoints
        // table's sort key): enough for a full page and one more, at least the log's budget.
        let budget = self.list_examine_budget.max(limit.saturating_add(1));
        let mut query = self
            .partition_query(
                &self.tables.endpoints,
                "account_id",
                event.account_id.as_str(),
            )
            .projection_expression("id");
        if let Some(after) = &page.after {
            query = query
                .key_condition_expression("#pk = :pk AND #id > :after")
                .expression_attribute_names("#id", "id")
                .expression_attribute_values(":after", s(after.as_str()));
        }
        let mut deliveries = Vec::new();
        let (mut looked_at, mut last_looked_at) = (0, None);
        let mut start: Option<Item> = None;
        // A batch of endpoints at a time, each read as soon as it is listed: once more than
        // a page is found, no later candidate can come before them, and the rest are not
        // read (each is a read unit of the endpoints table, and one of the deliveries',
        // found or not).
        let ended = loop {
            let wanted = (budget - looked_at).min(BATCH_GET_ITEMS);
            let out = query
                .clone()
                .set_exclusive_start_key(start.take())
                .limit(i32::try_from(wanted).unwrap_or(i32::MAX))
                .send()
                .await
                .map_err(sdk)?;
            let batch = out
                .items()
                .iter()
                .map(|item| get_s(item, "id").map(EndpointId::from_trusted))
                .collect::<StoreResult<Vec<_>>>()?;
            looked_at += batch.len();
            if let Some(last) = batch.last() {
                last_looked_at = Some(last.clone());
            }
            deliveries.extend(self.deliveries_to(event, &batch).await?);
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break true,
            }
            if deliveries.len() > limit || looked_at >= budget {
                break false;
            }
        };
        deliveries.sort_by(|a, b| a.endpoint_id.cmp(&b.endpoint_id));
        let mut found = crate::store::EventDeliveries::first(deliveries, page.limit);
        if found.next.is_none() && !ended {
            // The page stopped at its budget, not at the last endpoint: the next one goes on
            // after the last candidate looked at.
            found.next = last_looked_at;
        }
        Ok(found)
    }

    /// The event's deliveries to these endpoints (of its account), in no order. A delivery's
    /// id is derived from (account, event, event time, endpoint) (checked when it is
    /// written), so each endpoint is one candidate key; the ones that exist are the event's
    /// deliveries. (No read of the event: the fan-out function may not read the events
    /// table, only its stream.)
    async fn deliveries_to(
        &self,
        event: &Event,
        endpoints: &[EndpointId],
    ) -> StoreResult<Vec<Delivery>> {
        let (account, id) = (&event.account_id, &event.id);
        let ids: Vec<DeliveryId> = endpoints
            .iter()
            .map(|endpoint| DeliveryId::derived(account, id, event.created_at, endpoint))
            .collect();
        let mut deliveries = Vec::new();
        for item in self.get_deliveries(&ids).await? {
            let delivery = delivery_from_item(&item)?;
            if &delivery.account_id == account && &delivery.event_id == id {
                deliveries.push(delivery);
            }
        }
        Ok(deliveries)
    }

    pub(super) async fn unfanned_events(
        &self,
        after: Option<Timestamp>,
        created_before: Timestamp,
        limit: u32,
    ) -> StoreResult<crate::store::UnfannedPage> {
        let limit = limit.max(1) as usize;
        let lower = after.map_or(0, |a| to_millis(a) + 1);
        let upper = to_millis(created_before);
        if lower > upper {
            // DynamoDB refuses a reversed BETWEEN.
            return Ok(crate::store::UnfannedPage::default());
        }
        let mut keys: Vec<(i64, String, String)> = Vec::new();
        for shard in 0..UNFANNED_SHARDS {
            let out = self
                .client
                .query()
                .table_name(&self.tables.events)
                .index_name(UNFANNED)
                .key_condition_expression(
                    "#shard = :shard AND created_at BETWEEN :after AND :before",
                )
                .expression_attribute_names("#shard", UNFANNED_SHARD)
                .expression_attribute_values(":shard", s(shard.to_string()))
                .expression_attribute_values(":after", n(lower))
                .expression_attribute_values(":before", n(upper))
                .limit(i32::try_from(limit).unwrap_or(i32::MAX))
                .send()
                .await
                .map_err(sdk)?;
            for item in out.items.unwrap_or_default() {
                keys.push((
                    get_n(&item, "created_at")?,
                    get_s(&item, "account_id")?,
                    get_s(&item, "id")?,
                ));
            }
        }
        keys.sort();
        keys.truncate(limit);
        let last = keys.last().map(|(at, _, _)| from_millis(*at));
        let mut events = Vec::with_capacity(keys.len());
        for (_, account, id) in keys {
            // Read from the table itself: the index is eventually consistent, and an event
            // marked done meanwhile is left alone.
            let Some(item) = self
                .get(&self.tables.events, account_key(&account, &id))
                .await?
            else {
                continue;
            };
            if !item.contains_key(UNFANNED_SHARD) {
                continue;
            }
            // Checked as the stream's reader checks an image (docs/OUTBOX.md's contract),
            // and fan-out's own check, that the account exists.
            let checked = match super::outbox::read_outbox_item(&item) {
                Ok(super::outbox::OutboxItem::New(event)) => {
                    match self.get_account(&event.account_id).await? {
                        Some(_) => Ok(Some(event)),
                        None => Err(crate::domain::event::unknown_account(&event.account_id)),
                    }
                }
                Ok(super::outbox::OutboxItem::AlreadyFannedOut) => {
                    // Written fanned out, but with a shard (docs/OUTBOX.md allows both): out
                    // of the index, or every sweep reads it again.
                    self.leave_unfanned_index(&account, &id).await?;
                    Ok(None)
                }
                Err(reason) => Err(reason),
            };
            match checked {
                Ok(Some(event)) => events.push(event),
                Ok(None) => {}
                Err(reason) => self.reject_event(&account, &id, &reason).await?,
            }
        }
        Ok(crate::store::UnfannedPage { events, last })
    }

    /// Takes an event written fanned out out of the `unfanned` index, and changes nothing
    /// else (its TTL is its writer's).
    async fn leave_unfanned_index(&self, account: &str, id: &str) -> StoreResult<()> {
        let update = self
            .client
            .update_item()
            .table_name(&self.tables.events)
            .set_key(Some(account_key(account, id)))
            .update_expression("REMOVE #shard")
            .condition_expression("fanned_out = :done")
            .expression_attribute_names("#shard", UNFANNED_SHARD)
            .expression_attribute_values(":done", AttributeValue::Bool(true))
            .send()
            .await;
        written(update)?;
        Ok(())
    }

    pub(super) async fn mark_fanned_out(
        &self,
        events: &[crate::store::FannedOut],
    ) -> StoreResult<()> {
        let until = crate::clock::add(chrono::Utc::now(), self.retention.retries);
        let retries_end = to_millis(until).div_euclid(1000);
        let marks: Vec<_> = events
            .iter()
            .map(|done| self.mark_one_fanned_out(done, retries_end))
            .collect();
        let results: Vec<_> = futures_util::stream::iter(marks)
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Marks one event done, leaving the `unfanned` index. Its TTL: the retention's, or past
    /// the end of the retries its fan-out starts if that is later (a late fan-out). An outbox
    /// writer's own TTL is kept unless it comes before that end, which it is then moved to:
    /// DynamoDB must not delete the event while its retries are left. An event a disabled
    /// endpoint missed enters the `missed` index in the same write.
    async fn mark_one_fanned_out(
        &self,
        done: &crate::store::FannedOut,
        retries_end: i64,
    ) -> StoreResult<()> {
        let event = &done.event;
        let mark = |expires_at: &str| {
            let missed = if done.missed { ", #missed = :at" } else { "" };
            let update = self
                .client
                .update_item()
                .table_name(&self.tables.events)
                .set_key(Some(account_key(
                    event.account_id.as_str(),
                    event.id.as_str(),
                )))
                .update_expression(format!(
                    "SET fanned_out = :done, expires_at = {expires_at}{missed} REMOVE #shard"
                ))
                .expression_attribute_names("#shard", UNFANNED_SHARD)
                .expression_attribute_values(":done", AttributeValue::Bool(true))
                .expression_attribute_values(":retries_end", n(retries_end));
            if done.missed {
                update
                    .expression_attribute_names("#missed", MISSED_AT)
                    .expression_attribute_values(":at", n(to_millis(event.created_at)))
            } else {
                update
            }
        };
        let first = mark("if_not_exists(expires_at, :expires)")
            .condition_expression(
                "attribute_exists(#shard) \
                 AND (attribute_not_exists(expires_at) OR expires_at >= :retries_end)",
            )
            .expression_attribute_values(
                ":expires",
                n(self.event_expiry(event.created_at).max(retries_end)),
            )
            .return_values_on_condition_check_failure(
                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
            )
            .send()
            .await;
        let seen = match first {
            Ok(_) => return Ok(()),
            Err(e) if is_condition_failed(&e) => match e.as_service_error() {
                Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(failed)) => failed.item().cloned(),
                _ => None,
            },
            Err(e) => return Err(sdk(e)),
        };
        // Already marked (a repeat), or expired meanwhile: nothing left to do. Otherwise
        // its TTL comes before the retries' end: the writer's, moved there.
        if !seen.is_some_and(|item| item.contains_key(UNFANNED_SHARD)) {
            return Ok(());
        }
        let moved = mark(":retries_end")
            .condition_expression("attribute_exists(#shard) AND expires_at < :retries_end")
            .send()
            .await;
        written(moved)?;
        Ok(())
    }

    pub(super) async fn fan_out_progress(
        &self,
        account: &AccountId,
        event: &EventId,
    ) -> StoreResult<Option<EndpointId>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.events)
            .set_key(Some(account_key(account.as_str(), event.as_str())))
            .projection_expression("#through")
            .expression_attribute_names("#through", FANNED_THROUGH)
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk)?;
        Ok(out
            .item
            .and_then(|item| opt_s(&item, FANNED_THROUGH))
            .map(EndpointId::from_trusted))
    }

    pub(super) async fn record_fan_out_progress(
        &self,
        account: &AccountId,
        event: &EventId,
        through: &EndpointId,
    ) -> StoreResult<()> {
        // A MODIFY record on the stream, which fan-out's filter (INSERT) passes over. Only
        // forward: a second fan-out of the event (the sweeper's, beside a stream retry) that
        // is behind does not send the first back over what it did.
        let update = self
            .client
            .update_item()
            .table_name(&self.tables.events)
            .set_key(Some(account_key(account.as_str(), event.as_str())))
            .update_expression("SET #through = :through")
            .condition_expression(
                "attribute_exists(id) AND (attribute_not_exists(#through) OR #through < :through)",
            )
            .expression_attribute_names("#through", FANNED_THROUGH)
            .expression_attribute_values(":through", s(through.as_str()))
            .send()
            .await;
        written(update)?;
        Ok(())
    }

    pub(super) async fn mark_missed(&self, events: &[Event]) -> StoreResult<()> {
        let updates: Vec<_> = events
            .iter()
            .map(|event| {
                // A MODIFY record on the stream, which fan-out's filter (INSERT) passes over.
                self.client
                    .update_item()
                    .table_name(&self.tables.events)
                    .set_key(Some(account_key(
                        event.account_id.as_str(),
                        event.id.as_str(),
                    )))
                    .update_expression("SET #missed = :at")
                    .condition_expression(
                        "attribute_exists(id) AND attribute_not_exists(#missed) \
                         AND attribute_not_exists(erased_at)",
                    )
                    .expression_attribute_names("#missed", MISSED_AT)
                    .expression_attribute_values(":at", n(to_millis(event.created_at)))
            })
            .collect();
        // One marked already, or no longer stored, has nothing to do.
        conditional_updates(updates).await
    }

    pub(super) async fn missed_events(
        &self,
        query: &crate::store::MissedQuery,
    ) -> StoreResult<Vec<MissedEvent>> {
        let limit = query.limit.clamp(1, 10_000) as usize;
        let mut lower = to_millis(query.since);
        if !self.shows_expired {
            // An event older than the retention has expired, and TTL deletes it within
            // days (reads return it until then): recovering it would keep it past the
            // retention (a delivery added moves its event's TTL), as SQLite's purge would not.
            let retention = i64::try_from(self.retention.events.as_millis()).unwrap_or(i64::MAX);
            lower = lower.max(to_millis(chrono::Utc::now()).saturating_sub(retention) + 1);
        }
        let upper = query.until.map_or(i64::MAX, |until| to_millis(until) - 1);
        if lower > upper {
            // DynamoDB refuses a reversed BETWEEN.
            return Ok(Vec::new());
        }
        let account = query.account.as_str();
        // The index's own order (time, then as DynamoDB keeps equal times) from just past
        // the previous page's last event, which its full key names. DynamoDB refuses a
        // starting key outside the key condition's range: a cursor before the window (its
        // start, the retention's edge, moved on since that page) goes on from the start, and
        // one past its end has nothing after it.
        let mut start = match &query.after {
            Some((at, _)) if to_millis(*at) > upper => return Ok(Vec::new()),
            Some((at, id)) if to_millis(*at) >= lower => {
                let mut key = account_key(account, id.as_str());
                key.insert(MISSED_AT.into(), n(to_millis(*at)));
                Some(key)
            }
            _ => None,
        };
        let mut found = Vec::new();
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.tables.events)
                .index_name(MISSED)
                .key_condition_expression("account_id = :account AND #missed BETWEEN :from AND :to")
                .expression_attribute_names("#missed", MISSED_AT)
                .expression_attribute_values(":account", s(account))
                .expression_attribute_values(":from", n(lower))
                .expression_attribute_values(":to", n(upper))
                .set_exclusive_start_key(start.take())
                .limit(i32::try_from(limit - found.len()).unwrap_or(i32::MAX))
                .send()
                .await
                .map_err(sdk)?;
            for item in out.items.unwrap_or_default() {
                found.push(MissedEvent {
                    account_id: AccountId::from_trusted(get_s(&item, "account_id")?),
                    id: EventId::from_trusted(get_s(&item, "id")?),
                    event_type: EventType::from_trusted(get_s(&item, "type")?),
                    created_at: from_millis(get_n(&item, MISSED_AT)?),
                });
            }
            match out.last_evaluated_key {
                Some(key) if found.len() < limit => start = Some(key),
                _ => return Ok(found),
            }
        }
    }
}

/// Sends `updates`, [`WRITE_CONCURRENCY`] at a time; one whose condition fails is passed
/// over, any other error is the answer.
async fn conditional_updates(
    updates: Vec<aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder>,
) -> StoreResult<()> {
    let results: Vec<_> = futures_util::stream::iter(updates)
        .map(|update| update.send())
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    for result in results {
        written(result)?;
    }
    Ok(())
}
