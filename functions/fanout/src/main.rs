//! The fan-out function: a DynamoDB stream batch of new events → their deliveries.

// The layout of `main`'s future, which holds the stream event's nested types, goes deeper
// than the default limit of 128 queries.
#![recursion_limit = "256"]

use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let started = hooklane::aws::lambda::start(hooklane::aws::shape::SecretsUse::Withheld).await?;
    run(service_fn(|event: LambdaEvent<_>| async move {
        let deadline = hooklane_fanout::fan_out_deadline(event.context.deadline);
        let work = hooklane_fanout::handle_until(&started.shape, event.payload, Some(deadline));
        Ok::<_, Error>(started.invoke(work).await)
    }))
    .await
}
