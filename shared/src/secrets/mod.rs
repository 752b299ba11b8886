//! Endpoint signing secrets at rest: sealed with AES-256-GCM under the operator's key, one rule for both stores.
//!
//! A stored value is `enc:v1:<key id>:<base64 of nonce ‖ ciphertext ‖ tag>`. The key id is
//! the first 8 bytes of SHA-256 of the key, in hex, so a value names the key that sealed it
//! and a reader holding the current and the previous key picks the right one. The
//! associated data is the endpoint's account and id: a value copied onto another endpoint
//! does not open. A value without the `enc:` prefix is a plaintext secret written before
//! encryption existed; it is read as it is and sealed at the next re-seal or write.
//! Secret custom header values are sealed the same way, bound to their header's name too
//! (`headers`).

use std::sync::Arc;

use base64::{engine::general_purpose::STANDARD, Engine};
use ring::{
    aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN},
    rand::{SecureRandom, SystemRandom},
};
use sha2::{Digest, Sha256};

use crate::{
    domain::{AccountId, EndpointId, InvalidField},
    signing::SigningSecret,
};

mod headers;

const PREFIX: &str = "enc:";
const V1: &str = "enc:v1:";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretsError {
    #[error(
        "a secret is sealed under key {0}, which is neither HOOKLANE_SECRETS_KEY nor \
         HOOKLANE_SECRETS_KEY_PREVIOUS"
    )]
    UnknownKey(String),
    #[error("a sealed secret does not open: it was altered or belongs to another endpoint")]
    Tampered,
    #[error("a sealed secret is malformed: {0}")]
    Malformed(&'static str),
    #[error("the system random source failed")]
    Random,
    #[error(
        "this process holds no secrets key (HOOKLANE_SECRETS_KEY): it cannot seal or open \
         endpoint signing secrets"
    )]
    Withheld,
    #[error("a secret setting is stored in plaintext")]
    Plaintext,
}

/// A 32-byte key and its id.
struct Key {
    id: String,
    key: LessSafeKey,
}

impl Key {
    fn new(bytes: &[u8; 32]) -> Result<Self, InvalidField> {
        let unbound = UnboundKey::new(&AES_256_GCM, bytes)
            .map_err(|_| InvalidField::new("HOOKLANE_SECRETS_KEY", "not an AES-256 key"))?;
        Ok(Self {
            id: key_id(bytes),
            key: LessSafeKey::new(unbound),
        })
    }
}

/// The key id of a 32-byte key: what a sealed value names and the start-up log shows.
pub fn key_id(bytes: &[u8; 32]) -> String {
    let digest = Sha256::digest(bytes);
    hex::encode(&digest[..8])
}

/// Parses a key given as 64 hex digits or base64 (standard or URL-safe, padded or not) of
/// exactly 32 bytes; `variable` names the setting in the error.
pub fn parse_key(raw: &str, variable: &'static str) -> Result<[u8; 32], InvalidField> {
    let raw = raw.trim();
    let bytes = if raw.len() == 64 && raw.bytes().all(|b| b.is_ascii_hexdigit()) {
        (0..32)
            .map(|i| u8::from_str_radix(&raw[2 * i..2 * i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .ok()
    } else {
        use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
        [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
            .iter()
            .find_map(|engine| engine.decode(raw).ok())
    };
    bytes
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| {
            InvalidField::new(
                variable,
                "must be 32 bytes as 64 hex digits or base64 (e.g. `openssl rand -hex 32`)",
            )
        })
}

/// The operator's keys as configured (`HOOKLANE_SECRETS_KEY`, `HOOKLANE_SECRETS_KEY_PREVIOUS`);
/// `Debug` shows key ids only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretsKeys {
    pub current: Option<[u8; 32]>,
    pub previous: Option<[u8; 32]>,
}

impl std::fmt::Debug for SecretsKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsKeys")
            .field("current", &self.current.as_ref().map(key_id))
            .field("previous", &self.previous.as_ref().map(key_id))
            .finish()
    }
}

impl SecretsKeys {
    /// The cipher of these keys with `current` standing in when none is configured (the
    /// embedded shape's generated key file).
    pub fn cipher_or(
        &self,
        fallback: Option<&[u8; 32]>,
    ) -> Option<Result<SecretsCipher, InvalidField>> {
        let current = self.current.as_ref().or(fallback)?;
        Some(SecretsCipher::new(current, self.previous.as_ref()))
    }
}

