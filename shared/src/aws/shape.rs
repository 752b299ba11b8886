//! The AWS shape wired from environment variables (set by the SAM template): what each
//! Lambda function builds once in `main`.

use std::{collections::HashMap, sync::Arc, time::Duration};

use super::{
    clients::{self, SharedInterceptor},
    load_sdk_config,
};
use crate::{
    clock::SystemClock,
    config::{parse_duration, CoreConfig},
    http::HttpSender,
    notify::{ses::SesNotifier, LogNotifier, Notifier},
    queue::sqs::{SchedulerTarget, SqsQueue},
    slots::dynamodb::DynamoSlots,
    store::dynamodb::{DynamoStore, Retention, TableNames},
    App, PublishMode,
};

#[derive(Debug, thiserror::Error)]
#[error("{variable}: {message}")]
pub struct SettingsError {
    pub variable: &'static str,
    pub message: String,
}

fn invalid(variable: &'static str, message: impl Into<String>) -> SettingsError {
    SettingsError {
        variable,
        message: message.into(),
    }
}

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
        Ok(Self {
            tables: TableNames::with_prefix(&required("HOOKLANE_TABLE_PREFIX")?),
            queue_url: required("HOOKLANE_QUEUE_URL")?,
            queue_arn: required("HOOKLANE_QUEUE_ARN")?,
            scheduler,
            schedule_dead_letter_arn: get("HOOKLANE_SCHEDULE_DLQ_ARN").map(str::to_owned),
            notification_from: get("HOOKLANE_NOTIFICATION_FROM").map(str::to_owned),
            admin_token,
            admin_token_parameter,
            in_lambda: get("AWS_LAMBDA_FUNCTION_NAME").is_some(),
            sweep_grace,
            core,
        })
    }
}

/// The engine on AWS: the App over DynamoDB, SQS (+ Scheduler) and SES, plus the slots.
#[derive(Clone)]
pub struct AwsShape {
    pub app: App,
    pub store: Arc<DynamoStore>,
    pub slots: Arc<DynamoSlots>,
    /// The sweeper's grace (`AwsSettings::sweep_grace`): the sender moves a waiting
    /// delivery's next try before the sweeper would take its message for lost.
    pub sweep_grace: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot build the outbound HTTP client: {0}")]
pub struct ConnectError(String);

/// Builds the clients once (a Lambda's `main` calls this before the first event).
pub async fn connect(settings: &AwsSettings) -> Result<AwsShape, ConnectError> {
    connect_with(settings, None).await
}

/// [`connect`], with `extra` on every SDK client (a measurement's request meter).
pub async fn connect_with(
    settings: &AwsSettings,
    extra: Option<&SharedInterceptor>,
) -> Result<AwsShape, ConnectError> {
    let sdk = load_sdk_config().await;
    let clock = Arc::new(SystemClock);
    let dynamodb = clients::dynamodb(&sdk, extra);
    let store = Arc::new(DynamoStore::new(
        dynamodb.clone(),
        settings.tables.clone(),
        Retention::default(),
    ));
    let scheduler = settings
        .scheduler
        .as_ref()
        .map(|(group, role)| SchedulerTarget {
            client: clients::scheduler(&sdk, extra),
            group: group.clone(),
            role_arn: role.clone(),
            dead_letter_arn: settings.schedule_dead_letter_arn.clone(),
        });
    let queue = SqsQueue::new(
        clients::sqs(&sdk, extra),
        &settings.queue_url,
        &settings.queue_arn,
        scheduler,
        clock.clone(),
    );
    let notifier: Arc<dyn Notifier> = match &settings.notification_from {
        Some(from) => Arc::new(SesNotifier::new(clients::sesv2(&sdk, extra), from)),
        None => Arc::new(LogNotifier),
    };
    let transport =
        HttpSender::new(settings.core.sender.clone()).map_err(|e| ConnectError(e.to_string()))?;
    let slots = Arc::new(DynamoSlots::new(
        dynamodb,
        settings.tables.control.clone(),
        clock.clone(),
    ));
    let app = App {
        store: store.clone(),
        queue: Arc::new(queue),
        transport: Arc::new(transport),
        notifier,
        clock,
        config: Arc::new(settings.core.clone()),
        // The events table's stream feeds the fan-out function, so the API writes only the
        // event (one put instead of a transaction with every delivery, and no SQS send).
        publish: PublishMode::ThroughStream,
    };
    Ok(AwsShape {
        app,
        store,
        slots,
        sweep_grace: settings.sweep_grace,
    })
}

const ADMIN_TOKEN_SETTING: &str = "admin_token";

#[derive(Debug, thiserror::Error)]
pub enum AdminTokenError {
    #[error(
        "no admin token configured: set HOOKLANE_ADMIN_TOKEN_PARAMETER to the SSM parameter \
         that holds it"
    )]
    NotConfigured,
    #[error("cannot read the admin token from SSM parameter {parameter}: {message}")]
    Parameter { parameter: String, message: String },
    #[error("the admin token in SSM parameter {0} is empty")]
    EmptyParameter(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// The API's admin token, read once when the function starts: from the SSM parameter
/// `HOOKLANE_ADMIN_TOKEN_PARAMETER` (decrypted), else `HOOKLANE_ADMIN_TOKEN`. Outside Lambda
/// (local runs against an emulator) a token can also be generated on first use and kept in
/// the control table; a deployed function refuses to start without a configured one.
pub async fn admin_token(
    shape: &AwsShape,
    settings: &AwsSettings,
) -> Result<String, AdminTokenError> {
    if let Some(parameter) = &settings.admin_token_parameter {
        let ssm = clients::ssm(&load_sdk_config().await, None);
        return admin_token_from_parameter(&ssm, parameter).await;
    }
    if let Some(token) = &settings.admin_token {
        return Ok(token.clone());
    }
    if settings.in_lambda {
        return Err(AdminTokenError::NotConfigured);
    }
    let generated = format!("hl_admin_{}", uuid::Uuid::new_v4().simple());
    Ok(shape
        .app
        .store
        .put_setting_if_absent(ADMIN_TOKEN_SETTING, &generated)
        .await?)
}

async fn admin_token_from_parameter(
    ssm: &aws_sdk_ssm::Client,
    parameter: &str,
) -> Result<String, AdminTokenError> {
    let response = ssm
        .get_parameter()
        .name(parameter)
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| AdminTokenError::Parameter {
            parameter: parameter.to_owned(),
            message: super::error_text(&e),
        })?;
    let token = response
        .parameter
        .and_then(|p| p.value)
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    if token.is_empty() {
        return Err(AdminTokenError::EmptyParameter(parameter.to_owned()));
    }
    Ok(token)
}

