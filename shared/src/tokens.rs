//! Account-scoped API tokens: `hl_acct_<claims>.<mac>`, signed with a server key, so a
//! token is verified without a lookup (whether it was revoked is the caller's lookup). Claims
//! and MAC are URL-safe base64; the claims are JSON `{"a": account, "j": token id, "e": expiry
//! in unix seconds, "i": issue time in unix milliseconds, "r": true for a read-only token}`
//! (tokens from before `i` have none; `r` is left out when false).

use std::fmt;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::{clock::Timestamp, domain::AccountId};

pub const TOKEN_PREFIX: &str = "hl_acct_";
/// Binds the MAC to this use of the key and to the token format's version.
const MAC_CONTEXT: &[u8] = b"hooklane account token v1\n";
const KEY_BYTES: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a hooklane account token")]
    Malformed,
    #[error("token signature does not match")]
    BadSignature,
    #[error("token has expired")]
    Expired,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token signing key must be {KEY_BYTES} bytes of hex")]
pub struct BadKey;

/// The server's key for account tokens. Whoever holds it can mint tokens for any account.
#[derive(Clone)]
pub struct TokenKey {
    key: [u8; KEY_BYTES],
}

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// What a valid account token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountClaims {
    pub account_id: AccountId,
    pub token_id: String,
    pub expires_at: Timestamp,
    /// `None` for a token minted before tokens carried it.
    pub issued_at: Option<Timestamp>,
    /// Only the reading scopes (a read-only portal link).
    pub read_only: bool,
}

#[derive(Serialize, Deserialize)]
struct WireClaims {
    a: String,
    j: String,
    e: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    i: Option<i64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    r: bool,
}

impl TokenKey {
    pub fn generate() -> Self {
        let mut key = [0u8; KEY_BYTES];
        rand::rng().fill_bytes(&mut key);
        Self { key }
    }

    /// The hex form kept in the store's settings.
    pub fn to_hex(&self) -> String {
        hex::encode(self.key)
    }

    pub fn from_hex(raw: &str) -> Result<Self, BadKey> {
        let raw = raw.trim();
        if raw.len() != KEY_BYTES * 2 || !raw.is_ascii() {
            return Err(BadKey);
        }
        let mut key = [0u8; KEY_BYTES];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&raw[i * 2..i * 2 + 2], 16).map_err(|_| BadKey)?;
        }
        Ok(Self { key })
    }

    fn mac(&self) -> Hmac<Sha256> {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            unreachable!("HMAC accepts every key length")
        };
        mac.update(MAC_CONTEXT);
        mac
    }

    /// A new token for `account`, issued at `issued_at`, valid until `expires_at`;
    /// `read_only` leaves it the reading scopes only.
    pub fn mint(
        &self,
        account: &AccountId,
        token_id: &str,
        (issued_at, expires_at): (Timestamp, Timestamp),
        read_only: bool,
    ) -> String {
        let claims = WireClaims {
            a: account.as_str().to_owned(),
            j: token_id.to_owned(),
            e: expires_at.timestamp(),
            i: Some(issued_at.timestamp_millis()),
            r: read_only,
        };
        // Serialising three plain fields cannot fail.
        let json = serde_json::to_vec(&claims).unwrap_or_default();
        let encoded = URL_SAFE_NO_PAD.encode(json);
        let mut mac = self.mac();
        mac.update(encoded.as_bytes());
        let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{TOKEN_PREFIX}{encoded}.{signature}")
    }

    /// Checks the signature (in constant time) and the expiry, not revocation.
    pub fn verify(&self, token: &str, now: Timestamp) -> Result<AccountClaims, TokenError> {
        let body = token
            .strip_prefix(TOKEN_PREFIX)
            .ok_or(TokenError::Malformed)?;
        let (encoded, signature) = body.split_once('.').ok_or(TokenError::Malformed)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| TokenError::Malformed)?;
        let mut mac = self.mac();
        mac.update(encoded.as_bytes());
        mac.verify_slice(&signature)
            .map_err(|_| TokenError::BadSignature)?;
        let json = URL_SAFE_NO_PAD
            .decode(encoded)
            .map_err(|_| TokenError::Malformed)?;
        let claims: WireClaims =
            serde_json::from_slice(&json).map_err(|_| TokenError::Malformed)?;
        if claims.e <= now.timestamp() {
            return Err(TokenError::Expired);
        }
        let expires_at =
            chrono::DateTime::from_timestamp(claims.e, 0).ok_or(TokenError::Malformed)?;
        let account_id = AccountId::parse(&claims.a).map_err(|_| TokenError::Malformed)?;
        Ok(AccountClaims {
            account_id,
            token_id: claims.j,
            expires_at,
            issued_at: claims.i.map(crate::clock::from_millis),
            read_only: claims.r,
        })
    }
}

