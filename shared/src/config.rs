//! Configuration of the engine's rules; where it comes from (file, environment) is the binary's business.

use std::time::Duration;

use crate::{
    domain::{AccountId, InvalidField, RetryPolicy, RetrySchedule},
    http::{AddressPolicy, SenderConfig},
};

/// The engine's rules as settings, `(name in a config file, environment variable)`. Both
/// shapes read them with [`CoreConfig::with_settings`]: the same names mean the same there.
pub const CORE_SETTINGS: [(&str, &str); 6] = [
    ("allow_cidrs", "HOOKLANE_ALLOW_CIDRS"),
    ("https_only", "HOOKLANE_HTTPS_ONLY"),
    ("retry_schedule", "HOOKLANE_RETRY_SCHEDULE"),
    ("disable_after", "HOOKLANE_DISABLE_AFTER"),
    ("operations_account", "HOOKLANE_OPERATIONS_ACCOUNT"),
    ("retention", "HOOKLANE_RETENTION"),
];

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
    /// How long ended deliveries, their attempts and their events are kept. Pending work
    /// is kept however old it is.
    pub retention: Duration,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            disable_after: Duration::from_secs(3 * 86_400),
            sender: SenderConfig::default(),
            operations_account: None,
            max_payload_bytes: crate::domain::event::MAX_PAYLOAD_BYTES,
            disable_on_attempt: true,
            retention: Duration::from_secs(30 * 86_400),
        }
    }
}

impl CoreConfig {
    pub fn address_policy(&self) -> &AddressPolicy {
        &self.sender.policy
    }

    /// This configuration with the [`CORE_SETTINGS`] that `get` has (asked by variable
    /// name; blank counts as unset). An invalid value is an error naming its variable.
    pub fn with_settings<'a>(
        mut self,
        get: impl Fn(&'static str) -> Option<&'a str>,
    ) -> Result<Self, InvalidField> {
        let get = |name: &'static str| get(name).map(str::trim).filter(|v| !v.is_empty());
        let mut allow = self.sender.policy.allow_list().to_vec();
        if let Some(raw) = get("HOOKLANE_ALLOW_CIDRS") {
            allow = raw
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(|cidr| {
                    cidr.parse::<ipnet::IpNet>()
                        .or_else(|_| cidr.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                        .map_err(|_| {
                            InvalidField::new(
                                "HOOKLANE_ALLOW_CIDRS",
                                format!("`{cidr}` is not a CIDR like 127.0.0.0/8"),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
        }
        let https_only = match get("HOOKLANE_HTTPS_ONLY") {
            None => self.sender.policy.https_only(),
            Some("false") | Some("0") => false,
            Some("true") | Some("1") => true,
            Some(other) => {
                return Err(InvalidField::new(
                    "HOOKLANE_HTTPS_ONLY",
                    format!("`{other}` is not true or false"),
                ))
            }
        };
        self.sender.policy = AddressPolicy::new(allow, https_only);
        if let Some(raw) = get("HOOKLANE_RETRY_SCHEDULE") {
            self.retry.schedule = RetrySchedule::parse(raw)
                .map_err(|e| InvalidField::new("HOOKLANE_RETRY_SCHEDULE", e.message))?;
        }
        if let Some(raw) = get("HOOKLANE_DISABLE_AFTER") {
            self.disable_after = parse_duration(raw, "HOOKLANE_DISABLE_AFTER")?;
        }
        if let Some(raw) = get("HOOKLANE_RETENTION") {
            self.retention = parse_duration(raw, "HOOKLANE_RETENTION")?;
            if self.retention.is_zero() {
                return Err(InvalidField::new(
                    "HOOKLANE_RETENTION",
                    "must be above 0 (it is how long ended deliveries are kept)",
                ));
            }
        }
        if let Some(raw) = get("HOOKLANE_OPERATIONS_ACCOUNT") {
            self.operations_account = Some(
                AccountId::parse(raw)
                    .map_err(|e| InvalidField::new("HOOKLANE_OPERATIONS_ACCOUNT", e.message))?,
            );
        }
        Ok(self)
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
    fn the_core_settings_parse_once_for_both_shapes() {
        let vars = std::collections::HashMap::from([
            ("HOOKLANE_HTTPS_ONLY", "true"),
            ("HOOKLANE_ALLOW_CIDRS", "127.0.0.0/8, ::1"),
            ("HOOKLANE_DISABLE_AFTER", " 2h "),
            ("HOOKLANE_RETRY_SCHEDULE", ""),
            ("HOOKLANE_RETENTION", "7d"),
        ]);
        let core = CoreConfig::default()
            .with_settings(|name| vars.get(name).copied())
            .unwrap();
        assert!(core.sender.policy.https_only());
        assert_eq!(core.sender.policy.allow_list().len(), 2);
        assert_eq!(core.disable_after, Duration::from_secs(7200));
        assert_eq!(core.retention, Duration::from_secs(7 * 86_400));
        assert_eq!(
            core.retry.schedule,
            RetrySchedule::default(),
            "blank is unset"
        );
        for (variable, bad) in [
            ("HOOKLANE_HTTPS_ONLY", "yes"),
            ("HOOKLANE_ALLOW_CIDRS", "10.0.0.0/99"),
            ("HOOKLANE_DISABLE_AFTER", "soon"),
            ("HOOKLANE_RETRY_SCHEDULE", "x"),
            ("HOOKLANE_OPERATIONS_ACCOUNT", "not an id!"),
            ("HOOKLANE_RETENTION", "0"),
            ("HOOKLANE_RETENTION", "forever"),
        ] {
            let err = CoreConfig::default()
                .with_settings(|name| (name == variable).then_some(bad))
                .unwrap_err();
            assert_eq!(err.field, variable, "{}", err.message);
        }
    }

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
