//! Scoped API keys: make one (the secret is returned once and kept only as a digest), list
//! them, revoke one.

use super::{
    access::{key_credential, new_key_secret, sha256_hex, Access},
    ServiceError, ServiceResult,
};
use crate::{
    clock::Timestamp,
    domain::{
        access::{parse_key_accounts, parse_scopes},
        account, ApiKey, ApiKeyId, InvalidField, Scope,
    },
    App,
};

#[derive(Debug, Clone, Default)]
pub struct NewKey {
    pub name: String,
    pub scopes: Vec<String>,
    /// `None`: every account.
    pub accounts: Option<Vec<String>>,
    pub expires_at: Option<Timestamp>,
}

/// A key just made: its record, and the credential to hand over (never stored).
#[derive(Debug, Clone)]
pub struct MintedKey {
    pub key: ApiKey,
    pub credential: String,
}

pub async fn create(app: &App, input: NewKey, actor: String) -> ServiceResult<MintedKey> {
    let name = account::parse_name(&input.name)?;
    let scopes = parse_scopes(&input.scopes)?;
    let accounts = input
        .accounts
        .as_deref()
        .map(parse_key_accounts)
        .transpose()?;
    if accounts.is_some() && scopes.contains(&Scope::Admin) {
        return Err(InvalidField::new(
            "accounts",
            "an `admin` key reaches every account: leave `accounts` out",
        )
        .into());
    }
    let now = app.clock.now();
    if input.expires_at.is_some_and(|at| at <= now) {
        return Err(InvalidField::new("expires_at", "must be in the future").into());
    }
    for id in accounts.iter().flatten() {
        if app.store.get_account(id).await?.is_none() {
            return Err(InvalidField::new("accounts", format!("no account `{id}`")).into());
        }
    }
    let secret = new_key_secret();
    let key = ApiKey {
        id: ApiKeyId::generate(),
        name,
        scopes,
        accounts,
        secret_sha256: sha256_hex(&secret),
        created_at: now,
        created_by: actor,
        expires_at: input.expires_at,
        revoked_at: None,
    };
    app.store.create_api_key(&key).await?;
    Ok(MintedKey {
        credential: key_credential(&key.id, &secret),
        key,
    })
}

pub async fn list(app: &App) -> ServiceResult<Vec<ApiKey>> {
    Ok(app.store.list_api_keys().await?)
}

/// Revokes the key; this process refuses it from now on, others within their cache's time.
pub async fn revoke(app: &App, access: &Access, id: &ApiKeyId) -> ServiceResult<ApiKey> {
    let key = app
        .store
        .revoke_api_key(id, app.clock.now())
        .await?
        .ok_or(ServiceError::NotFound("key"))?;
    access.forget_key(id);
    Ok(key)
}
