//! CloudWatch Embedded Metric Format: the Lambda functions' metrics exporter. Metrics are
//! collected in memory during an invocation and written as EMF JSON lines to the log at its
//! end, so CloudWatch extracts them with no API call.

use std::{
    collections::BTreeMap,
    future::Future,
    io::Write,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use serde_json::{json, Map, Value};

/// CloudWatch accepts at most 100 values for one metric in one document.
const MAX_VALUES: usize = 100;

#[derive(Default)]
struct CounterCell(AtomicU64);

impl CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct GaugeCell(Mutex<f64>);

impl GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += value;
    }

    fn decrement(&self, value: f64) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) -= value;
    }

    fn set(&self, value: f64) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = value;
    }
}

#[derive(Default)]
struct HistogramCell(Mutex<Vec<f64>>);

impl HistogramFn for HistogramCell {
    fn record(&self, value: f64) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(value);
    }
}

enum Cell {
    Counter(Arc<CounterCell>),
    Gauge(Arc<GaugeCell>),
    Histogram(Arc<HistogramCell>),
}

type Labels = Vec<(String, String)>;
/// Name, value and unit of one metric in a document.
type Sample = (String, Value, String);

/// A `metrics` recorder that renders EMF documents on demand.
#[derive(Clone)]
pub struct EmfRecorder {
    namespace: String,
    /// Dimensions added to every document, e.g. the stack name.
    fixed: Vec<(String, String)>,
    /// Labels written as plain fields of the document, not as dimensions: the unbounded ones
    /// (endpoint, account), which would otherwise make one CloudWatch metric per value.
    properties: Vec<String>,
    cells: Arc<Mutex<BTreeMap<Key, Cell>>>,
    units: Arc<Mutex<BTreeMap<String, Unit>>>,
}

impl EmfRecorder {
    pub fn new(namespace: impl Into<String>, fixed: Vec<(String, String)>) -> Self {
        Self {
            namespace: namespace.into(),
            fixed,
            properties: Vec::new(),
            cells: Arc::default(),
            units: Arc::default(),
        }
    }

    /// Keeps these labels out of the dimensions (see `properties`).
    pub fn with_property_labels(mut self, labels: &[&str]) -> Self {
        self.properties = labels.iter().map(|l| (*l).to_owned()).collect();
        self
    }

    fn unit_of(&self, name: &str, fallback: &'static str) -> String {
        let units = self.units.lock().unwrap_or_else(PoisonError::into_inner);
        match units.get(name) {
            Some(Unit::Seconds) => "Seconds".into(),
            Some(Unit::Count) => "Count".into(),
            _ => fallback.into(),
        }
    }

    /// One EMF document per label set with what was recorded since the last flush; counters
    /// and histograms start again from zero, gauges keep their value.
    pub fn flush(&self, timestamp_millis: i64) -> Vec<Value> {
        let mut groups: BTreeMap<Labels, Vec<Sample>> = BTreeMap::new();
        {
            let cells = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
            for (key, cell) in cells.iter() {
                let labels: Labels = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                let name = key.name().to_owned();
                let (value, unit) = match cell {
                    Cell::Counter(c) => {
                        let count = c.0.swap(0, Ordering::Relaxed);
                        if count == 0 {
                            continue;
                        }
                        (json!(count), self.unit_of(&name, "Count"))
                    }
                    Cell::Gauge(g) => (
                        json!(*g.0.lock().unwrap_or_else(PoisonError::into_inner)),
                        self.unit_of(&name, "None"),
                    ),
                    Cell::Histogram(h) => {
                        let values = std::mem::take(
                            &mut *h.0.lock().unwrap_or_else(PoisonError::into_inner),
                        );
                        if values.is_empty() {
                            continue;
                        }
                        (
                            json!(values.into_iter().take(MAX_VALUES).collect::<Vec<_>>()),
                            self.unit_of(&name, "None"),
                        )
                    }
                };
                groups.entry(labels).or_default().push((name, value, unit));
            }
        }
        groups
            .into_iter()
            .map(|(labels, metrics)| {
                let mut document = Map::new();
                let mut dimensions: Vec<String> =
                    self.fixed.iter().map(|(k, _)| k.clone()).collect();
                for (k, v) in self.fixed.iter().chain(labels.iter()) {
                    document.insert(k.clone(), json!(v));
                }
                dimensions.extend(
                    labels
                        .iter()
                        .filter(|(k, _)| !self.properties.contains(k))
                        .map(|(k, _)| k.clone()),
                );
                let definitions: Vec<Value> = metrics
                    .iter()
                    .map(|(name, _, unit)| json!({"Name": name, "Unit": unit}))
                    .collect();
                for (name, value, _) in metrics {
                    document.insert(name, value);
                }
                document.insert(
                    "_aws".into(),
                    json!({
                        "Timestamp": timestamp_millis,
                        "CloudWatchMetrics": [{
                            "Namespace": self.namespace,
                            "Dimensions": [dimensions],
                            "Metrics": definitions,
                        }],
                    }),
                );
                Value::Object(document)
            })
            .collect()
    }

