//! Configuration of the engine's rules; where it comes from (file, environment) is the binary's business.

use std::time::Duration;

use crate::{
    domain::{AccountId, InvalidField, RetryPolicy},
    http::{AddressPolicy, SenderConfig},
};

#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub retry: RetryPolicy,
    /// How long an endpoint may fail before it is disabled.
    pub disable_after: Duration,
    pub sender: SenderConfig,
    /// The account whose endpoints receive operational events such as `endpoint.disabled`.
    pub operations_account: Option<AccountId>,
    pub max_payload_bytes: usize,
    /// An attempt that finds its endpoint failing for longer than `disable_after` disables
    /// it there and then (embedded). Off on AWS: abandoning a whole backlog does not fit in
    /// a sender invocation, and the health function does it.
    pub disable_on_attempt: bool,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            disable_after: Duration::from_secs(3 * 86_400),
            sender: SenderConfig::default(),
            operations_account: None,
            max_payload_bytes: 256 * 1024,
            disable_on_attempt: true,
        }
    }
}

impl CoreConfig {
    pub fn address_policy(&self) -> &AddressPolicy {
        &self.sender.policy
    }
}

/// Parses `3d`, `12h`, `30m`, `45s`, `500ms` or a plain number of seconds.
pub fn parse_duration(raw: &str, field: &'static str) -> Result<Duration, InvalidField> {
    let raw = raw.trim();
    let split = raw
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(raw.len());
    let (number, unit) = raw.split_at(split);
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| {
            InvalidField::new(
                field,
                format!("`{raw}` is not a duration like 3d, 12h, 30m, 45s or 500ms"),
            )
        })?;
    let seconds = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86_400.0,
        other => {
            return Err(InvalidField::new(
                field,
                format!("unknown unit `{other}` (use ms, s, m, h or d)"),
            ))
        }
    };
    if seconds > 365.0 * 86_400.0 {
        return Err(InvalidField::new(field, "longer than a year"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("3d", "x").unwrap(),
            Duration::from_secs(259_200)
        );
        assert_eq!(parse_duration("90", "x").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_duration("1.5s", "x").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration("250ms", "x").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_duration("2h", "x").unwrap(),
            Duration::from_secs(7200)
        );
        for bad in ["", "d", "3 weeks", "-1s", "3y", "9999d"] {
            assert!(parse_duration(bad, "x").is_err(), "{bad}");
        }
    }
}
