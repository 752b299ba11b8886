//! The AWS stack as CloudFormation creates it: `infra/template.yaml` translated by
//! aws-sam-translator (SAM's policy templates expanded into the roles' statements, the event
//! sources, schedules and Globals into plain resources), checked for what the emulator never
//! enforces: IAM grants, what happens to stream records and schedules that keep failing,
//! retention, protection of the tables, and which settings `sam build` and `sam deploy` share.

use std::{collections::BTreeSet, path::Path, process::Command, sync::OnceLock};

use hooklane::telemetry;
use serde_json::Value;

const FUNCTIONS: [&str; 5] = [
    "ApiFunction",
    "FanoutFunction",
    "SenderFunction",
    "SweeperFunction",
    "HealthFunction",
];

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The translated template, once for all tests.
fn stack() -> &'static Value {
    static STACK: OnceLock<Value> = OnceLock::new();
    STACK.get_or_init(|| {
        let python = std::env::var("HOOKLANE_TEST_PYTHON").expect(
            "HOOKLANE_TEST_PYTHON is not set: this test translates the template with \
             aws-sam-translator and cfn-lint's decoder from the test environment \
             (scripts/test-env prints its python)",
        );
        let output = Command::new(python)
            .current_dir(root())
            .arg("tests/sam_translate.py")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "translating infra/template.yaml failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    })
}

fn resources() -> &'static serde_json::Map<String, Value> {
    stack()["Resources"].as_object().unwrap()
}

fn resource(name: &str) -> &'static Value {
    resources()
        .get(name)
        .unwrap_or_else(|| panic!("the stack has no resource `{name}`"))
}

fn properties(name: &str) -> &'static Value {
    &resource(name)["Properties"]
}

fn of_type(kind: &str) -> impl Iterator<Item = (&'static String, &'static Value)> + '_ {
    resources()
        .iter()
        .filter(move |(_, r)| r["Type"] == kind)
        .map(|(n, r)| (n, &r["Properties"]))
}

/// An intrinsic as a string: `Ref X` is `${X}`, `GetAtt X.A` is `${X.A}`, `Sub` with its
/// variables put in. Anything else stays JSON (it matches no pattern below).
fn render(value: &Value) -> String {
    let Value::Object(o) = value else {
        return value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned);
    };
    if let Some(name) = o.get("Ref") {
        return format!("${{{}}}", name.as_str().unwrap());
    }
    if let Some(attribute) = o.get("Fn::GetAtt") {
        let path = match attribute {
            Value::Array(parts) => parts
                .iter()
                .map(|p| p.as_str().unwrap())
                .collect::<Vec<_>>()
                .join("."),
            other => other.as_str().unwrap().to_owned(),
        };
        return format!("${{{path}}}");
    }
    match o.get("Fn::Sub") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut text = parts[0].as_str().unwrap().to_owned();
            for (name, variable) in parts[1].as_object().unwrap() {
                text = text.replace(&format!("${{{name}}}"), &render(variable));
            }
            text
        }
        _ => value.to_string(),
    }
}

/// IAM's `*` wildcard.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::Array(items) => items.iter().map(render).collect(),
        Value::Null => Vec::new(),
        other => vec![render(other)],
    }
}

/// Both branches of every `Fn::If`, without `AWS::NoValue`.
fn branches(value: &Value) -> Vec<&Value> {
    match value {
        Value::Array(items) => items.iter().flat_map(branches).collect(),
        Value::Object(o) if o.contains_key("Fn::If") => {
            let arms = o["Fn::If"].as_array().unwrap();
            branches(&arms[1])
                .into_iter()
                .chain(branches(&arms[2]))
                .collect()
        }
        Value::Object(o) if o.get("Ref") == Some(&Value::from("AWS::NoValue")) => Vec::new(),
        other => vec![other],
    }
}

#[derive(Debug)]
struct Statement {
    policy: String,
    actions: Vec<String>,
    resources: Vec<String>,
    condition: Value,
}

impl Statement {
    fn allows(&self, action: &str, targets: &[String]) -> bool {
        self.actions
            .iter()
            .any(|a| glob(&a.to_ascii_lowercase(), &action.to_ascii_lowercase()))
            && self
                .resources
                .iter()
                .any(|r| targets.iter().any(|t| glob(r, t)))
    }
}

/// The Allow statements of a role's inline policies.
fn statements(role: &str) -> Vec<Statement> {
    let role_resource = resource(role);
    assert_eq!(
        role_resource["Type"], "AWS::IAM::Role",
        "`{role}` is not a role"
    );
    let mut out = Vec::new();
    for policy in role_resource["Properties"]["Policies"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for statement in branches(&policy["PolicyDocument"]["Statement"]) {
            if statement["Effect"] != "Allow" {
                continue;
            }
            out.push(Statement {
                policy: policy["PolicyName"].as_str().unwrap().to_owned(),
                actions: strings(&statement["Action"]),
                resources: strings(&statement["Resource"]),
                condition: statement["Condition"].clone(),
            });
        }
    }
    out
}

fn managed_policies(role: &str) -> Vec<String> {
    strings(&properties(role)["ManagedPolicyArns"])
}

/// The role a function runs with (SAM names it `<Function>Role`; read, not assumed).
fn role_of(function: &str) -> String {
    let role = &properties(function)["Role"];
    let rendered = render(role);
    rendered
        .strip_prefix("${")
        .and_then(|r| r.strip_suffix(".Arn}"))
        .unwrap_or_else(|| panic!("{function}'s role is not one of the stack: {role}"))
        .to_owned()
}

fn allows(role: &str, action: &str, targets: &[String]) -> bool {
    statements(role).iter().any(|s| s.allows(action, targets))
}

fn table(name: &str) -> Vec<String> {
    vec![
        format!("arn:${{AWS::Partition}}:dynamodb:${{AWS::Region}}:${{AWS::AccountId}}:table/${{{name}}}"),
        format!("${{{name}.Arn}}"),
    ]
}

fn index(table_name: &str, index: &str) -> Vec<String> {
    table(table_name)
        .into_iter()
        .map(|t| format!("{t}/index/{index}"))
        .collect()
}

