//! Owner mail through an SMTP relay.

use std::time::Duration;

use async_trait::async_trait;
use lettre::{
    message::{header::ContentType, Mailbox},
    AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor,
};

use super::{Notifier, NotifyError};
use crate::store::Notification;

#[derive(Debug, thiserror::Error)]
pub enum SmtpConfigError {
    #[error("HOOKLANE_SMTP_URL: {0}")]
    Url(String),
    #[error("HOOKLANE_SMTP_FROM: `{0}` is not a mailbox like Hooklane <hooklane@example.com>")]
    From(String),
}

pub struct SmtpNotifier {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// How long one mail may take, end to end. The transport's own timeout covers the
    /// connection only: a relay that accepts and then says nothing would hold the mail
    /// loop, and the health check's disables behind it, for ever.
    send_timeout: Duration,
}

/// [`SmtpNotifier::send_timeout`]'s default.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

impl SmtpNotifier {
    /// `url` as lettre reads it: `smtp://host:25` (plain), `smtp://host:587?tls=required`
    /// (STARTTLS) or `smtps://user:pass@host:465` (TLS).
    pub fn new(url: &str, from: &str) -> Result<Self, SmtpConfigError> {
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map_err(|e| SmtpConfigError::Url(e.to_string()))?
            .timeout(Some(Duration::from_secs(15)))
            .build();
        let from = from
            .parse()
            .map_err(|_| SmtpConfigError::From(from.to_owned()))?;
        Ok(Self {
            transport,
            from,
            send_timeout: SEND_TIMEOUT,
        })
    }
}

#[async_trait]
impl Notifier for SmtpNotifier {
    async fn send(&self, n: &Notification) -> Result<(), NotifyError> {
        let to: Mailbox = n.recipient.as_str().parse().map_err(|e| {
            NotifyError::Permanent(format!("recipient {}: {e}", n.recipient.as_str()))
        })?;
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(&n.subject)
            .header(ContentType::TEXT_PLAIN)
            .body(n.body.clone())
            .map_err(|e| NotifyError::Permanent(e.to_string()))?;
        let sent = tokio::time::timeout(self.send_timeout, self.transport.send(message))
            .await
            .map_err(|_| {
                NotifyError::Unavailable(format!(
                    "SMTP: the relay did not finish within {} s",
                    self.send_timeout.as_secs_f32()
                ))
            })?;
        sent.map_err(|e| {
            let text = format!("SMTP: {e}");
            let code = e.status().map(u16::from);
            if refused_for_good(code, e.is_permanent(), &text) {
                NotifyError::Permanent(text)
            } else if refuses_every_mail(code, &text) {
                NotifyError::Unavailable(text)
            } else {
                NotifyError::Temporary(text)
            }
        })?;
        tracing::info!(notification.id = %n.id, recipient = %n.recipient.as_str(), "owner notified by mail");
        Ok(())
    }
}

/// The relay refuses the mail for good when it says the mailbox is wrong (RFC 5321: 550
/// unavailable, 551 not local, 553 name not allowed), unless its enhanced status is one of
/// policy or security (5.7.x: relaying denied, our sender refused), which the operator fixes.
/// Any other 5xx (our login, 554 "transaction failed" and the like), a 4xx, or no answer (the
/// relay unreachable) may go through later, until the mail is given up for its age.
fn refused_for_good(code: Option<u16>, permanent: bool, text: &str) -> bool {
    permanent && matches!(code, Some(550 | 551 | 553)) && !text.contains(" 5.7.")
}

