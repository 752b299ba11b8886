//! The store contract for events a disabled endpoint missed: marked once, listed by account
//! and time in pages that continue where they stopped, and gone once erased.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hooklane::{
    domain::{AccountId, Event, EventId, MissedEvent},
    store::{FannedOut, MissedQuery, Store},
};

use crate::fixtures::{account, at, typed_event};

fn query(account: &str, since: i64, until: Option<i64>, limit: u32) -> MissedQuery {
    MissedQuery {
        account: AccountId::from_trusted(account.into()),
        since: at(since),
        until: until.map(at),
        after: None,
        limit,
    }
}

fn ids(missed: &[MissedEvent]) -> Vec<&str> {
    let mut ids: Vec<&str> = missed.iter().map(|m| m.id.as_str()).collect();
    ids.sort_unstable();
    ids
}

/// Every page of `query`, `limit` at a time, each after the last of the one before.
async fn every_page(store: &dyn Store, mut query: MissedQuery) -> Vec<MissedEvent> {
    let mut all: Vec<MissedEvent> = Vec::new();
    loop {
        let page = store.missed_events(&query).await.unwrap();
        assert!(page.len() <= query.limit as usize, "{page:?}");
        let Some(last) = page.last() else {
            return all;
        };
        query.after = Some((last.created_at, last.id.clone()));
        all.extend(page);
    }
}

pub async fn missed_events_are_listed_by_account_and_time(store: &dyn Store) {
    for id in ["acme", "other"] {
        store.create_account(&account(id)).await.unwrap();
    }
    let event = |account: &str, id: &str, second: i64| -> Event {
        typed_event(account, id, "invoice.paid", at(second))
    };
    let events = [
        event("acme", "evt_a10", 10),
        event("acme", "evt_b20", 20),
        event("acme", "evt_c20", 20),
        event("acme", "evt_d30", 30),
        event("acme", "evt_e40", 40),
        event("other", "evt_o20", 20),
    ];
    for e in &events {
        store.publish(e, &[]).await.unwrap();
    }
    let ghost = event("acme", "evt_never_stored", 25);
    // All but evt_e40 are marked; marking twice, and marking an event that is not stored,
    // change nothing.
    let marked: Vec<Event> = events
        .iter()
        .filter(|e| e.id.as_str() != "evt_e40")
        .cloned()
        .collect();
    store.mark_missed(&marked).await.unwrap();
    store.mark_missed(&marked[..2]).await.unwrap();
    store
        .mark_missed(std::slice::from_ref(&ghost))
        .await
        .unwrap();
    store.mark_missed(&[]).await.unwrap();

    let all = store
        .missed_events(&query("acme", 0, None, 100))
        .await
        .unwrap();
    assert_eq!(ids(&all), ["evt_a10", "evt_b20", "evt_c20", "evt_d30"]);
    let times: Vec<_> = all.iter().map(|m| m.created_at).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "oldest first: {times:?}"
    );
    let first = all.iter().find(|m| m.id.as_str() == "evt_a10").unwrap();
    assert_eq!(*first, events[0].as_missed());
    assert_eq!(
        ids(&store
            .missed_events(&query("other", 0, None, 100))
            .await
            .unwrap()),
        ["evt_o20"]
    );
    // `since` is inclusive and `until` exclusive, to the millisecond.
    assert_eq!(
        ids(&store
            .missed_events(&query("acme", 20, Some(30), 100))
            .await
            .unwrap()),
        ["evt_b20", "evt_c20"]
    );
    let within_one_millisecond = MissedQuery {
        since: at(30) + chrono::TimeDelta::microseconds(300),
        until: Some(at(30) + chrono::TimeDelta::microseconds(700)),
        ..query("acme", 0, None, 100)
    };
    assert_eq!(
        store.missed_events(&within_one_millisecond).await.unwrap(),
        [],
        "an empty window is an empty answer (DynamoDB refuses a reversed BETWEEN)"
    );
    // Pages of one, and of two, continue where they stopped, equal times included.
    for limit in [1, 2] {
        let paged = every_page(store, query("acme", 0, None, limit)).await;
        assert_eq!(ids(&paged), ids(&all), "pages of {limit}");
        assert_eq!(paged.len(), all.len(), "pages of {limit}: {paged:?}");
    }
    // A page's cursor outside the window, as when the window's start moved on since the page
    // before (on AWS it is the retention's edge, which moves while a recovery pages through):
    // before the window, the list goes on from its start; past its end, nothing is left.
    // (DynamoDB refuses a starting key outside the query's range.)
    let cursor = |id: &str, second: i64| Some((at(second), EventId::from_trusted(id.into())));
    let before = MissedQuery {
        after: cursor("evt_a10", 10),
        ..query("acme", 20, Some(40), 100)
    };
    assert_eq!(
        ids(&store.missed_events(&before).await.unwrap()),
        ["evt_b20", "evt_c20", "evt_d30"]
    );
    let past = MissedQuery {
        after: cursor("evt_d30", 30),
        ..query("acme", 0, Some(30), 100)
    };
    assert_eq!(store.missed_events(&past).await.unwrap(), []);
    // An erased event has nothing left to send: it leaves the list, and is not marked again.
    let erased = EventId::from_trusted("evt_d30".into());
    let acme = AccountId::from_trusted("acme".into());
    store.erase_event(&acme, &erased, at(50)).await.unwrap();
    store.mark_missed(&marked[3..4]).await.unwrap();
    assert_eq!(
        ids(&store
            .missed_events(&query("acme", 0, None, 100))
            .await
            .unwrap()),
        ["evt_a10", "evt_b20", "evt_c20"]
    );
    // The mark changes nothing else of the event.
    assert_eq!(
        store.get_event(&acme, &events[0].id).await.unwrap(),
        Some(events[0].clone())
    );

    // Events stored alone for a fan-out are marked with its completion, when it says so.
    let (fanned, missed) = (event("acme", "evt_f60", 60), event("acme", "evt_m60", 60));
    for e in [&fanned, &missed] {
        store.put_event(e).await.unwrap();
    }
    store
        .mark_fanned_out(&[
            FannedOut {
                event: fanned.clone(),
                missed: false,
            },
            FannedOut {
                event: missed.clone(),
                missed: true,
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        store
            .missed_events(&query("acme", 60, None, 100))
            .await
            .unwrap(),
        [missed.as_missed()]
    );
    assert!(store
        .unfanned_events(None, at(100), 100)
        .await
        .unwrap()
        .events
        .is_empty());
}
