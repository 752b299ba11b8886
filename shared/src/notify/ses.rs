//! The AWS notifier: mail to the account owner through SES (v2).

use async_trait::async_trait;
use aws_sdk_sesv2::types::{Body, Content, Destination, EmailContent, Message};

use super::{Notifier, NotifyError};
use crate::{aws::error_text, store::Notification};

pub struct SesNotifier {
    client: aws_sdk_sesv2::Client,
    /// A verified SES identity.
    from: String,
}

impl SesNotifier {
    pub fn new(client: aws_sdk_sesv2::Client, from: impl Into<String>) -> Self {
        Self {
            client,
            from: from.into(),
        }
    }
}

fn text(data: &str) -> Result<Content, NotifyError> {
    Content::builder()
        .data(data)
        .charset("UTF-8")
        .build()
        .map_err(|e| NotifyError(e.to_string()))
}

#[async_trait]
impl Notifier for SesNotifier {
    async fn send(&self, n: &Notification) -> Result<(), NotifyError> {
        let message = Message::builder()
            .subject(text(&n.subject)?)
            .body(Body::builder().text(text(&n.body)?).build())
            .build();
        self.client
            .send_email()
            .from_email_address(&self.from)
            .destination(
                Destination::builder()
                    .to_addresses(n.recipient.as_str())
                    .build(),
            )
            .content(EmailContent::builder().simple(message).build())
            .send()
            .await
            .map_err(|e| NotifyError(error_text(&e)))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[tokio::test]
    async fn owner_mail_goes_out_through_ses() {
        let _ = crate::testing::emulator_client().await;
        let client = aws_sdk_sesv2::Client::new(&crate::aws::load_sdk_config().await);
        let from = format!("hooklane-{}@example.com", uuid::Uuid::new_v4().simple());
        client
            .create_email_identity()
            .email_identity(&from)
            .send()
            .await
            .unwrap();
        let notifier = SesNotifier::new(client, &from);
        let subject = format!("Webhook endpoint disabled {}", uuid::Uuid::new_v4());
        let notification = Notification {
            id: "ntf_1".into(),
            account_id: crate::domain::AccountId::parse("acme").unwrap(),
            recipient: crate::domain::EmailAddress::parse("owner@example.com").unwrap(),
            subject: subject.clone(),
            body: "We disabled your endpoint.".into(),
            created_at: fixtures::t0(),
        };
        notifier.send(&notification).await.unwrap();
        let sent = crate::testing::sent_mail_text().await;
        assert!(sent.contains(&subject), "the mail is not in the emulator");
        assert!(sent.contains("owner@example.com"));

        let unverified = SesNotifier::new(
            aws_sdk_sesv2::Client::new(&crate::aws::load_sdk_config().await),
            "nobody-verified-this@example.net",
        );
        assert!(unverified.send(&notification).await.is_err());
    }
}
