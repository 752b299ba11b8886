//! Every AWS request the functions make is allowed by their roles as `infra/template.yaml`
//! defines them. `serve --backend aws` records each request with the function it ran for
//! (`HOOKLANE_AWS_REQUEST_LOG`) while a scenario exercises all five functions, their
//! triggers and the Scheduler's role; the requests are then evaluated against the roles of
//! the template translated by aws-sam-translator (policy templates expanded, intrinsics
//! resolved for the test stack) by a real IAM policy evaluator (iam-simulate, run by
//! tests/iam/evaluate.cjs). The emulator itself allows everything.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::OnceLock,
    time::{Duration, Instant},
};

use hooklane::{
    aws::{aws_sdk_sesv2, aws_sdk_ssm, load_sdk_config, local, record::RUNNER, stack::Stack},
    config::CoreConfig,
};
use hooklane_testkit::farm::{Behavior, Farm};
use hooklane_testkit::testing::require_emulator;
use serde_json::{json, Value};

use crate::{
    aws_pipeline::{stack_env, unique, with},
    support::{Scratch, Server, ADMIN_TOKEN},
};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// One recorded request, its resource resolved for the stack.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Request {
    who: String,
    action: String,
    resource: String,
    context: String,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} on {}", self.who, self.action, self.resource)?;
        if self.context != "{}" {
            write!(f, " with {}", self.context)?;
        }
        Ok(())
    }
}

/// The distinct requests of a record (`HOOKLANE_AWS_REQUEST_LOG`), and how many lines it had.
fn read_requests(path: &Path, stack: &Stack) -> (BTreeSet<Request>, usize) {
    let text = std::fs::read_to_string(path).expect("the request record");
    let mut requests = BTreeSet::new();
    let mut lines = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        lines += 1;
        let line: Value = serde_json::from_str(line).expect("a JSON line");
        let resource = line["resource"].as_str().unwrap();
        let resource = if resource == "*" {
            "*".to_owned()
        } else {
            stack
                .resolve(&json!({"Fn::Sub": resource}))
                .unwrap_or_else(|e| panic!("recorded resource {resource}: {e}"))
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap()
        };
        requests.insert(Request {
            who: line["function"].as_str().unwrap().to_owned(),
            action: line["action"].as_str().unwrap().to_owned(),
            resource,
            context: line["context"].to_string(),
        });
    }
    (requests, lines)
}

/// The translated template, once for all tests.
fn translated() -> &'static Value {
    static TRANSLATED: OnceLock<Value> = OnceLock::new();
    TRANSLATED.get_or_init(|| hooklane_testkit::testing::sam_translated(&[]))
}

/// The roles of the translated template: name → {principal, policies: [{name, document}]},
/// inline policies and AWS managed ones, resolved for `stack`.
fn roles(stack: &Stack) -> BTreeMap<String, Value> {
    let translated = translated();
    let resources = translated["Resources"].as_object().unwrap();
    let mut managed = BTreeSet::new();
    for resource in resources.values().filter(|r| r["Type"] == "AWS::IAM::Role") {
        for arn in resource["Properties"]["ManagedPolicyArns"]
            .as_array()
            .into_iter()
            .flatten()
        {
            managed.insert(arn.as_str().expect("a managed policy ARN").to_owned());
        }
    }
    static DOCUMENTS: OnceLock<Value> = OnceLock::new();
    let documents = DOCUMENTS.get_or_init(|| {
        let mut args = vec!["--managed-policies"];
        args.extend(managed.iter().map(String::as_str));
        hooklane_testkit::testing::sam_translated(&args)
    });
    let mut roles = BTreeMap::new();
    for (name, resource) in resources
        .iter()
        .filter(|(_, r)| r["Type"] == "AWS::IAM::Role")
    {
        let mut policies = Vec::new();
        for policy in resource["Properties"]["Policies"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let document = stack
                .resolve(&policy["PolicyDocument"])
                .unwrap_or_else(|e| panic!("{name}'s policy {}: {e}", policy["PolicyName"]))
                .unwrap();
            policies.push(json!({"name": policy["PolicyName"], "document": document}));
        }
        for arn in resource["Properties"]["ManagedPolicyArns"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let arn = arn.as_str().unwrap();
            policies.push(json!({"name": arn, "document": documents[arn]}));
        }
        let principal = format!("arn:aws:iam::{}:role/{}-{name}", stack.account, stack.name);
        roles.insert(
            name.clone(),
            json!({"principal": principal, "policies": policies}),
        );
    }
    roles
}

