//! The template reader, the resolver and the provisioner, against the template itself and the emulator.
use super::{
    deploy::{check_types, pairs},
    *,
};
use aws_sdk_sqs::types::QueueAttributeName as Q;
use serde_json::json;

fn stack() -> Stack {
    Stack::new("st", "eu-west-1", "111122223333", &[]).unwrap()
}

#[test]
fn the_store_names_its_tables_as_the_template_does() {
    let names = crate::store::dynamodb::TableNames::with_prefix("st");
    let known = [
        &names.accounts,
        &names.endpoints,
        &names.events,
        &names.deliveries,
        &names.attempts,
        &names.control,
    ];
    let tables = TableDefinition::all(&stack()).unwrap();
    assert_eq!(tables.len(), known.len(), "{tables:?}");
    for table in tables {
        assert!(
            known.contains(&&table.name),
            "{} is not one of {known:?}",
            table.name
        );
    }
}

#[test]
fn intrinsics_resolve_for_the_stack() {
    let mut stack = stack();
    let resolve = |stack: &Stack, v: Value| stack.resolve(&v).unwrap();
    assert_eq!(
        resolve(
            &stack,
            json!({"Fn::Sub": "arn:${AWS::Partition}:x:${AWS::Region}:${AWS::AccountId}:${AWS::StackName}/${!Literal}"})
        ),
        Some(json!("arn:aws:x:eu-west-1:111122223333:st/${Literal}"))
    );
    assert_eq!(
        resolve(
            &stack,
            json!({"Fn::Sub": ["${Q}-${DeliveryQueue.QueueName}", {"Q": {"Ref": "DisableAfter"}}]})
        ),
        Some(json!("3d-st-DeliveryQueue"))
    );
    assert_eq!(
        resolve(&stack, json!({"Fn::GetAtt": ["EventsTable", "Arn"]})),
        Some(json!(
            "arn:aws:dynamodb:eu-west-1:111122223333:table/st-events"
        ))
    );
    // A condition on a parameter's default, and AWS::NoValue dropping the property.
    let optional = json!({"A": {"Fn::If": ["HasOperationsAccount", {"Ref": "OperationsAccount"}, {"Ref": "AWS::NoValue"}]}, "B": 1});
    assert_eq!(resolve(&stack, optional.clone()), Some(json!({"B": 1})));
    stack
        .parameters
        .insert("OperationsAccount".into(), "ops".into());
    assert_eq!(resolve(&stack, optional), Some(json!({"A": "ops", "B": 1})));
    let unknown = stack.resolve(&json!({"Fn::GetAtt": ["NoSuchThing", "Arn"]}));
    assert!(matches!(unknown, Err(StackError::Template(m)) if m.contains("NoSuchThing")));
    assert!(stack
        .resolve(&json!({"Fn::FindInMap": ["M", "k", "v"]}))
        .is_err());
}

#[test]
fn a_resource_the_provisioner_has_not_decided_on_is_refused() {
    let resources =
        json!({"Bucket": {"Type": "AWS::S3::Bucket"}, "Q": {"Type": "AWS::SQS::Queue"}});
    let refused = check_types(resources.as_object().unwrap());
    assert!(
        matches!(refused, Err(StackError::Template(m)) if m.contains("Bucket is a AWS::S3::Bucket"))
    );
    check_types(template().unwrap()["Resources"].as_object().unwrap()).unwrap();
}

#[test]
fn the_sender_is_given_the_stack_it_runs_in() {
    let env = stack().function_env("SenderFunction").unwrap();
    assert_eq!(env["HOOKLANE_TABLE_PREFIX"], "st");
    assert_eq!(env["HOOKLANE_SCHEDULE_GROUP"], "st-RetryScheduleGroup");
    assert_eq!(
        env["HOOKLANE_SCHEDULER_ROLE_ARN"],
        "arn:aws:iam::111122223333:role/st-SchedulerSendRole"
    );
    assert_eq!(
        env["HOOKLANE_SCHEDULE_DLQ_ARN"],
        "arn:aws:sqs:eu-west-1:111122223333:st-ScheduleDeadLetterQueue"
    );
    assert!(
        !env.contains_key("HOOKLANE_OPERATIONS_ACCOUNT"),
        "no operations account by default"
    );
}

