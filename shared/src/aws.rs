//! Shared AWS plumbing for the adapters behind the `aws` feature: one SDK configuration,
//! loaded from the environment (region, credentials, and `AWS_ENDPOINT_URL` for a local
//! emulator such as moto or LocalStack).

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
