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
}

/// The contract checks again on a file, where reads take the reader connection and a
/// thread checkpoints the WAL (the in-memory store has neither).
#[tokio::test]
async fn a_file_store_keeps_the_contract_with_its_reader_and_checkpoint_threads() {
    use hooklane::store::sqlite::SqliteStore;
    use hooklane_testkit::contract::*;
    let dir = std::env::temp_dir().join(format!(
        "hooklane-sqlite-file-contract-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    macro_rules! on_fresh_files {
        ($($check:ident),* $(,)?) => {$(
            let store = SqliteStore::open(dir.join(concat!(stringify!($check), ".db"))).unwrap();
            $check(&store).await;
            drop(store);
        )*};
    }
    on_fresh_files!(
        accounts_and_endpoints,
        publish_is_idempotent_on_the_event_id,
        record_attempt_applies_once_per_expected_state,
        failed_is_final,
        pending_deliveries_page_by_id_and_skip_inactive_endpoints,
        list_deliveries_newest_first_with_filters_and_cursor,
        failing_endpoints_are_the_active_ones_failing_long_enough,
        disable_endpoint_is_conditional_and_complete,
        notification_outbox,
        settings_put_if_absent,
        delete_endpoint_abandons_pending_and_keeps_history,
        add_deliveries_adds_each_pair_once,
        publish_batch_answers_each_item_once,
    );
    let store = SqliteStore::open(dir.join("replays.db")).unwrap();
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
}