fn queue(name: &str) -> Vec<String> {
    vec![
        format!("${{{name}.Arn}}"),
        format!("arn:${{AWS::Partition}}:sqs:${{AWS::Region}}:${{AWS::AccountId}}:${{{name}.QueueName}}"),
    ]
}

fn assert_allows(function: &str, action: &str, targets: &[String], what: &str) {
    let role = role_of(function);
    assert!(
        allows(&role, action, targets),
        "{function} ({role}) is not allowed {action} on {what}; its statements: {:#?}",
        statements(&role)
    );
}

fn environment(function: &str) -> &'static serde_json::Map<String, Value> {
    static EMPTY: OnceLock<serde_json::Map<String, Value>> = OnceLock::new();
    properties(function)["Environment"]["Variables"]
        .as_object()
        .unwrap_or_else(|| EMPTY.get_or_init(serde_json::Map::new))
}

fn dimension(metric: &Value, name: &str) -> Option<String> {
    metric["Dimensions"]
        .as_array()?
        .iter()
        .find(|d| d["Name"] == name)
        .map(|d| render(&d["Value"]))
}

/// Alarms on one metric (namespace, name) whose dimensions include `dimensions`, that notify.
fn alarms_on(namespace: &str, metric: &str, dimensions: &[(&str, &str)]) -> Vec<&'static str> {
    of_type("AWS::CloudWatch::Alarm")
        .filter(|(_, p)| {
            p["Namespace"] == namespace
                && p["MetricName"] == metric
                && dimensions
                    .iter()
                    .all(|(n, v)| dimension(p, n).as_deref() == Some(*v))
                && p["AlarmActions"].as_array().is_some_and(|a| !a.is_empty())
        })
        .map(|(n, _)| n.as_str())
        .collect()
}

fn assert_queue_depth_alarm(queue_name: &str) {
    let queue_dimension = format!("${{{queue_name}.QueueName}}");
    let alarms = alarms_on(
        "AWS/SQS",
        "ApproximateNumberOfMessagesVisible",
        &[("QueueName", &queue_dimension)],
    );
    assert!(
        !alarms.is_empty(),
        "no alarm with actions watches the depth (ApproximateNumberOfMessagesVisible) of {queue_name}"
    );
}

fn assert_dead_letter_queue(name: &str) {
    let queue = properties(name);
    assert_eq!(
        resource(name)["Type"],
        "AWS::SQS::Queue",
        "{name} is not an SQS queue"
    );
    assert_eq!(
        queue["SqsManagedSseEnabled"], true,
        "{name} is not encrypted"
    );
    assert_eq!(
        queue["MessageRetentionPeriod"], 1_209_600,
        "{name} does not keep messages for 14 days"
    );
    assert!(
        queue.get("FifoQueue").is_none_or(|f| f == false),
        "{name} must be a standard queue"
    );
}

// ---------------------------------------------------------------- 1: replay's audit row

#[test]
fn the_api_may_write_the_replay_audit_row_into_the_attempts_table() {
    for action in ["dynamodb:PutItem", "dynamodb:UpdateItem"] {
        assert_allows(
            "ApiFunction",
            action,
            &table("AttemptsTable"),
            "AttemptsTable",
        );
    }
}

// ---------------------------------------------------------------- 2: the events stream

fn fanout_mapping() -> &'static Value {
    let mappings: Vec<_> = of_type("AWS::Lambda::EventSourceMapping")
        .filter(|(_, p)| render(&p["FunctionName"]) == "${FanoutFunction}")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        mappings.len(),
        1,
        "FanoutFunction should have one event source mapping (the events stream)"
    );
    assert_eq!(
        render(&mappings[0]["EventSourceArn"]),
        "${EventsTable.StreamArn}"
    );
    mappings[0]
}

#[test]
fn stream_batches_that_keep_failing_go_to_an_alarmed_queue() {
    let mapping = fanout_mapping();
    assert_eq!(
        mapping["BisectBatchOnFunctionError"], true,
        "the fanout's stream mapping must bisect a failing batch"
    );
    let destination = &mapping["DestinationConfig"]["OnFailure"]["Destination"];
    assert_eq!(
        render(destination),
        "${FanoutFailureQueue.Arn}",
        "the fanout's stream mapping has no on-failure destination FanoutFailureQueue: Lambda \
         discards the records after the last retry"
    );
    assert_dead_letter_queue("FanoutFailureQueue");
    assert_allows(
        "FanoutFunction",
        "sqs:SendMessage",
        &queue("FanoutFailureQueue"),
        "FanoutFailureQueue (the stream's on-failure destination)",
    );
    assert_queue_depth_alarm("FanoutFailureQueue");
}

#[test]
fn the_fanout_stream_has_an_iterator_age_alarm() {
    let alarms: Vec<_> = of_type("AWS::CloudWatch::Alarm")
        .filter(|(_, p)| {
            p["Namespace"] == "AWS/Lambda"
                && p["MetricName"] == "IteratorAge"
                && dimension(p, "FunctionName").as_deref() == Some("${FanoutFunction}")
                && p["AlarmActions"].as_array().is_some_and(|a| !a.is_empty())
        })
        .collect();
    assert_eq!(
        alarms.len(),
        1,
        "one alarm with actions on AWS/Lambda IteratorAge of FanoutFunction expected"
    );
    let (name, alarm) = alarms[0];
    assert_eq!(
        alarm["Statistic"], "Maximum",
        "{name}: IteratorAge alarms on its Maximum"
    );
}

