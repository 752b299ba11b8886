//! The SDK clients of the AWS shape, each built from one SDK configuration, with an
//! optional extra interceptor (a measurement's meter, a test's counter) and the request
//! recorder when `HOOKLANE_AWS_REQUEST_LOG` is set (`aws::record`).

use aws_config::SdkConfig;
pub use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;

/// One `pub fn $name(sdk, extra) -> $sdk::Client` per SDK: the builders are distinct types
/// with no common trait.
macro_rules! client {
    ($name:ident, $sdk:ident) => {
        pub fn $name(sdk: &SdkConfig, extra: Option<&SharedInterceptor>) -> $sdk::Client {
            let mut config = $sdk::config::Builder::from(sdk);
            if let Some(extra) = extra {
                config.push_interceptor(extra.clone());
            }
            if let Some(recorder) = crate::aws::record::recorder() {
                config = config.interceptor(recorder);
            }
            $sdk::Client::from_conf(config.build())
        }
    };
}

client!(dynamodb, aws_sdk_dynamodb);
client!(sqs, aws_sdk_sqs);
client!(scheduler, aws_sdk_scheduler);
client!(sesv2, aws_sdk_sesv2);
client!(dynamodbstreams, aws_sdk_dynamodbstreams);
client!(ssm, aws_sdk_ssm);
