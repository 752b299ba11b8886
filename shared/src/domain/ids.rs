use std::fmt;

use serde::Serialize;

use super::InvalidField;

const MAX_ID_LEN: usize = 128;

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')
}

macro_rules! string_id {
    ($name:ident, $prefix:literal, $field:literal) => {
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// A new time-ordered id with the type's prefix.
            pub fn generate() -> Self {
                Self(format!("{}_{}", $prefix, uuid::Uuid::now_v7().simple()))
            }

            /// Parses an id given from outside: 1 to 128 characters of `A-Z a-z 0-9 _ - . :`,
            /// not `.` or `..`.
            pub fn parse(raw: &str) -> Result<Self, InvalidField> {
                if raw.is_empty() || raw.len() > MAX_ID_LEN {
                    return Err(InvalidField::new(
                        $field,
                        format!("must be 1 to {MAX_ID_LEN} characters"),
                    ));
                }
                if !raw.chars().all(is_id_char) {
                    return Err(InvalidField::new(
                        $field,
                        "may only contain letters, digits and _ - . :",
                    ));
                }
                // In a URL, `.` and `..` are steps of the path, not a segment of it.
                if raw == "." || raw == ".." {
                    return Err(InvalidField::new(
                        $field,
                        "may not be `.` or `..`, which a URL reads as a step of its path",
                    ));
                }
                Ok(Self(raw.to_owned()))
            }

            /// For values read back from our own storage, which were parsed on the way in.
            pub fn from_trusted(raw: String) -> Self {
                Self(raw)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(AccountId, "acc", "id");
string_id!(EndpointId, "ep", "endpoint");
string_id!(EventId, "evt", "id");
string_id!(DeliveryId, "dlv", "delivery");
string_id!(ReplayId, "rpl", "replay");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_carry_their_prefix_and_are_unique() {
        let a = EventId::generate();
        let b = EventId::generate();
        assert!(a.as_str().starts_with("evt_"));
        assert_ne!(a, b);
        assert!(EventId::parse(a.as_str()).is_ok());
    }

    #[test]
    fn ids_from_outside_are_checked() {
        assert!(AccountId::parse("acme-corp_1").is_ok());
        assert!(AccountId::parse("").is_err());
        // A URL reads them as steps of its path: `/v1/accounts/../events/batch`.
        assert!(AccountId::parse(".").is_err() && EventId::parse("..").is_err());
        assert!(AccountId::parse("...").is_ok());
        assert!(AccountId::parse("has space").is_err());
        assert!(AccountId::parse("slash/inside").is_err());
        assert!(AccountId::parse(&"x".repeat(129)).is_err());
        let err = EventId::parse("é").unwrap_err();
        assert_eq!(err.field, "id");
    }
}
