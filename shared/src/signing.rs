//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256("{id}.{ts}.{body}")>`.

use std::fmt;

use base64::{engine::general_purpose::STANDARD, Engine};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub const SECRET_PREFIX: &str = "whsec_";
pub const HEADER_ID: &str = "webhook-id";
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
pub const HEADER_SIGNATURE: &str = "webhook-signature";
/// How far a timestamp may be from the verifier's clock.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

const SECRET_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret must start with `whsec_`")]
    MissingPrefix,
    #[error("secret after `whsec_` must be base64")]
    NotBase64,
    #[error("secret must decode to 24 to 64 bytes")]
    BadLength,
}

/// An endpoint's HMAC key, shown to its owner as `whsec_<base64>`.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret {
    key: Vec<u8>,
}

impl SigningSecret {
    pub fn generate() -> Self {
        let mut key = vec![0u8; SECRET_BYTES];
        rand::rng().fill_bytes(&mut key);
        Self { key }
    }

    pub fn parse(raw: &str) -> Result<Self, SecretError> {
        let encoded = raw
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| SecretError::NotBase64)?;
        if !(24..=64).contains(&key.len()) {
            return Err(SecretError::BadLength);
        }
        Ok(Self { key })
    }

    /// The stand-in for a secret a process was not given the key to open (see
    /// [`crate::secrets::SecretsAccess::Withheld`]). Nothing is sent signed with it (the
    /// sender refuses an endpoint whose secret is withheld) and it is never stored (sealing
    /// it is refused).
    pub fn withheld() -> Self {
        Self { key: Vec::new() }
    }

    /// Whether this is [`SigningSecret::withheld`]; a parsed or generated secret never is.
    pub fn is_withheld(&self) -> bool {
        self.key.is_empty()
    }

    /// The `whsec_…` form, for the endpoint's owner and for storage.
    pub fn expose(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.key))
    }

    /// `v1,<base64>` for one message.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", STANDARD.encode(self.mac(msg_id, timestamp, body)))
    }

    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
        // HMAC takes keys of any length, so this cannot fail.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            unreachable!("HMAC accepts every key length")
        };
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(redacted)")
    }
}

