//! Work and attempts: loading a delivery to send, recording its attempt, due work.

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;

use super::items::*;
use super::*;

impl DynamoStore {
    pub(super) async fn load_work(
        &self,
        delivery: &DeliveryId,
    ) -> StoreResult<Option<DeliveryWork>> {
        let Some(delivery) = self.get_delivery_item(delivery).await? else {
            return Ok(None);
        };
        let event = self
            .get_event_item(delivery.account_id.as_str(), delivery.event_id.as_str())
            .await?;
        let endpoint = self
            .get_endpoint_item(&delivery.account_id, &delivery.endpoint_id)
            .await?;
        Ok(Some(DeliveryWork {
            delivery,
            event,
            endpoint,
        }))
    }

    pub(super) async fn move_unattempted(&self, request: &UnattemptedMove) -> StoreResult<bool> {
        let UnattemptedMove {
            delivery,
            expected_attempts,
            change,
            at: now,
        } = request;
        let (expected_attempts, now) = (*expected_attempts, *now);
        let Some(key) = delivery_key(delivery) else {
            return Ok(false);
        };
        let id = delivery.as_str();
        let request = self
            .client
            .update_item()
            .table_name(&self.tables.deliveries)
            .set_key(Some(key))
            .condition_expression("#status = :pending AND attempts = :expected")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":pending", s("pending"))
            .expression_attribute_values(":expected", n(expected_attempts))
            .expression_attribute_values(":now", n(to_millis(now)));
        let request = match change {
            // The index entry moves to the message's time (the sweeper reads due work from
            // it); `next_try_at` stays, so an earlier copy may still go ahead.
            Unattempted::Defer(until) => request
                .update_expression(
                    "SET queued_until = :until, due_key = :due_key, pending_shard = :shard, updated_at = :now",
                )
                .expression_attribute_values(":until", n(to_millis(*until)))
                .expression_attribute_values(":due_key", s(time_key(*until, id)))
                .expression_attribute_values(":shard", s(pending_shard(id))),
            Unattempted::Fail(reason) => self.end_unattempted(request, DeliveryStatus::Failed, reason, now),
            Unattempted::Abandon(reason) => {
                self.end_unattempted(request, DeliveryStatus::Abandoned, reason, now)
            }
        };
        Ok(written(request.send().await)?.is_some())
    }

    /// `request` made to end the delivery as `status`, saying why, out of the due work.
    fn end_unattempted(
        &self,
        request: aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
        status: DeliveryStatus,
        reason: &str,
        now: Timestamp,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        request
            .update_expression(
                "SET #status = :ended, last_error = :reason, updated_at = :now, expires_at = :expires \
                 REMOVE next_try_at, pending_shard, due_key",
            )
            .expression_attribute_values(":expires", self.log_expiry(now))
            .expression_attribute_values(":ended", s(status.as_str()))
            .expression_attribute_values(":reason", s(reason))
    }

    pub(super) async fn record_attempt(&self, r: &AttemptRecord) -> StoreResult<RecordOutcome> {
        // Three single writes, no transaction (a transaction costs every item twice): the
        // delivery's conditional update decides; only then the attempt's detail and, if its
        // failing clock starts or stops, the endpoint. A crash between them, or either later
        // write refused, loses that attempt's detail (the delivery keeps its status, last
        // status and error) or delays the clock to the next attempt, never a delivery's
        // state.
        let delivery_id = r.attempt.delivery_id.as_str();
        // An id no delivery can have: no such delivery, as for a missing one.
        let Some(key) = delivery_key(&r.attempt.delivery_id) else {
            return Ok(RecordOutcome::Stale);
        };

        let update = r.decision.update(r.attempt.error.as_deref());
        let (status, next_try_at, last_error) =
            (update.status, update.next_try_at, update.last_error);
        let mut sets = vec![
            "#status = :status",
            "attempts = :attempts",
            "client_errors = :client_errors",
            "updated_at = :now",
            "next_trigger = :scheduled",
            // This call's own: see `own` below.
            "record_token = :token",
        ];
        let mut removes = Vec::new();
        let token = s(uuid::Uuid::new_v4().simple().to_string());
        let mut values = Item::from([
            (":status".into(), s(status.as_str())),
            (":attempts".into(), n(r.attempt.number)),
            (":client_errors".into(), n(r.client_error_count)),
            (":now".into(), n(to_millis(r.now))),
            (":pending".into(), s("pending")),
            (":expected".into(), n(r.expected_attempts)),
            (":scheduled".into(), s(Trigger::Scheduled.as_str())),
            (":token".into(), token.clone()),
        ]);
        match next_try_at {
            Some(at) => {
                removes.push("expires_at");
                sets.push("next_try_at = :next");
                sets.push("due_key = :due_key");
                sets.push("pending_shard = :shard");
                values.insert(":shard".into(), s(pending_shard(delivery_id)));
                values.insert(":next".into(), n(to_millis(at)));
                values.insert(":due_key".into(), s(time_key(at, delivery_id)));
            }
            None => {
                removes.extend(["next_try_at", "pending_shard", "due_key"]);
                // Ended: the log row leaves through TTL once past retention.
                sets.push("expires_at = :expires");
                values.insert(":expires".into(), self.log_expiry(r.now));
            }
        }
        match r.attempt.status_code {
            Some(code) => {
                sets.push("last_status = :last_status");
                values.insert(":last_status".into(), n(code));
            }
            None => removes.push("last_status"),
        }
        match &last_error {
            Some(error) => {
                sets.push("last_error = :last_error");
                values.insert(":last_error".into(), s(error));
            }
            None => removes.push("last_error"),
        }
        // A first try that delivers is kept on the delivery itself, in this same update,
        // when its detail is small (the usual 2xx): no attempts row. Every other attempt
        // gets its row, so a delivery that is retried stays small for its later updates.
        let detail = attempt_detail(&r.attempt);
        let attempt_row = if r.attempt.number == 1
            && matches!(r.decision, Decision::Delivered)
            && item_size(&detail) <= INLINE_FIRST_TRY_BYTES
        {
            sets.push("first_try = :first_try");
            values.insert(":first_try".into(), AttributeValue::M(detail));
            None
        } else {
            Some(attempt_row(detail, &r.attempt, self.retention.attempts))
        };
        let mut expression = format!("SET {}", sets.join(", "));
        if !removes.is_empty() {
            expression.push_str(&format!(" REMOVE {}", removes.join(", ")));
        }
        let update = self
            .client
            .update_item()
            .table_name(&self.tables.deliveries)
            .set_key(Some(key))
            .update_expression(expression)
            .condition_expression("#status = :pending AND attempts = :expected")
            .expression_attribute_names("#status", "status")
            .set_expression_attribute_values(Some(values))
            // The endpoint's key needs the account, which the delivery knows.
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(own_item_on_refusal());
        // Both writes share one wait: a throttled table costs the sender's batch at most
        // that, and the refusal comes back inside the function's timeout.
        let until = Some(tokio::time::Instant::now() + crate::store::RECORD_THROTTLE_WAIT);
        let updated = sent_through_throttling(until, || update.clone().send()).await;
        // A try sent again after a late answer finds the delivery as its first try left it,
        // with this call's token: recorded by this call, not by another sender.
        let own = |item: &Item| item.get("record_token") == Some(&token);
        let attributes = match updated {
            Ok(out) => out.attributes,
            Err(error) => match error.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(refused))
                    if refused.item().is_some_and(own) =>
                {
                    refused.item().cloned()
                }
                // Not written: not pending at the expected count, or no such delivery.
                _ => {
                    written(Err::<(), _>(error))?;
                    return Ok(RecordOutcome::Stale);
                }
            },
        };
        self.hour_tally.add(&r.endpoint_id, r.hour_count());
        let account = attributes
            .as_ref()
            .map(|item| get_s(item, "account_id"))
            .transpose()?
            .map(AccountId::from_trusted)
            .ok_or_else(|| corrupt("account_id"))?;

        // The delivery is recorded: a row refused now loses only the attempt's detail, as a
        // crash here would. Failing the record for it sent the message back to a delivery
        // that had moved on, and the row was not written then either.
        if let Some(row) = attempt_row {
            let put = self
                .client
                .put_item()
                .table_name(&self.tables.attempts)
                .set_item(Some(row));
            if let Err(error) = sent_through_throttling(until, || put.clone().send()).await {
                tracing::warn!(
                    delivery.id = delivery_id,
                    attempt = r.attempt.number,
                    error = %error_text(&error),
                    "attempt recorded on its delivery, but its detail could not be written"
                );
                crate::telemetry::record_incomplete("detail");
            }
        }

        // Nor does a clock refused now undo the record: it starts or stops at the next
        // attempt, and whether to disable the endpoint is decided then.
        let endpoint_failing_since = match self.track_failing_clock(&account, r).await {
            Ok(since) => since,
            Err(error) => {
                tracing::warn!(
                    endpoint.id = %r.endpoint_id,
                    %error,
                    "attempt recorded, but its endpoint's failing clock could not be written"
                );
                crate::telemetry::record_incomplete("failing_clock");
                None
            }
        };
        Ok(RecordOutcome::Recorded {
            endpoint_failing_since,
        })
    }

    pub(super) async fn pending_deliveries(
        &self,
        due_before: Timestamp,
        page: &PageAfter<DueCursor>,
    ) -> StoreResult<PendingPage> {
        let limit = page.limit as usize;
        // Entries by due key (`due#id`), in the index's own order: due time, then id.
        let mut found: BTreeMap<String, Item> = BTreeMap::new();
        // A sweep's first page brings new deliveries that are still unsent into the index
        // (and lists them here, as the index may not show them yet).
        if page.after.is_none() {
            for item in self.walk_unsent_first_tries(due_before).await? {
                let due_at = opt_n::<i64>(&item, "next_try_at")?.map(from_millis);
                if let Some(due) = due_at.filter(|at| *at <= due_before) {
                    found.insert(time_key(due, &get_s(&item, "id")?), item);
                }
            }
        }
        let mut after = page.after.as_ref().map(|c| time_key(c.due, c.id.as_str()));
        // Each shard is read a few entries at a time from the cursor, the one furthest
        // behind first: up to the least key a shard with more has reached, every entry is
        // known, in order. So a page costs about its own length in reads.
        let chunk = limit.div_ceil(PENDING_SHARDS as usize) + 1;
        let mut shards: Vec<ShardWalk> = (0..PENDING_SHARDS)
            .map(|shard| ShardWalk {
                shard,
                last: after.clone(),
                done: false,
            })
            .collect();
        let mut listed = HashSet::new();
        let mut endpoints: HashMap<(String, String), Option<Endpoint>> = HashMap::new();
        let mut refs = Vec::new();
        let mut first = true;
        // Entries of inactive endpoints are passed over, not listed: a page looks at this
        // many at most, and may then hold fewer than `limit` (even none) and go on.
        let most = limit.saturating_mul(4);
        let mut examined = 0;
        loop {
            let behind = shards
                .iter()
                .filter(|w| !w.done)
                .map(|w| w.last.clone())
                .min();
            for walk in shards.iter_mut().filter(|w| !w.done) {
                if first || Some(&walk.last) == behind.as_ref() {
                    self.read_shard(walk, due_before, chunk, &mut found).await?;
                }
            }
            first = false;
            // Known in order up to here (everything, once every shard is read to its end).
            let known_to = shards
                .iter()
                .filter(|w| !w.done)
                .map(|w| w.last.clone())
                .min();
            while refs.len() < limit && examined < most {
                let Some(entry) = found.first_entry() else {
                    break;
                };
                if known_to
                    .as_ref()
                    .is_some_and(|to| to.as_ref().is_none_or(|to| entry.key() > to))
                {
                    break;
                }
                let (key, item) = entry.remove_entry();
                after = Some(key);
                examined += 1;
                let id = get_s(&item, "id")?;
                if !listed.insert(id.clone()) {
                    continue;
                }
                if let Some(pending) = self.pending_ref(id, &item, &mut endpoints).await? {
                    refs.push(pending);
                }
            }
            let exhausted = known_to.is_none() && found.is_empty();
            if refs.len() >= limit || examined >= most || exhausted {
                let next = if exhausted {
                    None
                } else {
                    after.as_deref().and_then(due_cursor)
                };
                return Ok(PendingPage { refs, next });
            }
        }
    }

    /// Where the sweeper's walk of due deliveries goes on after its first page, as the last
    /// run that ran out of time left it (`None`: from the start).
    pub async fn due_walk_resume(&self) -> StoreResult<Option<DueCursor>> {
        let Some(item) = self.get(&self.tables.control, key1("pk", DUE_WALK)).await? else {
            return Ok(None);
        };
        Ok(Some(DueCursor {
            due: from_millis(get_n(&item, "due")?),
            id: DeliveryId::from_trusted(get_s(&item, "id")?),
        }))
    }

    /// When the last sweep that finished began, if one has.
    pub async fn last_sweep(&self) -> StoreResult<Option<Timestamp>> {
        let item = self
            .get(&self.tables.control, key1("pk", LAST_SWEEP))
            .await?;
        item.map(|item| get_n::<i64>(&item, "at").map(from_millis))
            .transpose()
    }

    /// Keeps when this sweep began, once it has finished.
    pub async fn set_last_sweep(&self, at: Timestamp) -> StoreResult<()> {
        let mut item = key1("pk", LAST_SWEEP);
        item.insert("at".into(), n(to_millis(at)));
        self.client
            .put_item()
            .table_name(&self.tables.control)
            .set_item(Some(item))
            .send()
            .await
            .map_err(sdk)?;
        Ok(())
    }

    /// Keeps where the next sweep's walk goes on (`None`: it starts over).
    pub async fn set_due_walk_resume(&self, at: Option<&DueCursor>) -> StoreResult<()> {
        match at {
            Some(at) => {
                let mut item = key1("pk", DUE_WALK);
                item.insert("due".into(), n(to_millis(at.due)));
                item.insert("id".into(), s(at.id.as_str()));
                self.client
                    .put_item()
                    .table_name(&self.tables.control)
                    .set_item(Some(item))
                    .send()
                    .await
                    .map_err(sdk)?;
            }
            None => {
                self.client
                    .delete_item()
                    .table_name(&self.tables.control)
                    .set_key(Some(key1("pk", DUE_WALK)))
                    .send()
                    .await
                    .map_err(sdk)?;
            }
        }
        Ok(())
    }

    /// Reads the next `chunk` entries of one shard of the `pending` index past where its
    /// walk stands, due by `due_before`, into `found`.
    async fn read_shard(
        &self,
        walk: &mut ShardWalk,
        due_before: Timestamp,
        chunk: usize,
        found: &mut BTreeMap<String, Item>,
    ) -> StoreResult<()> {
        let upper = format!("{}#~", time_bound(due_before));
        let query = self
            .client
            .query()
            .table_name(&self.tables.deliveries)
            .index_name("pending")
            .expression_attribute_values(":shard", s(walk.shard.to_string()))
            .expression_attribute_values(":upper", s(upper.clone()));
        // Past `last`, which BETWEEN includes (one more is read for it). A key value may not
        // be an empty string, so a walk from the start has no lower bound.
        let (query, wanted) = match &walk.last {
            Some(last) if last.as_str() >= upper.as_str() => {
                // DynamoDB refuses a BETWEEN whose bounds are the wrong way round.
                walk.done = true;
                return Ok(());
            }
            Some(last) => (
                query
                    .key_condition_expression(
                        "pending_shard = :shard AND due_key BETWEEN :after AND :upper",
                    )
                    .expression_attribute_values(":after", s(last)),
                chunk + 1,
            ),
            None => (
                query.key_condition_expression("pending_shard = :shard AND due_key <= :upper"),
                chunk,
            ),
        };
        let items = self.query_at_most(query, wanted).await?;
        walk.done = items.len() < wanted;
        for item in items {
            let key = get_s(&item, "due_key")?;
            if walk.last.as_ref().is_none_or(|last| key > *last) {
                walk.last = Some(key.clone());
                found.insert(key, item);
            }
        }
        Ok(())
    }

    /// The due delivery `id` as the sweeper hands it on; `None` when its endpoint is gone or
    /// not active. Each endpoint is read once per page.
    async fn pending_ref(
        &self,
        id: String,
        item: &Item,
        endpoints: &mut HashMap<(String, String), Option<Endpoint>>,
    ) -> StoreResult<Option<PendingRef>> {
        let key = (get_s(item, "account_id")?, get_s(item, "endpoint_id")?);
        if !endpoints.contains_key(&key) {
            let endpoint = self
                .get_endpoint_item(
                    &AccountId::from_trusted(key.0.clone()),
                    &EndpointId::from_trusted(key.1.clone()),
                )
                .await?;
            endpoints.insert(key.clone(), endpoint);
        }
        let Some(Some(endpoint)) = endpoints.get(&key) else {
            return Ok(None);
        };
        if endpoint.status != EndpointStatus::Active {
            return Ok(None);
        }
        Ok(Some(PendingRef {
            delivery_id: DeliveryId::from_trusted(id),
            endpoint_id: endpoint.id.clone(),
            account_id: endpoint.account_id.clone(),
            due: indexed_due(item)?,
            max_in_flight: endpoint.max_in_flight,
            rate_limit_per_second: endpoint.rate_limit_per_second,
        }))
    }

    pub(super) async fn list_attempts(&self, delivery: &DeliveryId) -> StoreResult<Vec<Attempt>> {
        let Some(key) = delivery_key(delivery) else {
            return Ok(Vec::new());
        };
        let first_try = self
            .client
            .get_item()
            .table_name(&self.tables.deliveries)
            .set_key(Some(key))
            .projection_expression("id, first_try")
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk)?
            .item
            .map(|item| first_try_from_item(&item))
            .transpose()?
            .flatten();
        let items = self
            .query_all(self.partition_query(
                &self.tables.attempts,
                "delivery_id",
                delivery.as_str(),
            ))
            .await?;
        // Past its expiry, as the delivery log leaves such deliveries out.
        let mut attempts = items
            .iter()
            .filter(|item| self.is_shown(item))
            .map(attempt_from_item)
            .collect::<StoreResult<Vec<_>>>()?;
        attempts.extend(first_try);
        attempts.sort_by_key(|a| a.number);
        Ok(attempts)
    }
}