#[test]
fn failed_batch_items_rejected_events_and_failed_mail_raise_alarms() {
    let stack = "${AWS::StackName}";
    for function in ["fanout", "sender"] {
        let alarms = alarms_on(
            telemetry::EMF_NAMESPACE,
            telemetry::BATCH_ITEM_FAILURES,
            &[("Stack", stack), ("function", function)],
        );
        assert_eq!(
            alarms.len(),
            1,
            "one alarm on {} with function={function} expected, found {alarms:?}",
            telemetry::BATCH_ITEM_FAILURES
        );
        let alarm = properties(alarms[0]);
        assert_eq!(alarm["Statistic"], "Sum", "{}", alarms[0]);
        assert_eq!(
            alarm["Threshold"], 0,
            "{}: any failed item alarms",
            alarms[0]
        );
        assert_eq!(
            alarm["ComparisonOperator"], "GreaterThanThreshold",
            "{}",
            alarms[0]
        );
    }
    for metric in [telemetry::EVENTS_REJECTED, telemetry::NOTIFICATIONS_FAILED] {
        assert!(
            !alarms_on(telemetry::EMF_NAMESPACE, metric, &[("Stack", stack)]).is_empty(),
            "no alarm with actions on {metric}"
        );
    }
    // A webhook the sender put back unsent is queued again, not failed: it reaches neither
    // the failed-items alarm nor the dead-letter queue, so an alarm of its own watches it,
    // for each cause.
    for cause in hooklane::http::LocalFault::ALL.map(hooklane::http::LocalFault::label) {
        let watched = of_type("AWS::CloudWatch::Alarm").any(|(_, p)| {
            p["AlarmActions"].as_array().is_some_and(|a| !a.is_empty())
                && p["Threshold"] == 0
                && p["ComparisonOperator"] == "GreaterThanThreshold"
                && p["Metrics"].as_array().into_iter().flatten().any(|m| {
                    let metric = &m["MetricStat"]["Metric"];
                    metric["MetricName"] == telemetry::SENDS_OUT_OF_RESOURCES
                        && dimension(metric, "Stack").as_deref() == Some(stack)
                        && dimension(metric, "cause").as_deref() == Some(cause)
                        && dimension(metric, "outcome").as_deref() == Some("put_back")
                })
        });
        assert!(
            watched,
            "no alarm with actions on {} put back for {cause}",
            telemetry::SENDS_OUT_OF_RESOURCES
        );
    }
    let dashboard = render(&properties("Dashboard")["DashboardBody"]);
    assert!(
        dashboard.contains(telemetry::EVENTS_RECOVERED),
        "the dashboard has no graph of {}",
        telemetry::EVENTS_RECOVERED
    );
}

#[test]
fn the_events_table_has_a_sparse_index_of_unfanned_events() {
    let events = properties("EventsTable");
    let index = events["GlobalSecondaryIndexes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["IndexName"] == "unfanned")
        .expect("EventsTable has no `unfanned` index");
    let keys: Vec<(&str, &str)> = index["KeySchema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["AttributeName"].as_str().unwrap(),
                k["KeyType"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [("unfanned_shard", "HASH"), ("created_at", "RANGE")],
        "EventsTable index `unfanned`"
    );
    assert_eq!(
        index["Projection"]["ProjectionType"], "KEYS_ONLY",
        "EventsTable index `unfanned`"
    );
    let types: Vec<(&str, &str)> = events["AttributeDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["AttributeName"].as_str().unwrap(),
                a["AttributeType"].as_str().unwrap(),
            )
        })
        .collect();
    for expected in [("unfanned_shard", "S"), ("created_at", "N")] {
        assert!(
            types.contains(&expected),
            "EventsTable does not define {expected:?}"
        );
    }
}

#[test]
fn fanout_may_mark_its_events_fanned_out_and_nothing_more() {
    let events = table("EventsTable");
    assert_allows(
        "FanoutFunction",
        "dynamodb:UpdateItem",
        &events,
        "EventsTable",
    );
    let role = role_of("FanoutFunction");
    for action in [
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",
        "dynamodb:BatchWriteItem",
    ] {
        assert!(
            !allows(&role, action, &events),
            "FanoutFunction ({role}) may {action} on EventsTable; it only marks events fanned out"
        );
    }
}

/// A replay (and a resend of missed events) late in the retention moves the TTL of each
/// event it sends past the retries it starts (`expires_at`, an UpdateItem), and reads the
/// TTL of events past the one they were written with (BatchGetItem): the api runs it.
#[test]
fn the_api_may_keep_the_events_a_replay_sends() {
    for action in ["dynamodb:UpdateItem", "dynamodb:BatchGetItem"] {
        assert_allows("ApiFunction", action, &table("EventsTable"), "EventsTable");
    }
}

/// An outbox event of an account that does not exist is rejected, so both readers of new
/// events may look accounts up.
#[test]
fn fanout_and_the_sweeper_may_look_up_an_events_account() {
    for function in ["FanoutFunction", "SweeperFunction"] {
        assert_allows(
            function,
            "dynamodb:GetItem",
            &table("AccountsTable"),
            "AccountsTable",
        );
    }
}

#[test]
fn the_sweeper_may_find_and_recover_unfanned_events() {
    assert_allows(
        "SweeperFunction",
        "dynamodb:Query",
        &index("EventsTable", "unfanned"),
        "EventsTable index `unfanned`",
    );
    for action in ["dynamodb:GetItem", "dynamodb:UpdateItem"] {
        assert_allows(
            "SweeperFunction",
            action,
            &table("EventsTable"),
            "EventsTable",
        );
    }
}

// ---------------------------------------------------------------- 4: owner mail

#[test]
fn only_health_sends_mail_and_only_from_notification_from() {
    let health = role_of("HealthFunction");
    let identities = "arn:${AWS::Partition}:ses:${AWS::Region}:${AWS::AccountId}:identity/*";
    let mut health_sends = false;
    for (role, _) in of_type("AWS::IAM::Role") {
        for statement in statements(role) {
            let ses: Vec<_> = statement
                .actions
                .iter()
                .filter(|a| a.to_ascii_lowercase().starts_with("ses:") || a.as_str() == "*")
                .collect();
            if ses.is_empty() {
                continue;
            }
            assert_eq!(
                role, &health,
                "{role} ({}) has SES actions {ses:?}; only the health function mails owners",
                statement.policy
            );
            assert_eq!(
                statement.actions,
                ["ses:SendEmail"],
                "{role} ({}): only ses:SendEmail",
                statement.policy
            );
            assert_eq!(
                statement.resources,
                [identities],
                "{role} ({}): ses:SendEmail on the account's identities (SES authorises \
                 against the identity used, often the verified domain)",
                statement.policy
            );
            assert_eq!(
                statement.condition,
                serde_json::json!({"StringEquals": {"ses:FromAddress": {"Ref": "NotificationFrom"}}}),
                "{role} ({}): ses:SendEmail only from NotificationFrom",
                statement.policy
            );
            health_sends = true;
        }
    }
    assert!(health_sends, "HealthFunction ({health}) may not send mail");
}

