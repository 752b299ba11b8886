use super::ServiceResult;
use crate::App;

/// Sends queued owner notifications; a failed one stays queued for the next pass.
pub async fn flush(app: &App) -> ServiceResult<usize> {
    let mut sent = 0;
    for notification in app.store.unsent_notifications(100).await? {
        match app.notifier.send(&notification).await {
            Ok(()) => {
                app.store
                    .mark_notification_sent(&notification.id, app.clock.now())
                    .await?;
                sent += 1;
            }
            Err(error) => {
                tracing::warn!(notification.id = %notification.id, %error, "notification not sent; will retry");
            }
        }
    }
    Ok(sent)
}
