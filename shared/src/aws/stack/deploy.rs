//! Creating the template's queues, tables and schedule groups on the AWS endpoint in use.

use std::{collections::BTreeMap, time::Duration};

use aws_config::SdkConfig;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
    PointInTimeRecoverySpecification, Projection, ProjectionType, ScalarAttributeType,
    StreamSpecification, StreamViewType, TableStatus, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
use futures_util::future::try_join_all;
use serde_json::{Map, Value};

use super::{
    generated_name, resources_of, template, template_error, text, Physical, Stack, StackError,
    NOT_PROVISIONED,
};
use crate::aws::error_text;

/// Every resource of the template is one the provisioner creates or leaves out on purpose:
/// a new kind of resource must be decided on, not silently skipped.
pub(super) fn check_types(resources: &Map<String, Value>) -> Result<(), StackError> {
    const PROVISIONED: [&str; 3] = [
        "AWS::SQS::Queue",
        "AWS::DynamoDB::Table",
        "AWS::Scheduler::ScheduleGroup",
    ];
    for (logical, resource) in resources {
        let kind = resource["Type"].as_str().unwrap_or_default();
        if !PROVISIONED.contains(&kind) && !NOT_PROVISIONED.contains(&kind) {
            return Err(template_error(format!(
                "{logical} is a {kind}, which the provisioner (shared/src/aws/stack/) neither creates nor leaves out on purpose"
            )));
        }
    }
    Ok(())
}

fn create_error(resource: &str, message: impl Into<String>) -> StackError {
    StackError::Create {
        resource: resource.to_owned(),
        message: message.into(),
    }
}

/// Creates the stack `name` on the AWS endpoint in use (the emulator in tests and local
/// development; `sam deploy` does this in production): its queues, tables and schedule
/// groups, as the template defines them. Existing queues get the template's settings back;
/// existing tables are reused as they are (keys and indexes cannot change in place), with
/// their TTL and point-in-time recovery turned on. Every other resource type must be one the
/// provisioner leaves out.
pub async fn deploy(
    sdk: &SdkConfig,
    name: &str,
    parameters: &[(&str, &str)],
) -> Result<Stack, StackError> {
    let all = template()?["Resources"]
        .as_object()
        .ok_or_else(|| template_error("no Resources"))?;
    check_types(all)?;
    // Without the roles the stack is not whole (the sender's schedules need the Scheduler's
    // role): on AWS itself the template is deployed with SAM.
    if sdk.endpoint_url().is_none() {
        return Err(template_error(
            "provisioning makes a stack on an emulator (set AWS_ENDPOINT_URL); on AWS, deploy \
             infra/template.yaml with sam deploy, which also creates the roles",
        ));
    }
    let region = sdk.region().map_or("us-east-1", |r| r.as_ref()).to_owned();
    // The queues reference only each other (a redrive policy names its target's ARN), and
    // the account the stack is in is read off the first queue's ARN.
    let mut queued = Stack::new(name, &region, "", parameters)?;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let mut queues = resources_of("AWS::SQS::Queue")?;
    queues.sort_by_key(|(_, p)| p.get("RedrivePolicy").is_some());
    let mut created_queues = BTreeMap::new();
    for (logical, properties) in queues {
        let physical = create_queue(&sqs, &queued, logical, properties).await?;
        queued.resources.insert(logical.clone(), physical.clone());
        created_queues.insert(logical.clone(), physical);
    }
    let account = created_queues
        .values()
        .next()
        .and_then(|q| q.attributes["Arn"].split(':').nth(4))
        .filter(|a| !a.is_empty())
        .ok_or_else(|| template_error("no queue to learn the account from"))?
        .to_owned();
    let mut stack = Stack::new(name, &region, &account, parameters)?;
    stack.resources.extend(created_queues);
    let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
    let tables = resources_of("AWS::DynamoDB::Table")?;
    let created = try_join_all(
        tables
            .iter()
            .map(|(logical, _)| create_table(&dynamodb, &stack, logical)),
    )
    .await?;
    for ((logical, _), stream_arn) in tables.iter().zip(created) {
        if let (Some(arn), Some(physical)) = (stream_arn, stack.resources.get_mut(logical.as_str()))
        {
            physical.attributes.insert("StreamArn".to_owned(), arn);
        }
    }
    let scheduler = aws_sdk_scheduler::Client::new(sdk);
    for (logical, _) in resources_of("AWS::Scheduler::ScheduleGroup")? {
        let group = stack.resources[logical.as_str()].reference.clone();
        let created = scheduler.create_schedule_group().name(&group).send().await;
        if let Err(e) = created {
            if !e
                .as_service_error()
                .is_some_and(|s| s.is_conflict_exception())
            {
                return Err(create_error(logical, error_text(&e)));
            }
        }
    }
    Ok(stack)
}

