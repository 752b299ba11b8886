//! The AWS store: DynamoDB tables designed for the engine's access patterns.
//!
//! | table | key | indexes | for |
//! |---|---|---|---|
//! | `accounts` | `id` | | accounts |
//! | `endpoints` | `account_id`, `id` | `failing` (sparse: `failing_shard`, `failing_since`) | an account's endpoints (strongly consistent query; a deleted one stays as a tombstone); endpoints failing since T |
//! | `events` | `account_id`, `id` | stream (new image), TTL `expires_at` | the outbox; fan-out reads its stream |
//! | `deliveries` (`…-delivery-log`) | `log`, `id` | `pending` (sparse, sharded: `pending_shard`, `due_key`) | an endpoint's log is its `log` partition (the endpoint part of the derived delivery ids, which sort by their event's time), newest first; an account's log is the merge of its endpoints'; due work (and, filtered by endpoint, an endpoint's pending work to abandon). An event's deliveries need no index: their ids are derived from (account, event, event time, endpoint), and so is their key |
//! | `attempts` | `delivery_id`, `number` | TTL `expires_at` | attempt detail, kept shorter |
//! | `control` | `pk` | `unsent` (sparse: `unsent`, `created_key`) | settings, the notification outbox, slot leases, rate buckets |
//!
//! Every change that can race is a conditional write: an event is created only if its id
//! is new (with its deliveries, in one transaction); an attempt is recorded only against
//! the delivery's `pending` status and attempt count it was taken from; a delivery leaves
//! `pending` at most once.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use aws_sdk_dynamodb::{
    error::{ProvideErrorMetadata, SdkError},
    operation::transact_write_items::TransactWriteItemsError,
    types::{AttributeValue, KeysAndAttributes, Put, ReturnValue, TransactWriteItem, Update},
    Client,
};
use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use futures_util::StreamExt;

use super::{
    sqlite::decode_cursor, AttemptRecord, DeliveryQuery, DeliveryWork, DisableOutcome,
    DisableRequest, Notification, Page, PendingRef, PublishOutcome, PutEventOutcome, RecordOutcome,
    ReplayOutcome, ReplayRequest, Store, StoreError, StoreResult, Unattempted,
};
use crate::{
    aws::error_text,
    clock::{from_millis, to_millis, Timestamp},
    domain::{
        delivery_log_partition, delivery_log_position, delivery_log_prefix, delivery_log_time,
        endpoint::RetiringSecret, Account, AccountId, Attempt, Decision, Delivery, DeliveryId,
        DeliveryStatus, EmailAddress, Endpoint, EndpointId, EndpointStatus, EndpointUrl, Event,
        EventId, EventType, EventTypeFilter, Replay, ReplayFilter, ReplayId, ReplayScope, Trigger,
    },
    signing::SigningSecret,
};

pub type Item = HashMap<String, AttributeValue>;

/// Pending deliveries are spread over this many partitions of the `pending` index.
pub const PENDING_SHARDS: u32 = 16;
const FAILING_SHARD: &str = "failing";
/// Endpoints disabled for failing whose pending deliveries are still being abandoned.
const DISABLING_SHARD: &str = "disabling";
const UNSENT: &str = "unsent";
/// The sparse index of events stored without their deliveries whose fan-out is not yet
/// marked done, and its partition attribute (removed when fan-out is done).
const UNFANNED: &str = "unfanned";
const UNFANNED_SHARD: &str = "unfanned_shard";
/// Partitions of the `unfanned` index: every outbox write lands in one of them.
pub const UNFANNED_SHARDS: u32 = 4;
/// The control item holding how far `walk_unsent_first_tries` has looked.
const FIRST_TRY_WATERMARK: &str = "sweep#first_tries";
/// How far back before its watermark the walk looks again: a delivery is written a while
/// after the time it is created with (its event's), at most `LATE_FAN_OUT` later before it
/// goes straight into the `pending` index instead.
const LATE_WRITE_MARGIN: std::time::Duration = std::time::Duration::from_secs(120);
/// A delivery written this long after its event's time (a fan-out delayed by a stream
/// backlog or retries) enters the `pending` index as it is written: the walk may already
/// be past its place in the log.
const LATE_FAN_OUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Endpoint partitions the walk reads at once.
const WALK_CONCURRENCY: usize = 8;
/// Endpoints the walk finishes before it saves how far it got.
const WALK_CHUNK: usize = 64;
/// How long one sweep spends on the walk before it leaves the rest to the next run (the
/// sweeper function's timeout is 240 s, and the pending index is read after the walk).
const WALK_BUDGET: std::time::Duration = std::time::Duration::from_secs(120);
/// Marks a deleted endpoint's tombstone.
const DELETED_AT: &str = "deleted_at";
/// DynamoDB's limit of items in one `TransactWriteItems`.
const MAX_TRANSACTION_ITEMS: usize = 100;
/// Conditional writes in flight at once while abandoning an endpoint's pending deliveries.
const ABANDON_CONCURRENCY: usize = 16;
/// DynamoDB's limit of keys in one `BatchGetItem`.
const BATCH_GET_ITEMS: usize = 100;
/// Index entries one `list_deliveries` call examines at most before it returns a short page.
const LIST_EXAMINE_BUDGET: usize = 2_000;
/// A first try that delivers is kept on the delivery item when its detail is at most this
/// big: a delivery item (~0.5 KB) plus this stays within the 1 KB a write unit covers (and
/// a bigger one would cost the update what the attempts row saves).
const INLINE_FIRST_TRY_BYTES: usize = 400;

/// The names of the tables, all sharing one prefix (the stack name in production).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableNames {
    pub accounts: String,
    pub endpoints: String,
    pub events: String,
    pub deliveries: String,
    pub attempts: String,
    pub control: String,
}

impl TableNames {
    pub fn with_prefix(prefix: &str) -> Self {
        Self {
            accounts: format!("{prefix}-accounts"),
            endpoints: format!("{prefix}-endpoints"),
            events: format!("{prefix}-events"),
            deliveries: format!("{prefix}-delivery-log"),
            attempts: format!("{prefix}-attempts"),
            control: format!("{prefix}-control"),
        }
    }

    /// The prefix the names were made with (the stack's name).
    pub fn prefix(&self) -> &str {
        self.accounts
            .strip_suffix("-accounts")
            .unwrap_or(&self.accounts)
    }
}

/// How long DynamoDB keeps events and attempts (through TTL) after they were written.
/// Events must outlive the retry schedule of their deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub events: std::time::Duration,
    pub attempts: std::time::Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            events: std::time::Duration::from_secs(30 * 86_400),
            attempts: std::time::Duration::from_secs(14 * 86_400),
        }
    }
}

#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    tables: TableNames,
    retention: Retention,
    /// `LIST_EXAMINE_BUDGET`, smaller in tests.
    list_examine_budget: usize,
    /// `WALK_BUDGET`, smaller in tests.
    walk_budget: std::time::Duration,
    /// `LATE_FAN_OUT`; `None` in the store contract tests, whose fixed times lie years in
    /// the past (every delivery would be indexed as it is written, and the walk would go
    /// untested).
    late_fan_out: Option<std::time::Duration>,
}

impl DynamoStore {
    pub fn new(client: Client, tables: TableNames, retention: Retention) -> Self {
        Self {
            client,
            tables,
            retention,
            list_examine_budget: LIST_EXAMINE_BUDGET,
            walk_budget: WALK_BUDGET,
            late_fan_out: Some(LATE_FAN_OUT),
        }
    }

