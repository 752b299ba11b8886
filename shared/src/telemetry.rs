//! Metric names and the few places that record them. One set of names for every exporter:
//! Prometheus text in the embedded shape, CloudWatch EMF in Lambda logs.

pub mod emf;

use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

use crate::domain::{AccountId, AttemptOutcome, Decision, EndpointId};

pub const EVENTS_PUBLISHED: &str = "hooklane_events_published_total";
pub const DELIVERIES_CREATED: &str = "hooklane_deliveries_created_total";
pub const ATTEMPTS: &str = "hooklane_attempts_total";
pub const ATTEMPT_DURATION: &str = "hooklane_attempt_duration_seconds";
pub const DELIVERY_LATENCY: &str = "hooklane_delivery_latency_seconds";
pub const DELIVERIES_COMPLETED: &str = "hooklane_deliveries_completed_total";
pub const RETRIES_SCHEDULED: &str = "hooklane_retries_scheduled_total";
pub const ENDPOINTS_DISABLED: &str = "hooklane_endpoints_disabled_total";
pub const REPLAYS: &str = "hooklane_replays_total";
pub const ENDPOINT_ATTEMPTS: &str = "hooklane_endpoint_attempts_total";
pub const ENDPOINT_IN_FLIGHT: &str = "hooklane_endpoint_in_flight";
pub const ACCOUNT_DELIVERIES: &str = "hooklane_account_deliveries_total";
pub const PENDING_DELIVERIES: &str = "hooklane_pending_deliveries";
pub const OLDEST_PENDING_AGE: &str = "hooklane_oldest_pending_age_seconds";
pub const DUE_BACKLOG: &str = "hooklane_due_backlog";
pub const IN_FLIGHT: &str = "hooklane_in_flight";
pub const OLDEST_DUE_AGE: &str = "hooklane_oldest_due_age_seconds";
pub const BATCH_ITEM_FAILURES: &str = "hooklane_batch_item_failures_total";
pub const NOTIFICATIONS_FAILED: &str = "hooklane_notifications_failed_total";
pub const EVENTS_REJECTED: &str = "hooklane_events_rejected_total";
pub const EVENTS_RECOVERED: &str = "hooklane_events_recovered_total";
pub const PUBLISHES_THROTTLED: &str = "hooklane_publishes_throttled_total";
pub const STORE_WRITE_ERRORS: &str = "hooklane_store_write_errors_total";
pub const SENDS_OUT_OF_RESOURCES: &str = "hooklane_sends_out_of_resources_total";
pub const RECORDS_INCOMPLETE: &str = "hooklane_records_incomplete_total";

/// Every metric name, for checks that dashboards and alarms name only real metrics.
pub const ALL: &[&str] = &[
    EVENTS_PUBLISHED,
    DELIVERIES_CREATED,
    ATTEMPTS,
    ATTEMPT_DURATION,
    DELIVERY_LATENCY,
    DELIVERIES_COMPLETED,
    RETRIES_SCHEDULED,
    ENDPOINTS_DISABLED,
    REPLAYS,
    ENDPOINT_ATTEMPTS,
    ENDPOINT_IN_FLIGHT,
    ACCOUNT_DELIVERIES,
    PENDING_DELIVERIES,
    OLDEST_PENDING_AGE,
    DUE_BACKLOG,
    IN_FLIGHT,
    OLDEST_DUE_AGE,
    BATCH_ITEM_FAILURES,
    NOTIFICATIONS_FAILED,
    EVENTS_REJECTED,
    EVENTS_RECOVERED,
    PUBLISHES_THROTTLED,
    STORE_WRITE_ERRORS,
    SENDS_OUT_OF_RESOURCES,
    RECORDS_INCOMPLETE,
];

/// The CloudWatch namespace of the Lambda functions' metrics.
pub const EMF_NAMESPACE: &str = "Hooklane";
/// The dimension every Lambda metric carries: the stack (= table prefix) it comes from.
pub const EMF_STACK_DIMENSION: &str = "Stack";
/// Labels with one value per customer or endpoint: log fields in EMF, not dimensions.
pub const UNBOUNDED_LABELS: &[&str] = &["endpoint", "account"];

