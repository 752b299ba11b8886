//! The AWS stack as `infra/template.yaml` defines it, read from the template itself: the
//! tables, queues and schedule group that `serve --backend aws --provision` and the tests
//! create on an emulator, and each function's environment, so that no table, index or queue
//! is described a second time in code.
//!
//! The template is read in CloudFormation's JSON form (`!Sub x` becomes `{"Fn::Sub": x}`), and
//! its intrinsic functions are resolved for one stack: a name, a region, an account, the
//! parameters' defaults, and the physical names of what was created.

use std::{collections::BTreeMap, sync::OnceLock};

use serde_json::{Map, Value};

/// The deployment template, as the SAM CLI deploys it.
pub const TEMPLATE: &str = include_str!("../../../../infra/template.yaml");

#[derive(Debug, Clone, thiserror::Error)]
pub enum StackError {
    #[error("infra/template.yaml: {0}")]
    Template(String),
    #[error("cannot create {resource}: {message}")]
    Create { resource: String, message: String },
}

fn template_error(message: impl Into<String>) -> StackError {
    StackError::Template(message.into())
}

/// The template in CloudFormation's JSON form, parsed once.
pub fn template() -> Result<&'static Value, StackError> {
    static PARSED: OnceLock<Result<Value, StackError>> = OnceLock::new();
    PARSED
        .get_or_init(|| {
            let yaml: serde_yaml::Value =
                serde_yaml::from_str(TEMPLATE).map_err(|e| template_error(e.to_string()))?;
            to_json(yaml)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// YAML to JSON, CloudFormation's short-form tags to their long form.
fn to_json(yaml: serde_yaml::Value) -> Result<Value, StackError> {
    use serde_yaml::Value as Y;
    Ok(match yaml {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => serde_json::to_value(&n).map_err(|e| template_error(e.to_string()))?,
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => {
            Value::Array(items.into_iter().map(to_json).collect::<Result<_, _>>()?)
        }
        Y::Mapping(entries) => {
            let mut out = Map::new();
            for (key, value) in entries {
                let Y::String(key) = key else {
                    return Err(template_error(format!(
                        "a key that is not a string: {key:?}"
                    )));
                };
                out.insert(key, to_json(value)?);
            }
            Value::Object(out)
        }
        Y::Tagged(tagged) => {
            let tag = tagged.tag.to_string();
            let tag = tag.trim_start_matches('!');
            let value = to_json(tagged.value)?;
            let (key, value) = match (tag, value) {
                ("Ref" | "Condition", v) => (tag.to_owned(), v),
                ("GetAtt", Value::String(path)) => {
                    let (resource, attribute) = path
                        .split_once('.')
                        .ok_or_else(|| template_error(format!("!GetAtt {path}: no attribute")))?;
                    (
                        "Fn::GetAtt".to_owned(),
                        serde_json::json!([resource, attribute]),
                    )
                }
                (name, v) => (format!("Fn::{name}"), v),
            };
            Value::Object(Map::from_iter([(key, value)]))
        }
    })
}

/// What one created (or named) resource answers to `Ref` and `Fn::GetAtt`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Physical {
    pub reference: String,
    pub attributes: BTreeMap<String, String>,
}

/// One stack of the template: where it is, its parameters and its resources' physical names.
#[derive(Debug, Clone)]
pub struct Stack {
    pub name: String,
    pub region: String,
    pub account: String,
    pub parameters: BTreeMap<String, String>,
    pub resources: BTreeMap<String, Physical>,
}

/// Resource types the provisioner leaves out, each for a reason: the emulator has no IAM
/// to enforce (the roles are checked against the recorded requests instead), the local
/// runner is the functions and their triggers, and the rest is operations (logs, alarms).
const NOT_PROVISIONED: [&str; 7] = [
    "AWS::IAM::Role",
    "AWS::Serverless::Function",
    "AWS::Logs::LogGroup",
    "AWS::SNS::Topic",
    "AWS::CloudWatch::Alarm",
    "AWS::CloudWatch::Dashboard",
    "AWS::Lambda::Function",
];

fn resources_of(kind: &str) -> Result<Vec<(&'static String, &'static Value)>, StackError> {
    let all = template()?["Resources"]
        .as_object()
        .ok_or_else(|| template_error("no Resources"))?;
    Ok(all
        .iter()
        .filter(|(_, r)| r["Type"] == kind)
        .map(|(n, r)| (n, &r["Properties"]))
        .collect())
}

impl Stack {
    /// The stack `name` in `region` of `account`, with the template's parameter defaults
    /// (then `parameters`) and the physical names CloudFormation would give what the
    /// provisioner does not create. Queues and tables are added as they are created.
    pub fn new(
        name: &str,
        region: &str,
        account: &str,
        parameters: &[(&str, &str)],
    ) -> Result<Self, StackError> {
        let mut stack = Self {
            name: name.to_owned(),
            region: region.to_owned(),
            account: account.to_owned(),
            parameters: BTreeMap::new(),
            resources: BTreeMap::new(),
        };
        let declared = template()?["Parameters"]
            .as_object()
            .ok_or_else(|| template_error("no Parameters"))?;
        for (parameter, declaration) in declared {
            let value = match &declaration["Default"] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            stack.parameters.insert(parameter.clone(), value);
        }
        for (parameter, value) in parameters {
            if !declared.contains_key(*parameter) {
                return Err(template_error(format!("no parameter {parameter}")));
            }
            stack
                .parameters
                .insert((*parameter).to_owned(), (*value).to_owned());
        }
        let all = template()?["Resources"]
            .as_object()
            .ok_or_else(|| template_error("no Resources"))?;
        for (logical, resource) in all {
            let kind = resource["Type"].as_str().unwrap_or_default();
            let generated = generated_name(name, logical);
            let physical = match kind {
                "AWS::IAM::Role" => {
                    stack.named(&generated, format!("iam::{account}:role/{generated}"))
                }
                "AWS::Serverless::Function" | "AWS::Lambda::Function" => stack.named(
                    &generated,
                    format!("lambda:{region}:{account}:function:{generated}"),
                ),
                "AWS::SNS::Topic" => {
                    let arn = format!("arn:aws:sns:{region}:{account}:{generated}");
                    Physical {
                        reference: arn.clone(),
                        attributes: BTreeMap::from([("TopicArn".to_owned(), arn)]),
                    }
                }
                _ => continue,
            };
            stack.resources.insert(logical.clone(), physical);
        }
        // Named by the template (a schedule group as CloudFormation would, as it is left
        // unnamed); they reference nothing but parameters.
        for (logical, properties) in resources_of("AWS::Logs::LogGroup")? {
            let group = stack.string(&properties["LogGroupName"])?;
            let arn = format!("logs:{region}:{account}:log-group:{group}");
            let physical = stack.named(&group, arn);
            stack.resources.insert(logical.clone(), physical);
        }
        for (logical, properties) in resources_of("AWS::Scheduler::ScheduleGroup")? {
            let group = match &properties["Name"] {
                Value::Null => generated_name(name, logical),
                named => stack.string(named)?,
            };
            let physical = stack.named(
                &group,
                format!("scheduler:{region}:{account}:schedule-group/{group}"),
            );
            stack.resources.insert(logical.clone(), physical);
        }
        // Queues as the provisioner names them (CloudFormation adds a random suffix).
        for (logical, properties) in resources_of("AWS::SQS::Queue")? {
            let queue = match &properties["QueueName"] {
                Value::Null => generated_name(name, logical),
                named => stack.string(named)?,
            };
            let mut physical = stack.named(&queue, format!("sqs:{region}:{account}:{queue}"));
            // The URL as SQS gives it on AWS; an emulator's differs, and creating the queue
            // puts the real one here.
            physical.reference = format!("https://sqs.{region}.amazonaws.com/{account}/{queue}");
            physical.attributes.insert("QueueName".to_owned(), queue);
            stack.resources.insert(logical.clone(), physical);
        }
        for (logical, properties) in resources_of("AWS::DynamoDB::Table")? {
            let table = stack.string(&properties["TableName"])?;
            let physical =
                stack.named(&table, format!("dynamodb:{region}:{account}:table/{table}"));
            stack.resources.insert(logical.clone(), physical);
        }
        Ok(stack)
    }

    fn named(&self, name: &str, arn_tail: String) -> Physical {
        Physical {
            reference: name.to_owned(),
            attributes: BTreeMap::from([("Arn".to_owned(), format!("arn:aws:{arn_tail}"))]),
        }
    }

    fn condition(&self, name: &str) -> Result<bool, StackError> {
        let declared = &template()?["Conditions"][name];
        if declared.is_null() {
            return Err(template_error(format!("no condition {name}")));
        }
        self.truth(declared)
    }

    fn truth(&self, value: &Value) -> Result<bool, StackError> {
        let Value::Object(o) = value else {
            return value
                .as_bool()
                .ok_or_else(|| template_error(format!("not a condition: {value}")));
        };
        let operands = |key: &str| o[key].as_array().cloned().unwrap_or_default();
        if let Some(name) = o.get("Condition").and_then(Value::as_str) {
            self.condition(name)
        } else if o.contains_key("Fn::Not") {
            Ok(!self.truth(&operands("Fn::Not").first().cloned().unwrap_or_default())?)
        } else if o.contains_key("Fn::Equals") {
            let pair = operands("Fn::Equals");
            let [a, b] = pair.as_slice() else {
                return Err(template_error("Fn::Equals takes two values"));
            };
            Ok(self.resolve(a)? == self.resolve(b)?)
        } else if o.contains_key("Fn::And") {
            operands("Fn::And")
                .iter()
                .try_fold(true, |all, c| Ok(all && self.truth(c)?))
        } else if o.contains_key("Fn::Or") {
            operands("Fn::Or")
                .iter()
                .try_fold(false, |any, c| Ok(any || self.truth(c)?))
        } else {
            Err(template_error(format!("not a condition: {value}")))
        }
    }

    fn reference(&self, name: &str) -> Result<Option<String>, StackError> {
        Ok(Some(match name {
            "AWS::NoValue" => return Ok(None),
            "AWS::StackName" => self.name.clone(),
            "AWS::Region" => self.region.clone(),
            "AWS::AccountId" => self.account.clone(),
            "AWS::Partition" => "aws".to_owned(),
            "AWS::URLSuffix" => "amazonaws.com".to_owned(),
            _ => match (self.parameters.get(name), self.resources.get(name)) {
                (Some(value), _) => value.clone(),
                (None, Some(physical)) => physical.reference.clone(),
                (None, None) => {
                    return Err(template_error(format!(
                        "Ref {name}: not known in this stack"
                    )))
                }
            },
        }))
    }

    fn attribute(&self, resource: &str, attribute: &str) -> Result<String, StackError> {
        self.resources
            .get(resource)
            .and_then(|p| p.attributes.get(attribute))
            .cloned()
            .ok_or_else(|| {
                template_error(format!(
                    "GetAtt {resource}.{attribute}: not known in this stack"
                ))
            })
    }

    /// `value` with every intrinsic function resolved for this stack; `None` for
    /// `AWS::NoValue` (and a `Fn::If` that chose it), which drops the property.
    pub fn resolve(&self, value: &Value) -> Result<Option<Value>, StackError> {
        match value {
            Value::Array(items) => Ok(Some(Value::Array(
                items
                    .iter()
                    .map(|v| self.resolve(v))
                    .filter_map(Result::transpose)
                    .collect::<Result<_, _>>()?,
            ))),
            Value::Object(o) if o.len() == 1 => {
                let (key, argument) = o.iter().next().unwrap_or_else(|| unreachable!());
                match key.as_str() {
                    "Ref" => Ok(self
                        .reference(argument.as_str().unwrap_or_default())?
                        .map(Value::String)),
                    "Fn::GetAtt" => {
                        let (resource, attribute) = match argument {
                            Value::Array(parts) if parts.len() == 2 => (
                                parts[0].as_str().unwrap_or_default(),
                                parts[1].as_str().unwrap_or_default(),
                            ),
                            Value::String(path) => path.split_once('.').unwrap_or((path, "")),
                            _ => return Err(template_error(format!("GetAtt {argument}"))),
                        };
                        Ok(Some(Value::String(self.attribute(resource, attribute)?)))
                    }
                    "Fn::Sub" => Ok(Some(Value::String(self.substitute(argument)?))),
                    "Fn::If" => {
                        let arms = argument
                            .as_array()
                            .filter(|a| a.len() == 3)
                            .ok_or_else(|| template_error("Fn::If takes three values"))?;
                        let chosen = if self.condition(arms[0].as_str().unwrap_or_default())? {
                            &arms[1]
                        } else {
                            &arms[2]
                        };
                        self.resolve(chosen)
                    }
                    "Fn::Join" => {
                        let parts = argument
                            .as_array()
                            .filter(|a| a.len() == 2)
                            .ok_or_else(|| template_error("Fn::Join takes two values"))?;
                        let separator = parts[0].as_str().unwrap_or_default();
                        let items = self.resolve(&parts[1])?.unwrap_or_default();
                        let texts: Vec<String> =
                            items.as_array().into_iter().flatten().map(text).collect();
                        Ok(Some(Value::String(texts.join(separator))))
                    }
                    k if k.starts_with("Fn::") => Err(template_error(format!(
                        "{k} is not resolved by the provisioner"
                    ))),
                    _ => self.resolve_object(o),
                }
            }
            Value::Object(o) => self.resolve_object(o),
            other => Ok(Some(other.clone())),
        }
    }

    fn resolve_object(&self, o: &Map<String, Value>) -> Result<Option<Value>, StackError> {
        let mut out = Map::new();
        for (key, value) in o {
            if let Some(resolved) = self.resolve(value)? {
                out.insert(key.clone(), resolved);
            }
        }
        Ok(Some(Value::Object(out)))
    }

    fn substitute(&self, argument: &Value) -> Result<String, StackError> {
        let (pattern, variables) = match argument {
            Value::String(s) => (s.as_str(), Map::new()),
            Value::Array(parts) if parts.len() == 2 => (
                parts[0].as_str().unwrap_or_default(),
                parts[1].as_object().cloned().unwrap_or_default(),
            ),
            _ => return Err(template_error(format!("Fn::Sub {argument}"))),
        };
        let mut out = String::new();
        let mut rest = pattern;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after
                .find('}')
                .ok_or_else(|| template_error(format!("Fn::Sub {pattern}: unclosed")))?;
            let name = &after[..end];
            if let Some(literal) = name.strip_prefix('!') {
                out.push_str("${");
                out.push_str(literal);
                out.push('}');
            } else if let Some(variable) = variables.get(name) {
                out.push_str(
                    &self
                        .resolve(variable)?
                        .map(|v| text(&v))
                        .unwrap_or_default(),
                );
            } else if let Some((resource, attribute)) =
                name.split_once('.').filter(|_| !name.starts_with("AWS::"))
            {
                out.push_str(&self.attribute(resource, attribute)?);
            } else {
                out.push_str(&self.reference(name)?.unwrap_or_default());
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    fn string(&self, value: &Value) -> Result<String, StackError> {
        self.resolve(value)?
            .as_ref()
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| template_error(format!("not a string: {value}")))
    }

    /// The environment variables the template gives `function` (its `Globals` and its own),
    /// resolved for this stack.
    pub fn function_env(&self, function: &str) -> Result<BTreeMap<String, String>, StackError> {
        let resource = &template()?["Resources"][function];
        if resource["Type"] != "AWS::Serverless::Function" {
            return Err(template_error(format!("{function} is not a function")));
        }
        let mut env = BTreeMap::new();
        for variables in [
            &template()?["Globals"]["Function"]["Environment"]["Variables"],
            &resource["Properties"]["Environment"]["Variables"],
        ] {
            if let Some(Value::Object(resolved)) = self.resolve(variables)? {
                env.extend(resolved.iter().map(|(k, v)| (k.clone(), text(v))));
            }
        }
        Ok(env)
    }

    /// The functions of the template, by logical id.
    pub fn functions() -> Result<Vec<&'static str>, StackError> {
        Ok(resources_of("AWS::Serverless::Function")?
            .into_iter()
            .map(|(n, _)| n.as_str())
            .collect())
    }
}

/// The name of a resource the template leaves unnamed: `{stack}-{logical id}`.
fn generated_name(stack: &str, logical: &str) -> String {
    format!("{stack}-{logical}")
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

mod deploy;
#[cfg(test)]
mod tests;

pub use deploy::{create_tables, deploy, IndexDefinition, TableDefinition};