    pub fn tables(&self) -> &TableNames {
        &self.tables
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

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

    fn event_item(&self, event: &Event, fanned_out: bool) -> Item {
        let expires = to_millis(event.created_at) / 1000
            + i64::try_from(self.retention.events.as_secs()).unwrap_or(i64::MAX / 2);
        let mut item = Item::new();
        item.insert("account_id".into(), s(event.account_id.as_str()));
        item.insert("id".into(), s(event.id.as_str()));
        item.insert("type".into(), s(event.event_type.as_str()));
        item.insert("created_at".into(), n(to_millis(event.created_at)));
        item.insert("payload".into(), s(&event.payload));
        item.insert("expires_at".into(), n(expires));
        // Written together with its deliveries: the stream's fan-out has nothing to do.
        item.insert("fanned_out".into(), AttributeValue::Bool(fanned_out));
        if !fanned_out {
            // In the `unfanned` index until fan-out marks it done: if its stream record is
            // lost, the sweeper finds it there.
            item.insert(UNFANNED_SHARD.into(), s(unfanned_shard(event.id.as_str())));
        }
        item
    }

    fn delivery_item(&self, d: &Delivery) -> StoreResult<Item> {
        new_delivery_item(d, chrono::Utc::now(), self.late_fan_out)
    }

    async fn get(&self, table: &str, key: Item) -> StoreResult<Option<Item>> {
        let out = self
            .client
            .get_item()
            .table_name(table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk)?;
        Ok(out.item)
    }

    /// Every item of a query, following pages.
    async fn query_all(
        &self,
        request: aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
    ) -> StoreResult<Vec<Item>> {
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let out = request
                .clone()
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(sdk)?;
            items.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(items),
            }
        }
    }

    /// The deliveries with these ids, read strongly consistently in batches of 100; missing
    /// ones (and ids no delivery can have) are left out.
    async fn get_deliveries(&self, ids: &[DeliveryId]) -> StoreResult<Vec<Item>> {
        let keys: Vec<Item> = ids.iter().filter_map(delivery_key).collect();
        let table = &self.tables.deliveries;
        let mut items = Vec::new();
        for chunk in keys.chunks(BATCH_GET_ITEMS) {
            let keys = KeysAndAttributes::builder()
                .set_keys(Some(chunk.to_vec()))
                .consistent_read(true)
                .build()
                .map_err(build_error)?;
            let mut request = Some(HashMap::from([(table.to_owned(), keys)]));
            while let Some(wanted) = request.take().filter(|w| !w.is_empty()) {
                let out = self
                    .client
                    .batch_get_item()
                    .set_request_items(Some(wanted))
                    .send()
                    .await
                    .map_err(sdk)?;
                if let Some(mut found) = out.responses {
                    items.extend(found.remove(table).unwrap_or_default());
                }
                request = out.unprocessed_keys;
            }
        }
        Ok(items)
    }

    async fn get_endpoint_item(
        &self,
        account: &AccountId,
        id: &EndpointId,
    ) -> StoreResult<Option<Endpoint>> {
        self.get(
            &self.tables.endpoints,
            key2("account_id", account.as_str(), "id", id.as_str()),
        )
        .await?
        .filter(|item| !is_tombstone(item))
        .map(|item| endpoint_from_item(&item))
        .transpose()
    }

    /// The ids of every endpoint the account has had, deleted ones included (their items
    /// stay as tombstones, see `delete_endpoint`).
    async fn endpoint_ids_ever(&self, account: &AccountId) -> StoreResult<Vec<EndpointId>> {
        let items = self
            .query_all(
                self.client
                    .query()
                    .table_name(&self.tables.endpoints)
                    .key_condition_expression("account_id = :a")
                    .expression_attribute_values(":a", s(account.as_str()))
                    .projection_expression("id")
                    .consistent_read(true),
            )
            .await?;
        items
            .iter()
            .map(|item| get_s(item, "id").map(EndpointId::from_trusted))
            .collect()
    }

    async fn get_event_item(&self, account: &str, id: &str) -> StoreResult<Option<Event>> {
        self.get(&self.tables.events, key2("account_id", account, "id", id))
            .await?
            .map(|item| event_from_item(&item))
            .transpose()
    }

    async fn get_delivery_item(&self, id: &DeliveryId) -> StoreResult<Option<Delivery>> {
        let Some(key) = delivery_key(id) else {
            return Ok(None);
        };
        self.get(&self.tables.deliveries, key)
            .await?
            .map(|item| delivery_from_item(&item))
            .transpose()
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
    async fn walk_unsent_first_tries(&self, until: Timestamp) -> StoreResult<Vec<Item>> {
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
    async fn index_unsent_of(
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

    /// Every endpoint of every account, deleted ones left out (deleting an endpoint
    /// abandons its pending deliveries).
    async fn all_endpoints(&self) -> StoreResult<Vec<(AccountId, EndpointId)>> {
        let mut ids = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let out = self
                .client
                .scan()
                .table_name(&self.tables.endpoints)
                .projection_expression("account_id, id, #deleted")
                .expression_attribute_names("#deleted", DELETED_AT)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(sdk)?;
            for item in out.items.unwrap_or_default() {
                if !is_tombstone(&item) {
                    ids.push((
                        AccountId::from_trusted(get_s(&item, "account_id")?),
                        EndpointId::from_trusted(get_s(&item, "id")?),
                    ));
                }
            }
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// A query of one endpoint's log partition between two ids; its filter expression must
    /// include `LOG_PARTITION_FILTER`.
    fn log_query(
        &self,
        partition: &str,
        account: &str,
        endpoint: &EndpointId,
        lower: String,
        upper: String,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        self.client
            .query()
            .table_name(&self.tables.deliveries)
            .key_condition_expression("#log = :log AND id BETWEEN :lower AND :upper")
            .expression_attribute_names("#log", "log")
            .expression_attribute_values(":log", s(partition))
            .expression_attribute_values(":lower", s(lower))
            .expression_attribute_values(":upper", s(upper))
            .expression_attribute_values(":account", s(account))
            .expression_attribute_values(":endpoint", s(endpoint.as_str()))
    }

    /// An endpoint's deliveries whose events were created in [`from`, `until`] (unbounded
    /// where `None`), oldest first, that also match `filter`.
    async fn endpoint_log(
        &self,
        account: &AccountId,
        endpoint: &EndpointId,
        from: Option<Timestamp>,
        until: Option<Timestamp>,
        filter: LogFilter,
        consistent: bool,
    ) -> StoreResult<Vec<Item>> {
        let partition = delivery_log_partition(account, endpoint);
        let lower = delivery_log_position(&partition, from.unwrap_or_else(|| from_millis(0)));
        let upper = match until {
            Some(until) => format!("{}~", delivery_log_position(&partition, until)),
            None => format!("{}~", delivery_log_prefix(&partition)),
        };
        if lower > upper {
            // DynamoDB refuses a BETWEEN whose bounds are the wrong way round.
            return Ok(Vec::new());
        }
        let mut condition = LOG_PARTITION_FILTER.to_owned();
        let mut request = self
            .log_query(&partition, account.as_str(), endpoint, lower, upper)
            .scan_index_forward(true)
            .consistent_read(consistent);
        match filter {
            LogFilter::All => {}
            LogFilter::Pending => {
                condition.push_str(" AND #status = :pending");
                request = request
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":pending", s("pending"));
            }
            LogFilter::UnindexedFirstTries => {
                condition.push_str(
                    " AND #status = :pending AND attempts = :zero AND attribute_not_exists(pending_shard)",
                );
                request = request
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":pending", s("pending"))
                    .expression_attribute_values(":zero", n(0));
            }
        }
        self.query_all(request.filter_expression(condition)).await
    }

    /// An endpoint's deliveries created in [`from`, `until`] (unbounded where `None`) that
    /// are pending without an attempt and outside the `pending` index.
    async fn unindexed_pending_of(
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

    /// Moves every pending delivery of an endpoint to `abandoned`, each by a conditional
    /// write (so one that was delivered meanwhile stays delivered). Returns how many moved.
    async fn abandon_pending_of(
        &self,
        account: &AccountId,
        endpoint: &EndpointId,
        reason: &str,
        now: Timestamp,
    ) -> StoreResult<u64> {
        // Rare (an endpoint disabled or deleted), so it reads the whole `pending` index
        // rather than every delivery paying for an index of its own (two index writes each).
        let mut keys = Vec::new();
        for shard in 0..PENDING_SHARDS {
            keys.extend(
                self.query_all(
                    self.client
                        .query()
                        .table_name(&self.tables.deliveries)
                        .index_name("pending")
                        .key_condition_expression("pending_shard = :shard")
                        .filter_expression("account_id = :a AND endpoint_id = :e")
                        .expression_attribute_values(":shard", s(shard.to_string()))
                        .expression_attribute_values(":a", s(account.as_str()))
                        .expression_attribute_values(":e", s(endpoint.as_str())),
                )
                .await?,
            );
        }
        // New deliveries perhaps not yet in the index: the walk has looked at everything
        // below its watermark (less the margin for late writes); the rest is read from the
        // endpoint's log, strongly consistent and whether indexed or not (the index is read
        // eventually consistent, so an entry just written may be missing from it).
        let watermark = self
            .get(&self.tables.control, key1("pk", FIRST_TRY_WATERMARK))
            .await?
            .map(|item| opt_n::<i64>(&item, "watermark"))
            .transpose()?
            .flatten();
        let from = watermark.map(|w| {
            from_millis(w) - chrono::TimeDelta::from_std(LATE_WRITE_MARGIN).unwrap_or_default()
        });
        keys.extend(
            self.endpoint_log(account, endpoint, from, None, LogFilter::Pending, true)
                .await?,
        );
        let mut seen = std::collections::HashSet::new();
        keys.retain(|item| seen.insert(opt_s(item, "id")));
        // One conditional write per delivery (no transaction, so no 100-item limit), a few
        // at a time; each one only moves a delivery that is still pending, so running this
        // again after a failure part-way finishes the rest and changes nothing else.
        let outcomes: Vec<StoreResult<bool>> = futures_util::stream::iter(keys)
            .map(|item| async move {
                let result = self
                    .client
                    .update_item()
                    .table_name(&self.tables.deliveries)
                    .set_key(Some(stored_delivery_key(&item)?))
                    .update_expression(
                        "SET #status = :abandoned, last_error = :reason, updated_at = :now \
                     REMOVE next_try_at, pending_shard, due_key",
                    )
                    .condition_expression("#status = :pending")
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":abandoned", s("abandoned"))
                    .expression_attribute_values(":pending", s("pending"))
                    .expression_attribute_values(":reason", s(reason))
                    .expression_attribute_values(":now", n(to_millis(now)))
                    .send()
                    .await;
                written(result).map(|out| out.is_some())
            })
            .buffer_unordered(ABANDON_CONCURRENCY)
            .collect()
            .await;
        let mut abandoned = 0;
        for outcome in outcomes {
            if outcome? {
                abandoned += 1;
            }
        }
        Ok(abandoned)
    }

    /// Abandons a disabled endpoint's pending deliveries, then moves the endpoint back from
    /// the `disabling` partition of the `failing` index (where the disabling transaction put
    /// it) to the `failing` one. Until that last write the endpoint stays findable, so the
    /// next health check (`failing_endpoints`) finishes an abandon that failed part-way.
    async fn finish_disabling(
        &self,
        account: &AccountId,
        endpoint: &EndpointId,
        reason: &str,
        now: Timestamp,
    ) -> StoreResult<u64> {
        let abandoned = self
            .abandon_pending_of(account, endpoint, &format!("abandoned: {reason}"), now)
            .await?;
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.endpoints)
            .set_key(Some(key2(
                "account_id",
                account.as_str(),
                "id",
                endpoint.as_str(),
            )))
            .update_expression("SET failing_shard = :failing")
            .condition_expression("failing_shard = :disabling")
            .expression_attribute_values(":failing", s(FAILING_SHARD))
            .expression_attribute_values(":disabling", s(DISABLING_SHARD))
            .send()
            .await;
        // Not written: already finished, or the endpoint was deleted or rewritten meanwhile.
        written(result)?;
        Ok(abandoned)
    }

    /// The endpoint's failing clock after an attempt, written only when it starts or stops
    /// (like the SQLite store): a healthy endpoint's row is read, not rewritten, per attempt.
    /// The read is strongly consistent, so an attempt recorded after another one sees it.
    async fn track_failing_clock(
        &self,
        account: &AccountId,
        r: &AttemptRecord,
    ) -> StoreResult<Option<Timestamp>> {
        let Some(endpoint) = self.get_endpoint_item(account, &r.endpoint_id).await? else {
            return Ok(None);
        };
        let key = key2("account_id", account.as_str(), "id", r.endpoint_id.as_str());
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
                    // Only touch an endpoint that still exists; an update would create it.
                    .condition_expression("attribute_exists(id) AND attribute_not_exists(#deleted)")
                    .expression_attribute_names("#deleted", DELETED_AT)
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
                    .condition_expression("attribute_exists(id) AND attribute_not_exists(#deleted)")
                    .expression_attribute_names("#deleted", DELETED_AT)
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

    /// A page of deliveries read from endpoints' log partitions merged newest first (by
    /// event time, then id). Filters on attributes that never change (account, endpoint,
    /// event type) run in the query; status and last status on the items read. A position
    /// (time, id) is a cursor for every partition (`LogWindow::upper_in`).
    async fn list_from_partitions(
        &self,
        account: &AccountId,
        partitions: Vec<LogPartition>,
        query: &DeliveryQuery,
        limit: usize,
    ) -> StoreResult<Page<Delivery>> {
        let mut upper = query
            .until
            .map(|until| LogUpper::Before(delivery_log_time(until)));
        if let Some(cursor) = &query.cursor {
            let (_, id) = decode_cursor(cursor).ok_or(StoreError::NotFound("cursor"))?;
            let id = DeliveryId::from_trusted(id);
            let time = id
                .log_time()
                .map(str::to_owned)
                .ok_or(StoreError::NotFound("cursor"))?;
            let tighter = match &upper {
                Some(LogUpper::Before(until)) => &time < until,
                _ => true,
            };
            if tighter {
                upper = Some(LogUpper::After { time, id });
            }
        }
        let window = LogWindow {
            lower: delivery_log_time(query.since.unwrap_or_else(|| from_millis(0))),
            upper,
            account: account.as_str().to_owned(),
            event_type: query.event_type.clone(),
        };
        let mut partitions = partitions;
        let mut found: Vec<Delivery> = Vec::new();
        let mut examined = 0usize;
        let mut last_examined: Option<(Timestamp, DeliveryId)> = None;
        while found.len() <= limit && examined < self.list_examine_budget {
            let want = limit + 1 - found.len();
            let mut batch: Vec<Delivery> = Vec::new();
            while batch.len() < want {
                let empty = partitions
                    .iter_mut()
                    .filter(|p| p.buffered.is_empty() && !p.exhausted);
                futures_util::future::try_join_all(
                    empty.map(|p| self.fill_partition(p, &window, want)),
                )
                .await?;
                let newest = partitions
                    .iter_mut()
                    .filter(|p| !p.buffered.is_empty())
                    .max_by(|a, b| {
                        a.buffered
                            .front()
                            .map(|(k, _)| k)
                            .cmp(&b.buffered.front().map(|(k, _)| k))
                    });
                let Some((_, delivery)) = newest.and_then(|p| p.buffered.pop_front()) else {
                    break;
                };
                batch.push(delivery);
            }
            if batch.is_empty() {
                break;
            }
            examined += batch.len();
            for delivery in batch {
                last_examined = Some((delivery.created_at, delivery.id.clone()));
                let wanted = query.status.is_none_or(|s| s == delivery.status)
                    && query
                        .status_code
                        .is_none_or(|c| delivery.last_status == Some(c));
                if wanted {
                    found.push(delivery);
                    if found.len() > limit {
                        break;
                    }
                }
            }
        }
        let more_to_read = partitions
            .iter()
            .any(|p| !p.buffered.is_empty() || !p.exhausted);
        let next_cursor = if found.len() > limit {
            found.truncate(limit);
            found
                .last()
                .map(|d| encode_position(to_millis(d.created_at), d.id.as_str()))
        } else if more_to_read {
            // The examine budget ran out: a short page that continues after the last entry
            // examined, so sparse filters cost bounded reads per call.
            last_examined.map(|(at, id)| encode_position(to_millis(at), id.as_str()))
        } else {
            None
        };
        Ok(Page {
            items: found,
            next_cursor,
        })
    }

    /// Reads the next page of a log partition into its buffer (at least one delivery unless
    /// the partition is exhausted: a filtered page can come back empty).
    async fn fill_partition(
        &self,
        partition: &mut LogPartition,
        window: &LogWindow,
        want: usize,
    ) -> StoreResult<()> {
        let lower = format!(
            "{}{}",
            delivery_log_prefix(&partition.partition),
            window.lower
        );
        let upper = window.upper_in(&partition.partition);
        if lower > upper {
            // An empty window (since after until, or a cursor before since); DynamoDB refuses
            // a BETWEEN whose bounds are the wrong way round.
            partition.exhausted = true;
            return Ok(());
        }
        let cursor_id = match &window.upper {
            Some(LogUpper::After { id, .. }) => Some(id),
            _ => None,
        };
        let mut filters = vec![LOG_PARTITION_FILTER];
        let mut request = self
            .log_query(
                &partition.partition,
                &window.account,
                &partition.endpoint,
                lower,
                upper,
            )
            .scan_index_forward(false)
            .consistent_read(true)
            .limit(i32::try_from(want.clamp(1, 500) + 1).unwrap_or(501));
        if let Some(event_type) = &window.event_type {
            request = request.expression_attribute_values(":event_type", s(event_type));
            filters.push("event_type = :event_type");
        }
        request = request.filter_expression(filters.join(" AND "));
        while partition.buffered.is_empty() && !partition.exhausted {
            let out = request
                .clone()
                .set_exclusive_start_key(partition.start.take())
                .send()
                .await
                .map_err(sdk)?;
            for item in out.items.unwrap_or_default() {
                let delivery = delivery_from_item(&item)?;
                if cursor_id == Some(&delivery.id) {
                    continue;
                }
                let Some(time) = delivery.id.log_time() else {
                    return Err(corrupt("id"));
                };
                let order = format!("{time}{}", delivery.id);
                partition.buffered.push_back((order, delivery));
            }
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => partition.start = Some(key),
                _ => partition.exhausted = true,
            }
        }
        Ok(())
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
            .set_key(Some(key2("account_id", account, "id", id)))
            .update_expression("SET rejected = :reason, fanned_out = :done REMOVE #shard")
            .condition_expression("attribute_exists(id)")
            .expression_attribute_names("#shard", UNFANNED_SHARD)
            .expression_attribute_values(":reason", s(reason))
            .expression_attribute_values(":done", AttributeValue::Bool(true))
            .send()
            .await;
        written(update)?;
        Ok(())
    }

    /// A final delivery back to `pending`, due now, its next try manual (see `Store::replay`).
    fn replay_delivery_update(
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
                 next_trigger = :manual, updated_at = :now",
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
    fn replay_count_update(
        &self,
        replay: &Replay,
        sort: i64,
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

    async fn transact(&self, items: Vec<TransactWriteItem>) -> Result<(), TransactionFailure> {
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(error) => {
                if let Some(TransactWriteItemsError::TransactionCanceledException(cancel)) =
                    error.as_service_error()
                {
                    let failed = cancel
                        .cancellation_reasons()
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.code() == Some("ConditionalCheckFailed"))
                        .map(|(i, _)| i)
                        .collect::<Vec<_>>();
                    if !failed.is_empty() {
                        return Err(TransactionFailure::Conditions(failed));
                    }
                }
                Err(TransactionFailure::Other(sdk(error)))
            }
        }
    }
}

