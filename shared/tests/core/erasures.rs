//! Erasures a call left unfinished on DynamoDB, as the sweeper finishes them, against what
//! the emulator does not do: a global secondary index that lags its table.

#![cfg(feature = "aws")]

use std::{sync::Arc, time::Duration};

use hooklane::{
    clock::add,
    store::{dynamodb::DynamoStore, Store},
};
use hooklane_testkit::{
    faults::{dynamodb_client_with, LaggingIndex},
    fixtures::{account_with_numbered_endpoints, publish_to_all, t0},
    testing::{emulator_store_on, fresh_table_names, require_emulator},
};

/// A store on fresh tables whose control table's `listed` index lags as `lag` says, and
/// whose erasure calls stop after each page, as calls out of time do.
async fn lagging_store(lag: &LaggingIndex) -> DynamoStore {
    require_emulator();
    let tables = fresh_table_names();
    let client = dynamodb_client_with(lag.clone()).await;
    emulator_store_on(client, &tables)
        .await
        .with_erase_budget(Duration::ZERO)
}

/// An erasure finished a moment ago may still be listed by the index (DynamoDB propagates a
/// write to a GSI within about a second, and every GSI read is eventually consistent). The
/// sweeper passes it by: erasing it again would start over from the first delivery, run out
/// of time, and list it again.
#[tokio::test]
async fn the_sweeper_passes_by_an_erasure_its_index_still_lists_after_it_finished() {
    let lag = LaggingIndex::of("listed");
    let store = Arc::new(lagging_store(&lag).await);
    let endpoints = account_with_numbered_endpoints(store.as_ref(), "acme", 101).await;
    let (ev, _) = publish_to_all(store.as_ref(), &endpoints, "evt_wide").await;
    let at = |second: u64| add(t0(), Duration::from_secs(second));
    let erase = |second| store.erase_event(&ev.account_id, &ev.id, at(second));

    assert!(!erase(5).await.unwrap().unwrap().complete, "a page a call");
    let listed = store.unfinished_erasures().await.unwrap();
    assert_eq!(listed, [(ev.account_id.clone(), ev.id.clone())]);
    let as_indexed = lag.last_answer();
    assert!(erase(6).await.unwrap().unwrap().complete, "the rest");
    assert_eq!(store.unfinished_erasures().await.unwrap(), []);

    // The index has not caught up with the delete yet.
    lag.showing(as_indexed);
    assert_eq!(store.unfinished_erasures().await.unwrap(), listed);
    assert_eq!(
        store.finish_erasures(at(300), Duration::MAX).await.unwrap(),
        0
    );
    lag.showing(Vec::new());
    assert_eq!(
        store.unfinished_erasures().await.unwrap(),
        [],
        "the finished erasure was started over, and left unfinished again"
    );
}
