use serde::Serialize;

use super::{ids::AccountId, InvalidField};
use crate::clock::Timestamp;

/// An e-mail address, checked for shape and for what SES sends to: the mail system is the
/// real judge of the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct EmailAddress(String);

impl EmailAddress {
    pub fn parse(raw: &str) -> Result<Self, InvalidField> {
        let raw = raw.trim();
        // SES refuses a non-ASCII address for good (a domain must be Punycode, a local part
        // 7-bit ASCII): refused here, the owner can correct it, where queued mail to it
        // could only be given up.
        if !raw.is_ascii() {
            return Err(InvalidField::new(
                "owner_email",
                "must be ASCII: write an international domain in its Punycode form \
                 (ops@xn--bcher-kva.example for ops@bücher.example); a local part must be ASCII",
            ));
        }
        let valid = raw.len() <= 254
            && !raw.chars().any(|c| c.is_whitespace() || c.is_control())
            && match raw.split_once('@') {
                Some((local, domain)) => {
                    !local.is_empty()
                        && domain.contains('.')
                        && !domain.starts_with('.')
                        && !domain.ends_with('.')
                        && !domain.contains('@')
                }
                None => false,
            };
        if valid {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidField::new(
                "owner_email",
                "must be an e-mail address like ops@example.com",
            ))
        }
    }

    pub fn from_trusted(raw: String) -> Self {
        Self(raw)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Account {
    pub id: AccountId,
    pub name: String,
    pub owner_email: EmailAddress,
    pub created_at: Timestamp,
    /// This account's publish rate limit, instead of the configured default.
    pub publish_rate_limit: Option<super::rate::PublishRate>,
}

pub const MAX_NAME_LEN: usize = 200;

/// A name as given, at most [`MAX_NAME_LEN`] characters (the API document's `maxLength`,
/// which counts characters, and counts the spaces around it: a longer one is refused
/// before they are trimmed), and not blank.
pub fn parse_name(raw: &str) -> Result<String, InvalidField> {
    let name = raw.trim();
    if name.is_empty() || raw.chars().count() > MAX_NAME_LEN {
        return Err(InvalidField::new(
            "name",
            format!("must be 1 to {MAX_NAME_LEN} characters"),
        ));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit is the document's `maxLength`: characters of the name as sent. A name of 200
    /// after a newline was trimmed to 200 and accepted, and one of 200 two-byte letters was
    /// refused.
    #[test]
    fn a_name_is_at_most_200_characters_as_sent() {
        let trimmed = parse_name(&format!("\n{}", "*".repeat(200)));
        assert_eq!(trimmed.expect_err("201 characters").field, "name");
        assert_eq!(parse_name(&"é".repeat(200)).unwrap().chars().count(), 200);
        assert_eq!(parse_name("  Acme Corp ").unwrap(), "Acme Corp");
        assert!(parse_name(" \t ").is_err(), "blank");
    }

    #[test]
    fn email_shapes() {
        assert!(EmailAddress::parse("ops@example.com").is_ok());
        assert!(EmailAddress::parse(" ops@example.com ").is_ok());
        for bad in [
            "",
            "ops",
            "ops@",
            "@example.com",
            "a@b",
            "a b@example.com",
            "a@@b.com",
            "a@.com",
        ] {
            assert!(EmailAddress::parse(bad).is_err(), "{bad} accepted");
        }
    }

    /// SES sends only to 7-bit ASCII addresses: an owner address it would refuse for good is
    /// refused when it is given, naming the field, and an international domain is accepted
    /// in its Punycode form.
    #[test]
    fn addresses_the_mail_service_cannot_send_to_are_refused() {
        for bad in ["jörg@example.com", "ops@bücher.example", "ops@例え.jp"] {
            let error = EmailAddress::parse(bad).expect_err(bad);
            assert_eq!(error.field, "owner_email");
            assert!(error.message.contains("ASCII"), "{}", error.message);
        }
        assert!(EmailAddress::parse("ops@xn--bcher-kva.example").is_ok());
    }
}
