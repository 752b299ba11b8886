//! The sender function's trigger, locally: the queue long-polled, handled messages deleted.

use super::*;

pub(super) const RECEIVE_WAIT_SECONDS: i32 = 2;

/// The sender function's trigger: long-polls the queue.
pub(super) struct QueueConsumer {
    pub(super) shape: AwsShape,
    pub(super) sqs: aws_sdk_sqs::Client,
    pub(super) queue_url: String,
}

impl QueueConsumer {
    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            let received = tokio::select! {
                received = self
                    .sqs
                    .receive_message()
                    .queue_url(&self.queue_url)
                    .max_number_of_messages(10)
                    .wait_time_seconds(RECEIVE_WAIT_SECONDS)
                    .send() => received,
                _ = stop.changed() => return,
            };
            let messages = match received {
                Ok(out) => out.messages.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(error = %error_text(&e), "cannot receive from the queue");
                    if !pause(ERROR_BACKOFF, &mut stop).await {
                        return;
                    }
                    continue;
                }
            };
            let batch: Vec<(&str, Option<&str>)> = messages
                .iter()
                .map(|m| (m.message_id().unwrap_or_default(), m.body()))
                .collect();
            let outcomes = handlers::handle_queue_batch(&self.shape, &batch).await;
            let handled: Vec<&str> = messages
                .iter()
                .zip(outcomes)
                .filter(|(_, outcome)| *outcome == MessageOutcome::Done)
                .filter_map(|(message, _)| message.receipt_handle())
                .collect();
            self.delete(&handled).await;
            if *stop.borrow() {
                return;
            }
        }
    }

    pub(super) async fn delete(&self, receipts: &[&str]) {
        if receipts.is_empty() {
            return;
        }
        let mut request = self.sqs.delete_message_batch().queue_url(&self.queue_url);
        for (index, receipt) in receipts.iter().enumerate() {
            match aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                .id(index.to_string())
                .receipt_handle(*receipt)
                .build()
            {
                Ok(entry) => request = request.entries(entry),
                Err(error) => tracing::warn!(%error, "cannot build a delete entry"),
            }
        }
        match request.send().await {
            // An undeleted message comes back and finds its delivery already handled.
            Ok(out) if !out.failed().is_empty() => {
                tracing::warn!(
                    failed = out.failed().len(),
                    "some handled messages were not deleted"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %error_text(&e), "cannot delete handled messages"),
        }
    }
}
