//! An endpoint's custom headers at rest, one form for both stores: JSON
//! `{"name": {"value": "…", "secret": true}}`, each secret value sealed and bound to its
//! endpoint and header name, so a value moved to another header or endpoint does not open.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{SecretsAccess, SecretsCipher, SecretsError};
use crate::domain::{
    headers::{CustomHeader, CustomHeaders},
    AccountId, EndpointId,
};

#[derive(Serialize, Deserialize)]
struct Stored {
    value: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    secret: bool,
}

type StoredHeaders = BTreeMap<String, Stored>;

/// Binds a sealed header value to its endpoint and name; lengths keep the parts apart.
fn bound_to(account: &AccountId, endpoint: &EndpointId, name: &str) -> Vec<u8> {
    let (a, e) = (account.as_str(), endpoint.as_str());
    format!(
        "hooklane:endpoint-header:{}:{a}:{}:{e}:{name}",
        a.len(),
        e.len()
    )
    .into_bytes()
}

fn parse(stored: &str) -> Result<StoredHeaders, SecretsError> {
    serde_json::from_str(stored).map_err(|_| SecretsError::Malformed("custom headers"))
}

fn write(headers: &StoredHeaders) -> String {
    // A map of strings and booleans always serialises.
    serde_json::to_string(headers).unwrap_or_default()
}

impl SecretsAccess {
    /// The stored form of `headers` (`None` when there are none), secret values sealed.
    /// Without a key no endpoint is written (its signing secret is refused too), so neither
    /// are its headers ([`SecretsError::Withheld`]).
    pub fn seal_headers(
        &self,
        headers: &CustomHeaders,
        account: &AccountId,
        endpoint: &EndpointId,
    ) -> Result<Option<String>, SecretsError> {
        if headers.is_empty() {
            return Ok(None);
        }
        let Self::Keys(cipher) = self else {
            return Err(SecretsError::Withheld);
        };
        let mut stored = StoredHeaders::new();
        for (name, header) in headers.iter() {
            let value = if header.secret {
                cipher.seal_bound(&header.value, &bound_to(account, endpoint, name))?
            } else {
                header.value.clone()
            };
            let secret = header.secret;
            stored.insert(name.to_owned(), Stored { value, secret });
        }
        Ok(Some(write(&stored)))
    }

    /// The headers in a stored form, secret values opened; without a key they read as empty.
    pub fn open_headers(
        &self,
        stored: Option<&str>,
        account: &AccountId,
        endpoint: &EndpointId,
    ) -> Result<CustomHeaders, SecretsError> {
        let Some(stored) = stored else {
            return Ok(CustomHeaders::default());
        };
        let mut headers = Vec::new();
        for (name, Stored { value, secret }) in parse(stored)? {
            let value = match self {
                Self::Keys(cipher) if secret => {
                    cipher.open_bound(&value, &bound_to(account, endpoint, &name))?
                }
                Self::Withheld if secret => String::new(),
                _ => value,
            };
            headers.push((name, CustomHeader { value, secret }));
        }
        Ok(CustomHeaders::from_trusted(headers))
    }
}

impl SecretsCipher {
    /// The stored headers with every secret value sealed under the current key, or `None`
    /// when they already are. Every value is opened either way (see [`Self::reseal`]).
    pub fn reseal_headers(
        &self,
        stored: &str,
        account: &AccountId,
        endpoint: &EndpointId,
    ) -> Result<Option<String>, SecretsError> {
        let access = SecretsAccess::Keys(self.clone());
        let headers = access.open_headers(Some(stored), account, endpoint)?;
        let stale = parse(stored)?
            .values()
            .any(|h| h.secret && self.needs_reseal(&h.value));
        if !stale {
            return Ok(None);
        }
        access.seal_headers(&headers, account, endpoint)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ids(e: &str) -> (AccountId, EndpointId) {
        (
            AccountId::from_trusted("acme".into()),
            EndpointId::from_trusted(e.into()),
        )
    }

    #[test]
    fn secret_values_are_sealed_to_their_endpoint_and_name() {
        let cipher = SecretsAccess::from(SecretsCipher::new(&[4u8; 32], None).unwrap());
        let (account, endpoint) = ids("ep_1");
        let headers = CustomHeaders::parse(Some(&json!({
            "Authorization": "Bearer s3cr3t-value",
            "X-Tenant": "t_1",
        })))
        .unwrap();
        let stored = cipher
            .seal_headers(&headers, &account, &endpoint)
            .unwrap()
            .unwrap();
        assert!(!stored.contains("s3cr3t-value"), "{stored}");
        assert!(
            stored.contains("t_1"),
            "a plain value stays readable: {stored}"
        );
        let opened = cipher
            .open_headers(Some(&stored), &account, &endpoint)
            .unwrap();
        assert_eq!(opened, headers);

        // The sealed value moved to another endpoint, or to another header, does not open.
        let (_, other) = ids("ep_2");
        assert_eq!(
            cipher.open_headers(Some(&stored), &account, &other),
            Err(SecretsError::Tampered)
        );
        let mut moved: serde_json::Value = serde_json::from_str(&stored).unwrap();
        moved["x-api-key"] = moved["authorization"].clone();
        moved.as_object_mut().unwrap().remove("authorization");
        assert_eq!(
            cipher.open_headers(Some(&moved.to_string()), &account, &endpoint),
            Err(SecretsError::Tampered)
        );

        // Without a key the secret value reads as empty; writing one is refused.
        let withheld = SecretsAccess::Withheld
            .open_headers(Some(&stored), &account, &endpoint)
            .unwrap();
        let values: Vec<_> = withheld
            .iter()
            .map(|(n, h)| (n, h.value.as_str()))
            .collect();
        assert_eq!(values, [("authorization", ""), ("x-tenant", "t_1")]);
        assert_eq!(
            SecretsAccess::Withheld.seal_headers(&headers, &account, &endpoint),
            Err(SecretsError::Withheld)
        );
        assert_eq!(
            cipher.seal_headers(&CustomHeaders::default(), &account, &endpoint),
            Ok(None)
        );
    }

    #[test]
    fn a_new_key_reseals_only_secret_values_under_the_old_one() {
        let old = SecretsCipher::new(&[1u8; 32], None).unwrap();
        let new = SecretsCipher::new(&[2u8; 32], Some(&[1u8; 32])).unwrap();
        let (account, endpoint) = ids("ep_1");
        let headers =
            CustomHeaders::parse(Some(&json!({"authorization": "Bearer x", "x-a": "1"}))).unwrap();
        let stored = SecretsAccess::from(old)
            .seal_headers(&headers, &account, &endpoint)
            .unwrap()
            .unwrap();
        let resealed = new
            .reseal_headers(&stored, &account, &endpoint)
            .unwrap()
            .expect("sealed under the previous key");
        assert!(resealed.contains(new.key_id()), "{resealed}");
        let access = SecretsAccess::from(new.clone());
        assert_eq!(
            access
                .open_headers(Some(&resealed), &account, &endpoint)
                .unwrap(),
            headers
        );
        assert_eq!(new.reseal_headers(&resealed, &account, &endpoint), Ok(None));
        let plain_only = access
            .seal_headers(
                &CustomHeaders::parse(Some(&json!({"x-a": "1"}))).unwrap(),
                &account,
                &endpoint,
            )
            .unwrap()
            .unwrap();
        assert_eq!(
            new.reseal_headers(&plain_only, &account, &endpoint),
            Ok(None)
        );
    }
}
