use std::time::Duration;

use rand::Rng;

use super::{delivery::DeliveryStatus, schedule::RetrySchedule};
use crate::clock::{self, Timestamp};

/// What one HTTP try came to, before any decision about the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// 2xx.
    Success { status: u16 },
    /// 3xx: never followed; the customer must fix the URL.
    Redirect {
        status: u16,
        location: Option<String>,
    },
    /// Any other status. `retry_after` is the parsed `Retry-After` of a 429 or 503.
    Rejected {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// No usable response: refused address, DNS, connect, timeout, broken HTTP.
    TransportError { message: String },
}

impl AttemptOutcome {
    /// Classifies a response from its status and the two headers that matter.
    pub fn from_response(
        status: u16,
        retry_after: Option<&str>,
        location: Option<&str>,
        now: Timestamp,
    ) -> Self {
        match status {
            200..=299 => Self::Success { status },
            300..=399 => Self::Redirect {
                status,
                location: location.map(|l| l.chars().take(512).collect()),
            },
            429 | 503 => Self::Rejected {
                status,
                retry_after: retry_after.and_then(|v| parse_retry_after(v, now)),
            },
            _ => Self::Rejected {
                status,
                retry_after: None,
            },
        }
    }

    pub fn is_success(&self) -> bool {
        matches!(self, Self::Success { .. })
    }

    pub fn status_code(&self) -> Option<u16> {
        match self {
            Self::Success { status }
            | Self::Redirect { status, .. }
            | Self::Rejected { status, .. } => Some(*status),
            Self::TransportError { .. } => None,
        }
    }

    /// The error shown in the delivery log, if the attempt failed.
    pub fn error_text(&self) -> Option<String> {
        match self {
            Self::Success { .. } => None,
            Self::Redirect { status, location } => Some(match location {
                Some(location) => format!(
                    "HTTP {status} redirect to {location} not followed: update the endpoint URL"
                ),
                None => format!("HTTP {status} redirect not followed: update the endpoint URL"),
            }),
            Self::Rejected { status, .. } => Some(format!("HTTP {status}")),
            Self::TransportError { message } => Some(message.clone()),
        }
    }
}

/// The longest `Retry-After` taken at its word.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(365 * 86_400);

/// `Retry-After` (RFC 9110 §10.2.3) as a wait from `now`: delay-seconds, or an HTTP-date in
/// any of its three forms (`Sun, 06 Nov 1994 08:49:37 GMT`, `Sunday, 06-Nov-94 08:49:37 GMT`,
/// `Sun Nov  6 08:49:37 1994`), at most a year. `None` when unreadable, or a date already
/// past (the sender's clock and the receiver's disagree: the caller's own schedule applies).
pub fn parse_retry_after(value: &str, now: Timestamp) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds is as far off as can be.
        let seconds = value.parse().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds).min(LONGEST_RETRY_AFTER));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    at.duration_since(std::time::SystemTime::from(now))
        .ok()
        .map(|wait| wait.min(LONGEST_RETRY_AFTER))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Delivered,
    RetryAt(Timestamp),
    Failed { reason: String },
}

/// What a decision makes of its delivery: the status, the next try, the error kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryUpdate {
    pub status: DeliveryStatus,
    pub next_try_at: Option<Timestamp>,
    pub last_error: Option<String>,
}

impl Decision {
    /// The delivery after an attempt that ended with `error` (none for a 2xx) and this
    /// decision. A failed delivery keeps the attempt's error and why it was given up on.
    pub fn update(&self, error: Option<&str>) -> DeliveryUpdate {
        let (status, next_try_at, last_error) = match self {
            Decision::Delivered => (DeliveryStatus::Delivered, None, None),
            Decision::RetryAt(at) => (DeliveryStatus::Pending, Some(*at), error.map(str::to_owned)),
            Decision::Failed { reason } => (
                DeliveryStatus::Failed,
                None,
                Some(match error {
                    Some(error) => format!("{error} ({reason})"),
                    None => reason.clone(),
                }),
            ),
        };
        DeliveryUpdate {
            status,
            next_try_at,
            last_error,
        }
    }
}

/// The delivery rules: schedule, early failure on repeated client errors, `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub schedule: RetrySchedule,
    /// Statuses that mean "this endpoint is misconfigured" …
    pub client_error_statuses: Vec<u16>,
    /// … and how many of them fail a delivery before its schedule ends.
    pub client_error_limit: u32,
    /// The longest wait a `Retry-After` may ask for; longer requests are cut to this.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            schedule: RetrySchedule::default(),
            client_error_statuses: vec![400, 401, 403, 404, 410],
            client_error_limit: 3,
            max_retry_after: Duration::from_secs(86_400),
        }
    }
}

impl RetryPolicy {
    /// The longest time from a delivery's first attempt to its last: the schedule with every
    /// failure asking for the longest `Retry-After`, which may stretch each delay to it.
    pub fn longest_span(&self) -> Duration {
        self.schedule
            .delays()
            .iter()
            .map(|delay| (*delay).max(self.max_retry_after))
            .sum()
    }

