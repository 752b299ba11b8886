//! The AWS notifier: mail to the account owner through SES (v2).

use async_trait::async_trait;
use aws_sdk_sesv2::{
    error::ProvideErrorMetadata,
    types::{Body, Content, Destination, EmailContent, Message},
};

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
        .map_err(|e| NotifyError::Permanent(e.to_string()))
}

/// SendEmail's error codes for this message as it is, which SES will refuse however often it
/// is sent: `MessageRejected` (its content, or in the sandbox a recipient not verified).
/// Everything else is temporary: throttling, and what is wrong with the sending set-up as a
/// whole (a paused or suspended account, an unverified MAIL FROM domain, a denied role, and
/// `BadRequestException`/`InvalidParameterValue`, an address SES cannot read: the recipient
/// was checked when the account was made, so that is most likely our From), which the
/// operator fixes and after which the mail should go.
const REFUSED_FOR_GOOD: &[&str] = &["MessageRejected"];

/// Sorts an SES refusal into permanent or temporary (see [`REFUSED_FOR_GOOD`]).
fn refusal(code: Option<&str>, message: Option<&str>, from: &str, text: String) -> NotifyError {
    // SES also answers `MessageRejected` when our From identity is not verified (yet),
    // naming it: that is the set-up, not this mail.
    let names_from = message.is_some_and(|m| {
        m.to_ascii_lowercase()
            .contains(&address_of(from).to_ascii_lowercase())
    });
    if code.is_some_and(|c| REFUSED_FOR_GOOD.contains(&c)) && !names_from {
        NotifyError::Permanent(text)
    } else {
        // Every other refusal of SES's is of the sending as a whole, not of this mail.
        NotifyError::Unavailable(text)
    }
}

/// The address of a From that may be written `Name <address>`.
fn address_of(from: &str) -> &str {
    from.rsplit_once('<')
        .and_then(|(_, rest)| rest.split_once('>'))
        .map_or(from, |(address, _)| address)
        .trim()
}

#[async_trait]
impl Notifier for SesNotifier {
    async fn send(&self, n: &Notification) -> Result<(), NotifyError> {
        // SES takes only ASCII addresses. The API refuses others; one stored before it did
        // is refused here without asking.
        if !n.recipient.as_str().is_ascii() {
            return Err(NotifyError::Permanent(format!(
                "recipient {}: SES sends only to ASCII addresses",
                n.recipient.as_str()
            )));
        }
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
            .map_err(|e| refusal(e.code(), e.message(), &self.from, error_text(&e)))?;
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

        // An address SES cannot read is most likely our From (recipients are checked when
        // their account is made), and an unverified From is ours to fix: the mail is tried
        // again once it is.
        let nowhere = Notification {
            recipient: crate::domain::EmailAddress::from_trusted("nobody".into()),
            ..notification.clone()
        };
        let refused = notifier.send(&nowhere).await;
        assert!(
            matches!(refused, Err(NotifyError::Unavailable(_))),
            "{refused:?}"
        );
        let unverified = SesNotifier::new(
            aws_sdk_sesv2::Client::new(&crate::aws::load_sdk_config().await),
            "nobody-verified-this@example.net",
        );
        let refused = unverified.send(&notification).await;
        assert!(
            matches!(refused, Err(NotifyError::Unavailable(_))),
            "{refused:?}"
        );
    }

    #[test]
    fn refusals_of_this_mail_are_permanent_and_of_the_set_up_temporary() {
        let from = "Hooklane <hooklane@example.com>";
        let kind = |code: Option<&str>, message: &str| {
            refusal(code, Some(message), from, String::new()).is_permanent()
        };
        let recipient = "Email address is not verified. The following identities failed the \
                         check in region EU-WEST-1: owner@acme.example";
        assert!(kind(Some("MessageRejected"), recipient));
        // An address SES cannot read: most likely our From, a set-up to mend.
        assert!(!kind(
            Some("BadRequestException"),
            "Missing final '@domain'"
        ));
        assert!(!kind(Some("InvalidParameterValue"), "Missing domain"));
        let sender = "Email address is not verified. The following identities failed the \
                      check in region EU-WEST-1: HOOKLANE@example.com, owner@acme.example";
        assert!(!kind(Some("MessageRejected"), sender), "our From");
        for code in [
            "TooManyRequestsException",
            "SendingPausedException",
            "AccountSuspendedException",
            "MailFromDomainNotVerifiedException",
            "NotFoundException",
            "LimitExceededException",
            "AccessDeniedException",
        ] {
            assert!(!kind(Some(code), "…"), "{code}");
        }
        assert!(!kind(None, "dispatch failure"), "no answer");
    }

    #[tokio::test]
    async fn a_non_ascii_recipient_is_refused_for_good_without_asking_ses() {
        let config = aws_sdk_sesv2::Config::builder()
            .behavior_version(aws_sdk_sesv2::config::BehaviorVersion::latest())
            .region(aws_sdk_sesv2::config::Region::new("eu-west-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        let notifier = SesNotifier::new(aws_sdk_sesv2::Client::from_conf(config), "a@b.example");
        let notification = Notification {
            id: "ntf_1".into(),
            account_id: crate::domain::AccountId::parse("acme").unwrap(),
            recipient: crate::domain::EmailAddress::from_trusted("jörg@example.com".into()),
            subject: "s".into(),
            body: "b".into(),
            created_at: fixtures::t0(),
        };
        let refused = notifier.send(&notification).await;
        assert!(
            matches!(refused, Err(NotifyError::Permanent(_))),
            "{refused:?}"
        );
    }
}
