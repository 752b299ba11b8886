//! Configuration of the engine's rules; where it comes from (file, environment) is the binary's business.

use std::time::Duration;

use crate::{
    domain::{rate::PublishRate, AccountId, InvalidField, RetryPolicy, RetrySchedule},
    http::{AddressPolicy, SenderConfig},
    secrets::{parse_key, SecretsKeys},
};

/// The engine's rules as settings, `(name in a config file, environment variable)`. Both
/// shapes read them with [`CoreConfig::with_settings`]: the same names mean the same there.
pub const CORE_SETTINGS: [(&str, &str); 14] = [
    ("allow_cidrs", "HOOKLANE_ALLOW_CIDRS"),
    ("https_only", "HOOKLANE_HTTPS_ONLY"),
    ("retry_schedule", "HOOKLANE_RETRY_SCHEDULE"),
    ("disable_after", "HOOKLANE_DISABLE_AFTER"),
    ("operations_account", "HOOKLANE_OPERATIONS_ACCOUNT"),
    ("retention", "HOOKLANE_RETENTION"),
    ("max_payload", "HOOKLANE_MAX_PAYLOAD"),
    ("publish_rate", "HOOKLANE_PUBLISH_RATE"),
    ("publish_burst", "HOOKLANE_PUBLISH_BURST"),
    ("secrets_key", "HOOKLANE_SECRETS_KEY"),
    ("secrets_key_previous", "HOOKLANE_SECRETS_KEY_PREVIOUS"),
    ("public_url", "HOOKLANE_PUBLIC_URL"),
    ("strict_event_types", "HOOKLANE_STRICT_EVENT_TYPES"),
    ("max_endpoints", "HOOKLANE_MAX_ENDPOINTS"),
];

/// Endpoints an account may have by default (`HOOKLANE_MAX_ENDPOINTS`): every event goes to
/// each of them, and every publish reads them all.
pub const DEFAULT_MAX_ENDPOINTS: usize = 100;

/// The most `HOOKLANE_MAX_PAYLOAD` may be: a request body, up to [`JSON_ESCAPE_FACTOR`] times
/// it, is held in memory whole.
pub const MAX_PAYLOAD_CEILING: usize = 16 * 1024 * 1024;

/// The most bytes a client's JSON may spend on one byte of the compact webhook body: a
/// character written `\u0061` is 6 bytes for 1. Python's `json.dumps` (and so `requests`)
/// escapes all text past ASCII by default: `日` (3 bytes of UTF-8) as 6, an emoji (4) as 12.
pub const JSON_ESCAPE_FACTOR: usize = 6;

/// [`CoreConfig::batch_body_limit`] for the usual event sizes.
pub const BATCH_BODY_BYTES: usize = 3_700_000;

#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub retry: RetryPolicy,
    /// How long an endpoint may fail before it is disabled.
    pub disable_after: Duration,
    pub sender: SenderConfig,
    /// The account whose endpoints receive operational events such as `endpoint.disabled`.
    pub operations_account: Option<AccountId>,
    /// The largest webhook body an event may have (`HOOKLANE_MAX_PAYLOAD`), checked on the
    /// event's compact body; request bodies are cut off at [`CoreConfig::body_limit`].
    pub max_payload_bytes: usize,
    /// The publish rate limit of accounts without their own (`HOOKLANE_PUBLISH_RATE`,
    /// `HOOKLANE_PUBLISH_BURST`); none by default.
    pub publish_rate: Option<PublishRate>,
    /// An attempt that finds its endpoint failing for longer than `disable_after` disables
    /// it there and then (embedded). Off on AWS: abandoning a whole backlog does not fit in
    /// a sender invocation, and the health function does it.
    pub disable_on_attempt: bool,
    /// How long ended deliveries, their attempts and their events are kept. Pending work
    /// is kept however old it is.
    pub retention: Duration,
    /// The keys endpoint signing secrets are sealed with at rest (`HOOKLANE_SECRETS_KEY`,
    /// `HOOKLANE_SECRETS_KEY_PREVIOUS`; see [`crate::secrets`]).
    pub secrets: SecretsKeys,
    /// Where people reach this deployment's API and page (`HOOKLANE_PUBLIC_URL`), for the
    /// links it hands out; without it a portal link is built from the request's `Host`.
    pub public_url: Option<url::Url>,
    /// Publishing a type the event-type catalog does not have is refused
    /// (`HOOKLANE_STRICT_EVENT_TYPES`); off by default.
    pub strict_event_types: bool,
    /// Endpoints (not deleted) one account may have (`HOOKLANE_MAX_ENDPOINTS`).
    pub max_endpoints: usize,
    /// An event to more endpoints than this is fanned out this many at a time, each part
    /// written, queued and recorded before the next, so that a fan-out cut short goes on
    /// where it stopped ([`crate::service::fan_out`]).
    pub fan_out_part: usize,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            disable_after: Duration::from_secs(3 * 86_400),
            sender: SenderConfig::default(),
            operations_account: None,
            max_payload_bytes: crate::domain::event::MAX_PAYLOAD_BYTES,
            publish_rate: None,
            disable_on_attempt: true,
            retention: Duration::from_secs(30 * 86_400),
            secrets: SecretsKeys::default(),
            public_url: None,
            strict_event_types: false,
            max_endpoints: DEFAULT_MAX_ENDPOINTS,
            fan_out_part: crate::service::fan_out::FAN_OUT_PART,
        }
    }
}

