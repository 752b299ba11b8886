//! The AWS shape's settings, read from the environment the SAM template gives each function.

use std::{collections::HashMap, time::Duration};

use crate::{
    config::{parse_duration, CoreConfig},
    store::dynamodb::TableNames,
};

#[derive(Debug, thiserror::Error)]
#[error("{variable}: {message}")]
pub struct SettingsError {
    pub variable: std::borrow::Cow<'static, str>,
    pub message: String,
}

fn invalid(
    variable: impl Into<std::borrow::Cow<'static, str>>,
    message: impl Into<String>,
) -> SettingsError {
    SettingsError {
        variable: variable.into(),
        message: message.into(),
    }
}

/// The largest `HOOKLANE_MAX_PAYLOAD` on AWS.
pub const MAX_AWS_PAYLOAD: usize = 350 * 1024;

#[derive(Debug, Clone)]
pub struct AwsSettings {
    pub tables: TableNames,
    pub queue_url: String,
    pub queue_arn: String,
    /// The schedule group and the role Scheduler assumes to send to the queue.
    pub scheduler: Option<(String, String)>,
    /// Where Scheduler puts a schedule it could not deliver (`HOOKLANE_SCHEDULE_DLQ_ARN`).
    pub schedule_dead_letter_arn: Option<String>,
    /// A verified SES identity; without one, owner mail goes to the log.
    pub notification_from: Option<String>,
    /// The admin token itself (`HOOKLANE_ADMIN_TOKEN`): for local runs and tests.
    pub admin_token: Option<String>,
    /// The SSM parameter (a SecureString) holding the admin token
    /// (`HOOKLANE_ADMIN_TOKEN_PARAMETER`): how the deployed stack gets it.
    pub admin_token_parameter: Option<String>,
    /// The SSM parameters (SecureStrings) holding the key of endpoint secrets and, during a
    /// rotation, the key being rotated away from (`HOOKLANE_SECRETS_KEY_PARAMETER`,
    /// `HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER`): how the deployed stack gets them, read by
    /// the functions that need them when they start (`aws::parameters`).
    pub secrets_key_parameter: Option<String>,
    pub secrets_key_previous_parameter: Option<String>,
    /// Running inside Lambda (`AWS_LAMBDA_FUNCTION_NAME` is set): the admin token must then
    /// come from the parameter or the variable, never be generated.
    pub in_lambda: bool,
    /// How long past its due time a pending delivery must be before the sweeper re-sends it.
    pub sweep_grace: Duration,
    pub core: CoreConfig,
}