/// A new random key, as 64 hex digits.
pub fn generate_key() -> Result<String, SecretsError> {
    let mut bytes = [0u8; 32];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| SecretsError::Random)?;
    Ok(hex::encode(bytes))
}

/// The keys secrets are sealed and opened with: the current one seals, both open. Cheap to
/// clone (shared).
#[derive(Clone)]
pub struct SecretsCipher {
    inner: Arc<Inner>,
}

struct Inner {
    current: Key,
    previous: Option<Key>,
    random: SystemRandom,
}

impl std::fmt::Debug for SecretsCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsCipher")
            .field("key_id", &self.inner.current.id)
            .field(
                "previous_key_id",
                &self.inner.previous.as_ref().map(|k| &k.id),
            )
            .finish()
    }
}

impl SecretsCipher {
    pub fn new(current: &[u8; 32], previous: Option<&[u8; 32]>) -> Result<Self, InvalidField> {
        Ok(Self {
            inner: Arc::new(Inner {
                current: Key::new(current)?,
                previous: previous.map(Key::new).transpose()?,
                random: SystemRandom::new(),
            }),
        })
    }

    /// A cipher with a random key that lives as long as the process: for in-memory stores
    /// and tests, where nothing outlives the process.
    pub fn ephemeral() -> Result<Self, SecretsError> {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| SecretsError::Random)?;
        Self::new(&bytes, None).map_err(|_| SecretsError::Random)
    }

    /// The id of the key that seals.
    pub fn key_id(&self) -> &str {
        &self.inner.current.id
    }

    /// The id of the previous key, if one is configured.
    pub fn previous_key_id(&self) -> Option<&str> {
        self.inner.previous.as_ref().map(|k| k.id.as_str())
    }

    /// Seals `secret` for the endpoint `(account, endpoint)` under the current key.
    pub fn seal(
        &self,
        secret: &str,
        account: &AccountId,
        endpoint: &EndpointId,
    ) -> Result<String, SecretsError> {
        self.seal_bound(secret, &associated_data(account, endpoint))
    }

    /// Seals `plain` under the current key; it opens only with the same `bound_to`.
    fn seal_bound(&self, plain: &str, bound_to: &[u8]) -> Result<String, SecretsError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.inner
            .random
            .fill(&mut nonce)
            .map_err(|_| SecretsError::Random)?;
        let mut buffer = plain.as_bytes().to_vec();
        self.inner
            .current
            .key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(bound_to),
                &mut buffer,
            )
            .map_err(|_| SecretsError::Malformed("cannot seal"))?;
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&buffer);
        Ok(format!(
            "{V1}{}:{}",
            self.inner.current.id,
            STANDARD.encode(sealed)
        ))
    }

    /// The secret in a stored value: opened with whichever key sealed it, or as it is if
    /// it was stored before encryption (no `enc:` prefix).
    pub fn open(
        &self,
        stored: &str,
        account: &AccountId,
        endpoint: &EndpointId,
    ) -> Result<String, SecretsError> {
        self.open_bound(stored, &associated_data(account, endpoint))
    }

    /// The plaintext of a value [`Self::seal_bound`] made with the same `bound_to`, or the
    /// value as it is without the `enc:` prefix.
    fn open_bound(&self, stored: &str, bound_to: &[u8]) -> Result<String, SecretsError> {
        let Some(rest) = stored.strip_prefix(V1) else {
            if stored.starts_with(PREFIX) {
                return Err(SecretsError::Malformed("unknown version"));
            }
            return Ok(stored.to_owned());
        };
        let (id, body) = rest
            .split_once(':')
            .ok_or(SecretsError::Malformed("no key id"))?;
        let key = self
            .keys()
            .find(|k| k.id == id)
            .ok_or_else(|| SecretsError::UnknownKey(id.to_owned()))?;
        let mut sealed = STANDARD
            .decode(body)
            .map_err(|_| SecretsError::Malformed("not base64"))?;
        if sealed.len() < NONCE_LEN {
            return Err(SecretsError::Malformed("too short"));
        }
        let mut ciphertext = sealed.split_off(NONCE_LEN);
        let nonce =
            Nonce::try_assume_unique_for_key(&sealed).map_err(|_| SecretsError::Tampered)?;
        let plain = key
            .key
            .open_in_place(nonce, Aad::from(bound_to), &mut ciphertext)
            .map_err(|_| SecretsError::Tampered)?;
        String::from_utf8(plain.to_vec()).map_err(|_| SecretsError::Malformed("not UTF-8"))
    }

    /// Whether a stored value should be sealed again: it is plaintext, or sealed under a
    /// key other than the current one.
    pub fn needs_reseal(&self, stored: &str) -> bool {
        match stored.strip_prefix(V1).and_then(|r| r.split_once(':')) {
            Some((id, _)) => id != self.inner.current.id,
            None => true,
        }
    }

    /// An endpoint's stored secrets (current, retiring) sealed under the current key, or
    /// `None` when they already are. Every value is opened either way, so a walk over a
    /// store checks that the configured keys open all of it.
    pub fn reseal(
        &self,
        stored: (&str, Option<&str>),
        account: &AccountId,
        endpoint: &EndpointId,
    ) -> Result<Option<(String, Option<String>)>, SecretsError> {
        let (secret, retiring) = stored;
        let opened = (
            self.open(secret, account, endpoint)?,
            retiring
                .map(|r| self.open(r, account, endpoint))
                .transpose()?,
        );
        if !self.needs_reseal(secret) && !retiring.is_some_and(|r| self.needs_reseal(r)) {
            return Ok(None);
        }
        Ok(Some((
            self.seal(&opened.0, account, endpoint)?,
            opened
                .1
                .map(|plain| self.seal(&plain, account, endpoint))
                .transpose()?,
        )))
    }

    /// Seals the value of the setting `name` (the account-token signing key) under the
    /// current key, bound to that name.
    pub fn seal_setting(&self, name: &str, plain: &str) -> Result<String, SecretsError> {
        self.seal_bound(plain, &setting_data(name))
    }

    /// The value of the setting `name` that [`Self::seal_setting`] sealed; unlike an
    /// endpoint secret, a plaintext value is refused ([`SecretsError::Plaintext`]): a key
    /// anyone who read the store could use must not be used.
    pub fn open_setting(&self, name: &str, stored: &str) -> Result<String, SecretsError> {
        if !stored.starts_with(PREFIX) {
            return Err(SecretsError::Plaintext);
        }
        self.open_bound(stored, &setting_data(name))
    }

    fn keys(&self) -> impl Iterator<Item = &Key> {
        std::iter::once(&self.inner.current).chain(self.inner.previous.as_ref())
    }
}

