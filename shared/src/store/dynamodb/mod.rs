//! The AWS store: DynamoDB tables designed for the engine's access patterns.
//!
//! | table | key | indexes | for |
//! |---|---|---|---|
//! | `accounts` | `id` | | accounts |
//! | `endpoints` | `account_id`, `id` | `failing` (sparse: `failing_shard`, `failing_since`) | an account's endpoints (strongly consistent query; a deleted one stays as a tombstone); endpoints failing since T |
//! | `events` | `account_id`, `id` | stream (new image), TTL `expires_at` | the outbox; fan-out reads its stream |
//! | `deliveries` (`…-delivery-log`) | `log`, `id` | `pending` (sparse, sharded: `pending_shard`, `due_key`) | an endpoint's log is its `log` partition (the endpoint part of the derived delivery ids, which sort by their event's time), newest first; an account's log is the merge of its endpoints'; due work (and, filtered by endpoint, an endpoint's pending work to abandon). An event's deliveries need no index: their ids are derived from (account, event, event time, endpoint), and so is their key |
//! | `attempts` | `delivery_id`, `number` | TTL `expires_at` | attempt detail, kept shorter |
//! | (`…-delivery-log`) | `log = hours#<endpoint>`, `id` = the hour | TTL `expires_at` | attempts counted by endpoint and hour, kept 8 days |
//! | `control` | `pk` | `unsent` (sparse: `unsent`, `created_key`); `listed` (sparse: `list`, `list_key`) | settings, the notification outbox (in the `unsent` index by when each is due: made, or the end of its claim or retry's wait; mail given up leaves it), slot leases, rate buckets, each account's count of endpoints (`endpoints#<account>`), the scheduled functions' run locks (`run#<name>`), API keys (`apikey#<id>`, listed under `list = apikeys`), the event-type catalog (`eventtype#<name>`, listed under `list = eventtypes`), the audit log (`audit#<account>#<id>`, listed under `list = audit#<account>`), erasures a call left unfinished (`erasure#<account>#<event>`, listed under `list = erasures`, expiring with their event) |
//!
//! Every change that can race is a conditional write: an event is created only if its id
//! is new (with its deliveries, in one transaction); an attempt is recorded only against
//! the delivery's `pending` status and attempt count it was taken from; a delivery leaves
//! `pending` at most once.

mod access;
mod accounts;
mod attempts;
mod audit;
mod catalog;
mod disable;
mod erase;
mod events;
mod hours;
mod items;
mod log;
pub mod outbox;
mod replay;
mod reseal;
mod runs;
mod schema;
mod size;
#[cfg(test)]
mod tests;
mod write;

pub use erase::{ERASE_BUDGET, FINISHING_LONGEST};
use items::*;
pub use items::{pending_shard, unfanned_shard};
use log::*;
pub use reseal::ResealReport;
pub use runs::RunLock;
pub use schema::create_tables;
pub use size::item_size;

use std::collections::{BTreeMap, HashMap, HashSet};

use aws_sdk_dynamodb::{
    error::{ProvideErrorMetadata, SdkError},
    operation::transact_write_items::TransactWriteItemsError,
    types::{AttributeValue, KeysAndAttributes, Put, ReturnValue, TransactWriteItem, Update},
    Client,
};
use futures_util::StreamExt;

use super::{
    AttemptRecord, AuditedChange, DeliveryQuery, DeliveryWork, DisableOutcome, DisableRequest,
    DueCursor, EndpointDeletion, Notification, Page, PageAfter, PendingPage, PendingRef,
    PublishOutcome, PutEventOutcome, RecordOutcome, ReplayOutcome, ReplayRequest, StoreError,
    StoreResult, Unattempted, UnattemptedMove,
};
use crate::{
    aws::error_text,
    clock::{from_millis, to_millis, Timestamp},
    domain::{
        delivery_log_partition, delivery_log_position, delivery_log_prefix, delivery_log_time,
        endpoint::RetiringSecret, Account, AccountId, Attempt, Decision, Delivery, DeliveryId,
        DeliveryStatus, EmailAddress, Endpoint, EndpointId, EndpointStatus, EndpointUrl,
        EndpointVersion, Event, EventId, EventType, EventTypeFilter, MissedEvent, Replay,
        ReplayCandidate, ReplayFilter, ReplayId, ReplayScope, Trigger,
    },
    secrets::{SecretsAccess, SecretsError},
    signing::SigningSecret,
};

