//! Scoped API keys: one control-table item each (`pk = apikey#<id>`), read by key on every
//! request that presents one; listed through the sparse `listed` index. Revoked account
//! tokens: `pk = revoked#<account>#<token id>`, expiring (TTL) once no token of that id can
//! be valid any more, and `revoked#<account>#*`, "every token issued up to `revoked_at`".

use super::items::*;
use super::*;
use crate::{
    domain::{access::Scope, ApiKey, ApiKeyId},
    store::{TokenRef, TokenRevocation},
};

/// How long a revoked token's record is kept: longer than any token lives (90 days).
pub(super) const TOKEN_RECORD_KEPT: std::time::Duration =
    std::time::Duration::from_secs(91 * 86_400);

pub(super) fn revoked_pk(account: &AccountId, token_id: &str) -> String {
    format!("revoked#{account}#{token_id}")
}

/// The sparse index that lists control items by kind, and its partition for API keys.
pub(super) const LISTED: &str = "listed";
const API_KEYS: &str = "apikeys";

fn key_pk(id: &ApiKeyId) -> String {
    format!("apikey#{id}")
}

pub(super) fn api_key_item(key: &ApiKey) -> Item {
    let mut item = Item::from([
        ("pk".to_owned(), s(key_pk(&key.id))),
        ("list".to_owned(), s(API_KEYS)),
        ("list_key".to_owned(), s(key.id.as_str())),
        ("id".to_owned(), s(key.id.as_str())),
        ("name".to_owned(), s(&key.name)),
        (
            "scopes".to_owned(),
            AttributeValue::Ss(key.scopes.iter().map(|s| s.as_str().to_owned()).collect()),
        ),
        ("secret_sha256".to_owned(), s(&key.secret_sha256)),
        ("created_at".to_owned(), n(to_millis(key.created_at))),
        ("created_by".to_owned(), s(&key.created_by)),
    ]);
    if let Some(accounts) = &key.accounts {
        item.insert(
            "accounts".to_owned(),
            AttributeValue::Ss(accounts.iter().map(|a| a.as_str().to_owned()).collect()),
        );
    }
    // Not `expires_at`: that is the table's TTL attribute, and an expired key stays listed.
    if let Some(at) = key.expires_at {
        item.insert("key_expires_at".to_owned(), n(to_millis(at)));
    }
    if let Some(at) = key.revoked_at {
        item.insert("revoked_at".to_owned(), n(to_millis(at)));
    }
    item
}

fn string_set(item: &Item, name: &str) -> StoreResult<Option<Vec<String>>> {
    match item.get(name) {
        Some(AttributeValue::Ss(values)) => Ok(Some(values.clone())),
        None => Ok(None),
        Some(_) => Err(corrupt(name)),
    }
}

fn api_key_from_item(item: &Item) -> StoreResult<ApiKey> {
    let mut scopes = string_set(item, "scopes")?
        .ok_or_else(|| corrupt("scopes"))?
        .iter()
        .map(|name| Scope::parse(name).ok_or_else(|| corrupt("scopes")))
        .collect::<StoreResult<Vec<_>>>()?;
    scopes.sort();
    let accounts = string_set(item, "accounts")?.map(|ids| {
        let mut ids: Vec<AccountId> = ids.into_iter().map(AccountId::from_trusted).collect();
        ids.sort();
        ids
    });
    Ok(ApiKey {
        id: ApiKeyId::from_trusted(get_s(item, "id")?),
        name: get_s(item, "name")?,
        scopes,
        accounts,
        secret_sha256: get_s(item, "secret_sha256")?,
        created_at: from_millis(get_n(item, "created_at")?),
        created_by: get_s(item, "created_by")?,
        expires_at: opt_n(item, "key_expires_at")?.map(from_millis),
        revoked_at: opt_n(item, "revoked_at")?.map(from_millis),
    })
}

impl DynamoStore {
    pub(super) async fn create_api_key(&self, key: &ApiKey) -> StoreResult<()> {
        self.audited_change(&AuditedChange::CreateApiKey(key.clone()), &[])
            .await
    }

    pub(super) async fn get_api_key(&self, id: &ApiKeyId) -> StoreResult<Option<ApiKey>> {
        self.get(&self.tables.control, key1("pk", &key_pk(id)))
            .await?
            .map(|item| api_key_from_item(&item))
            .transpose()
    }

    /// Every control item listed under `list`, by `list_key` (`newest_first`: descending).
    /// Through a global secondary index, so eventually consistent.
    pub(super) async fn listed(&self, list: &str, newest_first: bool) -> StoreResult<Vec<Item>> {
        self.query_all(
            self.client
                .query()
                .table_name(&self.tables.control)
                .index_name(LISTED)
                .key_condition_expression("#list = :list")
                .expression_attribute_names("#list", "list")
                .expression_attribute_values(":list", s(list))
                .scan_index_forward(!newest_first),
        )
        .await
    }

    /// A key created a moment ago may be missing from the list for a moment (authentication
    /// reads the item itself).
    pub(super) async fn list_api_keys(&self) -> StoreResult<Vec<ApiKey>> {
        let items = self.listed(API_KEYS, true).await?;
        items.iter().map(api_key_from_item).collect()
    }

    pub(super) async fn revoke_api_key(
        &self,
        id: &ApiKeyId,
        at: Timestamp,
    ) -> StoreResult<Option<ApiKey>> {
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.control)
            .key("pk", s(key_pk(id)))
            .update_expression("SET revoked_at = if_not_exists(revoked_at, :at)")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":at", n(to_millis(at)))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        written(result)?
            .and_then(|out| out.attributes)
            .map(|item| api_key_from_item(&item))
            .transpose()
    }

    pub(super) async fn revoke_token(&self, token: &TokenRef, at: Timestamp) -> StoreResult<()> {
        let change = AuditedChange::RevokeToken {
            account: token.account.clone(),
            token_id: token.token_id.clone(),
            at,
        };
        self.audited_change(&change, &[]).await
    }

    pub(super) async fn revoke_account_tokens(
        &self,
        account: &AccountId,
        before: Timestamp,
    ) -> StoreResult<()> {
        let change = AuditedChange::RevokeAccountTokens {
            account: account.clone(),
            before,
        };
        self.audited_change(&change, &[]).await
    }

    pub(super) async fn token_revocation(&self, token: &TokenRef) -> StoreResult<TokenRevocation> {
        let control = &self.tables.control;
        let (token, every) = tokio::try_join!(
            self.get(
                control,
                key1("pk", &revoked_pk(&token.account, &token.token_id))
            ),
            self.get(control, key1("pk", &revoked_pk(&token.account, "*"))),
        )?;
        let at = |item: Option<Item>| -> StoreResult<Option<Timestamp>> {
            Ok(item
                .map(|item| get_n::<i64>(&item, "revoked_at"))
                .transpose()?
                .map(from_millis))
        };
        Ok(TokenRevocation {
            revoked_at: at(token)?,
            account_tokens_before: at(every)?,
        })
    }
}