/// `HttpsOnly` reaches every function as `HOOKLANE_HTTPS_ONLY`, which the core's settings
/// read on AWS as in the embedded shape: off by default, on when the deployer asks.
#[test]
fn the_https_only_parameter_reaches_every_function() {
    use crate::aws::settings::AwsSettings;
    for (parameters, expected) in [(&[][..], false), (&[("HttpsOnly", "true")][..], true)] {
        let stack = Stack::new("st", "eu-west-1", "111122223333", parameters).unwrap();
        for function in Stack::functions().unwrap() {
            let vars = stack.function_env(function).unwrap().into_iter().collect();
            let settings = AwsSettings::from_vars(&vars).unwrap();
            assert_eq!(
                settings.core.sender.policy.https_only(),
                expected,
                "{function} with {parameters:?}"
            );
        }
    }
}

/// The publish limits reach the api function from the template's parameters: none and
/// 256 KiB by default.
#[test]
fn the_limit_parameters_reach_the_api_function() {
    use crate::aws::settings::AwsSettings;
    for (parameters, rate, payload, endpoints) in [
        (&[][..], None, 256 * 1024, 100),
        (
            &[
                ("PublishRate", "50"),
                ("PublishBurst", "80"),
                ("MaxPayload", "128KiB"),
                ("MaxEndpoints", "250"),
            ][..],
            Some((50, 80)),
            128 * 1024,
            250,
        ),
    ] {
        let stack = Stack::new("st", "eu-west-1", "111122223333", parameters).unwrap();
        let vars = stack
            .function_env("ApiFunction")
            .unwrap()
            .into_iter()
            .collect();
        let settings = AwsSettings::from_vars(&vars).unwrap();
        assert_eq!(
            settings.core.publish_rate.map(|r| (r.per_second, r.burst)),
            rate,
            "{parameters:?}"
        );
        assert_eq!(settings.core.max_payload_bytes, payload, "{parameters:?}");
        assert_eq!(settings.core.max_endpoints, endpoints, "{parameters:?}");
    }
}

/// `HOOKLANE_RETENTION` reaches every function from the `Retention` parameter, and every
/// table that grows with traffic expires its items through TTL on the attribute the store
/// writes. Accounts and endpoints are the platform's configuration, kept until deleted.
#[test]
fn the_retention_parameter_reaches_every_function_and_every_growing_table_expires() {
    use crate::aws::settings::AwsSettings;
    for (parameters, days) in [(&[][..], 30), (&[("Retention", "7d")][..], 7)] {
        let stack = Stack::new("st", "eu-west-1", "111122223333", parameters).unwrap();
        for function in Stack::functions().unwrap() {
            let vars = stack.function_env(function).unwrap().into_iter().collect();
            let settings = AwsSettings::from_vars(&vars).unwrap();
            assert_eq!(
                settings.core.retention,
                std::time::Duration::from_secs(days * 86_400),
                "{function} with {parameters:?}"
            );
        }
    }
    let names = crate::store::dynamodb::TableNames::with_prefix("st");
    for table in TableDefinition::all(&stack()).unwrap() {
        let configuration = [&names.accounts, &names.endpoints].contains(&&table.name);
        let expected = (!configuration).then(|| "expires_at".to_owned());
        assert_eq!(table.ttl_attribute, expected, "{}", table.name);
    }
}

/// Each function's environment in the template configures it as its `main` reads it
/// (`AwsSettings::from_vars`, as `from_env` in Lambda), with what that function needs.
#[test]
fn every_function_is_configured_by_its_template_environment() {
    use crate::aws::settings::AwsSettings;
    let stack = stack();
    for function in Stack::functions().unwrap() {
        let mut vars: std::collections::HashMap<String, String> =
            stack.function_env(function).unwrap().into_iter().collect();
        vars.insert("AWS_LAMBDA_FUNCTION_NAME".into(), format!("st-{function}"));
        let settings = AwsSettings::from_vars(&vars)
            .unwrap_or_else(|e| panic!("{function}'s template environment: {e}"));
        assert_eq!(settings.tables.prefix(), "st", "{function}");
        assert_eq!(
            settings.queue_arn, "arn:aws:sqs:eu-west-1:111122223333:st-DeliveryQueue",
            "{function}"
        );
        assert!(settings.in_lambda);
        match function {
            // The api reads its admin token from the parameter, and nothing else may.
            "ApiFunction" => assert_eq!(
                settings.admin_token_parameter.as_deref(),
                Some("/hooklane/admin-token")
            ),
            // Only the sender schedules retries, each with the schedules' dead-letter queue.
            "SenderFunction" => {
                assert!(settings.scheduler.is_some());
                assert!(settings.schedule_dead_letter_arn.is_some());
            }
            // The health check mails owners from the configured identity.
            "HealthFunction" => assert_eq!(
                settings.notification_from.as_deref(),
                Some("webhooks@example.com")
            ),
            _ => {}
        }
        if function != "ApiFunction" {
            assert_eq!(
                settings.admin_token_parameter, None,
                "{function} is given the admin token's parameter"
            );
        }
        if function != "SenderFunction" {
            assert!(
                settings.scheduler.is_none(),
                "{function} is given the scheduler settings"
            );
        }
    }
}