type QueueAttributes = Vec<(QueueAttributeName, String)>;

/// SQS attribute values as strings (CloudFormation takes numbers, booleans and a JSON
/// redrive policy).
fn queue_attributes(
    stack: &Stack,
    logical: &str,
    properties: &Value,
) -> Result<(Option<String>, QueueAttributes), StackError> {
    let mut name = None;
    let mut attributes = Vec::new();
    let Some(Value::Object(resolved)) = stack.resolve(properties)? else {
        return Ok((name, attributes));
    };
    for (property, value) in resolved {
        let value = match (property.as_str(), value) {
            ("QueueName", v) => {
                name = Some(text(&v));
                continue;
            }
            ("RedrivePolicy" | "RedriveAllowPolicy", v @ Value::Object(_)) => {
                // Its target must be created first: a queue not created yet has no account.
                let target = v["deadLetterTargetArn"].as_str().unwrap_or_default();
                if property == "RedrivePolicy" && target.split(':').nth(4).is_none_or(str::is_empty)
                {
                    return Err(template_error(format!(
                        "{logical}: its dead-letter queue {target} is not created before it"
                    )));
                }
                v.to_string()
            }
            (
                "VisibilityTimeout"
                | "MessageRetentionPeriod"
                | "DelaySeconds"
                | "MaximumMessageSize"
                | "ReceiveMessageWaitTimeSeconds"
                | "SqsManagedSseEnabled"
                | "KmsMasterKeyId"
                | "KmsDataKeyReusePeriodSeconds",
                v,
            ) => text(&v),
            (other, _) => {
                return Err(template_error(format!(
                    "{logical}: the provisioner does not create queues with {other}"
                )))
            }
        };
        attributes.push((QueueAttributeName::from(property.as_str()), value));
    }
    Ok((name, attributes))
}

async fn create_queue(
    sqs: &aws_sdk_sqs::Client,
    stack: &Stack,
    logical: &str,
    properties: &Value,
) -> Result<Physical, StackError> {
    let (name, attributes) = queue_attributes(stack, logical, properties)?;
    let name = name.unwrap_or_else(|| generated_name(&stack.name, logical));
    if name.len() > 80 {
        return Err(create_error(
            logical,
            format!(
                "queue name {name} is longer than SQS's 80 characters: choose a shorter stack name"
            ),
        ));
    }
    let created = sqs
        .create_queue()
        .queue_name(&name)
        .set_attributes(Some(attributes.iter().cloned().collect()))
        .send()
        .await;
    let url = match created {
        Ok(created) => created
            .queue_url
            .ok_or_else(|| create_error(logical, "no queue URL"))?,
        // An existing queue with other settings: put the template's back.
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_queue_name_exists()) =>
        {
            let url = sqs
                .get_queue_url()
                .queue_name(&name)
                .send()
                .await
                .map_err(|e| create_error(logical, error_text(&e)))?
                .queue_url
                .ok_or_else(|| create_error(logical, "no queue URL"))?;
            sqs.set_queue_attributes()
                .queue_url(&url)
                .set_attributes(Some(attributes.into_iter().collect()))
                .send()
                .await
                .map_err(|e| create_error(logical, error_text(&e)))?;
            url
        }
        Err(e) => return Err(create_error(logical, error_text(&e))),
    };
    let arn = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| create_error(logical, error_text(&e)))?
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
        .ok_or_else(|| create_error(logical, "no queue ARN"))?;
    Ok(Physical {
        reference: url.clone(),
        attributes: BTreeMap::from([
            ("Arn".to_owned(), arn),
            ("QueueName".to_owned(), name),
            ("QueueUrl".to_owned(), url),
        ]),
    })
}

