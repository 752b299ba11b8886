//! Authentication: the principal a bearer credential names (the admin token, a scoped API
//! key, an account token), with what the store says about it read through a short cache.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{
    clock::{Clock, Timestamp},
    domain::{ApiKey, ApiKeyId, Principal},
    store::{Store, StoreError},
    tokens::{TokenError, TokenKey, TOKEN_PREFIX},
    App,
};

/// What every API key starts with; the key's id and its secret follow, joined by a dot.
pub const KEY_PREFIX: &str = "hl_key_";
/// More entries than this and the cache starts over: it only saves reads.
const CACHE_ENTRIES: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("invalid token")]
    Invalid,
    #[error("{0}")]
    Token(#[from] TokenError),
    #[error("API key has expired")]
    KeyExpired,
    #[error("credential has been revoked")]
    Revoked,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The lower-case hex SHA-256 of `secret`: how key secrets and the admin token are kept.
pub fn sha256_hex(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn same_digest(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// A new key secret: 32 random bytes, URL-safe base64.
pub fn new_key_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The bearer form of a key: `hl_key_<32 hex>.<secret>` (its id is `key_<32 hex>`).
pub fn key_credential(id: &ApiKeyId, secret: &str) -> String {
    format!("hl_{id}.{secret}")
}

/// The id and secret of a presented key; `None` if it cannot be one.
fn split_key(credential: &str) -> Option<(ApiKeyId, &str)> {
    let (id, secret) = credential.strip_prefix("hl_")?.split_once('.')?;
    let id = ApiKeyId::parse(id)?;
    (!secret.is_empty()).then_some((id, secret))
}

/// The admin token, known by its digest.
#[derive(Debug, Clone)]
pub enum AdminToken {
    /// Configured (a variable, an SSM parameter): fixed for the life of the process.
    Fixed { sha256: String },
}

impl AdminToken {
    pub fn fixed(token: &str) -> Self {
        Self::Fixed {
            sha256: sha256_hex(token),
        }
    }
}

#[derive(Clone)]
enum Entry {
    Key(ApiKey),
}

struct Cached {
    read_at: Timestamp,
    entry: Entry,
}

/// Checks bearer credentials. What can change under a credential (a key's record) is read
/// from the store at most once per `cache_ttl` per credential on this process; a change made
/// through this process is seen at once (the change forgets the entry), one made through
/// another process (another Lambda instance) within `cache_ttl`.
pub struct Access {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    token_key: TokenKey,
    admin: AdminToken,
    cache_ttl: Duration,
    cache: Mutex<HashMap<String, Cached>>,
}

impl Access {
    pub fn new(app: &App, token_key: TokenKey, admin: AdminToken, cache_ttl: Duration) -> Self {
        Self {
            store: Arc::clone(&app.store),
            clock: Arc::clone(&app.clock),
            token_key,
            admin,
            cache_ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The key that signs account tokens.
    pub fn token_key(&self) -> &TokenKey {
        &self.token_key
    }

    /// How long a credential's state may be read from the cache.
    pub fn cache_ttl(&self) -> Duration {
        self.cache_ttl
    }

    /// The principal `credential` names, or why it names none.
    pub async fn authenticate(&self, credential: &str) -> Result<Principal, AuthError> {
        let now = self.clock.now();
        if credential.starts_with(TOKEN_PREFIX) {
            let claims = self.token_key.verify(credential, now)?;
            return Ok(Principal::Account {
                account_id: claims.account_id,
                token_id: claims.token_id,
                expires_at: claims.expires_at,
            });
        }
        if credential.starts_with(KEY_PREFIX) {
            let (id, secret) = split_key(credential).ok_or(AuthError::Invalid)?;
            let key = self.key(&id, now).await?.ok_or(AuthError::Invalid)?;
            if !same_digest(&sha256_hex(secret), &key.secret_sha256) {
                return Err(AuthError::Invalid);
            }
            if key.revoked_at.is_some() {
                return Err(AuthError::Revoked);
            }
            if key.expires_at.is_some_and(|at| at <= now) {
                return Err(AuthError::KeyExpired);
            }
            return Ok(Principal::Key {
                key_id: key.id,
                scopes: key.scopes,
                accounts: key.accounts,
            });
        }
        let AdminToken::Fixed { sha256 } = &self.admin;
        if same_digest(&sha256_hex(credential), sha256) {
            Ok(Principal::Admin)
        } else {
            Err(AuthError::Invalid)
        }
    }

    /// The key's record: from the cache if read less than `cache_ttl` ago. A missing key is
    /// not cached, so a key made through another process works at once.
    async fn key(&self, id: &ApiKeyId, now: Timestamp) -> Result<Option<ApiKey>, StoreError> {
        let name = format!("key:{id}");
        if let Some(Entry::Key(key)) = self.cached(&name, now) {
            return Ok(Some(key));
        }
        let key = self.store.get_api_key(id).await?;
        if let Some(key) = &key {
            self.remember(name, now, Entry::Key(key.clone()));
        }
        Ok(key)
    }

    fn cached(&self, name: &str, now: Timestamp) -> Option<Entry> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let cached = cache.get(name)?;
        let age = (now - cached.read_at).to_std().unwrap_or(Duration::MAX);
        (age < self.cache_ttl).then(|| cached.entry.clone())
    }

    fn remember(&self, name: String, now: Timestamp, entry: Entry) {
        if self.cache_ttl.is_zero() {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(
            name,
            Cached {
                read_at: now,
                entry,
            },
        );
    }

    /// Forgets what the cache holds of a key (it was just changed through this process).
    pub fn forget_key(&self, id: &ApiKeyId) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.remove(&format!("key:{id}"));
    }
}
