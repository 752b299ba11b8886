//! Pages the store's pending deliveries into the embedded queue's bounded window.
//!
//! The window ([`EmbeddedQueue`]) keeps the earliest-due deliveries that are not yet due
//! and a bounded lane of due work per endpoint. What did not fit is still pending in the
//! store; this loop reads it back when the window asks: a spilled endpoint's next rows
//! once its lane runs low, and the next page in due order from the window's horizon.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use tokio::sync::watch;

use super::embedded::{DueKey, EmbeddedQueue};
use crate::{
    clock::{Clock, Timestamp},
    domain::EndpointId,
    store::{PendingRef, StoreResult},
};

/// Where the window reads pending work: the embedded store.
#[async_trait]
pub trait PendingSource: Send + Sync + 'static {
    /// Pending deliveries of active endpoints with a due key at or after `from`, in due
    /// order (due time, then id).
    async fn pending_from(&self, from: &DueKey, limit: u32) -> StoreResult<Vec<PendingRef>>;
    /// One active endpoint's pending deliveries due at or before `due_before`, in due order.
    async fn pending_of_endpoint(
        &self,
        endpoint: &EndpointId,
        due_before: Timestamp,
        limit: u32,
    ) -> StoreResult<Vec<PendingRef>>;
}

/// Rows of one page from the horizon: a read of this size takes the reader connection for
/// milliseconds, not the API's reads for the length of a large page.
const MAX_PAGE: usize = 5_000;
/// Spilled endpoints refilled in one pass.
const ENDPOINTS_PER_PASS: usize = 256;
/// A pass runs at least this often, whether asked or not (a due horizon needs no signal).
const IDLE_PASS: Duration = Duration::from_millis(250);
/// Between passes that found work: the reader connection is shared with the API's reads.
const BUSY_PAUSE: Duration = Duration::from_millis(2);

/// What one pass read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub endpoints: usize,
    pub rows: usize,
    /// Rows of the horizon's page the window kept. A page that keeps nothing (every lane it
    /// reached is full: an outage) is not followed by the next at once.
    pub kept: usize,
}

/// One pass: refills the spilled lanes that ran low, then reads the next page from the
/// horizon if one is wanted.
pub async fn refill(
    queue: &EmbeddedQueue,
    source: &dyn PendingSource,
    now: Timestamp,
) -> StoreResult<Pass> {
    let mut pass = Pass::default();
    for (endpoint, limit) in queue.spilled_to_refill(ENDPOINTS_PER_PASS) {
        match source.pending_of_endpoint(&endpoint, now, limit).await {
            Ok(rows) => {
                pass.endpoints += 1;
                pass.rows += rows.len();
                // A full read may have left rows behind: the lane asks again when it runs
                // low. Otherwise the rest of a burst waited for the periodic resync.
                let full = rows.len() >= limit as usize;
                queue.add(rows);
                if full {
                    queue.respill(endpoint);
                }
            }
            Err(error) => {
                queue.respill(endpoint);
                return Err(error);
            }
        }
    }
    if let Some(from) = queue.next_page_from(now) {
        // Two rows at least: a page starts at the last one's key, and one row that is known
        // already (leased, or held after a send it could not record) would be read for ever.
        let page = u32::try_from((queue.limits().waiting / 2).min(MAX_PAGE))
            .unwrap_or(u32::MAX)
            .max(2);
        let rows = source.pending_from(&from, page).await?;
        let end = (rows.len() >= page as usize)
            .then(|| {
                rows.last()
                    .map(|r| (crate::clock::to_millis(r.due), r.delivery_id.clone()))
            })
            .flatten();
        pass.rows += rows.len();
        pass.kept = queue.add_page(rows, end, now);
    }
    Ok(pass)
}