/// A new token id, recorded in audit trails as the caller's identity.
pub fn new_token_id() -> String {
    format!("tok_{}", uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_millis;

    fn account(raw: &str) -> AccountId {
        AccountId::parse(raw).unwrap()
    }

    #[test]
    fn a_minted_token_verifies_until_it_expires() {
        let key = TokenKey::generate();
        let now = from_millis(1_800_000_000_000);
        let expires = from_millis(1_800_000_600_000);
        let token = key.mint(&account("acme:eu"), "tok_1", (now, expires), false);
        let claims = key.verify(&token, now).unwrap();
        assert_eq!(claims.account_id, account("acme:eu"));
        assert_eq!(claims.token_id, "tok_1");
        assert_eq!(claims.expires_at, expires);
        assert_eq!(claims.issued_at, Some(now));
        assert!(!claims.read_only);
        assert_eq!(key.verify(&token, expires), Err(TokenError::Expired));
        let read_only = key.mint(&account("acme:eu"), "tok_2", (now, expires), true);
        assert!(key.verify(&read_only, now).unwrap().read_only);
        // Read-only is signed like the rest: a token cannot shed it.
        let (claims, signature) = read_only.split_once('.').unwrap();
        let body = URL_SAFE_NO_PAD
            .decode(claims.strip_prefix(TOKEN_PREFIX).unwrap())
            .unwrap();
        let widened = String::from_utf8(body).unwrap().replace(",\"r\":true", "");
        let widened = format!(
            "{TOKEN_PREFIX}{}.{signature}",
            URL_SAFE_NO_PAD.encode(widened)
        );
        assert_eq!(key.verify(&widened, now), Err(TokenError::BadSignature));
    }

    #[test]
    fn tampering_or_another_key_is_refused() {
        let key = TokenKey::generate();
        let now = from_millis(1_800_000_000_000);
        let token = key.mint(
            &account("acme"),
            "tok_1",
            (now, from_millis(1_900_000_000_000)),
            false,
        );
        let (claims, signature) = token.split_once('.').unwrap();
        // Another account's claims under acme's signature.
        let forged_claims = URL_SAFE_NO_PAD.encode(br#"{"a":"evil","j":"tok_1","e":1900000000}"#);
        let forged = format!("{TOKEN_PREFIX}{forged_claims}.{signature}");
        assert_eq!(key.verify(&forged, now), Err(TokenError::BadSignature));
        let mut flipped = signature.to_owned().into_bytes();
        flipped[3] = if flipped[3] == b'A' { b'B' } else { b'A' };
        let flipped = format!("{claims}.{}", String::from_utf8(flipped).unwrap());
        assert_eq!(key.verify(&flipped, now), Err(TokenError::BadSignature));
        let other = TokenKey::generate();
        assert_eq!(other.verify(&token, now), Err(TokenError::BadSignature));
        for junk in ["", "hl_acct_", "hl_acct_abc", "hl_acct_a.b.c", "Bearer x"] {
            assert!(key.verify(junk, now).is_err(), "{junk}");
        }
    }

    #[test]
    fn key_survives_its_hex_form() {
        let key = TokenKey::generate();
        let again = TokenKey::from_hex(&key.to_hex()).unwrap();
        let now = from_millis(0);
        let token = key.mint(&account("a"), "t", (now, from_millis(60_000)), false);
        assert!(again.verify(&token, now).is_ok());
        assert!(TokenKey::from_hex("zz").is_err());
    }
}
