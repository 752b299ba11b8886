//! The Notifier port: telling an account owner that something needs them.

use async_trait::async_trait;

use crate::store::Notification;

#[cfg(feature = "aws")]
pub mod ses;
pub mod smtp;

#[derive(Debug, thiserror::Error)]
#[error("notification not sent: {0}")]
pub struct NotifyError(pub String);

#[async_trait]
pub trait Notifier: Send + Sync + 'static {
    async fn send(&self, notification: &Notification) -> Result<(), NotifyError>;
}

/// Writes notifications to the log: the embedded default when no mail server is configured.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogNotifier;

#[async_trait]
impl Notifier for LogNotifier {
    async fn send(&self, n: &Notification) -> Result<(), NotifyError> {
        tracing::warn!(
            notification.id = %n.id,
            account.id = %n.account_id,
            recipient = %n.recipient.as_str(),
            subject = %n.subject,
            body = %n.body,
            "owner notification"
        );
        Ok(())
    }
}
