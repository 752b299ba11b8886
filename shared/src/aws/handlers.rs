//! What each Lambda function does with one piece of input, shared by the functions (which
//! add only the Lambda event types) and by the local runner (`aws::local`), which feeds them
//! from the stream, the queue and timers itself.

use std::sync::Arc;

use serde_json::Value;

use super::{
    shape::{admin_token, AwsSettings, AwsShape},
    stream::{event_from_image, StreamedEvent},
};
use crate::{
    api::{router, ApiState},
    queue::sqs::DeliveryMessage,
    service::{
        fan_out::fan_out,
        health, notifications,
        sender::{handle_message, Lanes},
        sweep::enqueue_pending,
        tokens, ServiceResult,
    },
    store::StoreError,
};

/// The API function's router: the admin token and the token signing key are loaded once.
pub async fn api_router(
    shape: &AwsShape,
    settings: &AwsSettings,
) -> Result<axum::Router, StoreError> {
    let token = admin_token(shape, settings).await?;
    api_router_with_token(shape, token).await
}

/// The router for an admin token the caller already has.
pub async fn api_router_with_token(
    shape: &AwsShape,
    admin_token: String,
) -> Result<axum::Router, StoreError> {
    let token_key = tokens::signing_key(shape.app.store.as_ref())
        .await
        .map_err(|e| StoreError::Backend(format!("cannot load the token signing key: {e}")))?;
    Ok(router(ApiState {
        app: shape.app.clone(),
        admin_token: admin_token.into(),
        token_key: Arc::new(token_key),
    }))
}

/// Fan-out of one events-table stream record's new image (in DynamoDB JSON). An error means
/// "retry from this record"; an unreadable image is logged and skipped, since retrying
/// cannot make it readable and would stop the shard.
pub async fn fan_out_image(shape: &AwsShape, image: &Value) -> Result<(), String> {
    match event_from_image(image) {
        Ok(StreamedEvent::New(event)) => {
            let created = fan_out(&shape.app, &event)
                .await
                .map_err(|e| e.to_string())?;
            tracing::info!(event.id = %event.id, created, "fanned out");
            Ok(())
        }
        Ok(StreamedEvent::AlreadyFannedOut) => Ok(()),
        Err(error) => {
            tracing::error!(%error, "unreadable event image; skipped");
            Ok(())
        }
    }
}

/// What became of one queue message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageOutcome {
    /// Handled (or unusable for good): delete it.
    Done,
    /// Leave it in the queue; it comes back after its visibility timeout.
    Retry,
}

/// The sender function's work for one SQS message.
pub async fn handle_queue_message(
    shape: &AwsShape,
    message_id: &str,
    body: Option<&str>,
) -> MessageOutcome {
    let Some(body) = body else {
        tracing::error!(message.id = %message_id, "message without a body; dropped");
        return MessageOutcome::Done;
    };
    let (delivery, endpoint, account) = match DeliveryMessage::parse(body) {
        Ok(parsed) => parsed,
        Err(error) => {
            // Retrying cannot fix a malformed message; the delivery row stays for the sweeper.
            tracing::error!(message.id = %message_id, %error, "malformed message; dropped");
            return MessageOutcome::Done;
        }
    };
    let lanes = Lanes {
        slots: shape.slots.as_ref(),
        rate: shape.slots.as_ref(),
    };
    match handle_message(&shape.app, lanes, &delivery, &endpoint, &account).await {
        Ok(_) => MessageOutcome::Done,
        Err(error) => {
            tracing::warn!(message.id = %message_id, delivery.id = %delivery, %error, "message failed; it will come back");
            MessageOutcome::Retry
        }
    }
}

/// The sweeper function's work: re-queues pending deliveries more than `grace` past due.
pub async fn sweep(shape: &AwsShape, grace: std::time::Duration) -> ServiceResult<usize> {
    let cutoff = shape.app.clock.now() - chrono::TimeDelta::from_std(grace).unwrap_or_default();
    let requeued = enqueue_pending(&shape.app, cutoff).await?;
    tracing::info!(requeued, "swept");
    Ok(requeued)
}

/// The health function's work: disables long-failing endpoints, then sends the owner mail
/// still queued. Returns (disabled, mailed).
pub async fn check_health(shape: &AwsShape) -> ServiceResult<(usize, usize)> {
    let disabled = health::check(&shape.app).await?;
    let mailed = notifications::flush(&shape.app).await?;
    tracing::info!(disabled, mailed, "health checked");
    Ok((disabled, mailed))
}
