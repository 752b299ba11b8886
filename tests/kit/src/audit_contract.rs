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
    store::{cursor, PageAfter, Store, StoreError},
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
            .list_audit(
                account,
                &PageAfter {
                    after: after.clone(),
                    limit,
                },
            )
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
        .list_audit(Some(&acme), &PageAfter::first(10))
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
    let first = store
        .list_audit(Some(&acme), &PageAfter::first(2))
        .await
        .unwrap();
    assert_eq!(first.items, expected[..2]);
    assert!(first.next_cursor.is_some());
    let last = store
        .list_audit(Some(&acme), &PageAfter::first(5))
        .await
        .unwrap();
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
        .list_audit(Some(&nobody), &PageAfter::first(10))
        .await
        .unwrap()
        .items
        .is_empty());
}

async fn token_revocation(
    store: &dyn Store,
    account: &AccountId,
    token_id: &str,
) -> hooklane::store::TokenRevocation {
    let token = hooklane::store::TokenRef {
        account: account.clone(),
        token_id: token_id.to_owned(),
    };
    store.token_revocation(&token).await.unwrap()
}

pub async fn audited_changes_are_written_with_their_entries(store: &dyn Store) {
    use hooklane::store::AuditedChange;
    let acme = AccountId::parse("acme").unwrap();
    let created = entry(Some("acme"), 1, Actor::Admin, AuditAction::AccountCreated);
    let change = AuditedChange::CreateAccount(account("acme"));
    store
        .audited_change(&change, std::slice::from_ref(&created))
        .await
        .unwrap();
    assert!(store.get_account(&acme).await.unwrap().is_some());

    let endpoint = crate::fixtures::endpoint("acme", "ep_a", t0());
    let added = entry(Some("acme"), 2, Actor::Admin, AuditAction::EndpointCreated);
    let change = AuditedChange::CreateEndpoint {
        endpoint: endpoint.clone(),
        limit: Some(1),
    };
    store
        .audited_change(&change, std::slice::from_ref(&added))
        .await
        .unwrap();
    // A change that fails writes no entry.
    let again = entry(Some("acme"), 3, Actor::Admin, AuditAction::EndpointCreated);
    assert!(matches!(
        store.audited_change(&change, &[again]).await,
        Err(StoreError::Conflict { .. })
    ));
    let mut changed = endpoint.clone();
    changed.max_in_flight = 9;
    changed.touch(t0());
    let updated = entry(Some("acme"), 4, Actor::Admin, AuditAction::EndpointUpdated);
    let change = AuditedChange::UpdateEndpoint {
        endpoint: changed,
        read: endpoint.version(),
    };
    store
        .audited_change(&change, std::slice::from_ref(&updated))
        .await
        .unwrap();
    // A change made from the version before that one is refused, with its entry.
    let stale = entry(Some("acme"), 4, Actor::Admin, AuditAction::EndpointUpdated);
    assert!(matches!(
        store.audited_change(&change, &[stale]).await,
        Err(StoreError::Changed("endpoint"))
    ));
    let stored = store
        .get_endpoint(&acme, &endpoint.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.max_in_flight, 9);

    // A key over two accounts: one entry in each log.
    store.create_account(&account("beta")).await.unwrap();
    let key = hooklane::domain::ApiKey {
        id: ApiKeyId::generate(),
        name: "two".into(),
        scopes: vec![hooklane::domain::Scope::EndpointsRead],
        accounts: Some(vec![acme.clone(), AccountId::parse("beta").unwrap()]),
        secret_sha256: "0".repeat(64),
        created_at: t0(),
        created_by: "admin".into(),
        expires_at: None,
        revoked_at: None,
    };
    let for_acme = entry(Some("acme"), 5, Actor::Admin, AuditAction::KeyCreated);
    let for_beta = entry(Some("beta"), 5, Actor::Admin, AuditAction::KeyCreated);
    let change = AuditedChange::CreateApiKey(key.clone());
    store
        .audited_change(&change, &[for_acme.clone(), for_beta.clone()])
        .await
        .unwrap();
    assert!(store.get_api_key(&key.id).await.unwrap().is_some());
    assert_eq!(
        read_all(store, Some(&acme), 10).await,
        vec![for_acme, updated, added, created.clone()]
    );
    let beta = AccountId::parse("beta").unwrap();
    assert_eq!(read_all(store, Some(&beta), 10).await, vec![for_beta]);

    // Revocations and settings go with their entries too.
    let revoked = entry(Some("beta"), 6, Actor::Admin, AuditAction::TokenRevoked);
    let change = AuditedChange::RevokeToken {
        account: beta.clone(),
        token_id: "tok_1".into(),
        at: t0(),
    };
    store
        .audited_change(&change, std::slice::from_ref(&revoked))
        .await
        .unwrap();
    let all = entry(Some("beta"), 7, Actor::Admin, AuditAction::TokensRevoked);
    let change = AuditedChange::RevokeAccountTokens {
        account: beta.clone(),
        before: t0(),
    };
    store
        .audited_change(&change, std::slice::from_ref(&all))
        .await
        .unwrap();
    let revocation = token_revocation(store, &beta, "tok_1").await;
    assert_eq!(revocation.revoked_at, Some(t0()));
    assert_eq!(revocation.account_tokens_before, Some(t0()));
    let rotated = entry(None, 8, Actor::Admin, AuditAction::AdminTokenRotated);
    let change = AuditedChange::PutSetting {
        key: "k".into(),
        value: "v".into(),
    };
    store
        .audited_change(&change, std::slice::from_ref(&rotated))
        .await
        .unwrap();
    assert_eq!(store.get_setting("k").await.unwrap().as_deref(), Some("v"));
    assert_eq!(read_all(store, None, 10).await, vec![rotated]);
    assert_eq!(read_all(store, Some(&beta), 1).await[..2], [all, revoked]);

    // An entry that cannot be written (its id is taken) takes its change with it.
    let gamma = AccountId::parse("gamma").unwrap();
    let change = AuditedChange::CreateAccount(account("gamma"));
    assert!(store
        .audited_change(&change, std::slice::from_ref(&created))
        .await
        .is_err());
    assert!(
        store.get_account(&gamma).await.unwrap().is_none(),
        "the account was created without its entry"
    );

    // A revocation made again changes nothing but is still recorded.
    let again = entry(Some("beta"), 9, Actor::Admin, AuditAction::TokenRevoked);
    let change = AuditedChange::RevokeToken {
        account: beta.clone(),
        token_id: "tok_1".into(),
        at: add(t0(), Duration::from_secs(60)),
    };
    store
        .audited_change(&change, std::slice::from_ref(&again))
        .await
        .unwrap();
    let revocation = token_revocation(store, &beta, "tok_1").await;
    assert_eq!(revocation.revoked_at, Some(t0()), "the first time stays");
    assert_eq!(read_all(store, Some(&beta), 10).await[0], again);

    // A key limited to the most accounts a key may have: the change and 100 entries, more
    // than one DynamoDB transaction takes. Every entry is written.
    let accounts: Vec<AccountId> = (0..hooklane::domain::access::MAX_KEY_ACCOUNTS)
        .map(|i| AccountId::parse(&format!("wide{i:03}")).unwrap())
        .collect();
    let key = hooklane::domain::ApiKey {
        id: ApiKeyId::generate(),
        accounts: Some(accounts.clone()),
        ..key
    };
    let entries: Vec<AuditEntry> = accounts
        .iter()
        .map(|a| entry(Some(a.as_str()), 10, Actor::Admin, AuditAction::KeyCreated))
        .collect();
    store
        .audited_change(&AuditedChange::CreateApiKey(key.clone()), &entries)
        .await
        .unwrap();
    assert!(store.get_api_key(&key.id).await.unwrap().is_some());
    for (account, entry) in accounts.iter().zip(&entries).rev().take(3) {
        assert_eq!(
            read_all(store, Some(account), 10).await,
            std::slice::from_ref(entry)
        );
    }
}