pub type Item = HashMap<String, AttributeValue>;

/// Pending deliveries are spread over this many partitions of the `pending` index.
pub const PENDING_SHARDS: u32 = 16;
const FAILING_SHARD: &str = "failing";
/// Endpoints disabled for failing whose pending deliveries are still being abandoned.
const DISABLING_SHARD: &str = "disabling";
/// The `failing_since` of a disabled endpoint that was not failing: there for the `failing`
/// index only (a disable under way must be findable), read as no clock.
const INDEX_ONLY_SINCE: i64 = 0;
const UNSENT: &str = "unsent";
/// The sparse index of events stored without their deliveries whose fan-out is not yet
/// marked done, and its partition attribute (removed when fan-out is done).
const UNFANNED: &str = "unfanned";
const UNFANNED_SHARD: &str = "unfanned_shard";
/// The sparse index of events a disabled endpoint missed, by account and time: only those
/// carry its sort key, `missed_at` (their creation time).
const MISSED: &str = "missed";
const MISSED_AT: &str = "missed_at";
/// How far a fan-out cut short got: the last endpoint id (in id order) it wrote and queued.
const FANNED_THROUGH: &str = "fanned_through";
/// Partitions of the `unfanned` index: every outbox write lands in one of them.
pub const UNFANNED_SHARDS: u32 = 4;
/// The control item holding how far `walk_unsent_first_tries` has looked.
const FIRST_TRY_WATERMARK: &str = "sweep#first_tries";
/// The control-table item of where the sweeper's walk of due deliveries goes on.
const DUE_WALK: &str = "sweep#due_walk";
/// The control item with when the last sweep that finished began.
const LAST_SWEEP: &str = "sweep#last";
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
/// DynamoDB's limit on the items of one transaction together (4 MB), less a margin for
/// what `item_size` does not count.
const MAX_TRANSACTION_BYTES: usize = DYNAMODB_TRANSACTION_BYTES - 64 * 1024;
/// That limit itself, which `transact` holds every transaction to.
const DYNAMODB_TRANSACTION_BYTES: usize = 4_000_000;

/// About what DynamoDB counts of a transaction against its 4 MB: the items put, and the
/// keys and values of updates, deletes and condition checks.
fn transaction_bytes(items: &[TransactWriteItem]) -> usize {
    items
        .iter()
        .map(|write| {
            if let Some(put) = write.put() {
                item_size(put.item())
            } else if let Some(update) = write.update() {
                item_size(update.key()) + update.expression_attribute_values().map_or(0, item_size)
            } else if let Some(delete) = write.delete() {
                item_size(delete.key())
            } else if let Some(check) = write.condition_check() {
                item_size(check.key())
            } else {
                0
            }
        })
        .sum()
}
/// Writes in flight at once where many independent ones are made: abandoning an endpoint's
/// pending deliveries, adding deliveries, marking events.
pub const WRITE_CONCURRENCY: usize = 16;
/// DynamoDB's limit of keys in one `BatchGetItem`.
const BATCH_GET_ITEMS: usize = 100;
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

/// How long DynamoDB keeps items (through TTL): events and attempts from when they were
/// written, delivery-log rows from when their delivery ended. Pending deliveries carry no
/// expiry. Events must outlive the retry schedule of their deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub events: std::time::Duration,
    pub attempts: std::time::Duration,
    pub deliveries: std::time::Duration,
    /// How long a delivery made pending now may need its event: the longest its retries can
    /// take, and a day. A replay or a late delivery keeps its event at least this long from
    /// then on.
    pub retries: std::time::Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self::from_core(&crate::config::CoreConfig::default())
    }
}

impl Retention {
    /// `HOOKLANE_RETENTION` for every table; an event is kept at least a day past the
    /// longest its retries can take (every failure asking for the longest `Retry-After`),
    /// so a delivery still being retried always finds it. An attempt is kept that long plus
    /// the retention (its TTL runs from when it was made): its delivery ends at most that
    /// long after it, and the delivery's log row is kept the retention from then.
    pub fn from_core(core: &crate::config::CoreConfig) -> Self {
        let retries = core.retry.longest_span() + std::time::Duration::from_secs(86_400);
        Self {
            events: core.retention.max(retries),
            attempts: core.retention + retries,
            deliveries: core.retention,
            retries,
        }
    }
}

