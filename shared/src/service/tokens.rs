use std::time::Duration;

use super::{access::Access, audit, ServiceError, ServiceResult};
use crate::{
    clock::Timestamp,
    domain::{AccountId, AuditAction, AuditTarget, Caller, InvalidField, TargetKind},
    secrets::SecretsError,
    store::{AuditedChange, Store},
    tokens::{new_token_id, TokenKey},
    App,
};

const KEY_SETTING: &str = "account_token_key";
pub const DEFAULT_TTL: Duration = Duration::from_secs(86_400);
pub const MAX_TTL: Duration = Duration::from_secs(90 * 86_400);

/// The key that signs account tokens: made on first use and kept in the store's settings,
/// so every process (and every Lambda instance) of one deployment shares it. It is sealed
/// there with the secrets key, as endpoint secrets are: whoever holds it can mint a token
/// for any account and read its endpoints' secrets through the API, so a copy of the store
/// must not hold it in the clear. One found in plaintext (kept so by an older build, or
/// written by someone without the secrets key) is replaced by a new sealed one, which
/// revokes every account token signed with it. Under the previous secrets key it is sealed
/// again under the current one.
pub async fn signing_key(store: &dyn Store) -> ServiceResult<TokenKey> {
    let cipher = store.settings_cipher().await?;
    let sealed_fresh = || -> ServiceResult<String> {
        cipher
            .seal_setting(KEY_SETTING, &TokenKey::generate().to_hex())
            .map_err(|e| corrupt(e.to_string()))
    };
    let mut stored = match store.get_setting(KEY_SETTING).await? {
        Some(stored) => stored,
        None => {
            store
                .put_setting_if_absent(KEY_SETTING, &sealed_fresh()?)
                .await?
        }
    };
    let mut replaced = 0;
    let plain = loop {
        match cipher.open_setting(KEY_SETTING, &stored) {
            Ok(plain) => break plain,
            Err(SecretsError::Plaintext) if replaced < 3 => {
                replaced += 1;
                let sealed = sealed_fresh()?;
                tracing::warn!("the account-token signing key was stored in plaintext: replaced by a new sealed key; account tokens and portal links made before no longer work");
                // Whoever replaced it first (another instance) wins; theirs is read back.
                if store.replace_setting(KEY_SETTING, &stored, &sealed).await? {
                    stored = sealed;
                } else {
                    stored = store
                        .get_setting(KEY_SETTING)
                        .await?
                        .ok_or_else(|| corrupt("vanished".into()))?;
                }
            }
            Err(e) => return Err(corrupt(e.to_string())),
        }
    };
    if cipher.needs_reseal(&stored) {
        let resealed = cipher
            .seal_setting(KEY_SETTING, &plain)
            .map_err(|e| corrupt(e.to_string()))?;
        // Not written: another instance re-sealed it first, to the same key.
        store
            .replace_setting(KEY_SETTING, &stored, &resealed)
            .await?;
    }
    TokenKey::from_hex(&plain).map_err(|e| corrupt(e.to_string()))
}

fn corrupt(reason: String) -> ServiceError {
    ServiceError::Store(crate::store::StoreError::Corrupt(format!(
        "setting {KEY_SETTING}: {reason}"
    )))
}

#[derive(Debug, Clone)]
pub struct MintedToken {
    pub token: String,
    pub token_id: String,
    pub account_id: AccountId,
    pub expires_at: Timestamp,
    pub read_only: bool,
}

/// A portal link's lifetime when the request gives none, and the longest it may have: a
/// link travels by mail and chat, so it lives hours, not the days an account token may.
pub const PORTAL_DEFAULT_TTL: Duration = Duration::from_secs(3_600);
pub const PORTAL_MAX_TTL: Duration = Duration::from_secs(7 * 86_400);

/// Mints a token that reaches only `account`, for `ttl` (1 s to 90 days), and no later than
/// `not_after` (the minting credential's own expiry).
pub async fn mint(
    app: &App,
    key: &TokenKey,
    account: &AccountId,
    (ttl, not_after): (Duration, Option<Timestamp>),
    caller: &Caller,
) -> ServiceResult<MintedToken> {
    let grant = Grant {
        ttl,
        not_after,
        max_ttl: MAX_TTL,
        read_only: false,
        action: AuditAction::TokenCreated,
    };
    issue(app, key, account, grant, caller).await
}