/// The parts of a table definition, read from its properties.
#[derive(Debug, Clone, PartialEq)]
pub struct TableDefinition {
    pub name: String,
    pub attributes: Vec<(String, String)>,
    /// (attribute, HASH or RANGE)
    pub key: Vec<(String, String)>,
    pub indexes: Vec<IndexDefinition>,
    pub billing_mode: String,
    pub stream_view: Option<String>,
    pub ttl_attribute: Option<String>,
    pub point_in_time_recovery: bool,
    pub deletion_protection: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct IndexDefinition {
    pub name: String,
    pub key: Vec<(String, String)>,
    pub projection: String,
    pub non_key_attributes: Vec<String>,
}

pub(super) fn pairs(value: &Value, first: &str, second: &str) -> Vec<(String, String)> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| (text(&item[first]), text(&item[second])))
        .collect()
}

impl TableDefinition {
    /// The table `logical` of the template, for `stack`.
    pub fn of(stack: &Stack, logical: &str) -> Result<Self, StackError> {
        let properties = &template()?["Resources"][logical]["Properties"];
        let Some(Value::Object(p)) = stack.resolve(properties)? else {
            return Err(template_error(format!("{logical} has no properties")));
        };
        const READ: [&str; 9] = [
            "TableName",
            "AttributeDefinitions",
            "KeySchema",
            "GlobalSecondaryIndexes",
            "BillingMode",
            "StreamSpecification",
            "TimeToLiveSpecification",
            "PointInTimeRecoverySpecification",
            "DeletionProtectionEnabled",
        ];
        if let Some(other) = p.keys().find(|k| !READ.contains(&k.as_str())) {
            return Err(template_error(format!(
                "{logical}: the provisioner does not create tables with {other}"
            )));
        }
        let indexes = p
            .get("GlobalSecondaryIndexes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|index| IndexDefinition {
                name: text(&index["IndexName"]),
                key: pairs(&index["KeySchema"], "AttributeName", "KeyType"),
                projection: text(&index["Projection"]["ProjectionType"]),
                non_key_attributes: index["Projection"]["NonKeyAttributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(text)
                    .collect(),
            })
            .collect();
        let ttl = &p
            .get("TimeToLiveSpecification")
            .cloned()
            .unwrap_or_default();
        Ok(Self {
            name: text(&p["TableName"]),
            attributes: pairs(&p["AttributeDefinitions"], "AttributeName", "AttributeType"),
            key: pairs(&p["KeySchema"], "AttributeName", "KeyType"),
            indexes,
            billing_mode: p
                .get("BillingMode")
                .map_or_else(|| "PROVISIONED".to_owned(), text),
            stream_view: p
                .get("StreamSpecification")
                .map(|s| text(&s["StreamViewType"])),
            ttl_attribute: (ttl["Enabled"] == true).then(|| text(&ttl["AttributeName"])),
            point_in_time_recovery: p
                .get("PointInTimeRecoverySpecification")
                .is_some_and(|s| s["PointInTimeRecoveryEnabled"] == true),
            deletion_protection: p.get("DeletionProtectionEnabled") == Some(&Value::Bool(true)),
        })
    }

    /// Every table of the template, for `stack`.
    pub fn all(stack: &Stack) -> Result<Vec<Self>, StackError> {
        resources_of("AWS::DynamoDB::Table")?
            .into_iter()
            .map(|(logical, _)| Self::of(stack, logical))
            .collect()
    }
}

