//! The SDK clients of the AWS shape, each built from one SDK configuration, with an
//! optional extra interceptor (a measurement's meter, a test's counter) and the request
//! recorder when `HOOKLANE_AWS_REQUEST_LOG` is set (`aws::record`).

use aws_config::SdkConfig;
pub use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;

/// One `pub fn $name(sdk, extra) -> $sdk::Client` per SDK: the builders are distinct types
/// with no common trait.
macro_rules! client {
    ($name:ident, $sdk:ident $(, |$config:ident| $more:expr)?) => {
        pub fn $name(sdk: &SdkConfig, extra: Option<&SharedInterceptor>) -> $sdk::Client {
            let mut config = $sdk::config::Builder::from(sdk);
            if let Some(extra) = extra {
                config.push_interceptor(extra.clone());
            }
            if let Some(recorder) = crate::aws::record::recorder() {
                config = config.interceptor(recorder);
            }
            $(let $config = config; let config = $more;)?
            $sdk::Client::from_conf(config.build())
        }
    };
}

client!(dynamodb, aws_sdk_dynamodb, |config| {
    use aws_sdk_dynamodb::operation::{
        delete_item::DeleteItemError, put_item::PutItemError, update_item::UpdateItemError,
    };
    config
        .retry_classifier(ConflictRetry::<UpdateItemError>::default())
        .retry_classifier(ConflictRetry::<PutItemError>::default())
        .retry_classifier(ConflictRetry::<DeleteItemError>::default())
});
client!(sqs, aws_sdk_sqs);
client!(scheduler, aws_sdk_scheduler);
client!(sesv2, aws_sdk_sesv2);
client!(dynamodbstreams, aws_sdk_dynamodbstreams);
client!(ssm, aws_sdk_ssm);

/// Has the SDK try again, with its backoff, a single-item write that met a transaction
/// writing the same item (`TransactionConflictException`). DynamoDB refuses such a write;
/// the emulator, running one request at a time, never does, and the SDK does not count it
/// as retryable. (Transactions that meet each other are tried again by the store.)
pub struct ConflictRetry<E>(std::marker::PhantomData<fn() -> E>);

impl<E> Default for ConflictRetry<E> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<E> std::fmt::Debug for ConflictRetry<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConflictRetry")
    }
}

impl<E> aws_smithy_runtime_api::client::retries::classifiers::ClassifyRetry for ConflictRetry<E>
where
    E: std::error::Error
        + aws_smithy_types::error::metadata::ProvideErrorMetadata
        + Send
        + Sync
        + 'static,
{
    fn classify_retry(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::InterceptorContext,
    ) -> aws_smithy_runtime_api::client::retries::classifiers::RetryAction {
        use aws_smithy_runtime_api::client::retries::classifiers::RetryAction;
        let Some(Err(error)) = context.output_or_error() else {
            return RetryAction::NoActionIndicated;
        };
        let code = error
            .as_operation_error()
            .and_then(|error| error.downcast_ref::<E>())
            .and_then(|error| error.code());
        if code == Some("TransactionConflictException") {
            RetryAction::transient_error()
        } else {
            RetryAction::NoActionIndicated
        }
    }

    fn name(&self) -> &'static str {
        "ConflictRetry"
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::{
        operation::update_item::UpdateItemError,
        types::error::{ConditionalCheckFailedException, TransactionConflictException},
    };
    use aws_smithy_runtime_api::client::{
        interceptors::context::{Error, Input, InterceptorContext},
        orchestrator::OrchestratorError,
        retries::classifiers::{ClassifyRetry, RetryAction},
    };

    use super::ConflictRetry;

    fn classified(error: UpdateItemError) -> RetryAction {
        let mut context = InterceptorContext::new(Input::doesnt_matter());
        context.set_output_or_error(Err(OrchestratorError::operation(Error::erase(error))));
        ConflictRetry::<UpdateItemError>::default().classify_retry(&context)
    }

    /// DynamoDB's answer to a single write meeting a transaction is tried again; a failed
    /// condition is an answer, never retried.
    #[test]
    fn a_write_that_met_a_transaction_is_tried_again() {
        // As the SDK reads DynamoDB's answer: the code from its `__type`.
        let meta = |code: &str| {
            aws_smithy_types::error::ErrorMetadata::builder()
                .code(code)
                .build()
        };
        let conflict = TransactionConflictException::builder()
            .message("Transaction is ongoing for the item")
            .meta(meta("TransactionConflictException"))
            .build();
        assert_eq!(
            classified(UpdateItemError::TransactionConflictException(conflict)),
            RetryAction::transient_error()
        );
        let condition = ConditionalCheckFailedException::builder()
            .meta(meta("ConditionalCheckFailedException"))
            .build();
        assert_eq!(
            classified(UpdateItemError::ConditionalCheckFailedException(condition)),
            RetryAction::NoActionIndicated
        );
    }

    /// The sender's longest batch counts, after a record's wait, three writes that the SDK
    /// may each try three times, pausing up to 1 s and then 2 s (the standard retry mode's
    /// full-jitter pauses, doubling from the first): `service::sender::AFTER_THE_WAIT`. A
    /// newer SDK behaviour version, or `AWS_MAX_ATTEMPTS` in the environment, could change
    /// that, and the function's timeout would no longer cover the batch.
    #[tokio::test]
    async fn the_sdks_tries_of_three_writes_pause_no_longer_than_the_sender_counts() {
        use aws_config::retry::RetryMode;
        let sdk = crate::aws::load_sdk_config().await;
        let retry = sdk.retry_config().expect("a retry configuration");
        assert_eq!(retry.mode(), RetryMode::Standard);
        let pauses: std::time::Duration = (0..retry.max_attempts().saturating_sub(1))
            .map(|n| retry.initial_backoff() * 2u32.pow(n))
            .sum();
        assert_eq!(
            (retry.max_attempts(), pauses),
            (3, std::time::Duration::from_secs(3))
        );
        assert!(pauses * 3 <= crate::service::sender::AFTER_THE_WAIT);
        let client = super::dynamodb(&sdk, None);
        assert_eq!(client.config().retry_config(), Some(retry));
    }
}
