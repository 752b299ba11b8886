//! Scoped API keys: make one (the secret is returned once and kept only as a digest), list
//! them, revoke one or all of an account's.

use super::{
    access::{key_credential, new_key_secret, sha256_hex, Access},
    audit, ServiceError, ServiceResult,
};
use crate::{
    clock::Timestamp,
    domain::{
        access::{parse_key_accounts, parse_scopes},
        account, AccountId, ApiKey, ApiKeyId, AuditAction, AuditTarget, Caller, InvalidField,
        Scope, TargetKind,
    },
    store::AuditedChange,
    App,
};

/// Records a change to `key` in the log of each account it is limited to, or in the
/// operator's log for a key that reaches every account.
async fn audited(
    app: &App,
    caller: &Caller,
    key: &ApiKey,
    action: AuditAction,
    details: serde_json::Value,
) -> ServiceResult<()> {
    let target = AuditTarget::new(TargetKind::Key, &key.id);
    let details = audit::details(details);
    match &key.accounts {
        Some(accounts) => {
            for account in accounts {
                let (target, details) = (target.clone(), details.clone());
                audit::record(app, caller, Some(account), action, target, details).await?;
            }
            Ok(())
        }
        None => audit::record(app, caller, None, action, target, details).await,
    }
}

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

pub async fn create(app: &App, input: NewKey, caller: &Caller) -> ServiceResult<MintedKey> {
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
        created_by: caller.actor.to_text(),
        expires_at: input.expires_at,
        revoked_at: None,
    };
    let scopes: Vec<&str> = key.scopes.iter().map(|s| s.as_str()).collect();
    let details = serde_json::json!({ "name": key.name, "scopes": scopes });
    let target = AuditTarget::new(TargetKind::Key, &key.id);
    let entry = |account: Option<&AccountId>| {
        let (target, details) = (target.clone(), details.clone());
        audit::entry(
            app,
            caller,
            account,
            AuditAction::KeyCreated,
            target,
            details,
        )
    };
    // In the log of each account the key is limited to, or the operator's.
    let entries: Vec<_> = match &key.accounts {
        Some(accounts) => accounts.iter().map(|a| entry(Some(a))).collect(),
        None => vec![entry(None)],
    };
    audit::change(app, AuditedChange::CreateApiKey(key.clone()), &entries).await?;
    Ok(MintedKey {
        credential: key_credential(&key.id, &secret),
        key,
    })
}

pub async fn list(app: &App) -> ServiceResult<Vec<ApiKey>> {
    Ok(app.store.list_api_keys().await?)
}

/// Revokes the key; this process refuses it from now on, others within their cache's time.
pub async fn revoke(
    app: &App,
    access: &Access,
    id: &ApiKeyId,
    caller: &Caller,
) -> ServiceResult<ApiKey> {
    let now = app.clock.now();
    let key = app
        .store
        .revoke_api_key(id, now)
        .await?
        .ok_or(ServiceError::NotFound("key"))?;
    access.forget_key(id);
    // Revoking again changes nothing, and records nothing.
    if key.revoked_at == Some(now) {
        audited(
            app,
            caller,
            &key,
            AuditAction::KeyRevoked,
            serde_json::json!({}),
        )
        .await?;
    }
    Ok(key)
}

/// Revokes every key limited to `account` that is not revoked yet, and returns them. A key
/// limited to several accounts is revoked for all of them (a key cannot lose one of its
/// accounts); a key that reaches every account is the operator's and stays.
pub async fn revoke_account_keys(
    app: &App,
    access: &Access,
    account: &AccountId,
    caller: &Caller,
) -> ServiceResult<Vec<ApiKey>> {
    if app.store.get_account(account).await?.is_none() {
        return Err(ServiceError::NotFound("account"));
    }
    let mut revoked = Vec::new();
    for key in app.store.list_api_keys().await? {
        let limited_to_it = key.accounts.as_ref().is_some_and(|a| a.contains(account));
        if limited_to_it && key.revoked_at.is_none() {
            revoked.push(revoke(app, access, &key.id, caller).await?);
        }
    }
    Ok(revoked)
}