impl CoreConfig {
    pub fn address_policy(&self) -> &AddressPolicy {
        &self.sender.policy
    }

    /// The largest request body a publish (or an endpoint's test event) may send: a webhook
    /// body at the limit however its text is escaped ([`JSON_ESCAPE_FACTOR`]), plus room for
    /// the event's id and type and for whitespace the compact body drops. The limit that
    /// matters, `max_payload_bytes`, is checked on the event as re-written. On AWS (350 KiB
    /// at most) this is 2.2 MB, within the api function's 6 MB request.
    pub fn body_limit(&self) -> usize {
        JSON_ESCAPE_FACTOR * self.max_payload_bytes + 16 * 1024
    }

    /// The largest request body of the routes that carry no event data (endpoints, keys,
    /// tokens, replays…): the payload limit and 16 KiB, far more than any of them needs. Not
    /// scaled for escaping: a body is held and parsed whole, and these routes are open to
    /// account tokens and portal links.
    pub fn other_body_limit(&self) -> usize {
        self.max_payload_bytes + 16 * 1024
    }

    /// The largest body of a batch publish: [`MAX_BATCH`](crate::service::publish::MAX_BATCH)
    /// events at most, together within 3.7 MB as sent, so that on AWS the batch's event
    /// items fit one DynamoDB transaction (4 MB, with the items' other attributes), and never
    /// less than what one event may be. Not scaled for escaping as one event is: on AWS the
    /// api function takes 6 MB at most, and the stored items must still fit the transaction.
    pub fn batch_body_limit(&self) -> usize {
        BATCH_BODY_BYTES.max(self.body_limit())
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
            Some(raw) => parse_bool("HOOKLANE_HTTPS_ONLY", raw)?,
        };
        self.sender.policy = AddressPolicy::new(allow, https_only);
        if let Some(raw) = get("HOOKLANE_STRICT_EVENT_TYPES") {
            self.strict_event_types = parse_bool("HOOKLANE_STRICT_EVENT_TYPES", raw)?;
        }
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
        if let Some(raw) = get("HOOKLANE_MAX_PAYLOAD") {
            self.max_payload_bytes = parse_size(raw, "HOOKLANE_MAX_PAYLOAD")?;
            if !(1024..=MAX_PAYLOAD_CEILING).contains(&self.max_payload_bytes) {
                return Err(InvalidField::new(
                    "HOOKLANE_MAX_PAYLOAD",
                    format!("must be from 1KiB to {}MiB", MAX_PAYLOAD_CEILING >> 20),
                ));
            }
        }
        if let Some(raw) = get("HOOKLANE_MAX_ENDPOINTS") {
            self.max_endpoints = raw
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=100_000).contains(n))
                .ok_or_else(|| {
                    InvalidField::new(
                        "HOOKLANE_MAX_ENDPOINTS",
                        format!("`{raw}` is not a whole number from 1 to 100000"),
                    )
                })?;
        }
        let burst = get("HOOKLANE_PUBLISH_BURST")
            .map(|raw| parse_count(raw, "HOOKLANE_PUBLISH_BURST"))
            .transpose()?;
        match get("HOOKLANE_PUBLISH_RATE") {
            Some(raw) => {
                let per_second = parse_count(raw, "HOOKLANE_PUBLISH_RATE")?;
                let rate = PublishRate::new(per_second, burst, "HOOKLANE_PUBLISH_RATE")?;
                self.publish_rate = Some(rate);
            }
            None if burst.is_some() => {
                return Err(InvalidField::new(
                    "HOOKLANE_PUBLISH_BURST",
                    "is set without HOOKLANE_PUBLISH_RATE",
                ))
            }
            None => {}
        }
        if let Some(raw) = get("HOOKLANE_SECRETS_KEY") {
            self.secrets.current = Some(parse_key(raw, "HOOKLANE_SECRETS_KEY")?);
        }
        if let Some(raw) = get("HOOKLANE_SECRETS_KEY_PREVIOUS") {
            let previous = parse_key(raw, "HOOKLANE_SECRETS_KEY_PREVIOUS")?;
            if self.secrets.current.is_none() {
                return Err(InvalidField::new(
                    "HOOKLANE_SECRETS_KEY_PREVIOUS",
                    "is set without HOOKLANE_SECRETS_KEY (the key that replaces it)",
                ));
            }
            self.secrets.previous = Some(previous);
        }
        if let Some(raw) = get("HOOKLANE_PUBLIC_URL") {
            self.public_url = Some(parse_public_url(raw)?);
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

/// An `http(s)://` address without query or fragment; links are made by appending to it.
fn parse_bool(variable: &'static str, raw: &str) -> Result<bool, InvalidField> {
    match raw {
        "false" | "0" => Ok(false),
        "true" | "1" => Ok(true),
        other => Err(InvalidField::new(
            variable,
            format!("`{other}` is not true or false"),
        )),
    }
}

fn parse_public_url(raw: &str) -> Result<url::Url, InvalidField> {
    let invalid = || {
        InvalidField::new(
            "HOOKLANE_PUBLIC_URL",
            format!("`{raw}` is not an http(s) address like https://hooks.example.com"),
        )
    };
    let url = url::Url::parse(raw).map_err(|_| invalid())?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host_str().is_none()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(invalid());
    }
    Ok(url)
}

