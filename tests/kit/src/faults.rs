//! An SDK interceptor that makes one table's batch reads fail while a switch is on, as a
//! throttled or unreachable table would: for tests of what a use-case has done by the time
//! one of its reads fails.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemInput;
use aws_smithy_runtime_api::{
    box_error::BoxError,
    client::interceptors::{context::BeforeSerializationInterceptorContextRef, Intercept},
};
use aws_smithy_types::config_bag::ConfigBag;

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
