//! The api function: the HTTP API behind API Gateway.

use lambda_http::{run, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let started = hooklane::aws::lambda::start(hooklane::aws::shape::SecretsUse::Needed).await?;
    let router = hooklane_api::api_router(&started.shape, &started.settings).await?;
    run(hooklane_api::flushing_metrics(
        hooklane_api::with_source_ip(router),
        started.metrics().clone(),
    ))
    .await
}
