use std::time::Duration;

use rand::Rng;

use super::InvalidField;

/// The seed's schedule: roughly two days of retries after the first try.
pub const DEFAULT_SCHEDULE_SECS: [u64; 10] =
    [30, 120, 600, 1800, 3600, 7200, 14400, 28800, 43200, 86400];

/// Delays between attempts. Attempt n+1 waits a delay drawn uniformly from [d/2, d] where
/// d is the n-th entry; a delivery has `len + 1` attempts in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule(Vec<Duration>);

impl Default for RetrySchedule {
    fn default() -> Self {
        Self(
            DEFAULT_SCHEDULE_SECS
                .iter()
                .map(|s| Duration::from_secs(*s))
                .collect(),
        )
    }
}

impl RetrySchedule {
    pub fn new(delays: Vec<Duration>) -> Result<Self, InvalidField> {
        if delays.len() > 100 {
            return Err(InvalidField::new("retry_schedule", "at most 100 entries"));
        }
        if delays
            .iter()
            .any(|d| d.is_zero() || *d > Duration::from_secs(30 * 86_400))
        {
            return Err(InvalidField::new(
                "retry_schedule",
                "each delay must be above 0 and at most 30 days",
            ));
        }
        Ok(Self(delays))
    }

    /// Parses `30,120,600` (seconds; fractions allowed, e.g. `0.2,0.5` for tests).
    pub fn parse(raw: &str) -> Result<Self, InvalidField> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Self::new(Vec::new());
        }
        let delays = raw
            .split(',')
            .map(|part| {
                part.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    // Past what a Duration holds: too long, which `new` refuses as such.
                    .map(|s| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX))
                    .ok_or_else(|| {
                        InvalidField::new(
                            "retry_schedule",
                            format!("`{}` is not a positive number of seconds", part.trim()),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(delays)
    }

    pub fn delays(&self) -> &[Duration] {
        &self.0
    }

    pub fn max_attempts(&self) -> u32 {
        u32::try_from(self.0.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1)
    }

    /// The delay after the `attempts_made`-th failed attempt, or `None` when the schedule is spent.
    pub fn delay_after(&self, attempts_made: u32, rng: &mut impl Rng) -> Option<Duration> {
        let index = usize::try_from(attempts_made.checked_sub(1)?).ok()?;
        let full = *self.0.get(index)?;
        let half = full / 2;
        if half >= full {
            return Some(full);
        }
        Some(rng.random_range(half..=full))
    }

    /// The longest time from the first attempt to the last.
    pub fn total_span(&self) -> Duration {
        self.0.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn default_is_the_seed_schedule() {
        let schedule = RetrySchedule::default();
        assert_eq!(schedule.delays().len(), 10);
        assert_eq!(schedule.max_attempts(), 11);
        assert_eq!(schedule.total_span(), Duration::from_secs(186_150));
    }

    #[test]
    fn jitter_stays_within_half_to_full() {
        let schedule = RetrySchedule::default();
        let mut rng = StdRng::seed_from_u64(7);
        for attempt in 1..=10u32 {
            let full = schedule.delays()[attempt as usize - 1];
            let mut lowest = full;
            let mut highest = Duration::ZERO;
            for _ in 0..2000 {
                let d = schedule.delay_after(attempt, &mut rng).unwrap();
                assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
                lowest = lowest.min(d);
                highest = highest.max(d);
            }
            // Full jitter really spreads: the draws cover most of the interval.
            assert!(
                lowest < full / 2 + full / 10,
                "attempt {attempt} lowest {lowest:?}"
            );
            assert!(
                highest > full - full / 10,
                "attempt {attempt} highest {highest:?}"
            );
        }
        assert_eq!(schedule.delay_after(11, &mut rng), None);
        assert_eq!(schedule.delay_after(0, &mut rng), None);
    }

    #[test]
    fn parse_schedule() {
        assert_eq!(
            RetrySchedule::parse("1, 2,0.5").unwrap().delays(),
            &[
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_millis(500)
            ]
        );
        assert_eq!(RetrySchedule::parse("").unwrap().max_attempts(), 1);
        assert!(RetrySchedule::parse("1,x").is_err());
        assert!(RetrySchedule::parse("0").is_err());
        assert!(RetrySchedule::parse("-3").is_err());
        // Past what a Duration holds: refused as too long, not a panic at start-up.
        let huge = RetrySchedule::parse("30,1e20").unwrap_err();
        assert_eq!(huge.field, "retry_schedule");
        assert!(huge.message.contains("30 days"), "{}", huge.message);
    }
}

/// Renders a delay for people: `15 s`, `2 min`, `1 h`.
pub fn human_delay(delay: Duration) -> String {
    let secs = delay.as_secs_f64();
    let (value, unit) = if secs < 60.0 {
        (secs, "s")
    } else if secs < 3600.0 {
        (secs / 60.0, "min")
    } else {
        (secs / 3600.0, "h")
    };
    let rounded = (value * 10.0).round() / 10.0;
    if rounded.fract() == 0.0 {
        format!("{} {unit}", rounded as u64)
    } else {
        format!("{rounded} {unit}")
    }
}

impl RetrySchedule {
    /// The customer-facing table of docs/RETRIES.md.
    pub fn markdown_table(&self) -> String {
        let mut table = String::from("| after attempt | next attempt in |\n|---|---|\n");
        for (i, delay) in self.0.iter().enumerate() {
            table.push_str(&format!(
                "| {} | {} – {} |\n",
                i + 1,
                human_delay(*delay / 2),
                human_delay(*delay)
            ));
        }
        table
    }
}

#[cfg(test)]
mod docs_tests {
    use super::*;

    fn retries_md() -> String {
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/RETRIES.md"))
            .expect("docs/RETRIES.md")
    }

    #[test]
    fn docs_match_the_defaults() {
        let doc = retries_md();
        let schedule = RetrySchedule::default();
        let table = doc
            .split("<!-- schedule:begin -->\n")
            .nth(1)
            .and_then(|rest| rest.split("<!-- schedule:end -->").next())
            .expect("schedule markers");
        assert_eq!(
            table,
            schedule.markdown_table(),
            "docs/RETRIES.md schedule table is out of date"
        );
        let hours = schedule.total_span().as_secs_f64() / 3600.0;
        let min_hours = hours / 2.0;
        assert!(
            doc.contains(&format!(
                "**{} attempts over up to {:.1} hours** (at least {:.1} hours)",
                schedule.max_attempts(),
                hours,
                min_hours
            )),
            "docs/RETRIES.md attempt count or span is out of date: {} attempts, {hours:.1} h",
            schedule.max_attempts()
        );
        let policy = super::super::outcome::RetryPolicy::default();
        assert_eq!(policy.client_error_statuses, [400, 401, 403, 404, 410]);
        assert!(doc.contains("`400`, `401`, `403`, `404` or `410`, three times"));
        assert_eq!(policy.client_error_limit, 3);
        assert_eq!(policy.max_retry_after, Duration::from_secs(86_400));
        assert!(doc.contains("(up to 24 hours)"));
        let disable_days = crate::config::CoreConfig::default().disable_after.as_secs() / 86_400;
        assert!(
            doc.contains(&format!("have all failed for **{disable_days} days**")),
            "disable threshold out of date"
        );
    }
}
