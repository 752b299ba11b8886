//! Use-cases, each a function over [`App`](crate::App): the same code behind the embedded
//! binary and the Lambda functions.

pub mod access;
pub mod accounts;
pub mod audit;
pub mod catalog;
pub mod deliver;
pub mod endpoints;
pub mod fan_out;
pub mod health;
pub mod keys;
pub mod notifications;
pub mod publish;
pub mod replay;
#[cfg(feature = "aws")]
pub mod sender;
pub mod sweep;
pub mod test_events;
pub mod tokens;

use crate::{domain::InvalidField, queue::QueueError, store::StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    /// A publish under the id of another event: answered 409 naming the field that differs.
    #[error(transparent)]
    EventConflict(crate::domain::EventConflict),
    /// `field` is over its size limit.
    #[error("{message}")]
    TooLarge {
        field: &'static str,
        message: String,
    },
    /// The account's limit on `what` (publishing, test events) is used up; a token is back
    /// after `retry_after`.
    #[error("rate limit of {per_second} events/s (bursts of {burst}) on {what} reached")]
    RateLimited {
        what: &'static str,
        per_second: u32,
        burst: u32,
        retry_after: std::time::Duration,
    },
    #[error(transparent)]
    Store(StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// Item `index` of a batch is at fault; nothing of the batch was written.
    #[error("events[{index}]: {error}")]
    InBatch {
        index: usize,
        error: Box<ServiceError>,
    },
}

impl From<StoreError> for ServiceError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Conflict { entity, id } => {
                Self::Conflict(format!("{entity} `{id}` already exists"))
            }
            StoreError::NotFound(what) => Self::NotFound(what),
            StoreError::EventConflict(conflict) => Self::EventConflict(conflict),
            other => Self::Store(other),
        }
    }
}

pub type ServiceResult<T> = Result<T, ServiceError>;

/// Runs `write`, a write to the app's store, and notes its result for `/health`, the metrics
/// and the dispatcher's probing sends: a failure of the storage itself (busy, full, an I/O
/// error) marks the store failing, and a write that goes through clears it. A refusal of
/// what was asked (a conflict, a limit) is neither.
pub(crate) async fn noted_write<T>(
    app: &crate::App,
    write: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let began = app.clock.now();
    let result = write.await;
    note_write(app, began, &result);
    result
}

/// [`noted_write`]'s note of `result`, of a write that began at `began`.
fn note_write<T>(app: &crate::App, began: crate::clock::Timestamp, result: &Result<T, StoreError>) {
    match result {
        Ok(_) => crate::telemetry::store_write_succeeded(&app.store),
        Err(error) => note_write_failure(app, began, error),
    }
}

/// [`note_write`] of a failed write.
pub(crate) fn note_write_failure(
    app: &crate::App,
    began: crate::clock::Timestamp,
    error: &StoreError,
) {
    if matches!(error, StoreError::Locked(_) | StoreError::Backend(_)) {
        crate::telemetry::store_write_failed(&app.store, (began, app.clock.now()), error);
    }
}