    fn cell(&self, key: &Key, make: impl FnOnce() -> Cell) -> Cell {
        let mut cells = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
        let cell = cells.entry(key.clone()).or_insert_with(make);
        match cell {
            Cell::Counter(c) => Cell::Counter(Arc::clone(c)),
            Cell::Gauge(g) => Cell::Gauge(Arc::clone(g)),
            Cell::Histogram(h) => Cell::Histogram(Arc::clone(h)),
        }
    }

    fn describe(&self, key: KeyName, unit: Option<Unit>) {
        if let Some(unit) = unit {
            self.units
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.as_str().to_owned(), unit);
        }
    }
}

/// Writes a recorder's documents, one JSON line each, to the function's log (stdout in
/// Lambda, where CloudWatch picks the EMF lines out of the log stream).
#[derive(Clone)]
pub struct EmfPublisher {
    recorder: EmfRecorder,
    out: Arc<Mutex<dyn Write + Send>>,
}

impl EmfPublisher {
    pub fn new(recorder: EmfRecorder, out: impl Write + Send + 'static) -> Self {
        Self {
            recorder,
            out: Arc::new(Mutex::new(out)),
        }
    }

    pub fn recorder(&self) -> &EmfRecorder {
        &self.recorder
    }

    /// Writes what was recorded since the last call; returns how many documents.
    pub fn publish(&self) -> std::io::Result<usize> {
        let documents = self.recorder.flush(chrono::Utc::now().timestamp_millis());
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        for document in &documents {
            // One write per line, so a log line of another thread cannot land inside it.
            let mut line = document.to_string();
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
        out.flush()?;
        Ok(documents.len())
    }

    /// Runs one invocation and publishes its metrics before handing back its result: a
    /// Lambda may be frozen as soon as it has answered, so nothing is left for later.
    pub async fn flushed<F: Future>(&self, invocation: F) -> F::Output {
        let output = invocation.await;
        if let Err(error) = self.publish() {
            tracing::warn!(%error, "cannot write the invocation's metrics");
        }
        output
    }
}

/// An in-memory log for tests: the JSON lines an `EmfPublisher` (or a JSON log subscriber)
/// wrote, read back as documents.
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn documents(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The value of `metric` in the one document that has it with these label values.
    pub fn value(&self, metric: &str, labels: &[(&str, &str)]) -> Option<Value> {
        self.documents().into_iter().find_map(|document| {
            let matches = labels
                .iter()
                .all(|(k, v)| document.get(*k) == Some(&json!(v)));
            if matches {
                document.get(metric).cloned()
            } else {
                None
            }
        })
    }
}

impl Write for LogCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Recorder for EmfRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match self.cell(key, || Cell::Counter(Arc::default())) {
            Cell::Counter(c) => Counter::from_arc(c),
            _ => Counter::noop(),
        }
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        match self.cell(key, || Cell::Gauge(Arc::default())) {
            Cell::Gauge(g) => Gauge::from_arc(g),
            _ => Gauge::noop(),
        }
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        match self.cell(key, || Cell::Histogram(Arc::default())) {
            Cell::Histogram(h) => Histogram::from_arc(h),
            _ => Histogram::noop(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::{AccountId, AttemptOutcome, Decision, EndpointId},
        telemetry,
    };

    #[test]
    fn renders_emf_documents_per_label_set() {
        let recorder = EmfRecorder::new("Hooklane", vec![("Function".into(), "sender".into())]);
        metrics::with_local_recorder(&recorder, || {
            telemetry::describe();
            let endpoint = EndpointId::from_trusted("ep_1".into());
            let account = AccountId::from_trusted("acme".into());
            for _ in 0..3 {
                telemetry::attempt_recorded(
                    &endpoint,
                    &account,
                    1,
                    &AttemptOutcome::Success { status: 200 },
                    &Decision::Delivered,
                    std::time::Duration::from_millis(20),
                    std::time::Duration::from_millis(50),
                );
            }
        });
        let documents = recorder.flush(1_700_000_000_000);
        let attempts = documents
            .iter()
            .find(|d| d.get("hooklane_attempts_total").is_some())
            .expect("attempts document");
        assert_eq!(attempts["hooklane_attempts_total"], 3);
        assert_eq!(attempts["outcome"], "success");
        assert_eq!(attempts["attempt"], "1");
        assert_eq!(attempts["Function"], "sender");
        let definition = &attempts["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(definition["Namespace"], "Hooklane");
        assert_eq!(
            definition["Dimensions"][0],
            json!(["Function", "outcome", "attempt"])
        );
        assert_eq!(definition["Metrics"][0]["Unit"], "Count");
        let durations = documents
            .iter()
            .find(|d| d.get("hooklane_attempt_duration_seconds").is_some())
            .expect("histogram document");
        assert_eq!(
            durations["hooklane_attempt_duration_seconds"],
            json!([0.02, 0.02, 0.02])
        );
        assert_eq!(
            durations["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"],
            "Seconds"
        );
        // Counters and histograms restart after a flush.
        assert!(recorder.flush(1_700_000_001_000).is_empty());
    }
}
