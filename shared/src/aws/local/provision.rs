//! Provisioning for local runs: the stack of `infra/template.yaml` created on the AWS endpoint
//! in use (an emulator), and the settings that reach it.

use std::{collections::HashMap, time::Duration};

use crate::{
    aws::{load_sdk_config, settings::AwsSettings},
    config::CoreConfig,
};

#[derive(Debug, thiserror::Error)]
#[error("cannot provision the stack: {0}")]
pub struct ProvisionError(#[from] crate::aws::stack::StackError);

/// The stack-location variables the template gives the functions, for a provisioned stack:
/// the sender's environment (which has them all) without the settings a deployer chooses
/// (mail, admin token, timings), which local runs take from their own environment.
pub fn stack_vars(
    stack: &crate::aws::stack::Stack,
) -> Result<Vec<(String, String)>, ProvisionError> {
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
) -> Result<(AwsSettings, crate::aws::stack::Stack), ProvisionError> {
    let sdk = load_sdk_config().await;
    let stack = crate::aws::stack::deploy(&sdk, prefix, &[]).await?;
    let vars: HashMap<String, String> = stack_vars(&stack)?.into_iter().collect();
    let located = AwsSettings::from_vars(&vars).map_err(|e| {
        crate::aws::stack::StackError::Template(format!("the sender's environment: {e}"))
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
