//! The audit log's store contract: entries kept as written, listed per account (and the
//! operator's apart) newest first by (time, id), a page at a time with the delivery log's
//! cursors, without gaps or repeats.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hooklane::{
    clock::add,
    domain::{
        AccountId, Actor, ApiKeyId, AuditAction, AuditEntry, AuditTarget, Caller, TargetKind,
    },
    store::{cursor, Store, StoreError},
};

use crate::fixtures::{account, t0};

fn entry(account: Option<&str>, second: u64, actor: Actor, action: AuditAction) -> AuditEntry {
    AuditEntry::new(
        account.map(|id| AccountId::parse(id).unwrap()),
        add(t0(), Duration::from_secs(second)),
        &Caller::new(actor, Some("127.0.0.1".into())),
        action,
        AuditTarget::new(TargetKind::Endpoint, format!("ep_{second}")),
        serde_json::json!({"changed": ["url"], "n": second})
            .as_object()
            .cloned()
            .unwrap(),
    )
}

/// Every entry of a log, reading it `limit` at a time.
async fn read_all(store: &dyn Store, account: Option<&AccountId>, limit: u32) -> Vec<AuditEntry> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list_audit(account, after.as_deref(), limit)
            .await
            .unwrap();
        assert!(page.items.len() <= limit as usize);
        all.extend(page.items);
        match page.next_cursor {
            Some(next) => {
                let last = all.last().expect("a page with a cursor has entries");
                assert_eq!(
                    cursor::decode(&next),
                    Some((hooklane::clock::to_millis(last.at), last.id.to_string())),
                    "the cursor is the last entry's (time, id)"
                );
                after = Some(next);
            }
            None => return all,
        }
    }
}

pub async fn audit_log_is_listed_per_account_newest_first_in_pages(store: &dyn Store) {
    let acme = AccountId::parse("acme").unwrap();
    store.create_account(&account("acme")).await.unwrap();
    store.create_account(&account("beta")).await.unwrap();
    assert!(store
        .list_audit(Some(&acme), None, 10)
        .await
        .unwrap()
        .items
        .is_empty());

    let key = ApiKeyId::generate();
    let mut written = vec![
        entry(Some("acme"), 1, Actor::Admin, AuditAction::EndpointCreated),
        entry(
            Some("acme"),
            3,
            Actor::Key(key.clone()),
            AuditAction::EndpointUpdated,
        ),
        entry(
            Some("acme"),
            2,
            Actor::Token("tok_1".into()),
            AuditAction::EndpointSecretRotated,
        ),
        // Two in the same millisecond: the id orders them.
        entry(
            Some("acme"),
            3,
            Actor::System,
            AuditAction::EndpointDisabled,
        ),
        entry(Some("acme"), 5, Actor::Admin, AuditAction::EndpointDeleted),
        entry(Some("beta"), 4, Actor::Admin, AuditAction::AccountUpdated),
        entry(None, 4, Actor::Admin, AuditAction::AdminTokenRotated),
    ];
    written[3].address = None;
    for e in &written {
        store.append_audit(e).await.unwrap();
    }
    assert!(matches!(
        store.append_audit(&written[0]).await,
        Err(StoreError::Conflict { .. })
    ));

    let mut expected: Vec<AuditEntry> = written
        .iter()
        .filter(|e| e.account_id.as_ref() == Some(&acme))
        .cloned()
        .collect();
    expected.sort_by(|a, b| (b.at, &b.id).cmp(&(a.at, &a.id)));
    // Entries come back as written, whole, newest first, whatever the page size.
    for limit in [1, 2, 3, 500] {
        assert_eq!(
            read_all(store, Some(&acme), limit).await,
            expected,
            "limit {limit}"
        );
    }
    let first = store.list_audit(Some(&acme), None, 2).await.unwrap();
    assert_eq!(first.items, expected[..2]);
    assert!(first.next_cursor.is_some());
    let last = store.list_audit(Some(&acme), None, 5).await.unwrap();
    assert_eq!(
        last.next_cursor, None,
        "a page that ends the log has no cursor"
    );

    // Each account's log, and the operator's, hold their own entries only.
    let beta = read_all(store, Some(&AccountId::parse("beta").unwrap()), 10).await;
    assert_eq!(beta, vec![written[5].clone()]);
    assert_eq!(read_all(store, None, 10).await, vec![written[6].clone()]);
    let nobody = AccountId::parse("nobody").unwrap();
    assert!(store
        .list_audit(Some(&nobody), None, 10)
        .await
        .unwrap()
        .items
        .is_empty());
}
