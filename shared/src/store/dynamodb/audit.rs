//! The audit log: one control-table item per entry (`pk = audit#<account>#<id>`; the
//! operator's entries, over no one account, under `audit#*`), listed newest first through
//! the sparse `listed` index in the partition `audit#<account>`, sorted by
//! `<at, 15 digits>#<id>`: the (time, id) order of the delivery log's cursors. In the
//! control table, which every function that changes something may already write, so the
//! log needs no table or grant of its own. The index is eventually consistent: an entry
//! written a moment ago may be missing from a page for a moment.

use super::items::*;
use super::write::Write;
use super::*;
use crate::domain::{Actor, AuditAction, AuditEntry, AuditId, AuditTarget, TargetKind};

use super::access::LISTED;
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

/// What an audited change's failed condition means.
enum Refused {
    /// The change cannot be made: this error, and nothing written.
    With(StoreError),
    /// Nothing is left to do (a revocation already made): its entries are still written.
    AlreadyDone,
    /// An endpoint no longer at the version a change was made from: `Changed`, or
    /// `NotFound` when it is gone (the condition does not say which).
    EndpointMoved(AccountId, EndpointId),
}

/// The endpoint's attributes that only some endpoints have (see `endpoint_item`).
const ENDPOINT_OPTIONAL: [&str; 6] = [
    "retiring_secret",
    "retiring_until",
    "event_types",
    "rate_limit",
    "disabled_reason",
    "headers",
];
/// The failing clock: the sender's, or the marker of a disable under way.
const ENDPOINT_CLOCK: [&str; 2] = ["failing_since", "failing_shard"];

