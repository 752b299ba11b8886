//! Shared AWS plumbing for the adapters behind the `aws` feature: one SDK configuration,
//! loaded from the environment (region, credentials, and `AWS_ENDPOINT_URL` for a local
//! emulator such as moto or LocalStack).

pub mod clients;
pub mod dlq;
pub mod handlers;
pub mod local;
pub mod record;
pub mod shape;
pub mod stack;
pub mod stream;

// The SDK crates, for callers that add their own writes (the outbox helper's transaction).
pub use aws_sdk_dynamodb;
pub use aws_sdk_dynamodbstreams;
pub use aws_sdk_scheduler;
pub use aws_sdk_sesv2;
pub use aws_sdk_sqs;
pub use aws_sdk_ssm;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

/// Loads the SDK configuration the standard way, with an HTTPS client on rustls + ring.
pub async fn load_sdk_config() -> SdkConfig {
    let http_client = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client)
        .load()
        .await
}

/// The full text of an SDK error, including its source chain (the `Display` of an
/// `SdkError` alone says little more than "service error").
pub fn error_text<E>(error: &E) -> String
where
    E: std::error::Error,
{
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// JSON logs and EMF metrics for a Lambda function: installs both and returns the metrics
/// publisher, whose `flushed` wraps each invocation (`metrics.flushed(handle(..))`).
pub fn init_lambda_telemetry() -> crate::telemetry::emf::EmfPublisher {
    init_lambda_logging();
    let stack = std::env::var("HOOKLANE_TABLE_PREFIX").unwrap_or_default();
    let publisher = crate::telemetry::emf::EmfPublisher::new(
        crate::telemetry::lambda_recorder(&stack),
        std::io::stdout(),
    );
    if metrics::set_global_recorder(publisher.recorder().clone()).is_err() {
        tracing::warn!("a metrics recorder was already installed; EMF metrics are off");
    }
    crate::telemetry::describe();
    publisher
}

/// JSON logs for a Lambda function (CloudWatch keeps one object a line); `RUST_LOG` filters.
pub fn init_lambda_logging() {
    use tracing_subscriber::util::SubscriberInitExt;
    if lambda_log_subscriber(std::io::stdout).try_init().is_err() {
        tracing::warn!("a log subscriber was already installed");
    }
}

/// The Lambda functions' log format: one JSON object a line, each with the fields of the
/// spans it is in (`spans`: the delivery's event, endpoint and delivery ids and attempt).
pub fn lambda_log_subscriber<W>(writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        .with_span_list(true)
        .with_ansi(false)
        .with_writer(writer)
        .finish()
}