/// Parses a whole number of events (a rate or a burst).
fn parse_count(raw: &str, field: &'static str) -> Result<u32, InvalidField> {
    raw.trim()
        .strip_suffix("/s")
        .unwrap_or(raw.trim())
        .parse()
        .map_err(|_| InvalidField::new(field, format!("`{raw}` is not a whole number of events")))
}

/// Parses a size: a number of bytes, or with `KiB` or `MiB` after it.
pub fn parse_size(raw: &str, field: &'static str) -> Result<usize, InvalidField> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
    let (number, unit) = raw.split_at(split);
    let unit = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        other => {
            return Err(InvalidField::new(
                field,
                format!("unknown unit `{other}` (use bytes, KiB or MiB, as in 256KiB)"),
            ))
        }
    };
    number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| InvalidField::new(field, format!("`{raw}` is not a size like 256KiB")))
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
        let key = "ab".repeat(32);
        let previous = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=".to_string();
        let vars = std::collections::HashMap::from([
            ("HOOKLANE_HTTPS_ONLY", "true"),
            ("HOOKLANE_ALLOW_CIDRS", "127.0.0.0/8, ::1"),
            ("HOOKLANE_DISABLE_AFTER", " 2h "),
            ("HOOKLANE_RETRY_SCHEDULE", ""),
            ("HOOKLANE_RETENTION", "7d"),
            ("HOOKLANE_MAX_PAYLOAD", "64KiB"),
            ("HOOKLANE_PUBLISH_RATE", "50"),
            ("HOOKLANE_PUBLISH_BURST", "200"),
            ("HOOKLANE_SECRETS_KEY", key.as_str()),
            ("HOOKLANE_SECRETS_KEY_PREVIOUS", previous.as_str()),
            ("HOOKLANE_PUBLIC_URL", "https://hooks.example.com/base/"),
        ]);
        let core = CoreConfig::default()
            .with_settings(|name| vars.get(name).copied())
            .unwrap();
        assert!(core.sender.policy.https_only());
        assert_eq!(core.sender.policy.allow_list().len(), 2);
        assert_eq!(core.disable_after, Duration::from_secs(7200));
        assert_eq!(core.retention, Duration::from_secs(7 * 86_400));
        assert_eq!(core.max_payload_bytes, 64 * 1024);
        assert_eq!(core.secrets.current, Some([0xab; 32]));
        assert_eq!(core.secrets.previous, Some([1; 32]));
        assert!(!format!("{core:?}").contains(&key), "no key in Debug");
        assert_eq!(
            core.public_url.as_ref().map(url::Url::as_str),
            Some("https://hooks.example.com/base/")
        );
        assert_eq!(
            core.publish_rate,
            Some(PublishRate {
                per_second: 50,
                burst: 200
            })
        );
        let defaults = CoreConfig::default().with_settings(|_| None).unwrap();
        assert_eq!(defaults.max_payload_bytes, 256 * 1024);
        assert_eq!(
            defaults.publish_rate, None,
            "no publish limit unless configured"
        );
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
            ("HOOKLANE_MAX_PAYLOAD", "lots"),
            ("HOOKLANE_MAX_PAYLOAD", "1GiB"),
            ("HOOKLANE_MAX_PAYLOAD", "100"),
            ("HOOKLANE_MAX_PAYLOAD", "64MiB"),
            ("HOOKLANE_PUBLISH_RATE", "fast"),
            ("HOOKLANE_PUBLISH_RATE", "0"),
            ("HOOKLANE_PUBLISH_BURST", "10"),
            ("HOOKLANE_SECRETS_KEY", "letmein"),
            ("HOOKLANE_SECRETS_KEY", "abab"),
            ("HOOKLANE_SECRETS_KEY_PREVIOUS", "letmein"),
            ("HOOKLANE_SECRETS_KEY_PREVIOUS", key.as_str()),
            ("HOOKLANE_PUBLIC_URL", "hooks.example.com"),
            ("HOOKLANE_PUBLIC_URL", "ftp://hooks.example.com"),
            ("HOOKLANE_PUBLIC_URL", "https://hooks.example.com/#x"),
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
