//! The sweep: pending deliveries handed to the queue again, after a restart or a lost message.

use std::time::{Duration, Instant};

use super::ServiceResult;
use crate::{
    clock::Timestamp,
    store::{DueCursor, PageAfter, PendingRef},
    App,
};

const PAGE: u32 = 1000;

/// How long the scheduled sweep walks due deliveries: with the unfanned events' recovery
/// before it (60 s at most), well inside the sweeper's 240 s timeout. A backlog larger
/// than one walk is taken oldest first; the rest waits for a later run.
const WALK_BUDGET: Duration = Duration::from_secs(120);

/// The pending deliveries due at or before a time, page by page in due order.
struct PendingPages {
    due_before: Timestamp,
    page: PageAfter<DueCursor>,
    done: bool,
}

impl PendingPages {
    fn new(due_before: Timestamp, limit: u32) -> Self {
        Self {
            due_before,
            page: PageAfter::first(limit),
            done: false,
        }
    }

    /// The next page; `None` once the last has been handed out.
    async fn next(&mut self, app: &App) -> ServiceResult<Option<Vec<PendingRef>>> {
        if self.done {
            return Ok(None);
        }
        let page = app
            .store
            .pending_deliveries(self.due_before, &self.page)
            .await?;
        self.done = page.next.is_none();
        self.page.after = page.next;
        Ok(Some(page.refs))
    }
}

/// Hands every pending delivery due at or before `due_before` to the queue again. The
/// queue ignores the ones it already holds, so this is how a lost message or a restart
/// never loses a delivery. Returns how many were handed over.
pub async fn enqueue_pending(app: &App, due_before: Timestamp) -> ServiceResult<usize> {
    let mut pages = PendingPages::new(due_before, PAGE);
    let mut total = 0;
    while let Some(page) = pages.next(app).await? {
        total += page.len();
        app.queue.enqueue(page).await?;
    }
    Ok(total)
}

/// What one sweep found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Deliveries handed back to the queue (due for longer than the grace period).
    pub requeued: usize,
    /// Deliveries due at `now`, requeued or not: the due backlog (of those walked, when the
    /// walk was cut short).
    pub due: usize,
    /// The earliest due time among them (exact either way: the walk goes oldest first).
    pub oldest_due: Option<Timestamp>,
    /// Whether the walk reached the end of the due deliveries within its time.
    pub complete: bool,
}

/// The scheduled sweep of the AWS shape: re-queues what has been due for longer than `grace`
/// (its message was lost, or its schedule never fired), and measures the due backlog.
pub async fn sweep_overdue(
    app: &App,
    now: Timestamp,
    grace: Duration,
) -> ServiceResult<SweepReport> {
    sweep_overdue_within(app, now, grace, PAGE, WALK_BUDGET).await
}