/// The `webhook-signature` value: one `v1,` signature per secret, space-separated, so that
/// during a rotation a receiver holding either secret can verify.
pub fn signature_header(
    secrets: &[&SigningSecret],
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .iter()
        .map(|secret| secret.sign(msg_id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("webhook-timestamp is not a whole number of seconds")]
    MalformedTimestamp,
    #[error("webhook-timestamp is {0} s older than allowed (replay?)")]
    TimestampTooOld(i64),
    #[error("webhook-timestamp is {0} s in the future")]
    TimestampTooNew(i64),
    #[error("webhook-signature has no `v1,<base64>` entry")]
    MalformedSignature,
    #[error("no signature matches: wrong secret, or the body was changed (verify the raw bytes, not re-serialised JSON)")]
    NoMatch,
}

/// Verifies a received webhook against any of `secrets`, with a clock tolerance.
pub fn verify(
    secrets: &[&SigningSecret],
    msg_id: &str,
    timestamp: &str,
    signature: &str,
    body: &[u8],
    now_unix: i64,
    tolerance_secs: i64,
) -> Result<(), VerifyError> {
    let ts: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| VerifyError::MalformedTimestamp)?;
    // Saturating: the header is the sender's to write, up to i64's ends.
    let age = now_unix.saturating_sub(ts);
    if age > tolerance_secs {
        return Err(VerifyError::TimestampTooOld(
            age.saturating_sub(tolerance_secs),
        ));
    }
    let ahead = ts.saturating_sub(now_unix);
    if ahead > tolerance_secs {
        return Err(VerifyError::TimestampTooNew(ahead));
    }
    let candidates: Vec<Vec<u8>> = signature
        .split_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|encoded| STANDARD.decode(encoded).ok())
        .collect();
    if candidates.is_empty() {
        return Err(VerifyError::MalformedSignature);
    }
    let matched = secrets.iter().any(|secret| {
        let expected = secret.mac(msg_id, ts, body);
        candidates
            .iter()
            .any(|candidate| bool::from(candidate.as_slice().ct_eq(&expected)))
    });
    if matched {
        Ok(())
    } else {
        Err(VerifyError::NoMatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn published_vector() {
        let secret = SigningSecret::parse(SECRET).unwrap();
        assert_eq!(secret.sign(MSG_ID, TS, BODY), EXPECTED);
        assert_eq!(secret.expose(), SECRET);
    }

    #[test]
    fn verify_accepts_the_vector_and_rejects_changes() {
        let secret = SigningSecret::parse(SECRET).unwrap();
        // The published vector, with one thing changed at a time: id, body, receiver's clock.
        let check = |id: &str, body: &[u8], now: i64| {
            verify(&[&secret], id, "1614265330", EXPECTED, body, now, 300)
        };
        assert_eq!(check(MSG_ID, BODY, TS + 10), Ok(()));
        let reserialised = br#"{"test":2432232314}"#;
        assert_eq!(check(MSG_ID, reserialised, TS), Err(VerifyError::NoMatch));
        assert_eq!(check("msg_other", BODY, TS), Err(VerifyError::NoMatch));
        assert_eq!(
            check(MSG_ID, BODY, TS + 301),
            Err(VerifyError::TimestampTooOld(1))
        );
        assert_eq!(
            check(MSG_ID, BODY, TS - 400),
            Err(VerifyError::TimestampTooNew(400))
        );
        assert_eq!(
            verify(&[&secret], MSG_ID, "soon", EXPECTED, BODY, TS, 300),
            Err(VerifyError::MalformedTimestamp)
        );
        assert_eq!(
            verify(&[&secret], MSG_ID, "1614265330", "v2,abc", BODY, TS, 300),
            Err(VerifyError::MalformedSignature)
        );
        let other = SigningSecret::generate();
        assert_eq!(
            verify(&[&other], MSG_ID, "1614265330", EXPECTED, BODY, TS, 300),
            Err(VerifyError::NoMatch)
        );
        // Timestamps at the ends of i64 (the header is the sender's to write) are too old or
        // too new, not an overflow.
        let extreme =
            |timestamp: &str| verify(&[&secret], MSG_ID, timestamp, EXPECTED, BODY, TS, 300);
        assert_eq!(
            extreme("-9223372036854775808"),
            Err(VerifyError::TimestampTooOld(i64::MAX - 300))
        );
        assert_eq!(
            extreme("9223372036854775807"),
            Err(VerifyError::TimestampTooNew(i64::MAX - TS))
        );
    }

    #[test]
    fn rotation_signs_with_both_and_either_verifies() {
        let old = SigningSecret::parse(SECRET).unwrap();
        let new = SigningSecret::generate();
        let header = signature_header(&[&new, &old], MSG_ID, TS, BODY);
        assert_eq!(header.split(' ').count(), 2);
        assert!(header.ends_with(EXPECTED));
        assert_eq!(
            verify(&[&old], MSG_ID, &TS.to_string(), &header, BODY, TS, 300),
            Ok(())
        );
        assert_eq!(
            verify(&[&new], MSG_ID, &TS.to_string(), &header, BODY, TS, 300),
            Ok(())
        );
    }

    #[test]
    fn secret_parsing() {
        assert_eq!(
            SigningSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Err(SecretError::MissingPrefix)
        );
        assert_eq!(
            SigningSecret::parse("whsec_!!!"),
            Err(SecretError::NotBase64)
        );
        assert_eq!(
            SigningSecret::parse("whsec_YWJj"),
            Err(SecretError::BadLength)
        );
        let generated = SigningSecret::generate();
        assert_eq!(
            SigningSecret::parse(&generated.expose()).unwrap(),
            generated
        );
        assert_eq!(format!("{generated:?}"), "SigningSecret(redacted)");
    }
}
