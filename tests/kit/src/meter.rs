//! A request meter for the AWS shape: an SDK interceptor that counts every request per
//! operation and prices DynamoDB requests in read and write capacity units.
//!
//! DynamoDB can report `ConsumedCapacity` itself, but the local emulator (moto) answers a
//! fixed 1.0 or 0.5 whatever the item size and ignores index writes, so the meter works the
//! units out from the items, by DynamoDB's published rules:
//!
//! - an item's size is the sum of its attribute names and values (strings and binaries by
//!   length, numbers about one byte per two significant digits plus one, booleans and nulls
//!   one byte, lists and maps 3 bytes plus their elements);
//! - a write costs one unit per started 1 KB of the larger of the item before and after it
//!   (at least one), twice inside `TransactWriteItems`; a conditional write whose condition
//!   fails still costs the units of the item as it is;
//! - every global secondary index the write touches costs one unit per started 1 KB of the
//!   index entry (its projected attributes, the keys and 100 bytes of overhead): a put when
//!   the item enters the index, a delete when it leaves, both when an index key changes, and
//!   one when a projected attribute changes;
//! - a strongly consistent read costs one unit per started 4 KB (a query: of all the items it
//!   returns together; a batch read: of each item, and the smallest read for a key with no
//!   item), an eventually consistent one half that; index queries are always
//!   eventually consistent; `TransactGetItems` costs double.
//!
//! To know the item before a write the meter keeps the last image it saw of every item
//! (written, or read in full) in memory: meant for measurements, not for production.
//! Approximations: update expressions are applied by a small interpreter that understands
//! what this crate writes (`SET` with values, `if_not_exists`, `+`/`-`; `REMOVE`; one level
//! of map paths); a cancelled transaction is charged one unit per item; index writes inside
//! a transaction are charged once.
//!
//! SQS requests are billed per started 64 KB of payload (a `SendMessageBatch` of up to 10
//! small messages is one request). Scheduler and SES calls are counted as calls. Lambda
//! invocations are not SDK calls: callers count them with [`Meter::invoked`].

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, MutexGuard},
};

use aws_sdk_dynamodb::{
    error::ProvideErrorMetadata,
    operation::{
        batch_get_item::{BatchGetItemInput, BatchGetItemOutput},
        batch_write_item::BatchWriteItemInput,
        delete_item::{DeleteItemError, DeleteItemInput},
        get_item::{GetItemInput, GetItemOutput},
        put_item::{PutItemError, PutItemInput},
        query::{QueryInput, QueryOutput},
        scan::{ScanInput, ScanOutput},
        transact_get_items::{TransactGetItemsInput, TransactGetItemsOutput},
        transact_write_items::{TransactWriteItemsError, TransactWriteItemsInput},
        update_item::{UpdateItemError, UpdateItemInput},
    },
    types::AttributeValue,
};
use aws_smithy_runtime_api::{
    box_error::BoxError,
    client::{
        interceptors::{
            context::{BeforeSerializationInterceptorContextRef, FinalizerInterceptorContextRef},
            Intercept, SharedInterceptor,
        },
        orchestrator::Metadata,
        runtime_components::RuntimeComponents,
    },
};
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

use hooklane::store::dynamodb::{item_size, TableNames};

type Item = HashMap<String, AttributeValue>;

const WRITE_UNIT_BYTES: usize = 1024;
const READ_UNIT_BYTES: usize = 4096;
const INDEX_ENTRY_OVERHEAD: usize = 100;
const SQS_BILLING_CHUNK: usize = 64 * 1024;

/// What one operation (e.g. `DynamoDB.UpdateItem`) cost so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Calls made (Lambda: invocations).
    pub calls: u64,
    /// Requests billed (SQS: per started 64 KB of payload; otherwise the calls).
    pub billed_requests: u64,
    pub read_units: f64,
    pub write_units: f64,
}

impl Usage {
    fn add(&mut self, other: &Usage) {
        self.calls += other.calls;
        self.billed_requests += other.billed_requests;
        self.read_units += other.read_units;
        self.write_units += other.write_units;
    }

    fn minus(&self, earlier: &Usage) -> Usage {
        Usage {
            calls: self.calls.saturating_sub(earlier.calls),
            billed_requests: self.billed_requests.saturating_sub(earlier.billed_requests),
            read_units: self.read_units - earlier.read_units,
            write_units: self.write_units - earlier.write_units,
        }
    }
}