/// The update that makes an endpoint's item `item` (as `endpoint_item` builds it), leaving
/// its key, its creation time and, unless `clock`, its failing clock as they are.
fn endpoint_update(table: &str, item: Item, clock: bool) -> Write {
    let kept = |name: &str| {
        ["account_id", "id", "created_at"].contains(&name)
            || (!clock && ENDPOINT_CLOCK.contains(&name))
    };
    let removed: Vec<&str> = ENDPOINT_OPTIONAL
        .iter()
        .chain(if clock { &ENDPOINT_CLOCK[..] } else { &[] })
        .copied()
        .filter(|name| !item.contains_key(*name))
        .collect();
    let key = Item::from_iter(
        ["account_id", "id"]
            .into_iter()
            .filter_map(|name| Some((name.to_owned(), item.get(name)?.clone()))),
    );
    let set: Vec<(String, AttributeValue)> =
        item.into_iter().filter(|(name, _)| !kept(name)).collect();
    let mut expression = format!(
        "SET {}",
        (0..set.len())
            .map(|i| format!("#s{i} = :s{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !removed.is_empty() {
        let names: Vec<String> = (0..removed.len()).map(|i| format!("#r{i}")).collect();
        expression.push_str(&format!(" REMOVE {}", names.join(", ")));
    }
    let mut write = Write::update(table, key, &expression);
    for (i, (name, value)) in set.into_iter().enumerate() {
        write = write
            .name(&format!("#s{i}"), &name)
            .value(&format!(":s{i}"), value);
    }
    for (i, name) in removed.into_iter().enumerate() {
        write = write.name(&format!("#r{i}"), name);
    }
    write
}

impl DynamoStore {
    async fn refusal(&self, refused: Refused) -> StoreResult<()> {
        match refused {
            Refused::With(error) => Err(error),
            Refused::AlreadyDone => Ok(()),
            Refused::EndpointMoved(account, id) => match self.get_endpoint(&account, &id).await? {
                Some(_) => Err(StoreError::Changed("endpoint")),
                None => Err(StoreError::NotFound("endpoint")),
            },
        }
    }
}

impl DynamoStore {
    /// The change and its entries in one `TransactWriteItems`: neither is written without
    /// the other. Without entries, the change alone, as a plain conditional write. A change
    /// whose condition fails is refused as `refused` says, its entries unwritten, except
    /// a revocation already made, whose entries are written alone (as SQLite does).
    pub(super) async fn audited_change(
        &self,
        change: &AuditedChange,
        entries: &[AuditEntry],
    ) -> StoreResult<()> {
        let (write, refused) = self.change_write(change)?;
        let counted = match change {
            AuditedChange::CreateEndpoint { endpoint, limit } => {
                Some(self.endpoint_count_write(&endpoint.account_id, 1, *limit))
            }
            _ => None,
        };
        if entries.is_empty() && counted.is_none() {
            return match write.send(&self.client).await? {
                Some(()) => Ok(()),
                None => self.refusal(refused).await,
            };
        }
        let mut items = vec![write.transact_item()?];
        let counts = counted.is_some();
        if let Some(count) = counted {
            items.push(count.transact_item()?);
        }
        for entry in entries {
            items.push(self.audit_write(entry).transact_item()?);
        }
        // A key limited to 100 accounts has 100 entries: those past DynamoDB's limit on a
        // transaction are written just after it.
        let rest = items.split_off(items.len().min(MAX_TRANSACTION_ITEMS));
        match self.transact(items).await {
            Ok(()) => {}
            Err(TransactionFailure::Conditions(failed)) if failed.contains(&0) => {
                self.refusal(refused).await?;
                for entry in entries {
                    self.append_audit(entry).await?;
                }
                return Ok(());
            }
            Err(TransactionFailure::Conditions(failed)) if counts && failed == [1] => {
                return Err(StoreError::LimitReached("endpoints"));
            }
            Err(failure) => return Err(failure.into_store_error()),
        }
        for item in rest {
            self.transact(vec![item])
                .await
                .map_err(TransactionFailure::into_store_error)?;
        }
        Ok(())
    }

    /// The one write each audited change is, and what its condition failing means.
    fn change_write(&self, change: &AuditedChange) -> StoreResult<(Write, Refused)> {
        let conflict = |entity: &'static str, id: &str| {
            Refused::With(StoreError::Conflict {
                entity,
                id: id.to_owned(),
            })
        };
        let (tables, control) = (&self.tables, &self.tables.control);
        Ok(match change {
            AuditedChange::CreateAccount(account) => (
                Write::put(&tables.accounts, account_item(account))
                    .condition("attribute_not_exists(id)"),
                conflict("account", account.id.as_str()),
            ),
            AuditedChange::UpdateAccount(account) => (
                Write::put(&tables.accounts, account_item(account))
                    .condition("attribute_exists(id)"),
                Refused::With(StoreError::NotFound("account")),
            ),
            // A deleted endpoint's tombstone gives way to a new endpoint of the same id, once
            // its delete is finished (no `failing_shard` marker left): the new item would drop
            // the marker, and the old endpoint's pending deliveries, in the same log, would go
            // to the new one.
            AuditedChange::CreateEndpoint { endpoint, .. } => (
                Write::put(&tables.endpoints, endpoint_item(endpoint, &self.secrets)?)
                    .condition(
                        "attribute_not_exists(id) \
                         OR (attribute_exists(#deleted) AND attribute_not_exists(failing_shard))",
                    )
                    .name("#deleted", DELETED_AT),
                conflict("endpoint", endpoint.id.as_str()),
            ),
            // Only over the version read (see `EndpointVersion`).
            AuditedChange::UpdateEndpoint { endpoint, read } => {
                let item = endpoint_item(endpoint, &self.secrets)?;
                let write =
                    endpoint_update(&tables.endpoints, item, read.moves_failing_clock(endpoint))
                        .condition(
                            "attribute_exists(id) AND attribute_not_exists(#deleted) \
                     AND updated_at = :read_at AND #status = :read_status",
                        )
                        .name("#deleted", DELETED_AT)
                        .name("#status", "status")
                        .value(":read_at", n(to_millis(read.updated_at)))
                        .value(":read_status", s(read.status.as_str()));
                let moved =
                    Refused::EndpointMoved(endpoint.account_id.clone(), endpoint.id.clone());
                (write, moved)
            }
            AuditedChange::CreateApiKey(key) => (
                Write::put(control, super::access::api_key_item(key))
                    .condition("attribute_not_exists(pk)"),
                conflict("api key", key.id.as_str()),
            ),
            // The first revocation's time stays.
            AuditedChange::RevokeToken {
                account,
                token_id,
                at,
            } => {
                let kept = crate::clock::add(*at, super::access::TOKEN_RECORD_KEPT);
                let item = Item::from([
                    (
                        "pk".to_owned(),
                        s(super::access::revoked_pk(account, token_id)),
                    ),
                    ("revoked_at".to_owned(), n(to_millis(*at))),
                    ("expires_at".to_owned(), n(kept.timestamp())),
                ]);
                (
                    Write::put(control, item).condition("attribute_not_exists(pk)"),
                    Refused::AlreadyDone,
                )
            }
            // Only forward: a slower request with an earlier time does not undo a later one.
            AuditedChange::RevokeAccountTokens { account, before } => (
                Write::update(
                    control,
                    key1("pk", &super::access::revoked_pk(account, "*")),
                    "SET revoked_at = :at",
                )
                .condition("attribute_not_exists(revoked_at) OR revoked_at < :at")
                .value(":at", n(to_millis(*before))),
                Refused::AlreadyDone,
            ),
            AuditedChange::PutSetting { key, value } => {
                let item = Item::from([
                    ("pk".to_owned(), s(format!("setting#{key}"))),
                    ("value".to_owned(), s(value)),
                ]);
                (Write::put(control, item), Refused::AlreadyDone)
            }
        })
    }

    /// Moves `account`'s count of endpoints by `by`; with a `limit`, only from below it.
    /// The count is an item of the control table, not of the account, whose changes
    /// replace the account item whole.
    pub(super) fn endpoint_count_write(
        &self,
        account: &AccountId,
        by: i64,
        limit: Option<usize>,
    ) -> Write {
        let key = key1("pk", &format!("endpoints#{account}"));
        let write = Write::update(&self.tables.control, key, "ADD #count :by")
            .name("#count", "count")
            .value(":by", n(by));
        match limit {
            Some(limit) => write
                .condition("attribute_not_exists(#count) OR #count < :limit")
                .value(":limit", n(limit)),
            None => write,
        }
    }

    fn audit_write(&self, entry: &AuditEntry) -> Write {
        Write::put(&self.tables.control, audit_item(entry)).condition("attribute_not_exists(pk)")
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
        match self.audit_write(entry).send(&self.client).await? {
            Some(()) => Ok(()),
            None => Err(StoreError::Conflict {
                entity: "audit entry",
                id: entry.id.as_str().to_owned(),
            }),
        }
    }
}
