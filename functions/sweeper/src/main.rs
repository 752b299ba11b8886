use hooklane::aws::shape::{connect, AwsSettings};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let metrics = hooklane::aws::init_lambda_telemetry();
    let settings = AwsSettings::from_env()?;
    let shape = connect(&settings).await?;
    let (shape, metrics, grace) = (&shape, &metrics, settings.sweep_grace);
    run(service_fn(
        move |event: LambdaEvent<serde_json::Value>| async move {
            metrics
                .flushed(hooklane_sweeper::handle(shape, grace, event.payload))
                .await
                .map_err(Error::from)
        },
    ))
    .await
}