/// What a store does with endpoint signing secrets: seals and opens them with the
/// operator's keys, or withholds them. A process that neither signs nor writes an endpoint
/// (on AWS: the fan-out, sweeper and health functions) is given no key: the endpoints it
/// reads carry [`SigningSecret::withheld`], and writing an endpoint is refused.
#[derive(Clone, Debug)]
pub enum SecretsAccess {
    Keys(SecretsCipher),
    Withheld,
}

impl From<SecretsCipher> for SecretsAccess {
    fn from(cipher: SecretsCipher) -> Self {
        Self::Keys(cipher)
    }
}

impl SecretsAccess {
    /// The cipher, or [`SecretsError::Withheld`] without a key.
    pub fn cipher(&self) -> Result<&SecretsCipher, SecretsError> {
        match self {
            Self::Keys(cipher) => Ok(cipher),
            Self::Withheld => Err(SecretsError::Withheld),
        }
    }

    /// [`SecretsCipher::seal`]; [`SecretsError::Withheld`] without a key.
    pub fn seal(
        &self,
        secret: &SigningSecret,
        account: &AccountId,
        endpoint: &EndpointId,
    ) -> Result<String, SecretsError> {
        match self {
            Self::Keys(cipher) if !secret.is_withheld() => {
                cipher.seal(&secret.expose(), account, endpoint)
            }
            _ => Err(SecretsError::Withheld),
        }
    }

