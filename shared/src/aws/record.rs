//! A record of the AWS requests the functions make, for checking a deployment's permissions
//! against what the code really asks for. With `HOOKLANE_AWS_REQUEST_LOG` set to a file,
//! every SDK client appends one JSON line per IAM action a request needs: the function it
//! ran for, the action, the resource ARN and the request's condition keys (a transaction is
//! one line per item). `${AWS::Region}` and `${AWS::AccountId}` stand in an ARN for what
//! the request alone does not tell.
//!
//! The function is the one whose work is running ([`as_function`]); the local runner tags
//! each function's work, its triggers' work (reading the stream, receiving from the queue)
//! with the function whose role AWS would use, and its own bookkeeping as `runner`.

use std::{
    fs::File,
    io::Write,
    sync::{Arc, Mutex, OnceLock},
};

use aws_smithy_runtime_api::{
    box_error::BoxError,
    client::interceptors::{context::BeforeSerializationInterceptorContextRef, Intercept},
};
use aws_smithy_types::config_bag::ConfigBag;
use serde_json::{json, Value};

tokio::task_local! {
    static FUNCTION: &'static str;
}

/// Work that is not a function's: what only the local runner does (its stream checkpoints,
/// firing schedules in place of EventBridge Scheduler).
pub const RUNNER: &str = "runner";

/// Runs `work` as `function`'s: the requests it makes are recorded under that name.
pub async fn as_function<F: std::future::Future>(function: &'static str, work: F) -> F::Output {
    FUNCTION.scope(function, work).await
}

fn current_function() -> &'static str {
    FUNCTION.try_with(|f| *f).unwrap_or("unattributed")
}

/// The recorder every SDK client gets when `HOOKLANE_AWS_REQUEST_LOG` names a file.
#[derive(Debug, Clone)]
pub struct RequestRecorder {
    sink: Arc<Mutex<File>>,
    /// `GetRecords` names only a shard iterator: its stream is the one last asked for (the
    /// runner reads one stream).
    stream: Arc<Mutex<String>>,
}

/// The process's recorder, opened once; `None` when the variable is not set (or the file
/// cannot be opened, which is logged).
pub fn recorder() -> Option<RequestRecorder> {
    static RECORDER: OnceLock<Option<RequestRecorder>> = OnceLock::new();
    RECORDER
        .get_or_init(|| {
            let path = std::env::var("HOOKLANE_AWS_REQUEST_LOG").ok().filter(|p| !p.is_empty())?;
            match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
                Ok(file) => Some(RequestRecorder {
                    sink: Arc::new(Mutex::new(file)),
                    stream: Arc::new(Mutex::new("*".to_owned())),
                }),
                Err(error) => {
                    tracing::warn!(%error, path, "cannot open HOOKLANE_AWS_REQUEST_LOG; requests are not recorded");
                    None
                }
            }
        })
        .clone()
}

const REGION: &str = "${AWS::Region}";
const ACCOUNT: &str = "${AWS::AccountId}";

fn table(name: Option<&str>) -> String {
    format!(
        "arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{}",
        name.unwrap_or("*")
    )
}

fn index(name: Option<&str>, index: Option<&str>) -> String {
    match index {
        Some(index) => format!("{}/index/{index}", table(name)),
        None => table(name),
    }
}

/// `https://sqs.{region}.amazonaws.com/{account}/{name}` (or an emulator's
/// `http://host:port/{account}/{name}`) as an ARN.
fn queue(url: Option<&str>) -> String {
    let mut parts = url.unwrap_or_default().trim_end_matches('/').rsplit('/');
    let name = parts.next().filter(|n| !n.is_empty()).unwrap_or("*");
    let account = parts.next().filter(|a| !a.is_empty()).unwrap_or(ACCOUNT);
    format!("arn:aws:sqs:{REGION}:{account}:{name}")
}

fn queue_named(name: Option<&str>) -> String {
    format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{}", name.unwrap_or("*"))
}

fn schedule(group: Option<&str>, name: Option<&str>) -> String {
    format!(
        "arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/{}/{}",
        group.unwrap_or("default"),
        name.unwrap_or("*")
    )
}

