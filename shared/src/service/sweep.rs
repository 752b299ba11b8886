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