/// Mints the token of a portal link to `account`'s page: like [`mint`], for `ttl` (1 s to
/// 7 days, no later than `not_after`), optionally read-only. Revoked as any account token
/// is, by its id.
pub async fn portal_link(
    app: &App,
    key: &TokenKey,
    account: &AccountId,
    (ttl, not_after, read_only): (Duration, Option<Timestamp>, bool),
    caller: &Caller,
) -> ServiceResult<MintedToken> {
    let grant = Grant {
        ttl,
        not_after,
        max_ttl: PORTAL_MAX_TTL,
        read_only,
        action: AuditAction::PortalLinkCreated,
    };
    issue(app, key, account, grant, caller).await
}

struct Grant {
    ttl: Duration,
    /// A key that expires mints nothing that outlives it.
    not_after: Option<Timestamp>,
    max_ttl: Duration,
    read_only: bool,
    action: AuditAction,
}

async fn issue(
    app: &App,
    key: &TokenKey,
    account: &AccountId,
    grant: Grant,
    caller: &Caller,
) -> ServiceResult<MintedToken> {
    if grant.ttl.is_zero() || grant.ttl > grant.max_ttl {
        return Err(InvalidField::new(
            "ttl_seconds",
            format!("must be between 1 and {} seconds", grant.max_ttl.as_secs()),
        )
        .into());
    }
    if app.store.get_account(account).await?.is_none() {
        return Err(ServiceError::NotFound("account"));
    }
    // Tokens carry whole seconds.
    let now = app.clock.now();
    let expires_at = crate::clock::add(now, grant.ttl);
    let expires_at = grant.not_after.map_or(expires_at, |at| at.min(expires_at));
    let expires_at =
        chrono::DateTime::from_timestamp(expires_at.timestamp(), 0).unwrap_or(expires_at);
    let token_id = new_token_id();
    // The token itself stays out: its id is enough to revoke it.
    audit::record(
        app,
        caller,
        Some(account),
        grant.action,
        AuditTarget::new(TargetKind::Token, &token_id),
        audit::details(serde_json::json!({
            "expires_at": crate::clock::to_text(expires_at),
            "read_only": grant.read_only,
        })),
    )
    .await?;
    Ok(MintedToken {
        token: key.mint(account, &token_id, (now, expires_at), grant.read_only),
        token_id,
        account_id: account.clone(),
        expires_at,
        read_only: grant.read_only,
    })
}

/// Whether `raw` is a token id as [`new_token_id`] makes them (`tok_` and 32 hex digits).
pub fn is_token_id(raw: &str) -> bool {
    raw.strip_prefix("tok_").is_some_and(|hex| {
        hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// Revokes one token of the account: this process refuses it from now on, others within
/// their cache's time (`Access`). Portal links, being account tokens, are revoked the same way.
pub async fn revoke(
    app: &App,
    access: &Access,
    account: &AccountId,
    token_id: &str,
    caller: &Caller,
) -> ServiceResult<()> {
    if !is_token_id(token_id) {
        return Err(ServiceError::NotFound("token"));
    }
    if app.store.get_account(account).await?.is_none() {
        return Err(ServiceError::NotFound("account"));
    }
    let entry = audit::entry(
        app,
        caller,
        Some(account),
        AuditAction::TokenRevoked,
        AuditTarget::new(TargetKind::Token, token_id),
        serde_json::json!({}),
    );
    let change = AuditedChange::RevokeToken {
        account: account.clone(),
        token_id: token_id.to_owned(),
        at: app.clock.now(),
    };
    audit::change(app, change, &[entry]).await?;
    access.forget_account_tokens(account);
    Ok(())
}

/// Revokes every token of the account issued until now; tokens minted afterwards work.
/// Returns the time up to which tokens are revoked.
pub async fn revoke_all(
    app: &App,
    access: &Access,
    account: &AccountId,
    caller: &Caller,
) -> ServiceResult<Timestamp> {
    if app.store.get_account(account).await?.is_none() {
        return Err(ServiceError::NotFound("account"));
    }
    let now = app.clock.now();
    let entry = audit::entry(
        app,
        caller,
        Some(account),
        AuditAction::TokensRevoked,
        AuditTarget::new(TargetKind::Account, account),
        serde_json::json!({ "tokens_revoked_before": crate::clock::to_text(now) }),
    );
    let change = AuditedChange::RevokeAccountTokens {
        account: account.clone(),
        before: now,
    };
    audit::change(app, change, &[entry]).await?;
    access.forget_account_tokens(account);
    Ok(now)
}
