//! The SAM template's alarms and dashboard read the metrics the Lambda functions emit: every
//! metric they name exists in `telemetry`, and with the very dimensions the EMF documents
//! carry (an alarm on a dimension set nobody emits never fires, and says nothing).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
    time::Duration,
};

use hooklane::{
    domain::{AccountId, AttemptOutcome, Decision, EndpointId},
    telemetry::{self, emf::EmfRecorder},
};
use serde_json::Value;

/// A metric as an alarm or a graph names it: dimension name → value.
#[derive(Debug)]
struct Reference {
    place: String,
    name: String,
    dimensions: BTreeMap<String, String>,
}

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The template as JSON, through cfn-lint's own decoder (it knows the `!Ref` tags).
fn template() -> Value {
    let python = std::env::var("HOOKLANE_TEST_PYTHON").expect(
        "HOOKLANE_TEST_PYTHON is not set: this test reads the template with cfn-lint's decoder \
         from the test environment (scripts/test-env prints its python)",
    );
    let output = Command::new(python)
        .current_dir(root())
        .args([
            "-c",
            "import json, sys\n\
             from cfnlint.decode import decode\n\
             template, errors = decode('infra/template.yaml')\n\
             assert not errors, errors\n\
             json.dump(template, sys.stdout)",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn stack_placeholder(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Object(o) if o.get("Ref") == Some(&Value::from("AWS::StackName")) => {
            "${AWS::StackName}".into()
        }
        other => panic!("unexpected dimension value {other}"),
    }
}

fn alarm_metric(place: &str, metric: &Value, out: &mut Vec<Reference>) {
    if metric["Namespace"] != telemetry::EMF_NAMESPACE {
        return;
    }
    let dimensions = metric["Dimensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["Name"].as_str().unwrap().to_owned(),
                stack_placeholder(&d["Value"]),
            )
        })
        .collect();
    out.push(Reference {
        place: place.to_owned(),
        name: metric["MetricName"].as_str().unwrap().to_owned(),
        dimensions,
    });
}

/// `SEARCH('{Hooklane,Stack,outcome,attempt} MetricName="…" Stack="…" outcome="…"', …)`
fn search_reference(place: &str, expression: &str) -> Option<Reference> {
    let schema_start = expression.find("SEARCH('{")? + "SEARCH('{".len();
    let schema_end = schema_start + expression[schema_start..].find('}')?;
    let mut schema = expression[schema_start..schema_end].split(',');
    assert_eq!(
        schema.next(),
        Some(telemetry::EMF_NAMESPACE),
        "{expression}"
    );
    let names: Vec<&str> = schema.collect();
    let mut values = BTreeMap::new();
    let mut rest = &expression[schema_end + 1..];
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].rsplit(' ').next().unwrap_or_default().to_owned();
        let value_end = rest[eq + 2..].find('"').unwrap() + eq + 2;
        values.insert(key, rest[eq + 2..value_end].to_owned());
        rest = &rest[value_end + 1..];
    }
    let name = values.remove("MetricName").expect(expression);
    let dimensions = names
        .iter()
        .map(|n| {
            // A dimension not fixed in the query matches every value: `*`.
            let value = values.remove(*n).unwrap_or_else(|| "*".into());
            ((*n).to_owned(), value)
        })
        .collect();
    assert!(values.is_empty(), "{expression} filters on {values:?}");
    Some(Reference {
        place: place.to_owned(),
        name,
        dimensions,
    })
}

fn dashboard_metrics(body: &str, out: &mut Vec<Reference>) {
    // The Fn::Sub placeholders (`${AWS::StackName}`) all sit inside JSON strings.
    let dashboard: Value = serde_json::from_str(body).unwrap();
    for widget in dashboard["widgets"].as_array().unwrap() {
        let title = widget["properties"]["title"].as_str().unwrap_or("text");
        let place = format!("dashboard widget `{title}`");
        for row in widget["properties"]["metrics"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let row = row.as_array().unwrap();
            if let Some(expression) = row[0].get("expression") {
                out.extend(search_reference(&place, expression.as_str().unwrap()));
                continue;
            }
            if row[0] != telemetry::EMF_NAMESPACE {
                continue;
            }
            let strings: Vec<&str> = row.iter().filter_map(Value::as_str).collect();
            let dimensions = strings[2..]
                .chunks(2)
                .map(|pair| (pair[0].to_owned(), pair[1].to_owned()))
                .collect();
            out.push(Reference {
                place: place.clone(),
                name: strings[1].to_owned(),
                dimensions,
            });
        }
    }
}

fn references(template: &Value) -> Vec<Reference> {
    let mut out = Vec::new();
    for (name, resource) in template["Resources"].as_object().unwrap() {
        let properties = &resource["Properties"];
        match resource["Type"].as_str().unwrap() {
            "AWS::CloudWatch::Alarm" => {
                alarm_metric(name, properties, &mut out);
                for metric in properties["Metrics"].as_array().into_iter().flatten() {
                    if let Some(stat) = metric.get("MetricStat") {
                        alarm_metric(name, &stat["Metric"], &mut out);
                    }
                }
            }
            "AWS::CloudWatch::Dashboard" => {
                let body = properties["DashboardBody"]["Fn::Sub"].as_str().unwrap();
                dashboard_metrics(body, &mut out);
            }
            _ => {}
        }
    }
    out
}

