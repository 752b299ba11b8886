//! Provisions a Hooklane stack on the AWS endpoint in use (the local emulator, through
//! `AWS_ENDPOINT_URL`) and seeds it: account `acme`, one endpoint at RECEIVER_URL, and
//! DELIVERIES published events. Prints one JSON object with the environment the SAM
//! template gives the functions and the queue message body of each delivery.
//! `scripts/lambda-footprint` uses it to give each Lambda bootstrap real tables, a real
//! queue and real work.
//!
//! Usage: cargo run --example emulator_stack --features aws -- PREFIX RECEIVER_URL DELIVERIES

use hooklane::{
    aws::{
        aws_sdk_ssm::{self, types::ParameterType},
        load_sdk_config,
        local::provision,
        shape::connect,
    },
    config::CoreConfig,
    http::AddressPolicy,
    queue::sqs::DeliveryMessage,
    secrets::{generate_key, parse_key},
    service::{
        accounts::{self, NewAccount},
        endpoints::{self, NewEndpoint},
        fan_out::fan_out,
        publish::{publish, NewEvent},
    },
};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [prefix, receiver_url, deliveries] = args.as_slice() else {
        return Err("usage: emulator_stack PREFIX RECEIVER_URL DELIVERIES".into());
    };
    let deliveries: usize = deliveries.parse()?;
    let mut core = CoreConfig::default();
    core.sender.policy = AddressPolicy::new(vec!["127.0.0.0/8".parse()?], false);
    // The key of endpoint secrets: a fresh key for this run, handed to the functions below.
    let secrets_key = generate_key()?;
    core.secrets.current = Some(parse_key(&secrets_key, "HOOKLANE_SECRETS_KEY")?);
    let settings = provision(prefix, core).await?;
    let shape = connect(&settings).await?;
    let account = accounts::create(
        &shape.app,
        NewAccount {
            id: Some("acme".into()),
            name: "Acme".into(),
            owner_email: "owner@example.com".into(),
            ..NewAccount::default()
        },
        &hooklane::domain::Caller::system(),
    )
    .await?;
    endpoints::create(
        &shape.app,
        &account.id,
        NewEndpoint {
            url: receiver_url.clone(),
            ..NewEndpoint::default()
        },
        &hooklane::domain::Caller::system(),
    )
    .await?;
    let mut messages = Vec::new();
    for n in 0..deliveries {
        let published = publish(
            &shape.app,
            &account.id,
            NewEvent {
                id: Some(format!("evt_seed_{n}")),
                event_type: "invoice.paid".into(),
                data: serde_json::json!({ "amount": 42, "n": n }),
            },
        )
        .await?;
        // What the events table's stream would hand the fan-out function.
        fan_out(&shape.app, &published.event).await?;
        for delivery in &published.deliveries {
            messages.push(serde_json::to_string(&DeliveryMessage {
                delivery_id: delivery.id.to_string(),
                endpoint_id: delivery.endpoint_id.to_string(),
                account_id: delivery.account_id.to_string(),
            })?);
        }
    }
    let mut env = serde_json::Map::new();
    let mut set = |name: &str, value: &str| {
        env.insert(name.into(), serde_json::Value::String(value.into()));
    };
    set("HOOKLANE_TABLE_PREFIX", prefix);
    set("HOOKLANE_SECRETS_KEY", &secrets_key);
    // As deployed: the api function reads its admin token from an SSM SecureString.
    let token_parameter = format!("/{prefix}/admin-token");
    aws_sdk_ssm::Client::new(&load_sdk_config().await)
        .put_parameter()
        .name(&token_parameter)
        .r#type(ParameterType::SecureString)
        .value(format!("hl_admin_{prefix}_footprint"))
        .send()
        .await?;
    set("HOOKLANE_ADMIN_TOKEN_PARAMETER", &token_parameter);
    set("HOOKLANE_QUEUE_URL", &settings.queue_url);
    set("HOOKLANE_QUEUE_ARN", &settings.queue_arn);
    if let Some((group, role)) = &settings.scheduler {
        set("HOOKLANE_SCHEDULE_GROUP", group);
        set("HOOKLANE_SCHEDULER_ROLE_ARN", role);
    }
    println!(
        "{}",
        serde_json::json!({ "env": env, "messages": messages })
    );
    Ok(())
}
