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
