use serde::Serialize;
use url::Url;

use super::{
    event::EventType,
    ids::{AccountId, EndpointId},
    InvalidField,
};
use crate::{clock::Timestamp, signing::SigningSecret};

pub const DEFAULT_MAX_IN_FLIGHT: u32 = 4;
pub const MAX_MAX_IN_FLIGHT: u32 = 1000;
pub const MAX_URL_LEN: usize = 2048;
pub const MAX_DESCRIPTION_LEN: usize = 1000;
pub const MAX_EVENT_TYPES: usize = 100;

/// A customer URL that is syntactically fit to receive webhooks. Whether its address may be
/// reached is a separate, configurable check (`http::ssrf::AddressPolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointUrl(Url);

impl EndpointUrl {
    pub fn parse(raw: &str) -> Result<Self, InvalidField> {
        let field = "url";
        // Characters as sent, as the API document's `maxLength` counts them.
        if raw.chars().count() > MAX_URL_LEN {
            return Err(InvalidField::new(
                field,
                format!("longer than {MAX_URL_LEN} characters"),
            ));
        }
        let url = Url::parse(raw.trim())
            .map_err(|e| InvalidField::new(field, format!("not a valid URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(InvalidField::new(field, "scheme must be http or https"));
        }
        if url.host().is_none() {
            return Err(InvalidField::new(field, "has no host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(InvalidField::new(field, "must not contain credentials"));
        }
        if url.fragment().is_some() {
            return Err(InvalidField::new(field, "must not contain a #fragment"));
        }
        Ok(Self(url))
    }

    pub fn as_url(&self) -> &Url {
        &self.0
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl Serialize for EndpointUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointStatus {
    Active,
    Disabled,
}

impl EndpointStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Disabled => "disabled",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "active" => Some(Self::Active),
            "disabled" => Some(Self::Disabled),
            _ => None,
        }
    }
}

/// Which event types an endpoint receives: all of them, or those matching one of its
/// patterns. A pattern is an exact type (`invoice.paid`) or a prefix ending in `.*`
/// (`invoice.*`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventTypeFilter(Option<Vec<String>>);

impl EventTypeFilter {
    pub fn all() -> Self {
        Self(None)
    }

    pub fn parse(patterns: Option<&[String]>) -> Result<Self, InvalidField> {
        let Some(patterns) = patterns else {
            return Ok(Self(None));
        };
        let field = "event_types";
        if patterns.is_empty() {
            return Err(InvalidField::new(
                field,
                "must not be empty; omit it or use null to receive every event type",
            ));
        }
        if patterns.len() > MAX_EVENT_TYPES {
            return Err(InvalidField::new(
                field,
                format!("at most {MAX_EVENT_TYPES} entries"),
            ));
        }
        let mut checked = Vec::with_capacity(patterns.len());
        for pattern in patterns {
            let exact = pattern.strip_suffix(".*").unwrap_or(pattern);
            if pattern != "*" {
                EventType::parse(exact)
                    .map_err(|e| InvalidField::new(field, format!("`{pattern}`: {}", e.message)))?;
            }
            if !checked.contains(pattern) {
                checked.push(pattern.clone());
            }
        }
        Ok(Self(Some(checked)))
    }

    pub fn matches(&self, event_type: &EventType) -> bool {
        let Some(patterns) = &self.0 else {
            return true;
        };
        let ty = event_type.as_str();
        patterns.iter().any(|pattern| {
            if pattern == "*" {
                return true;
            }
            match pattern.strip_suffix(".*") {
                Some(prefix) => {
                    ty.len() > prefix.len()
                        && ty.starts_with(prefix)
                        && ty.as_bytes()[prefix.len()] == b'.'
                }
                None => pattern == ty,
            }
        })
    }

    pub fn patterns(&self) -> Option<&[String]> {
        self.0.as_deref()
    }
}

/// A secret that keeps signing for a while after a rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetiringSecret {
    pub secret: SigningSecret,
    pub until: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub id: EndpointId,
    pub account_id: AccountId,
    pub url: EndpointUrl,
    pub description: String,
    pub secret: SigningSecret,
    pub retiring_secret: Option<RetiringSecret>,
    pub status: EndpointStatus,
    pub event_types: EventTypeFilter,
    pub max_in_flight: u32,
    /// Requests per second, for customers who ask for a limit.
    pub rate_limit_per_second: Option<u32>,
    /// Sent with every attempt.
    pub headers: super::headers::CustomHeaders,
    pub failing_since: Option<Timestamp>,
    pub disabled_reason: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// What a change to an endpoint was made from. The stores write it only while the endpoint
/// still has this change time and status, so a change read before another one landed (a
/// second API call, a disable) is refused rather than writing the other one's fields back.
/// The failing clock is the sender's, moved at every attempt: it is not compared, and is
/// written only by a change that moved it from the value read (enabling restarts it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EndpointVersion {
    pub updated_at: Timestamp,
    pub status: EndpointStatus,
    pub failing_since: Option<Timestamp>,
}

impl EndpointVersion {
    /// Whether `changed`, made from this version, restarts the failing clock: a change of it,
    /// or an enable, which always writes it (on DynamoDB, that removes the clock a disable
    /// keeps for its index only).
    pub fn moves_failing_clock(&self, changed: &Endpoint) -> bool {
        changed.failing_since != self.failing_since
            || (self.status != EndpointStatus::Active && changed.status == EndpointStatus::Active)
    }
}

impl Endpoint {
    pub fn version(&self) -> EndpointVersion {
        EndpointVersion {
            updated_at: self.updated_at,
            status: self.status,
            failing_since: self.failing_since,
        }
    }

    /// Marks a change made at `now`, at least a millisecond (the stores' precision) after
    /// the version it was made from, so that two changes in one millisecond differ.
    pub fn touch(&mut self, now: Timestamp) {
        let after = crate::clock::to_millis(self.updated_at).saturating_add(1);
        self.updated_at = if crate::clock::to_millis(now) >= after {
            now
        } else {
            crate::clock::from_millis(after)
        };
    }

    /// Secrets that sign a message sent at `now`: the current one, and the retiring one
    /// while its grace period lasts.
    pub fn signing_secrets(&self, now: Timestamp) -> Vec<&SigningSecret> {
        let mut secrets = vec![&self.secret];
        if let Some(retiring) = &self.retiring_secret {
            if retiring.until > now {
                secrets.push(&retiring.secret);
            }
        }
        secrets
    }

    /// Whether `event` is sent to this endpoint: it is active, subscribes to the event's
    /// type, and existed when the event was published (within [`CLOCK_ALLOWANCE`]). An
    /// endpoint created later does not get it, however late the event's fan-out runs (after
    /// a crash, in parts on AWS), so who gets an event does not hang on when its fan-out ran
    /// or on endpoint ids.
    pub fn receives(&self, event: &super::Event) -> bool {
        self.status == EndpointStatus::Active
            && self.subscribed_at(&event.event_type, event.created_at)
    }

    /// Whether the endpoint, whatever its status, subscribes to `event_type` and existed
    /// when an event of it was published at `published_at`: created less than
    /// [`CLOCK_ALLOWANCE`] after it (to the millisecond, as the stores keep times).
    pub fn subscribed_at(&self, event_type: &EventType, published_at: Timestamp) -> bool {
        let allowance = i64::try_from(CLOCK_ALLOWANCE.as_millis()).unwrap_or(i64::MAX);
        self.event_types.matches(event_type)
            && crate::clock::to_millis(self.created_at)
                < crate::clock::to_millis(published_at).saturating_add(allowance)
    }
}

/// How much later than an event an endpoint may have been created and still get it. On AWS
/// the two times come from different clocks (two API functions; the platform's own for an
/// outbox event): an endpoint created just before a publish must not miss it because the
/// publishing clock runs a few milliseconds behind. The price is that an endpoint created
/// less than a second after an event gets it.
pub const CLOCK_ALLOWANCE: std::time::Duration = std::time::Duration::from_secs(1);

/// `endpoints` by id, to match each of many deliveries to its endpoint in one pass: an
/// account may have 100,000 endpoints, and a search of the list per delivery is quadratic.
pub fn by_id(endpoints: &[Endpoint]) -> std::collections::HashMap<&EndpointId, &Endpoint> {
    endpoints.iter().map(|e| (&e.id, e)).collect()
}

pub fn parse_max_in_flight(raw: Option<u32>) -> Result<u32, InvalidField> {
    match raw {
        None => Ok(DEFAULT_MAX_IN_FLIGHT),
        Some(n) if (1..=MAX_MAX_IN_FLIGHT).contains(&n) => Ok(n),
        Some(_) => Err(InvalidField::new(
            "max_in_flight",
            format!("must be between 1 and {MAX_MAX_IN_FLIGHT}"),
        )),
    }
}

pub fn parse_rate_limit(raw: Option<u32>) -> Result<Option<u32>, InvalidField> {
    match raw {
        None => Ok(None),
        Some(n) if (1..=100_000).contains(&n) => Ok(Some(n)),
        Some(_) => Err(InvalidField::new(
            "rate_limit_per_second",
            "must be between 1 and 100000",
        )),
    }
}

/// At most [`MAX_DESCRIPTION_LEN`] characters as sent, spaces around it included (the API
/// document's `maxLength`), then trimmed.
pub fn parse_description(raw: Option<&str>) -> Result<String, InvalidField> {
    let raw = raw.unwrap_or("");
    let description = raw.trim();
    if raw.chars().count() > MAX_DESCRIPTION_LEN {
        return Err(InvalidField::new(
            "description",
            format!("at most {MAX_DESCRIPTION_LEN} characters"),
        ));
    }
    Ok(description.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(s: &str) -> EventType {
        EventType::parse(s).unwrap()
    }

    /// The limit is the document's `maxLength`, in characters as sent: 1,000 after a
    /// newline was accepted once trimmed, and 1,000 two-byte letters were refused.
    #[test]
    fn a_description_is_at_most_1000_characters_as_sent() {
        let long = format!("\n{}", "x".repeat(MAX_DESCRIPTION_LEN));
        assert_eq!(
            parse_description(Some(&long))
                .expect_err("1,001 characters")
                .field,
            "description"
        );
        let letters = "é".repeat(MAX_DESCRIPTION_LEN);
        assert_eq!(parse_description(Some(&letters)).unwrap(), letters);
        assert_eq!(parse_description(Some(" ops ")).unwrap(), "ops");
        assert_eq!(parse_description(None).unwrap(), "");
    }

    /// The limit is the document's `maxLength`, in characters as sent: a URL of 2,048,
    /// most of them two-byte letters, was refused as 4,076 bytes.
    #[test]
    fn a_url_is_at_most_2048_characters_as_sent() {
        let start = "https://example.com/";
        let letters = format!("{start}{}", "é".repeat(MAX_URL_LEN - start.len()));
        assert_eq!(letters.chars().count(), MAX_URL_LEN);
        let url = EndpointUrl::parse(&letters).unwrap();
        assert!(
            url.as_str().starts_with("https://example.com/%C3%A9"),
            "{url:?}"
        );
        let over = format!("{letters}x");
        let error = EndpointUrl::parse(&over).expect_err("2,049 characters");
        assert_eq!(error.field, "url");
        assert_eq!(error.message, "longer than 2048 characters");
    }

    #[test]
    fn url_rules() {
        assert!(EndpointUrl::parse("https://example.com/hooks?x=1").is_ok());
        assert!(EndpointUrl::parse("http://127.0.0.1:8080/").is_ok());
        for bad in [
            "",
            "example.com",
            "ftp://example.com",
            "https://user:pw@example.com/",
            "http://",
            "https://example.com/#frag",
            "javascript:alert(1)",
        ] {
            let err = EndpointUrl::parse(bad).unwrap_err();
            assert_eq!(err.field, "url", "{bad}");
        }
    }

    #[test]
    fn filter_matching() {
        let all = EventTypeFilter::parse(None).unwrap();
        assert!(all.matches(&ty("invoice.paid")));
        let some =
            EventTypeFilter::parse(Some(&["invoice.*".into(), "user.created".into()])).unwrap();
        assert!(some.matches(&ty("invoice.paid")));
        assert!(some.matches(&ty("invoice.refund.created")));
        assert!(!some.matches(&ty("invoice")));
        assert!(!some.matches(&ty("invoices.paid")));
        assert!(some.matches(&ty("user.created")));
        assert!(!some.matches(&ty("user.deleted")));
        assert!(EventTypeFilter::parse(Some(&[])).is_err());
        assert!(EventTypeFilter::parse(Some(&["bad type".into()])).is_err());
        assert!(EventTypeFilter::parse(Some(&["*".into()]))
            .unwrap()
            .matches(&ty("a.b")));
    }

    #[test]
    fn in_flight_bounds() {
        assert_eq!(parse_max_in_flight(None).unwrap(), 4);
        assert!(parse_max_in_flight(Some(0)).is_err());
        assert_eq!(parse_max_in_flight(Some(16)).unwrap(), 16);
    }
}
