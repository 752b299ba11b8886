use hooklane::aws::shape::{connect, AwsSettings};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let metrics = hooklane::aws::init_lambda_telemetry();
    let shape = connect(&AwsSettings::from_env()?).await?;
    let (shape, metrics) = (&shape, &metrics);
    run(service_fn(
        move |event: LambdaEvent<serde_json::Value>| async move {
            metrics
                .flushed(hooklane_health::handle(shape, event.payload))
                .await
                .map_err(Error::from)
        },
    ))
    .await
}
