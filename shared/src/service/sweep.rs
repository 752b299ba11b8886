use super::ServiceResult;
use crate::{clock::Timestamp, App};

const PAGE: u32 = 1000;

/// Hands every pending delivery due at or before `due_before` to the queue again. The
/// queue ignores the ones it already holds, so this is how a lost message or a restart
/// never loses a delivery. Returns how many were handed over.
pub async fn enqueue_pending(app: &App, due_before: Timestamp) -> ServiceResult<usize> {
    let mut after = None;
    let mut total = 0;
    loop {
        let page = app
            .store
            .pending_deliveries(due_before, after.as_ref(), PAGE)
            .await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some(last.delivery_id.clone());
        total += page.len();
        let full = page.len() == PAGE as usize;
        app.queue.enqueue(page).await?;
        if !full {
            break;
        }
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
    let mut after = None;
    loop {
        let page = app
            .store
            .pending_deliveries(now, after.as_ref(), PAGE)
            .await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some(last.delivery_id.clone());
        let full = page.len() == PAGE as usize;
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
        if !full {
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