/// [`sweep_overdue`] in pages of `page`, starting no page once `budget` has passed.
async fn sweep_overdue_within(
    app: &App,
    now: Timestamp,
    grace: Duration,
    page: u32,
    budget: Duration,
) -> ServiceResult<SweepReport> {
    let started = Instant::now();
    let cutoff = now - chrono::TimeDelta::from_std(grace).unwrap_or_default();
    let mut report = SweepReport {
        requeued: 0,
        due: 0,
        oldest_due: None,
        complete: true,
    };
    let mut pages = PendingPages::new(now, page);
    while let Some(page) = pages.next(app).await? {
        report.due += page.len();
        for pending in &page {
            report.oldest_due = Some(match report.oldest_due {
                Some(oldest) if oldest <= pending.due => oldest,
                _ => pending.due,
            });
        }
        let overdue: Vec<_> = page.into_iter().filter(|p| p.due <= cutoff).collect();
        report.requeued += overdue.len();
        if !overdue.is_empty() {
            app.queue.enqueue(overdue).await?;
        }
        if !pages.done && started.elapsed() >= budget {
            report.complete = false;
            tracing::warn!(
                due = report.due,
                requeued = report.requeued,
                "the due backlog is more than one sweep walks: the oldest were re-queued, the rest wait for a later sweep"
            );
            break;
        }
    }
    crate::telemetry::due_backlog(
        report.due,
        report
            .oldest_due
            .and_then(|due| (now - due).to_std().ok())
            .unwrap_or_default(),
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::{
        clock::{add, Clock, ManualClock},
        fixtures,
        queue::embedded::EmbeddedQueue,
        store::{sqlite::SqliteStore, Store},
        telemetry::{self, emf::EmfRecorder},
    };

    #[tokio::test]
    async fn only_deliveries_overdue_past_the_grace_are_requeued_but_all_due_ones_are_measured() {
        let recorder = EmfRecorder::new("Hooklane", Vec::new());
        let _local = metrics::set_default_local_recorder(&recorder);
        let now = add(fixtures::t0(), Duration::from_secs(3600));
        let clock = Arc::new(ManualClock::new(now));
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let queue = Arc::new(EmbeddedQueue::new());
        let app = App {
            queue: queue.clone(),
            ..fixtures::app_on(store.clone(), clock.clone())
        };
        store
            .create_account(&fixtures::account("acme"))
            .await
            .unwrap();
        let endpoint = fixtures::endpoint("acme", "ep_1", fixtures::t0());
        store.create_endpoint(&endpoint).await.unwrap();
        let mut ids = Vec::new();
        // Due an hour ago, a minute ago, and in a minute.
        for (name, due) in [
            ("evt_lost", fixtures::t0()),
            ("evt_recent", now - chrono::TimeDelta::minutes(1)),
            ("evt_future", now + chrono::TimeDelta::minutes(1)),
        ] {
            let event = fixtures::event("acme", name, due);
            let delivery = fixtures::delivery(&event, &endpoint, due);
            ids.push(delivery.id.clone());
            store.publish(&event, &[delivery]).await.unwrap();
        }

        let report = sweep_overdue(&app, clock.now(), Duration::from_secs(300))
            .await
            .unwrap();
        assert_eq!(
            report,
            SweepReport {
                requeued: 1,
                due: 2,
                oldest_due: Some(fixtures::t0()),
                complete: true,
            }
        );
        assert!(queue.is_known(&ids[0]));
        assert!(!queue.is_known(&ids[1]) && !queue.is_known(&ids[2]));
        let documents = recorder.flush(0);
        let gauge = |name: &str| {
            documents
                .iter()
                .find_map(|d| d.get(name).cloned())
                .unwrap_or_else(|| panic!("no {name} in {documents:?}"))
        };
        assert_eq!(gauge(telemetry::DUE_BACKLOG), 2.0);
        assert_eq!(gauge(telemetry::OLDEST_DUE_AGE), 3600.0);
    }

    /// A backlog more than one sweep can walk in its time is walked oldest first as far as
    /// the time allows: the oldest are re-queued, and the report says the walk stopped.
    #[tokio::test]
    async fn a_sweep_out_of_time_requeues_the_oldest_and_says_it_stopped() {
        let now = add(fixtures::t0(), Duration::from_secs(3600));
        let clock = Arc::new(ManualClock::new(now));
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let queue = Arc::new(EmbeddedQueue::new());
        let app = App {
            queue: queue.clone(),
            ..fixtures::app_on(store.clone(), clock.clone())
        };
        let [endpoint] = fixtures::account_with_endpoints(store.as_ref(), "acme", ["ep_1"]).await;
        let mut ids = Vec::new();
        // Five overdue, oldest last in id order.
        for n in 0..5_u64 {
            let due = add(fixtures::t0(), Duration::from_secs(60 * (5 - n)));
            let event = fixtures::event("acme", &format!("evt_{n}"), due);
            let delivery = fixtures::delivery(&event, &endpoint, due);
            ids.push(delivery.id.clone());
            store.publish(&event, &[delivery]).await.unwrap();
        }
        let grace = Duration::from_secs(300);

        let report = sweep_overdue_within(&app, now, grace, 2, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(
            (report.requeued, report.due, report.complete),
            (2, 2, false)
        );
        assert_eq!(
            report.oldest_due,
            Some(add(fixtures::t0(), Duration::from_secs(60)))
        );
        let requeued: Vec<bool> = ids.iter().map(|id| queue.is_known(id)).collect();
        assert_eq!(
            requeued,
            [false, false, false, true, true],
            "the two oldest"
        );

        let report = sweep_overdue_within(&app, now, grace, 2, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!((report.due, report.complete), (5, true));
        assert!(ids.iter().all(|id| queue.is_known(id)));
    }
}
