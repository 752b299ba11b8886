//! The store contract for `hooklane_deliveries_created_total`: every delivery row a store
//! writes is counted once, by the store, whoever asked for it and however many writes it
//! took; a row that already existed is not counted again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hooklane::{
    domain::{Delivery, Endpoint, Event, EventType},
    store::{DisableRequest, Store},
    telemetry::emf::EmfRecorder,
};

use crate::fixtures::{account, account_with_endpoints, delivery, endpoint, event, t0};
use crate::testing::deliveries_counted as counted;

async fn endpoints(store: &dyn Store, account_id: &str, count: usize) -> Vec<Endpoint> {
    store.create_account(&account(account_id)).await.unwrap();
    let mut made = Vec::with_capacity(count);
    for i in 0..count {
        let ep = endpoint(account_id, &format!("ep_{account_id}_{i:03}"), t0());
        store.create_endpoint(&ep).await.unwrap();
        made.push(ep);
    }
    made
}

fn to_each(ev: &Event, endpoints: &[Endpoint]) -> Vec<Delivery> {
    endpoints.iter().map(|ep| delivery(ev, ep, t0())).collect()
}

pub async fn every_delivery_written_is_counted_once(store: &dyn Store) {
    let recorder = EmfRecorder::new("Hooklane", Vec::new());
    let _local = metrics::set_default_local_recorder(&recorder);
    let [a, b, c] = account_with_endpoints(store, "acme", ["ep_a", "ep_b", "ep_c"]).await;

    let published = event("acme", "evt_published", t0());
    let deliveries = to_each(&published, &[a.clone(), b.clone()]);
    store.publish(&published, &deliveries).await.unwrap();
    assert_eq!(counted(&recorder), 2, "a publish with its deliveries");
    store.publish(&published, &deliveries).await.unwrap();
    assert_eq!(counted(&recorder), 0, "a repeated publish writes nothing");

    let alone = event("acme", "evt_alone", t0());
    store.put_event(&alone).await.unwrap();
    assert_eq!(counted(&recorder), 0, "an event alone has no delivery");
    let fanned = to_each(&alone, &[a.clone(), b.clone()]);
    store
        .add_deliveries_of(&alone, &fanned, None)
        .await
        .unwrap();
    assert_eq!(counted(&recorder), 2, "its fan-out");
    let all = to_each(&alone, &[a.clone(), b.clone(), c.clone()]);
    store.add_deliveries_of(&alone, &all, None).await.unwrap();
    assert_eq!(
        counted(&recorder),
        1,
        "a fan-out again adds only the missing one"
    );
    store.add_deliveries(&all).await.unwrap();
    assert_eq!(counted(&recorder), 0, "all three exist");

    let batched = event("acme", "evt_batched", t0());
    let items = vec![
        (
            batched.clone(),
            Some(to_each(&batched, &[a.clone(), c.clone()])),
        ),
        (event("acme", "evt_batched_alone", t0()), None),
        (published.clone(), Some(deliveries.clone())),
    ];
    store.publish_batch(&items).await.unwrap();
    assert_eq!(
        counted(&recorder),
        2,
        "a batch: only its new event's deliveries"
    );

    // More than one DynamoDB transaction holds.
    let many = endpoints(store, "wide", 120).await;
    let wide = event("wide", "evt_wide", t0());
    store.publish(&wide, &to_each(&wide, &many)).await.unwrap();
    assert_eq!(counted(&recorder), 120, "a publish to 120 endpoints");

    let listeners = endpoints(store, "ops", 110).await;
    let mut operational = event("ops", "evt_disabled", t0());
    operational.event_type = EventType::parse("endpoint.disabled").unwrap();
    let request = DisableRequest {
        account_id: a.account_id.clone(),
        endpoint_id: a.id.clone(),
        reason: "failing for 3 days".into(),
        now: t0(),
        expected_failing_since: None,
        notification: None,
        operational_event: Some((operational.clone(), to_each(&operational, &listeners))),
    };
    assert!(store.disable_endpoint(&request).await.unwrap().is_some());
    assert_eq!(
        counted(&recorder),
        110,
        "a disabling's operational event to 110 endpoints"
    );
    assert_eq!(store.disable_endpoint(&request).await.unwrap(), None);
    assert_eq!(counted(&recorder), 0, "a disabling that did not happen");
}
