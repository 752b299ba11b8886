//! Attempts counted by endpoint and hour, in the delivery-log table under `log =
//! hours#<endpoint>` (delivery-log partitions are hex hashes, so the two never meet). Counts
//! are gathered as attempts are recorded and written once per endpoint and hour when the
//! sender's batch is done: one write per endpoint in a batch, not one per attempt.

use std::sync::{Arc, Mutex, PoisonError};

use super::*;
use crate::domain::{
    stats::{LastFailure, STATS_KEPT},
    HourCount,
};

/// The counts gathered since the last flush, by endpoint and hour (shared by the store's
/// clones).
#[derive(Clone, Default)]
pub(super) struct HourTally(Arc<Mutex<HashMap<(EndpointId, i64), HourCount>>>);

impl HourTally {
    pub(super) fn add(&self, endpoint: &EndpointId, count: HourCount) {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        counts
            .entry((endpoint.clone(), to_millis(count.hour)))
            .and_modify(|c| c.add(&count))
            .or_insert(count);
    }

    fn take(&self) -> Vec<(EndpointId, HourCount)> {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        counts
            .drain()
            .map(|((endpoint, _), c)| (endpoint, c))
            .collect()
    }
}

fn hours_partition(endpoint: &EndpointId) -> String {
    format!("hours#{endpoint}")
}

/// Milliseconds, zero-padded so that the keys sort by time.
fn hour_key(hour: Timestamp) -> String {
    format!("{:013}", to_millis(hour).max(0))
}

impl DynamoStore {
    pub(super) async fn endpoint_hours(
        &self,
        endpoint: &EndpointId,
        since: Timestamp,
    ) -> StoreResult<Vec<HourCount>> {
        let request = self
            .client
            .query()
            .table_name(&self.tables.deliveries)
            .key_condition_expression("#log = :log AND id >= :since")
            .expression_attribute_names("#log", "log")
            .expression_attribute_values(":log", s(hours_partition(endpoint)))
            .expression_attribute_values(
                ":since",
                s(hour_key(crate::domain::stats::hour_of(since))),
            );
        let items = self.query_all(request).await?;
        items
            .iter()
            .map(|item| {
                let hour: i64 = get_s(item, "id")?.parse().map_err(|_| corrupt("id"))?;
                let last_failure = match opt_n::<i64>(item, "last_failure_at")? {
                    Some(at) => Some(LastFailure {
                        at: from_millis(at),
                        status_code: opt_n(item, "last_failure_status")?,
                        error: opt_s(item, "last_failure_error").unwrap_or_default(),
                    }),
                    None => None,
                };
                Ok(HourCount {
                    hour: from_millis(hour),
                    succeeded: opt_n(item, "succeeded")?.unwrap_or(0),
                    failed: opt_n(item, "failed")?.unwrap_or(0),
                    last_failure,
                })
            })
            .collect()
    }

    /// One `UpdateItem` per endpoint and hour gathered, adding to what is stored. Counts
    /// that could not be written are kept for the next flush.
    pub(super) async fn flush_hour_counts(&self) -> StoreResult<()> {
        let counts = self.hour_tally.take();
        let written = futures_util::future::join_all(counts.into_iter().map(
            |(endpoint, count)| async move {
                let result = self.add_hour_count(&endpoint, &count).await;
                (endpoint, count, result)
            },
        ))
        .await;
        let mut failure = None;
        for (endpoint, count, result) in written {
            if let Err(error) = result {
                self.hour_tally.add(&endpoint, count);
                failure = Some(error);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    async fn add_hour_count(&self, endpoint: &EndpointId, count: &HourCount) -> StoreResult<()> {
        // Kept as long as the counts are shown, then TTL takes them (epoch seconds).
        let expires = (to_millis(count.hour) + STATS_KEPT.num_milliseconds()).div_euclid(1000);
        let mut expression =
            "ADD succeeded :succeeded, failed :failed SET expires_at = :expires".to_owned();
        let mut values = Item::from([
            (":succeeded".into(), n(count.succeeded)),
            (":failed".into(), n(count.failed)),
            (":expires".into(), n(expires)),
        ]);
        // The failure of the latest flush stands for the hour's last one.
        if let Some(failure) = &count.last_failure {
            expression.push_str(", last_failure_at = :failed_at, last_failure_error = :error");
            values.insert(":failed_at".into(), n(to_millis(failure.at)));
            values.insert(":error".into(), s(failure.error.as_str()));
            match failure.status_code {
                Some(code) => {
                    expression.push_str(", last_failure_status = :status");
                    values.insert(":status".into(), n(code));
                }
                None => expression.push_str(" REMOVE last_failure_status"),
            }
        }
        self.client
            .update_item()
            .table_name(&self.tables.deliveries)
            .set_key(Some(key2(
                "log",
                &hours_partition(endpoint),
                "id",
                &hour_key(count.hour),
            )))
            .update_expression(expression)
            .set_expression_attribute_values(Some(values))
            .send()
            .await
            .map_err(sdk)?;
        Ok(())
    }
}