/// The meter's counters at one moment. Keys: `Service.Operation` (e.g. `SQS.SendMessageBatch`,
/// `Lambda.sender`) in `operations`; the table (or `table/index`) in `tables`, for units.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub operations: BTreeMap<String, Usage>,
    pub tables: BTreeMap<String, Usage>,
}

impl Reading {
    /// What happened between `earlier` and this reading.
    pub fn since(&self, earlier: &Reading) -> Reading {
        let diff = |now: &BTreeMap<String, Usage>, then: &BTreeMap<String, Usage>| {
            now.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.minus(&then.get(k).cloned().unwrap_or_default()),
                    )
                })
                .filter(|(_, v)| *v != Usage::default())
                .collect()
        };
        Reading {
            operations: diff(&self.operations, &earlier.operations),
            tables: diff(&self.tables, &earlier.tables),
        }
    }

    /// The sum over one service's operations (`DynamoDB`, `SQS`, `Scheduler`, `Lambda`, …).
    pub fn service(&self, service: &str) -> Usage {
        let prefix = format!("{service}.");
        let mut total = Usage::default();
        for (_, usage) in self
            .operations
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
        {
            total.add(usage);
        }
        total
    }
}

/// How an index copies attributes from the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Projected {
    All,
    KeysOnly,
    Include(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexLayout {
    pub name: String,
    pub hash: String,
    pub range: Option<String>,
    pub projected: Projected,
}

/// A table as the meter needs it: its key and its global secondary indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLayout {
    /// The table's name in requests.
    pub name: String,
    /// The name it is reported under (without the stack prefix).
    pub label: String,
    pub key: Vec<String>,
    pub indexes: Vec<IndexLayout>,
}

#[derive(Default)]
struct State {
    reading: Reading,
    tables: HashMap<String, TableLayout>,
    /// The last image seen of each item, by (table, key).
    images: HashMap<(String, String), Item>,
}

/// Counts the requests of every SDK client built with its interceptor. Cheap to clone;
/// all clones count into the same totals.
#[derive(Clone, Default)]
pub struct Meter {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter").finish_non_exhaustive()
    }
}