/// The recorder the Lambda functions install: the names above, under `EMF_NAMESPACE`.
pub fn lambda_recorder(stack: &str) -> emf::EmfRecorder {
    emf::EmfRecorder::new(
        EMF_NAMESPACE,
        vec![(EMF_STACK_DIMENSION.to_owned(), stack.to_owned())],
    )
    .with_property_labels(UNBOUNDED_LABELS)
}

/// HELP texts, for exporters that show them.
pub fn describe() {
    describe_counter!(
        EVENTS_PUBLISHED,
        "Events accepted by publish (repeats of an id not counted)"
    );
    describe_counter!(DELIVERIES_CREATED, "Deliveries written by the store");
    describe_counter!(ATTEMPTS, "HTTP attempts by outcome (success, http_error, redirect, transport_error) and attempt number");
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "Duration of one HTTP attempt"
    );
    describe_histogram!(
        DELIVERY_LATENCY,
        Unit::Seconds,
        "From event creation to successful delivery"
    );
    describe_counter!(
        DELIVERIES_COMPLETED,
        "Deliveries that reached a final status (delivered, failed, abandoned)"
    );
    describe_counter!(
        RETRIES_SCHEDULED,
        "Failed attempts followed by a scheduled retry"
    );
    describe_counter!(
        ENDPOINTS_DISABLED,
        "Endpoints disabled after failing too long"
    );
    describe_counter!(REPLAYS, "Replays requested");
    describe_counter!(ENDPOINT_ATTEMPTS, "HTTP attempts per endpoint");
    describe_gauge!(ENDPOINT_IN_FLIGHT, "Requests in flight per endpoint");
    describe_counter!(
        ACCOUNT_DELIVERIES,
        "Final deliveries per account and status (per-customer throughput)"
    );
    describe_gauge!(PENDING_DELIVERIES, "Deliveries still pending");
    describe_gauge!(
        OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest pending delivery"
    );
    describe_gauge!(
        DUE_BACKLOG,
        "Deliveries due now and waiting for a worker or an endpoint slot"
    );
    describe_gauge!(IN_FLIGHT, "Requests in flight across all endpoints");
    describe_gauge!(
        OLDEST_DUE_AGE,
        Unit::Seconds,
        "How long the most overdue pending delivery has been past its due time"
    );
    describe_counter!(
        BATCH_ITEM_FAILURES,
        "Items of a queue or stream batch a function reported failed (by function): a \
         partial-batch response counts as a successful invocation, so Lambda's Errors never sees them"
    );
    describe_counter!(
        NOTIFICATIONS_FAILED,
        "Owner mails the notifier could not send, at each try (tried again later, or given up)"
    );
    describe_counter!(
        PUBLISHES_THROTTLED,
        "Events refused with 429 by an account's publish rate limit, per account"
    );
    describe_counter!(
        EVENTS_REJECTED,
        "Event items fan-out could not read (malformed outbox writes)"
    );
    describe_counter!(
        EVENTS_RECOVERED,
        "Events the sweeper fanned out because their stream record never completed fan-out"
    );
    describe_counter!(
        STORE_WRITE_ERRORS,
        "Writes of an attempt's record (or of a delivery ended unsent) the store refused, \
         each try counted (a record written again after a failure counts again)"
    );
    describe_counter!(
        RECORDS_INCOMPLETE,
        "Attempts recorded on their delivery whose detail (part detail: missing from the \
         delivery's attempt list) or endpoint failing clock (part failing_clock: moved at the \
         next attempt) the store could not write"
    );
    describe_counter!(
        SENDS_OUT_OF_RESOURCES,
        "Webhook connections this process could not open for want of its own resources (cause: \
         file_descriptors, socket_memory): tried once more after the idle connections were \
         dropped (outcome retried), or not sent and put back without an attempt (put_back); \
         and webhooks the AWS sender did not send for want of invocation time (cause \
         invocation_time, put_back)"
    );
}

fn outcome_label(outcome: &AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Success { .. } => "success",
        AttemptOutcome::Redirect { .. } => "redirect",
        AttemptOutcome::Rejected { .. } => "http_error",
        AttemptOutcome::TransportError { .. } => "transport_error",
    }
}