fn parameter(name: Option<&str>) -> String {
    let name = name.unwrap_or("*");
    let separator = if name.starts_with('/') { "" } else { "/" };
    format!("arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{separator}{name}")
}

/// One IAM action a request needs: (action, resource, condition keys).
type Need = (String, String, Value);

fn need(action: &str, resource: String) -> Need {
    (action.to_owned(), resource, json!({}))
}

impl RequestRecorder {
    /// What the request needs, from its typed input.
    fn needs(
        &self,
        service: &str,
        operation: &str,
        input: &aws_smithy_runtime_api::client::interceptors::context::Input,
    ) -> Vec<Need> {
        use aws_sdk_dynamodb::operation as ddb;
        use aws_sdk_dynamodbstreams::operation as streams;
        use aws_sdk_scheduler::operation as sch;
        use aws_sdk_sqs::operation as sqs;
        let dynamodb = |op: &str| format!("dynamodb:{op}");
        // DynamoDB: one table (or index) each, but for the multi-item calls.
        if let Some(i) = input.downcast_ref::<ddb::get_item::GetItemInput>() {
            return vec![need("dynamodb:GetItem", table(i.table_name()))];
        }
        if let Some(i) = input.downcast_ref::<ddb::put_item::PutItemInput>() {
            return vec![need("dynamodb:PutItem", table(i.table_name()))];
        }
        if let Some(i) = input.downcast_ref::<ddb::update_item::UpdateItemInput>() {
            return vec![need("dynamodb:UpdateItem", table(i.table_name()))];
        }
        if let Some(i) = input.downcast_ref::<ddb::delete_item::DeleteItemInput>() {
            return vec![need("dynamodb:DeleteItem", table(i.table_name()))];
        }
        if let Some(i) = input.downcast_ref::<ddb::query::QueryInput>() {
            return vec![need(
                "dynamodb:Query",
                index(i.table_name(), i.index_name()),
            )];
        }
        if let Some(i) = input.downcast_ref::<ddb::scan::ScanInput>() {
            return vec![need("dynamodb:Scan", index(i.table_name(), i.index_name()))];
        }
        if let Some(i) = input.downcast_ref::<ddb::batch_write_item::BatchWriteItemInput>() {
            return i
                .request_items()
                .into_iter()
                .flatten()
                .map(|(t, _)| need("dynamodb:BatchWriteItem", table(Some(t))))
                .collect();
        }
        if let Some(i) = input.downcast_ref::<ddb::batch_get_item::BatchGetItemInput>() {
            return i
                .request_items()
                .into_iter()
                .flatten()
                .map(|(t, _)| need("dynamodb:BatchGetItem", table(Some(t))))
                .collect();
        }
        if let Some(i) = input.downcast_ref::<ddb::transact_write_items::TransactWriteItemsInput>()
        {
            // Authorised item by item, as the item's own action.
            return i
                .transact_items()
                .iter()
                .filter_map(|item| {
                    if let Some(p) = item.put() {
                        Some(need("dynamodb:PutItem", table(Some(p.table_name()))))
                    } else if let Some(u) = item.update() {
                        Some(need("dynamodb:UpdateItem", table(Some(u.table_name()))))
                    } else if let Some(d) = item.delete() {
                        Some(need("dynamodb:DeleteItem", table(Some(d.table_name()))))
                    } else {
                        item.condition_check().map(|c| {
                            need("dynamodb:ConditionCheckItem", table(Some(c.table_name())))
                        })
                    }
                })
                .collect();
        }
        if let Some(i) = input.downcast_ref::<ddb::transact_get_items::TransactGetItemsInput>() {
            return i
                .transact_items()
                .iter()
                .filter_map(|item| item.get())
                .map(|g| need("dynamodb:GetItem", table(Some(g.table_name()))))
                .collect();
        }
        if service.eq_ignore_ascii_case("dynamodb") {
            // Table-level calls (DescribeTable, CreateTable, UpdateTimeToLive, ...).
            let name = input
                .downcast_ref::<ddb::describe_table::DescribeTableInput>()
                .and_then(|i| i.table_name());
            return vec![need(&dynamodb(operation), table(name))];
        }
        // DynamoDB Streams: actions of the `dynamodb` namespace on the stream's ARN.
        if let Some(i) = input.downcast_ref::<streams::describe_stream::DescribeStreamInput>() {
            let arn = i.stream_arn().unwrap_or("*").to_owned();
            if let Ok(mut last) = self.stream.lock() {
                last.clone_from(&arn);
            }
            return vec![need("dynamodb:DescribeStream", arn)];
        }
        if let Some(i) = input.downcast_ref::<streams::get_shard_iterator::GetShardIteratorInput>()
        {
            let arn = i.stream_arn().unwrap_or("*").to_owned();
            if let Ok(mut last) = self.stream.lock() {
                last.clone_from(&arn);
            }
            return vec![need("dynamodb:GetShardIterator", arn)];
        }
        if input
            .downcast_ref::<streams::get_records::GetRecordsInput>()
            .is_some()
        {
            let arn = self
                .stream
                .lock()
                .map(|s| s.clone())
                .unwrap_or_else(|_| "*".to_owned());
            return vec![need("dynamodb:GetRecords", arn)];
        }
        if input
            .downcast_ref::<streams::list_streams::ListStreamsInput>()
            .is_some()
        {
            return vec![need("dynamodb:ListStreams", "*".to_owned())];
        }
        // SQS: the batch calls are authorised as their single forms.
        let on_queue = |action: &str, url: Option<&str>| vec![need(action, queue(url))];
        if let Some(i) = input.downcast_ref::<sqs::send_message::SendMessageInput>() {
            return on_queue("sqs:SendMessage", i.queue_url());
        }
        if let Some(i) = input.downcast_ref::<sqs::send_message_batch::SendMessageBatchInput>() {
            return on_queue("sqs:SendMessage", i.queue_url());
        }
        if let Some(i) = input.downcast_ref::<sqs::receive_message::ReceiveMessageInput>() {
            return on_queue("sqs:ReceiveMessage", i.queue_url());
        }
        if let Some(i) = input.downcast_ref::<sqs::delete_message::DeleteMessageInput>() {
            return on_queue("sqs:DeleteMessage", i.queue_url());
        }
        if let Some(i) = input.downcast_ref::<sqs::delete_message_batch::DeleteMessageBatchInput>()
        {
            return on_queue("sqs:DeleteMessage", i.queue_url());
        }
        if let Some(i) =
            input.downcast_ref::<sqs::change_message_visibility::ChangeMessageVisibilityInput>()
        {
            return on_queue("sqs:ChangeMessageVisibility", i.queue_url());
        }
        if let Some(i) = input.downcast_ref::<sqs::change_message_visibility_batch::ChangeMessageVisibilityBatchInput>() {
            return on_queue("sqs:ChangeMessageVisibility", i.queue_url());
        }
        if let Some(i) = input.downcast_ref::<sqs::get_queue_attributes::GetQueueAttributesInput>()
        {
            return on_queue("sqs:GetQueueAttributes", i.queue_url());
        }
        if let Some(i) = input.downcast_ref::<sqs::set_queue_attributes::SetQueueAttributesInput>()
        {
            return on_queue("sqs:SetQueueAttributes", i.queue_url());
        }
        if let Some(i) = input.downcast_ref::<sqs::get_queue_url::GetQueueUrlInput>() {
            return vec![need("sqs:GetQueueUrl", queue_named(i.queue_name()))];
        }
        if let Some(i) = input.downcast_ref::<sqs::create_queue::CreateQueueInput>() {
            return vec![need("sqs:CreateQueue", queue_named(i.queue_name()))];
        }
        // Scheduler: a schedule's ARN is its group and name; creating one passes its role.
        if let Some(i) = input.downcast_ref::<sch::create_schedule::CreateScheduleInput>() {
            let mut needs = vec![need(
                "scheduler:CreateSchedule",
                schedule(i.group_name(), i.name()),
            )];
            if let Some(role) = i.target().map(|t| t.role_arn()) {
                needs.push((
                    "iam:PassRole".to_owned(),
                    role.to_owned(),
                    json!({"iam:PassedToService": "scheduler.amazonaws.com"}),
                ));
            }
            return needs;
        }
        if let Some(i) = input.downcast_ref::<sch::get_schedule::GetScheduleInput>() {
            return vec![need(
                "scheduler:GetSchedule",
                schedule(i.group_name(), i.name()),
            )];
        }
        if let Some(i) = input.downcast_ref::<sch::delete_schedule::DeleteScheduleInput>() {
            return vec![need(
                "scheduler:DeleteSchedule",
                schedule(i.group_name(), i.name()),
            )];
        }
        if let Some(i) =
            input.downcast_ref::<sch::create_schedule_group::CreateScheduleGroupInput>()
        {
            let group = format!(
                "arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule-group/{}",
                i.name().unwrap_or("*")
            );
            return vec![need("scheduler:CreateScheduleGroup", group)];
        }
        // SES: authorised against the identity it sends from, with the From address as a key.
        if let Some(i) =
            input.downcast_ref::<aws_sdk_sesv2::operation::send_email::SendEmailInput>()
        {
            let from = i.from_email_address().unwrap_or("*");
            let address = from
                .rsplit_once('<')
                .map_or(from, |(_, a)| a.trim_end_matches('>'));
            return vec![(
                "ses:SendEmail".to_owned(),
                format!("arn:aws:ses:{REGION}:{ACCOUNT}:identity/{address}"),
                json!({"ses:FromAddress": address}),
            )];
        }
        if let Some(i) =
            input.downcast_ref::<aws_sdk_ssm::operation::get_parameter::GetParameterInput>()
        {
            return vec![need("ssm:GetParameter", parameter(i.name()))];
        }
        if let Some(i) =
            input.downcast_ref::<aws_sdk_ssm::operation::put_parameter::PutParameterInput>()
        {
            return vec![need("ssm:PutParameter", parameter(i.name()))];
        }
        // Anything else is recorded on every resource, so that a check against a role
        // names it rather than passing it by.
        let namespace = match service.to_ascii_lowercase().as_str() {
            "sesv2" | "ses" => "ses".to_owned(),
            "dynamodb streams" | "dynamodbstreams" => "dynamodb".to_owned(),
            other => other.to_owned(),
        };
        vec![need(&format!("{namespace}:{operation}"), "*".to_owned())]
    }
}