impl Meter {
    pub fn new(tables: Vec<TableLayout>) -> Self {
        let meter = Self::default();
        meter.lock().tables = tables.into_iter().map(|t| (t.name.clone(), t)).collect();
        meter
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves counters that are still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn reading(&self) -> Reading {
        self.lock().reading.clone()
    }

    /// Counts one invocation of a Lambda function (a handler call).
    pub fn invoked(&self, function: &str) {
        let mut state = self.lock();
        let usage = state
            .reading
            .operations
            .entry(format!("Lambda.{function}"))
            .or_default();
        usage.calls += 1;
        usage.billed_requests += 1;
    }

    /// The interceptor to install on an SDK client's config.
    pub fn interceptor(&self) -> MeterInterceptor {
        MeterInterceptor {
            meter: self.clone(),
        }
    }

    /// The interceptor as the shape's clients take it (`aws::clients`, `connect_with`).
    pub fn shared(&self) -> SharedInterceptor {
        SharedInterceptor::new(self.interceptor())
    }

    fn plan(&self, input: &aws_smithy_runtime_api::client::interceptors::context::Input) -> Plan {
        let state = self.lock();
        if let Some(put) = input.downcast_ref::<PutItemInput>() {
            let table = put.table_name().unwrap_or_default();
            return Plan::Writes {
                writes: vec![state.write(
                    table,
                    WriteKind::Put(put.item().cloned().unwrap_or_default()),
                )],
                transactional: false,
            };
        }
        if let Some(update) = input.downcast_ref::<UpdateItemInput>() {
            let table = update.table_name().unwrap_or_default();
            let kind = WriteKind::update(
                update.key().cloned().unwrap_or_default(),
                update.update_expression().unwrap_or_default(),
                update.expression_attribute_names(),
                update.expression_attribute_values(),
            );
            return Plan::Writes {
                writes: vec![state.write(table, kind)],
                transactional: false,
            };
        }
        if let Some(delete) = input.downcast_ref::<DeleteItemInput>() {
            let table = delete.table_name().unwrap_or_default();
            let kind = WriteKind::Delete(delete.key().cloned().unwrap_or_default());
            return Plan::Writes {
                writes: vec![state.write(table, kind)],
                transactional: false,
            };
        }
        if let Some(batch) = input.downcast_ref::<BatchWriteItemInput>() {
            let mut writes = Vec::new();
            for (table, requests) in batch.request_items().into_iter().flatten() {
                for request in requests {
                    if let Some(put) = request.put_request() {
                        writes.push(state.write(table, WriteKind::Put(put.item().clone())));
                    }
                    if let Some(delete) = request.delete_request() {
                        writes.push(state.write(table, WriteKind::Delete(delete.key().clone())));
                    }
                }
            }
            return Plan::Writes {
                writes,
                transactional: false,
            };
        }
        if let Some(transaction) = input.downcast_ref::<TransactWriteItemsInput>() {
            let mut writes = Vec::new();
            for item in transaction.transact_items() {
                if let Some(put) = item.put() {
                    writes.push(state.write(put.table_name(), WriteKind::Put(put.item().clone())));
                }
                if let Some(update) = item.update() {
                    let kind = WriteKind::update(
                        update.key().clone(),
                        update.update_expression(),
                        update.expression_attribute_names(),
                        update.expression_attribute_values(),
                    );
                    writes.push(state.write(update.table_name(), kind));
                }
                if let Some(delete) = item.delete() {
                    let kind = WriteKind::Delete(delete.key().clone());
                    writes.push(state.write(delete.table_name(), kind));
                }
                if let Some(check) = item.condition_check() {
                    let kind = WriteKind::Check(check.key().clone());
                    writes.push(state.write(check.table_name(), kind));
                }
            }
            return Plan::Writes {
                writes,
                transactional: true,
            };
        }
        if let Some(get) = input.downcast_ref::<GetItemInput>() {
            return Plan::Read {
                table: get.table_name().unwrap_or_default().to_owned(),
                index: None,
                consistent: get.consistent_read().unwrap_or(false),
            };
        }
        if let Some(query) = input.downcast_ref::<QueryInput>() {
            return Plan::Read {
                table: query.table_name().unwrap_or_default().to_owned(),
                index: query.index_name().map(str::to_owned),
                consistent: query.consistent_read().unwrap_or(false),
            };
        }
        if let Some(scan) = input.downcast_ref::<ScanInput>() {
            return Plan::Read {
                table: scan.table_name().unwrap_or_default().to_owned(),
                index: scan.index_name().map(str::to_owned),
                consistent: scan.consistent_read().unwrap_or(false),
            };
        }
        if let Some(batch) = input.downcast_ref::<BatchGetItemInput>() {
            return Plan::BatchRead {
                consistent: batch
                    .request_items()
                    .into_iter()
                    .flatten()
                    .map(|(table, keys)| (table.clone(), keys.consistent_read().unwrap_or(false)))
                    .collect(),
                requested: batch
                    .request_items()
                    .into_iter()
                    .flatten()
                    .map(|(table, keys)| (table.clone(), keys.keys().len()))
                    .collect(),
            };
        }
        if input.downcast_ref::<TransactGetItemsInput>().is_some() {
            return Plan::TransactionalRead;
        }
        if let Some(batch) = input
            .downcast_ref::<hooklane::aws::aws_sdk_sqs::operation::send_message_batch::SendMessageBatchInput>()
        {
            let bytes: usize = batch.entries().iter().map(|e| e.message_body().len()).sum();
            return Plan::Billed(chunks(bytes));
        }
        if let Some(send) = input
            .downcast_ref::<hooklane::aws::aws_sdk_sqs::operation::send_message::SendMessageInput>(
        ) {
            return Plan::Billed(chunks(send.message_body().map_or(0, str::len)));
        }
        Plan::Billed(1)
    }

    fn settle(&self, operation: &str, plan: &Plan, outcome: Outcome<'_>) {
        let mut state = self.lock();
        let mut by_table: Vec<(String, Usage)> = Vec::new();
        let mut usage = Usage {
            calls: 1,
            billed_requests: match plan {
                Plan::Billed(n) => *n,
                _ => 1,
            },
            ..Usage::default()
        };
        match (plan, outcome) {
            (
                Plan::Writes {
                    writes,
                    transactional,
                },
                Outcome::Succeeded(_),
            ) => {
                let factor = if *transactional { 2.0 } else { 1.0 };
                for write in writes {
                    let label = state.label(&write.table);
                    let base = write_units(write.before.as_ref(), write.after.as_ref()) * factor;
                    by_table.push((label.clone(), writing(base)));
                    usage.write_units += base;
                    if let Some(layout) = state.tables.get(&write.table) {
                        for index in &layout.indexes {
                            let units = index_write_units(
                                layout,
                                index,
                                write.before.as_ref(),
                                write.after.as_ref(),
                            );
                            if units > 0.0 {
                                by_table.push((format!("{label}/{}", index.name), writing(units)));
                                usage.write_units += units;
                            }
                        }
                    }
                    if let Some(key) = &write.key {
                        let slot = (write.table.clone(), key.clone());
                        match &write.after {
                            Some(after) if !write.is_check => {
                                state.images.insert(slot, after.clone());
                            }
                            None => {
                                state.images.remove(&slot);
                            }
                            Some(_) => {}
                        }
                    }
                }
            }
            (
                Plan::Writes {
                    writes,
                    transactional,
                },
                Outcome::ConditionFailed,
            ) => {
                // The condition was read against the item as it is: that still costs units
                // (one per item of a cancelled transaction: its prepare phase).
                for write in writes {
                    let units = if *transactional {
                        1.0
                    } else {
                        write_units(write.before.as_ref(), None)
                    };
                    by_table.push((state.label(&write.table), writing(units)));
                    usage.write_units += units;
                }
            }
            (
                Plan::Read {
                    table,
                    index,
                    consistent,
                },
                Outcome::Succeeded(output),
            ) => {
                let items: Vec<&Item> = if let Some(get) = output.downcast_ref::<GetItemOutput>() {
                    get.item().into_iter().collect()
                } else if let Some(query) = output.downcast_ref::<QueryOutput>() {
                    query.items().iter().collect()
                } else if let Some(scan) = output.downcast_ref::<ScanOutput>() {
                    scan.items().iter().collect()
                } else {
                    Vec::new()
                };
                let bytes: usize = items.iter().map(|i| item_size(i)).sum();
                let strong = *consistent && index.is_none();
                let units = read_units(bytes, strong);
                let label = match index {
                    Some(index) => format!("{}/{index}", state.label(table)),
                    None => state.label(table),
                };
                by_table.push((label, reading(units)));
                usage.read_units += units;
                if index.is_none() {
                    let images: Vec<((String, String), Item)> = items
                        .iter()
                        .filter_map(|item| {
                            let key = state.key_of(table, item)?;
                            Some(((table.clone(), key), (*item).clone()))
                        })
                        .collect();
                    state.images.extend(images);
                }
            }
            (
                Plan::BatchRead {
                    consistent,
                    requested,
                },
                Outcome::Succeeded(output),
            ) => {
                if let Some(batch) = output.downcast_ref::<BatchGetItemOutput>() {
                    for (table, asked) in requested {
                        let strong = consistent.get(table).copied().unwrap_or(false);
                        let items = batch
                            .responses()
                            .and_then(|r| r.get(table))
                            .map_or(&[][..], Vec::as_slice);
                        let unprocessed = batch
                            .unprocessed_keys()
                            .and_then(|u| u.get(table))
                            .map_or(0, |k| k.keys().len());
                        // A key with no item still costs the smallest read.
                        let missing = asked.saturating_sub(items.len() + unprocessed);
                        let units: f64 = items
                            .iter()
                            .map(|i| read_units(item_size(i), strong))
                            .sum::<f64>()
                            + missing as f64 * read_units(0, strong);
                        by_table.push((state.label(table), reading(units)));
                        usage.read_units += units;
                    }
                }
            }
            (Plan::TransactionalRead, Outcome::Succeeded(output)) => {
                if let Some(transaction) = output.downcast_ref::<TransactGetItemsOutput>() {
                    for response in transaction.responses() {
                        let units = 2.0 * read_units(response.item().map_or(0, item_size), true);
                        usage.read_units += units;
                    }
                }
            }
            _ => {}
        }
        state
            .reading
            .operations
            .entry(operation.to_owned())
            .or_default()
            .add(&usage);
        for (label, units) in by_table {
            state.reading.tables.entry(label).or_default().add(&units);
        }
    }
}

fn writing(units: f64) -> Usage {
    Usage {
        write_units: units,
        ..Usage::default()
    }
}

fn reading(units: f64) -> Usage {
    Usage {
        read_units: units,
        ..Usage::default()
    }
}

fn chunks(bytes: usize) -> u64 {
    u64::try_from(bytes.div_ceil(SQS_BILLING_CHUNK).max(1)).unwrap_or(u64::MAX)
}

enum WriteKind {
    Put(Item),
    Update {
        key: Item,
        expression: String,
        names: HashMap<String, String>,
        values: Item,
    },
    Delete(Item),
    Check(Item),
}

impl WriteKind {
    /// An update of the item at `key` by `expression`, with the names and values it uses
    /// (none given: none), as an `UpdateItem` request or a transaction's update carries them.
    fn update(
        key: Item,
        expression: &str,
        names: Option<&HashMap<String, String>>,
        values: Option<&Item>,
    ) -> Self {
        WriteKind::Update {
            key,
            expression: expression.to_owned(),
            names: names.cloned().unwrap_or_default(),
            values: values.cloned().unwrap_or_default(),
        }
    }
}

/// One item write, with the item before (as last seen) and after it.
#[derive(Debug, Clone)]
struct PlannedWrite {
    table: String,
    key: Option<String>,
    before: Option<Item>,
    after: Option<Item>,
    is_check: bool,
}

impl State {
    fn label(&self, table: &str) -> String {
        self.tables
            .get(table)
            .map_or_else(|| table.to_owned(), |t| t.label.clone())
    }

