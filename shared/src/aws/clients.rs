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
        .timeout_config(answer_wait())
        .retry_classifier(ConflictRetry::<UpdateItemError>::default())
        .retry_classifier(ConflictRetry::<PutItemError>::default())
        .retry_classifier(ConflictRetry::<DeleteItemError>::default())
});
client!(sqs, aws_sdk_sqs);
client!(scheduler, aws_sdk_scheduler, |config| config
    .timeout_config(answer_wait()));

/// A try given up once its answer has not begun after [`crate::service::sender::TRY_ANSWER_WAIT`]
/// (the SDK's read timeout; its other timeouts stay as they are). Not on the SQS client:
/// its long polls wait longer, so its requests set it one by one (`queue::sqs`, `aws::dlq`).
pub fn answer_wait() -> aws_smithy_types::timeout::TimeoutConfig {
    answer_wait_after(std::time::Duration::ZERO)
}

/// As [`answer_wait`], for a request whose answer begins only after `wait` (a long poll's
/// `WaitTimeSeconds`).
pub fn answer_wait_after(wait: std::time::Duration) -> aws_smithy_types::timeout::TimeoutConfig {
    aws_smithy_types::timeout::TimeoutConfig::builder()
        .read_timeout(wait + crate::service::sender::TRY_ANSWER_WAIT)
        .build()
}

// The owner mail, the local runner's stream reads and the parameters read at a cold start:
// none of them waits for an answer that never comes either.
client!(sesv2, aws_sdk_sesv2, |config| config
    .timeout_config(answer_wait()));
client!(dynamodbstreams, aws_sdk_dynamodbstreams, |config| config
    .timeout_config(answer_wait()));
client!(ssm, aws_sdk_ssm, |config| config
    .timeout_config(answer_wait()));

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
pub(crate) mod tests {
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
    /// may each try three times, each try given up when its answer has not begun after
    /// `TRY_ANSWER_WAIT` (a write's answer is a few hundred bytes), pausing up to
    /// 1 s and then 2 s between them (the standard retry mode's full-jitter pauses, doubling
    /// from the first): `service::sender::AFTER_THE_WAIT`. A newer SDK behaviour version, or
    /// `AWS_MAX_ATTEMPTS` in the environment, could change that, and the function's timeout
    /// would no longer cover the batch.
    #[tokio::test]
    async fn the_sdks_tries_of_three_writes_take_no_longer_than_the_sender_counts() {
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
        let client = super::dynamodb(&sdk, None);
        assert_eq!(client.config().retry_config(), Some(retry));
        let timeouts = client.config().timeout_config().expect("timeouts");
        let try_longest = timeouts
            .read_timeout()
            .expect("DynamoDB requests wait for their answer for a limited time");
        assert_eq!(try_longest, crate::service::sender::TRY_ANSWER_WAIT);
        // The follow-ups' schedules too (their sends to SQS set it per request, in
        // `queue::sqs`, as the client's own long polls wait longer).
        let scheduler = super::scheduler(&sdk, None);
        let scheduler_timeouts = scheduler.config().timeout_config().expect("timeouts");
        assert_eq!(scheduler_timeouts.read_timeout(), Some(try_longest));
        // The SDK's own connect timeout is kept beside it.
        assert!(timeouts.connect_timeout().is_some(), "{timeouts:?}");
        let one_write = try_longest * retry.max_attempts() + pauses;
        assert!(
            one_write * 3 <= crate::service::sender::AFTER_THE_WAIT,
            "three writes of {one_write:?} each"
        );
    }

