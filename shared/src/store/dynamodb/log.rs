//! Delivery logs: one partition per endpoint, merged newest first into pages.

use super::items::*;
use super::*;
use crate::store::cursor;
use futures_util::TryStreamExt;

/// One endpoint's log partition in a listing: its deliveries read newest first, a page at
/// a time, each buffered with its place in the merge (event time, then id).
pub(super) struct LogPartition {
    partition: String,
    endpoint: EndpointId,
    buffered: std::collections::VecDeque<(String, Delivery)>,
    start: Option<Item>,
    exhausted: bool,
    /// The `Limit` of its next query: see [`first_page`]. Doubles after each query.
    page: usize,
}

impl LogPartition {
    pub(super) fn new(account: &AccountId, endpoint: &EndpointId) -> Self {
        Self {
            partition: delivery_log_partition(account, endpoint),
            endpoint: endpoint.clone(),
            buffered: std::collections::VecDeque::new(),
            start: None,
            exhausted: false,
            page: MAX_PAGE,
        }
    }
}

/// A query's `Limit` at most: a page of the log (500) and the one that says there is more.
const MAX_PAGE: usize = 501;

/// The first query's `Limit` in each of `partitions` log partitions merged for a page of
/// `wanted` deliveries: an equal part, each partition's next page twice its last. A page of
/// 100 from an account of 1,000 endpoints read 101 deliveries from each (101,000, held in
/// memory and charged as read) to show 100; with parts, about one per endpoint, and a few
/// more from those whose deliveries the page shows.
fn first_page(wanted: usize, partitions: usize) -> usize {
    wanted.div_ceil(partitions.max(1)).clamp(1, MAX_PAGE)
}

/// Log partitions an account's log queries at once. Each query in flight holds a connection
/// of its own (the SDK's HTTP client sets no cap), and a Lambda execution environment has
/// 1,024 file descriptors: an account that has had thousands of endpoints, deleted ones
/// included, would run out of them (or into the HTTP API's 30 s) with every partition
/// queried at once. 32 at a time is 32 sockets, and reads 1,000 partitions in about 32
/// round trips' time.
pub(super) const LOG_READ_CONCURRENCY: usize = 32;

/// A log partition is one endpoint's: this keeps out another endpoint whose partition hash
/// collides, and another account's endpoint of the same name.
pub(super) const LOG_PARTITION_FILTER: &str = "account_id = :account AND endpoint_id = :endpoint";

/// Which deliveries of an endpoint's log a query returns.
#[derive(Debug, Clone, Copy)]
pub(super) enum LogFilter {
    All,
    Pending,
    /// Pending without an attempt, and not in the `pending` index.
    UnindexedFirstTries,
}

/// The bounds and query-side filters of one listing. Times are as in delivery ids.
pub(super) struct LogWindow {
    /// The earliest event time listed.
    lower: String,
    upper: Option<LogUpper>,
    account: String,
    event_type: Option<String>,
}

