//! The local runner's parts that need no emulator: options, images, `at(...)` expressions.

use super::schedule_firer::*;
use super::stream_poller::*;
use super::*;
use crate::clock::from_millis;

#[test]
fn options_from_variables() {
    let vars: HashMap<String, String> = [
        ("HOOKLANE_LISTEN", "127.0.0.1:0"),
        ("HOOKLANE_SWEEP_INTERVAL", "500ms"),
        ("HOOKLANE_LOCAL_TIME_SCALE", "600"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let options = LocalOptions::from_vars(&vars).unwrap();
    assert_eq!(options.listen.port(), 0);
    assert_eq!(options.sweep_interval, Duration::from_millis(500));
    assert_eq!(options.health_interval, Duration::from_secs(60));
    assert_eq!(options.time_scale, 600.0);
    for (name, bad) in [
        ("HOOKLANE_LOCAL_TIME_SCALE", "0.5"),
        ("HOOKLANE_LOCAL_TIME_SCALE", "fast"),
        ("HOOKLANE_HEALTH_INTERVAL", "0s"),
        ("HOOKLANE_WORKERS", "0"),
    ] {
        let mut broken = vars.clone();
        broken.insert(name.to_owned(), bad.to_owned());
        let err = LocalOptions::from_vars(&broken).unwrap_err();
        assert_eq!(err.variable, name, "{bad}");
    }
}

#[test]
fn a_scaled_schedule_keeps_its_shape() {
    let schedule = RetrySchedule::parse("30,1800").unwrap();
    assert_eq!(
        scaled_schedule(&schedule, 600.0).delays(),
        &[Duration::from_millis(50), Duration::from_secs(3)]
    );
}

#[test]
fn at_expressions_are_read_back() {
    let due = from_millis(1_700_000_000_001);
    let expression = crate::queue::sqs::at_expression(due);
    assert_eq!(
        parse_at_expression(&expression),
        Some(from_millis(1_700_000_001_000))
    );
    assert_eq!(parse_at_expression("rate(5 minutes)"), None);
    assert_eq!(parse_at_expression("at(yesterday)"), None);
}

#[test]
fn stream_images_become_dynamodb_json() {
    let image: HashMap<String, AttributeValue> = [
        ("id".to_owned(), AttributeValue::S("evt_1".into())),
        ("created_at".to_owned(), AttributeValue::N("17".into())),
        ("fanned_out".to_owned(), AttributeValue::Bool(false)),
        (
            "tags".to_owned(),
            AttributeValue::L(vec![AttributeValue::M(
                [("k".to_owned(), AttributeValue::Null(true))].into(),
            )]),
        ),
    ]
    .into();
    assert_eq!(
        image_json(&image),
        serde_json::json!({
            "id": {"S": "evt_1"},
            "created_at": {"N": "17"},
            "fanned_out": {"BOOL": false},
            "tags": {"L": [{"M": {"k": {"NULL": true}}}]}
        })
    );
}

/// As Lambda with the template's `MaximumRetryAttempts`: a record is tried once and retried
/// 10 times, and given up when the last retry fails; another record's failure counts from
/// one.
#[test]
fn a_failing_stream_record_is_given_up_after_its_retries() {
    use super::stream_poller::Retries;
    let mut retries = Retries::default();
    let tries: Vec<bool> = (0..10).map(|_| retries.give_up("0001")).collect();
    assert!(tries.iter().all(|given_up| !given_up), "{tries:?}");
    assert!(
        retries.give_up("0001"),
        "the 10th retry's failure gives it up"
    );
    assert!(!retries.give_up("0001"), "counted again from one");
    assert!(!retries.give_up("0002"));
    assert!(
        !retries.give_up("0001"),
        "another record's failure in between"
    );
}