/// Runs passes until shutdown: when the window asks, and every [`IDLE_PASS`] regardless.
pub async fn run(
    queue: Arc<EmbeddedQueue>,
    source: Arc<dyn PendingSource>,
    clock: Arc<dyn Clock>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        match refill(&queue, source.as_ref(), clock.now()).await {
            Ok(pass) if pass.kept > 0 || pass.endpoints > 0 => {
                tokio::time::sleep(BUSY_PAUSE).await;
                continue;
            }
            // Read but kept nothing: the lanes it reached are full. Asking again at once
            // would only read the same rows; wait a pass (the workers ask on every take).
            Ok(pass) if pass.rows > 0 => {
                tokio::select! {
                    () = tokio::time::sleep(IDLE_PASS) => {}
                    _ = shutdown.changed() => break,
                }
                continue;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::error!(%error, "cannot read pending deliveries into the queue; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        tokio::select! {
            () = queue.refill_requested() => {}
            () = tokio::time::sleep(IDLE_PASS) => {}
            _ = shutdown.changed() => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, sync::Mutex};

    use super::*;
    use crate::{
        clock::{from_millis, to_millis},
        domain::{AccountId, DeliveryId},
        queue::embedded::WindowLimits,
    };

    /// The store's pending rows, in due order, as the two queries see them.
    #[derive(Default)]
    struct Backlog(Mutex<BTreeMap<DueKey, PendingRef>>);

    impl Backlog {
        fn put(&self, item: PendingRef) {
            let key = (to_millis(item.due), item.delivery_id.clone());
            let mut rows = self.0.lock().unwrap();
            rows.retain(|_, r| r.delivery_id != item.delivery_id);
            rows.insert(key, item);
        }

        /// The delivery ended: it is no longer pending.
        fn finish(&self, item: &PendingRef) {
            let mut rows = self.0.lock().unwrap();
            rows.retain(|_, r| r.delivery_id != item.delivery_id);
        }

        fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
    }

    #[async_trait]
    impl PendingSource for Backlog {
        async fn pending_from(&self, from: &DueKey, limit: u32) -> StoreResult<Vec<PendingRef>> {
            let rows = self.0.lock().unwrap();
            Ok(rows
                .range(from.clone()..)
                .take(limit as usize)
                .map(|(_, r)| r.clone())
                .collect())
        }

        async fn pending_of_endpoint(
            &self,
            endpoint: &EndpointId,
            due_before: Timestamp,
            limit: u32,
        ) -> StoreResult<Vec<PendingRef>> {
            let rows = self.0.lock().unwrap();
            Ok(rows
                .values()
                .filter(|r| &r.endpoint_id == endpoint && r.due <= due_before)
                .take(limit as usize)
                .cloned()
                .collect())
        }
    }

    fn item(id: String, endpoint: &str, due_ms: i64, cap: u32) -> PendingRef {
        PendingRef {
            delivery_id: DeliveryId::from_trusted(id),
            endpoint_id: EndpointId::from_trusted(endpoint.into()),
            account_id: AccountId::from_trusted(format!("acct-{endpoint}")),
            due: from_millis(due_ms),
            max_in_flight: cap,
            rate_limit_per_second: None,
        }
    }

    const SMALL: WindowLimits = WindowLimits {
        waiting: 20,
        due: 30,
        refill: 10,
        lane_floor: 3,
    };

    /// What the window holds may never pass its limits (plus what is in flight).
    fn assert_bounded(queue: &EmbeddedQueue, endpoints: usize) {
        let stats = queue.stats();
        assert!(stats.waiting <= SMALL.waiting, "{stats:?}");
        assert!(
            stats.due <= SMALL.due + endpoints * SMALL.lane_floor,
            "{stats:?}"
        );
    }

    #[tokio::test]
    async fn a_backlog_many_times_the_window_is_sent_whole_with_retries_crowding_it() {
        let store = Backlog::default();
        // 600 rows over 6 endpoints, due over 6 s, none in memory yet (a restart).
        for i in 0..600 {
            store.put(item(format!("d{i:04}"), &format!("e{}", i % 6), i * 10, 4));
        }
        let queue = EmbeddedQueue::with_limits(SMALL);
        queue.resync();
        let mut sent: Vec<PendingRef> = Vec::new();
        let mut retried = std::collections::HashSet::new();
        let mut now = 0;
        while store.len() > 0 && now < 20_000 {
            refill(&queue, &store, from_millis(now)).await.unwrap();
            assert_bounded(&queue, 6);
            while let Some(lease) = queue.try_take(from_millis(now)) {
                assert!(to_millis(lease.due) <= now, "taken before its time");
                queue.complete(&lease, from_millis(now));
                // Four in ten deliveries fail its first try and is due again in 2 s: the
                // retries crowd the waiting list and push later rows out of memory.
                if lease.delivery_id.as_str().ends_with(['0', '3', '6', '9'])
                    && retried.insert(lease.delivery_id.clone())
                {
                    let again = PendingRef {
                        due: from_millis(now + 2_000),
                        ..lease
                    };
                    store.put(again.clone());
                    queue.add(vec![again]);
                    continue;
                }
                store.finish(&lease);
                sent.push(lease);
            }
            now += 5;
        }
        assert_eq!(sent.len(), 600, "every pending row was sent, in {now} ms");
        assert_eq!(retried.len(), 240);
        let mut ids: Vec<_> = sent.iter().map(|l| l.delivery_id.clone()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 600, "and none twice");
    }

    #[tokio::test]
    async fn a_healthy_endpoint_is_not_held_up_by_a_spilled_backlog() {
        let store = Backlog::default();
        // Ten endpoints with 200 due rows each, answering nothing (never completed).
        for i in 0..2_000 {
            store.put(item(
                format!("f{i:05}"),
                &format!("failing{}", i % 10),
                0,
                2,
            ));
        }
        let queue = EmbeddedQueue::with_limits(SMALL);
        queue.resync();
        for _ in 0..200 {
            if refill(&queue, &store, from_millis(0)).await.unwrap() == Pass::default() {
                break;
            }
            assert_bounded(&queue, 10);
        }
        let stuck: Vec<_> = std::iter::from_fn(|| queue.try_take(from_millis(0))).collect();
        assert_eq!(stuck.len(), 20, "each failing endpoint at its cap of 2");
        // A publish for a healthy endpoint goes straight to its lane.
        let fresh = item("h1".into(), "healthy", 1, 4);
        store.put(fresh.clone());
        queue.add(vec![fresh]);
        let taken = queue
            .try_take(from_millis(1))
            .expect("the healthy delivery");
        assert_eq!(taken.delivery_id.as_str(), "h1");
        assert_bounded(&queue, 11);
    }

    /// 100 due rows of one endpoint (cap 100) in the store, none in memory yet.
    fn one_busy_endpoint() -> (Backlog, EmbeddedQueue) {
        let store = Backlog::default();
        for i in 0..100 {
            store.put(item(format!("d{i:03}"), "busy", 0, 100));
        }
        let queue = EmbeddedQueue::with_limits(SMALL);
        queue.resync();
        (store, queue)
    }

    #[tokio::test]
    async fn a_spilled_lane_that_runs_low_is_refilled_from_the_store() {
        let (store, queue) = one_busy_endpoint();
        while refill(&queue, &store, from_millis(0)).await.unwrap() != Pass::default() {}
        let first: Vec<_> = std::iter::from_fn(|| queue.try_take(from_millis(0))).collect();
        assert_eq!(first.len(), SMALL.due, "as much as the window holds");
        for lease in &first {
            store.finish(lease);
            queue.complete(lease, from_millis(0));
        }
        let pass = refill(&queue, &store, from_millis(0)).await.unwrap();
        assert_eq!(pass.endpoints, 1, "{pass:?}");
        let next: Vec<_> = std::iter::from_fn(|| queue.try_take(from_millis(0))).collect();
        assert_eq!(next.len(), SMALL.refill, "one refill's rows");
        assert!(next.iter().all(|l| !first.contains(l)));
    }

    #[tokio::test]
    async fn a_spilled_backlog_longer_than_one_refill_is_read_to_its_end() {
        // The end of a burst: 100 due rows of one endpoint, ten refills' worth, and no
        // publish after them to mark the lane spilled again. Nothing here resyncs.
        let (store, queue) = one_busy_endpoint();
        let mut sent = 0;
        for _ in 0..50 {
            while refill(&queue, &store, from_millis(0)).await.unwrap() != Pass::default() {}
            let taken: Vec<_> = std::iter::from_fn(|| queue.try_take(from_millis(0))).collect();
            for lease in &taken {
                store.finish(lease);
                queue.complete(lease, from_millis(0));
            }
            sent += taken.len();
        }
        assert_eq!(
            sent,
            100,
            "every row sent; {} left in the store",
            store.len()
        );
    }

    #[tokio::test]
    async fn bursts_past_the_window_are_sent_whole_without_a_resync() {
        // Publishes come in bursts to four endpoints, faster than they are taken, until the
        // backlog is dozens of windows deep; then they stop and the backlog drains. Only
        // the start resyncs: the periodic backstop never runs here.
        let store = Backlog::default();
        let queue = EmbeddedQueue::with_limits(SMALL);
        queue.resync();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = move |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let (mut published, mut sent) = (0, std::collections::HashSet::new());
        for round in 0..600 {
            let now = round * 5;
            if round < 200 {
                // Fewer than the waiting list holds between two passes: the burst's rows
                // reach the store only by spilling from full lanes.
                for _ in 0..random(SMALL.waiting as u64) {
                    let fresh = item(
                        format!("p{published:05}"),
                        &format!("e{}", random(4)),
                        now,
                        4,
                    );
                    store.put(fresh.clone());
                    queue.add(vec![fresh]);
                    published += 1;
                }
            }
            refill(&queue, &store, from_millis(now)).await.unwrap();
            for _ in 0..random(12) {
                let Some(lease) = queue.try_take(from_millis(now)) else {
                    break;
                };
                store.finish(&lease);
                queue.complete(&lease, from_millis(now));
                assert!(sent.insert(lease.delivery_id.clone()), "sent twice");
            }
            assert_bounded(&queue, 4);
        }
        assert!(published > 1_500, "{published}");
        assert_eq!(sent.len(), published, "{} left in the store", store.len());
    }
}