/// One endpoint's log partition in a listing: its deliveries read newest first, a page at
/// a time, each buffered with its place in the merge (event time, then id).
struct LogPartition {
    partition: String,
    endpoint: EndpointId,
    buffered: std::collections::VecDeque<(String, Delivery)>,
    start: Option<Item>,
    exhausted: bool,
}

impl LogPartition {
    fn new(account: &AccountId, endpoint: &EndpointId) -> Self {
        Self {
            partition: delivery_log_partition(account, endpoint),
            endpoint: endpoint.clone(),
            buffered: std::collections::VecDeque::new(),
            start: None,
            exhausted: false,
        }
    }
}

/// A log partition is one endpoint's: this keeps out another endpoint whose partition hash
/// collides, and another account's endpoint of the same name.
const LOG_PARTITION_FILTER: &str = "account_id = :account AND endpoint_id = :endpoint";

/// Which deliveries of an endpoint's log a query returns.
#[derive(Debug, Clone, Copy)]
enum LogFilter {
    All,
    Pending,
    /// Pending without an attempt, and not in the `pending` index.
    UnindexedFirstTries,
}

/// The bounds and query-side filters of one listing. Times are as in delivery ids.
struct LogWindow {
    /// The earliest event time listed.
    lower: String,
    upper: Option<LogUpper>,
    account: String,
    event_type: Option<String>,
}

enum LogUpper {
    /// Deliveries of events before this time.
    Before(String),
    /// Deliveries before this position in the merged order: the last one of the previous
    /// page (left out itself).
    After { time: String, id: DeliveryId },
}

impl LogWindow {
    /// The highest id a partition's query reads (inclusive). For a cursor from another
    /// partition, the deliveries at the cursor's time come before it when their id is
    /// smaller, which for ids of two partitions is decided by the partitions alone.
    fn upper_in(&self, partition: &str) -> String {
        let prefix = delivery_log_prefix(partition);
        match &self.upper {
            None => format!("{prefix}~"),
            Some(LogUpper::Before(time)) => format!("{prefix}{time}"),
            Some(LogUpper::After { time, id }) => match id.log_partition() {
                Some(theirs) if theirs == partition => id.as_str().to_owned(),
                Some(theirs) if partition < theirs => format!("{prefix}{time}~"),
                _ => format!("{prefix}{time}"),
            },
        }
    }
}

enum TransactionFailure {
    /// The positions of the items whose condition did not hold.
    Conditions(Vec<usize>),
    Other(StoreError),
}

impl TransactionFailure {
    fn into_store_error(self) -> StoreError {
        match self {
            Self::Conditions(items) => StoreError::Backend(format!(
                "transaction cancelled: conditions failed on items {items:?}"
            )),
            Self::Other(e) => e,
        }
    }
}

fn sdk<E: std::error::Error>(error: E) -> StoreError {
    StoreError::Backend(error_text(&error))
}

fn build_error(error: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Backend(format!("malformed DynamoDB request: {error}"))
}

fn is_condition_failed<E: ProvideErrorMetadata, R>(error: &SdkError<E, R>) -> bool {
    error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        == Some("ConditionalCheckFailedException")
}

/// The output of a conditional write, or `None` when its condition did not hold.
fn written<T, E, R>(result: Result<T, SdkError<E, R>>) -> StoreResult<Option<T>>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match result {
        Ok(out) => Ok(Some(out)),
        Err(e) if is_condition_failed(&e) => Ok(None),
        Err(e) => Err(sdk(e)),
    }
}

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn key1(name: &str, value: &str) -> Item {
    Item::from([(name.to_owned(), s(value))])
}

fn key2(name: &str, value: &str, sort_name: &str, sort_value: &str) -> Item {
    Item::from([
        (name.to_owned(), s(value)),
        (sort_name.to_owned(), s(sort_value)),
    ])
}

/// Every delivery this store writes has the id derived from its (account, event, event
/// time, endpoint) (`DeliveryId::derived`, what `Delivery::new_pending` gives, with the
/// event's time as the delivery's): an event's deliveries are found by those ids, without an
/// index. Another id is refused rather than stored unfindable.
fn derived_ids_only(deliveries: &[Delivery]) -> StoreResult<()> {
    match deliveries.iter().find(|d| {
        d.id != DeliveryId::derived(&d.account_id, &d.event_id, d.created_at, &d.endpoint_id)
    }) {
        None => Ok(()),
        Some(d) => Err(StoreError::Backend(format!(
            "delivery {} does not have the id derived from its event and endpoint",
            d.id
        ))),
    }
}

fn put_if_absent(table: &str, item: Item, key_attribute: &str) -> StoreResult<TransactWriteItem> {
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(#k)")
        .expression_attribute_names("#k", key_attribute)
        .build()
        .map_err(build_error)?;
    Ok(TransactWriteItem::builder().put(put).build())
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("DynamoDB item without a valid `{what}`"))
}

fn get_s(item: &Item, name: &str) -> StoreResult<String> {
    opt_s(item, name).ok_or_else(|| corrupt(name))
}

fn opt_s(item: &Item, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Some(v.clone()),
        _ => None,
    }
}

fn get_n<T: std::str::FromStr>(item: &Item, name: &str) -> StoreResult<T> {
    opt_n(item, name)?.ok_or_else(|| corrupt(name))
}

fn opt_n<T: std::str::FromStr>(item: &Item, name: &str) -> StoreResult<Option<T>> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse().map(Some).map_err(|_| corrupt(name)),
        Some(AttributeValue::Null(_)) | None => Ok(None),
        Some(_) => Err(corrupt(name)),
    }
}

fn get_bool(item: &Item, name: &str) -> bool {
    matches!(item.get(name), Some(AttributeValue::Bool(true)))
}

/// The key of a delivery's item: its endpoint's log partition and its id. `None` for an id
/// no delivery can have (given from outside).
fn delivery_key(id: &DeliveryId) -> Option<Item> {
    let partition = id.log_partition()?;
    Some(key2("log", partition, "id", id.as_str()))
}

/// The key of a delivery item read back (or of its `pending` index entry).
fn stored_delivery_key(item: &Item) -> StoreResult<Item> {
    delivery_key(&DeliveryId::from_trusted(get_s(item, "id")?)).ok_or_else(|| corrupt("id"))
}

/// Sort key that orders by time, then id: `0001700000000000#dlv_…`.
fn time_key(at: Timestamp, id: &str) -> String {
    format!("{:016}#{id}", to_millis(at).max(0))
}

/// When a pending delivery is due as the sweeper sees it: its next try, or the time its
/// re-queued message is expected (`due_key` of a deferred delivery), whichever is later.
fn indexed_due(item: &Item) -> StoreResult<Timestamp> {
    let next = get_n::<i64>(item, "next_try_at")?;
    let keyed = opt_s(item, "due_key")
        .and_then(|key| key.get(..16)?.parse::<i64>().ok())
        .unwrap_or(next);
    Ok(from_millis(next.max(keyed)))
}

fn time_bound(at: Timestamp) -> String {
    format!("{:016}", to_millis(at).max(0))
}

/// One of `shards` partitions for an id (FNV-1a): stable, so an index entry never moves.
fn shard_of(id: &str, shards: u32) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in id.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash % shards).to_string()
}

/// The `pending` index partition of a delivery id.
pub fn pending_shard(id: &str) -> String {
    shard_of(id, PENDING_SHARDS)
}

/// The `unfanned` index partition of an event id.
pub fn unfanned_shard(id: &str) -> String {
    shard_of(id, UNFANNED_SHARDS)
}

/// The walk's control item: how far it has looked (`watermark`), and where a walk left
/// part-way stopped (the window's end and the last endpoint done).
fn walk_state(watermark: Option<i64>, walking: Option<(Timestamp, &str, &str)>) -> Item {
    let mut item = key1("pk", FIRST_TRY_WATERMARK);
    if let Some(watermark) = watermark {
        item.insert("watermark".into(), n(watermark));
    }
    if let Some((until, account, endpoint)) = walking {
        item.insert("walking_until".into(), n(to_millis(until)));
        item.insert("walked_account".into(), s(account));
        item.insert("walked_endpoint".into(), s(endpoint));
    }
    item
}

fn account_item(account: &Account) -> Item {
    Item::from([
        ("id".into(), s(account.id.as_str())),
        ("name".into(), s(&account.name)),
        ("owner_email".into(), s(account.owner_email.as_str())),
        ("created_at".into(), n(to_millis(account.created_at))),
    ])
}