    fn key_of(&self, table: &str, item: &Item) -> Option<String> {
        let layout = self.tables.get(table)?;
        let mut key = String::new();
        for name in &layout.key {
            key.push_str(&format!("{:?}|", item.get(name)?));
        }
        Some(key)
    }

    fn write(&self, table: &str, kind: WriteKind) -> PlannedWrite {
        let key_item = match &kind {
            WriteKind::Put(item) => item,
            WriteKind::Update { key, .. } | WriteKind::Delete(key) | WriteKind::Check(key) => key,
        };
        let key = self.key_of(table, key_item);
        let before = key
            .as_ref()
            .and_then(|k| self.images.get(&(table.to_owned(), k.clone())))
            .cloned();
        let (after, is_check) = match kind {
            WriteKind::Put(item) => (Some(item), false),
            WriteKind::Update {
                key,
                expression,
                names,
                values,
            } => (
                Some(apply_update(
                    before.as_ref(),
                    &key,
                    &expression,
                    &names,
                    &values,
                )),
                false,
            ),
            WriteKind::Delete(_) => (None, false),
            WriteKind::Check(_) => (before.clone(), true),
        };
        PlannedWrite {
            table: table.to_owned(),
            key,
            before,
            after,
            is_check,
        }
    }
}

#[derive(Debug, Clone)]
enum Plan {
    Writes {
        writes: Vec<PlannedWrite>,
        transactional: bool,
    },
    Read {
        table: String,
        index: Option<String>,
        consistent: bool,
    },
    BatchRead {
        consistent: HashMap<String, bool>,
        /// Keys asked for, per table.
        requested: HashMap<String, usize>,
    },
    TransactionalRead,
    /// Any other call: this many billed requests.
    Billed(u64),
}

impl Storable for Plan {
    type Storer = StoreReplace<Self>;
}

enum Outcome<'a> {
    Succeeded(&'a aws_smithy_runtime_api::client::interceptors::context::Output),
    ConditionFailed,
    Failed,
}

/// Installed on SDK clients by [`Meter::interceptor`].
#[derive(Debug, Clone)]
pub struct MeterInterceptor {
    meter: Meter,
}

impl Intercept for MeterInterceptor {
    fn name(&self) -> &'static str {
        "HooklaneMeter"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let plan = self.meter.plan(context.input());
        cfg.interceptor_state().store_put(plan);
        Ok(())
    }

