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
    domain::{
        AccountId, ApiKey, ApiKeyId, AuditAction, AuditEntry, AuditTarget, Caller, Principal,
        TargetKind,
    },
    store::{AuditedChange, Store, StoreError, TokenRef, TokenRevocation},
    tokens::{TokenError, TokenKey, TOKEN_PREFIX},
};

/// What every API key starts with; the key's id and its secret follow, joined by a dot.
pub const KEY_PREFIX: &str = "hl_key_";
/// How long an api function instance on AWS keeps what it read of a credential: the bound
/// on how long a credential revoked through one instance is still accepted by another.
pub const LAMBDA_CREDENTIAL_CACHE: Duration = Duration::from_secs(5);
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
    hex::encode(Sha256::digest(secret.as_bytes()))
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

/// The setting that holds the digest of an admin token the store keeps (not configured).
pub const ADMIN_TOKEN_DIGEST_SETTING: &str = "admin_token_sha256";

/// The admin token, known by its digest.
#[derive(Debug, Clone)]
pub enum AdminToken {
    /// Configured (a variable, an SSM parameter): fixed for the life of the process.
    Fixed { sha256: String },
    /// Kept in the store's settings ([`ADMIN_TOKEN_DIGEST_SETTING`]) and replaced through
    /// the API ([`rotate_admin_token`]) without a restart.
    Stored,
}

impl AdminToken {
    pub fn fixed(token: &str) -> Self {
        Self::Fixed {
            sha256: sha256_hex(token),
        }
    }
}

/// A new admin token: `hl_admin_` and 48 hex digits.
pub fn new_admin_token() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    format!("hl_admin_{}", hex::encode(bytes))
}

#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error(
        "the admin token is set by the configuration (HOOKLANE_ADMIN_TOKEN or its SSM \
         parameter): change it there"
    )]
    Configured,
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Clone)]
enum Entry {
    Key(ApiKey),
    Token(TokenRevocation),
    AdminDigest(Option<String>),
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
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        token_key: TokenKey,
        admin: AdminToken,
        cache_ttl: Duration,
    ) -> Self {
        Self {
            store,
            clock,
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
            let revocation = self
                .token_revocation(&claims.account_id, &claims.token_id, now)
                .await?;
            if revocation.revokes(claims.issued_at) {
                return Err(AuthError::Revoked);
            }
            return Ok(Principal::Account {
                account_id: claims.account_id,
                token_id: claims.token_id,
                expires_at: claims.expires_at,
                read_only: claims.read_only,
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
                expires_at: key.expires_at,
            });
        }
        let digest = match &self.admin {
            AdminToken::Fixed { sha256 } => Some(sha256.clone()),
            AdminToken::Stored => self.stored_admin_digest(now).await?,
        };
        match digest {
            Some(digest) if same_digest(&sha256_hex(credential), &digest) => Ok(Principal::Admin),
            _ => Err(AuthError::Invalid),
        }
    }

    async fn stored_admin_digest(&self, now: Timestamp) -> Result<Option<String>, StoreError> {
        if let Some(Entry::AdminDigest(digest)) = self.cached(ADMIN_ENTRY, now) {
            return Ok(digest);
        }
        let digest = self.store.get_setting(ADMIN_TOKEN_DIGEST_SETTING).await?;
        self.remember(
            ADMIN_ENTRY.to_owned(),
            now,
            Entry::AdminDigest(digest.clone()),
        );
        Ok(digest)
    }

    /// What is revoked of an account token: from the cache if read less than `cache_ttl`
    /// ago (revoked or not: a token is checked on every request, so both are kept).
    async fn token_revocation(
        &self,
        account: &AccountId,
        token_id: &str,
        now: Timestamp,
    ) -> Result<TokenRevocation, StoreError> {
        let name = token_entry(account, token_id);
        if let Some(Entry::Token(revocation)) = self.cached(&name, now) {
            return Ok(revocation);
        }
        let token = TokenRef {
            account: account.clone(),
            token_id: token_id.to_owned(),
        };
        let revocation = self.store.token_revocation(&token).await?;
        self.remember(name, now, Entry::Token(revocation));
        Ok(revocation)
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

    /// Forgets what the cache holds of the account's tokens.
    pub fn forget_account_tokens(&self, account: &AccountId) {
        let prefix = token_entry(account, "");
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|name, _| !name.starts_with(&prefix));
    }

    /// Replaces a stored admin token with a new one, returned (it is kept only as a digest):
    /// the old one is refused from now on by this process, by others within `cache_ttl`.
    pub async fn rotate_admin_token(&self, caller: &Caller) -> Result<String, RotateError> {
        if !matches!(self.admin, AdminToken::Stored) {
            return Err(RotateError::Configured);
        }
        let token = new_admin_token();
        // In the operator's log: the admin token is over no one account.
        let entry = AuditEntry::new(
            None,
            self.clock.now(),
            caller,
            AuditAction::AdminTokenRotated,
            AuditTarget::new(TargetKind::AdminToken, "admin"),
            serde_json::Map::new(),
        );
        let change = AuditedChange::PutSetting {
            key: ADMIN_TOKEN_DIGEST_SETTING.to_owned(),
            value: sha256_hex(&token),
        };
        self.store.audited_change(&change, &[entry]).await?;
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(ADMIN_ENTRY);
        Ok(token)
    }
}

