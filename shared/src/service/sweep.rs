//! The sweep: pending deliveries handed to the queue again, after a restart or a lost message.

use super::ServiceResult;
use crate::{
    clock::Timestamp,
    domain::DeliveryId,
    store::{PageAfter, PendingRef},
    App,
};

const PAGE: u32 = 1000;

/// The pending deliveries due at or before a time, page by page in id order.
struct PendingPages {
    due_before: Timestamp,
    page: PageAfter<DeliveryId>,
    done: bool,
}

impl PendingPages {
    fn new(due_before: Timestamp) -> Self {
        Self {
            due_before,
            page: PageAfter {
                after: None,
                limit: PAGE,
            },
            done: false,
        }
    }

    /// The next page; `None` once a short page has been handed out.
    async fn next(&mut self, app: &App) -> ServiceResult<Option<Vec<PendingRef>>> {
        if self.done {
            return Ok(None);
        }
        let page = app
            .store
            .pending_deliveries(self.due_before, &self.page)
            .await?;
        self.done = page.len() < self.page.limit as usize;
        self.page.after = page.last().map(|last| last.delivery_id.clone());
        Ok(self.page.after.is_some().then_some(page))
    }
}

/// Hands every pending delivery due at or before `due_before` to the queue again. The
/// queue ignores the ones it already holds, so this is how a lost message or a restart
/// never loses a delivery. Returns how many were handed over.
pub async fn enqueue_pending(app: &App, due_before: Timestamp) -> ServiceResult<usize> {
    let mut pages = PendingPages::new(due_before);
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
    /// Deliveries due at `now`, requeued or not: the due backlog.
    pub due: usize,
    /// The earliest due time among them.
    pub oldest_due: Option<Timestamp>,
}

/// The scheduled sweep of the AWS shape: re-queues what has been due for longer than `grace`
/// (its message was lost, or its schedule never fired), and measures the whole due backlog.
pub async fn sweep_overdue(
    app: &App,
    now: Timestamp,
    grace: std::time::Duration,
) -> ServiceResult<SweepReport> {
    let cutoff = now - chrono::TimeDelta::from_std(grace).unwrap_or_default();
    let mut report = SweepReport {
        requeued: 0,
        due: 0,
        oldest_due: None,
    };
    let mut pages = PendingPages::new(now);
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
}
