//! The sender function: each SQS message names one delivery; they are handled concurrently
//! and the ones that failed are reported back (`ReportBatchItemFailures`) so only they are
//! retried by SQS.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use futures_util::future::join_all;
use hooklane::{
    aws::shape::AwsShape,
    queue::sqs::DeliveryMessage,
    service::sender::{handle_message, Lanes},
};

pub async fn handle(shape: &AwsShape, event: SqsEvent) -> SqsBatchResponse {
    let lanes = Lanes {
        slots: shape.slots.as_ref(),
        rate: shape.slots.as_ref(),
    };
    let outcomes = join_all(event.records.iter().map(|record| async move {
        let id = record.message_id.clone().unwrap_or_default();
        let Some(body) = record.body.as_deref() else {
            tracing::error!(message.id = %id, "message without a body; dropped");
            return None;
        };
        let (delivery, endpoint, account) = match DeliveryMessage::parse(body) {
            Ok(parsed) => parsed,
            Err(error) => {
                // Retrying cannot fix a malformed message; the delivery row stays for the sweeper.
                tracing::error!(message.id = %id, %error, "malformed message; dropped");
                return None;
            }
        };
        match handle_message(&shape.app, lanes, &delivery, &endpoint, &account).await {
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(message.id = %id, delivery.id = %delivery, %error, "message failed; SQS will retry it");
                Some(id)
            }
        }
    }))
    .await;
    let mut response = SqsBatchResponse::default();
    response.batch_item_failures = outcomes
        .into_iter()
        .flatten()
        .map(|id| {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            failure
        })
        .collect();
    response
}

#[cfg(test)]
mod crash_tests;

#[cfg(test)]
mod tests {
    use std::{sync::atomic::Ordering, time::Duration};

    use hooklane::{
        domain::{DeliveryStatus, EndpointUrl},
        queue::sqs::DeliveryMessage,
        service::publish::{publish, NewEvent},
        store::contract,
        testing::{emulated_shape, slow_receiver},
    };

    use super::*;

    #[tokio::test]
    async fn a_real_sqs_batch_reports_only_the_failed_item() {
        let (settings, shape) = emulated_shape().await;
        let receiver = slow_receiver(Duration::from_millis(5)).await;
        let store = &shape.app.store;
        store
            .create_account(&contract::account("acme"))
            .await
            .unwrap();
        let mut endpoint = contract::endpoint("acme", "ep_1", contract::t0());
        endpoint.url = EndpointUrl::parse(&receiver.url).unwrap();
        store.create_endpoint(&endpoint).await.unwrap();
        let event = |id: &str| NewEvent {
            id: Some(id.into()),
            event_type: "invoice.paid".into(),
            data: serde_json::json!({}),
        };
        let account = endpoint.account_id.clone();
        let good = publish(&shape.app, &account, event("evt_good"))
            .await
            .unwrap();
        let broken = publish(&shape.app, &account, event("evt_broken"))
            .await
            .unwrap();
        // The broken delivery's event is gone: attempting it fails inside the sender.
        shape
            .store
            .client()
            .delete_item()
            .table_name(&settings.tables.events)
            .key("account_id", aws_sdk_dynamodb_value("acme"))
            .key("id", aws_sdk_dynamodb_value("evt_broken"))
            .send()
            .await
            .unwrap();
        let message = |d: &hooklane::domain::Delivery| {
            serde_json::to_string(&DeliveryMessage {
                delivery_id: d.id.to_string(),
                endpoint_id: d.endpoint_id.to_string(),
                account_id: d.account_id.to_string(),
            })
            .unwrap()
        };
        let fixture = include_str!("../fixtures/sqs-batch.json")
            .replace(
                "\"{{DELIVERY_MESSAGE}}\"",
                &serde_json::to_string(&message(&good.deliveries[0])).unwrap(),
            )
            .replace(
                "\"{{UNREACHABLE_MESSAGE}}\"",
                &serde_json::to_string(&message(&broken.deliveries[0])).unwrap(),
            );
        let batch: SqsEvent = serde_json::from_str(&fixture).unwrap();

        let response = handle(&shape, batch).await;
        let failed: Vec<_> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        assert_eq!(failed, vec!["7d9c1f3e-5c2a-4b8e-9f0a-1e2d3c4b5a69"]);
        assert_eq!(receiver.served.load(Ordering::SeqCst), 1);
        let delivered = store
            .get_delivery(&account, &good.deliveries[0].id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(delivered.status, DeliveryStatus::Delivered);
    }

    fn aws_sdk_dynamodb_value(s: &str) -> hooklane::aws::aws_sdk_dynamodb::types::AttributeValue {
        hooklane::aws::aws_sdk_dynamodb::types::AttributeValue::S(s.to_owned())
    }
}