/// The cache's name for the stored admin token's digest.
const ADMIN_ENTRY: &str = "admin";

/// The cache's name for an account token (`#` is in no account id).
fn token_entry(account: &AccountId, token_id: &str) -> String {
    format!("tok:{account}#{token_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        clock::{add, from_millis, ManualClock},
        domain::{Account, EmailAddress, Scope},
        store::sqlite::SqliteStore,
    };

    struct World {
        store: Arc<dyn Store>,
        clock: Arc<ManualClock>,
        token_key: TokenKey,
        acme: AccountId,
    }

    impl World {
        async fn new() -> Self {
            let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().unwrap());
            let clock = Arc::new(ManualClock::new(from_millis(1_800_000_000_000)));
            let acme = AccountId::parse("acme").unwrap();
            store
                .create_account(&Account {
                    id: acme.clone(),
                    name: "Acme".into(),
                    owner_email: EmailAddress::parse("ops@acme.example").unwrap(),
                    publish_rate_limit: None,
                    created_at: clock.now(),
                })
                .await
                .unwrap();
            Self {
                store,
                clock,
                token_key: TokenKey::generate(),
                acme,
            }
        }

        /// One api function instance (or one `serve`) over the shared store.
        fn instance(&self, admin: AdminToken, ttl: Duration) -> Access {
            Access::new(
                Arc::clone(&self.store),
                self.clock.clone(),
                self.token_key.clone(),
                admin,
                ttl,
            )
        }

        fn token(&self, id: &str) -> String {
            let now = self.clock.now();
            self.token_key.mint(
                &self.acme,
                id,
                (now, add(now, Duration::from_secs(3600))),
                false,
            )
        }

        async fn key(&self) -> (ApiKeyId, String) {
            let id = ApiKeyId::generate();
            let secret = new_key_secret();
            let key = ApiKey {
                id: id.clone(),
                name: "publisher".into(),
                scopes: vec![Scope::EventsPublish],
                accounts: None,
                secret_sha256: sha256_hex(&secret),
                created_at: self.clock.now(),
                created_by: "admin".into(),
                expires_at: None,
                revoked_at: None,
            };
            self.store.create_api_key(&key).await.unwrap();
            (id.clone(), key_credential(&id, &secret))
        }
    }

    /// AWS runs many api instances, each with its own cache: one that read a credential just
    /// before it was revoked through another accepts it until its cache entry is
    /// `LAMBDA_CREDENTIAL_CACHE` old, and never after; the revoking instance refuses it at once.
    #[tokio::test]
    async fn another_instance_refuses_a_revoked_credential_within_the_cache_time() {
        let world = World::new().await;
        let ttl = LAMBDA_CREDENTIAL_CACHE;
        let admin = || AdminToken::fixed("admin-token-0123456789");
        let (revoking, other) = (world.instance(admin(), ttl), world.instance(admin(), ttl));
        let token_id = "tok_0192d1f4a5b67c8d9e0f1a2b3c4d5e6f";
        let token = world.token(token_id);
        let (key_id, key) = world.key().await;
        assert!(other.authenticate(&token).await.is_ok());
        assert!(other.authenticate(&key).await.is_ok());

        let now = world.clock.now();
        world
            .store
            .revoke_token(
                &TokenRef {
                    account: world.acme.clone(),
                    token_id: token_id.to_owned(),
                },
                now,
            )
            .await
            .unwrap();
        revoking.forget_account_tokens(&world.acme);
        world.store.revoke_api_key(&key_id, now).await.unwrap();
        revoking.forget_key(&key_id);
        assert!(matches!(
            revoking.authenticate(&token).await,
            Err(AuthError::Revoked)
        ));
        assert!(matches!(
            revoking.authenticate(&key).await,
            Err(AuthError::Revoked)
        ));

        world.clock.advance(ttl - Duration::from_millis(1));
        assert!(other.authenticate(&token).await.is_ok(), "still cached");
        assert!(other.authenticate(&key).await.is_ok(), "still cached");
        world.clock.advance(Duration::from_millis(1));
        assert!(matches!(
            other.authenticate(&token).await,
            Err(AuthError::Revoked)
        ));
        assert!(matches!(
            other.authenticate(&key).await,
            Err(AuthError::Revoked)
        ));
        println!("modelled: another api instance accepts a revoked credential for at most {ttl:?}");
    }

    /// Revoking all of an account's tokens refuses those issued until then, including tokens
    /// from before tokens said when they were issued; a token minted afterwards works.
    #[tokio::test]
    async fn revoking_an_accounts_tokens_spares_the_ones_minted_afterwards() {
        let world = World::new().await;
        let access = world.instance(AdminToken::fixed("admin-token-0123456789"), Duration::ZERO);
        let before = world.token("tok_0192d1f4a5b67c8d9e0f1a2b3c4d5e01");
        world
            .store
            .revoke_account_tokens(&world.acme, world.clock.now())
            .await
            .unwrap();
        world.clock.advance(Duration::from_millis(1));
        let after = world.token("tok_0192d1f4a5b67c8d9e0f1a2b3c4d5e02");
        assert!(matches!(
            access.authenticate(&before).await,
            Err(AuthError::Revoked)
        ));
        assert!(access.authenticate(&after).await.is_ok());
    }

    /// A stored admin token is replaced without a restart: the old one is refused at once by
    /// the instance that rotated it; a configured one cannot be rotated through the API.
    #[tokio::test]
    async fn a_stored_admin_token_rotates_and_a_configured_one_does_not() {
        let world = World::new().await;
        let first = new_admin_token();
        world
            .store
            .put_setting(ADMIN_TOKEN_DIGEST_SETTING, &sha256_hex(&first))
            .await
            .unwrap();
        let access = world.instance(AdminToken::Stored, Duration::from_secs(1));
        assert_eq!(access.authenticate(&first).await.unwrap(), Principal::Admin);
        let second = access
            .rotate_admin_token(&Caller::new(crate::domain::Actor::Admin, None))
            .await
            .unwrap();
        assert!(second.starts_with("hl_admin_") && second != first);
        assert!(matches!(
            access.authenticate(&first).await,
            Err(AuthError::Invalid)
        ));
        assert_eq!(
            access.authenticate(&second).await.unwrap(),
            Principal::Admin
        );
        let configured = world.instance(AdminToken::fixed(&first), Duration::from_secs(1));
        assert!(matches!(
            configured.rotate_admin_token(&Caller::system()).await,
            Err(RotateError::Configured)
        ));
        assert_eq!(
            configured.authenticate(&first).await.unwrap(),
            Principal::Admin
        );
    }
}