// ---------------------------------------------------------------- 6: sweeps never overlap

/// `rate(5 minutes)` in seconds.
fn rate_seconds(expression: &str) -> u64 {
    let inner = expression
        .strip_prefix("rate(")
        .and_then(|e| e.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a rate expression: {expression}"));
    let (count, unit) = inner.split_once(' ').unwrap();
    let count: u64 = count.parse().unwrap();
    count
        * match unit.trim_end_matches('s') {
            "minute" => 60,
            "hour" => 3600,
            "day" => 86_400,
            other => panic!("unknown rate unit {other}"),
        }
}

/// Lambda keeps 100 of an account's concurrency unreserved, and a new account's quota may be
/// as low as 10: a function that reserves any fails the stack's creation there. The sweeper
/// and the health check run one at a time by a lock held for their timeout instead.
#[test]
fn no_function_reserves_concurrency() {
    let functions: Vec<_> = of_type("AWS::Lambda::Function").collect();
    assert!(
        functions.len() >= 5,
        "the translated stack's functions: {functions:?}"
    );
    let reserving: Vec<_> = functions
        .iter()
        .filter(|(_, p)| p.get("ReservedConcurrentExecutions").is_some())
        .map(|(name, _)| name)
        .collect();
    assert!(reserving.is_empty(), "{reserving:?} reserve concurrency");
}

#[test]
fn sweeper_and_health_run_one_at_a_time_and_are_not_retried() {
    use hooklane::aws::handlers::{HEALTH_RUN, SWEEP_RUN};
    for (function, run) in [
        ("SweeperFunction", SWEEP_RUN),
        ("HealthFunction", HEALTH_RUN),
    ] {
        let lambda = properties(function);
        assert_eq!(
            lambda["Timeout"].as_u64(),
            Some(run.as_secs()),
            "{function}: its run lock is held for its timeout"
        );
        let invoke_configs: Vec<_> = of_type("AWS::Lambda::EventInvokeConfig")
            .filter(|(_, p)| render(&p["FunctionName"]) == format!("${{{function}}}"))
            .collect();
        assert_eq!(
            invoke_configs.len(),
            1,
            "{function} has no EventInvokeConfig: Lambda retries a failed asynchronous \
             invocation twice"
        );
        assert_eq!(
            invoke_configs[0].1["MaximumRetryAttempts"], 0,
            "{function}: asynchronous invocations must not be retried"
        );
        let schedules: Vec<_> = of_type("AWS::Scheduler::Schedule")
            .filter(|(_, p)| render(&p["Target"]["Arn"]) == format!("${{{function}.Arn}}"))
            .collect();
        assert_eq!(schedules.len(), 1, "{function} should have one schedule");
        let (schedule_name, schedule) = schedules[0];
        assert_eq!(
            schedule["Target"]["RetryPolicy"]["MaximumRetryAttempts"], 0,
            "{schedule_name}: Scheduler must not retry the invocation of {function}"
        );
        let rate = rate_seconds(schedule["ScheduleExpression"].as_str().unwrap());
        if function == "SweeperFunction" {
            assert_eq!(
                rate,
                hooklane::aws::handlers::SWEEP_EVERY.as_secs(),
                "a first sweep counts the doubling ages of overdue deliveries from one rate ago"
            );
        }
        let timeout = lambda["Timeout"].as_u64().unwrap();
        assert!(
            timeout < rate,
            "{function}: timeout {timeout} s is not below its rate of {rate} s"
        );
    }
}

// ---------------------------------------------------------------- 7: build and deploy agree

fn samconfig() -> toml::Table {
    let text = std::fs::read_to_string(root().join("samconfig.toml")).unwrap();
    text.parse().unwrap()
}

#[test]
fn build_and_deploy_read_the_same_architecture() {
    let config = samconfig();
    let environment = config["default"]
        .as_table()
        .expect("samconfig has no [default]");
    let overrides = |command: &str| {
        environment
            .get(command)
            .and_then(|c| c.get("parameters"))
            .and_then(|p| p.get("parameter_overrides"))
            .and_then(toml::Value::as_str)
            .map(str::to_owned)
    };
    let global = overrides("global").unwrap_or_default();
    assert!(
        global
            .split_whitespace()
            .any(|p| p.starts_with("Architecture=")),
        "Architecture is not in [default.global.parameters] parameter_overrides, which both \
         `sam build` and `sam deploy` read (found {global:?})"
    );
    for command in ["build", "deploy"] {
        assert_eq!(
            overrides(command),
            None,
            "[default.{command}.parameters] has its own parameter_overrides: they replace the \
             global ones for `sam {command}`, and build and deploy can disagree again"
        );
    }
}

#[test]
fn every_deploy_instruction_builds_with_scripts_sam_build() {
    for file in [
        "README.md",
        "infra/README.md",
        "docs/OPERATIONS.md",
        "samconfig.toml",
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        assert!(
            text.contains("scripts/sam-build"),
            "{file} does not name the build command, scripts/sam-build"
        );
        assert!(
            !text.contains("sam build &&"),
            "{file} tells to build with plain `sam build`; the build command is scripts/sam-build"
        );
    }
}

// ---------------------------------------------------------------- 8: tables

#[test]
fn every_table_is_protected_from_deletion_and_restorable() {
    let tables: Vec<_> = of_type("AWS::DynamoDB::Table").collect();
    assert_eq!(tables.len(), 6, "six tables expected");
    for (name, table) in tables {
        assert_eq!(
            table["DeletionProtectionEnabled"], true,
            "{name} has no deletion protection"
        );
        assert_eq!(
            table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"], true,
            "{name} has no point-in-time recovery"
        );
    }
}

/// CloudFormation deletes a replaced resource once its new one is made, unless it is retained:
/// a replaced table would leave its records behind empty, a replaced schedule group would take
/// its scheduled retries with it (deleting a group deletes its schedules).
#[test]
fn what_holds_records_or_scheduled_retries_is_kept_when_replaced() {
    let kinds = ["AWS::DynamoDB::Table", "AWS::Scheduler::ScheduleGroup"];
    let held: Vec<_> = resources()
        .iter()
        .filter(|(_, r)| kinds.contains(&r["Type"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(held.len(), 7, "six tables and the retry schedule group");
    for (name, resource) in held {
        assert_eq!(resource["UpdateReplacePolicy"], "Retain", "{name}");
    }
}

// ---------------------------------------------------------------- 9: logs

#[test]
fn every_function_logs_to_its_own_group_with_a_retention() {
    let parameter = &stack()["Parameters"]["LogRetentionDays"];
    assert_eq!(
        parameter["Default"], 30,
        "LogRetentionDays defaults to 30 days"
    );
    let allowed: Vec<u64> = parameter["AllowedValues"]
        .as_array()
        .expect("LogRetentionDays has no AllowedValues")
        .iter()
        .map(|v| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .unwrap()
        })
        .collect();
    assert_eq!(
        allowed,
        [
            1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
            2922, 3288, 3653
        ],
        "LogRetentionDays allows exactly CloudWatch Logs' retention values"
    );
    let mut groups = BTreeSet::new();
    for function in FUNCTIONS {
        let logging = &properties(function)["LoggingConfig"];
        assert_eq!(
            logging["LogFormat"], "JSON",
            "{function} no longer logs JSON"
        );
        let group = render(&logging["LogGroup"]);
        let group = group
            .strip_prefix("${")
            .and_then(|g| g.strip_suffix('}'))
            .unwrap_or_else(|| {
                panic!("{function} does not log to a log group of the stack ({group})")
            })
            .to_owned();
        assert_eq!(
            resource(&group)["Type"],
            "AWS::Logs::LogGroup",
            "{function} logs to {group}, which is not a log group"
        );
        assert_eq!(
            render(&properties(&group)["RetentionInDays"]),
            "${LogRetentionDays}",
            "{group} ({function}'s log group) keeps logs for {}, not LogRetentionDays",
            properties(&group)["RetentionInDays"]
        );
        assert!(
            groups.insert(group.clone()),
            "{group} is the log group of more than one function"
        );
    }
    let dashboard = render(&properties("Dashboard")["DashboardBody"]);
    assert!(
        !dashboard.contains("/aws/lambda/${"),
        "the dashboard queries a function's default log group, which it no longer writes to"
    );
}

// ---------------------------------------------------------------- 10: schedules' dead letters

#[test]
fn retry_schedules_that_fail_go_to_an_alarmed_dead_letter_queue() {
    assert_dead_letter_queue("ScheduleDeadLetterQueue");
    assert!(
        allows(
            "SchedulerSendRole",
            "sqs:SendMessage",
            &queue("ScheduleDeadLetterQueue")
        ),
        "SchedulerSendRole may not send to ScheduleDeadLetterQueue; its statements: {:#?}",
        statements("SchedulerSendRole")
    );
    assert_queue_depth_alarm("ScheduleDeadLetterQueue");
    for function in FUNCTIONS {
        let variable = environment(function).get("HOOKLANE_SCHEDULE_DLQ_ARN");
        if function == "SenderFunction" {
            assert_eq!(
                variable.map(render).as_deref(),
                Some("${ScheduleDeadLetterQueue.Arn}"),
                "SenderFunction's HOOKLANE_SCHEDULE_DLQ_ARN"
            );
        } else {
            assert_eq!(
                variable, None,
                "{function} has HOOKLANE_SCHEDULE_DLQ_ARN; only the sender schedules retries"
            );
        }
    }
}

// ---------------------------------------------------------------- 12: dead letters can wait

#[test]
fn the_delivery_queue_expires_messages_before_its_dead_letter_queue() {
    let main = properties("DeliveryQueue");
    let target = render(&main["RedrivePolicy"]["deadLetterTargetArn"]);
    let dead_letters = target
        .strip_prefix("${")
        .and_then(|t| t.strip_suffix(".Arn}"))
        .unwrap_or_else(|| {
            panic!("DeliveryQueue's dead-letter queue is not in the stack: {target}")
        });
    // SQS's default retention is 4 days.
    let retention = |p: &Value| p["MessageRetentionPeriod"].as_u64().unwrap_or(345_600);
    let (main_retention, dead_retention) = (retention(main), retention(properties(dead_letters)));
    assert!(
        main_retention < dead_retention,
        "DeliveryQueue keeps messages {main_retention} s, its dead-letter queue {dead_letters} \
         {dead_retention} s: a dead letter keeps its first enqueue time, so it would expire as \
         it arrives"
    );
}

/// Every message to the delivery queue carries its own delay (a retry due within 15 minutes,
/// a busy endpoint's re-queue, a webhook put back unsent), which SQS refuses on a FIFO queue
/// ("you can't set DelaySeconds per message"); the emulator takes it on either.
#[test]
fn the_delivery_queue_is_a_standard_queue_so_each_message_may_have_its_delay() {
    let queue = properties("DeliveryQueue");
    assert!(
        queue.get("FifoQueue").is_none_or(|f| f == false),
        "DeliveryQueue is a FIFO queue: SQS would refuse each message's DelaySeconds"
    );
    // Nor a queue-wide delay, which would hold back the first try of every delivery too.
    assert!(
        queue.get("DelaySeconds").is_none_or(|d| d == 0),
        "DeliveryQueue delays every message: {}",
        queue["DelaySeconds"]
    );
}

/// Lambda refuses to create an SQS event source mapping whose function may run longer than
/// the queue's visibility timeout, and advises six times the function's timeout, so that a
/// batch held while the function is throttled is still hidden when it runs. The emulator
/// creates any mapping.
#[test]
fn every_queue_hides_a_batch_for_six_runs_of_the_function_it_feeds() {
    let mut checked = 0;
    for (mapping, properties_of) in of_type("AWS::Lambda::EventSourceMapping") {
        let source = render(&properties_of["EventSourceArn"]);
        let Some(queue) = source
            .strip_prefix("${")
            .and_then(|s| s.strip_suffix(".Arn}"))
            .filter(|q| resource(q)["Type"] == "AWS::SQS::Queue")
        else {
            continue;
        };
        let function = render(&properties_of["FunctionName"]);
        let function = function
            .strip_prefix("${")
            .and_then(|f| f.strip_suffix('}'))
            .unwrap_or_else(|| panic!("{mapping}: its function is not in the stack: {function}"));
        // Lambda's default timeout is 3 s, SQS's default visibility timeout 30 s.
        let timeout = properties(function)["Timeout"].as_u64().unwrap_or(3);
        let visibility = properties(queue)["VisibilityTimeout"]
            .as_u64()
            .unwrap_or(30);
        assert!(
            visibility >= 6 * timeout,
            "{queue} hides a message {visibility} s, but {function} may run {timeout} s: \
             Lambda refuses a visibility timeout below the function's timeout and advises six \
             times it"
        );
        checked += 1;
    }
    assert!(checked > 0, "no SQS event source mapping in the stack");
}

/// Lambda stops an invocation at its timeout, whatever it is doing; the local runner and
/// the emulator never do. A sender stopped mid-batch has sent requests it never recorded, so
/// their deliveries go again: its timeout must cover the longest batch it can run.
#[test]
fn the_sender_may_run_its_longest_batch_to_the_end() {
    let deadline = hooklane::http::sender::SenderConfig::default().deadline;
    let longest = hooklane::service::sender::longest_batch(deadline);
    let timeout = properties("SenderFunction")["Timeout"]
        .as_u64()
        .unwrap_or(3);
    // The batch counts the SDK's default tries (`aws::clients`' test): no function's
    // environment may change them.
    let functions: Vec<_> = of_type("AWS::Lambda::Function").collect();
    assert!(functions.len() >= 5, "{} functions", functions.len());
    for (_, function) in functions {
        let variables = &function["Environment"]["Variables"];
        for name in ["AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"] {
            assert!(variables.get(name).is_none(), "{name} set: {variables}");
        }
    }
    assert!(
        std::time::Duration::from_secs(timeout) >= longest,
        "the sender may run {timeout} s, but a batch may take {longest:?} \
         (a slot's wait, its hold and the last attempt, each up to the {deadline:?} deadline, \
         and the writes that record them)"
    );
    // A batch's sends start within a slot's wait and its hold: the sender holds none of them
    // back for want of time (`send_margin`) unless reads before them went unanswered.
    let margin = hooklane::service::sender::send_margin(deadline);
    assert!(
        std::time::Duration::from_secs(timeout) >= deadline * 2 + margin,
        "the sender may run {timeout} s: a send started after two deadlines of {deadline:?} \
         would be held back, as {margin:?} must be left to send and record it"
    );
    let reliability = std::fs::read_to_string(root().join("docs/RELIABILITY.md")).unwrap();
    let reliability = reliability.split_whitespace().collect::<Vec<_>>().join(" ");
    let stated = format!(
        "its record's time ({} s of its {timeout} s)",
        margin.as_secs_f64()
    );
    assert!(
        reliability.contains(&stated),
        "docs/RELIABILITY.md does not say {stated:?}"
    );
}

/// An event to many endpoints is fanned out a part at a time, each part recorded, and an
/// invocation past its share of the timeout stops at the end of a part. So the share covers
/// one part (every invocation moves the event forward), and at the counted write time the
/// stream's own tries (the first and `MaximumRetryAttempts` retries) finish an event to the
/// most endpoints allowed with room for writes many times slower; past them the sweeper
/// goes on from the same mark. Lambda stops an invocation at its timeout; the emulator's
/// local runner never does.
#[test]
fn a_fan_out_part_fits_one_invocation_and_the_largest_event_fits_the_streams_tries() {
    let most = stack()["Parameters"]["MaxEndpoints"]["MaxValue"]
        .as_u64()
        .expect("MaxEndpoints has a MaxValue");
    let timeout = properties("FanoutFunction")["Timeout"]
        .as_u64()
        .unwrap_or(3);
    let part = hooklane::service::fan_out::FAN_OUT_PART as u64;
    assert!(
        properties("FanoutFunction")["Environment"]["Variables"]
            .get("HOOKLANE_FAN_OUT_PART")
            .is_none(),
        "the check below counts the default part"
    );
    let share =
        std::time::Duration::from_secs(timeout).mul_f64(hooklane::aws::handlers::FAN_OUT_SHARE);
    let one_part = hooklane::service::fan_out::longest_fan_out(part);
    assert!(
        one_part <= share,
        "a part of {part} deliveries may take {one_part:?} to write, but the fanout function \
         fans out for {share:?} of its {timeout} s"
    );
    let tries = u64::from(hooklane::aws::stream::STREAM_RETRIES) + 1;
    let parts_per_try = (share.as_millis() / one_part.as_millis().max(1)) as u64;
    let room = 10;
    assert!(
        most.div_ceil(part) * room <= parts_per_try * tries,
        "an event to {most} endpoints is {} parts; {tries} tries of {parts_per_try} parts \
         each leave less than {room} times the counted write time",
        most.div_ceil(part)
    );
}

/// An erasure stops going through an event's deliveries in time to answer: an HTTP API
/// gives its Lambda integration 30 s at most (the emulator has neither a gateway nor a Lambda
/// timeout), and the API function has its own timeout. What the budget leaves covers the
/// page under way and the answer's reads.
#[test]
fn an_erasure_answers_within_the_api_functions_timeout() {
    let timeout = properties("ApiFunction")["Timeout"].as_u64().unwrap_or(3);
    let answered_by = std::time::Duration::from_secs(timeout.min(30));
    let budget = hooklane::store::dynamodb::ERASE_BUDGET;
    let room = std::time::Duration::from_secs(5);
    assert!(
        budget + room <= answered_by,
        "an erasure works for {budget:?}, and then needs {room:?} more, but is answered by \
         {answered_by:?} (the api function's timeout: {timeout} s)"
    );
}

/// A sweep's parts' budgets add up within the sweeper's timeout, as Lambda stops it there
/// (the local runner does not): the recovery of unfanned events, the walk of due deliveries,
/// and the erasures left unfinished, with room for the writes around them. (Each part may
/// run past its budget by the page or event under way; the erasures also start a call only
/// while a whole one fits in the time left.)
#[test]
fn a_sweeps_budgets_fit_the_sweepers_timeout() {
    let timeout = properties("SweeperFunction")["Timeout"]
        .as_u64()
        .unwrap_or(3);
    let parts = [
        (
            "unfanned events",
            hooklane::service::fan_out::RECOVER_BUDGET,
        ),
        ("due deliveries", hooklane::service::sweep::WALK_BUDGET),
        (
            "unfinished erasures",
            hooklane::store::dynamodb::FINISHING_LONGEST,
        ),
    ];
    let room = std::time::Duration::from_secs(15);
    let total: std::time::Duration = parts.iter().map(|(_, budget)| *budget).sum();
    assert!(
        total + room <= std::time::Duration::from_secs(timeout),
        "a sweep may take {total:?} ({parts:?}) and {room:?} more; the sweeper's timeout is \
         {timeout} s"
    );
}

/// The local runner gives a failing events-stream record up after as many retries as the
/// fan-out trigger's `MaximumRetryAttempts`, as Lambda does (the emulator never does).
#[test]
fn the_local_runner_gives_stream_records_up_as_the_trigger_does() {
    let retries: Vec<u64> = of_type("AWS::Lambda::EventSourceMapping")
        .filter(|(_, mapping)| render(&mapping["EventSourceArn"]) == "${EventsTable.StreamArn}")
        .map(|(_, mapping)| mapping["MaximumRetryAttempts"].as_u64().unwrap_or(u64::MAX))
        .collect();
    assert_eq!(
        retries,
        [u64::from(hooklane::aws::stream::STREAM_RETRIES)],
        "the events stream's trigger's MaximumRetryAttempts (absent: retried until the record expires)"
    );
}

/// The fan-out and the sender answer with the items that failed (the fan-out from the event
/// it could not finish, the sender each message to retry). Lambda reads that answer only from
/// a trigger with `ReportBatchItemFailures`: without it, the invocation counts as a success,
/// the stream moves past the failed records and the queue deletes the failed messages. The
/// local runner reads the answer whatever the trigger says.
#[test]
fn both_triggers_read_the_items_their_function_reports_failed() {
    let mappings: Vec<_> = of_type("AWS::Lambda::EventSourceMapping").collect();
    let sources: Vec<String> = mappings
        .iter()
        .map(|(_, m)| render(&m["EventSourceArn"]))
        .collect();
    assert!(
        sources.iter().any(|s| s == "${EventsTable.StreamArn}")
            && sources.iter().any(|s| s == "${DeliveryQueue.Arn}"),
        "{sources:?}"
    );
    for (name, mapping) in mappings {
        assert_eq!(
            mapping["FunctionResponseTypes"],
            serde_json::json!(["ReportBatchItemFailures"]),
            "{name}"
        );
    }
}

// ---------------------------------------------------------------- 13: least privilege

#[test]
fn only_the_sender_may_schedule_retries() {
    let sender = role_of("SenderFunction");
    for (role, _) in of_type("AWS::IAM::Role") {
        for statement in statements(role) {
            let scheduling: Vec<_> = statement
                .actions
                .iter()
                .filter(|a| {
                    let a = a.to_ascii_lowercase();
                    a.starts_with("scheduler:")
                        || glob(&a, "iam:passrole")
                        || glob(&a, "scheduler:createschedule")
                })
                .collect();
            assert!(
                scheduling.is_empty() || role == &sender,
                "{role} ({}) has {scheduling:?}; only the sender schedules retries",
                statement.policy
            );
        }
    }
    let group = "arn:${AWS::Partition}:scheduler:${AWS::Region}:${AWS::AccountId}:schedule/${RetryScheduleGroup}/x";
    assert_allows(
        "SenderFunction",
        "scheduler:CreateSchedule",
        &[group.to_owned()],
        "the retry schedule group",
    );
    assert_allows(
        "SenderFunction",
        "iam:PassRole",
        &["${SchedulerSendRole.Arn}".to_owned()],
        "SchedulerSendRole",
    );
    for function in FUNCTIONS {
        for variable in ["HOOKLANE_SCHEDULER_ROLE_ARN", "HOOKLANE_SCHEDULE_GROUP"] {
            let present = environment(function).contains_key(variable);
            assert_eq!(
                present,
                function == "SenderFunction",
                "{function} {} {variable}; only the sender schedules retries",
                if present { "has" } else { "lacks" }
            );
        }
    }
}

#[test]
fn fanout_reads_its_stream_through_one_grant() {
    let role = role_of("FanoutFunction");
    let managed = managed_policies(&role);
    assert!(
        managed
            .iter()
            .any(|arn| arn.ends_with(":policy/service-role/AWSLambdaDynamoDBExecutionRole")),
        "{role} lacks AWSLambdaDynamoDBExecutionRole, which SAM attaches for a DynamoDB event \
         source: {managed:?}"
    );
    for statement in statements(&role) {
        let stream_reads: Vec<_> = statement
            .actions
            .iter()
            .filter(|a| {
                [
                    "dynamodb:GetRecords",
                    "dynamodb:GetShardIterator",
                    "dynamodb:DescribeStream",
                    "dynamodb:ListStreams",
                ]
                .iter()
                .any(|read| glob(&a.to_ascii_lowercase(), &read.to_ascii_lowercase()))
            })
            .collect();
        assert!(
            stream_reads.is_empty(),
            "{role} ({}) grants {stream_reads:?} again; AWSLambdaDynamoDBExecutionRole already \
             allows reading the stream",
            statement.policy
        );
    }
}

// ---------------------------------------------------------------- 14: the API's throttle

/// A parameter's `Default`, `MinValue` or `MaxValue` as a number (the decoder keeps YAML's
/// numbers; a quoted one is a string).
fn parameter_number(parameter: &str, field: &str) -> f64 {
    let value = &stack()["Parameters"][parameter][field];
    value
        .as_f64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("parameter {parameter} has no numeric {field}: {value}"))
}

/// No function reserves concurrency (above), so a client sending requests as fast as it can
/// would take the account's Lambda concurrency from the sender and fan-out, one invocation a
/// request: the publish limits run inside the api function, after the invocation. The HTTP
/// API's stage throttles every route before that (API Gateway answers 429 without invoking
/// the function), at rates from the stack's parameters, within what API Gateway accepts.
#[test]
fn the_http_api_throttles_every_route_before_invoking_the_api() {
    // API Gateway's default throttle quota per account and Region, across all its APIs
    // (https://docs.aws.amazon.com/apigateway/latest/developerguide/limits.html): a stage's
    // default route limits cannot exceed it.
    const ACCOUNT_RATE: f64 = 10_000.0;
    const ACCOUNT_BURST: f64 = 5_000.0;

    let stages: Vec<_> = of_type("AWS::ApiGatewayV2::Stage")
        .filter(|(_, p)| render(&p["ApiId"]) == "${ServerlessHttpApi}")
        .collect();
    assert_eq!(
        stages.len(),
        1,
        "ServerlessHttpApi should have one stage: {stages:?}"
    );
    let (name, stage) = stages[0];
    assert_eq!(
        stage["StageName"], "$default",
        "{name}: the ApiUrl output names no stage, so the API is served from `$default`"
    );
    assert_eq!(
        resource("ServerlessHttpApi")["Type"],
        "AWS::ApiGatewayV2::Api",
        "ApiUrl is made from ServerlessHttpApi"
    );
    let settings = &stage["DefaultRouteSettings"];
    for (property, parameter, account_limit, integer) in [
        ("ThrottlingRateLimit", "ApiRateLimit", ACCOUNT_RATE, false),
        ("ThrottlingBurstLimit", "ApiBurstLimit", ACCOUNT_BURST, true),
    ] {
        assert_eq!(
            render(&settings[property]),
            format!("${{{parameter}}}"),
            "{name}'s DefaultRouteSettings.{property} is not the {parameter} parameter \
             (DefaultRouteSettings: {settings})"
        );
        assert_eq!(
            stack()["Parameters"][parameter]["Type"],
            "Number",
            "{parameter}: {property} is a number"
        );
        let (min, max, default) = (
            parameter_number(parameter, "MinValue"),
            parameter_number(parameter, "MaxValue"),
            parameter_number(parameter, "Default"),
        );
        assert!(
            min >= 1.0,
            "{parameter} may be {min}: a limit of 0 refuses every request"
        );
        assert!(
            max <= account_limit,
            "{parameter} may be {max}, above API Gateway's account limit of {account_limit}"
        );
        assert!(
            (min..=max).contains(&default) && default <= account_limit / 4.0,
            "{parameter} defaults to {default}: within {min}..={max} and at most a quarter \
             of the account limit of {account_limit}, which the account's other APIs share"
        );
        if integer {
            for value in [min, max, default] {
                assert_eq!(
                    value.fract(),
                    0.0,
                    "{parameter}: {property} is an integer, not {value}"
                );
            }
        }
    }
    // A route's own settings replace the stage's defaults for that route.
    for (route, route_settings) in stage["RouteSettings"].as_object().into_iter().flatten() {
        for property in ["ThrottlingRateLimit", "ThrottlingBurstLimit"] {
            assert!(
                route_settings.get(property).is_none(),
                "{name}: route {route} sets its own {property}, escaping the API's throttle"
            );
        }
    }
}

/// The names the template gives its resources fit the services' limits whatever the stack's
/// name: CloudFormation takes stack names of up to 128 characters, and a name built from one
/// can pass a service's limit, which only the deployment would show (cfn-lint cannot know the
/// stack's name, and the emulator's stacks have short ones). An EventBridge Scheduler group
/// takes 64 characters (the AWS::Scheduler::ScheduleGroup reference).
#[test]
fn every_name_fits_its_service_for_the_longest_stack_name() {
    // (type, naming property, longest name the service takes)
    const LIMITS: [(&str, &str, usize); 9] = [
        ("AWS::DynamoDB::Table", "TableName", 255),
        ("AWS::Logs::LogGroup", "LogGroupName", 512),
        ("AWS::Scheduler::ScheduleGroup", "Name", 64),
        ("AWS::SQS::Queue", "QueueName", 80),
        ("AWS::CloudWatch::Dashboard", "DashboardName", 255),
        ("AWS::CloudWatch::Alarm", "AlarmName", 255),
        ("AWS::Lambda::Function", "FunctionName", 64),
        ("AWS::IAM::Role", "RoleName", 64),
        ("AWS::SNS::Topic", "TopicName", 256),
    ];
    let longest_stack = format!("h{}", "x".repeat(127));
    let mut named = 0;
    let mut too_long = Vec::new();
    for (logical, resource) in resources() {
        let kind = resource["Type"].as_str().unwrap_or_default();
        for (_, property, limit) in LIMITS.iter().filter(|(k, _, _)| *k == kind) {
            let name = match &resource["Properties"][*property] {
                Value::Null => continue,
                Value::String(literal) => literal.clone(),
                other => other["Fn::Sub"]
                    .as_str()
                    .unwrap_or_else(|| {
                        panic!("{logical}.{property}: not a string or a Sub: {other}")
                    })
                    .replace("${AWS::StackName}", &longest_stack),
            };
            assert!(
                !name.contains("${"),
                "{logical}.{property}: cannot resolve {name}"
            );
            named += 1;
            if name.len() > *limit {
                too_long.push(format!("{logical}.{property}: {} > {limit}", name.len()));
            }
        }
    }
    assert!(
        named >= 10,
        "only {named} names checked: the template's layout changed?"
    );
    assert!(too_long.is_empty(), "{too_long:#?}");
}