impl AwsSettings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_vars(&std::env::vars().collect())
    }

    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Self, SettingsError> {
        let get = |name: &str| vars.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
        let required = |name: &'static str| {
            get(name)
                .map(str::to_owned)
                .ok_or_else(|| invalid(name, "must be set"))
        };
        let core = CoreConfig {
            // The health function disables endpoints and abandons their backlog.
            disable_on_attempt: false,
            ..CoreConfig::default()
        }
        .with_settings(|name| vars.get(name).map(String::as_str))
        .map_err(|e| invalid(e.field, e.message))?;
        // Deliveries a large event's fan-out writes, queues and records at a time.
        let core = match get("HOOKLANE_FAN_OUT_PART") {
            Some(raw) => CoreConfig {
                fan_out_part: raw
                    .parse::<usize>()
                    .ok()
                    .filter(|part| *part > 0)
                    .ok_or_else(|| {
                        invalid("HOOKLANE_FAN_OUT_PART", "must be a whole number above 0")
                    })?,
                ..core
            },
            None => core,
        };
        // An event is one DynamoDB item, which holds 400 KB with its other attributes.
        if core.max_payload_bytes > MAX_AWS_PAYLOAD {
            return Err(invalid(
                "HOOKLANE_MAX_PAYLOAD",
                format!(
                    "is at most {}KiB on AWS (a DynamoDB item holds 400 KB)",
                    MAX_AWS_PAYLOAD >> 10
                ),
            ));
        }
        let sweep_grace = match get("HOOKLANE_SWEEP_GRACE") {
            Some(raw) => parse_duration(raw, "HOOKLANE_SWEEP_GRACE")
                .map_err(|e| invalid("HOOKLANE_SWEEP_GRACE", e.message))?,
            None => Duration::from_secs(300),
        };
        let scheduler = match (
            get("HOOKLANE_SCHEDULE_GROUP"),
            get("HOOKLANE_SCHEDULER_ROLE_ARN"),
        ) {
            (Some(group), Some(role)) => Some((group.to_owned(), role.to_owned())),
            (None, None) => None,
            _ => {
                return Err(invalid(
                    "HOOKLANE_SCHEDULE_GROUP",
                    "and HOOKLANE_SCHEDULER_ROLE_ARN must be set together",
                ))
            }
        };
        let admin_token = get("HOOKLANE_ADMIN_TOKEN").map(str::to_owned);
        let admin_token_parameter = get("HOOKLANE_ADMIN_TOKEN_PARAMETER").map(str::to_owned);
        if admin_token.is_some() && admin_token_parameter.is_some() {
            return Err(invalid(
                "HOOKLANE_ADMIN_TOKEN_PARAMETER",
                "and HOOKLANE_ADMIN_TOKEN are both set; keep only one",
            ));
        }
        let secrets_key_parameter = get("HOOKLANE_SECRETS_KEY_PARAMETER").map(str::to_owned);
        let secrets_key_previous_parameter =
            get("HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER").map(str::to_owned);
        if secrets_key_parameter.is_some() && core.secrets.current.is_some() {
            return Err(invalid(
                "HOOKLANE_SECRETS_KEY_PARAMETER",
                "and HOOKLANE_SECRETS_KEY are both set; keep only one",
            ));
        }
        if secrets_key_previous_parameter.is_some() && secrets_key_parameter.is_none() {
            return Err(invalid(
                "HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER",
                "is set without HOOKLANE_SECRETS_KEY_PARAMETER (the key that replaces it)",
            ));
        }
        Ok(Self {
            tables: TableNames::with_prefix(&required("HOOKLANE_TABLE_PREFIX")?),
            queue_url: required("HOOKLANE_QUEUE_URL")?,
            queue_arn: required("HOOKLANE_QUEUE_ARN")?,
            scheduler,
            schedule_dead_letter_arn: get("HOOKLANE_SCHEDULE_DLQ_ARN").map(str::to_owned),
            notification_from: get("HOOKLANE_NOTIFICATION_FROM").map(str::to_owned),
            admin_token,
            admin_token_parameter,
            secrets_key_parameter,
            secrets_key_previous_parameter,
            in_lambda: get("AWS_LAMBDA_FUNCTION_NAME").is_some(),
            sweep_grace,
            core,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::environment;

    /// The largest request the api takes at the largest AWS payload (every character escaped
    /// six-fold), escaped once more inside the function's event (a byte at most doubled),
    /// fits the 6 MB a Lambda function is invoked with; the batch's limit stays the one that
    /// keeps its items within one DynamoDB transaction.
    #[test]
    fn the_largest_request_fits_the_api_function() {
        let core = CoreConfig {
            max_payload_bytes: MAX_AWS_PAYLOAD,
            ..CoreConfig::default()
        };
        assert!(2 * core.body_limit() < 6_000_000, "{}", core.body_limit());
        assert_eq!(core.batch_body_limit(), crate::config::BATCH_BODY_BYTES);
    }

    #[test]
    fn settings_from_the_template_variables() {
        let base = [
            ("HOOKLANE_TABLE_PREFIX", "hooklane"),
            ("HOOKLANE_QUEUE_URL", "https://sqs/q"),
            ("HOOKLANE_QUEUE_ARN", "arn:aws:sqs:us-east-1:1:q"),
        ];
        let settings = AwsSettings::from_vars(&environment(&base)).unwrap();
        assert_eq!(settings.tables.deliveries, "hooklane-delivery-log");
        assert!(settings.scheduler.is_none());
        assert!(
            !settings.core.disable_on_attempt,
            "a sender invocation must not abandon a backlog; the health function disables"
        );
        let mut more = base.to_vec();
        more.extend([
            ("HOOKLANE_SCHEDULE_GROUP", "g"),
            ("HOOKLANE_SCHEDULER_ROLE_ARN", "arn:role"),
            ("HOOKLANE_DISABLE_AFTER", "2h"),
            ("HOOKLANE_OPERATIONS_ACCOUNT", "ops"),
            ("HOOKLANE_RETRY_SCHEDULE", "60,1801"),
            ("HOOKLANE_SCHEDULE_DLQ_ARN", "arn:aws:sqs:us-east-1:1:dlq"),
            ("HOOKLANE_HTTPS_ONLY", "true"),
        ]);
        let settings = AwsSettings::from_vars(&environment(&more)).unwrap();
        assert!(
            settings.core.sender.policy.https_only(),
            "HOOKLANE_HTTPS_ONLY holds on AWS as in the embedded shape"
        );
        assert_eq!(settings.scheduler, Some(("g".into(), "arn:role".into())));
        assert_eq!(
            settings.schedule_dead_letter_arn.as_deref(),
            Some("arn:aws:sqs:us-east-1:1:dlq")
        );
        assert_eq!(settings.core.disable_after, Duration::from_secs(7200));
        assert_eq!(
            settings.core.retry.schedule.delays(),
            &[Duration::from_secs(60), Duration::from_secs(1801)]
        );
        let err = AwsSettings::from_vars(&environment(&base[..2])).unwrap_err();
        assert_eq!(err.variable, "HOOKLANE_QUEUE_ARN");
        let mut big = base.to_vec();
        big.push(("HOOKLANE_MAX_PAYLOAD", "1MiB"));
        let err = AwsSettings::from_vars(&environment(&big)).unwrap_err();
        assert_eq!(err.variable, "HOOKLANE_MAX_PAYLOAD");
        let mut limited = base.to_vec();
        limited.extend([
            ("HOOKLANE_MAX_PAYLOAD", "128KiB"),
            ("HOOKLANE_PUBLISH_RATE", "20"),
        ]);
        let settings = AwsSettings::from_vars(&environment(&limited)).unwrap();
        assert_eq!(settings.core.max_payload_bytes, 128 * 1024);
        assert_eq!(settings.core.publish_rate.map(|r| r.per_second), Some(20));
        let mut half = base.to_vec();
        half.push(("HOOKLANE_SCHEDULE_GROUP", "g"));
        assert!(AwsSettings::from_vars(&environment(&half)).is_err());
        assert_eq!(
            AwsSettings::from_vars(&environment(&base))
                .unwrap()
                .core
                .fan_out_part,
            crate::service::fan_out::FAN_OUT_PART
        );
        for (part, read) in [("2", Some(2)), ("0", None), ("-1", None), ("many", None)] {
            let mut parts = base.to_vec();
            parts.push(("HOOKLANE_FAN_OUT_PART", part));
            match (AwsSettings::from_vars(&environment(&parts)), read) {
                (Ok(settings), Some(read)) => assert_eq!(settings.core.fan_out_part, read),
                (Err(err), None) => assert_eq!(err.variable, "HOOKLANE_FAN_OUT_PART", "{part}"),
                (other, _) => panic!("HOOKLANE_FAN_OUT_PART={part}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_admin_token_comes_from_one_source() {
        let base = [
            ("HOOKLANE_TABLE_PREFIX", "hooklane"),
            ("HOOKLANE_QUEUE_URL", "https://sqs/q"),
            ("HOOKLANE_QUEUE_ARN", "arn:aws:sqs:us-east-1:1:q"),
        ];
        let local = AwsSettings::from_vars(&environment(&base)).unwrap();
        assert!(!local.in_lambda);
        assert_eq!(local.admin_token_parameter, None);
        let mut deployed = base.to_vec();
        deployed.extend([
            ("HOOKLANE_ADMIN_TOKEN_PARAMETER", "/hooklane/admin-token"),
            ("AWS_LAMBDA_FUNCTION_NAME", "hooklane-ApiFunction-1"),
        ]);
        let deployed = AwsSettings::from_vars(&environment(&deployed)).unwrap();
        assert!(deployed.in_lambda);
        assert_eq!(
            deployed.admin_token_parameter.as_deref(),
            Some("/hooklane/admin-token")
        );
        let mut both = base.to_vec();
        both.extend([
            ("HOOKLANE_ADMIN_TOKEN_PARAMETER", "/hooklane/admin-token"),
            ("HOOKLANE_ADMIN_TOKEN", "hl_admin_x"),
        ]);
        let err = AwsSettings::from_vars(&environment(&both)).unwrap_err();
        assert_eq!(err.variable, "HOOKLANE_ADMIN_TOKEN_PARAMETER");
    }

    #[test]
    fn the_secrets_key_comes_from_one_source_and_a_previous_one_needs_a_current_one() {
        let base = [
            ("HOOKLANE_TABLE_PREFIX", "hooklane"),
            ("HOOKLANE_QUEUE_URL", "https://sqs/q"),
            ("HOOKLANE_QUEUE_ARN", "arn:aws:sqs:us-east-1:1:q"),
        ];
        let with = |more: &[(&'static str, &'static str)]| {
            let mut vars = base.to_vec();
            vars.extend_from_slice(more);
            AwsSettings::from_vars(&environment(&vars))
        };
        let key = "ab".repeat(32);
        let key: &'static str = Box::leak(key.into_boxed_str());
        let rotating = with(&[
            ("HOOKLANE_SECRETS_KEY_PARAMETER", "/h/new"),
            ("HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER", "/h/old"),
        ])
        .unwrap();
        assert_eq!(
            (
                rotating.secrets_key_parameter.as_deref(),
                rotating.secrets_key_previous_parameter.as_deref()
            ),
            (Some("/h/new"), Some("/h/old"))
        );
        let both = with(&[
            ("HOOKLANE_SECRETS_KEY_PARAMETER", "/h/new"),
            ("HOOKLANE_SECRETS_KEY", key),
        ])
        .unwrap_err();
        assert_eq!(both.variable, "HOOKLANE_SECRETS_KEY_PARAMETER");
        let orphan = with(&[("HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER", "/h/old")]).unwrap_err();
        assert_eq!(orphan.variable, "HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER");
    }
}