/// Attempt numbers as a bounded label: 1 to 10, then "11+".
fn attempt_label(number: u32) -> String {
    if number > 10 {
        "11+".to_owned()
    } else {
        number.to_string()
    }
}

/// An event accepted by publish (its deliveries are counted by the store that writes them).
pub fn event_published() {
    counter!(EVENTS_PUBLISHED).increment(1);
}

/// Delivery rows a store wrote, whoever asked (publish, fan-out, replay, an operational
/// event). Counted by the store as each write commits, so a write that fails part-way counts
/// what it wrote, and the retry that finds those rows written counts only the rest.
pub fn deliveries_created(deliveries: usize) {
    if deliveries > 0 {
        counter!(DELIVERIES_CREATED).increment(deliveries as u64);
    }
}

pub fn attempt_recorded(
    endpoint: &EndpointId,
    account: &AccountId,
    number: u32,
    outcome: &AttemptOutcome,
    decision: &Decision,
    duration: Duration,
    since_event: Duration,
) {
    counter!(ATTEMPTS, "outcome" => outcome_label(outcome), "attempt" => attempt_label(number))
        .increment(1);
    counter!(ENDPOINT_ATTEMPTS, "endpoint" => endpoint.to_string()).increment(1);
    histogram!(ATTEMPT_DURATION).record(duration.as_secs_f64());
    match decision {
        Decision::Delivered => {
            histogram!(DELIVERY_LATENCY).record(since_event.as_secs_f64());
            completed(account, "delivered", 1);
        }
        Decision::RetryAt(_) => counter!(RETRIES_SCHEDULED).increment(1),
        Decision::Failed { .. } => completed(account, "failed", 1),
    }
}

pub fn completed(account: &AccountId, status: &'static str, count: u64) {
    counter!(DELIVERIES_COMPLETED, "status" => status).increment(count);
    counter!(ACCOUNT_DELIVERIES, "account" => account.to_string(), "status" => status)
        .increment(count);
}

pub fn endpoint_disabled(account: &AccountId, abandoned: u64) {
    counter!(ENDPOINTS_DISABLED).increment(1);
    completed(account, "abandoned", abandoned);
}

pub fn replayed(count: u64) {
    counter!(REPLAYS).increment(count);
}

pub fn endpoint_in_flight(endpoint: &EndpointId, change: f64) {
    gauge!(ENDPOINT_IN_FLIGHT, "endpoint" => endpoint.to_string()).increment(change);
}

/// What the sweeper saw: deliveries due now (or overdue) and how late the latest is.
pub fn due_backlog(due: usize, oldest_due_age: Duration) {
    gauge!(DUE_BACKLOG).set(due as f64);
    gauge!(OLDEST_DUE_AGE).set(oldest_due_age.as_secs_f64());
}

/// The backlog gauges, refreshed periodically.
pub fn backlog(pending: u64, oldest_pending_age: Duration, due: usize, in_flight: usize) {
    gauge!(PENDING_DELIVERIES).set(pending as f64);
    gauge!(OLDEST_PENDING_AGE).set(oldest_pending_age.as_secs_f64());
    gauge!(DUE_BACKLOG).set(due as f64);
    gauge!(IN_FLIGHT).set(in_flight as f64);
}

/// Items of one batch (`function` is `fanout` or `sender`) reported back as failed.
pub fn batch_item_failures(function: &'static str, count: usize) {
    if count > 0 {
        counter!(BATCH_ITEM_FAILURES, "function" => function).increment(count as u64);
    }
}

/// A webhook's connection that could not be opened for want of this process's own resources
/// (`cause`): tried once more on a fresh pool (`outcome` = `retried`, whatever came of it),
/// or not sent at all and its delivery put back without an attempt (`put_back`).
pub fn send_out_of_resources(cause: &'static str, outcome: &'static str) {
    counter!(SENDS_OUT_OF_RESOURCES, "cause" => cause, "outcome" => outcome).increment(1);
}

/// An attempt recorded on its delivery, but not its `part` (`detail`, `failing_clock`).
pub fn record_incomplete(part: &'static str) {
    counter!(RECORDS_INCOMPLETE, "part" => part).increment(1);
}