/// The role AWS uses for `who`'s requests: a function's execution role, the role of the
/// schedule that invokes a function (`schedule:Function`), or a role named directly.
fn role_of(who: &str) -> Option<String> {
    let resources = translated()["Resources"].as_object().unwrap();
    let logical_of = |value: &Value| value["Fn::GetAtt"][0].as_str().map(str::to_owned);
    if let Some(function) = who.strip_prefix("schedule:") {
        return resources
            .values()
            .filter(|r| r["Type"] == "AWS::Scheduler::Schedule")
            .find(|r| logical_of(&r["Properties"]["Target"]["Arn"]).as_deref() == Some(function))
            .and_then(|r| logical_of(&r["Properties"]["Target"]["RoleArn"]));
    }
    match resources.get(who)?["Type"].as_str()? {
        "AWS::Lambda::Function" => logical_of(&resources[who]["Properties"]["Role"]),
        "AWS::IAM::Role" => Some(who.to_owned()),
        _ => None,
    }
}

/// Runs the evaluator; one result per request, in order.
fn evaluate(
    account: &str,
    roles: &BTreeMap<String, Value>,
    requests: &[(String, &Request)],
) -> Vec<Value> {
    let modules = std::env::var("HOOKLANE_TEST_NODE_MODULES").unwrap_or_else(|_| {
        panic!("HOOKLANE_TEST_NODE_MODULES is not set: run the tests with scripts/test, which installs iam-simulate")
    });
    let input = json!({
        "account": account,
        "roles": roles,
        "requests": requests.iter().map(|(role, r)| json!({
            "role": role,
            "action": r.action,
            "resource": r.resource,
            "context": serde_json::from_str::<Value>(&r.context).unwrap(),
        })).collect::<Vec<_>>(),
    });
    let mut child = std::process::Command::new("node")
        .arg(root().join("tests/iam/evaluate.cjs"))
        .env("HOOKLANE_TEST_NODE_MODULES", modules)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run node");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.to_string().as_bytes()).unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "tests/iam/evaluate.cjs failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(results.len(), requests.len());
    results
}

/// What the evaluation found: the requests denied (with why), and the grants used.
struct Verdict {
    denied: Vec<String>,
    /// (role, policy, statement index) → action patterns that allowed a request
    used: BTreeMap<(String, String, usize), BTreeSet<String>>,
}