fn account_from_item(item: &Item) -> StoreResult<Account> {
    Ok(Account {
        id: AccountId::from_trusted(get_s(item, "id")?),
        name: get_s(item, "name")?,
        owner_email: EmailAddress::from_trusted(get_s(item, "owner_email")?),
        created_at: from_millis(get_n(item, "created_at")?),
    })
}

fn endpoint_item(e: &Endpoint) -> Item {
    let mut item = Item::from([
        ("account_id".into(), s(e.account_id.as_str())),
        ("id".into(), s(e.id.as_str())),
        ("url".into(), s(e.url.as_str())),
        ("description".into(), s(&e.description)),
        ("secret".into(), s(e.secret.expose())),
        ("status".into(), s(e.status.as_str())),
        ("max_in_flight".into(), n(e.max_in_flight)),
        ("created_at".into(), n(to_millis(e.created_at))),
        ("updated_at".into(), n(to_millis(e.updated_at))),
    ]);
    if let Some(retiring) = &e.retiring_secret {
        item.insert("retiring_secret".into(), s(retiring.secret.expose()));
        item.insert("retiring_until".into(), n(to_millis(retiring.until)));
    }
    if let Some(patterns) = e.event_types.patterns() {
        item.insert(
            "event_types".into(),
            AttributeValue::L(patterns.iter().map(s).collect()),
        );
    }
    if let Some(rate) = e.rate_limit_per_second {
        item.insert("rate_limit".into(), n(rate));
    }
    if let Some(since) = e.failing_since {
        item.insert("failing_since".into(), n(to_millis(since)));
        item.insert("failing_shard".into(), s(FAILING_SHARD));
    }
    if let Some(reason) = &e.disabled_reason {
        item.insert("disabled_reason".into(), s(reason));
    }
    item
}

/// A deleted endpoint's item: kept (without its secrets) so that the account's deliveries
/// stay findable by their derived ids; hidden from every endpoint read.
fn is_tombstone(item: &Item) -> bool {
    item.contains_key(DELETED_AT)
}

fn endpoint_from_item(item: &Item) -> StoreResult<Endpoint> {
    let url = get_s(item, "url")?;
    let secret = get_s(item, "secret")?;
    let status = get_s(item, "status")?;
    let patterns = match item.get("event_types") {
        Some(AttributeValue::L(list)) => Some(
            list.iter()
                .map(|v| match v {
                    AttributeValue::S(p) => Ok(p.clone()),
                    _ => Err(corrupt("event_types")),
                })
                .collect::<StoreResult<Vec<_>>>()?,
        ),
        _ => None,
    };
    let retiring_secret = match (
        opt_s(item, "retiring_secret"),
        opt_n::<i64>(item, "retiring_until")?,
    ) {
        (Some(secret), Some(until)) => Some(RetiringSecret {
            secret: SigningSecret::parse(&secret).map_err(|_| corrupt("retiring_secret"))?,
            until: from_millis(until),
        }),
        _ => None,
    };
    Ok(Endpoint {
        id: EndpointId::from_trusted(get_s(item, "id")?),
        account_id: AccountId::from_trusted(get_s(item, "account_id")?),
        url: EndpointUrl::parse(&url).map_err(|_| corrupt("url"))?,
        description: opt_s(item, "description").unwrap_or_default(),
        secret: SigningSecret::parse(&secret).map_err(|_| corrupt("secret"))?,
        retiring_secret,
        status: EndpointStatus::parse(&status).ok_or_else(|| corrupt("status"))?,
        event_types: EventTypeFilter::parse(patterns.as_deref())
            .map_err(|_| corrupt("event_types"))?,
        max_in_flight: get_n(item, "max_in_flight")?,
        rate_limit_per_second: opt_n(item, "rate_limit")?,
        failing_since: opt_n::<i64>(item, "failing_since")?.map(from_millis),
        disabled_reason: opt_s(item, "disabled_reason"),
        created_at: from_millis(get_n(item, "created_at")?),
        updated_at: from_millis(get_n(item, "updated_at")?),
    })
}

fn event_from_item(item: &Item) -> StoreResult<Event> {
    Ok(Event {
        id: EventId::from_trusted(get_s(item, "id")?),
        account_id: AccountId::from_trusted(get_s(item, "account_id")?),
        event_type: EventType::from_trusted(get_s(item, "type")?),
        created_at: from_millis(get_n(item, "created_at")?),
        payload: get_s(item, "payload")?,
    })
}

/// A new delivery's item, as written now.
fn new_delivery_item(
    d: &Delivery,
    written_at: Timestamp,
    late_fan_out: Option<std::time::Duration>,
) -> StoreResult<Item> {
    let partition =
        d.id.log_partition()
            .ok_or_else(|| StoreError::Backend(format!("delivery {} has no derived id", d.id)))?;
    let mut item = Item::from([
        ("log".into(), s(partition)),
        ("id".into(), s(d.id.as_str())),
        ("account_id".into(), s(d.account_id.as_str())),
        ("event_id".into(), s(d.event_id.as_str())),
        ("endpoint_id".into(), s(d.endpoint_id.as_str())),
        ("event_type".into(), s(d.event_type.as_str())),
        ("status".into(), s(d.status.as_str())),
        ("attempts".into(), n(d.attempts)),
        ("client_errors".into(), n(d.client_error_count)),
        ("created_at".into(), n(to_millis(d.created_at))),
        ("updated_at".into(), n(to_millis(d.updated_at))),
    ]);
    item.insert("schedule_start".into(), n(d.schedule_start));
    item.insert("next_trigger".into(), s(d.next_trigger.as_str()));
    if let Some(at) = d.next_try_at {
        item.insert("next_try_at".into(), n(to_millis(at)));
    }
    if let Some(code) = d.last_status {
        item.insert("last_status".into(), n(code));
    }
    if let Some(error) = &d.last_error {
        item.insert("last_error".into(), s(error));
    }
    // A new delivery stays out of the `pending` index (entering and leaving it would cost
    // two index writes for a first try that delivers): it enters after a failed try, on a
    // replay, or when `walk_unsent_first_tries` finds it still unsent. One written long
    // after its event's time may sit where the walk has already looked, and one dated far
    // ahead (a platform clock running fast) where it will not look for a long time: it
    // enters now.
    let out_of_step = late_fan_out
        .and_then(|late| chrono::TimeDelta::from_std(late).ok())
        .is_some_and(|late| (written_at - d.created_at).abs() > late);
    if d.status == DeliveryStatus::Pending && out_of_step {
        let due = d.next_try_at.unwrap_or(written_at);
        item.insert("pending_shard".into(), s(pending_shard(d.id.as_str())));
        item.insert("due_key".into(), s(time_key(due, d.id.as_str())));
    }
    Ok(item)
}

fn delivery_from_item(item: &Item) -> StoreResult<Delivery> {
    let status = get_s(item, "status")?;
    Ok(Delivery {
        id: DeliveryId::from_trusted(get_s(item, "id")?),
        event_id: EventId::from_trusted(get_s(item, "event_id")?),
        endpoint_id: EndpointId::from_trusted(get_s(item, "endpoint_id")?),
        account_id: AccountId::from_trusted(get_s(item, "account_id")?),
        event_type: EventType::from_trusted(get_s(item, "event_type")?),
        status: DeliveryStatus::parse(&status).ok_or_else(|| corrupt("status"))?,
        attempts: get_n(item, "attempts")?,
        next_try_at: opt_n::<i64>(item, "next_try_at")?.map(from_millis),
        last_status: opt_n(item, "last_status")?,
        last_error: opt_s(item, "last_error"),
        client_error_count: get_n(item, "client_errors")?,
        schedule_start: opt_n(item, "schedule_start")?.unwrap_or(0),
        next_trigger: opt_s(item, "next_trigger")
            .and_then(|t| Trigger::parse(&t))
            .unwrap_or(Trigger::Scheduled),
        queued_until: opt_n::<i64>(item, "queued_until")?.map(from_millis),
        created_at: from_millis(get_n(item, "created_at")?),
        updated_at: from_millis(get_n(item, "updated_at")?),
    })
}

/// The partition of the attempts table that holds an account's replay audit records
/// (newest first by the numeric sort key): replays are rare, human-sized, and kept without TTL.
fn replays_partition(account: &AccountId) -> String {
    format!("replays#{account}")
}

fn replay_key(replay: &Replay, sort: i64) -> Item {
    Item::from([
        (
            "delivery_id".into(),
            s(replays_partition(&replay.account_id)),
        ),
        ("number".into(), n(sort)),
    ])
}

fn replay_item(replay: &Replay, sort: i64) -> Item {
    let mut item = replay_key(replay, sort);
    item.extend([
        ("replay_id".into(), s(replay.id.as_str())),
        ("account_id".into(), s(replay.account_id.as_str())),
        ("actor".into(), s(&replay.actor)),
        ("requested_at".into(), n(to_millis(replay.requested_at))),
        ("count".into(), n(replay.count)),
        ("more".into(), AttributeValue::Bool(replay.more)),
        (
            "statuses".into(),
            s(serde_json::to_string(
                &replay
                    .filter
                    .statuses
                    .iter()
                    .map(|st| st.as_str())
                    .collect::<Vec<_>>(),
            )
            .unwrap_or_else(|_| "[]".into())),
        ),
        (
            "event_types".into(),
            s(serde_json::to_string(
                &replay
                    .filter
                    .event_types
                    .iter()
                    .map(EventType::as_str)
                    .collect::<Vec<_>>(),
            )
            .unwrap_or_else(|_| "[]".into())),
        ),
    ]);
    match &replay.scope {
        ReplayScope::Delivery(id) => item.insert("scope_delivery".into(), s(id.as_str())),
        ReplayScope::Endpoint(id) => item.insert("scope_endpoint".into(), s(id.as_str())),
    };
    if let Some(since) = replay.filter.since {
        item.insert("since".into(), n(to_millis(since)));
    }
    if let Some(until) = replay.filter.until {
        item.insert("until".into(), n(to_millis(until)));
    }
    item
}

fn replay_from_item(item: &Item) -> StoreResult<Replay> {
    let scope = match (opt_s(item, "scope_delivery"), opt_s(item, "scope_endpoint")) {
        (Some(delivery), _) => ReplayScope::Delivery(DeliveryId::from_trusted(delivery)),
        (None, Some(endpoint)) => ReplayScope::Endpoint(EndpointId::from_trusted(endpoint)),
        (None, None) => return Err(corrupt("scope")),
    };
    let statuses: Vec<String> =
        serde_json::from_str(&get_s(item, "statuses")?).map_err(|_| corrupt("statuses"))?;
    let event_types: Vec<String> =
        serde_json::from_str(&get_s(item, "event_types")?).map_err(|_| corrupt("event_types"))?;
    Ok(Replay {
        id: ReplayId::from_trusted(get_s(item, "replay_id")?),
        account_id: AccountId::from_trusted(get_s(item, "account_id")?),
        actor: get_s(item, "actor")?,
        scope,
        filter: ReplayFilter {
            since: opt_n::<i64>(item, "since")?.map(from_millis),
            until: opt_n::<i64>(item, "until")?.map(from_millis),
            statuses: statuses
                .iter()
                .map(|st| DeliveryStatus::parse(st).ok_or_else(|| corrupt("statuses")))
                .collect::<StoreResult<Vec<_>>>()?,
            event_types: event_types
                .into_iter()
                .map(EventType::from_trusted)
                .collect(),
        },
        requested_at: from_millis(get_n(item, "requested_at")?),
        count: get_n(item, "count")?,
        more: get_bool(item, "more"),
    })
}

/// What an attempt left, as stored in its row (with the row's keys) or in a delivery's
/// `first_try` map.
fn attempt_detail(attempt: &Attempt) -> Item {
    let mut detail = Item::from([
        ("trigger".into(), s(attempt.trigger.as_str())),
        ("started_at".into(), n(to_millis(attempt.started_at))),
        ("latency_ms".into(), n(attempt.latency_ms)),
        (
            "response_headers".into(),
            s(serde_json::to_string(&attempt.response_headers).unwrap_or_else(|_| "[]".into())),
        ),
        ("response_body".into(), s(&attempt.response_body)),
        (
            "response_body_truncated".into(),
            AttributeValue::Bool(attempt.response_body_truncated),
        ),
    ]);
    if let Some(code) = attempt.status_code {
        detail.insert("status_code".into(), n(code));
    }
    if let Some(error) = &attempt.error {
        detail.insert("error".into(), s(error));
    }
    detail
}

