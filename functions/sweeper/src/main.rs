use hooklane::aws::shape::{connect, AwsSettings};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    hooklane::aws::init_lambda_logging();
    let settings = AwsSettings::from_env()?;
    let shape = connect(&settings).await?;
    let (shape, grace) = (&shape, settings.sweep_grace);
    run(service_fn(
        move |event: LambdaEvent<serde_json::Value>| async move {
            hooklane_sweeper::handle(shape, grace, event.payload)
                .await
                .map_err(Error::from)
        },
    ))
    .await
}