fn judge(stack: &Stack, roles: &BTreeMap<String, Value>, requests: &BTreeSet<Request>) -> Verdict {
    let mut denied = Vec::new();
    let mut asked = Vec::new();
    for request in requests.iter().filter(|r| r.who != RUNNER) {
        match role_of(&request.who) {
            Some(role) => asked.push((role, request)),
            None => denied.push(format!(
                "{request}: no role of the template runs `{}`",
                request.who
            )),
        }
    }
    let results = evaluate(&stack.account, roles, &asked);
    let mut used: BTreeMap<(String, String, usize), BTreeSet<String>> = BTreeMap::new();
    for ((role, request), result) in asked.iter().zip(&results) {
        if result["decision"] != "Allowed" {
            denied.push(format!(
                "{request} (role {role}): {} {}",
                result["decision"], result["errors"]
            ));
        }
        for by in result["allowedBy"].as_array().into_iter().flatten() {
            let key = (
                role.clone(),
                by["policy"].as_str().unwrap().to_owned(),
                by["statement"].as_u64().unwrap() as usize,
            );
            used.entry(key).or_default().extend(
                by["actions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| a.as_str().unwrap().to_owned()),
            );
        }
    }
    Verdict { denied, used }
}

/// The grants of the roles that ran something that no recorded request used.
fn unused_grants(
    stack: &Stack,
    roles: &BTreeMap<String, Value>,
    used: &BTreeMap<(String, String, usize), BTreeSet<String>>,
) -> Vec<String> {
    let active: BTreeSet<&String> = used.keys().map(|(role, _, _)| role).collect();
    let mut lines = Vec::new();
    for (role, definition) in roles.iter().filter(|(r, _)| active.contains(r)) {
        for policy in definition["policies"].as_array().unwrap() {
            let name = policy["name"].as_str().unwrap();
            let statements = policy["document"]["Statement"]
                .as_array()
                .cloned()
                .unwrap_or_else(|| vec![policy["document"]["Statement"].clone()]);
            for (index, statement) in statements
                .iter()
                .enumerate()
                .filter(|(_, s)| s["Effect"] == "Allow")
            {
                let actions: Vec<String> = match &statement["Action"] {
                    Value::Array(a) => a.iter().map(|x| x.as_str().unwrap().to_owned()).collect(),
                    other => vec![other.as_str().unwrap_or_default().to_owned()],
                };
                // Resources by the template's names: a table's ARN (and its indexes) as
                // the table's logical id.
                let mut resources: BTreeSet<String> = BTreeSet::new();
                let listed: Vec<String> = match &statement["Resource"] {
                    Value::Array(a) => a
                        .iter()
                        .map(|x| x.as_str().unwrap_or_default().to_owned())
                        .collect(),
                    other => vec![other.as_str().unwrap_or_default().to_owned()],
                };
                for arn in listed {
                    let base = arn.split("/index/").next().unwrap_or(&arn).to_owned();
                    let logical = stack
                        .resources
                        .iter()
                        .find(|(_, p)| p.attributes.get("Arn") == Some(&base))
                        .map(|(l, _)| l.clone());
                    resources.insert(logical.unwrap_or(arn));
                }
                let resources = resources.into_iter().collect::<Vec<_>>().join(" ");
                let used_here = used.get(&(role.clone(), name.to_owned(), index));
                let unused: Vec<&String> = actions
                    .iter()
                    .filter(|a| used_here.is_none_or(|u| !u.contains(*a)))
                    .collect();
                if !unused.is_empty() {
                    let short = name.rsplit('/').next().unwrap_or(name);
                    lines.push(format!(
                        "{role:<20} {short:<32} {resources:<40} {}",
                        unused
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
    }
    lines
}

/// Removes the statement of `role` that allows `action` on a resource ending in `suffix`.
fn without_grant(
    roles: &BTreeMap<String, Value>,
    role: &str,
    action: &str,
    suffix: &str,
) -> BTreeMap<String, Value> {
    let mut roles = roles.clone();
    let mut removed = 0;
    for policy in roles.get_mut(role).unwrap()["policies"]
        .as_array_mut()
        .unwrap()
    {
        if let Some(statements) = policy["document"]["Statement"].as_array_mut() {
            let before = statements.len();
            statements.retain(|s| {
                let actions = s["Action"].to_string();
                let resources = s["Resource"].to_string();
                !(actions.contains(action) && resources.contains(suffix))
            });
            removed += before - statements.len();
        }
    }
    assert_eq!(
        removed, 1,
        "one statement of {role} grants {action} on …{suffix}"
    );
    roles
}

/// A server's recorded requests, evaluated against the roles of its stack.
struct Checked {
    stack: Stack,
    roles: BTreeMap<String, Value>,
    requests: BTreeSet<Request>,
    lines: usize,
    verdict: Verdict,
}

fn check(server: &Server) -> Checked {
    let record = PathBuf::from(
        server
            .env_var("HOOKLANE_AWS_REQUEST_LOG")
            .expect("a request record"),
    );
    let prefix = server
        .env_var("HOOKLANE_TABLE_PREFIX")
        .or_else(|| server.arg_after("--provision"))
        .expect("the stack's name");
    let text = std::fs::read_to_string(&record).unwrap_or_default();
    // The account, from a queue's URL (the emulator's, or a real one).
    let account = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| {
            let arn = l["resource"].as_str()?.replace("${AWS::Region}", "region");
            let account = arn
                .strip_prefix("arn:aws:sqs:")?
                .split(':')
                .nth(1)?
                .to_owned();
            Some(account)
        })
        .find(|a| !a.starts_with("${"))
        .expect("a recorded request to a queue");
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
    // The deployer's choices that the roles' grants name.
    let mut parameters = Vec::new();
    if let Some(from) = server.env_var("HOOKLANE_NOTIFICATION_FROM") {
        parameters.push(("NotificationFrom", from));
    }
    if let Some(parameter) = server
        .env_var("HOOKLANE_ADMIN_TOKEN_PARAMETER")
        .filter(|p| !p.is_empty())
    {
        parameters.push(("AdminTokenParameterName", parameter));
    }
    if let Some(parameter) = server
        .env_var("HOOKLANE_SECRETS_KEY_PARAMETER")
        .filter(|p| !p.is_empty())
    {
        parameters.push(("SecretsKeyParameterName", parameter));
    }
    let stack = Stack::new(prefix, &region, &account, &parameters).expect("the test stack");
    let roles = roles(&stack);
    let (requests, lines) = read_requests(&record, &stack);
    let verdict = judge(&stack, &roles, &requests);
    Checked {
        stack,
        roles,
        requests,
        lines,
        verdict,
    }
}

/// Every AWS request `server` made (so far) is allowed by the template's roles.
pub(crate) fn assert_allowed(server: &Server) {
    let checked = check(server);
    // Checked first: an unattributed request is also denied (no role runs it), but this
    // says why.
    assert!(
        checked.requests.iter().all(|r| r.who != "unattributed"),
        "requests made outside any function's work: {:?}",
        checked
            .requests
            .iter()
            .filter(|r| r.who == "unattributed")
            .collect::<Vec<_>>()
    );
    let denied = &checked.verdict.denied;
    assert!(
        denied.is_empty(),
        "requests the template's roles do not allow:\n{}",
        denied.join("\n")
    );
    eprintln!(
        "iam: {} requests ({} distinct) allowed by the template's roles",
        checked.lines,
        checked.requests.len()
    );
}

/// What a deployer creates beside a stack: the admin token's SSM parameter (holding
/// `token`) and a verified SES identity for owner mail. Returns their names.
/// What the deployer creates beside the stack, named by the stack's parameters: the admin
/// token's and the secrets key's SSM SecureString parameters, and a verified sender address.
pub(crate) struct DeployerSetup {
    pub admin_token_parameter: String,
    pub secrets_key_parameter: String,
    pub from: String,
}

pub(crate) async fn deployer_setup(prefix: &str, token: &str) -> DeployerSetup {
    let sdk = load_sdk_config().await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let key: String = hooklane_testkit::testing::TEST_SECRETS_KEY
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (admin_token_parameter, secrets_key_parameter) = (
        format!("/{prefix}/admin-token"),
        format!("/{prefix}/secrets-key"),
    );
    for (name, value) in [
        (&admin_token_parameter, token),
        (&secrets_key_parameter, &key),
    ] {
        ssm.put_parameter()
            .name(name)
            .value(value)
            .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
            .send()
            .await
            .unwrap_or_else(|e| panic!("parameter {name}: {e}"));
    }
    let from = format!("{}@example.com", unique("owners"));
    aws_sdk_sesv2::Client::new(&sdk)
        .create_email_identity()
        .email_identity(&from)
        .send()
        .await
        .expect("SES identity");
    DeployerSetup {
        admin_token_parameter,
        secrets_key_parameter,
        from,
    }
}

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_aws_request_of_the_functions_is_allowed_by_their_roles_in_the_template() {
    require_emulator();
    let started = Instant::now();
    let prefix = unique("iam");
    let settings = local::provision(&prefix, CoreConfig::default())
        .await
        .expect("provision");
    // The admin token and the secrets key from their SSM parameters and owner mail from a
    // verified address, as deployed; the stack's parameters name them, so the roles' grants
    // name them too.
    let setup = deployer_setup(&prefix, ADMIN_TOKEN).await;

    let farm = Farm::start().await.expect("farm");
    farm.configure("later", Behavior::failing_first(1));
    farm.configure("down", Behavior::status(500));
    let scratch = Scratch::new("aws-iam");
    let env = with(
        stack_env(&settings),
        &[
            ("HOOKLANE_ADMIN_TOKEN", ""),
            (
                "HOOKLANE_ADMIN_TOKEN_PARAMETER",
                &setup.admin_token_parameter,
            ),
            ("HOOKLANE_SECRETS_KEY", ""),
            (
                "HOOKLANE_SECRETS_KEY_PARAMETER",
                &setup.secrets_key_parameter,
            ),
            ("HOOKLANE_NOTIFICATION_FROM", &setup.from),
            // A retry after 1500–3000 s goes through a schedule; time runs 600× faster.
            ("HOOKLANE_RETRY_SCHEDULE", "3000"),
            ("HOOKLANE_LOCAL_TIME_SCALE", "600"),
            // Longer than `later`'s retry takes (2.5-5 s), with room for a stall of the
            // emulator or the machine (one of 12 s disabled `later` too at 8 s), so that
            // only `down` is disabled.
            ("HOOKLANE_DISABLE_AFTER", "20s"),
            ("HOOKLANE_HEALTH_INTERVAL", "500ms"),
            ("HOOKLANE_SWEEP_INTERVAL", "500ms"),
            ("HOOKLANE_SWEEP_GRACE", "1s"),
            // The event's three deliveries in parts of two: the fan-out reads and records
            // how far it got, as it does for an event to more than 1,000 endpoints.
            ("HOOKLANE_FAN_OUT_PART", "2"),
        ],
    );
    let server = Server::start_aws(&scratch, &[], &env).await;
    server.create_account("acme").await;
    let [ok, _, down] = server
        .farm_endpoints("acme", &farm, ["ok", "later", "down"])
        .await;
    let event = server
        .publish("acme", "invoice.paid", json!({"amount": 7}))
        .await;
    let event_id = event["id"].as_str().unwrap().to_owned();
    let log = || server.log_text();
    assert!(
        farm.wait_until(WAIT, |f| f.success_count("ok") == 1
            && f.success_count("later") == 1)
            .await,
        "the first delivery and the scheduled retry did not both arrive; serve log:\n{}",
        log()
    );
    let down_path = format!("/v1/accounts/acme/endpoints/{down}");
    assert!(
        server
            .eventually(WAIT, || async {
                server.get(&down_path).await.1["status"] == "disabled"
            })
            .await,
        "the failing endpoint was not disabled; serve log:\n{}",
        log()
    );
    // The owner mail's request is in the record (what the emulator did with it is the
    // health test's concern; reading its whole state back is slow once it holds much).
    let record = PathBuf::from(server.env_var("HOOKLANE_AWS_REQUEST_LOG").unwrap());
    let record_ref = &record;
    assert!(
        server
            .eventually(WAIT, move || async move {
                std::fs::read_to_string(record_ref).is_ok_and(|t| t.contains("\"ses:SendEmail\""))
            })
            .await,
        "no owner mail was sent; serve log:\n{}",
        log()
    );
    // A replay (its audit row goes into the attempts table) and the delivery log's reads.
    let deliveries = server.deliveries("acme", "").await;
    let ok_delivery = deliveries
        .iter()
        .find(|d| d["endpoint_id"] == ok.as_str())
        .expect("the delivery to the healthy endpoint");
    let ok_id = ok_delivery["id"].as_str().unwrap();
    let (status, body) = server
        .post(
            &format!("/v1/accounts/acme/deliveries/{ok_id}/replay"),
            json!({}),
        )
        .await;
    assert!(status < 300, "replay: {status} {body}");
    assert!(
        farm.wait_until(WAIT, |f| f.success_count("ok") + f.success_count("later")
            >= 3)
            .await,
        "the replayed delivery did not arrive; serve log:\n{}",
        log()
    );
    settled(&server, &event_id).await;
    every_route(&server, &ok, ok_id).await;
    let Checked {
        stack,
        roles,
        requests,
        lines,
        verdict,
    } = check(&server);
    drop(server);
    let whos: BTreeSet<&str> = requests.iter().map(|r| r.who.as_str()).collect();
    let runner = requests.iter().filter(|r| r.who == RUNNER).count();
    eprintln!(
        "iam: {lines} recorded requests, {} distinct (function, action, resource), {runner} of them the local runner's own; from {whos:?}",
        requests.len()
    );
    for request in requests.iter().filter(|r| r.who != RUNNER) {
        eprintln!("iam: allowed? {request}");
    }
    let unused = unused_grants(&stack, &roles, &verdict.used);
    eprintln!(
        "iam: {} grants that no recorded request used:",
        unused.len()
    );
    for line in &unused {
        eprintln!("iam:   {line}");
    }
    assert!(
        !whos.contains("unattributed"),
        "requests made outside any function's work"
    );
    assert!(
        verdict.denied.is_empty(),
        "requests the template's roles do not allow:\n{}",
        verdict.denied.join("\n")
    );
    for function in Stack::functions().unwrap() {
        assert!(
            whos.contains(function),
            "no request of {function} was recorded: the scenario misses it"
        );
    }
    assert!(
        whos.contains("SchedulerSendRole"),
        "no send with the Scheduler's role was recorded"
    );

    // Negative control: without the API's grant for the replay's audit row, the same
    // requests are denied, and the denial names the function, the action and the table.
    let attempts = stack.resources["AttemptsTable"].reference.clone();
    let weakened = without_grant(
        &roles,
        "ApiFunctionRole",
        "dynamodb:PutItem\",\"dynamodb:UpdateItem\"]",
        &format!("table/{attempts}\""),
    );
    let control = judge(&stack, &weakened, &requests);
    eprintln!("iam: negative control, without the API's statement on the attempts table:");
    for line in &control.denied {
        eprintln!("iam:   denied {line}");
    }
    assert!(
        control
            .denied
            .iter()
            .any(|d| d.starts_with("ApiFunction dynamodb:PutItem on") && d.contains(&attempts)),
        "removing the grant denied nothing: {:?}",
        control.denied
    );
    eprintln!("iam: scenario and evaluation in {:?}", started.elapsed());
}

/// Calls every other route of the API once, so that the api function's requests cover them.
async fn every_route(server: &Server, endpoint: &str, delivery: &str) {
    use reqwest::Method;
    let (spare, _) = server
        .create_endpoint("acme", "http://127.0.0.1:9/spare", json!({}))
        .await;
    let e = format!("/v1/accounts/acme/endpoints/{endpoint}");
    let s = format!("/v1/accounts/acme/endpoints/{spare}");
    let d = format!("/v1/accounts/acme/deliveries/{delivery}");
    let since = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let calls: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, "/v1/accounts/acme".into(), None),
        (Method::GET, "/v1/accounts/acme/endpoints".into(), None),
        (Method::GET, e.clone(), None),
        (
            Method::PATCH,
            e.clone(),
            Some(json!({"description": "renamed"})),
        ),
        (Method::POST, format!("{e}/secret/rotate"), Some(json!({}))),
        (Method::GET, format!("{e}/deliveries"), None),
        (Method::GET, d.clone(), None),
        (Method::GET, format!("{d}/attempts"), None),
        (
            Method::POST,
            format!("{e}/replay"),
            Some(json!({"since": since, "statuses": ["delivered"]})),
        ),
        // What the endpoint missed while disabled: a query of the events table's `missed`
        // index, which the emulator allows whatever the role says.
        (
            Method::POST,
            format!("{e}/replay"),
            Some(json!({"since": since, "include_missed": true})),
        ),
        (Method::GET, "/v1/accounts/acme/replays".into(), None),
        (
            Method::POST,
            "/v1/accounts/acme/tokens".into(),
            Some(json!({"ttl_seconds": 60})),
        ),
        (Method::GET, "/v1/whoami".into(), None),
        (Method::POST, format!("{s}/disable"), Some(json!({}))),
        (Method::POST, format!("{s}/enable"), Some(json!({}))),
        (Method::DELETE, s.clone(), None),
    ];
    for (method, path, body) in calls {
        let (status, answer) = server.request(method.clone(), &path, body).await;
        assert!(status < 300, "{method} {path}: {status} {answer}");
    }
    // A scoped key: made, listed, used (its item is read), revoked.
    let (status, key) = server
        .post(
            "/v1/keys",
            json!({"name": "iam", "scopes": ["accounts:read"], "accounts": ["acme"]}),
        )
        .await;
    assert_eq!(status, 201, "{key}");
    let (status, list) = server.get("/v1/keys").await;
    assert_eq!(status, 200, "{list}");
    let used = reqwest::Client::new()
        .get(format!("{}/v1/accounts/acme", server.base))
        .bearer_auth(key["secret"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(used.status().as_u16(), 200);
    let path = format!("/v1/keys/{}", key["id"].as_str().unwrap());
    let (status, revoked) = server.request(Method::DELETE, &path, None).await;
    assert_eq!(status, 200, "{revoked}");
}

/// Waits until the event's two healthy deliveries show as delivered.
async fn settled(server: &Server, event: &str) {
    let path = format!("/v1/accounts/acme/events/{event}");
    let settled = server
        .eventually(WAIT, || async {
            let (_, body) = server.get(&path).await;
            body["deliveries"]
                .as_array()
                .is_some_and(|d| d.iter().filter(|x| x["status"] == "delivered").count() >= 2)
        })
        .await;
    assert!(settled, "the event's deliveries did not settle");
}