/// The first try kept on a delivery item (see `record_attempt`), if any.
fn first_try_from_item(item: &Item) -> StoreResult<Option<Attempt>> {
    let Some(AttributeValue::M(detail)) = item.get("first_try") else {
        return Ok(None);
    };
    let id = get_s(item, "id")?;
    attempt_from_detail(detail, DeliveryId::from_trusted(id), 1).map(Some)
}

fn attempt_from_item(item: &Item) -> StoreResult<Attempt> {
    attempt_from_detail(
        item,
        DeliveryId::from_trusted(get_s(item, "delivery_id")?),
        get_n(item, "number")?,
    )
}

fn attempt_from_detail(item: &Item, delivery_id: DeliveryId, number: u32) -> StoreResult<Attempt> {
    let trigger = get_s(item, "trigger")?;
    let headers = get_s(item, "response_headers")?;
    Ok(Attempt {
        delivery_id,
        number,
        trigger: Trigger::parse(&trigger).ok_or_else(|| corrupt("trigger"))?,
        started_at: from_millis(get_n(item, "started_at")?),
        latency_ms: get_n(item, "latency_ms")?,
        status_code: opt_n(item, "status_code")?,
        response_headers: serde_json::from_str(&headers)
            .map_err(|_| corrupt("response_headers"))?,
        response_body: opt_s(item, "response_body").unwrap_or_default(),
        response_body_truncated: get_bool(item, "response_body_truncated"),
        error: opt_s(item, "error"),
    })
}

fn notification_from_item(item: &Item) -> StoreResult<Notification> {
    Ok(Notification {
        id: get_s(item, "id")?,
        account_id: AccountId::from_trusted(get_s(item, "account_id")?),
        recipient: EmailAddress::from_trusted(get_s(item, "recipient")?),
        subject: get_s(item, "subject")?,
        body: get_s(item, "body")?,
        created_at: from_millis(get_n(item, "created_at")?),
    })
}

fn notification_item(n_: &Notification) -> Item {
    Item::from([
        ("pk".into(), s(format!("notification#{}", n_.id))),
        ("id".into(), s(&n_.id)),
        ("account_id".into(), s(n_.account_id.as_str())),
        ("recipient".into(), s(n_.recipient.as_str())),
        ("subject".into(), s(&n_.subject)),
        ("body".into(), s(&n_.body)),
        ("created_at".into(), n(to_millis(n_.created_at))),
        (UNSENT.into(), s(UNSENT)),
        ("created_key".into(), s(time_key(n_.created_at, &n_.id))),
    ])
}

/// A listing position: the created time and id of the last delivery returned or examined.
fn encode_position(created_millis: i64, id: &str) -> String {
    let cursor = serde_json::json!({"c": created_millis, "i": id});
    URL_SAFE_NO_PAD.encode(cursor.to_string())
}

