use std::time::Duration;

use super::{ServiceError, ServiceResult};
use crate::{
    clock::Timestamp,
    domain::{AccountId, InvalidField},
    store::Store,
    tokens::{new_token_id, TokenKey},
    App,
};

const KEY_SETTING: &str = "account_token_key";
pub const DEFAULT_TTL: Duration = Duration::from_secs(86_400);
pub const MAX_TTL: Duration = Duration::from_secs(90 * 86_400);

/// The key that signs account tokens: made on first use and kept in the store's settings,
/// so every process (and every Lambda instance) of one deployment shares it.
pub async fn signing_key(store: &dyn Store) -> ServiceResult<TokenKey> {
    let stored = match store.get_setting(KEY_SETTING).await? {
        Some(stored) => stored,
        None => {
            store
                .put_setting_if_absent(KEY_SETTING, &TokenKey::generate().to_hex())
                .await?
        }
    };
    TokenKey::from_hex(&stored).map_err(|e| {
        ServiceError::Store(crate::store::StoreError::Corrupt(format!(
            "setting {KEY_SETTING}: {e}"
        )))
    })
}

#[derive(Debug, Clone)]
pub struct MintedToken {
    pub token: String,
    pub token_id: String,
    pub account_id: AccountId,
    pub expires_at: Timestamp,
}

/// Mints a token that reaches only `account`, for `ttl` (1 s to 90 days).
pub async fn mint(
    app: &App,
    key: &TokenKey,
    account: &AccountId,
    ttl: Duration,
) -> ServiceResult<MintedToken> {
    if ttl.is_zero() || ttl > MAX_TTL {
        return Err(InvalidField::new(
            "ttl_seconds",
            format!("must be between 1 and {} seconds", MAX_TTL.as_secs()),
        )
        .into());
    }
    if app.store.get_account(account).await?.is_none() {
        return Err(ServiceError::NotFound("account"));
    }
    // Tokens carry whole seconds.
    let expires_at = crate::clock::add(app.clock.now(), ttl);
    let expires_at =
        chrono::DateTime::from_timestamp(expires_at.timestamp(), 0).unwrap_or(expires_at);
    let token_id = new_token_id();
    Ok(MintedToken {
        token: key.mint(account, &token_id, expires_at),
        token_id,
        account_id: account.clone(),
        expires_at,
    })
}