    pub fn is_client_error(&self, outcome: &AttemptOutcome) -> bool {
        matches!(outcome, AttemptOutcome::Rejected { status, .. } if self.client_error_statuses.contains(status))
    }

    /// Decides a delivery's fate after an attempt. `attempts_made` and `client_errors`
    /// already count this attempt.
    pub fn decide(
        &self,
        attempts_made: u32,
        client_errors: u32,
        outcome: &AttemptOutcome,
        now: Timestamp,
        rng: &mut impl Rng,
    ) -> Decision {
        if outcome.is_success() {
            return Decision::Delivered;
        }
        if self.is_client_error(outcome) && client_errors >= self.client_error_limit {
            return Decision::Failed {
                reason: format!(
                    "failed early: {client_errors} client-error responses (400/401/403/404/410)"
                ),
            };
        }
        let Some(scheduled) = self.schedule.delay_after(attempts_made, rng) else {
            return Decision::Failed {
                reason: format!("retry schedule exhausted after {attempts_made} attempts"),
            };
        };
        // Retry-After may only push the next try later, never sooner than the schedule:
        // a server asking for 1 s must not burn the whole schedule in seconds.
        let delay = match outcome {
            AttemptOutcome::Rejected {
                retry_after: Some(asked),
                ..
            } => scheduled.max((*asked).min(self.max_retry_after)),
            _ => scheduled,
        };
        Decision::RetryAt(clock::add(now, delay))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::clock::from_millis;
    use rand::{rngs::StdRng, SeedableRng};

    /// The time from a first attempt to the last of a delivery whose every try is answered
    /// 503 with `retry_after` (as `decide` schedules it).
    pub(crate) fn span_answered_with(
        policy: &RetryPolicy,
        retry_after: Option<Duration>,
    ) -> Duration {
        let mut rng = StdRng::seed_from_u64(7);
        let first = from_millis(1_700_000_000_000);
        let mut now = first;
        let outcome = AttemptOutcome::Rejected {
            status: 503,
            retry_after,
        };
        for attempts in 1.. {
            match policy.decide(attempts, 0, &outcome, now, &mut rng) {
                Decision::RetryAt(at) => now = at,
                _ => break,
            }
        }
        (now - first).to_std().unwrap()
    }

    /// An endpoint that asks for more than the longest `Retry-After` at every try takes the
    /// longest span; one that asks for nothing takes no longer than the schedule.
    #[test]
    fn the_longest_span_is_every_try_waiting_the_longest_retry_after() {
        let policy = RetryPolicy::default();
        let stretched = span_answered_with(&policy, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(stretched, policy.longest_span());
        assert_eq!(stretched, Duration::from_secs(10 * 86_400));
        assert!(span_answered_with(&policy, None) <= policy.schedule.total_span());
    }

    #[test]
    fn a_decision_sets_status_next_try_and_the_error_kept() {
        let at = from_millis(1_700_000_000_000);
        let retry = Decision::RetryAt(at).update(Some("HTTP 503"));
        assert_eq!(
            (retry.status, retry.next_try_at, retry.last_error.as_deref()),
            (DeliveryStatus::Pending, Some(at), Some("HTTP 503"))
        );
        let delivered = Decision::Delivered.update(None);
        assert_eq!(
            (
                delivered.status,
                delivered.next_try_at,
                delivered.last_error
            ),
            (DeliveryStatus::Delivered, None, None)
        );
        let failed = Decision::Failed {
            reason: "retries exhausted".into(),
        };
        assert_eq!(
            failed.update(Some("HTTP 500")).last_error.as_deref(),
            Some("HTTP 500 (retries exhausted)")
        );
        assert_eq!(
            failed.update(None).last_error.as_deref(),
            Some("retries exhausted")
        );
        assert_eq!(failed.update(None).status, DeliveryStatus::Failed);
    }

    fn now() -> Timestamp {
        from_millis(1_700_000_000_000)
    }

    fn rng() -> StdRng {
        StdRng::seed_from_u64(1)
    }

    fn rejected(status: u16) -> AttemptOutcome {
        AttemptOutcome::from_response(status, None, None, now())
    }

    #[test]
    fn classification() {
        assert!(AttemptOutcome::from_response(204, None, None, now()).is_success());
        assert!(matches!(
            AttemptOutcome::from_response(301, None, Some("http://x/"), now()),
            AttemptOutcome::Redirect { status: 301, .. }
        ));
        assert!(matches!(
            rejected(500),
            AttemptOutcome::Rejected {
                status: 500,
                retry_after: None
            }
        ));
        assert_eq!(
            AttemptOutcome::from_response(429, Some("120"), None, now()),
            AttemptOutcome::Rejected {
                status: 429,
                retry_after: Some(Duration::from_secs(120))
            }
        );
        // Retry-After only counts on 429 and 503.
        assert_eq!(
            AttemptOutcome::from_response(500, Some("120"), None, now()),
            rejected(500)
        );
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("0", now()), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(" 3600 ", now()),
            Some(Duration::from_secs(3600))
        );
        // now() is Tue, 14 Nov 2023 22:13:20 GMT; the three forms of ten minutes later.
        for later in [
            "Tue, 14 Nov 2023 22:23:20 GMT",
            "Tuesday, 14-Nov-23 22:23:20 GMT",
            "Tue Nov 14 22:23:20 2023",
        ] {
            assert_eq!(
                parse_retry_after(later, now()),
                Some(Duration::from_secs(600)),
                "{later}"
            );
        }
        assert_eq!(
            parse_retry_after("Tue, 14 Nov 2023 22:13:20 GMT", now()),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Mon, 01 Jan 2001 00:00:00 GMT", now()),
            None
        );
        let year = Some(Duration::from_secs(365 * 86_400));
        assert_eq!(parse_retry_after("99999999999999999999999", now()), year);
        assert_eq!(
            parse_retry_after("Fri, 01 Jan 2100 00:00:00 GMT", now()),
            year
        );
        for junk in [
            "",
            "soon",
            "-5",
            "+8",
            "1e9",
            "1.5",
            "8s",
            "Tue, 14 Nov 2023 22:23:20 +0100",
        ] {
            assert_eq!(parse_retry_after(junk, now()), None, "{junk}");
        }
    }

    #[test]
    fn success_delivers() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.decide(
                1,
                0,
                &AttemptOutcome::Success { status: 200 },
                now(),
                &mut rng()
            ),
            Decision::Delivered
        );
    }

    #[test]
    fn failures_follow_the_jittered_schedule_then_fail() {
        let policy = RetryPolicy::default();
        let outcome = rejected(500);
        for attempt in 1..=10u32 {
            let full = policy.schedule.delays()[attempt as usize - 1];
            match policy.decide(attempt, 0, &outcome, now(), &mut rng()) {
                Decision::RetryAt(at) => {
                    let delay = (at - now()).to_std().unwrap();
                    assert!(
                        delay >= full / 2 && delay <= full,
                        "attempt {attempt}: {delay:?}"
                    );
                }
                other => panic!("attempt {attempt}: {other:?}"),
            }
        }
        assert!(matches!(
            policy.decide(11, 0, &outcome, now(), &mut rng()),
            Decision::Failed { .. }
        ));
    }

    #[test]
    fn three_client_errors_fail_early() {
        let policy = RetryPolicy::default();
        for status in [400, 401, 403, 404, 410] {
            let outcome = rejected(status);
            assert!(matches!(
                policy.decide(1, 1, &outcome, now(), &mut rng()),
                Decision::RetryAt(_)
            ));
            assert!(matches!(
                policy.decide(2, 2, &outcome, now(), &mut rng()),
                Decision::RetryAt(_)
            ));
            assert!(
                matches!(
                    policy.decide(3, 3, &outcome, now(), &mut rng()),
                    Decision::Failed { .. }
                ),
                "{status}"
            );
        }
        // Other 4xx keep the full schedule.
        assert!(matches!(
            policy.decide(3, 0, &rejected(422), now(), &mut rng()),
            Decision::RetryAt(_)
        ));
        assert!(!policy.is_client_error(&rejected(422)));
    }

    #[test]
    fn redirects_are_failures_that_retry() {
        let policy = RetryPolicy::default();
        let outcome = AttemptOutcome::from_response(302, None, Some("http://10.0.0.1/"), now());
        assert!(matches!(
            policy.decide(1, 0, &outcome, now(), &mut rng()),
            Decision::RetryAt(_)
        ));
        assert!(outcome.error_text().unwrap().contains("not followed"));
    }

    #[test]
    fn retry_after_waits_longer_but_never_shorter_and_is_capped() {
        let policy = RetryPolicy::default();
        let asks = |secs: u64| AttemptOutcome::Rejected {
            status: 503,
            retry_after: Some(Duration::from_secs(secs)),
        };
        let delay = |d: Decision| match d {
            Decision::RetryAt(at) => (at - now()).to_std().unwrap(),
            other => panic!("{other:?}"),
        };
        // Asking for an hour after the first attempt (schedule: 15-30 s) waits the hour.
        assert_eq!(
            delay(policy.decide(1, 0, &asks(3600), now(), &mut rng())),
            Duration::from_secs(3600)
        );
        // Asking for 1 s does not make the retry sooner than the schedule.
        assert!(delay(policy.decide(1, 0, &asks(1), now(), &mut rng())) >= Duration::from_secs(15));
        // Asking for a year is cut to the bound.
        assert_eq!(
            delay(policy.decide(1, 0, &asks(365 * 86_400), now(), &mut rng())),
            Duration::from_secs(86_400)
        );
    }
}