/// What stops every mail, not this one: no answer at all (unreachable, TLS), the service
/// closing (421), our login (530, 535) or a policy refusal of our relaying or sender (5.7.x).
fn refuses_every_mail(code: Option<u16>, text: &str) -> bool {
    matches!(code, None | Some(421 | 530 | 535)) || text.contains(" 5.7.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AccountId, EmailAddress};
    use tokio::{
        io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
        net::TcpListener,
    };

    /// Just enough of an SMTP server to accept one message; returns what was sent.
    async fn one_message_server() -> (u16, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let (read, mut write) = socket.into_split();
            let mut lines = BufReader::new(read).lines();
            let mut transcript = String::new();
            write.write_all(b"220 test ESMTP\r\n").await.unwrap();
            let mut in_data = false;
            while let Ok(Some(line)) = lines.next_line().await {
                transcript.push_str(&line);
                transcript.push('\n');
                let reply: &[u8] = if in_data {
                    if line == "." {
                        in_data = false;
                        b"250 queued\r\n"
                    } else {
                        continue;
                    }
                } else if line.starts_with("EHLO") || line.starts_with("HELO") {
                    b"250 test\r\n"
                } else if line.starts_with("DATA") {
                    in_data = true;
                    b"354 go on\r\n"
                } else if line.starts_with("QUIT") {
                    write.write_all(b"221 bye\r\n").await.unwrap();
                    break;
                } else {
                    b"250 ok\r\n"
                };
                write.write_all(reply).await.unwrap();
            }
            transcript
        });
        (port, handle)
    }

    #[tokio::test]
    async fn sends_the_owner_mail() {
        let (port, server) = one_message_server().await;
        let notifier = SmtpNotifier::new(
            &format!("smtp://127.0.0.1:{port}"),
            "Hooklane <hooklane@example.com>",
        )
        .unwrap();
        let notification = Notification {
            id: "ntf_1".into(),
            account_id: AccountId::from_trusted("acme".into()),
            recipient: EmailAddress::parse("owner@acme.example").unwrap(),
            subject: "Webhook endpoint disabled: https://acme.example/hooks".into(),
            body: "We disabled your endpoint.".into(),
            created_at: chrono::Utc::now(),
        };
        notifier.send(&notification).await.unwrap();
        drop(notifier);
        let transcript = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
        assert!(
            transcript.contains("RCPT TO:<owner@acme.example>"),
            "{transcript}"
        );
        assert!(
            transcript.contains("Subject: Webhook endpoint disabled"),
            "{transcript}"
        );
        assert!(
            transcript.contains("We disabled your endpoint."),
            "{transcript}"
        );
    }

    /// A relay that takes the connection and never says a word: the mail fails for now,
    /// within the send timeout, and the loop goes on with the next one.
    #[tokio::test]
    async fn a_relay_that_never_answers_fails_the_mail_for_now() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(socket);
        });
        let mut notifier = SmtpNotifier::new(
            &format!("smtp://127.0.0.1:{port}"),
            "Hooklane <hooklane@example.com>",
        )
        .unwrap();
        notifier.send_timeout = Duration::from_millis(500);
        let notification = Notification {
            id: "ntf_1".into(),
            account_id: AccountId::from_trusted("acme".into()),
            recipient: EmailAddress::parse("owner@acme.example").unwrap(),
            subject: "s".into(),
            body: "b".into(),
            created_at: chrono::Utc::now(),
        };
        let outcome = tokio::time::timeout(Duration::from_secs(20), notifier.send(&notification))
            .await
            .expect("the send never ended");
        assert!(
            matches!(&outcome, Err(NotifyError::Unavailable(text)) if text.contains("did not finish")),
            "{outcome:?}"
        );
        silent.abort();
    }

    #[test]
    fn a_refusal_for_good_is_a_5xx_not_about_the_login() {
        let said = |text: &str| format!("SMTP: permanent error ({text})");
        assert!(
            refused_for_good(Some(550), true, &said("550): 5.1.1 No such user")),
            "mailbox unavailable"
        );
        assert!(
            refused_for_good(Some(553), true, &said("553): mailbox name not allowed")),
            "mailbox name not allowed"
        );
        let relay = said("550): 5.7.1 Relay access denied");
        assert!(!refused_for_good(Some(550), true, &relay), "our relaying");
        let sender = said("554): 5.7.1 Sender address rejected");
        assert!(!refused_for_good(Some(554), true, &sender), "our sender");
        assert!(
            !refused_for_good(Some(535), true, "auth"),
            "our credentials"
        );
        assert!(!refused_for_good(Some(450), false, "busy"), "mailbox busy");
        assert!(!refused_for_good(None, false, ""), "no answer");
    }

    #[test]
    fn bad_configuration_is_named() {
        assert!(matches!(
            SmtpNotifier::new("ftp://x", "a@b.co"),
            Err(SmtpConfigError::Url(_))
        ));
        assert!(matches!(
            SmtpNotifier::new("smtp://127.0.0.1:25", "not a mailbox"),
            Err(SmtpConfigError::From(_))
        ));
    }
}
