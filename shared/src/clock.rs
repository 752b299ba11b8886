use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Utc};

pub type Timestamp = DateTime<Utc>;

/// The source of "now" for every rule that depends on time, so tests can move it.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    /// To the millisecond, the precision the stores keep: a write then answers with the
    /// times a read of it returns, and an event's with the `created` of its webhook body.
    fn now(&self) -> Timestamp {
        from_millis(Utc::now().timestamp_millis())
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug)]
pub struct ManualClock {
    millis: AtomicI64,
}

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        Self {
            millis: AtomicI64::new(start.timestamp_millis()),
        }
    }

    pub fn advance(&self, by: std::time::Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.millis.fetch_add(by, Ordering::SeqCst);
    }

    pub fn set(&self, to: Timestamp) {
        self.millis.store(to.timestamp_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        from_millis(self.millis.load(Ordering::SeqCst))
    }
}

/// How a time is written for people and programs (the API's JSON, the audit log's details):
/// RFC 3339 in UTC with three fractional digits always, `2026-01-31T12:00:00.000Z`, so that
/// times compare as their text does. Left to serde, a whole second lost its fraction, and
/// `…:43Z` sorted after `…:43.110Z`.
pub fn to_text(at: Timestamp) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// [`to_text`] for a serde field: `#[serde(serialize_with = "crate::clock::as_text")]`.
pub fn as_text<S: serde::Serializer>(at: &Timestamp, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&to_text(*at))
}

/// [`as_text`] for an optional time.
pub fn as_optional_text<S: serde::Serializer>(
    at: &Option<Timestamp>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => serializer.serialize_some(&to_text(*at)),
        None => serializer.serialize_none(),
    }
}

/// Milliseconds since the epoch, the form timestamps take in storage.
pub fn to_millis(at: Timestamp) -> i64 {
    at.timestamp_millis()
}

pub fn from_millis(millis: i64) -> Timestamp {
    DateTime::<Utc>::from_timestamp_millis(millis).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Subtracts a std duration from a timestamp, saturating instead of overflowing.
pub fn sub(at: Timestamp, by: std::time::Duration) -> Timestamp {
    chrono::Duration::from_std(by)
        .ok()
        .and_then(|d| at.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Adds a std duration to a timestamp, saturating instead of overflowing.
pub fn add(at: Timestamp, by: std::time::Duration) -> Timestamp {
    chrono::Duration::from_std(by)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}
