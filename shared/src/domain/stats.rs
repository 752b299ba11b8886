//! An endpoint's attempts counted by the hour, for health at a glance: what the last 24 hours
//! and 7 days look like, and the last failure.

use chrono::{DurationRound, TimeDelta};

use crate::clock::Timestamp;

/// How far back the counts go: the stores keep a little longer, so that the oldest hour
/// shown is whole.
pub const STATS_HOURS: usize = 7 * 24;
/// How long a store keeps an hour's counts.
pub const STATS_KEPT: TimeDelta = TimeDelta::days(8);

/// The start of the hour `at` falls in.
pub fn hour_of(at: Timestamp) -> Timestamp {
    at.duration_trunc(TimeDelta::hours(1)).unwrap_or(at)
}

/// The most recent failed attempt of an hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastFailure {
    pub at: Timestamp,
    /// `None` when nothing answered (timeout, refused connection, TLS).
    pub status_code: Option<u16>,
    pub error: String,
}

/// The attempts to one endpoint in one hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HourCount {
    pub hour: Timestamp,
    pub succeeded: u64,
    pub failed: u64,
    pub last_failure: Option<LastFailure>,
}

impl HourCount {
    /// One attempt, finished at `at`.
    pub fn of_attempt(
        at: Timestamp,
        success: bool,
        status_code: Option<u16>,
        error: Option<&str>,
    ) -> Self {
        Self {
            hour: hour_of(at),
            succeeded: u64::from(success),
            failed: u64::from(!success),
            last_failure: (!success).then(|| LastFailure {
                at,
                status_code,
                error: error.unwrap_or("failed").to_owned(),
            }),
        }
    }

    /// Adds `other`'s attempts, of the same hour; the later failure is kept.
    pub fn add(&mut self, other: &HourCount) {
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.last_failure = later(self.last_failure.take(), other.last_failure.clone());
    }
}

fn later(a: Option<LastFailure>, b: Option<LastFailure>) -> Option<LastFailure> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.at >= a.at { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Attempts over a period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    pub succeeded: u64,
    pub failed: u64,
}

impl Totals {
    pub fn attempts(&self) -> u64 {
        self.succeeded + self.failed
    }

    /// Succeeded over attempted; `None` without attempts.
    pub fn success_rate(&self) -> Option<f64> {
        let attempts = self.attempts();
        // Counts stay far below 2^53, where u64 to f64 is exact.
        (attempts > 0).then(|| self.succeeded as f64 / attempts as f64)
    }

    fn add(&mut self, count: &HourCount) {
        self.succeeded += count.succeeded;
        self.failed += count.failed;
    }
}

/// One endpoint's last 7 days, hour by hour.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointStats {
    /// The time the counts run up to.
    pub at: Timestamp,
    pub last_24h: Totals,
    pub last_7d: Totals,
    /// The last [`STATS_HOURS`] hours, oldest first, the current one last; hours without
    /// attempts are there with zeros.
    pub hours: Vec<HourCount>,
    /// The last failed attempt of those 7 days.
    pub last_failure: Option<LastFailure>,
}

impl EndpointStats {
    /// From the stored counts (any order, hours outside the window ignored) at `now`.
    pub fn from_counts(counts: &[HourCount], now: Timestamp) -> Self {
        let current = hour_of(now);
        let first = current - TimeDelta::hours(STATS_HOURS as i64 - 1);
        let mut hours: Vec<HourCount> = (0..STATS_HOURS)
            .map(|n| HourCount {
                hour: first + TimeDelta::hours(n as i64),
                succeeded: 0,
                failed: 0,
                last_failure: None,
            })
            .collect();
        for count in counts {
            let offset = (hour_of(count.hour) - first).num_hours();
            if let Some(slot) = usize::try_from(offset).ok().and_then(|n| hours.get_mut(n)) {
                slot.add(count);
            }
        }
        let (mut last_24h, mut last_7d, mut last_failure) =
            (Totals::default(), Totals::default(), None);
        for (n, hour) in hours.iter().enumerate() {
            last_7d.add(hour);
            if n >= STATS_HOURS - 24 {
                last_24h.add(hour);
            }
            last_failure = later(last_failure, hour.last_failure.clone());
        }
        Self {
            at: now,
            last_24h,
            last_7d,
            hours,
            last_failure,
        }
    }

    /// The same hours summed by day, oldest first: the 24-hour periods ending with the
    /// current hour.
    pub fn days(&self) -> Vec<(Timestamp, Totals)> {
        self.hours
            .chunks(24)
            .map(|day| {
                let mut totals = Totals::default();
                day.iter().for_each(|h| totals.add(h));
                (day[0].hour, totals)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_millis;

    fn at(hours: i64, minutes: i64) -> Timestamp {
        from_millis(1_767_225_600_000) + TimeDelta::hours(hours) + TimeDelta::minutes(minutes)
    }

    #[test]
    fn attempts_fall_in_their_hour_and_the_later_failure_is_kept() {
        let mut count = HourCount::of_attempt(at(5, 10), false, Some(503), Some("HTTP 503"));
        assert_eq!(count.hour, at(5, 0));
        count.add(&HourCount::of_attempt(at(5, 50), true, Some(200), None));
        count.add(&HourCount::of_attempt(
            at(5, 40),
            false,
            None,
            Some("timed out"),
        ));
        assert_eq!((count.succeeded, count.failed), (1, 2));
        let last = count.last_failure.expect("a failure");
        assert_eq!(
            (last.at, last.status_code, last.error.as_str()),
            (at(5, 40), None, "timed out")
        );
    }

    #[test]
    fn the_window_is_seven_days_of_hours_ending_with_the_current_one() {
        let now = at(200, 30);
        let counts = [
            // The current hour, and 23 hours back: both in the last 24 hours.
            HourCount::of_attempt(at(200, 1), true, Some(200), None),
            HourCount::of_attempt(at(177, 59), false, Some(500), Some("HTTP 500")),
            // 24 hours back: in the 7 days only.
            HourCount::of_attempt(at(176, 59), false, Some(502), Some("HTTP 502")),
            // The oldest hour shown, and one before it (left out).
            HourCount::of_attempt(at(33, 0), true, Some(200), None),
            HourCount::of_attempt(at(32, 59), true, Some(200), None),
        ];
        let stats = EndpointStats::from_counts(&counts, now);
        assert_eq!(stats.hours.len(), STATS_HOURS);
        assert_eq!(stats.hours[0].hour, at(33, 0));
        assert_eq!(stats.hours[STATS_HOURS - 1].hour, at(200, 0));
        assert_eq!(
            stats.last_24h,
            Totals {
                succeeded: 1,
                failed: 1
            }
        );
        assert_eq!(
            stats.last_7d,
            Totals {
                succeeded: 2,
                failed: 2
            }
        );
        assert_eq!(stats.last_7d.success_rate(), Some(0.5));
        assert_eq!(Totals::default().success_rate(), None);
        assert_eq!(
            stats.last_failure.as_ref().map(|f| f.status_code),
            Some(Some(500))
        );
        let days = stats.days();
        assert_eq!(days.len(), 7);
        assert_eq!(days[6], (at(177, 0), stats.last_24h));
        assert_eq!(
            days[0],
            (
                at(33, 0),
                Totals {
                    succeeded: 1,
                    failed: 0
                }
            )
        );
    }
}