/// The template as cfn-lint's decoder and aws-sam-translator read it (not this module's
/// reader): the reference the provisioned stack is checked against.
fn translated() -> Value {
    crate::testing::require_emulator();
    crate::testing::sam_translated(&[])
}

fn sorted(mut pairs: Vec<(String, String)>) -> Vec<(String, String)> {
    pairs.sort();
    pairs
}

#[tokio::test]
async fn the_provisioned_stack_is_the_template_field_by_field() {
    let reference = translated();
    let sdk = crate::aws::load_sdk_config().await;
    let name = format!("p{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let stack = deploy(&sdk, &name, &[]).await.unwrap();
    let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let resources = reference["Resources"].as_object().unwrap();
    let mut checked = Vec::new();
    for (logical, resource) in resources {
        let p = &resource["Properties"];
        match resource["Type"].as_str().unwrap() {
            "AWS::DynamoDB::Table" => {
                let table_name = p["TableName"]["Fn::Sub"]
                    .as_str()
                    .unwrap()
                    .replace("${AWS::StackName}", &name);
                let described = dynamodb
                    .describe_table()
                    .table_name(&table_name)
                    .send()
                    .await
                    .unwrap();
                let t = described.table().unwrap();
                let key = |k: &[aws_sdk_dynamodb::types::KeySchemaElement]| {
                    k.iter()
                        .map(|e| {
                            (
                                e.attribute_name().to_owned(),
                                e.key_type().as_str().to_owned(),
                            )
                        })
                        .collect::<Vec<_>>()
                };
                assert_eq!(
                    key(t.key_schema()),
                    pairs(&p["KeySchema"], "AttributeName", "KeyType"),
                    "{logical} key"
                );
                let attributes = t
                    .attribute_definitions()
                    .iter()
                    .map(|a| {
                        (
                            a.attribute_name().to_owned(),
                            a.attribute_type().as_str().to_owned(),
                        )
                    })
                    .collect();
                assert_eq!(
                    sorted(attributes),
                    sorted(pairs(
                        &p["AttributeDefinitions"],
                        "AttributeName",
                        "AttributeType"
                    )),
                    "{logical} attributes"
                );
                let wanted = p["GlobalSecondaryIndexes"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                assert_eq!(
                    t.global_secondary_indexes().len(),
                    wanted.len(),
                    "{logical} indexes"
                );
                for index in wanted {
                    let made = t
                        .global_secondary_indexes()
                        .iter()
                        .find(|g| g.index_name() == index["IndexName"].as_str())
                        .unwrap_or_else(|| panic!("{logical} has no index {}", index["IndexName"]));
                    assert_eq!(
                        key(made.key_schema()),
                        pairs(&index["KeySchema"], "AttributeName", "KeyType"),
                        "{logical} {}",
                        index["IndexName"]
                    );
                    let projection = made.projection().unwrap();
                    assert_eq!(
                        projection.projection_type().map(|t| t.as_str()),
                        index["Projection"]["ProjectionType"].as_str()
                    );
                    let non_key: Vec<String> = index["Projection"]["NonKeyAttributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|a| a.as_str().unwrap().to_owned())
                        .collect();
                    assert_eq!(
                        projection.non_key_attributes().to_vec(),
                        non_key,
                        "{logical} projection"
                    );
                }
                assert_eq!(
                    t.billing_mode_summary()
                        .and_then(|b| b.billing_mode())
                        .map(|b| b.as_str()),
                    p["BillingMode"].as_str(),
                    "{logical} billing"
                );
                assert_eq!(
                    t.deletion_protection_enabled(),
                    p["DeletionProtectionEnabled"].as_bool(),
                    "{logical} deletion protection"
                );
                assert_eq!(
                    t.stream_specification()
                        .and_then(|s| s.stream_view_type())
                        .map(|v| v.as_str()),
                    p["StreamSpecification"]["StreamViewType"].as_str(),
                    "{logical} stream"
                );
                let ttl = dynamodb
                    .describe_time_to_live()
                    .table_name(&table_name)
                    .send()
                    .await
                    .unwrap();
                let ttl = ttl.time_to_live_description().unwrap();
                let enabled = ttl
                    .time_to_live_status()
                    .is_some_and(|s| s.as_str() == "ENABLED");
                assert_eq!(
                    enabled.then(|| ttl.attribute_name().unwrap_or_default().to_owned()),
                    p["TimeToLiveSpecification"]["AttributeName"]
                        .as_str()
                        .map(str::to_owned),
                    "{logical} TTL"
                );
                let backups = dynamodb
                    .describe_continuous_backups()
                    .table_name(&table_name)
                    .send()
                    .await
                    .unwrap();
                let pitr = backups
                    .continuous_backups_description()
                    .and_then(|d| d.point_in_time_recovery_description())
                    .and_then(|d| d.point_in_time_recovery_status())
                    .map(|s| s.as_str() == "ENABLED");
                assert_eq!(
                    pitr,
                    Some(
                        p["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] == true
                    ),
                    "{logical} point-in-time recovery"
                );
            }
            "AWS::SQS::Queue" => {
                let url = &stack.resources[logical.as_str()].reference;
                let attributes = sqs
                    .get_queue_attributes()
                    .queue_url(url)
                    .attribute_names(Q::All)
                    .send()
                    .await
                    .unwrap()
                    .attributes
                    .unwrap_or_default();
                for (property, attribute) in [
                    ("VisibilityTimeout", Q::VisibilityTimeout),
                    ("MessageRetentionPeriod", Q::MessageRetentionPeriod),
                    ("SqsManagedSseEnabled", Q::SqsManagedSseEnabled),
                ] {
                    let wanted = match &p[property] {
                        Value::Null => None,
                        v => Some(text(v)),
                    };
                    if let Some(wanted) = wanted {
                        assert_eq!(
                            attributes.get(&attribute),
                            Some(&wanted),
                            "{logical} {property}"
                        );
                    }
                }
                match &p["RedrivePolicy"] {
                    Value::Null => assert!(
                        !attributes.contains_key(&Q::RedrivePolicy),
                        "{logical} has a redrive policy"
                    ),
                    redrive => {
                        let made: Value = serde_json::from_str(
                            attributes
                                .get(&Q::RedrivePolicy)
                                .unwrap_or_else(|| panic!("{logical} has no redrive policy")),
                        )
                        .unwrap();
                        let target = redrive["deadLetterTargetArn"]["Fn::GetAtt"][0]
                            .as_str()
                            .unwrap();
                        assert_eq!(
                            made["deadLetterTargetArn"].as_str(),
                            Some(stack.resources[target].attributes["Arn"].as_str()),
                            "{logical} redrive target"
                        );
                        assert_eq!(
                            made["maxReceiveCount"].to_string().trim_matches('"'),
                            redrive["maxReceiveCount"].to_string(),
                            "{logical} receive count"
                        );
                    }
                }
            }
            "AWS::Scheduler::ScheduleGroup" => {
                let group = &stack.resources[logical.as_str()].reference;
                aws_sdk_scheduler::Client::new(&sdk)
                    .get_schedule_group()
                    .name(group)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{logical}: {e:?}"));
            }
            _ => continue,
        }
        checked.push(logical.clone());
    }
    assert_eq!(
        checked.len(),
        6 + 4 + 1,
        "tables, queues and the schedule group: {checked:?}"
    );
    // Provisioning again reuses all of it.
    deploy(&sdk, &name, &[]).await.unwrap();
}

/// The statements of `function`'s inline policies, resolved for `stack`.
fn statements_of(stack: &Stack, function: &str) -> Vec<Value> {
    let template = super::template().unwrap();
    template["Resources"][function]["Properties"]["Policies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|policy| policy.get("Statement"))
        .filter_map(|statements| stack.resolve(statements).unwrap())
        .flat_map(|statements| statements.as_array().cloned().unwrap_or_default())
        .collect()
}

/// The key of endpoint secrets (and the one being rotated away from) reaches only the
/// functions that seal or open endpoint signing secrets, the api and the sender, each of
/// which starts with `SecretsUse::Needed`; the others start with `SecretsUse::Withheld`.
/// The key itself is in no function's environment, only the names of the SSM parameters
/// holding it, and only those two functions may read them (and decrypt them through SSM
/// with the operator's KMS key, when there is one).
#[test]
fn the_secrets_key_reaches_only_the_api_and_the_sender() {
    use crate::aws::settings::AwsSettings;
    let kms = "arn:aws:kms:eu-west-1:111122223333:key/0f1e2d3c";
    let parameter = |name: &str| format!("arn:aws:ssm:eu-west-1:111122223333:parameter{name}");
    let rotating = Stack::new(
        "st",
        "eu-west-1",
        "111122223333",
        &[
            ("SecretsKeyParameterName", "/st/secrets-key"),
            ("SecretsKeyPreviousParameterName", "/st/secrets-key-old"),
            ("SecretsKmsKeyArn", kms),
        ],
    )
    .unwrap();
    let plain = Stack::new("st", "eu-west-1", "111122223333", &[]).unwrap();
    let mains = [
        (
            "ApiFunction",
            include_str!("../../../../functions/api/src/main.rs"),
        ),
        (
            "FanoutFunction",
            include_str!("../../../../functions/fanout/src/main.rs"),
        ),
        (
            "SenderFunction",
            include_str!("../../../../functions/sender/src/main.rs"),
        ),
        (
            "SweeperFunction",
            include_str!("../../../../functions/sweeper/src/main.rs"),
        ),
        (
            "HealthFunction",
            include_str!("../../../../functions/health/src/main.rs"),
        ),
    ];
    let mut functions = Stack::functions().unwrap();
    functions.sort_unstable();
    let mut named: Vec<_> = mains.iter().map(|(f, _)| *f).collect();
    named.sort_unstable();
    assert_eq!(functions, named, "every function's main is checked");
    let mut keyed = Vec::new();
    for (function, main) in mains {
        let vars: std::collections::HashMap<String, String> = rotating
            .function_env(function)
            .unwrap()
            .into_iter()
            .collect();
        let settings = AwsSettings::from_vars(&vars).unwrap();
        assert!(
            !vars.contains_key("HOOKLANE_SECRETS_KEY")
                && !vars.contains_key("HOOKLANE_SECRETS_KEY_PREVIOUS"),
            "{function}: no key in the environment"
        );
        assert_eq!(settings.core.secrets, Default::default(), "{function}");
        let statements = statements_of(&rotating, function);
        let reads = statements.iter().any(|s| {
            s["Action"] == "ssm:GetParameter"
                && s["Resource"]
                    == json!([
                        parameter("/st/secrets-key"),
                        parameter("/st/secrets-key-old")
                    ])
        });
        let decrypts = statements.iter().any(|s| {
            s["Action"] == "kms:Decrypt"
                && s["Resource"] == kms
                && s["Condition"]["StringEquals"]["kms:ViaService"] == "ssm.eu-west-1.amazonaws.com"
        });
        let named = settings.secrets_key_parameter.is_some();
        if named {
            keyed.push(function);
            assert_eq!(
                (
                    settings.secrets_key_parameter.as_deref(),
                    settings.secrets_key_previous_parameter.as_deref()
                ),
                (Some("/st/secrets-key"), Some("/st/secrets-key-old")),
                "{function}"
            );
        }
        assert_eq!(
            (reads, decrypts),
            (named, named),
            "{function}: its grants and its environment agree"
        );
        let mentions = serde_json::to_string(&statements).unwrap();
        assert_eq!(
            mentions.contains("secrets-key") || mentions.contains(kms),
            named,
            "{function}"
        );
        let needed = main.contains("SecretsUse::Needed");
        assert_ne!(needed, main.contains("SecretsUse::Withheld"), "{function}");
        assert_eq!(
            needed, named,
            "{function}: its main and its environment agree"
        );
        // Without a rotation or a KMS key of the operator's: the one parameter, no decrypt
        // grant (the AWS-managed key aws/ssm needs none).
        let statements = statements_of(&plain, function);
        let mentions = serde_json::to_string(&statements).unwrap();
        assert!(!mentions.contains("kms:Decrypt"), "{function}: {mentions}");
        if named {
            assert!(
                statements.iter().any(|s| s["Action"] == "ssm:GetParameter"
                    && s["Resource"] == json!([parameter("/hooklane/secrets-key")])),
                "{function}: {mentions}"
            );
        }
    }
    assert_eq!(keyed, ["ApiFunction", "SenderFunction"]);
}
