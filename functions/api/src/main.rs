use hooklane::aws::shape::{connect, AwsSettings};
use lambda_http::{run, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    hooklane::aws::init_lambda_logging();
    let settings = AwsSettings::from_env()?;
    let shape = connect(&settings).await?;
    run(hooklane_api::api_router(&shape, &settings).await?).await
}
