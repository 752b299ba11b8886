//! The sender function: an SQS batch of delivery messages → attempts.

use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let started = hooklane::aws::lambda::start(hooklane::aws::shape::SecretsUse::Needed).await?;
    run(service_fn(|event: LambdaEvent<_>| async move {
        let request_deadline = started.shape.app.config.sender.deadline;
        let send_by = hooklane_sender::send_by(event.context.deadline, request_deadline);
        let work = hooklane_sender::handle_until(&started.shape, event.payload, Some(send_by));
        Ok::<_, Error>(started.invoke(work).await)
    }))
    .await
}
