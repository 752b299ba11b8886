use hooklane::aws::shape::{connect, AwsSettings};
use lambda_http::{run, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let metrics = hooklane::aws::init_lambda_telemetry();
    let settings = AwsSettings::from_env()?;
    let shape = connect(&settings).await?;
    let router = hooklane_api::api_router(&shape, &settings).await?;
    run(hooklane_api::flushing_metrics(router, metrics)).await
}
