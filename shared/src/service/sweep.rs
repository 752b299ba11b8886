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