/// What the functions emit: every recording path of `telemetry` that runs in Lambda, through
/// the recorder the functions install. Name → the label sets seen (dimension name → value).
fn emitted() -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let recorder: EmfRecorder = telemetry::lambda_recorder("${AWS::StackName}");
    metrics::with_local_recorder(&recorder, || {
        telemetry::describe();
        let endpoint = EndpointId::from_trusted("ep_1".into());
        let account = AccountId::from_trusted("acme".into());
        telemetry::event_published();
        telemetry::deliveries_created(1);
        let outcomes = [
            AttemptOutcome::Success { status: 200 },
            AttemptOutcome::Rejected {
                status: 500,
                retry_after: None,
            },
            AttemptOutcome::Redirect {
                status: 301,
                location: None,
            },
            AttemptOutcome::TransportError {
                message: "refused".into(),
            },
        ];
        let decisions = [
            Decision::Delivered,
            Decision::RetryAt(chrono::Utc::now()),
            Decision::Failed {
                reason: "gone".into(),
            },
        ];
        for number in 1..=12 {
            for outcome in &outcomes {
                for decision in &decisions {
                    telemetry::attempt_recorded(
                        &endpoint,
                        &account,
                        number,
                        outcome,
                        decision,
                        Duration::from_millis(30),
                        Duration::from_secs(2),
                    );
                }
            }
        }
        telemetry::endpoint_disabled(&account, 3);
        telemetry::replayed(1);
        telemetry::due_backlog(4, Duration::from_secs(60));
        telemetry::batch_item_failures("fanout", 1);
        telemetry::batch_item_failures("sender", 1);
        telemetry::notification_failed();
        telemetry::event_rejected();
        telemetry::events_recovered(1);
        for cause in hooklane::http::LocalFault::ALL.map(hooklane::http::LocalFault::label) {
            telemetry::send_out_of_resources(cause, "put_back");
        }
        for part in ["detail", "failing_clock"] {
            telemetry::record_incomplete(part);
        }
    });
    let mut seen: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for document in recorder.flush(0) {
        let definition = &document["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(definition["Namespace"], telemetry::EMF_NAMESPACE);
        let dimensions: BTreeMap<String, String> = definition["Dimensions"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let d = d.as_str().unwrap();
                (d.to_owned(), document[d].as_str().unwrap().to_owned())
            })
            .collect();
        for metric in definition["Metrics"].as_array().unwrap() {
            seen.entry(metric["Name"].as_str().unwrap().to_owned())
                .or_default()
                .push(dimensions.clone());
        }
    }
    seen
}

#[test]
fn alarms_and_dashboard_read_metrics_the_functions_emit() {
    let template = template();
    let references = references(&template);
    let emitted = emitted();
    assert!(
        references.len() >= 20,
        "only {} metric references found: {references:?}",
        references.len()
    );
    for reference in &references {
        assert!(
            telemetry::ALL.contains(&reference.name.as_str()),
            "{}: `{}` is not a metric of shared/src/telemetry.rs",
            reference.place,
            reference.name
        );
        let label_sets = emitted.get(&reference.name).unwrap_or_else(|| {
            panic!(
                "{}: `{}` is never emitted by the Lambda functions",
                reference.place, reference.name
            )
        });
        let matches = label_sets.iter().any(|labels| {
            labels.len() == reference.dimensions.len()
                && reference
                    .dimensions
                    .iter()
                    .all(|(k, v)| labels.get(k).is_some_and(|seen| v == "*" || seen == v))
        });
        assert!(
            matches,
            "{}: `{}` with dimensions {:?} is not emitted; the functions emit it with {:?}",
            reference.place, reference.name, reference.dimensions, label_sets
        );
    }
    // Every alarm and graph of the kinds the operators' guide describes is there.
    let named: BTreeSet<&str> = references.iter().map(|r| r.name.as_str()).collect();
    for required in [
        telemetry::OLDEST_DUE_AGE,
        telemetry::ATTEMPTS,
        telemetry::DELIVERIES_COMPLETED,
        telemetry::DELIVERY_LATENCY,
        telemetry::ENDPOINTS_DISABLED,
    ] {
        assert!(
            named.contains(required),
            "{required} is in no alarm or graph"
        );
    }
}

/// Any `hooklane_…` word in a file.
fn metric_words(text: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("hooklane_") {
        let word: String = rest[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[start + word.len()..];
        words.insert(word);
    }
    words
}

#[test]
fn the_template_and_the_operators_guide_name_only_real_metrics() {
    for file in ["infra/template.yaml", "docs/OPERATIONS.md"] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let words = metric_words(&text);
        assert!(!words.is_empty(), "{file} names no metric");
        for word in words {
            assert!(
                telemetry::ALL.contains(&word.as_str()),
                "{file} names `{word}`, which shared/src/telemetry.rs does not define"
            );
        }
    }
}
