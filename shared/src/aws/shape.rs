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
    secrets::{generate_key, key_id, parse_key, SecretsCipher},
    slots::dynamodb::DynamoSlots,
    store::{
        dynamodb::{DynamoStore, Retention},
        Store,
    },
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
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(String);

/// Where a local run without `HOOKLANE_SECRETS_KEY` keeps its generated key.
const SECRETS_KEY_SETTING: &str = "secrets_key";

/// The cipher of endpoint secrets: `HOOKLANE_SECRETS_KEY` (and `_PREVIOUS`). A deployed
/// function refuses to start without it. A local run against an emulator generates a key
/// once and keeps it in the control table, which protects nothing against a copy of that
/// table: it only lets a local stack restart and still read its secrets.
async fn secrets_cipher(
    settings: &AwsSettings,
    dynamodb: &aws_sdk_dynamodb::Client,
) -> Result<SecretsCipher, ConnectError> {
    let invalid = |e: crate::domain::InvalidField| ConnectError(e.to_string());
    if let Some(cipher) = settings.core.secrets.cipher_or(None) {
        return cipher.map_err(invalid);
    }
    if settings.in_lambda {
        return Err(ConnectError(
            "HOOKLANE_SECRETS_KEY is not set: endpoint signing secrets are encrypted with it \
             (the stack's SecretsKey parameter)"
                .into(),
        ));
    }
    let bootstrap = DynamoStore::new(
        dynamodb.clone(),
        settings.tables.clone(),
        Retention::from_core(&settings.core),
        SecretsCipher::ephemeral().map_err(|e| ConnectError(e.to_string()))?,
    );
    let generated = generate_key().map_err(|e| ConnectError(e.to_string()))?;
    let stored = bootstrap
        .put_setting_if_absent(SECRETS_KEY_SETTING, &generated)
        .await
        .map_err(|e| ConnectError(format!("cannot keep the generated secrets key: {e}")))?;
    let key = parse_key(&stored, "HOOKLANE_SECRETS_KEY").map_err(invalid)?;
    tracing::warn!(
        key_id = %key_id(&key),
        "HOOKLANE_SECRETS_KEY is not set: endpoint secrets are encrypted with a key generated \
         into the control table, which a copy of that table holds; set HOOKLANE_SECRETS_KEY \
         for anything but a local run"
    );
    SecretsCipher::new(&key, None).map_err(invalid)
}

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
        Retention::from_core(&settings.core),
        secrets_cipher(settings, &dynamodb).await?,
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
    })
}