    /// The signing secret in a stored value ([`SecretsCipher::open`]), or
    /// [`SigningSecret::withheld`] without a key.
    pub fn open(
        &self,
        stored: &str,
        account: &AccountId,
        endpoint: &EndpointId,
    ) -> Result<SigningSecret, SecretsError> {
        match self {
            Self::Keys(cipher) => {
                let plain = cipher.open(stored, account, endpoint)?;
                SigningSecret::parse(&plain)
                    .map_err(|_| SecretsError::Malformed("not a whsec_ signing secret"))
            }
            Self::Withheld => Ok(SigningSecret::withheld()),
        }
    }
}

/// Binds a sealed setting to its name.
fn setting_data(name: &str) -> Vec<u8> {
    format!("hooklane:setting:{}:{name}", name.len()).into_bytes()
}

/// Binds a sealed value to its endpoint. The length prefix keeps `("ab", "c")` and
/// `("a", "bc")` apart.
fn associated_data(account: &AccountId, endpoint: &EndpointId) -> Vec<u8> {
    let (a, e) = (account.as_str(), endpoint.as_str());
    format!("hooklane:endpoint-secret:{}:{a}:{e}", a.len()).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(a: &str, e: &str) -> (AccountId, EndpointId) {
        (
            AccountId::from_trusted(a.into()),
            EndpointId::from_trusted(e.into()),
        )
    }

    #[test]
    fn seals_opens_and_refuses_another_row_or_an_unknown_key() {
        let old = [7u8; 32];
        let new = [9u8; 32];
        let cipher = SecretsCipher::new(&old, None).unwrap();
        let (account, endpoint) = ids("acme", "ep_1");
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let sealed = cipher.seal(secret, &account, &endpoint).unwrap();
        assert!(sealed.starts_with(&format!("enc:v1:{}:", cipher.key_id())));
        assert!(!sealed.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
        assert_ne!(sealed, cipher.seal(secret, &account, &endpoint).unwrap());
        assert_eq!(cipher.open(&sealed, &account, &endpoint).unwrap(), secret);
        assert_eq!(
            cipher.open(secret, &account, &endpoint).unwrap(),
            secret,
            "plaintext from before encryption reads as it is"
        );
        let (other_account, other_endpoint) = ids("acme", "ep_2");
        assert_eq!(
            cipher.open(&sealed, &other_account, &other_endpoint),
            Err(SecretsError::Tampered)
        );
        // One character changed: to "A", or to "B" where it was an "A" already (the nonce is
        // random, so a fixed replacement left it unchanged once in 64 runs).
        let mut altered = sealed.clone();
        let at = altered.len() - 3..altered.len() - 2;
        let other = if &altered[at.clone()] == "A" {
            "B"
        } else {
            "A"
        };
        altered.replace_range(at, other);
        assert_ne!(altered, sealed);
        assert!(cipher.open(&altered, &account, &endpoint).is_err());

        let rotated = SecretsCipher::new(&new, Some(&old)).unwrap();
        assert_eq!(rotated.open(&sealed, &account, &endpoint).unwrap(), secret);
        assert!(rotated.needs_reseal(&sealed) && rotated.needs_reseal(secret));
        let resealed = rotated.seal(secret, &account, &endpoint).unwrap();
        assert!(!rotated.needs_reseal(&resealed));
        let without_previous = SecretsCipher::new(&new, None).unwrap();
        assert_eq!(
            without_previous.open(&sealed, &account, &endpoint),
            Err(SecretsError::UnknownKey(key_id(&old)))
        );
        assert_eq!(
            cipher.open("enc:v9:x:y", &account, &endpoint),
            Err(SecretsError::Malformed("unknown version"))
        );
    }

    #[test]
    fn keys_parse_from_hex_or_base64_and_nothing_else() {
        let hex = "00".repeat(31) + "ff";
        assert_eq!(parse_key(&hex, "V").unwrap()[31], 0xff);
        let b64 = STANDARD.encode([3u8; 32]);
        assert_eq!(parse_key(&b64, "V").unwrap(), [3u8; 32]);
        for bad in ["", "short", &"0".repeat(62), &STANDARD.encode([1u8; 16])] {
            let err = parse_key(bad, "HOOKLANE_SECRETS_KEY").unwrap_err();
            assert_eq!(err.field, "HOOKLANE_SECRETS_KEY");
        }
        let generated = generate_key().unwrap();
        assert!(parse_key(&generated, "V").is_ok());
        assert_eq!(key_id(&[0u8; 32]).len(), 16);
    }
}
