//! The AWS shape wired from its settings: what each Lambda function builds once in `main`.

use std::{sync::Arc, time::Duration};

use super::{
    clients::{self, SharedInterceptor},
    load_sdk_config,
    settings::AwsSettings,
};
use crate::{
    clock::SystemClock,
    http::HttpSender,
    notify::{ses::SesNotifier, LogNotifier, Notifier},
    queue::sqs::{SchedulerTarget, SqsQueue},
    secrets::SecretsAccess,
    slots::dynamodb::DynamoSlots,
    store::dynamodb::{DynamoStore, Retention},
    App, PublishMode,
};

/// The engine on AWS: the App over DynamoDB, SQS (+ Scheduler) and SES, plus the slots.
#[derive(Clone)]
pub struct AwsShape {
    pub app: App,
    pub store: Arc<DynamoStore>,
    pub slots: Arc<DynamoSlots>,
    /// The sweeper's grace (`AwsSettings::sweep_grace`): the sender moves a waiting
    /// delivery's next try before the sweeper would take its message for lost.
    pub sweep_grace: Duration,
    /// For the SecureString parameters read at start (the admin token, the secrets key).
    pub ssm: aws_sdk_ssm::Client,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(String);

/// What a function does with endpoint signing secrets: the API (which creates endpoints and
/// shows their secrets) and the sender (which signs) need the key; the others read
/// endpoints without their secrets and are not given it (`infra/template.yaml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretsUse {
    /// The key must be there (from its SSM parameter, `HOOKLANE_SECRETS_KEY_PARAMETER`, or
    /// `HOOKLANE_SECRETS_KEY`): without it the function refuses to start.
    Needed,
    /// No key is read, even if one is set: endpoints come without their secrets.
    Withheld,
}

/// The store's access to endpoint secrets. The key is the operator's: on AWS it is never
/// generated or stored by Hooklane.
async fn secrets_access(
    settings: &AwsSettings,
    use_: SecretsUse,
    ssm: &aws_sdk_ssm::Client,
) -> Result<SecretsAccess, ConnectError> {
    if use_ == SecretsUse::Withheld {
        return Ok(SecretsAccess::Withheld);
    }
    let keys = super::parameters::secrets_keys(
        ssm,
        settings.secrets_key_parameter.as_deref(),
        settings.secrets_key_previous_parameter.as_deref(),
        &settings.core.secrets,
    )
    .await
    .map_err(|e| ConnectError(format!("the key of endpoint secrets: {e}")))?;
    match keys.cipher_or(None) {
        Some(cipher) => {
            let cipher = cipher.map_err(|e| ConnectError(e.to_string()))?;
            tracing::info!(
                key_id = cipher.key_id(),
                previous_key_id = cipher.previous_key_id(),
                "endpoint secrets are encrypted at rest"
            );
            Ok(SecretsAccess::Keys(cipher))
        }
        None => Err(ConnectError(
            "no key of endpoint secrets: they are encrypted at rest with one (32 bytes as 64 \
             hex digits or base64, e.g. `openssl rand -hex 32`). On a stack it is the SSM \
             SecureString parameter SecretsKeyParameterName names \
             (HOOKLANE_SECRETS_KEY_PARAMETER); locally, HOOKLANE_SECRETS_KEY. See \
             docs/OPERATIONS.md, \"Secrets at rest\""
                .into(),
        )),
    }
}

/// Builds the clients once (a Lambda's `main` calls this before the first event), with the
/// key of endpoint secrets (required).
pub async fn connect(settings: &AwsSettings) -> Result<AwsShape, ConnectError> {
    connect_with(settings, None).await
}

/// [`connect`], with `extra` on every SDK client (a measurement's request meter).
pub async fn connect_with(
    settings: &AwsSettings,
    extra: Option<&SharedInterceptor>,
) -> Result<AwsShape, ConnectError> {
    connect_using(settings, extra, SecretsUse::Needed).await
}

/// [`connect`], for a function that `use_`s endpoint secrets as said.
pub async fn connect_using(
    settings: &AwsSettings,
    extra: Option<&SharedInterceptor>,
    use_: SecretsUse,
) -> Result<AwsShape, ConnectError> {
    let sdk = load_sdk_config().await;
    // Every client from this one SDK configuration: it is loaded once per cold start.
    let ssm = clients::ssm(&sdk, extra);
    let clock = Arc::new(SystemClock);
    let dynamodb = clients::dynamodb(&sdk, extra);
    let store = Arc::new(DynamoStore::new(
        dynamodb.clone(),
        settings.tables.clone(),
        Retention::from_core(&settings.core),
        secrets_access(settings, use_, &ssm).await?,
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
    let transport = HttpSender::new(settings.core.sender.clone())
        .map_err(|e| ConnectError(format!("cannot build the outbound HTTP client: {e}")))?;
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
        ssm,
    })
}