#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    tables: TableNames,
    retention: Retention,
    /// `store::LIST_EXAMINE_BUDGET`, smaller in tests.
    list_examine_budget: usize,
    /// `WALK_BUDGET`, smaller in tests.
    walk_budget: std::time::Duration,
    /// `erase::ERASE_BUDGET`, smaller in tests.
    erase_budget: std::time::Duration,
    /// `LATE_FAN_OUT`; `None` in the store contract tests, whose fixed times lie years in
    /// the past (every delivery would be indexed as it is written, and the walk would go
    /// untested).
    late_fan_out: Option<std::time::Duration>,
    /// Seals endpoint signing secrets as they are written and opens them as they are read
    /// (or withholds them: see [`DynamoStore::withholding_secrets`]).
    secrets: SecretsAccess,
    /// Attempts counted by endpoint and hour, not yet written (`flush_hour_counts`).
    hour_tally: hours::HourTally,
    /// The log, and a read of one delivery or event, show items past their `expires_at`
    /// (which TTL has yet to delete): for the store contract tests, whose fixed times lie
    /// years in the past.
    shows_expired: bool,
}

impl DynamoStore {
    /// Without the key to endpoint signing secrets: endpoints read carry
    /// [`SigningSecret::withheld`] and writing an endpoint is refused. For the functions
    /// that neither sign nor change endpoints (fan-out, sweeper, health), which are not
    /// given the key.
    pub fn withholding_secrets(mut self) -> Self {
        self.secrets = SecretsAccess::Withheld;
        self
    }

    /// Without the rule that indexes a delivery written long after its event as it is
    /// written (`LATE_FAN_OUT`): for tests whose fixed times lie years in the past.
    pub fn without_late_write_rule(mut self) -> Self {
        self.late_fan_out = None;
        self
    }

    /// With reads that show items past their expiry (the delivery log, a delivery or an
    /// event read by its id): for tests whose fixed times lie years in the past, where every
    /// ended delivery has expired.
    pub fn showing_expired(mut self) -> Self {
        self.shows_expired = true;
        self
    }

    /// With another bound on the time one erasure call spends on an event's deliveries
    /// (`ERASE_BUDGET`, 20 s): tests stop after each page with none.
    pub fn with_erase_budget(mut self, budget: std::time::Duration) -> Self {
        self.erase_budget = budget;
        self
    }

    /// With another bound on the deliveries one log page reads (`store::LIST_EXAMINE_BUDGET`):
    /// tests make short pages with a few rows.
    pub fn with_list_examine_budget(mut self, budget: usize) -> Self {
        self.list_examine_budget = budget.max(1);
        self
    }

    /// A delivery-log row's TTL value for a delivery that ended at `now`: epoch seconds, the
    /// only form DynamoDB's TTL reads (milliseconds would be a date thousands of years
    /// ahead, and the row would never go).
    pub(super) fn log_expiry(&self, now: Timestamp) -> AttributeValue {
        let seconds = to_millis(now).div_euclid(1000)
            + i64::try_from(self.retention.deliveries.as_secs()).unwrap_or(i64::MAX / 2);
        AttributeValue::N(seconds.to_string())
    }

    /// A store on `tables`; endpoint secrets are sealed with `secrets` (a
    /// [`crate::secrets::SecretsCipher`], or [`SecretsAccess::Withheld`]).
    pub fn new(
        client: Client,
        tables: TableNames,
        retention: Retention,
        secrets: impl Into<SecretsAccess>,
    ) -> Self {
        Self {
            secrets: secrets.into(),
            client,
            tables,
            retention,
            list_examine_budget: super::LIST_EXAMINE_BUDGET,
            walk_budget: WALK_BUDGET,
            erase_budget: erase::ERASE_BUDGET,
            late_fan_out: Some(LATE_FAN_OUT),
            hour_tally: hours::HourTally::default(),
            shows_expired: false,
        }
    }

    pub fn tables(&self) -> &TableNames {
        &self.tables
    }

