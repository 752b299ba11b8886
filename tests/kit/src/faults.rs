//! SDK interceptors that make DynamoDB behave as the emulator never does, for tests: one
//! table's batch reads failing while a switch is on, as a throttled or unreachable table's
//! would; and a global secondary index that still shows items the table no longer has, as
//! a real index may for about a second (every read of a GSI is eventually consistent);
//! and a count of the puts a caller sends to one table, with when it sent each try.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
};

use aws_sdk_dynamodb::{
    operation::{
        batch_get_item::BatchGetItemInput,
        put_item::PutItemInput,
        query::{QueryInput, QueryOutput},
    },
    types::AttributeValue,
};
use aws_smithy_runtime_api::{
    box_error::BoxError,
    client::{
        interceptors::{
            context::{
                BeforeSerializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
                FinalizerInterceptorContextMut,
            },
            Intercept,
        },
        runtime_components::RuntimeComponents,
    },
};
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

/// Fails every `BatchGetItem` that names `table` while [`Self::refuse`] is on.
#[derive(Debug, Clone)]
pub struct RefuseBatchReads {
    table: String,
    on: Arc<AtomicBool>,
}

impl RefuseBatchReads {
    /// Off until [`Self::refuse`].
    pub fn of(table: &str) -> Self {
        Self {
            table: table.to_owned(),
            on: Arc::default(),
        }
    }

    pub fn refuse(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
    }
}

impl Intercept for RefuseBatchReads {
    fn name(&self) -> &'static str {
        "HooklaneRefuseBatchReads"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(batch) = context.input().downcast_ref::<BatchGetItemInput>() else {
            return Ok(());
        };
        let names_table = batch
            .request_items()
            .is_some_and(|items| items.contains_key(&self.table));
        if self.on.load(Ordering::SeqCst) && names_table {
            return Err(format!("the test refuses batch reads of {}", self.table).into());
        }
        Ok(())
    }
}

type Item = HashMap<String, AttributeValue>;

/// Adds `stale` items to the answer of every query of `index`: what the index still showed
/// of items deleted from the table a moment before.
#[derive(Debug, Clone, Default)]
pub struct LaggingIndex {
    index: String,
    stale: Arc<Mutex<Vec<Item>>>,
    /// What the last query of the index answered.
    last: Arc<Mutex<Vec<Item>>>,
}

/// Marks a request as a query of the lagging index, from before it is sent to its answer.
#[derive(Debug, Clone)]
struct OfIndex;

impl Storable for OfIndex {
    type Storer = StoreReplace<Self>;
}

impl LaggingIndex {
    pub fn of(index: &str) -> Self {
        Self {
            index: index.to_owned(),
            ..Self::default()
        }
    }

    /// The items its queries also answer from now on (none: it has caught up).
    pub fn showing(&self, stale: Vec<Item>) {
        *self.stale.lock().unwrap_or_else(|p| p.into_inner()) = stale;
    }

    /// What the last query of the index answered (stale items aside).
    pub fn last_answer(&self) -> Vec<Item> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Intercept for LaggingIndex {
    fn name(&self) -> &'static str {
        "HooklaneLaggingIndex"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let query = context.input().downcast_ref::<QueryInput>();
        if query.and_then(QueryInput::index_name) == Some(self.index.as_str()) {
            cfg.interceptor_state().store_put(OfIndex);
        }
        Ok(())
    }

    fn modify_before_completion(
        &self,
        context: &mut FinalizerInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if cfg.load::<OfIndex>().is_none() {
            return Ok(());
        }
        let stale = self.stale.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(Ok(output)) = context.output_or_error_mut() {
            if let Some(query) = output.downcast_mut::<QueryOutput>() {
                let mut items = query.items.take().unwrap_or_default();
                *self.last.lock().unwrap_or_else(|p| p.into_inner()) = items.clone();
                items.extend(stale);
                query.count = i32::try_from(items.len()).unwrap_or(i32::MAX);
                query.items = Some(items);
            }
        }
        Ok(())
    }
}

/// Notes when each try of a `PutItem` to `table` is sent, the SDK's own tries of one call
/// included: what a caller still sends past its deadline, counted rather than timed, as a
/// loaded emulator answers each try late.
#[derive(Debug, Clone)]
pub struct PutTries {
    table: String,
    sent: Arc<Mutex<Vec<tokio::time::Instant>>>,
}

/// Marks a request as a put to the watched table, from before it is sent to its answer.
#[derive(Debug, Clone)]
struct PutToTable;

impl Storable for PutToTable {
    type Storer = StoreReplace<Self>;
}

impl PutTries {
    pub fn of(table: &str) -> Self {
        Self {
            table: table.to_owned(),
            sent: Arc::default(),
        }
    }

    /// How many tries were sent at or after `moment`.
    pub fn sent_from(&self, moment: tokio::time::Instant) -> usize {
        let sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        sent.iter().filter(|&&at| at >= moment).count()
    }

    /// When the first try was sent.
    pub fn first(&self) -> Option<tokio::time::Instant> {
        let sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        sent.first().copied()
    }

    pub fn sent(&self) -> usize {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Intercept for PutTries {
    fn name(&self) -> &'static str {
        "HooklanePutTries"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let put = context.input().downcast_ref::<PutItemInput>();
        if put.and_then(PutItemInput::table_name) == Some(self.table.as_str()) {
            cfg.interceptor_state().store_put(PutToTable);
        }
        Ok(())
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if cfg.load::<PutToTable>().is_some() {
            let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            sent.push(tokio::time::Instant::now());
        }
        Ok(())
    }
}

/// A DynamoDB client for the emulator (the SDK's configuration from the environment) with
/// `interceptor` installed.
pub async fn dynamodb_client_with(
    interceptor: impl Intercept + 'static,
) -> aws_sdk_dynamodb::Client {
    let sdk = hooklane::aws::load_sdk_config().await;
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk)
        .interceptor(interceptor)
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}