#[async_trait]
impl Store for DynamoStore {
    async fn create_account(&self, account: &Account) -> StoreResult<()> {
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.accounts)
            .set_item(Some(account_item(account)))
            .condition_expression("attribute_not_exists(id)")
            .send()
            .await;
        written(result)?
            .map(|_| ())
            .ok_or_else(|| StoreError::Conflict {
                entity: "account",
                id: account.id.to_string(),
            })
    }

    async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        self.get(&self.tables.accounts, key1("id", id.as_str()))
            .await?
            .map(|item| account_from_item(&item))
            .transpose()
    }

    async fn create_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()> {
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.endpoints)
            .set_item(Some(endpoint_item(endpoint)))
            // A deleted endpoint's tombstone gives way to a new endpoint of the same id.
            .condition_expression("attribute_not_exists(id) OR attribute_exists(#deleted)")
            .expression_attribute_names("#deleted", DELETED_AT)
            .send()
            .await;
        written(result)?
            .map(|_| ())
            .ok_or_else(|| StoreError::Conflict {
                entity: "endpoint",
                id: endpoint.id.to_string(),
            })
    }

    async fn get_endpoint(
        &self,
        account: &AccountId,
        id: &EndpointId,
    ) -> StoreResult<Option<Endpoint>> {
        self.get_endpoint_item(account, id).await
    }

    async fn list_endpoints(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
        let items = self
            .query_all(
                self.client
                    .query()
                    .table_name(&self.tables.endpoints)
                    .key_condition_expression("account_id = :a")
                    .expression_attribute_values(":a", s(account.as_str()))
                    .consistent_read(true),
            )
            .await?;
        let mut endpoints = items
            .iter()
            .filter(|item| !is_tombstone(item))
            .map(endpoint_from_item)
            .collect::<StoreResult<Vec<_>>>()?;
        endpoints.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(endpoints)
    }

    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()> {
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.endpoints)
            .set_item(Some(endpoint_item(endpoint)))
            .condition_expression("attribute_exists(id) AND attribute_not_exists(#deleted)")
            .expression_attribute_names("#deleted", DELETED_AT)
            .send()
            .await;
        written(result)?
            .map(|_| ())
            .ok_or(StoreError::NotFound("endpoint"))
    }

    async fn delete_endpoint(
        &self,
        account: &AccountId,
        id: &EndpointId,
        now: Timestamp,
    ) -> StoreResult<bool> {
        // A tombstone rather than a delete: the account's deliveries are found through its
        // endpoints' ids (see `deliveries_of_event`, `list_deliveries`). It keeps no secret,
        // leaves the `failing` index and reads as absent everywhere.
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.endpoints)
            .set_key(Some(key2(
                "account_id",
                account.as_str(),
                "id",
                id.as_str(),
            )))
            .update_expression(
                "SET #deleted = :now, updated_at = :now, #status = :disabled \
                 REMOVE secret, retiring_secret, retiring_until, failing_since, failing_shard",
            )
            .condition_expression("attribute_exists(id) AND attribute_not_exists(#deleted)")
            .expression_attribute_names("#deleted", DELETED_AT)
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":now", n(to_millis(now)))
            .expression_attribute_values(":disabled", s("disabled"))
            .send()
            .await;
        if written(result)?.is_none() {
            return Ok(false);
        }
        self.abandon_pending_of(account, id, "endpoint deleted", now)
            .await?;
        Ok(true)
    }

    async fn publish(&self, event: &Event, deliveries: &[Delivery]) -> StoreResult<PublishOutcome> {
        derived_ids_only(deliveries)?;
        // The event and its first deliveries in one transaction; an account with more
        // endpoints than one transaction holds gets the rest in follow-up transactions,
        // each put conditional, so repeating them is harmless.
        let mut items = vec![put_if_absent(
            &self.tables.events,
            self.event_item(event, true),
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
        match self.transact(items).await {
            Ok(()) => {}
            Err(TransactionFailure::Conditions(failed)) if failed.contains(&0) => {
                let existing = self
                    .get_event_item(event.account_id.as_str(), event.id.as_str())
                    .await?
                    .ok_or_else(|| StoreError::Backend("event vanished during publish".into()))?;
                let deliveries = self.deliveries_of_event(&existing).await?;
                return Ok(PublishOutcome::AlreadyExists {
                    event: existing,
                    deliveries,
                });
            }
            Err(other) => return Err(other.into_store_error()),
        }
        let rest: Vec<&Delivery> = rest.collect();
        for chunk in rest.chunks(MAX_TRANSACTION_ITEMS) {
            let items = chunk
                .iter()
                .map(|d| put_if_absent(&self.tables.deliveries, self.delivery_item(d)?, "id"))
                .collect::<StoreResult<Vec<_>>>()?;
            match self.transact(items).await {
                Ok(()) | Err(TransactionFailure::Conditions(_)) => {}
                Err(TransactionFailure::Other(e)) => return Err(e),
            }
        }
        Ok(PublishOutcome::Created)
    }

    async fn put_event(&self, event: &Event) -> StoreResult<PutEventOutcome> {
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.events)
            .set_item(Some(self.event_item(event, false)))
            .condition_expression("attribute_not_exists(id)")
            .send()
            .await;
        match written(result)? {
            Some(_) => Ok(PutEventOutcome::Created),
            None => self
                .get_event_item(event.account_id.as_str(), event.id.as_str())
                .await?
                .map(PutEventOutcome::AlreadyExists)
                .ok_or_else(|| StoreError::Backend("event vanished during publish".into())),
        }
    }

    async fn add_deliveries(&self, deliveries: &[Delivery]) -> StoreResult<Vec<Delivery>> {
        derived_ids_only(deliveries)?;
        let mut added = Vec::new();
        for delivery in deliveries {
            let result = self
                .client
                .put_item()
                .table_name(&self.tables.deliveries)
                .set_item(Some(self.delivery_item(delivery)?))
                .condition_expression("attribute_not_exists(id)")
                .send()
                .await;
            if written(result)?.is_some() {
                added.push(delivery.clone());
            }
        }
        Ok(added)
    }

    async fn get_event(&self, account: &AccountId, id: &EventId) -> StoreResult<Option<Event>> {
        self.get_event_item(account.as_str(), id.as_str()).await
    }

    async fn deliveries_of_event(&self, event: &Event) -> StoreResult<Vec<Delivery>> {
        // A delivery's id is derived from (account, event, event time, endpoint) (checked
        // when it is written), so the candidates are one per endpoint the account ever had,
        // deleted ones included; the ones that exist are the event's deliveries. (No read of
        // the event: the fan-out function may not read the events table, only its stream.)
        let (account, id) = (&event.account_id, &event.id);
        let ids: Vec<DeliveryId> = self
            .endpoint_ids_ever(account)
            .await?
            .iter()
            .map(|endpoint| DeliveryId::derived(account, id, event.created_at, endpoint))
            .collect();
        let mut deliveries = self
            .get_deliveries(&ids)
            .await?
            .iter()
            .map(delivery_from_item)
            .collect::<StoreResult<Vec<_>>>()?;
        deliveries.retain(|d| &d.account_id == account && &d.event_id == id);
        deliveries.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(deliveries)
    }

    async fn unfanned_events(
        &self,
        after: Option<Timestamp>,
        created_before: Timestamp,
        limit: u32,
    ) -> StoreResult<super::UnfannedPage> {
        let limit = limit.max(1) as usize;
        let lower = after.map_or(0, |a| to_millis(a) + 1);
        let upper = to_millis(created_before);
        if lower > upper {
            // DynamoDB refuses a reversed BETWEEN.
            return Ok(super::UnfannedPage::default());
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
                .get(&self.tables.events, key2("account_id", &account, "id", &id))
                .await?
            else {
                continue;
            };
            if !item.contains_key(UNFANNED_SHARD) {
                continue;
            }
            // Checked as the stream's reader checks an image: fields present, ids valid.
            let checked = event_from_item(&item)
                .map_err(|e| e.to_string())
                .and_then(|event| {
                    AccountId::parse(event.account_id.as_str()).map_err(|e| e.to_string())?;
                    EventId::parse(event.id.as_str()).map_err(|e| e.to_string())?;
                    EventType::parse(event.event_type.as_str()).map_err(|e| e.to_string())?;
                    Ok(event)
                });
            match checked {
                Ok(event) => events.push(event),
                Err(reason) => self.reject_event(&account, &id, &reason).await?,
            }
        }
        Ok(super::UnfannedPage { events, last })
    }

    async fn mark_fanned_out(&self, events: &[Event]) -> StoreResult<()> {
        let updates: Vec<_> = events
            .iter()
            .map(|event| {
                self.client
                    .update_item()
                    .table_name(&self.tables.events)
                    .set_key(Some(key2(
                        "account_id",
                        event.account_id.as_str(),
                        "id",
                        event.id.as_str(),
                    )))
                    .update_expression("SET fanned_out = :done REMOVE #shard")
                    .condition_expression("attribute_exists(#shard)")
                    .expression_attribute_names("#shard", UNFANNED_SHARD)
                    .expression_attribute_values(":done", AttributeValue::Bool(true))
            })
            .collect();
        let results: Vec<_> = futures_util::stream::iter(updates)
            .map(|update| update.send())
            .buffer_unordered(ABANDON_CONCURRENCY)
            .collect()
            .await;
        for result in results {
            // Already marked (a repeat), or expired meanwhile: nothing left to do.
            written(result)?;
        }
        Ok(())
    }

    async fn load_work(&self, delivery: &DeliveryId) -> StoreResult<Option<DeliveryWork>> {
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

    async fn move_unattempted(
        &self,
        delivery: &DeliveryId,
        expected_attempts: u32,
        change: &Unattempted,
        now: Timestamp,
    ) -> StoreResult<bool> {
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
            Unattempted::Fail(reason) => request
                .update_expression(
                    "SET #status = :failed, last_error = :reason, updated_at = :now \
                     REMOVE next_try_at, pending_shard, due_key",
                )
                .expression_attribute_values(":failed", s(DeliveryStatus::Failed.as_str()))
                .expression_attribute_values(":reason", s(reason)),
        };
        Ok(written(request.send().await)?.is_some())
    }

    async fn record_attempt(&self, r: &AttemptRecord) -> StoreResult<RecordOutcome> {
        // Three single writes, no transaction (a transaction costs every item twice): the
        // delivery's conditional update decides; only then the attempt's detail and, if its
        // failing clock starts or stops, the endpoint. A crash between them loses that
        // attempt's detail (the delivery keeps its status, last status and error) or delays
        // the clock to the next attempt, never a delivery's state.
        let delivery_id = r.attempt.delivery_id.as_str();
        // An id no delivery can have: no such delivery, as for a missing one.
        let Some(key) = delivery_key(&r.attempt.delivery_id) else {
            return Ok(RecordOutcome::Stale);
        };

        let (status, next_try_at, last_error) = match &r.decision {
            Decision::Delivered => (DeliveryStatus::Delivered, None, None),
            Decision::RetryAt(at) => (DeliveryStatus::Pending, Some(*at), r.attempt.error.clone()),
            Decision::Failed { reason } => (
                DeliveryStatus::Failed,
                None,
                Some(match &r.attempt.error {
                    Some(error) => format!("{error} ({reason})"),
                    None => reason.clone(),
                }),
            ),
        };
        let mut sets = vec![
            "#status = :status",
            "attempts = :attempts",
            "client_errors = :client_errors",
            "updated_at = :now",
            "next_trigger = :scheduled",
        ];
        let mut removes = Vec::new();
        let mut values = Item::from([
            (":status".into(), s(status.as_str())),
            (":attempts".into(), n(r.attempt.number)),
            (":client_errors".into(), n(r.client_error_count)),
            (":now".into(), n(to_millis(r.now))),
            (":pending".into(), s("pending")),
            (":expected".into(), n(r.expected_attempts)),
            (":scheduled".into(), s(Trigger::Scheduled.as_str())),
        ]);
        match next_try_at {
            Some(at) => {
                sets.push("next_try_at = :next");
                sets.push("due_key = :due_key");
                sets.push("pending_shard = :shard");
                values.insert(":shard".into(), s(pending_shard(delivery_id)));
                values.insert(":next".into(), n(to_millis(at)));
                values.insert(":due_key".into(), s(time_key(at, delivery_id)));
            }
            None => removes.extend(["next_try_at", "pending_shard", "due_key"]),
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
            && crate::aws::meter::item_size(&detail) <= INLINE_FIRST_TRY_BYTES
        {
            sets.push("first_try = :first_try");
            values.insert(":first_try".into(), AttributeValue::M(detail));
            None
        } else {
            let expires = to_millis(r.attempt.started_at) / 1000
                + i64::try_from(self.retention.attempts.as_secs()).unwrap_or(i64::MAX / 2);
            let mut row = detail;
            row.insert("delivery_id".into(), s(delivery_id));
            row.insert("number".into(), n(r.attempt.number));
            row.insert("expires_at".into(), n(expires));
            Some(row)
        };
        let mut expression = format!("SET {}", sets.join(", "));
        if !removes.is_empty() {
            expression.push_str(&format!(" REMOVE {}", removes.join(", ")));
        }
        let updated = self
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
            .send()
            .await;
        // Not written: not pending at the expected count, or no such delivery.
        let Some(out) = written(updated)? else {
            return Ok(RecordOutcome::Stale);
        };
        let account = out
            .attributes
            .as_ref()
            .map(|item| get_s(item, "account_id"))
            .transpose()?
            .map(AccountId::from_trusted)
            .ok_or_else(|| corrupt("account_id"))?;

        if let Some(row) = attempt_row {
            self.client
                .put_item()
                .table_name(&self.tables.attempts)
                .set_item(Some(row))
                .send()
                .await
                .map_err(sdk)?;
        }

        let endpoint_failing_since = self.track_failing_clock(&account, r).await?;
        Ok(RecordOutcome::Recorded {
            endpoint_failing_since,
        })
    }

    async fn pending_deliveries(
        &self,
        due_before: Timestamp,
        after: Option<&DeliveryId>,
        limit: u32,
    ) -> StoreResult<Vec<PendingRef>> {
        // The index is ordered by due time within each shard, but the port pages by
        // delivery id: gather every due entry, then order and cut by id. Due-but-unsent
        // entries are few in practice (the sweeper looks only past a grace period).
        let upper = format!("{}#~", time_bound(due_before));
        let mut due: BTreeMap<String, Item> = BTreeMap::new();
        // A sweep's first page brings new deliveries that are still unsent into the index
        // (and lists them here, as the index may not show them yet).
        if after.is_none() {
            for item in self.walk_unsent_first_tries(due_before).await? {
                let due_at = opt_n::<i64>(&item, "next_try_at")?.map(from_millis);
                if due_at.is_some_and(|at| at <= due_before) {
                    due.insert(get_s(&item, "id")?, item);
                }
            }
        }
        for shard in 0..PENDING_SHARDS {
            let items = self
                .query_all(
                    self.client
                        .query()
                        .table_name(&self.tables.deliveries)
                        .index_name("pending")
                        .key_condition_expression("pending_shard = :shard AND due_key <= :upper")
                        .expression_attribute_values(":shard", s(shard.to_string()))
                        .expression_attribute_values(":upper", s(upper.clone())),
                )
                .await?;
            for item in items {
                let id = get_s(&item, "id")?;
                if after.is_none_or(|after| id.as_str() > after.as_str()) {
                    due.insert(id, item);
                }
            }
        }
        let mut endpoints: HashMap<(String, String), Option<Endpoint>> = HashMap::new();
        let mut refs = Vec::new();
        for (id, item) in due {
            if refs.len() >= limit as usize {
                break;
            }
            let account = get_s(&item, "account_id")?;
            let endpoint_id = get_s(&item, "endpoint_id")?;
            let key = (account.clone(), endpoint_id.clone());
            if !endpoints.contains_key(&key) {
                let endpoint = self
                    .get_endpoint_item(
                        &AccountId::from_trusted(account.clone()),
                        &EndpointId::from_trusted(endpoint_id.clone()),
                    )
                    .await?;
                endpoints.insert(key.clone(), endpoint);
            }
            let Some(Some(endpoint)) = endpoints.get(&key) else {
                continue;
            };
            if endpoint.status != EndpointStatus::Active {
                continue;
            }
            refs.push(PendingRef {
                delivery_id: DeliveryId::from_trusted(id),
                endpoint_id: endpoint.id.clone(),
                account_id: endpoint.account_id.clone(),
                due: indexed_due(&item)?,
                max_in_flight: endpoint.max_in_flight,
                rate_limit_per_second: endpoint.rate_limit_per_second,
            });
        }
        Ok(refs)
    }

    async fn get_delivery(
        &self,
        account: &AccountId,
        id: &DeliveryId,
    ) -> StoreResult<Option<Delivery>> {
        Ok(self
            .get_delivery_item(id)
            .await?
            .filter(|d| &d.account_id == account))
    }

    async fn list_deliveries(
        &self,
        account: &AccountId,
        query: &DeliveryQuery,
    ) -> StoreResult<Page<Delivery>> {
        let limit = query.limit.clamp(1, 500) as usize;
        let partitions = match &query.endpoint_id {
            Some(endpoint) => vec![LogPartition::new(account, endpoint)],
            // The account's log is the merge of its endpoints' logs, deleted ones included.
            None => self
                .endpoint_ids_ever(account)
                .await?
                .iter()
                .map(|endpoint| LogPartition::new(account, endpoint))
                .collect(),
        };
        self.list_from_partitions(account, partitions, query, limit)
            .await
    }

    async fn replay(&self, request: &ReplayRequest) -> StoreResult<ReplayOutcome> {
        let mut replay = request.replay.clone();
        let filter = replay.filter.clone();
        let limit = request.limit as usize;
        let candidates: Vec<Delivery> = match &replay.scope {
            ReplayScope::Delivery(id) => self.get_delivery_item(id).await?.into_iter().collect(),
            // Oldest first; the window's end is checked on each delivery below.
            ReplayScope::Endpoint(endpoint) => self
                .endpoint_log(
                    &replay.account_id,
                    endpoint,
                    filter.since,
                    filter.until,
                    LogFilter::All,
                    true,
                )
                .await?
                .iter()
                .map(delivery_from_item)
                .collect::<StoreResult<Vec<_>>>()?,
        };
        let mut endpoints: HashMap<EndpointId, Option<Endpoint>> = HashMap::new();
        let mut matched = Vec::new();
        for delivery in candidates {
            let in_window = filter
                .since
                .is_none_or(|since| delivery.created_at >= since)
                && filter.until.is_none_or(|until| delivery.created_at < until);
            // An event past retention is gone (TTL): its deliveries cannot be sent again.
            let event_kept =
                crate::clock::add(delivery.created_at, self.retention.events) > replay.requested_at;
            let wanted = delivery.account_id == replay.account_id
                && event_kept
                && delivery.status.is_final()
                && filter.statuses.contains(&delivery.status)
                && (filter.event_types.is_empty()
                    || filter.event_types.contains(&delivery.event_type))
                && in_window;
            if !wanted {
                continue;
            }
            if !endpoints.contains_key(&delivery.endpoint_id) {
                let endpoint = self
                    .get_endpoint(&delivery.account_id, &delivery.endpoint_id)
                    .await?;
                endpoints.insert(delivery.endpoint_id.clone(), endpoint);
            }
            let Some(Some(endpoint)) = endpoints.get(&delivery.endpoint_id) else {
                continue;
            };
            if endpoint.status != EndpointStatus::Active {
                continue;
            }
            matched.push((
                delivery,
                endpoint.max_in_flight,
                endpoint.rate_limit_per_second,
            ));
            if matched.len() > limit {
                break;
            }
        }
        replay.more = matched.len() > limit;
        matched.truncate(limit);
        let now = replay.requested_at;
        // Time-ordered and unique enough for a human-triggered audit trail.
        let sort = to_millis(now) * 1000 + i64::from(rand::random::<u16>() % 1000);
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
            self.client
                .put_item()
                .table_name(&self.tables.attempts)
                .set_item(Some(replay_item(&replay, sort)))
                .send()
                .await
                .map_err(sdk)?;
        }
        Ok(ReplayOutcome { replay, queued })
    }

    async fn list_replays(
        &self,
        account: &AccountId,
        after: Option<&ReplayId>,
        limit: u32,
    ) -> StoreResult<Page<Replay>> {
        let limit = limit.clamp(1, 500) as usize;
        let items = self
            .query_all(
                self.client
                    .query()
                    .table_name(&self.tables.attempts)
                    .key_condition_expression("delivery_id = :pk")
                    .expression_attribute_values(":pk", s(replays_partition(account)))
                    .scan_index_forward(false),
            )
            .await?;
        let mut replays = items
            .iter()
            .map(replay_from_item)
            .collect::<StoreResult<Vec<_>>>()?;
        // Replay ids are time-ordered: newest first, then strictly older than the cursor.
        replays.sort_by(|a, b| b.id.cmp(&a.id));
        if let Some(after) = after {
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

    async fn list_attempts(&self, delivery: &DeliveryId) -> StoreResult<Vec<Attempt>> {
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
            .query_all(
                self.client
                    .query()
                    .table_name(&self.tables.attempts)
                    .key_condition_expression("delivery_id = :d")
                    .expression_attribute_values(":d", s(delivery.as_str()))
                    .consistent_read(true),
            )
            .await?;
        let mut attempts = items
            .iter()
            .map(attempt_from_item)
            .collect::<StoreResult<Vec<_>>>()?;
        attempts.extend(first_try);
        attempts.sort_by_key(|a| a.number);
        Ok(attempts)
    }

    async fn failing_endpoints(&self, failing_before: Timestamp) -> StoreResult<Vec<Endpoint>> {
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
            .map(endpoint_from_item)
            .collect::<StoreResult<Vec<_>>>()?;
        // Endpoints whose disabling did not finish (see `finish_disabling`): finish it now.
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
        for item in &unfinished {
            let endpoint = endpoint_from_item(item)?;
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

    async fn disable_endpoint(&self, r: &DisableRequest) -> StoreResult<Option<DisableOutcome>> {
        if let Some((_, deliveries)) = &r.operational_event {
            derived_ids_only(deliveries)?;
        }
        let mut update = Update::builder()
            .table_name(&self.tables.endpoints)
            .set_key(Some(key2(
                "account_id",
                r.account_id.as_str(),
                "id",
                r.endpoint_id.as_str(),
            )))
            .update_expression(
                "SET #status = :disabled, disabled_reason = :reason, updated_at = :now, \
                 failing_shard = :disabling",
            )
            .expression_attribute_names("#status", "status")
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
        let mut later: Vec<&Delivery> = Vec::new();
        if let Some((event, deliveries)) = &r.operational_event {
            items.push(put_if_absent(
                &self.tables.events,
                self.event_item(event, true),
                "id",
            )?);
            let room = MAX_TRANSACTION_ITEMS - items.len();
            for delivery in deliveries.iter().take(room) {
                items.push(put_if_absent(
                    &self.tables.deliveries,
                    self.delivery_item(delivery)?,
                    "id",
                )?);
            }
            later.extend(deliveries.iter().skip(room));
        }
        match self.transact(items).await {
            Ok(()) => {}
            Err(TransactionFailure::Conditions(failed)) if failed.contains(&0) => return Ok(None),
            Err(other) => return Err(other.into_store_error()),
        }
        // More operations endpoints than one transaction holds: the rest, each put
        // conditional, so repeating them is harmless.
        for chunk in later.chunks(MAX_TRANSACTION_ITEMS) {
            let items = chunk
                .iter()
                .map(|d| put_if_absent(&self.tables.deliveries, self.delivery_item(d)?, "id"))
                .collect::<StoreResult<Vec<_>>>()?;
            match self.transact(items).await {
                Ok(()) | Err(TransactionFailure::Conditions(_)) => {}
                Err(TransactionFailure::Other(e)) => return Err(e),
            }
        }
        // The endpoint is disabled (so its pending deliveries are inert: no sender takes
        // them and the sweeper skips them); abandon them now, one conditional write each.
        let abandoned = self
            .finish_disabling(&r.account_id, &r.endpoint_id, &r.reason, r.now)
            .await?;
        Ok(Some(DisableOutcome { abandoned }))
    }

    async fn unsent_notifications(&self, limit: u32) -> StoreResult<Vec<Notification>> {
        let out = self
            .client
            .query()
            .table_name(&self.tables.control)
            .index_name(UNSENT)
            .key_condition_expression("#u = :u")
            .expression_attribute_names("#u", UNSENT)
            .expression_attribute_values(":u", s(UNSENT))
            .limit(i32::try_from(limit.max(1)).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(sdk)?;
        out.items
            .unwrap_or_default()
            .iter()
            .map(notification_from_item)
            .collect()
    }

    async fn mark_notification_sent(&self, id: &str, now: Timestamp) -> StoreResult<()> {
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.control)
            .key("pk", s(format!("notification#{id}")))
            .update_expression("SET sent_at = :now REMOVE #u")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_names("#u", UNSENT)
            .expression_attribute_values(":now", n(to_millis(now)))
            .send()
            .await;
        written(result)?;
        Ok(())
    }

    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        Ok(self
            .get(&self.tables.control, key1("pk", &format!("setting#{key}")))
            .await?
            .and_then(|item| opt_s(&item, "value")))
    }

    async fn put_setting_if_absent(&self, key: &str, value: &str) -> StoreResult<String> {
        let pk = format!("setting#{key}");
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.control)
            .item("pk", s(&pk))
            .item("value", s(value))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        if written(result)?.is_some() {
            return Ok(value.to_owned());
        }
        self.get_setting(key)
            .await?
            .ok_or_else(|| StoreError::Backend(format!("setting {key} vanished")))
    }
}

/// Creates the tables as `infra/template.yaml` defines them (for tests and local development;
/// CloudFormation creates them in production). Tables that already exist are reused.
pub async fn create_tables(client: &Client, tables: &TableNames) -> StoreResult<()> {
    if TableNames::with_prefix(tables.prefix()) != *tables {
        return Err(StoreError::Backend(format!(
            "the template names its tables after the stack; {tables:?} are not"
        )));
    }
    crate::aws::stack::create_tables(client, tables.prefix())
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))
}

