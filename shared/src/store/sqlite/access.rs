//! Scoped API keys, and revoked account tokens (`token_revocations`: one row per revoked
//! token, and the row `*` of an account for "every token issued up to then").

use super::rows::*;
use super::*;
use crate::{
    domain::{access::Scope, ApiKey, ApiKeyId},
    store::{TokenRef, TokenRevocation},
};

/// The `token_id` of an account's "every token up to" row: no token id is `*`.
const EVERY_TOKEN: &str = "*";

const KEY_COLUMNS: &str =
    "id, name, scopes, accounts, secret_sha256, created_at, created_by, expires_at, revoked_at";

/// Scopes as one space-separated column; accounts as a JSON array (NULL: every account).
fn key_from_row(row: &Row<'_>) -> rusqlite::Result<ApiKey> {
    let scopes: String = row.get(2)?;
    let scopes = scopes
        .split(' ')
        .map(|name| Scope::parse(name).ok_or_else(|| corrupt("api key scope", name)))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let accounts: Option<String> = row.get(3)?;
    let accounts = accounts
        .map(|raw| {
            serde_json::from_str::<Vec<String>>(&raw)
                .map(|ids| ids.into_iter().map(AccountId::from_trusted).collect())
                .map_err(|e| corrupt("api key accounts", e))
        })
        .transpose()?;
    Ok(ApiKey {
        id: ApiKeyId::from_trusted(row.get(0)?),
        name: row.get(1)?,
        scopes,
        accounts,
        secret_sha256: row.get(4)?,
        created_at: from_millis(row.get(5)?),
        created_by: row.get(6)?,
        expires_at: row.get::<_, Option<i64>>(7)?.map(from_millis),
        revoked_at: row.get::<_, Option<i64>>(8)?.map(from_millis),
    })
}

fn get_key(conn: &Connection, id: &str) -> StoreResult<Option<ApiKey>> {
    conn.query_row(
        &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?1"),
        params![id],
        key_from_row,
    )
    .optional()
    .map_err(backend)
}

impl SqliteStore {
    pub(super) async fn create_api_key(&self, key: &ApiKey) -> StoreResult<()> {
        let key = key.clone();
        self.run(move |conn| insert_api_key(conn, &key)).await
    }

    pub(super) async fn get_api_key(&self, id: &ApiKeyId) -> StoreResult<Option<ApiKey>> {
        let id = id.clone();
        self.read(move |conn| get_key(conn, id.as_str())).await
    }

    pub(super) async fn list_api_keys(&self) -> StoreResult<Vec<ApiKey>> {
        self.read(move |conn| {
            conn.prepare(&format!(
                "SELECT {KEY_COLUMNS} FROM api_keys ORDER BY id DESC"
            ))
            .and_then(|mut s| s.query_map([], key_from_row)?.collect())
            .map_err(backend)
        })
        .await
    }

    pub(super) async fn revoke_api_key(
        &self,
        id: &ApiKeyId,
        at: Timestamp,
    ) -> StoreResult<Option<ApiKey>> {
        let id = id.clone();
        self.run(move |conn| {
            conn.execute(
                "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                params![id.as_str(), to_millis(at)],
            )
            .map_err(backend)?;
            get_key(conn, id.as_str())
        })
        .await
    }

    pub(super) async fn revoke_token(&self, token: &TokenRef, at: Timestamp) -> StoreResult<()> {
        let TokenRef { account, token_id } = token.clone();
        self.run(move |conn| insert_token_revocation(conn, &account, &token_id, at))
            .await
    }

    pub(super) async fn revoke_account_tokens(
        &self,
        account: &AccountId,
        before: Timestamp,
    ) -> StoreResult<()> {
        let account = account.clone();
        self.run(move |conn| revoke_tokens_before(conn, &account, before))
            .await
    }

    pub(super) async fn token_revocation(&self, token: &TokenRef) -> StoreResult<TokenRevocation> {
        let TokenRef { account, token_id } = token.clone();
        self.read(move |conn| {
            let mut revocation = TokenRevocation::default();
            let mut statement = conn
                .prepare_cached(
                    "SELECT token_id, revoked_at FROM token_revocations \
                     WHERE account_id = ?1 AND token_id IN (?2, ?3)",
                )
                .map_err(backend)?;
            let rows = statement
                .query_map(params![account.as_str(), token_id, EVERY_TOKEN], |row| {
                    Ok((row.get::<_, String>(0)?, from_millis(row.get(1)?)))
                })
                .map_err(backend)?;
            for row in rows {
                let (id, at) = row.map_err(backend)?;
                if id == EVERY_TOKEN {
                    revocation.account_tokens_before = Some(at);
                } else {
                    revocation.revoked_at = Some(at);
                }
            }
            Ok(revocation)
        })
        .await
    }
}

/// The write of `create_api_key`, on the store thread; `audited_change` runs it too.
pub(super) fn insert_api_key(conn: &Connection, key: &ApiKey) -> StoreResult<()> {
    let scopes: Vec<&str> = key.scopes.iter().map(|s| s.as_str()).collect();
    let accounts = key.accounts.as_ref().map(|ids| {
        serde_json::to_string(&ids.iter().map(AccountId::as_str).collect::<Vec<_>>())
            .unwrap_or_default()
    });
    conn.execute(
        &format!(
            "INSERT INTO api_keys ({KEY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
        ),
        params![
            key.id.as_str(),
            key.name,
            scopes.join(" "),
            accounts,
            key.secret_sha256,
            to_millis(key.created_at),
            key.created_by,
            opt_millis(key.expires_at),
            opt_millis(key.revoked_at),
        ],
    )
    .map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::Conflict {
                entity: "api key",
                id: key.id.to_string(),
            }
        } else {
            backend(e)
        }
    })?;
    Ok(())
}

/// The write of `revoke_token`; `audited_change` runs it too.
pub(super) fn insert_token_revocation(
    conn: &Connection,
    account: &AccountId,
    token_id: &str,
    at: Timestamp,
) -> StoreResult<()> {
    conn.execute(
        "INSERT OR IGNORE INTO token_revocations (account_id, token_id, revoked_at) VALUES (?1, ?2, ?3)",
        params![account.as_str(), token_id, to_millis(at)],
    )
    .map_err(backend)?;
    Ok(())
}

/// The write of `revoke_account_tokens`; `audited_change` runs it too.
pub(super) fn revoke_tokens_before(
    conn: &Connection,
    account: &AccountId,
    before: Timestamp,
) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO token_revocations (account_id, token_id, revoked_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (account_id, token_id) DO UPDATE SET revoked_at = MAX(revoked_at, excluded.revoked_at)",
        params![account.as_str(), EVERY_TOKEN, to_millis(before)],
    )
    .map_err(backend)?;
    Ok(())
}
