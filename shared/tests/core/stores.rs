//! The store contract (`hooklane_testkit::contract`, `replay_contract`) on both stores:
//! SQLite in memory and on files, DynamoDB on the local emulator.

/// SQLite in memory: each check on a fresh store.
mod sqlite_in_memory {
    async fn store() -> hooklane::store::sqlite::SqliteStore {
        hooklane::store::sqlite::SqliteStore::in_memory().unwrap()
    }

    hooklane_testkit::store_contract_tests!(store);

    #[tokio::test]
    async fn replays_follow_the_store_contract() {
        hooklane_testkit::replay_contract::replays_follow_the_contract(&store().await).await;
    }

    #[tokio::test]
    async fn mail_refused_for_good_holds_back_no_other() {
        hooklane_testkit::notification_contract::mail_refused_for_good_holds_back_no_other(
            std::sync::Arc::new(store().await),
        )
        .await;
    }
}

/// The contract checks again on a file, where reads take the reader connection and a
/// thread checkpoints the WAL (the in-memory store has neither).
#[tokio::test]
async fn a_file_store_keeps_the_contract_with_its_reader_and_checkpoint_threads() {
    use hooklane::store::sqlite::SqliteStore;
    use hooklane_testkit::contract::*;
    use hooklane_testkit::testing::test_secrets;
    let dir = std::env::temp_dir().join(format!(
        "hooklane-sqlite-file-contract-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    macro_rules! on_fresh_files {
        ($($check:ident),* $(,)?) => {$(
            let store = SqliteStore::open(dir.join(concat!(stringify!($check), ".db")), test_secrets(None)).unwrap();
            $check(&store).await;
            drop(store);
        )*};
    }
    on_fresh_files!(
        accounts_and_endpoints,
        publish_is_idempotent_on_the_event_id,
        record_attempt_applies_once_per_expected_state,
        failed_is_final,
        pending_deliveries_page_in_due_order_and_skip_inactive_endpoints,
        list_deliveries_newest_first_with_filters_and_cursor,
        failing_endpoints_are_the_active_ones_failing_long_enough,
        disable_endpoint_is_conditional_and_complete,
        publish_reads_see_every_change_to_the_account_and_its_endpoints,
        endpoint_updates_apply_only_over_the_version_read,
        endpoints_are_created_within_their_limit,
        notification_outbox,
        failed_notifications_wait_or_are_given_up_and_are_read_past,
        settings_put_if_absent,
        delete_endpoint_abandons_pending_and_keeps_history,
        add_deliveries_adds_each_pair_once,
        publish_batch_answers_each_item_once,
        api_keys_are_kept_listed_and_revoked,
        token_revocations_are_kept_per_account,
        audit_log_is_listed_per_account_newest_first_in_pages,
        audited_changes_are_written_with_their_entries,
        attempts_are_counted_by_endpoint_and_hour,
        the_event_type_catalog_is_kept_by_name,
        missed_events_are_listed_by_account_and_time,
        event_deliveries_are_read_a_page_at_a_time,
        fan_out_progress_is_kept_and_only_moves_forward,
    );
    let store = SqliteStore::open(dir.join("replays.db"), test_secrets(None)).unwrap();
    hooklane_testkit::replay_contract::replays_follow_the_contract(&store).await;
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// DynamoDB on the emulator (scripts/test starts it): each check on fresh tables.
#[cfg(feature = "aws")]
mod dynamodb {
    use hooklane_testkit::testing::emulator_store;

    hooklane_testkit::store_contract_tests!(emulator_store);

    #[tokio::test]
    async fn replays_follow_the_store_contract() {
        hooklane_testkit::replay_contract::replays_follow_the_contract(&emulator_store().await)
            .await;
    }

    #[tokio::test]
    async fn mail_refused_for_good_holds_back_no_other() {
        hooklane_testkit::notification_contract::mail_refused_for_good_holds_back_no_other(
            std::sync::Arc::new(emulator_store().await),
        )
        .await;
    }

    #[tokio::test]
    async fn a_sparse_filter_answers_short_pages_that_continue_where_they_stopped() {
        let store = emulator_store().await.with_list_examine_budget(4);
        super::sparse_pages_continue_where_they_stopped(&store).await;
    }

    /// Over the publish limit, a retry of a published event is answered with it even when
    /// DynamoDB's first page of the event's deliveries, stopped at its budget (1,001
    /// candidates for an answer of 1,000), found none: the two are past it. The other
    /// endpoints are bare items of the endpoints table (an id is all a candidate is read
    /// for), written 25 to a request: created one by one they take the emulator 40 s.
    #[tokio::test]
    async fn a_retry_over_the_limit_is_answered_when_its_deliveries_are_past_a_page() {
        use hooklane::aws::aws_sdk_dynamodb::types::AttributeValue;
        use hooklane::{
            domain::{rate::PublishRate, AccountId},
            limits::{MemoryBuckets, PublishBuckets},
            service::publish::{publish_limited, NewEvent},
            store::Store,
        };
        use hooklane_testkit::fixtures::{
            app_on, create_account_and_endpoints, delivery, endpoint, event, t0,
        };
        use std::sync::Arc;
        let (store, client, tables) = hooklane_testkit::testing::emulator_store_and_tables().await;
        let store: Arc<dyn Store> = Arc::new(store.with_list_examine_budget(4));
        let endpoints: Vec<_> = (0..1_100)
            .map(|i| endpoint("acme", &format!("ep_{i:04}"), t0()))
            .collect();
        let far = [&endpoints[1_050], &endpoints[1_080]];
        create_account_and_endpoints(store.as_ref(), "acme", far).await;
        let bare = endpoints.iter().filter(|e| !far.contains(e)).map(|e| {
            [("account_id", "acme"), ("id", e.id.as_str())]
                .map(|(k, v)| (k.to_owned(), AttributeValue::S(v.to_owned())))
                .into()
        });
        hooklane_testkit::testing::put_items(&client, &tables.endpoints, bare).await;
        let ev = event("acme", "evt_far", t0());
        let sent = far.map(|e| delivery(&ev, e, t0()));
        store.publish(&ev, &sent).await.unwrap();
        let account = AccountId::parse("acme").unwrap();
        let mut limited = store.get_account(&account).await.unwrap().unwrap();
        limited.publish_rate_limit = Some(PublishRate::new(1, Some(1), "x").unwrap());
        store.update_account(&limited).await.unwrap();
        let clock = Arc::new(hooklane::clock::ManualClock::new(t0()));
        let app = app_on(store.clone(), clock.clone());
        let buckets = MemoryBuckets::new(clock);
        let new = |id: &str, data: serde_json::Value| NewEvent {
            id: Some(id.to_owned()),
            event_type: "invoice.paid".to_owned(),
            data,
        };
        // The bucket's one token is spent.
        let rate = PublishRate::new(1, Some(1), "x").unwrap();
        assert_eq!(buckets.take(&account, rate, 1).await.unwrap(), None);
        let again = publish_limited(
            &app,
            &buckets,
            &account,
            new("evt_far", serde_json::json!({"n": "evt_far"})),
        )
        .await
        .expect("the retry is answered over the limit");
        assert!(!again.created);
        let mut to: Vec<&str> = again
            .deliveries
            .iter()
            .map(|d| d.endpoint_id.as_str())
            .collect();
        to.sort();
        assert_eq!(to, ["ep_1050", "ep_1080"]);
    }

    /// DynamoDB finds an event's deliveries by key, one candidate per endpoint: with 6
    /// candidates a page (the budget, or a page of 5 and one), an event sent to 2 of 13
    /// endpoints is read in three pages, the first and the last empty, each going on after
    /// the last endpoint it looked at.
    #[tokio::test]
    async fn an_event_to_few_of_many_endpoints_is_read_in_short_pages() {
        let store = emulator_store().await.with_list_examine_budget(4);
        assert_eq!(
            super::event_pages_to_two_of_thirteen(&store).await,
            [
                (vec![], Some("ep_05")),
                (vec!["ep_08", "ep_10"], Some("ep_11")),
                (vec![], None),
            ]
        );
    }
}

/// The embedded store reads only the event's own deliveries: one page holds both.
#[tokio::test]
async fn an_event_to_few_of_many_endpoints_is_read_in_one_page() {
    let store = hooklane::store::sqlite::SqliteStore::in_memory()
        .unwrap()
        .with_list_examine_budget(4);
    assert_eq!(
        event_pages_to_two_of_thirteen(&store).await,
        [(vec!["ep_08", "ep_10"], None)]
    );
}

/// The pages of 5 of an event sent to ep_08 and ep_10 of ep_00…ep_12: each page's endpoints
/// and where the next one starts.
async fn event_pages_to_two_of_thirteen(
    store: &dyn hooklane::store::Store,
) -> Vec<(Vec<&'static str>, Option<&'static str>)> {
    use hooklane::store::PageAfter;
    use hooklane_testkit::fixtures::{create_account_and_endpoints, delivery, endpoint, event, t0};
    const NAMES: [&str; 13] = [
        "ep_00", "ep_01", "ep_02", "ep_03", "ep_04", "ep_05", "ep_06", "ep_07", "ep_08", "ep_09",
        "ep_10", "ep_11", "ep_12",
    ];
    let endpoints: Vec<_> = NAMES.iter().map(|n| endpoint("acme", n, t0())).collect();
    create_account_and_endpoints(store, "acme", &endpoints).await;
    let ev = event("acme", "evt_sparse", t0());
    let sent = [
        delivery(&ev, &endpoints[8], t0()),
        delivery(&ev, &endpoints[10], t0()),
    ];
    store.publish(&ev, &sent).await.unwrap();
    let name =
        |id: &hooklane::domain::EndpointId| *NAMES.iter().find(|n| **n == id.as_str()).unwrap();
    let mut pages = Vec::new();
    let mut after = None;
    for _ in 0..10 {
        let page = store
            .event_deliveries(&ev, &PageAfter { after, limit: 5 })
            .await
            .unwrap();
        let next = page.next.clone();
        pages.push((
            page.deliveries
                .iter()
                .map(|d| name(&d.endpoint_id))
                .collect(),
            next.as_ref().map(name),
        ));
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    pages
}

#[tokio::test]
async fn a_sparse_filter_answers_short_pages_that_continue_where_they_stopped() {
    let store = hooklane::store::sqlite::SqliteStore::in_memory()
        .unwrap()
        .with_list_examine_budget(4);
    sparse_pages_continue_where_they_stopped(&store).await;
}

/// With 4 rows read per page at most, a filter two of thirteen deliveries match (delivered,
/// which neither store indexes) is answered in short pages, some empty, each with a cursor
/// that continues after the last row read, until every match has been listed once.
async fn sparse_pages_continue_where_they_stopped(store: &dyn hooklane::store::Store) {
    use hooklane::{
        clock::add,
        domain::{AccountId, Decision, DeliveryStatus},
        store::DeliveryQuery,
    };
    use hooklane_testkit::fixtures::{account, attempt_record, delivery, endpoint, event, t0};
    store.create_account(&account("acme")).await.unwrap();
    let ep = endpoint("acme", "ep_a", t0());
    store.create_endpoint(&ep).await.unwrap();
    let mut made = Vec::new();
    for i in 0..13u64 {
        let at = add(t0(), std::time::Duration::from_secs(i));
        let ev = event("acme", &format!("evt_{i:02}"), at);
        let d = delivery(&ev, &ep, at);
        store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
        made.push(d);
    }
    for d in [&made[6], &made[0]] {
        let record = attempt_record(d, 1, Decision::Delivered, true, t0());
        store.record_attempt(&record).await.unwrap();
    }
    let acme = AccountId::parse("acme").unwrap();
    let mut cursor = None;
    let mut pages = Vec::new();
    for _ in 0..20 {
        let query = DeliveryQuery {
            status: Some(DeliveryStatus::Delivered),
            limit: 3,
            cursor: cursor.clone(),
            ..Default::default()
        };
        let page = store.list_deliveries(&acme, &query).await.unwrap();
        pages.push(page.items.iter().map(|d| d.id.clone()).collect::<Vec<_>>());
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert!(pages.len() > 1, "the budget cut the listing: {pages:?}");
    assert!(
        pages.iter().any(Vec::is_empty),
        "a page can be empty and go on"
    );
    assert_eq!(
        pages.concat(),
        vec![made[6].id.clone(), made[0].id.clone()],
        "every match once, newest first"
    );
}
