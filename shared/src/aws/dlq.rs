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

use super::error_text;

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
            .wait_time_seconds(1)
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
        let sent = send.send().await.map_err(|e| fail(moved, error_text(&e)))?;
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
}
