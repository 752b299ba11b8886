//! The audit log: one row per change, read an account's newest first through
//! `audit_by_account` (account, at, id), a page at a time with the delivery log's cursors.

use super::rows::*;
use super::*;
use crate::{
    domain::{Actor, AuditAction, AuditEntry, AuditId, AuditTarget, TargetKind},
    store::AuditedChange,
};

/// The `account_id` of the operator's entries (no account has an empty id).
const OPERATOR: &str = "";

const AUDIT_COLUMNS: &str =
    "id, account_id, at, actor, action, target_kind, target_id, address, details";

fn audit_from_row(row: &Row<'_>) -> rusqlite::Result<AuditEntry> {
    let account: String = row.get(1)?;
    let actor: String = row.get(3)?;
    let action: String = row.get(4)?;
    let kind: String = row.get(5)?;
    let details: String = row.get(8)?;
    let details = match serde_json::from_str(&details) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => return Err(corrupt("audit details", &details)),
    };
    Ok(AuditEntry {
        id: AuditId::from_trusted(row.get(0)?),
        account_id: (account != OPERATOR).then(|| AccountId::from_trusted(account)),
        at: from_millis(row.get(2)?),
        actor: Actor::parse(&actor).ok_or_else(|| corrupt("audit actor", &actor))?,
        action: AuditAction::parse(&action).ok_or_else(|| corrupt("audit action", &action))?,
        target: AuditTarget {
            kind: TargetKind::parse(&kind).ok_or_else(|| corrupt("audit target", &kind))?,
            id: row.get(6)?,
        },
        address: row.get(7)?,
        details,
    })
}

/// Inserts an entry; an id that exists is a conflict.
fn insert_audit(conn: &Connection, entry: &AuditEntry) -> StoreResult<()> {
    conn.execute(
        &format!(
            "INSERT INTO audit_log ({AUDIT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
        ),
        params![
            entry.id.as_str(),
            entry
                .account_id
                .as_ref()
                .map_or(OPERATOR, AccountId::as_str),
            to_millis(entry.at),
            entry.actor.to_text(),
            entry.action.as_str(),
            entry.target.kind.as_str(),
            entry.target.id,
            entry.address,
            serde_json::Value::Object(entry.details.clone()).to_string(),
        ],
    )
    .map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::Conflict {
                entity: "audit entry",
                id: entry.id.to_string(),
            }
        } else {
            backend(e)
        }
    })?;
    Ok(())
}

impl SqliteStore {
    pub(super) async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        let entry = entry.clone();
        self.run(move |conn| insert_audit(conn, &entry)).await
    }

    pub(super) async fn audited_change(
        &self,
        change: &AuditedChange,
        entries: &[AuditEntry],
    ) -> StoreResult<()> {
        let (change, entries) = (change.clone(), entries.to_vec());
        // Sealed before the store thread: the cipher lives with the store, not the connection.
        let sealed = match &change {
            AuditedChange::CreateEndpoint { endpoint: e, .. }
            | AuditedChange::UpdateEndpoint { endpoint: e, .. } => {
                Some(sealed_secrets(e, &self.secrets)?)
            }
            _ => None,
        };
        self.run(move |conn| {
            // One savepoint: the change and its entries stand or fall together.
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            match &change {
                AuditedChange::CreateAccount(account) => {
                    super::accounts::insert_account(&tx, account)?
                }
                AuditedChange::UpdateAccount(account) => {
                    super::accounts::rewrite_account(&tx, account)?
                }
                AuditedChange::CreateEndpoint { endpoint, limit } => {
                    super::accounts::insert_endpoint(&tx, endpoint, sealed_of(&sealed)?)?;
                    if let Some(limit) = *limit {
                        super::accounts::within_endpoint_limit(&tx, &endpoint.account_id, limit)?;
                    }
                }
                AuditedChange::UpdateEndpoint { endpoint, read } => {
                    super::accounts::rewrite_endpoint(&tx, endpoint, sealed_of(&sealed)?, read)?
                }
                AuditedChange::CreateApiKey(key) => super::access::insert_api_key(&tx, key)?,
                AuditedChange::RevokeToken {
                    account,
                    token_id,
                    at,
                } => super::access::insert_token_revocation(&tx, account, token_id, *at)?,
                AuditedChange::RevokeAccountTokens { account, before } => {
                    super::access::revoke_tokens_before(&tx, account, *before)?
                }
                AuditedChange::PutSetting { key, value } => {
                    super::accounts::write_setting(&tx, key, value)?
                }
            }
            for entry in &entries {
                insert_audit(&tx, entry)?;
            }
            tx.commit().map_err(backend)
        })
        .await
    }

    pub(super) async fn list_audit(
        &self,
        account: Option<&AccountId>,
        page: &PageAfter<String>,
    ) -> StoreResult<Page<AuditEntry>> {
        let account = account.map_or(OPERATOR.to_owned(), |a| a.as_str().to_owned());
        let limit = page.limit;
        let after = page
            .after
            .as_deref()
            .map(|raw| crate::store::cursor::decode(raw).ok_or(StoreError::NotFound("cursor")))
            .transpose()?;
        self.read(move |conn| {
            let limit = limit.clamp(1, 500);
            // A row value bound keeps the read on the index from the cursor on; the first
            // page starts after every time there can be.
            let (at, id) = after.unwrap_or((i64::MAX, String::new()));
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {AUDIT_COLUMNS} FROM audit_log WHERE account_id = ?1 \
                     AND (at, id) < (?2, ?3) ORDER BY at DESC, id DESC LIMIT ?4"
                ))
                .map_err(backend)?;
            let mut items = stmt
                .query_map(
                    params![account, at, id, i64::from(limit) + 1],
                    audit_from_row,
                )
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?;
            let next_cursor = if items.len() > limit as usize {
                items.truncate(limit as usize);
                items
                    .last()
                    .map(|e| crate::store::cursor::encode(to_millis(e.at), e.id.as_str()))
            } else {
                None
            };
            Ok(Page { items, next_cursor })
        })
        .await
    }
}

/// The sealed secrets `audited_change` made for an endpoint change.
fn sealed_of(sealed: &Option<Sealed>) -> StoreResult<&Sealed> {
    sealed
        .as_ref()
        .ok_or_else(|| StoreError::Backend("an endpoint change without its sealed secrets".into()))
}