    /// A peer on 127.0.0.1 that reads each request and holds its connection open, never
    /// writing a byte back; and how many requests it has read.
    pub(crate) fn never_answering_peer() -> (
        std::net::SocketAddr,
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut head = [0u8; 1024];
                if stream.read(&mut head).is_ok_and(|n| n > 0) {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                held.push(stream);
            }
        });
        (address, requests)
    }

    /// The SDK configuration `serve` and the functions load, sending to `address`: set on
    /// the loader, so that `AWS_ENDPOINT_URL` (the emulator, in the suite) does not win.
    pub(crate) async fn sdk_at(address: std::net::SocketAddr) -> aws_config::SdkConfig {
        crate::aws::sdk_config_loader()
            .endpoint_url(format!("http://{address}"))
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                "test", "test", None, None, "test",
            ))
            .load()
            .await
    }

    /// Waits for `call` against a [`never_answering_peer`] that has read `requests`: it must
    /// come back as a timeout after three tries, each given up after `TRY_ANSWER_WAIT`
    /// (and the SDK's pauses between them), not wait for ever.
    pub(crate) async fn given_up_after_three_tries<T: std::fmt::Debug, E: std::fmt::Debug>(
        requests: &std::sync::atomic::AtomicUsize,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> E {
        let longest = crate::service::sender::TRY_ANSWER_WAIT;
        given_up_after_three_tries_of(longest, requests, call).await
    }

    /// As [`given_up_after_three_tries`], for tries given up after `longest` each.
    pub(crate) async fn given_up_after_three_tries_of<T: std::fmt::Debug, E: std::fmt::Debug>(
        longest: std::time::Duration,
        requests: &std::sync::atomic::AtomicUsize,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> E {
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(30), call)
            .await
            .expect("no answer after 30 s: the request waits for ever");
        let took = started.elapsed();
        let error = answer.expect_err("the peer never answers");
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(
            took >= longest * 3 && took <= longest * 3 + std::time::Duration::from_secs(3 + 5),
            "three tries of {longest:?} and their pauses took {took:?}"
        );
        error
    }

    /// A DynamoDB request whose answer never comes (a connection lost on the way) is given
    /// up after the read timeout and tried again, three times in all, and then comes back
    /// as a timeout: not a wait until Lambda stops the function. DynamoDB and the emulator
    /// always answer, so only a peer of the test's own shows it.
    #[tokio::test]
    async fn a_dynamodb_request_that_is_never_answered_is_given_up_after_its_tries() {
        let (address, requests) = never_answering_peer();
        let client = super::dynamodb(&sdk_at(address).await, None);
        let call = client.describe_table().table_name("never-answered").send();
        let error = given_up_after_three_tries(&requests, call).await;
        assert!(
            matches!(&error, aws_sdk_dynamodb::error::SdkError::DispatchFailure(failure) if failure.is_timeout()),
            "{error:?}"
        );
    }
    /// The parameters a function reads when it starts (its admin token, the key of endpoint
    /// secrets): a read whose answer never comes fails the start within its tries, with the
    /// parameter's name, instead of holding the start until Lambda gives it up.
    #[tokio::test]
    async fn a_parameter_read_that_is_never_answered_fails_the_start_within_its_tries() {
        let (address, requests) = never_answering_peer();
        let ssm = super::ssm(&sdk_at(address).await, None);
        let call = crate::aws::parameters::secure_string(&ssm, "/hooklane/admin-token");
        let error = given_up_after_three_tries(&requests, call).await;
        let text = error.to_string();
        assert!(
            text.contains("/hooklane/admin-token") && text.contains("timeout"),
            "{text}"
        );
    }

    /// An owner's mail whose sending SES never answers is given up within its tries and
    /// stays queued (`Unavailable`), so the health run goes on instead of waiting until
    /// Lambda stops it.
    #[tokio::test]
    async fn a_mail_that_ses_never_answers_is_given_up_and_stays_queued() {
        use crate::notify::{Notifier, NotifyError};
        let (address, requests) = never_answering_peer();
        let notifier = crate::notify::ses::SesNotifier::new(
            super::sesv2(&sdk_at(address).await, None),
            "hooklane@example.com",
        );
        let notification = crate::store::Notification {
            id: "ntf_1".into(),
            account_id: crate::domain::AccountId::parse("acme").unwrap(),
            recipient: crate::domain::EmailAddress::parse("owner@example.com").unwrap(),
            subject: "Webhook endpoint disabled".into(),
            body: "We disabled your endpoint.".into(),
            created_at: crate::fixtures::t0(),
        };
        let error = given_up_after_three_tries(&requests, notifier.send(&notification)).await;
        assert!(matches!(error, NotifyError::Unavailable(_)), "{error:?}");
    }

    /// The local runner's reads of the events table's stream.
    #[tokio::test]
    async fn a_stream_read_that_is_never_answered_is_given_up_after_its_tries() {
        let (address, requests) = never_answering_peer();
        let streams = super::dynamodbstreams(&sdk_at(address).await, None);
        let call = streams
            .describe_stream()
            .stream_arn("arn:aws:dynamodb:us-east-1:123456789012:table/events/stream/2026-12-07T00:00:00.000")
            .send();
        let error = given_up_after_three_tries(&requests, call).await;
        assert!(
            matches!(&error, aws_sdk_dynamodbstreams::error::SdkError::DispatchFailure(failure) if failure.is_timeout()),
            "{error:?}"
        );
    }

    /// The address and `ClientRequestToken` of each try of a request (empty but for a
    /// `TransactWriteItems`), read from the request the SDK sends.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct TransactTokens(std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>);

    impl TransactTokens {
        /// The token of each try of a `TransactWriteItems`, in the order they were sent.
        pub(crate) fn of_transactions(&self) -> Vec<String> {
            let seen = self.0.lock().unwrap();
            let tokens = seen.iter().map(|(_, token)| token);
            tokens.filter(|token| !token.is_empty()).cloned().collect()
        }
    }

    impl aws_smithy_runtime_api::client::interceptors::Intercept for TransactTokens {
        fn name(&self) -> &'static str {
            "TransactTokens"
        }

        fn read_before_transmit(
            &self,
            context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
            _: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
            _: &mut aws_smithy_types::config_bag::ConfigBag,
        ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
            let body: serde_json::Value =
                serde_json::from_slice(context.request().body().bytes().unwrap_or_default())?;
            let token = body["ClientRequestToken"].as_str().unwrap_or_default();
            let to = context.request().uri().to_owned();
            self.0.lock().unwrap().push((to, token.to_owned()));
            Ok(())
        }
    }

    /// DynamoDB applies a `TransactWriteItems` once per `ClientRequestToken` for ten
    /// minutes: a try sent again after a read timeout, while the first one still runs or
    /// after it was applied, is answered as that one was, not applied twice nor refused on
    /// its own conditions (an event's `attribute_not_exists`). That holds only if every try
    /// of one call carries the same token and each call its own. No call of the store sets
    /// one, so it is the SDK's to fill in; the emulator ignores tokens, so the tries are read
    /// here as they are sent.
    #[tokio::test]
    async fn the_tries_of_one_transaction_share_its_idempotency_token() {
        use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
        let tokens = TransactTokens::default();
        let watched = super::SharedInterceptor::new(tokens.clone());
        let call = |address| {
            let tokens = &watched;
            async move {
                let client = super::dynamodb(&sdk_at(address).await, Some(tokens));
                let put = Put::builder()
                    .table_name("events")
                    .item(
                        "id",
                        aws_sdk_dynamodb::types::AttributeValue::S("evt_1".into()),
                    )
                    .condition_expression("attribute_not_exists(id)")
                    .build()
                    .unwrap();
                client
                    .transact_write_items()
                    .transact_items(TransactWriteItem::builder().put(put).build())
                    .send()
                    .await
            }
        };
        let ((first, first_requests), (second, second_requests)) =
            (never_answering_peer(), never_answering_peer());
        // Two calls side by side, each tried three times.
        tokio::join!(
            given_up_after_three_tries(&first_requests, call(first)),
            given_up_after_three_tries(&second_requests, call(second)),
        );
        let seen = tokens.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 6, "{seen:?}");
        assert!(seen.iter().all(|(_, token)| !token.is_empty()), "{seen:?}");
        let mut pairs = seen.clone();
        pairs.sort();
        pairs.dedup();
        // Each peer saw one token three times, and the two tokens differ.
        assert_eq!(pairs.len(), 2, "one token per call: {seen:?}");
        assert_ne!(pairs[0].1, pairs[1].1, "{seen:?}");
    }
}