    fn read_after_execution(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(plan) = cfg.load::<Plan>().cloned() else {
            return Ok(());
        };
        let operation = cfg.load::<Metadata>().map_or_else(
            || "unknown.unknown".to_owned(),
            |m| format!("{}.{}", m.service(), m.name()),
        );
        let outcome = match context.output_or_error() {
            Some(Ok(output)) => Outcome::Succeeded(output),
            Some(Err(error)) => match error.as_operation_error() {
                Some(e) if condition_failed(e) => Outcome::ConditionFailed,
                _ => Outcome::Failed,
            },
            None => Outcome::Failed,
        };
        self.meter.settle(&operation, &plan, outcome);
        Ok(())
    }
}

fn condition_failed(error: &aws_smithy_runtime_api::client::interceptors::context::Error) -> bool {
    let code = if let Some(e) = error.downcast_ref::<PutItemError>() {
        e.code()
    } else if let Some(e) = error.downcast_ref::<UpdateItemError>() {
        e.code()
    } else if let Some(e) = error.downcast_ref::<DeleteItemError>() {
        e.code()
    } else if let Some(e) = error.downcast_ref::<TransactWriteItemsError>() {
        e.code()
    } else {
        None
    };
    matches!(
        code,
        Some("ConditionalCheckFailedException" | "TransactionCanceledException")
    )
}