    pub fn client(&self) -> &Client {
        &self.client
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
    /// A strongly consistent query of one partition: `key = value`.
    fn partition_query(
        &self,
        table: &str,
        key: &str,
        value: &str,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        self.client
            .query()
            .table_name(table)
            .key_condition_expression("#pk = :pk")
            .expression_attribute_names("#pk", key)
            .expression_attribute_values(":pk", s(value))
            .consistent_read(true)
    }

    async fn query_all(
        &self,
        request: aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
    ) -> StoreResult<Vec<Item>> {
        self.query_at_most(request, usize::MAX).await
    }

    /// The first `wanted` items of a query, page by page (each page asks for what is left).
    async fn query_at_most(
        &self,
        request: aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
        wanted: usize,
    ) -> StoreResult<Vec<Item>> {
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let mut page = request.clone().set_exclusive_start_key(start.take());
            if let Ok(left) = i32::try_from(wanted - items.len()) {
                page = page.limit(left);
            }
            let out = page.send().await.map_err(sdk)?;
            items.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() && items.len() < wanted => start = Some(key),
                _ => return Ok(items),
            }
        }
    }

    /// The deliveries with these ids, read strongly consistently in batches of 100; missing
    /// ones (and ids no delivery can have) are left out.
    async fn get_deliveries(&self, ids: &[DeliveryId]) -> StoreResult<Vec<Item>> {
        let keys: Vec<Item> = ids.iter().filter_map(delivery_key).collect();
        self.batch_get(&self.tables.deliveries, &keys, None).await
    }

    /// The items of `table` at `keys` (with only the `projection`'s attributes, if given),
    /// read strongly consistently in batches of 100; missing ones are left out.
    async fn batch_get(
        &self,
        table: &str,
        keys: &[Item],
        projection: Option<&str>,
    ) -> StoreResult<Vec<Item>> {
        let mut items = Vec::new();
        for chunk in keys.chunks(BATCH_GET_ITEMS) {
            let keys = KeysAndAttributes::builder()
                .set_keys(Some(chunk.to_vec()))
                .consistent_read(true)
                .set_projection_expression(projection.map(str::to_owned))
                .build()
                .map_err(build_error)?;
            let mut request = Some(HashMap::from([(table.to_owned(), keys)]));
            let mut unprocessed_rounds = 0;
            while let Some(wanted) = request.take().filter(|w| !w.is_empty()) {
                if unprocessed_rounds > 0 {
                    // Keys left unprocessed (the table over its throughput, or the answer
                    // over 16 MB): DynamoDB asks for a growing pause before asking again.
                    if unprocessed_rounds > UNPROCESSED_ROUNDS {
                        return Err(StoreError::Backend(format!(
                            "BatchGetItem on {table} left keys unprocessed {UNPROCESSED_ROUNDS} times"
                        )));
                    }
                    tokio::time::sleep(unprocessed_pause(unprocessed_rounds)).await;
                }
                unprocessed_rounds += 1;
                let out = self
                    .client
                    .batch_get_item()
                    .set_request_items(Some(wanted))
                    .send()
                    .await
                    .map_err(sdk)?;
                if let Some(mut found) = out.responses {
                    let read = found.remove(table).unwrap_or_default();
                    if !read.is_empty() {
                        // Progress: only rounds that read nothing count towards giving up.
                        unprocessed_rounds = 1;
                    }
                    items.extend(read);
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
            account_key(account.as_str(), id.as_str()),
        )
        .await?
        .filter(|item| !is_tombstone(item))
        .map(|item| endpoint_from_item(&item, &self.secrets))
        .transpose()
    }

    /// The ids of every endpoint the account has had, deleted ones included (their items
    /// stay as tombstones, see `delete_endpoint`).
    async fn endpoint_ids_ever(&self, account: &AccountId) -> StoreResult<Vec<EndpointId>> {
        let items = self
            .query_all(
                self.partition_query(&self.tables.endpoints, "account_id", account.as_str())
                    .projection_expression("id"),
            )
            .await?;
        items
            .iter()
            .map(|item| get_s(item, "id").map(EndpointId::from_trusted))
            .collect()
    }

    async fn get_event_item(&self, account: &str, id: &str) -> StoreResult<Option<Event>> {
        self.get(&self.tables.events, account_key(account, id))
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

    async fn transact(&self, items: Vec<TransactWriteItem>) -> Result<(), TransactionFailure> {
        // DynamoDB's rules, which the emulator does not apply: more items, or more than 4 MB
        // of them together, are refused whole.
        if items.len() > MAX_TRANSACTION_ITEMS {
            return Err(TransactionFailure::Other(StoreError::Backend(format!(
                "a transaction of {} items; DynamoDB takes at most {}",
                items.len(),
                MAX_TRANSACTION_ITEMS
            ))));
        }
        let bytes = transaction_bytes(&items);
        if bytes > DYNAMODB_TRANSACTION_BYTES {
            return Err(TransactionFailure::Other(StoreError::Backend(format!(
                "a transaction of {bytes} bytes; DynamoDB takes at most {DYNAMODB_TRANSACTION_BYTES}"
            ))));
        }
        let mut tried = 0;
        loop {
            let result = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .send()
                .await;
            let error = match result {
                Ok(_) => return Ok(()),
                Err(error) => error,
            };
            let codes: Vec<Option<&str>> = match error.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(cancel)) => cancel
                    .cancellation_reasons()
                    .iter()
                    .map(|reason| reason.code())
                    .collect(),
                _ => Vec::new(),
            };
            match cancellation(&codes) {
                Cancellation::Conditions(failed) => {
                    return Err(TransactionFailure::Conditions(failed))
                }
                // Nothing was written: the conditions are checked again on the next try.
                Cancellation::Conflict if tried < CONFLICT_RETRIES => {
                    tried += 1;
                    let pause =
                        rand::Rng::random_range(&mut rand::rng(), 5..=25 * u64::from(tried));
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                }
                // A table or index over its capacity for a moment (an on-demand table past
                // twice its last peak, a hot partition): DynamoDB asks to try again shortly,
                // and the SDK does not for a transaction. A random pause of a quarter to all of a doubling
                // ceiling.
                Cancellation::Throttled if tried < CONFLICT_RETRIES => {
                    tried += 1;
                    let ceiling = 50u64 << tried;
                    let pause = rand::Rng::random_range(&mut rand::rng(), ceiling / 4..=ceiling);
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                }
                Cancellation::Conflict | Cancellation::Throttled | Cancellation::Other => {
                    return Err(TransactionFailure::Other(sdk(error)))
                }
            }
        }
    }
}

