//! The health function, on a schedule: endpoints failing for too long are disabled.

use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let started = hooklane::aws::lambda::start(hooklane::aws::shape::SecretsUse::Withheld).await?;
    run(service_fn(
        |event: LambdaEvent<serde_json::Value>| async move {
            let work = hooklane_health::handle(&started.shape, event.payload);
            started.invoke(work).await.map_err(Error::from)
        },
    ))
    .await
}