/// An owner mail that could not be sent: tried again later, or given up.
pub fn notification_failed() {
    counter!(NOTIFICATIONS_FAILED).increment(1);
}

/// An event item fan-out could not read (the reason goes to the log and the listing, not
/// into a dimension: one alarm covers every kind).
pub fn event_rejected() {
    counter!(EVENTS_REJECTED).increment(1);
}

/// Events an account's publish rate limit refused (a batch counts as its events).
pub fn publishes_throttled(account: &AccountId, events: u32) {
    counter!(PUBLISHES_THROTTLED, "account" => account.as_str().to_owned())
        .increment(u64::from(events));
}

/// Events fanned out by the sweeper, their stream records having been lost or dropped.
pub fn events_recovered(count: usize) {
    if count > 0 {
        counter!(EVENTS_RECOVERED).increment(count as u64);
    }
}

/// Writes to one store failing without a success between them: since when (the start of the
/// first failed write) and the last error.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreFault {
    pub since: crate::clock::Timestamp,
    /// When the last failed write ended: a fault nothing has written since is not current.
    pub last: crate::clock::Timestamp,
    pub error: String,
}

/// The stores whose writes are failing now. Keyed by the store, not one flag for the
/// process: tests run many apps in one process, and one's fault is not another's. The weak
/// reference keeps the allocation, so its address is not reused while listed.
static STORE_FAULTS: std::sync::Mutex<StoreFaults> = std::sync::Mutex::new(Vec::new());

type StoreFaults = Vec<(std::sync::Weak<dyn crate::store::Store>, StoreFault)>;

/// Whether [`STORE_FAULTS`] may hold anything: a success, the common case, then takes no lock.
static ANY_STORE_FAULT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn store_faults() -> std::sync::MutexGuard<'static, StoreFaults> {
    // A list of timestamps and texts: nothing a panic mid-update could leave harmful.
    STORE_FAULTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn same_store(
    listed: &std::sync::Weak<dyn crate::store::Store>,
    store: &std::sync::Arc<dyn crate::store::Store>,
) -> bool {
    std::ptr::addr_eq(listed.as_ptr(), std::sync::Arc::as_ptr(store))
}

/// A write to `store` that began at `began` failed: counted, and its fault kept (or
/// continued) for [`store_fault`].
pub fn store_write_failed(
    store: &std::sync::Arc<dyn crate::store::Store>,
    (began, ended): (crate::clock::Timestamp, crate::clock::Timestamp),
    error: &dyn std::fmt::Display,
) {
    counter!(STORE_WRITE_ERRORS).increment(1);
    let mut faults = store_faults();
    faults.retain(|(listed, _)| listed.strong_count() > 0);
    let error = error.to_string();
    match faults
        .iter_mut()
        .find(|(listed, _)| same_store(listed, store))
    {
        Some((_, fault)) => {
            fault.since = fault.since.min(began);
            fault.last = fault.last.max(ended);
            fault.error = error;
        }
        None => faults.push((
            std::sync::Arc::downgrade(store),
            StoreFault {
                since: began,
                last: ended,
                error,
            },
        )),
    }
    ANY_STORE_FAULT.store(true, std::sync::atomic::Ordering::Release);
}

/// A write to `store` succeeded: whatever failed before has cleared.
pub fn store_write_succeeded(store: &std::sync::Arc<dyn crate::store::Store>) {
    if !ANY_STORE_FAULT.load(std::sync::atomic::Ordering::Acquire) {
        return;
    }
    let mut faults = store_faults();
    faults.retain(|(listed, _)| listed.strong_count() > 0 && !same_store(listed, store));
    if faults.is_empty() {
        ANY_STORE_FAULT.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Since when writes to `store` have been failing, if its last write failed.
pub fn store_fault(store: &std::sync::Arc<dyn crate::store::Store>) -> Option<StoreFault> {
    if !ANY_STORE_FAULT.load(std::sync::atomic::Ordering::Acquire) {
        return None;
    }
    store_faults()
        .iter()
        .find(|(listed, _)| same_store(listed, store))
        .map(|(_, fault)| fault.clone())
}