#[derive(Debug, thiserror::Error)]
#[error("cannot provision the stack: {0}")]
pub struct ProvisionError(#[from] super::stack::StackError);

/// The stack-location variables the template gives the functions, for a provisioned stack:
/// the sender's environment (which has them all) without the settings a deployer chooses
/// (mail, admin token, timings), which local runs take from their own environment.
pub fn stack_vars(stack: &super::stack::Stack) -> Result<Vec<(String, String)>, ProvisionError> {
    const LOCATION: [&str; 6] = [
        "HOOKLANE_TABLE_PREFIX",
        "HOOKLANE_QUEUE_URL",
        "HOOKLANE_QUEUE_ARN",
        "HOOKLANE_SCHEDULE_GROUP",
        "HOOKLANE_SCHEDULER_ROLE_ARN",
        "HOOKLANE_SCHEDULE_DLQ_ARN",
    ];
    Ok(stack
        .function_env("SenderFunction")?
        .into_iter()
        .filter(|(name, _)| LOCATION.contains(&name.as_str()))
        .collect())
}

/// Creates the stack `prefix` as `infra/template.yaml` defines it (tables, queues, schedule
/// group) on the AWS endpoint in use (the emulator, in tests and local development; the SAM
/// template does this in production) and returns the settings that reach it, read from the
/// template's function environment. Existing resources are reused.
pub async fn provision(prefix: &str, core: CoreConfig) -> Result<AwsSettings, ProvisionError> {
    let (settings, _) = provision_stack(prefix, core).await?;
    Ok(settings)
}

/// [`provision`], with the stack's physical resources (for checks against the template).
pub async fn provision_stack(
    prefix: &str,
    core: CoreConfig,
) -> Result<(AwsSettings, super::stack::Stack), ProvisionError> {
    let sdk = load_sdk_config().await;
    let stack = super::stack::deploy(&sdk, prefix, &[]).await?;
    let vars: HashMap<String, String> = stack_vars(&stack)?.into_iter().collect();
    let located = AwsSettings::from_vars(&vars).map_err(|e| {
        super::stack::StackError::Template(format!("the sender's environment: {e}"))
    })?;
    let settings = AwsSettings {
        notification_from: None,
        admin_token: None,
        admin_token_parameter: None,
        in_lambda: false,
        sweep_grace: Duration::from_secs(300),
        // As `from_vars`: the health check disables endpoints on AWS, never an attempt.
        core: CoreConfig {
            disable_on_attempt: false,
            ..core
        },
        ..located
    };
    Ok((settings, stack))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn settings_from_the_template_variables() {
        let base = [
            ("HOOKLANE_TABLE_PREFIX", "hooklane"),
            ("HOOKLANE_QUEUE_URL", "https://sqs/q"),
            ("HOOKLANE_QUEUE_ARN", "arn:aws:sqs:us-east-1:1:q"),
        ];
        let settings = AwsSettings::from_vars(&vars(&base)).unwrap();
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
        let settings = AwsSettings::from_vars(&vars(&more)).unwrap();
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
        let err = AwsSettings::from_vars(&vars(&base[..2])).unwrap_err();
        assert_eq!(err.variable, "HOOKLANE_QUEUE_ARN");
        let mut half = base.to_vec();
        half.push(("HOOKLANE_SCHEDULE_GROUP", "g"));
        assert!(AwsSettings::from_vars(&vars(&half)).is_err());
    }

    #[test]
    fn the_admin_token_comes_from_one_source() {
        let base = [
            ("HOOKLANE_TABLE_PREFIX", "hooklane"),
            ("HOOKLANE_QUEUE_URL", "https://sqs/q"),
            ("HOOKLANE_QUEUE_ARN", "arn:aws:sqs:us-east-1:1:q"),
        ];
        let local = AwsSettings::from_vars(&vars(&base)).unwrap();
        assert!(!local.in_lambda);
        assert_eq!(local.admin_token_parameter, None);
        let mut deployed = base.to_vec();
        deployed.extend([
            ("HOOKLANE_ADMIN_TOKEN_PARAMETER", "/hooklane/admin-token"),
            ("AWS_LAMBDA_FUNCTION_NAME", "hooklane-ApiFunction-1"),
        ]);
        let deployed = AwsSettings::from_vars(&vars(&deployed)).unwrap();
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
        let err = AwsSettings::from_vars(&vars(&both)).unwrap_err();
        assert_eq!(err.variable, "HOOKLANE_ADMIN_TOKEN_PARAMETER");
    }
}
