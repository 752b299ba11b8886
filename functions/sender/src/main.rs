//! The sender function: an SQS batch of delivery messages → attempts.

use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let started = hooklane::aws::lambda::start(hooklane::aws::shape::SecretsUse::Needed).await?;
    run(service_fn(|event: LambdaEvent<_>| async move {
        let work = hooklane_sender::handle(&started.shape, event.payload);
        Ok::<_, Error>(started.invoke(work).await)
    }))
    .await
}
