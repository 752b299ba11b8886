//! The AWS shape (feature `aws`), one room per concern:
//!
//! | module | what |
//! |---|---|
//! | this file, `clients` | the SDK configuration (region, credentials, `AWS_ENDPOINT_URL`) and the clients built from it |
//! | `settings` | the settings, from the environment the template gives each function |
//! | `shape` | the wiring: the App over DynamoDB, SQS (+ Scheduler), SES and the slots |
//! | `admin_token`, `parameters` | the API's admin token (SSM parameter, variable, or generated locally); SSM SecureString parameters, the secrets key's too |
//! | `lambda` | a function's start-up: logs, metrics, settings, clients |
//! | `handlers`, `stream`, `dlq` | what the functions do with an event; stream records parsed; the dead-letter queue |
//! | `stack` | `infra/template.yaml` read as data, and provisioned on an emulator |
//! | `record` | every SDK request recorded with the IAM action it needs (`HOOKLANE_AWS_REQUEST_LOG`) |
//! | `local` | `serve --backend aws`: the functions' triggers run in one process |

pub mod admin_token;
pub mod clients;
pub mod dlq;
pub mod handlers;
pub mod lambda;
pub mod local;
pub mod parameters;
pub mod record;
pub mod settings;
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
    sdk_config_loader().load().await
}

/// [`load_sdk_config`]'s loader, for a test to set more on it.
pub(crate) fn sdk_config_loader() -> aws_config::ConfigLoader {
    let http_client = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    aws_config::defaults(BehaviorVersion::latest()).http_client(http_client)
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
