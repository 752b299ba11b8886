//! The audit log: each use-case that changes something records who asked (the caller's
//! credential and address), what, and to what, once the change is made; and the log is
//! read back a page at a time.
//!
//! The plain writes (accounts, endpoints, keys, token revocations, the admin token) go with
//! their entries through `Store::audited_change`: one transaction on SQLite, the change then
//! its entries on DynamoDB. The changes whose entry depends on what the store did (deleting
//! or disabling an endpoint, revoking a key, replays, erasures) are recorded just after they
//! are made: a failure between the two leaves the change without its entry, and is logged
//! as an error.

use serde_json::{Map, Value};

use super::ServiceResult;
use crate::{
    domain::{AccountId, AuditAction, AuditEntry, AuditTarget, Caller},
    store::{AuditedChange, Page, Store},
    App,
};

/// The entry of a change `caller` asks for now.
pub fn entry(
    app: &App,
    caller: &Caller,
    account: Option<&AccountId>,
    action: AuditAction,
    target: AuditTarget,
    details: Value,
) -> AuditEntry {
    let details = self::details(details);
    AuditEntry::new(
        account.cloned(),
        app.clock.now(),
        caller,
        action,
        target,
        details,
    )
}

/// Makes `change` and writes its `entries` together (`Store::audited_change`).
pub async fn change(app: &App, change: AuditedChange, entries: &[AuditEntry]) -> ServiceResult<()> {
    app.store.audited_change(&change, entries).await?;
    for entry in entries {
        tracing::info!(audit.id = %entry.id, audit.action = %entry.action, audit.actor = %entry.actor.to_text(), audit.target = %entry.target.id, "audited");
    }
    Ok(())
}

/// `details` as the object an entry holds (anything else holds nothing).
pub fn details(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// Records a change made on `caller`'s request; `account` `None` is the operator's log.
pub async fn record(
    app: &App,
    caller: &Caller,
    account: Option<&AccountId>,
    action: AuditAction,
    target: AuditTarget,
    details: Map<String, Value>,
) -> ServiceResult<()> {
    let entry = self::entry(app, caller, account, action, target, Value::Object(details));
    append(app.store.as_ref(), entry).await
}

/// Writes an entry [`record`] made; an entry that cannot be written fails the request.
async fn append(store: &dyn Store, entry: AuditEntry) -> ServiceResult<()> {
    let action = entry.action;
    if let Err(error) = store.append_audit(&entry).await {
        tracing::error!(audit.action = %action, audit.target = %entry.target.id, %error, "the change was made but its audit entry was not written");
        return Err(error.into());
    }
    tracing::info!(audit.id = %entry.id, audit.action = %action, audit.actor = %entry.actor.to_text(), audit.target = %entry.target.id, "audited");
    Ok(())
}

/// The account's log (`None`: the operator's), newest first.
pub async fn list(
    app: &App,
    account: Option<&AccountId>,
    cursor: Option<&str>,
    limit: u32,
) -> ServiceResult<Page<AuditEntry>> {
    if let Some(account) = account {
        if app.store.get_account(account).await?.is_none() {
            return Err(super::ServiceError::NotFound("account"));
        }
    }
    let page = crate::store::PageAfter {
        after: cursor.map(str::to_owned),
        limit,
    };
    Ok(app.store.list_audit(account, &page).await?)
}
