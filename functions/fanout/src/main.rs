use hooklane::aws::shape::{connect, AwsSettings};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    hooklane::aws::init_lambda_logging();
    let shape = connect(&AwsSettings::from_env()?).await?;
    let shape = &shape;
    run(service_fn(move |event: LambdaEvent<_>| async move {
        Ok::<_, Error>(hooklane_fanout::handle(shape, event.payload).await)
    }))
    .await
}
