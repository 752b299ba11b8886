//! Verify a Hooklane webhook (Standard Webhooks signatures) in Rust.
//! Cargo.toml: hmac = "0.12", sha2 = "0.10", base64 = "0.22"

use std::time::{SystemTime, UNIX_EPOCH};

use base64::{engine::general_purpose::STANDARD, Engine};
use hmac::{Hmac, Mac};
use sha2::Sha256;

const TOLERANCE_SECS: u64 = 5 * 60;

/// `Ok` if one of `secrets` signed exactly these raw `body` bytes; `Err(reason)` otherwise.
pub fn verify_webhook(
    body: &[u8],
    msg_id: &str,
    timestamp: &str,
    signature: &str,
    secrets: &[&str],
) -> Result<(), String> {
    if msg_id.is_empty() || timestamp.is_empty() || signature.is_empty() {
        return Err("missing webhook-id, webhook-timestamp or webhook-signature header".into());
    }
    let sent_at: i64 = timestamp
        .parse()
        .map_err(|_| "webhook-timestamp is not a number")?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| "the clock is before 1970")?
        .as_secs();
    let now = i64::try_from(now).map_err(|_| "the clock is too far ahead")?;
    if now.abs_diff(sent_at) > TOLERANCE_SECS {
        return Err("webhook-timestamp is more than 5 minutes away from now (replayed?)".into());
    }

    // "v1,<base64> v1,<base64>": one signature per secret during a rotation.
    let received: Vec<Vec<u8>> = signature
        .split_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|encoded| STANDARD.decode(encoded).ok())
        .collect();
    // Two secrets during a rotation: the old one and the new one.
    for secret in secrets {
        let key = STANDARD
            .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
            .map_err(|_| "a secret is not whsec_ followed by base64")?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).map_err(|_| "unusable secret")?;
        mac.update(format!("{msg_id}.{timestamp}.").as_bytes());
        mac.update(body);
        // verify_slice compares in constant time.
        if received
            .iter()
            .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
        {
            return Ok(());
        }
    }
    Err("no signature matches: wrong secret, or the body is not the raw bytes received".into())
}