impl Intercept for RequestRecorder {
    fn name(&self) -> &'static str {
        "HooklaneRequestRecorder"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (service, operation) = cfg
            .load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
            .map(|m| (m.service().to_owned(), m.name().to_owned()))
            .unwrap_or_default();
        let function = current_function();
        let mut lines = String::new();
        for (action, resource, condition) in self.needs(&service, &operation, context.input()) {
            let line = json!({"function": function, "operation": format!("{service}.{operation}"), "action": action, "resource": resource, "context": condition});
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
        // One write per request, so that concurrent requests' lines never interleave.
        if let Ok(mut file) = self.sink.lock() {
            if let Err(error) = file.write_all(lines.as_bytes()) {
                tracing::warn!(%error, "cannot append to HOOKLANE_AWS_REQUEST_LOG");
            }
        }
        Ok(())
    }
}

/// Records a request that AWS makes on the stack's behalf and the local runner stands in
/// for without an SDK call: `who` (a role's user, such as `schedule:SweeperFunction` for
/// the schedule that invokes the sweeper), the action, and the resource (`${Logical.Arn}`
/// names a resource of the template).
pub fn note(who: &str, action: &str, resource: &str) {
    let Some(recorder) = recorder() else {
        return;
    };
    let line = json!({"function": who, "operation": "local", "action": action, "resource": resource, "context": {}});
    let written = match recorder.sink.lock() {
        Ok(mut file) => writeln!(file, "{line}"),
        Err(_) => return,
    };
    if let Err(error) = written {
        tracing::warn!(%error, "cannot append to HOOKLANE_AWS_REQUEST_LOG");
    }
}
