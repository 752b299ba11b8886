//! The Notifier port: telling an account owner that something needs them.

use async_trait::async_trait;

use crate::store::Notification;

#[cfg(feature = "aws")]
pub mod ses;
pub mod smtp;

/// Why a notification was not sent, as far as the mail service tells: the sender retries a
/// temporary failure for a while and gives up a permanent one at once.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// Refused for good (the address, the message): sending it again gets the same answer.
    #[error("notification refused for good: {0}")]
    Permanent(String),
    /// This mail may go through later (its mailbox busy or full): the others may go now.
    #[error("notification not sent: {0}")]
    Temporary(String),
    /// No mail can go now: the service unreachable, silent or throttling, or our own sending
    /// set-up, which the operator can fix. This one and the rest go later.
    #[error("notification not sent (the mail service is unavailable): {0}")]
    Unavailable(String),
}

impl NotifyError {
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Permanent(_))
    }
}

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
