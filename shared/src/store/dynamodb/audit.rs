//! The audit log: one control-table item per entry (`pk = audit#<account>#<id>`; the
//! operator's entries, over no one account, under `audit#*`), listed newest first through
//! the sparse `listed` index in the partition `audit#<account>`, sorted by
//! `<at, 15 digits>#<id>`: the (time, id) order of the delivery log's cursors. In the
//! control table, which every function that changes something may already write, so the
//! log needs no table or grant of its own. The index is eventually consistent: an entry
//! written a moment ago may be missing from a page for a moment.

use super::items::*;
use super::*;
use crate::{
    domain::{Actor, AuditAction, AuditEntry, AuditId, AuditTarget, TargetKind},
    store::AuditedChange,
};

const LISTED: &str = "listed";
/// The account part of the operator's entries (no account id holds `*`).
const OPERATOR: &str = "*";

fn audit_list(account: Option<&AccountId>) -> String {
    format!("audit#{}", account.map_or(OPERATOR, AccountId::as_str))
}

fn list_key(at_millis: i64, id: &str) -> String {
    format!("{at_millis:015}#{id}")
}

fn audit_item(entry: &AuditEntry) -> Item {
    let list = audit_list(entry.account_id.as_ref());
    let mut item = Item::from([
        ("pk".to_owned(), s(format!("{list}#{}", entry.id))),
        (
            "list_key".to_owned(),
            s(list_key(to_millis(entry.at), entry.id.as_str())),
        ),
        ("list".to_owned(), s(list)),
        ("id".to_owned(), s(entry.id.as_str())),
        ("at".to_owned(), n(to_millis(entry.at))),
        ("actor".to_owned(), s(entry.actor.to_text())),
        ("action".to_owned(), s(entry.action.as_str())),
        ("target_kind".to_owned(), s(entry.target.kind.as_str())),
        ("target_id".to_owned(), s(&entry.target.id)),
        (
            "details".to_owned(),
            s(serde_json::Value::Object(entry.details.clone()).to_string()),
        ),
    ]);
    if let Some(account) = &entry.account_id {
        item.insert("account_id".to_owned(), s(account.as_str()));
    }
    if let Some(address) = &entry.address {
        item.insert("address".to_owned(), s(address));
    }
    item
}

fn audit_from_item(item: &Item) -> StoreResult<AuditEntry> {
    let details = match serde_json::from_str(&get_s(item, "details")?) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => return Err(corrupt("details")),
    };
    Ok(AuditEntry {
        id: AuditId::from_trusted(get_s(item, "id")?),
        account_id: opt_s(item, "account_id").map(AccountId::from_trusted),
        at: from_millis(get_n(item, "at")?),
        actor: Actor::parse(&get_s(item, "actor")?).ok_or_else(|| corrupt("actor"))?,
        action: AuditAction::parse(&get_s(item, "action")?).ok_or_else(|| corrupt("action"))?,
        target: AuditTarget {
            kind: TargetKind::parse(&get_s(item, "target_kind")?)
                .ok_or_else(|| corrupt("target_kind"))?,
            id: get_s(item, "target_id")?,
        },
        address: opt_s(item, "address"),
        details,
    })
}

impl DynamoStore {
    /// The change, then its entries: DynamoDB has no transaction across the SDK calls
    /// the changes are made of, so a failure after the change leaves it without entries.
    pub(super) async fn audited_change(
        &self,
        change: &AuditedChange,
        entries: &[AuditEntry],
    ) -> StoreResult<()> {
        match change {
            AuditedChange::CreateAccount(account) => self.create_account(account).await?,
            AuditedChange::UpdateAccount(account) => self.update_account(account).await?,
            AuditedChange::CreateEndpoint(endpoint) => self.create_endpoint(endpoint).await?,
            AuditedChange::UpdateEndpoint(endpoint) => self.update_endpoint(endpoint).await?,
            AuditedChange::CreateApiKey(key) => self.create_api_key(key).await?,
            AuditedChange::RevokeToken {
                account,
                token_id,
                at,
            } => {
                let token = crate::store::TokenRef {
                    account: account.clone(),
                    token_id: token_id.clone(),
                };
                self.revoke_token(&token, *at).await?
            }
            AuditedChange::RevokeAccountTokens { account, before } => {
                self.revoke_account_tokens(account, *before).await?
            }
            AuditedChange::PutSetting { key, value } => self.put_setting(key, value).await?,
        }
        for entry in entries {
            self.append_audit(entry).await?;
        }
        Ok(())
    }

    pub(super) async fn list_audit(
        &self,
        account: Option<&AccountId>,
        page: &PageAfter<String>,
    ) -> StoreResult<Page<AuditEntry>> {
        let (cursor, limit) = (page.after.as_deref(), page.limit);
        let limit = limit.clamp(1, 500) as usize;
        let before = match cursor {
            Some(raw) => {
                let (at, id) =
                    crate::store::cursor::decode(raw).ok_or(StoreError::NotFound("cursor"))?;
                list_key(at, &id)
            }
            // Past every list key: digits sort before `~`.
            None => "~".to_owned(),
        };
        let request = self
            .client
            .query()
            .table_name(&self.tables.control)
            .index_name(LISTED)
            .key_condition_expression("#list = :list AND list_key < :before")
            .expression_attribute_names("#list", "list")
            .expression_attribute_values(":list", s(audit_list(account)))
            .expression_attribute_values(":before", s(before))
            .scan_index_forward(false);
        // One more than the page, to know whether another follows.
        let wanted = limit + 1;
        let items = self.query_at_most(request, wanted).await?;
        let mut entries = items
            .iter()
            .map(audit_from_item)
            .collect::<StoreResult<Vec<_>>>()?;
        let next_cursor = if entries.len() > limit {
            entries.truncate(limit);
            entries
                .last()
                .map(|e| crate::store::cursor::encode(to_millis(e.at), e.id.as_str()))
        } else {
            None
        };
        Ok(Page {
            items: entries,
            next_cursor,
        })
    }

    pub(super) async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        self.put_new_control_item(audit_item(entry), "audit entry", entry.id.as_str())
            .await
    }
}
