//! Endpoint health: a clock that starts at the first failure and stops at any success.

use std::time::Duration;

use crate::clock::Timestamp;

/// `failing_since` after an attempt.
pub fn failing_since_after(
    previous: Option<Timestamp>,
    success: bool,
    now: Timestamp,
) -> Option<Timestamp> {
    if success {
        None
    } else {
        Some(previous.unwrap_or(now))
    }
}

/// Whether an endpoint failing since `failing_since` has failed for long enough to be disabled.
pub fn should_disable(
    failing_since: Option<Timestamp>,
    now: Timestamp,
    disable_after: Duration,
) -> bool {
    match failing_since {
        Some(since) => (now - since)
            .to_std()
            .is_ok_and(|failing_for| failing_for >= disable_after),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_millis;

    #[test]
    fn clock_starts_at_first_failure_and_clears_on_success() {
        let t0 = from_millis(1_000_000);
        let t1 = from_millis(2_000_000);
        assert_eq!(failing_since_after(None, false, t0), Some(t0));
        assert_eq!(failing_since_after(Some(t0), false, t1), Some(t0));
        assert_eq!(failing_since_after(Some(t0), true, t1), None);
        assert_eq!(failing_since_after(None, true, t1), None);
    }

    #[test]
    fn disables_after_threshold_only() {
        let three_days = Duration::from_secs(3 * 86_400);
        let since = from_millis(0);
        assert!(!should_disable(None, from_millis(i64::MAX / 2), three_days));
        assert!(!should_disable(
            Some(since),
            from_millis(3 * 86_400_000 - 1),
            three_days
        ));
        assert!(should_disable(
            Some(since),
            from_millis(3 * 86_400_000),
            three_days
        ));
        // A clock in the future (skew) never disables.
        assert!(!should_disable(
            Some(from_millis(10_000)),
            from_millis(0),
            three_days
        ));
    }
}
