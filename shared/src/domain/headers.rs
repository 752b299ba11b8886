//! Custom headers an endpoint's owner has every attempt carry (an `Authorization` their
//! receiver checks, a tenant id): names checked once, secret values never shown again.

use std::collections::BTreeMap;

use serde_json::Value;

use super::InvalidField;

/// Headers one endpoint may have.
pub const MAX_HEADERS: usize = 20;
/// The longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024;
const MAX_NAME_BYTES: usize = 64;

/// Names Hooklane sets itself or that belong to one connection, not to a message.
const RESERVED: &[&str] = &[
    "connection",
    "host",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
];

/// Names whose values are always secret, whatever the request said.
const ALWAYS_SECRET: &[&str] = &["authorization"];

/// One header's value; a secret one is encrypted at rest and never returned by the API.
#[derive(Clone, PartialEq, Eq)]
pub struct CustomHeader {
    pub value: String,
    pub secret: bool,
}

impl std::fmt::Debug for CustomHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = if self.secret { "(secret)" } else { &self.value };
        write!(f, "{value:?}")
    }
}

/// An endpoint's custom headers, by lower-case name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CustomHeaders(BTreeMap<String, CustomHeader>);

impl CustomHeaders {
    /// The headers a create request gives: an object of name → value, where a value is a
    /// string or `{"value": "…", "secret": true}`. `null` or absent: none.
    pub fn parse(raw: Option<&Value>) -> Result<Self, InvalidField> {
        Self::default().patched(raw)
    }

    /// These headers changed by a JSON merge patch (RFC 7396): a name with a value sets it,
    /// a name with `null` removes it, names left out stay (so a secret value need not be
    /// sent again). `null` or absent: unchanged.
    pub fn patched(&self, patch: Option<&Value>) -> Result<Self, InvalidField> {
        let entries = match patch {
            None | Some(Value::Null) => return Ok(self.clone()),
            Some(Value::Object(entries)) => entries,
            Some(_) => {
                return Err(InvalidField::new(
                    "headers",
                    "an object of header name to value",
                ))
            }
        };
        let mut headers = self.0.clone();
        for (raw_name, raw_value) in entries {
            let field = format!("headers.{raw_name}");
            match raw_value {
                // A header may always be removed, even one refused today (written before
                // its name was): only a name that cannot be stored is refused.
                Value::Null => {
                    headers.remove(&raw_name.to_ascii_lowercase());
                }
                value => {
                    let name = header_name(raw_name)?;
                    let header = header_value(&name, value, field)?;
                    headers.insert(name, header);
                }
            }
        }
        if headers.len() > MAX_HEADERS {
            return Err(InvalidField::new(
                "headers",
                format!("at most {MAX_HEADERS} headers"),
            ));
        }
        Ok(Self(headers))
    }

