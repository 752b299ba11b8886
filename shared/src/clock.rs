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

/// The time for work that must never come early, such as removing what is past retention.
/// It follows the wall clock, but moves forward at most twice as fast as the machine's
/// monotonic clock: a wall clock stepped forward (a wrong NTP answer, a virtual machine
/// restored from a snapshot) is caught up over as long again as the step, not at once. A
/// step back is followed at once, and so is one more than [`UNHURRIED_MOST_BEHIND`] ahead:
/// that is a clock being set right (a machine that booted with no real-time clock), and
/// lagging it would hold the work back for as long.
pub const UNHURRIED_MOST_BEHIND: std::time::Duration = std::time::Duration::from_secs(86_400);

#[derive(Debug, Default)]
pub struct Unhurried {
    last: Option<(Timestamp, std::time::Instant)>,
}

impl Unhurried {
    /// The time at the monotonic instant `at`, the wall clock reading `wall`.
    pub fn now(&mut self, wall: Timestamp, at: std::time::Instant) -> Timestamp {
        let now = match self.last {
            Some((then, since)) => {
                let paced = add(then, at.saturating_duration_since(since).saturating_mul(2));
                match paced < sub(wall, UNHURRIED_MOST_BEHIND) {
                    true => wall,
                    false => wall.min(paced),
                }
            }
            None => wall,
        };
        self.last = Some((now, at));
        now
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_wall_clock_stepped_forward_is_caught_up_at_twice_the_elapsed_time() {
        let (t0, start) = (from_millis(1_700_000_000_000), Instant::now());
        let later = |s: u64| add(t0, Duration::from_secs(s));
        let after = |s: u64| start + Duration::from_secs(s);
        let mut clock = Unhurried::default();
        assert_eq!(clock.now(t0, start), t0, "the first reading is the wall's");
        assert_eq!(clock.now(later(60), after(60)), later(60), "in step");
        // Stepped a day ahead a minute later: two minutes of it now, two more a minute on.
        assert_eq!(clock.now(later(86_520), after(120)), later(180));
        assert_eq!(clock.now(later(86_580), after(180)), later(300));
        // Stepped back: followed at once.
        assert_eq!(clock.now(later(200), after(240)), later(200));
        assert_eq!(
            clock.now(later(260), after(300)),
            later(260),
            "in step again"
        );
        // Set right by more than a day (it booted at 1970, say): followed at once.
        assert_eq!(clock.now(later(3 * 86_400), after(360)), later(3 * 86_400));
    }
}
