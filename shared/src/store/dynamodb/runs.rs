//! One run at a time: the scheduled functions (the sweeper, the health check) hold a lock
//! item in the control table while they work, so a run that starts late (its invocation
//! waited in Lambda's queue) never overlaps the next. A lock instead of reserved
//! concurrency, which a new AWS account's concurrency quota cannot spare (Lambda keeps 100
//! unreserved), so reserving any would fail the stack's creation there.

use super::items::*;
use super::*;

/// A lock held by this run: give it back with [`DynamoStore::release_run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLock {
    pk: String,
    holder: String,
}

impl DynamoStore {
    /// Takes the lock of the runs of `name` until `until` (the run's end at the latest: its
    /// function's timeout), unless another run holds it. `None` when one does: this run
    /// has nothing to do. A run that died holding it is out of the way once its `until` passed.
    pub async fn take_run(
        &self,
        name: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreResult<Option<RunLock>> {
        let lock = RunLock {
            pk: format!("run#{name}"),
            holder: uuid::Uuid::new_v4().simple().to_string(),
        };
        let mut item = key1("pk", &lock.pk);
        item.insert("held_by".into(), s(&lock.holder));
        item.insert("held_until".into(), n(to_millis(until)));
        // The holder is the call's own token: a try sent again after a late answer finds
        // the lock its first try took, and has it.
        let put = self
            .client
            .put_item()
            .table_name(&self.tables.control)
            .condition_expression("attribute_not_exists(pk) OR held_until <= :now")
            .expression_attribute_values(":now", n(to_millis(now)));
        Ok(put_once(put, item).await?.map(|_| lock))
    }

    /// Gives the lock back, if this run still holds it (a run past its `until` may have lost
    /// it to the next, whose lock stays).
    pub async fn release_run(&self, lock: &RunLock) -> StoreResult<()> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.tables.control)
            .set_key(Some(key1("pk", &lock.pk)))
            .condition_expression("held_by = :holder")
            .expression_attribute_values(":holder", s(&lock.holder))
            .send()
            .await;
        written(result).map(|_| ())
    }
}
