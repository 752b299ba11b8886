//! The sweeper function, on a schedule: overdue deliveries are queued again.

use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let started = hooklane::aws::lambda::start(hooklane::aws::shape::SecretsUse::Withheld).await?;
    run(service_fn(
        |event: LambdaEvent<serde_json::Value>| async move {
            let work = hooklane_sweeper::handle(
                &started.shape,
                started.settings.sweep_grace,
                event.payload,
            );
            started.invoke(work).await.map_err(Error::from)
        },
    ))
    .await
}
