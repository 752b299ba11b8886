//! Moving dead letters back (`hooklane dlq redrive`): once the cause of a message's failures
//! is fixed, the messages of the delivery queue's dead-letter queue go back to the queue.
//!
//! SQS's own `StartMessageMoveTask` does the same on AWS; this is the same move done with
//! receive, send and delete, so it also runs against an emulator and needs no more than
//! `sqs:ReceiveMessage`/`sqs:DeleteMessage` on the dead-letter queue and `sqs:SendMessage`
//! on the queue. A message is deleted only after its copy was sent: a move cut short leaves
//! at worst a message in both queues, which the sender handles once (a delivery's second
//! copy is dropped), never one in neither.

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

use super::{clients::answer_wait_after, error_text};

/// How long a receive waits for a message to come: its answer begins only after that.
const RECEIVE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Each request's tries wait for their answer as the functions' do, after `wait` (a receive's
/// long poll), so that a redrive whose answer never comes stops with an error rather than
/// hanging the command. Set per request: the client is the caller's.
fn waiting(wait: std::time::Duration) -> aws_sdk_sqs::config::Builder {
    aws_sdk_sqs::config::Builder::default().timeout_config(answer_wait_after(wait))
}

/// What one redrive moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Redriven {
    pub moved: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("redrive stopped after {moved} message(s): {message}")]
pub struct RedriveError {
    pub moved: usize,
    pub message: String,
}

/// Moves up to `limit` messages from `dead_letters` to `queue`, ten at a time, until the
/// dead-letter queue answers empty.
pub async fn redrive(
    sqs: &aws_sdk_sqs::Client,
    dead_letters: &str,
    queue: &str,
    limit: usize,
) -> Result<Redriven, RedriveError> {
    let mut moved = 0;
    let fail = |moved, message: String| RedriveError { moved, message };
    while moved < limit {
        let wanted = i32::try_from((limit - moved).min(10)).unwrap_or(10);
        let received = sqs
            .receive_message()
            .queue_url(dead_letters)
            .max_number_of_messages(wanted)
            // Long enough to send and delete the batch before anyone else could see it.
            .visibility_timeout(60)
            .wait_time_seconds(RECEIVE_WAIT.as_secs() as i32)
            .customize()
            .config_override(waiting(RECEIVE_WAIT))
            .send()
            .await
            .map_err(|e| fail(moved, error_text(&e)))?;
        let messages = received.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        let mut send = sqs.send_message_batch().queue_url(queue);
        for (index, message) in messages.iter().enumerate() {
            let entry = SendMessageBatchRequestEntry::builder()
                .id(index.to_string())
                .message_body(message.body().unwrap_or_default())
                .build()
                .map_err(|e| fail(moved, e.to_string()))?;
            send = send.entries(entry);
        }
        let sent = send
            .customize()
            .config_override(waiting(std::time::Duration::ZERO))
            .send()
            .await
            .map_err(|e| fail(moved, error_text(&e)))?;
        let failed: Vec<usize> = sent
            .failed()
            .iter()
            .filter_map(|f| f.id().parse().ok())
            .collect();
        for (index, message) in messages.iter().enumerate() {
            // Not sent: it stays in the dead-letter queue and shows again after its timeout.
            if failed.contains(&index) {
                continue;
            }
            let Some(receipt) = message.receipt_handle() else {
                continue;
            };
            sqs.delete_message()
                .queue_url(dead_letters)
                .receipt_handle(receipt)
                .customize()
                .config_override(waiting(std::time::Duration::ZERO))
                .send()
                .await
                .map_err(|e| fail(moved, error_text(&e)))?;
            moved += 1;
        }
        if !failed.is_empty() {
            return Err(fail(
                moved,
                format!("the queue refused {} message(s)", failed.len()),
            ));
        }
    }
    Ok(Redriven { moved })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn queue(sqs: &aws_sdk_sqs::Client, name: &str) -> String {
        sqs.create_queue()
            .queue_name(format!("{name}-{}", uuid::Uuid::new_v4().simple()))
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap()
    }

    #[tokio::test]
    async fn dead_letters_go_back_to_the_queue_and_leave_the_dead_letter_queue_empty() {
        crate::testing::require_emulator();
        let sqs = aws_sdk_sqs::Client::new(&super::super::load_sdk_config().await);
        let (dead, main) = (queue(&sqs, "dlq").await, queue(&sqs, "main").await);
        for n in 0..23 {
            sqs.send_message()
                .queue_url(&dead)
                .message_body(format!("{{\"n\":{n}}}"))
                .send()
                .await
                .unwrap();
        }
        let first = redrive(&sqs, &dead, &main, 5).await.unwrap();
        assert_eq!(first, Redriven { moved: 5 }, "at most the limit");
        let rest = redrive(&sqs, &dead, &main, usize::MAX).await.unwrap();
        assert_eq!(rest, Redriven { moved: 18 });
        let mut bodies = Vec::new();
        loop {
            let got = sqs
                .receive_message()
                .queue_url(&main)
                .max_number_of_messages(10)
                .send()
                .await
                .unwrap()
                .messages
                .unwrap_or_default();
            if got.is_empty() {
                break;
            }
            bodies.extend(got.into_iter().filter_map(|m| m.body));
        }
        bodies.sort();
        bodies.dedup();
        assert_eq!(bodies.len(), 23, "every message arrived, once");
        let left = sqs
            .receive_message()
            .queue_url(&dead)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        assert!(left.is_empty(), "the dead-letter queue is empty");
    }

    /// A redrive whose receive SQS never answers stops with an error after the receive's
    /// tries (each its long poll's second and `TRY_ANSWER_WAIT` more), having moved nothing,
    /// instead of hanging the command.
    #[tokio::test]
    async fn a_redrive_that_sqs_never_answers_stops_with_an_error() {
        use crate::aws::clients::tests::{
            given_up_after_three_tries_of, never_answering_peer, sdk_at,
        };
        let (address, requests) = never_answering_peer();
        let sqs = crate::aws::clients::sqs(&sdk_at(address).await, None);
        let dead = format!("http://{address}/123456789012/dlq");
        let main = format!("http://{address}/123456789012/main");
        let each = RECEIVE_WAIT + crate::service::sender::TRY_ANSWER_WAIT;
        let call = redrive(&sqs, &dead, &main, 10);
        let error = given_up_after_three_tries_of(each, &requests, call).await;
        assert_eq!(error.moved, 0);
        assert!(error.message.contains("timeout"), "{error}");
    }
}