/// Where the walk of one shard of the `pending` index stands: the last key it read (or the
/// cursor it started from), and whether it has read to the end.
struct ShardWalk {
    shard: u32,
    last: Option<String>,
    done: bool,
}

/// An attempt's row in the attempts table: its `detail` with the row's keys, kept for
/// `retention` from its start.
fn attempt_row(detail: Item, attempt: &Attempt, retention: std::time::Duration) -> Item {
    let expires = to_millis(attempt.started_at) / 1000
        + i64::try_from(retention.as_secs()).unwrap_or(i64::MAX / 2);
    let mut row = detail;
    row.insert("delivery_id".into(), s(attempt.delivery_id.as_str()));
    row.insert("number".into(), n(attempt.number));
    row.insert("expires_at".into(), n(expires));
    row
}

/// The cursor after the entry of due key `key` (`due#id`).
fn due_cursor(key: &str) -> Option<DueCursor> {
    let (due, id) = key.split_once('#')?;
    Some(DueCursor {
        due: from_millis(due.parse().ok()?),
        id: DeliveryId::from_trusted(id.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        clock::ManualClock,
        fixtures,
        service::deliver,
        store::{sqlite::SqliteStore, Store},
    };

    /// Room left under DynamoDB's 400 KiB item limit for what may grow in an attempt's row
    /// besides the answer kept (a longer error text: a transport error, a redirect's target).
    const ROOM_FOR_THE_REST: usize = 16 * 1024;

    /// Whatever a receiver answers, the attempt leaves a row DynamoDB takes: a row too large
    /// is refused after the delivery's update, losing the attempt and its failing clock.
    #[tokio::test]
    async fn the_largest_answer_leaves_an_attempt_row_dynamodb_takes() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let app = crate::App {
            transport: Arc::new(fixtures::Answering(fixtures::largest_answer())),
            ..fixtures::app_on(store.clone(), Arc::new(ManualClock::new(fixtures::t0())))
        };
        let [ep] = fixtures::account_with_endpoints(&*store, "acme", ["ep_hostile"]).await;
        let (_, d) = fixtures::publish_one(&*store, &ep, "evt_1").await;
        deliver::attempt(&app, &d.id, Trigger::Scheduled)
            .await
            .unwrap();
        let attempts = store.list_attempts(&d.id).await.unwrap();
        let [attempt] = attempts.as_slice() else {
            panic!("one attempt, not {}", attempts.len());
        };
        let row = attempt_row(
            attempt_detail(attempt),
            attempt,
            Retention::default().attempts,
        );
        let size = item_size(&row);
        assert!(
            size <= 400 * 1024 - ROOM_FOR_THE_REST,
            "the attempt's row is {size} bytes"
        );
    }
}