fn key_schema(key: &[(String, String)]) -> Result<Vec<KeySchemaElement>, String> {
    key.iter()
        .map(|(attribute, kind)| {
            KeySchemaElement::builder()
                .attribute_name(attribute)
                .key_type(KeyType::from(kind.as_str()))
                .build()
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Creates one table (or finds it), waits until it is active, turns on its TTL and
/// point-in-time recovery; returns its stream's ARN.
async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    stack: &Stack,
    logical: &str,
) -> Result<Option<String>, StackError> {
    let definition = TableDefinition::of(stack, logical)?;
    let fail = |message: String| create_error(logical, message);
    let mut request = client
        .create_table()
        .table_name(&definition.name)
        .billing_mode(BillingMode::from(definition.billing_mode.as_str()))
        .deletion_protection_enabled(definition.deletion_protection)
        .set_key_schema(Some(key_schema(&definition.key).map_err(fail)?));
    for (attribute, kind) in &definition.attributes {
        request = request.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(attribute)
                .attribute_type(ScalarAttributeType::from(kind.as_str()))
                .build()
                .map_err(|e| fail(e.to_string()))?,
        );
    }
    for index in &definition.indexes {
        let projection = Projection::builder()
            .projection_type(ProjectionType::from(index.projection.as_str()))
            .set_non_key_attributes(
                (!index.non_key_attributes.is_empty()).then(|| index.non_key_attributes.clone()),
            )
            .build();
        request = request.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(&index.name)
                .set_key_schema(Some(key_schema(&index.key).map_err(fail)?))
                .projection(projection)
                .build()
                .map_err(|e| fail(e.to_string()))?,
        );
    }
    if let Some(view) = &definition.stream_view {
        request = request.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::from(view.as_str()))
                .build()
                .map_err(|e| fail(e.to_string()))?,
        );
    }
    if let Err(e) = request.send().await {
        if !e
            .as_service_error()
            .is_some_and(|s| s.is_resource_in_use_exception())
        {
            return Err(fail(error_text(&e)));
        }
    }
    let mut waited = Duration::ZERO;
    let stream_arn = loop {
        let described = client
            .describe_table()
            .table_name(&definition.name)
            .send()
            .await
            .map_err(|e| fail(error_text(&e)))?;
        let table = described.table();
        if table.and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            break table.and_then(|t| t.latest_stream_arn()).map(str::to_owned);
        }
        if waited > Duration::from_secs(300) {
            return Err(fail("not active after 5 minutes".into()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        waited += Duration::from_millis(200);
    };
    if let Some(attribute) = &definition.ttl_attribute {
        let current = client
            .describe_time_to_live()
            .table_name(&definition.name)
            .send()
            .await
            .map_err(|e| fail(error_text(&e)))?;
        let description = current.time_to_live_description();
        let enabled = description.and_then(|d| d.attribute_name()) == Some(attribute.as_str())
            && description
                .and_then(|d| d.time_to_live_status())
                .is_some_and(|s| matches!(s.as_str(), "ENABLED" | "ENABLING"));
        if !enabled {
            let ttl = TimeToLiveSpecification::builder()
                .attribute_name(attribute)
                .enabled(true)
                .build()
                .map_err(|e| fail(e.to_string()))?;
            client
                .update_time_to_live()
                .table_name(&definition.name)
                .time_to_live_specification(ttl)
                .send()
                .await
                .map_err(|e| fail(error_text(&e)))?;
        }
    }
    if definition.point_in_time_recovery {
        let pitr = PointInTimeRecoverySpecification::builder()
            .point_in_time_recovery_enabled(true)
            .build()
            .map_err(|e| fail(e.to_string()))?;
        // A table just created refuses this for a while on AWS ("backups are being
        // enabled"): asked again until it takes it.
        let mut tries = 0;
        loop {
            let updated = client
                .update_continuous_backups()
                .table_name(&definition.name)
                .point_in_time_recovery_specification(pitr.clone())
                .send()
                .await;
            match updated {
                Ok(_) => break,
                Err(e)
                    if tries < 60
                        && e.as_service_error()
                            .is_some_and(|s| s.is_continuous_backups_unavailable_exception()) =>
                {
                    tries += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(fail(error_text(&e))),
            }
        }
    }
    Ok(stream_arn)
}

/// Creates the template's tables for the stack `name` (no queues: for the store's own tests).
pub async fn create_tables(
    client: &aws_sdk_dynamodb::Client,
    name: &str,
) -> Result<(), StackError> {
    let stack = Stack::new(name, "", "", &[])?;
    let tables = resources_of("AWS::DynamoDB::Table")?;
    try_join_all(
        tables
            .iter()
            .map(|(logical, _)| create_table(client, &stack, logical)),
    )
    .await?;
    Ok(())
}
