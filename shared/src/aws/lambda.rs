//! What every Lambda function's `main` does before its first event, said once: JSON logs
//! and EMF metrics, the settings from the environment, and the clients, built once.

use std::future::Future;

use super::{
    settings::{AwsSettings, SettingsError},
    shape::{connect_using, AwsShape, ConnectError, SecretsUse},
};
use crate::telemetry::emf::EmfPublisher;

/// A started function: what its handlers borrow for every event.
pub struct Started {
    pub settings: AwsSettings,
    pub shape: AwsShape,
    metrics: EmfPublisher,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
}

/// Starts a function that `secrets` endpoint signing secrets as said (the API and the
/// sender need the key; the others are not given it). What it builds lives as long as the
/// process, which is the function's (the runtime's handler closures need `'static`
/// borrows of it).
pub async fn start(secrets: SecretsUse) -> Result<&'static Started, StartError> {
    let metrics = init_lambda_telemetry();
    let settings = AwsSettings::from_env()?;
    let shape = connect_using(&settings, None, secrets).await?;
    Ok(Box::leak(Box::new(Started {
        settings,
        shape,
        metrics,
    })))
}

impl Started {
    /// Runs one invocation and publishes its metrics before its result goes back.
    pub async fn invoke<F: Future>(&self, invocation: F) -> F::Output {
        self.metrics.flushed(invocation).await
    }

    /// The metrics publisher, for a runtime that wraps invocations itself (the API's router).
    pub fn metrics(&self) -> &EmfPublisher {
        &self.metrics
    }
}

/// JSON logs and EMF metrics for a Lambda function: installs both and returns the metrics
/// publisher, whose `flushed` wraps each invocation.
fn init_lambda_telemetry() -> crate::telemetry::emf::EmfPublisher {
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
fn init_lambda_logging() {
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