/// How many times a batch read asks again for the keys DynamoDB left unprocessed.
const UNPROCESSED_ROUNDS: u32 = 8;

/// The pause before asking again for unprocessed keys the `round`th time (1 and up): full
/// jitter under a ceiling that doubles from 50 ms up to 3.2 s.
fn unprocessed_pause(round: u32) -> std::time::Duration {
    let ceiling = 50u64 << round.clamp(1, 7).saturating_sub(1);
    std::time::Duration::from_millis(rand::Rng::random_range(&mut rand::rng(), 0..=ceiling))
}

/// Tries again of a transaction cancelled only because another one was changing one of its
/// items at that moment (`TransactionConflict`), or because a table or index was over its
/// throughput, which DynamoDB does where the emulator, running one request at a time and
/// never throttling, never does.
const CONFLICT_RETRIES: u32 = 4;

/// What a transaction's cancellation reasons (one code per item, in order) come to.
#[derive(Debug, PartialEq)]
enum Cancellation {
    /// The items whose condition did not hold: the transaction is refused.
    Conditions(Vec<usize>),
    /// Only conflicts with other writes under way: the same transaction may succeed later.
    Conflict,
    /// Throughput exceeded on some item (with or without conflicts on others): it may
    /// succeed after a pause.
    Throttled,
    Other,
}

/// The cancellation reasons of a transaction over a table's or an index's throughput
/// (DynamoDB's `TransactWriteItems` reference).
const THROUGHPUT_EXCEEDED: &str = "ProvisionedThroughputExceeded";
const THROTTLED: &str = "ThrottlingError";

fn cancellation(codes: &[Option<&str>]) -> Cancellation {
    let failed: Vec<usize> = (0..codes.len())
        .filter(|&i| codes[i] == Some("ConditionalCheckFailed"))
        .collect();
    if !failed.is_empty() {
        return Cancellation::Conditions(failed);
    }
    let waiting = |code: &Option<&str>| {
        matches!(
            code,
            None | Some("None" | "TransactionConflict" | THROUGHPUT_EXCEEDED | THROTTLED)
        )
    };
    // Any other reason (validation, item or collection size) is not a matter of waiting.
    if !codes.iter().all(waiting) {
        Cancellation::Other
    } else if codes
        .iter()
        .any(|c| matches!(c, Some(THROUGHPUT_EXCEEDED | THROTTLED)))
    {
        Cancellation::Throttled
    } else if codes.contains(&Some("TransactionConflict")) {
        Cancellation::Conflict
    } else {
        Cancellation::Other
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

super::delegate_store!(DynamoStore);