fn units(bytes: usize, unit: usize) -> f64 {
    bytes.div_ceil(unit).max(1) as f64
}

fn write_units(before: Option<&Item>, after: Option<&Item>) -> f64 {
    let size = before.map_or(0, item_size).max(after.map_or(0, item_size));
    units(size, WRITE_UNIT_BYTES)
}

fn read_units(bytes: usize, strongly_consistent: bool) -> f64 {
    let full = units(bytes, READ_UNIT_BYTES);
    if strongly_consistent {
        full
    } else {
        full / 2.0
    }
}

fn in_index(index: &IndexLayout, item: &Item) -> bool {
    item.contains_key(&index.hash) && index.range.as_ref().is_none_or(|r| item.contains_key(r))
}

fn index_entry(layout: &TableLayout, index: &IndexLayout, item: &Item) -> Item {
    item.iter()
        .filter(|(name, _)| {
            layout.key.contains(name)
                || **name == index.hash
                || index.range.as_ref() == Some(*name)
                || match &index.projected {
                    Projected::All => true,
                    Projected::KeysOnly => false,
                    Projected::Include(names) => names.contains(name),
                }
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn index_write_units(
    layout: &TableLayout,
    index: &IndexLayout,
    before: Option<&Item>,
    after: Option<&Item>,
) -> f64 {
    let entry_units = |item: &Item| {
        units(
            item_size(&index_entry(layout, index, item)) + INDEX_ENTRY_OVERHEAD,
            WRITE_UNIT_BYTES,
        )
    };
    let before = before.filter(|i| in_index(index, i));
    let after = after.filter(|i| in_index(index, i));
    match (before, after) {
        (None, None) => 0.0,
        (None, Some(after)) => entry_units(after),
        (Some(before), None) => entry_units(before),
        (Some(before), Some(after)) => {
            let keys_moved = before.get(&index.hash) != after.get(&index.hash)
                || index.range.as_ref().and_then(|r| before.get(r))
                    != index.range.as_ref().and_then(|r| after.get(r));
            if keys_moved {
                entry_units(before) + entry_units(after)
            } else if index_entry(layout, index, before) != index_entry(layout, index, after) {
                entry_units(after)
            } else {
                0.0
            }
        }
    }
}

/// The item after an update expression (see the module documentation for what is understood).
fn apply_update(
    before: Option<&Item>,
    key: &Item,
    expression: &str,
    names: &HashMap<String, String>,
    values: &Item,
) -> Item {
    let mut item = before.cloned().unwrap_or_else(|| key.clone());
    for (action, text) in sections(expression) {
        for clause in split_top_level(&text, ',') {
            let clause = clause.trim();
            match action.as_str() {
                "SET" => {
                    let Some((path, operand)) = clause.split_once('=') else {
                        continue;
                    };
                    let path = parse_path(path, names);
                    let value = evaluate(operand, &item, names, values);
                    set_path(&mut item, &path, value);
                }
                "REMOVE" => {
                    let path = parse_path(clause, names);
                    remove_path(&mut item, &path);
                }
                "ADD" => {
                    let mut parts = clause.split_whitespace();
                    if let (Some(path), Some(operand)) = (parts.next(), parts.next()) {
                        let path = parse_path(path, names);
                        let current = get_path(&item, &path);
                        let added = values
                            .get(operand)
                            .cloned()
                            .unwrap_or(AttributeValue::Null(true));
                        let value = match current {
                            Some(current) => arithmetic(&current, &added, 1.0),
                            None => added,
                        };
                        set_path(&mut item, &path, value);
                    }
                }
                _ => {}
            }
        }
    }
    item
}

fn sections(expression: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for token in expression.split_whitespace() {
        let upper = token.to_ascii_uppercase();
        if matches!(upper.as_str(), "SET" | "REMOVE" | "ADD" | "DELETE") {
            sections.push((upper, String::new()));
        } else if let Some((_, text)) = sections.last_mut() {
            text.push_str(token);
            text.push(' ');
        }
    }
    sections
}

fn split_top_level(text: &str, separator: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if c == separator && depth == 0 {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    parts.push(current);
    parts
}

fn parse_path(path: &str, names: &HashMap<String, String>) -> Vec<String> {
    path.trim()
        .split('.')
        .map(|segment| {
            let segment = segment.split('[').next().unwrap_or_default().trim();
            names
                .get(segment)
                .cloned()
                .unwrap_or_else(|| segment.to_owned())
        })
        .collect()
}

fn get_path(item: &Item, path: &[String]) -> Option<AttributeValue> {
    let (first, rest) = path.split_first()?;
    let mut value = item.get(first)?;
    for segment in rest {
        match value {
            AttributeValue::M(map) => value = map.get(segment)?,
            _ => return None,
        }
    }
    Some(value.clone())
}

fn set_path(item: &mut Item, path: &[String], value: AttributeValue) {
    match path {
        [] => {}
        [name] => {
            item.insert(name.clone(), value);
        }
        [name, rest @ ..] => {
            let entry = item
                .entry(name.clone())
                .or_insert_with(|| AttributeValue::M(HashMap::new()));
            if let AttributeValue::M(map) = entry {
                set_path(map, rest, value);
            }
        }
    }
}

fn remove_path(item: &mut Item, path: &[String]) {
    match path {
        [] => {}
        [name] => {
            item.remove(name);
        }
        [name, rest @ ..] => {
            if let Some(AttributeValue::M(map)) = item.get_mut(name) {
                remove_path(map, rest);
            }
        }
    }
}

fn evaluate(
    operand: &str,
    item: &Item,
    names: &HashMap<String, String>,
    values: &Item,
) -> AttributeValue {
    let operand = operand.trim();
    if let Some(inner) = operand
        .strip_prefix("if_not_exists(")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        let arguments = split_top_level(inner, ',');
        if let [path, fallback] = arguments.as_slice() {
            return get_path(item, &parse_path(path, names))
                .unwrap_or_else(|| evaluate(fallback, item, names, values));
        }
    }
    for (sign, factor) in [('+', 1.0), ('-', -1.0)] {
        let parts = split_top_level(operand, sign);
        if let [left, right] = parts.as_slice() {
            let left = evaluate(left, item, names, values);
            let right = evaluate(right, item, names, values);
            return arithmetic(&left, &right, factor);
        }
    }
    if operand.starts_with(':') {
        return values
            .get(operand)
            .cloned()
            .unwrap_or(AttributeValue::Null(true));
    }
    get_path(item, &parse_path(operand, names)).unwrap_or(AttributeValue::Null(true))
}

fn arithmetic(left: &AttributeValue, right: &AttributeValue, factor: f64) -> AttributeValue {
    match (left, right) {
        (AttributeValue::N(a), AttributeValue::N(b)) => {
            match (a.parse::<i128>(), b.parse::<i128>()) {
                (Ok(a), Ok(b)) => {
                    AttributeValue::N(if factor > 0.0 { a + b } else { a - b }.to_string())
                }
                _ => {
                    let (a, b) = (
                        a.parse::<f64>().unwrap_or(0.0),
                        b.parse::<f64>().unwrap_or(0.0),
                    );
                    AttributeValue::N((a + factor * b).to_string())
                }
            }
        }
        _ => right.clone(),
    }
}

/// The tables' keys and indexes as the request meter needs them, read from the template.
pub fn table_layouts(tables: &TableNames) -> Vec<TableLayout> {
    let name = tables.prefix();
    let definitions = hooklane::aws::stack::Stack::new(name, "", "", &[])
        .and_then(|stack| hooklane::aws::stack::TableDefinition::all(&stack))
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
mod tests {
    use super::*;

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.into())
    }

    fn n(v: i64) -> AttributeValue {
        AttributeValue::N(v.to_string())
    }

    #[test]
    fn sizes_follow_the_published_rules() {
        // "id" (2) + "abc" (3); "count" (5) + 12345 (3 digit pairs → 3 + 1).
        let item = Item::from([("id".into(), s("abc")), ("count".into(), n(12345))]);
        assert_eq!(item_size(&item), 5 + 5 + 4);
        assert_eq!(write_units(Some(&item), None), 1.0);
        let big = Item::from([("p".into(), s(&"x".repeat(2048)))]);
        assert_eq!(write_units(Some(&item), Some(&big)), 3.0);
        assert_eq!(read_units(4097, true), 2.0);
        assert_eq!(read_units(10, false), 0.5);
    }

    #[test]
    fn update_expressions_are_applied_to_the_last_image() {
        let before = Item::from([
            ("pk".into(), s("slots#ep")),
            ("version".into(), n(3)),
            (
                "holders".into(),
                AttributeValue::M(HashMap::from([("h1".into(), n(9))])),
            ),
            ("pending_shard".into(), s("4")),
        ]);
        let names = HashMap::from([
            ("#holder".to_owned(), "h1".to_owned()),
            ("#status".to_owned(), "status".to_owned()),
        ]);
        let values = Item::from([
            (":one".into(), n(1)),
            (":s".into(), s("delivered")),
            (":now".into(), n(7)),
        ]);
        let after = apply_update(
            Some(&before),
            &Item::new(),
            "REMOVE holders.#holder, pending_shard SET version = version + :one, #status = :s, \
             since = if_not_exists(since, :now)",
            &names,
            &values,
        );
        assert_eq!(after.get("version"), Some(&n(4)));
        assert_eq!(
            after.get("holders"),
            Some(&AttributeValue::M(HashMap::new()))
        );
        assert_eq!(after.get("status"), Some(&s("delivered")));
        assert_eq!(after.get("since"), Some(&n(7)));
        assert!(!after.contains_key("pending_shard"));
    }

    #[test]
    fn a_batch_read_charges_every_key_asked_for() {
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        use aws_smithy_runtime_api::client::interceptors::context::{Input, Output};
        let meter = Meter::new(vec![TableLayout {
            name: "t".into(),
            label: "t".into(),
            key: vec!["id".into()],
            indexes: vec![],
        }]);
        let key = |id: &str| Item::from([("id".to_owned(), s(id))]);
        let keys = KeysAndAttributes::builder()
            .keys(key("a"))
            .keys(key("b"))
            .keys(key("c"))
            .consistent_read(true)
            .build()
            .unwrap();
        let input = BatchGetItemInput::builder()
            .request_items("t", keys)
            .build()
            .unwrap();
        let plan = meter.plan(&Input::erase(input));
        let output = BatchGetItemOutput::builder()
            .responses("t", vec![key("a")])
            .build();
        meter.settle(
            "DynamoDB.BatchGetItem",
            &plan,
            Outcome::Succeeded(&Output::erase(output)),
        );
        // The item found costs a unit, and so does each key without an item.
        assert_eq!(meter.reading().tables["t"].read_units, 3.0);
    }

    #[test]
    fn index_writes_follow_membership_and_projection() {
        let layout = TableLayout {
            name: "t".into(),
            label: "t".into(),
            key: vec!["id".into()],
            indexes: vec![],
        };
        let sparse = IndexLayout {
            name: "pending".into(),
            hash: "shard".into(),
            range: None,
            projected: Projected::KeysOnly,
        };
        let all = IndexLayout {
            name: "log".into(),
            hash: "owner".into(),
            range: None,
            projected: Projected::All,
        };
        let pending = Item::from([
            ("id".into(), s("d1")),
            ("owner".into(), s("a")),
            ("shard".into(), s("1")),
            ("status".into(), s("pending")),
        ]);
        let mut delivered = pending.clone();
        delivered.remove("shard");
        delivered.insert("status".into(), s("delivered"));
        assert_eq!(
            index_write_units(&layout, &sparse, None, Some(&pending)),
            1.0
        );
        assert_eq!(
            index_write_units(&layout, &sparse, Some(&pending), Some(&delivered)),
            1.0
        );
        assert_eq!(
            index_write_units(&layout, &sparse, Some(&delivered), Some(&delivered)),
            0.0
        );
        assert_eq!(
            index_write_units(&layout, &all, Some(&pending), Some(&delivered)),
            1.0
        );
        // A keys-only index is not written when only other attributes change.
        let mut touched = pending.clone();
        touched.insert("status".into(), s("other"));
        assert_eq!(
            index_write_units(&layout, &sparse, Some(&pending), Some(&touched)),
            0.0
        );
        let mut moved = pending.clone();
        moved.insert("owner".into(), s("b"));
        assert_eq!(
            index_write_units(&layout, &all, Some(&pending), Some(&moved)),
            2.0
        );
    }
}