pub(super) enum LogUpper {
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
    pub(super) fn upper_in(&self, partition: &str) -> String {
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

impl DynamoStore {
    /// A query of one endpoint's log partition between two ids; its filter expression must
    /// include `LOG_PARTITION_FILTER`.
    pub(super) fn log_query(
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
    pub(super) async fn endpoint_log(
        &self,
        account: &AccountId,
        endpoint: &EndpointId,
        from: Option<Timestamp>,
        until: Option<Timestamp>,
        filter: LogFilter,
        consistent: bool,
    ) -> StoreResult<Vec<Item>> {
        let Some((request, condition)) =
            self.endpoint_log_query(account, endpoint, from, until, filter, consistent)
        else {
            return Ok(Vec::new());
        };
        self.query_all(request.filter_expression(condition)).await
    }

    /// The query of [`Self::endpoint_log`], with its filter expression apart (the caller may
    /// add to it, then sets it); `None` for a window that holds nothing.
    pub(super) fn endpoint_log_query(
        &self,
        account: &AccountId,
        endpoint: &EndpointId,
        from: Option<Timestamp>,
        until: Option<Timestamp>,
        filter: LogFilter,
        consistent: bool,
    ) -> Option<(
        aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
        String,
    )> {
        let partition = delivery_log_partition(account, endpoint);
        let lower = delivery_log_position(&partition, from.unwrap_or_else(|| from_millis(0)));
        let upper = match until {
            Some(until) => format!("{}~", delivery_log_position(&partition, until)),
            None => format!("{}~", delivery_log_prefix(&partition)),
        };
        if lower > upper {
            // DynamoDB refuses a BETWEEN whose bounds are the wrong way round.
            return None;
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
        // Past its expiry and not yet deleted by TTL (within days; reads return it until
        // then): gone from the log, and not for a resend to bring back. Pending deliveries
        // carry no expiry.
        if !self.shows_expired {
            condition.push_str(" AND (attribute_not_exists(expires_at) OR expires_at > :now)");
            request =
                request.expression_attribute_values(":now", n(chrono::Utc::now().timestamp()));
        }
        Some((request, condition))
    }

    /// A page of deliveries read from endpoints' log partitions merged newest first (by
    /// event time, then id). Filters on attributes that never change (account, endpoint,
    /// event type) run in the query; status and last status on the items read. A position
    /// (time, id) is a cursor for every partition (`LogWindow::upper_in`).
    pub(super) async fn list_from_partitions(
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
            let (_, id) = cursor::decode(cursor).ok_or(StoreError::NotFound("cursor"))?;
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
        let first = first_page(limit + 1, partitions.len());
        for partition in &mut partitions {
            partition.page = first;
        }
        let mut found: Vec<Delivery> = Vec::new();
        let mut examined = 0usize;
        let mut last_examined: Option<(Timestamp, DeliveryId)> = None;
        while found.len() <= limit && examined < self.list_examine_budget {
            let want = limit + 1 - found.len();
            let mut batch: Vec<Delivery> = Vec::new();
            while batch.len() < want {
                // Made here, run below a bounded number at once (`LOG_READ_CONCURRENCY`);
                // each fills its own partition's buffer, so the merge sees the same in
                // whatever order they finish.
                let fills: Vec<_> = partitions
                    .iter_mut()
                    .filter(|p| p.buffered.is_empty() && !p.exhausted)
                    .map(|p| self.fill_partition(p, &window, want))
                    .collect();
                futures_util::stream::iter(fills)
                    .buffer_unordered(LOG_READ_CONCURRENCY)
                    .try_collect::<()>()
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
                if query.matches(&delivery) {
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
                .map(|d| cursor::encode(to_millis(d.created_at), d.id.as_str()))
        } else if more_to_read {
            // The examine budget ran out: a short page that continues after the last entry
            // examined, so sparse filters cost bounded reads per call.
            last_examined.map(|(at, id)| cursor::encode(to_millis(at), id.as_str()))
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
    pub(super) async fn fill_partition(
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
            .consistent_read(true);
        if let Some(event_type) = &window.event_type {
            request = request.expression_attribute_values(":event_type", s(event_type));
            filters.push("event_type = :event_type");
        }
        // TTL deletes an expired delivery within days, and reads return it until then: the
        // log keeps to the retention. A pending delivery carries no expiry.
        if !self.shows_expired {
            filters.push("(attribute_not_exists(expires_at) OR expires_at > :now)");
            request =
                request.expression_attribute_values(":now", n(chrono::Utc::now().timestamp()));
        }
        request = request.filter_expression(filters.join(" AND "));
        while partition.buffered.is_empty() && !partition.exhausted {
            // No more than the merge still wants from any one partition.
            let page = partition.page.min(want.clamp(1, 500) + 1);
            partition.page = (partition.page * 2).min(MAX_PAGE);
            let out = request
                .clone()
                .limit(i32::try_from(page).unwrap_or(1))
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

    pub(super) async fn get_delivery(
        &self,
        account: &AccountId,
        id: &DeliveryId,
    ) -> StoreResult<Option<Delivery>> {
        Ok(self
            .get_logged_delivery(id)
            .await?
            .filter(|d| &d.account_id == account))
    }

    /// One delivery as the log shows it: none past its expiry (see `fill_partition`).
    pub(super) async fn get_logged_delivery(
        &self,
        id: &DeliveryId,
    ) -> StoreResult<Option<Delivery>> {
        let Some(key) = delivery_key(id) else {
            return Ok(None);
        };
        self.get(&self.tables.deliveries, key)
            .await?
            .filter(|item| self.is_shown(item))
            .map(|item| delivery_from_item(&item))
            .transpose()
    }

    /// Whether a read by id shows `item`: not once past its expiry, which TTL deletes days
    /// later (reads return it until then), unless the store shows expired items.
    pub(super) fn is_shown(&self, item: &Item) -> bool {
        self.shows_expired || expiry(item).is_none_or(|at| at > chrono::Utc::now().timestamp())
    }

    /// The endpoints the account has had whose log partitions may still list something: all
    /// but those deleted so long ago that none of their deliveries can still be shown. Deleting
    /// abandons an endpoint's pending deliveries as of the deletion (and the tombstone keeps
    /// its `failing_shard` until that is done); one that was being tried meanwhile ends by
    /// its last retry at the latest (`Retention::retries` after it); and an ended delivery
    /// is shown for `Retention::deliveries`. Tombstones never expire, so without this an
    /// account's every page would query every endpoint it ever deleted.
    pub(super) async fn endpoints_with_a_log(
        &self,
        account: &AccountId,
    ) -> StoreResult<Vec<EndpointId>> {
        if self.shows_expired {
            return self.endpoint_ids_ever(account).await;
        }
        let items = self
            .query_all(
                self.partition_query(&self.tables.endpoints, "account_id", account.as_str())
                    .projection_expression("id, #deleted, failing_shard")
                    .expression_attribute_names("#deleted", DELETED_AT),
            )
            .await?;
        let shown_for = self.retention.retries + self.retention.deliveries;
        let cutoff = to_millis(crate::clock::sub(chrono::Utc::now(), shown_for));
        let mut ids = Vec::with_capacity(items.len());
        for item in &items {
            let deleted_at = opt_n::<i64>(item, DELETED_AT)?;
            let finished = !item.contains_key("failing_shard");
            if deleted_at.is_some_and(|at| at < cutoff) && finished {
                continue;
            }
            ids.push(EndpointId::from_trusted(get_s(item, "id")?));
        }
        Ok(ids)
    }

    pub(super) async fn list_deliveries(
        &self,
        account: &AccountId,
        query: &DeliveryQuery,
    ) -> StoreResult<Page<Delivery>> {
        let limit = query.limit.clamp(1, 500) as usize;
        let partitions = match &query.endpoint_id {
            Some(endpoint) => vec![LogPartition::new(account, endpoint)],
            // The account's log is the merge of its endpoints' logs, deleted ones included
            // while their deliveries can be shown.
            None => self
                .endpoints_with_a_log(account)
                .await?
                .iter()
                .map(|endpoint| LogPartition::new(account, endpoint))
                .collect(),
        };
        self.list_from_partitions(account, partitions, query, limit)
            .await
    }
}