    /// Headers as stored, trusted (already checked when they were written).
    pub fn from_trusted(headers: impl IntoIterator<Item = (String, CustomHeader)>) -> Self {
        Self(headers.into_iter().collect())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &CustomHeader)> {
        self.0.iter().map(|(name, header)| (name.as_str(), header))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn header_name(raw: &str) -> Result<String, InvalidField> {
    let field = || format!("headers.{raw}");
    let is_token_char = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if raw.is_empty() || raw.len() > MAX_NAME_BYTES || !raw.chars().all(is_token_char) {
        return Err(InvalidField::new(
            field(),
            format!("a header name is 1 to {MAX_NAME_BYTES} letters, digits or !#$%&'*+-.^_`|~"),
        ));
    }
    let name = raw.to_ascii_lowercase();
    // `content-*` describe the body, which is Hooklane's (JSON, as it sends it).
    if RESERVED.contains(&name.as_str())
        || name.starts_with("webhook-")
        || name.starts_with("content-")
    {
        return Err(InvalidField::new(
            field(),
            format!(
                "`{name}` is set by Hooklane or by the connection; it cannot be a custom header"
            ),
        ));
    }
    Ok(name)
}

fn header_value(name: &str, raw: &Value, field: String) -> Result<CustomHeader, InvalidField> {
    let (value, secret) = match raw {
        Value::String(value) => (value.as_str(), false),
        Value::Object(fields) => {
            if let Some(unknown) = fields.keys().find(|k| *k != "value" && *k != "secret") {
                return Err(InvalidField::new(
                    format!("{field}.{unknown}"),
                    "a header takes `value` and `secret`",
                ));
            }
            let value = fields.get("value").and_then(Value::as_str).ok_or_else(|| {
                InvalidField::new(format!("{field}.value"), "the header's value, a string")
            })?;
            let secret = match fields.get("secret") {
                None => false,
                Some(Value::Bool(secret)) => *secret,
                Some(_) => {
                    return Err(InvalidField::new(
                        format!("{field}.secret"),
                        "true or false",
                    ))
                }
            };
            (value, secret)
        }
        _ => {
            return Err(InvalidField::new(
                field,
                "a string, `{\"value\": …, \"secret\": true}`, or null to remove it",
            ))
        }
    };
    let printable = |c: char| c == '\t' || (' '..='~').contains(&c);
    if value.is_empty() || value.len() > MAX_VALUE_BYTES || !value.chars().all(printable) {
        return Err(InvalidField::new(
            field,
            format!(
                "a value is 1 to {MAX_VALUE_BYTES} printable ASCII characters (no line breaks)"
            ),
        ));
    }
    Ok(CustomHeader {
        value: value.to_owned(),
        secret: secret || ALWAYS_SECRET.contains(&name),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field_of(raw: Value) -> String {
        CustomHeaders::parse(Some(&raw))
            .unwrap_err()
            .field
            .into_owned()
    }

    #[test]
    fn names_are_lower_cased_and_authorization_is_always_secret() {
        let headers = CustomHeaders::parse(Some(&json!({
            "X-Tenant": "t_1",
            "Authorization": "Bearer abc",
            "X-Api-Key": {"value": "k", "secret": true},
        })))
        .unwrap();
        let listed: Vec<_> = headers
            .iter()
            .map(|(n, h)| (n.to_owned(), h.value.clone(), h.secret))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("authorization".into(), "Bearer abc".into(), true),
                ("x-api-key".into(), "k".into(), true),
                ("x-tenant".into(), "t_1".into(), false),
            ]
        );
        assert!(!format!("{headers:?}").contains("Bearer"));
    }

    #[test]
    fn a_patch_sets_removes_and_keeps() {
        let headers =
            CustomHeaders::parse(Some(&json!({"x-a": "1", "x-b": "2", "authorization": "s"})))
                .unwrap();
        let patched = headers
            .patched(Some(&json!({"x-a": "one", "x-b": null})))
            .unwrap();
        let names: Vec<_> = patched.iter().map(|(n, h)| (n, h.value.as_str())).collect();
        assert_eq!(names, vec![("authorization", "s"), ("x-a", "one")]);
        assert_eq!(headers.patched(None).unwrap(), headers);
    }

    /// A header stored before its name was refused (`content-encoding`) can still be removed.
    #[test]
    fn a_header_refused_since_it_was_stored_can_be_removed() {
        let stored = CustomHeaders::from_trusted([(
            "content-encoding".to_owned(),
            CustomHeader {
                value: "gzip".into(),
                secret: false,
            },
        )]);
        let patched = stored
            .patched(Some(&json!({"Content-Encoding": null})))
            .unwrap();
        assert_eq!(patched, CustomHeaders::default());
        assert!(stored
            .patched(Some(&json!({"content-encoding": "br"})))
            .is_err());
    }

    #[test]
    fn reserved_names_and_bad_values_are_refused_naming_the_header() {
        for name in [
            "Host",
            "content-length",
            "Connection",
            "webhook-id",
            "Webhook-Signature",
            // The body is Hooklane's: a header describing it otherwise (`gzip`) would make
            // every receiver misread it.
            "Content-Encoding",
            "content-language",
        ] {
            assert_eq!(field_of(json!({name: "x"})), format!("headers.{name}"));
        }
        assert_eq!(field_of(json!({"x a": "x"})), "headers.x a");
        assert_eq!(field_of(json!({"x-a": "line\nbreak"})), "headers.x-a");
        assert_eq!(field_of(json!({"x-a": ""})), "headers.x-a");
        assert_eq!(field_of(json!({"x-a": "é"})), "headers.x-a");
        assert_eq!(field_of(json!({"x-a": 5})), "headers.x-a");
        assert_eq!(field_of(json!({"x-a": "v".repeat(1025)})), "headers.x-a");
        assert_eq!(
            field_of(json!({"x-a": {"value": "v", "secret": "yes"}})),
            "headers.x-a.secret"
        );
        assert_eq!(
            field_of(json!({"x-a": {"secret": true}})),
            "headers.x-a.value"
        );
        assert_eq!(
            field_of(json!({"x-a": {"value": "v", "other": 1}})),
            "headers.x-a.other"
        );
        assert_eq!(field_of(json!(["x-a"])), "headers");
        let many: serde_json::Map<String, Value> =
            (0..21).map(|i| (format!("x-{i}"), json!("v"))).collect();
        assert_eq!(field_of(Value::Object(many)), "headers");
    }
}