/// The tables' keys and indexes as the request meter needs them, read from the template.
pub fn table_layouts(tables: &TableNames) -> Vec<crate::aws::meter::TableLayout> {
    use crate::aws::meter::{IndexLayout, Projected, TableLayout};
    let name = tables.prefix();
    let definitions = crate::aws::stack::Stack::new(name, "", "", &[])
        .and_then(|stack| crate::aws::stack::TableDefinition::all(&stack))
        .unwrap_or_default();
    let keys = |key: &[(String, String)]| key.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>();
    definitions
        .into_iter()
        .map(|table| TableLayout {
            label: table
                .name
                .strip_prefix(&format!("{name}-"))
                .unwrap_or(&table.name)
                .to_owned(),
            key: keys(&table.key),
            indexes: table
                .indexes
                .iter()
                .map(|index| IndexLayout {
                    name: index.name.clone(),
                    hash: index.key[0].0.clone(),
                    range: index.key.get(1).map(|(r, _)| r.clone()),
                    projected: match index.projection.as_str() {
                        "KEYS_ONLY" => Projected::KeysOnly,
                        "INCLUDE" => Projected::Include(index.non_key_attributes.clone()),
                        _ => Projected::All,
                    },
                })
                .collect(),
            name: table.name,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A client for the local AWS emulator that scripts/test starts. Fails loudly without it:
    /// a skipped AWS test would look like a passing one.
    pub async fn emulator_client() -> Client {
        crate::testing::require_emulator();
        Client::new(&crate::aws::load_sdk_config().await)
    }

    /// A store on fresh tables, so tests never see each other's items.
    pub async fn emulator_store() -> DynamoStore {
        let client = emulator_client().await;
        let tables = TableNames::with_prefix(&format!("t{}", uuid::Uuid::new_v4().simple()));
        create_tables(&client, &tables).await.unwrap();
        let mut store = DynamoStore::new(client, tables, Retention::default());
        store.late_fan_out = None;
        store
    }

    crate::store_contract_tests!(emulator_store);

    #[tokio::test]
    async fn replays_follow_the_store_contract() {
        let store = emulator_store().await;
        crate::store::replay_contract::replays_follow_the_contract(&store).await;
    }

    /// The audit record and the deliveries set back to pending are written together: when
    /// the record cannot be written (a role without write access to the attempts table, as
    /// the api's once was), no delivery is left pending, unqueued and unaudited.
    #[tokio::test]
    async fn a_replay_whose_audit_record_cannot_be_written_changes_nothing() {
        use crate::store::replay_contract::{
            attempt, endpoint, failed, publish, replay, status_of,
        };
        let store = emulator_store().await;
        let account = AccountId::from_trusted("acme".into());
        store
            .create_account(&crate::store::contract::account("acme"))
            .await
            .unwrap();
        let ep = endpoint(&account, "a", 4);
        store.create_endpoint(&ep).await.unwrap();
        let delivery = publish(&store, &account, 1, "invoice.paid", &[&ep])
            .await
            .remove(0);
        attempt(&store, &delivery.id, &ep.id, 2, failed()).await;
        let mut tables = store.tables().clone();
        tables.attempts = format!("{}-not-writable", tables.attempts);
        let refused = DynamoStore::new(store.client().clone(), tables, Retention::default());
        let request = |second| ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Delivery(delivery.id.clone()),
                ReplayFilter::single(),
                second,
            ),
            limit: 1,
        };

        let outcome = refused.replay(&request(3)).await;
        assert!(outcome.is_err(), "{outcome:?}");
        assert_eq!(
            status_of(&store, &account, &delivery.id).await.status,
            DeliveryStatus::Failed
        );
        assert!(store
            .list_replays(&account, None, 10)
            .await
            .unwrap()
            .items
            .is_empty());

        // Asked again where the record can be written, the replay goes through.
        let outcome = store.replay(&request(4)).await.unwrap();
        assert_eq!((outcome.replay.count, outcome.queued.len()), (1, 1));
        assert_eq!(
            status_of(&store, &account, &delivery.id).await.status,
            DeliveryStatus::Pending
        );
    }

    /// A walk over more endpoints than one run gets through goes on in the next run where
    /// the last one stopped, and the watermark moves only once the window is done.
    #[tokio::test]
    async fn a_walk_longer_than_one_run_is_finished_by_the_next() {
        use crate::store::contract::{account, delivery, endpoint, event, t0};
        let mut store = emulator_store().await;
        store.walk_budget = std::time::Duration::ZERO;
        store.create_account(&account("acme")).await.unwrap();
        let total = WALK_CHUNK + 6;
        for i in 0..total {
            let ep = endpoint("acme", &format!("ep_{i:03}"), t0());
            store.create_endpoint(&ep).await.unwrap();
            let ev = event("acme", &format!("evt_{i:03}"), t0());
            store
                .publish(&ev, &[delivery(&ev, &ep, t0())])
                .await
                .unwrap();
        }
        let now = chrono::Utc::now();
        let first = store.walk_unsent_first_tries(now).await.unwrap();
        assert_eq!(first.len(), WALK_CHUNK, "one chunk, then out of time");
        let state = store
            .get(&store.tables().control, key1("pk", FIRST_TRY_WATERMARK))
            .await
            .unwrap()
            .unwrap();
        assert!(state.contains_key("walked_endpoint") && !state.contains_key("watermark"));
        let second = store.walk_unsent_first_tries(now).await.unwrap();
        assert_eq!(
            second.len(),
            total - WALK_CHUNK,
            "the rest, in the next run"
        );
        let state = store
            .get(&store.tables().control, key1("pk", FIRST_TRY_WATERMARK))
            .await
            .unwrap()
            .unwrap();
        assert!(state.contains_key("watermark") && !state.contains_key("walked_endpoint"));
        assert!(store.walk_unsent_first_tries(now).await.unwrap().is_empty());
    }

    /// A replay larger than one transaction: its record counts every delivery written.
    #[tokio::test]
    async fn a_replay_of_more_than_one_transaction_counts_every_delivery() {
        use crate::store::replay_contract::{attempt, endpoint, failed, publish, replay};
        let store = emulator_store().await;
        let account = AccountId::from_trusted("acme".into());
        store
            .create_account(&crate::store::contract::account("acme"))
            .await
            .unwrap();
        let ep = endpoint(&account, "a", 4);
        store.create_endpoint(&ep).await.unwrap();
        for second in 1..=150 {
            let delivery = publish(&store, &account, second, "invoice.paid", &[&ep])
                .await
                .remove(0);
            attempt(&store, &delivery.id, &ep.id, second, failed()).await;
        }
        let outcome = store
            .replay(&ReplayRequest {
                replay: replay(
                    &account,
                    ReplayScope::Endpoint(ep.id.clone()),
                    ReplayFilter {
                        since: None,
                        until: None,
                        statuses: vec![DeliveryStatus::Failed],
                        event_types: vec![],
                    },
                    200,
                ),
                limit: 1000,
            })
            .await
            .unwrap();
        assert_eq!(
            (
                outcome.replay.count,
                outcome.queued.len(),
                outcome.replay.more
            ),
            (150, 150, false)
        );
        let listed = store.list_replays(&account, None, 10).await.unwrap().items;
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].count, listed[0].more), (150, false));
    }

    #[test]
    fn pending_shards_are_stable_and_spread() {
        assert_eq!(pending_shard("dlv_1"), pending_shard("dlv_1"));
        let shards: std::collections::HashSet<String> = (0..200)
            .map(|_| pending_shard(DeliveryId::generate().as_str()))
            .collect();
        assert_eq!(shards.len(), PENDING_SHARDS as usize);
    }

    #[tokio::test]
    async fn a_disable_that_stopped_part_way_is_finished_by_the_next_health_check() {
        use crate::store::contract::{account, delivery, endpoint, event, t0};
        let store = emulator_store().await;
        store.create_account(&account("acme")).await.unwrap();
        let ep = endpoint("acme", "ep_half", t0());
        store.create_endpoint(&ep).await.unwrap();
        let mut pending = Vec::new();
        for i in 0..120 {
            let ev = event("acme", &format!("evt_{i:03}"), t0());
            let d = delivery(&ev, &ep, t0());
            store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
            pending.push(d);
        }
        // The disabling transaction ran; the abandon after it never did (the process died).
        store
            .client()
            .update_item()
            .table_name(&store.tables().endpoints)
            .set_key(Some(key2("account_id", "acme", "id", "ep_half")))
            .update_expression(
                "SET #status = :disabled, disabled_reason = :reason, failing_since = :since, \
                 failing_shard = :disabling",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":disabled", s("disabled"))
            .expression_attribute_values(":reason", s("failing for 3 days"))
            .expression_attribute_values(":since", n(to_millis(t0())))
            .expression_attribute_values(":disabling", s(DISABLING_SHARD))
            .send()
            .await
            .unwrap();
        let now = crate::clock::add(t0(), std::time::Duration::from_secs(4 * 86_400));
        assert!(store.failing_endpoints(now).await.unwrap().is_empty());
        for d in &pending {
            let stored = store
                .get_delivery(&d.account_id, &d.id)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(stored.status, DeliveryStatus::Abandoned, "{}", d.id);
            assert_eq!(
                stored.last_error.as_deref(),
                Some("abandoned: failing for 3 days")
            );
        }
        let item = store
            .get(
                &store.tables().endpoints,
                key2("account_id", "acme", "id", "ep_half"),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            opt_s(&item, "failing_shard").as_deref(),
            Some(FAILING_SHARD)
        );
        // Finished: the next check has nothing left to do.
        assert!(store.failing_endpoints(now).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_delivery_without_its_derived_id_is_refused() {
        use crate::store::contract::{account, delivery, endpoint, event, t0};
        let store = emulator_store().await;
        store.create_account(&account("acme")).await.unwrap();
        let ep = endpoint("acme", "ep_a", t0());
        store.create_endpoint(&ep).await.unwrap();
        let ev = event("acme", "evt_1", t0());
        let mut stray = delivery(&ev, &ep, t0());
        stray.id = DeliveryId::generate();
        assert!(store
            .publish(&ev, std::slice::from_ref(&stray))
            .await
            .is_err());
        assert!(store.add_deliveries(&[stray]).await.is_err());
        assert_eq!(store.get_event(&ev.account_id, &ev.id).await.unwrap(), None);
    }

    /// The ids in the `pending` index.
    async fn indexed_pending(store: &DynamoStore) -> Vec<String> {
        let mut ids = Vec::new();
        for shard in 0..PENDING_SHARDS {
            let items = store
                .query_all(
                    store
                        .client()
                        .query()
                        .table_name(&store.tables().deliveries)
                        .index_name("pending")
                        .key_condition_expression("pending_shard = :shard")
                        .expression_attribute_values(":shard", s(shard.to_string())),
                )
                .await
                .unwrap();
            ids.extend(items.iter().map(|item| get_s(item, "id").unwrap()));
        }
        ids.sort();
        ids
    }

    #[tokio::test]
    async fn first_tries_enter_the_pending_index_only_when_unsent_or_retried() {
        use crate::clock::add;
        use crate::store::contract::{account, delivery, endpoint, event, t0};
        use std::time::Duration;
        let secs = Duration::from_secs;
        let store = emulator_store().await;
        store.create_account(&account("acme")).await.unwrap();
        let ep = endpoint("acme", "ep_a", t0());
        store.create_endpoint(&ep).await.unwrap();
        let publish = |name: &'static str, at: Timestamp| {
            let store = store.clone();
            let ep = ep.clone();
            async move {
                let ev = event("acme", name, at);
                let d = delivery(&ev, &ep, at);
                store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
                d
            }
        };
        let record = |d: &Delivery, decision: Decision, at: Timestamp| AttemptRecord {
            attempt: Attempt {
                delivery_id: d.id.clone(),
                number: 1,
                trigger: Trigger::Scheduled,
                started_at: at,
                latency_ms: 5,
                status_code: Some(200),
                response_headers: vec![],
                response_body: String::new(),
                response_body_truncated: false,
                error: None,
            },
            expected_attempts: 0,
            decision,
            client_error_count: 0,
            endpoint_id: d.endpoint_id.clone(),
            success: true,
            now: at,
        };

        // Delivered at the first try: never in the index.
        let delivered = publish("evt_ok", t0()).await;
        // Retried: enters the index with its retry.
        let retried = publish("evt_retry", t0()).await;
        // Its message lost: no attempt ever.
        let lost = publish("evt_lost", t0()).await;
        assert!(indexed_pending(&store).await.is_empty());
        store
            .record_attempt(&record(&delivered, Decision::Delivered, add(t0(), secs(1))))
            .await
            .unwrap();
        store
            .record_attempt(&record(
                &retried,
                Decision::RetryAt(add(t0(), secs(60))),
                add(t0(), secs(1)),
            ))
            .await
            .unwrap();
        assert_eq!(indexed_pending(&store).await, vec![retried.id.to_string()]);

        // The sweep finds the lost one (and the retry once it is due).
        let swept = store
            .pending_deliveries(add(t0(), secs(10)), None, 100)
            .await
            .unwrap();
        assert_eq!(
            swept.iter().map(|r| &r.delivery_id).collect::<Vec<_>>(),
            vec![&lost.id]
        );
        let mut expected = vec![lost.id.to_string(), retried.id.to_string()];
        expected.sort();
        assert_eq!(indexed_pending(&store).await, expected);

        // Written after the sweep's watermark passed its creation time (a slow writer),
        // within the margin: still found.
        let late = publish("evt_late", add(t0(), secs(5))).await;
        let swept = store
            .pending_deliveries(add(t0(), secs(100)), None, 100)
            .await
            .unwrap();
        let mut ids: Vec<&DeliveryId> = swept.iter().map(|r| &r.delivery_id).collect();
        ids.sort();
        let mut expected = vec![&lost.id, &retried.id, &late.id];
        expected.sort();
        assert_eq!(ids, expected);

        // Deleting the endpoint abandons a new delivery the walk has not seen yet.
        let unseen = publish("evt_unseen", add(t0(), secs(200))).await;
        assert!(store
            .delete_endpoint(&ep.account_id, &ep.id, add(t0(), secs(300)))
            .await
            .unwrap());
        for d in [&lost, &retried, &late, &unseen] {
            let stored = store
                .get_delivery(&d.account_id, &d.id)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(stored.status, DeliveryStatus::Abandoned, "{}", d.id);
        }
        assert_eq!(
            store
                .get_delivery(&delivered.account_id, &delivered.id)
                .await
                .unwrap()
                .unwrap()
                .status,
            DeliveryStatus::Delivered
        );
    }

    #[tokio::test]
    async fn a_delivery_written_long_after_its_event_enters_the_pending_index_at_once() {
        use crate::store::contract::{account, delivery, endpoint, event};
        let mut store = emulator_store().await;
        store.late_fan_out = Some(LATE_FAN_OUT);
        store.create_account(&account("acme")).await.unwrap();
        let ep = endpoint("acme", "ep_a", chrono::Utc::now());
        store.create_endpoint(&ep).await.unwrap();
        let now = chrono::Utc::now();
        let late_by = chrono::TimeDelta::from_std(LATE_FAN_OUT).unwrap();
        let recent = event("acme", "evt_recent", now - late_by / 2);
        let stale = event("acme", "evt_stale", now - late_by * 2);
        let ahead = event("acme", "evt_ahead", now + late_by * 2);
        let mut indexed = Vec::new();
        for ev in [&recent, &stale, &ahead] {
            let d = delivery(ev, &ep, now);
            store.put_event(ev).await.unwrap();
            store
                .add_deliveries(std::slice::from_ref(&d))
                .await
                .unwrap();
            if ev.id != recent.id {
                indexed.push(d.id.to_string());
            }
        }
        // The walk may be past a stale one's place in the log already, and will not reach
        // one dated far ahead for a long time: both are indexed as they are written.
        indexed.sort();
        assert_eq!(indexed_pending(&store).await, indexed);
    }

    #[tokio::test]
    async fn a_sparse_listing_returns_short_pages_that_continue_where_they_stopped() {
        use crate::clock::add;
        use crate::store::contract::{account, delivery, endpoint, event, t0};
        let mut store = emulator_store().await;
        store.list_examine_budget = 4;
        store.create_account(&account("acme")).await.unwrap();
        let ep = endpoint("acme", "ep_a", t0());
        store.create_endpoint(&ep).await.unwrap();
        let mut made = Vec::new();
        for i in 0..13u64 {
            let at = add(t0(), std::time::Duration::from_secs(i));
            let ev = event("acme", &format!("evt_{i:02}"), at);
            let d = delivery(&ev, &ep, at);
            store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
            made.push(d);
        }
        // Only the oldest and one in the middle match.
        let failed = |d: &Delivery| AttemptRecord {
            attempt: Attempt {
                delivery_id: d.id.clone(),
                number: 1,
                trigger: Trigger::Scheduled,
                started_at: t0(),
                latency_ms: 1,
                status_code: Some(410),
                response_headers: vec![],
                response_body: String::new(),
                response_body_truncated: false,
                error: Some("HTTP 410".into()),
            },
            expected_attempts: 0,
            decision: Decision::Failed {
                reason: "gone".into(),
            },
            client_error_count: 1,
            endpoint_id: d.endpoint_id.clone(),
            success: false,
            now: t0(),
        };
        for d in [&made[6], &made[0]] {
            store.record_attempt(&failed(d)).await.unwrap();
        }
        let acme = AccountId::parse("acme").unwrap();
        let mut cursor = None;
        let mut pages = Vec::new();
        for _ in 0..20 {
            let page = store
                .list_deliveries(
                    &acme,
                    &DeliveryQuery {
                        status: Some(DeliveryStatus::Failed),
                        limit: 3,
                        cursor: cursor.clone(),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            pages.push(page.items.iter().map(|d| d.id.clone()).collect::<Vec<_>>());
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert!(pages.len() > 1, "the budget cut the listing: {pages:?}");
        assert!(
            pages.iter().any(Vec::is_empty),
            "a page can be empty and go on"
        );
        assert_eq!(
            pages.concat(),
            vec![made[6].id.clone(), made[0].id.clone()],
            "every match once, newest first"
        );
    }

    #[tokio::test]
    async fn creating_the_tables_twice_is_harmless() {
        let store = emulator_store().await;
        create_tables(store.client(), store.tables()).await.unwrap();
    }
}
