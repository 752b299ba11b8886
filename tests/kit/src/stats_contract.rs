//! The store contract for the hour counts behind an endpoint's health at a glance: every
//! recorded attempt is counted once, in its endpoint's hour, with the hour's last failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::TimeDelta;
use hooklane::{
    clock::Timestamp,
    domain::{stats::hour_of, Decision, Delivery, HourCount, LastFailure},
    store::{AttemptRecord, RecordOutcome, Store},
};

use crate::fixtures::{account_with_endpoints, attempt_record, publish_one, t0};

fn failed(d: &Delivery, number: u32, at: Timestamp) -> AttemptRecord {
    attempt_record(
        d,
        number,
        Decision::RetryAt(at + TimeDelta::hours(1)),
        false,
        at,
    )
}

fn delivered(d: &Delivery, number: u32, at: Timestamp) -> AttemptRecord {
    attempt_record(d, number, Decision::Delivered, true, at)
}

async fn record(store: &dyn Store, record: &AttemptRecord) -> RecordOutcome {
    store.record_attempt(record).await.unwrap()
}

fn count(hour: Timestamp, succeeded: u64, failed: u64, last: Option<LastFailure>) -> HourCount {
    HourCount {
        hour,
        succeeded,
        failed,
        last_failure: last,
    }
}

fn failure(at: Timestamp, status_code: Option<u16>, error: &str) -> Option<LastFailure> {
    Some(LastFailure {
        at,
        status_code,
        error: error.to_owned(),
    })
}

pub async fn attempts_are_counted_by_endpoint_and_hour(store: &dyn Store) {
    let [a, b] = account_with_endpoints(store, "acme", ["ep_a", "ep_b"]).await;
    let (_, d1) = publish_one(store, &a, "evt_1").await;
    let (_, d2) = publish_one(store, &a, "evt_2").await;
    let (_, d3) = publish_one(store, &a, "evt_3").await;
    let (_, d4) = publish_one(store, &b, "evt_4").await;
    let h0 = hour_of(t0()) + TimeDelta::hours(1);
    let (h1, min) = (h0 + TimeDelta::hours(1), |m: i64| TimeDelta::minutes(m));

    record(store, &failed(&d1, 1, h0 + min(10))).await;
    // Refused as stale (that attempt is recorded already): not counted again.
    assert_eq!(
        record(store, &failed(&d1, 1, h0 + min(20))).await,
        RecordOutcome::Stale
    );
    record(store, &delivered(&d2, 1, h0 + min(30))).await;
    record(store, &delivered(&d4, 1, h0 + min(5))).await;
    store.flush_hour_counts().await.unwrap();
    // More of the same hour after a flush adds to it.
    record(store, &failed(&d3, 1, h0 + min(40))).await;
    let mut timed_out = failed(&d1, 2, h1 + min(10));
    timed_out.attempt.status_code = None;
    timed_out.attempt.error = Some("timed out after 10s".into());
    record(store, &timed_out).await;
    record(store, &delivered(&d1, 3, h1 + min(20))).await;
    store.flush_hour_counts().await.unwrap();

    assert_eq!(
        store.endpoint_hours(&a.id, h0).await.unwrap(),
        [
            count(h0, 1, 2, failure(h0 + min(40), Some(500), "HTTP 500")),
            count(h1, 1, 1, failure(h1 + min(10), None, "timed out after 10s")),
        ]
    );
    assert_eq!(
        store.endpoint_hours(&a.id, h1).await.unwrap(),
        [count(
            h1,
            1,
            1,
            failure(h1 + min(10), None, "timed out after 10s")
        )],
        "from the hour asked for"
    );
    // A time within an hour asks from that hour's start.
    assert_eq!(
        store
            .endpoint_hours(&a.id, h1 + min(59))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        store.endpoint_hours(&b.id, h0).await.unwrap(),
        [count(h0, 1, 0, None)],
        "each endpoint its own"
    );
    store.flush_hour_counts().await.unwrap();
    assert_eq!(
        store.endpoint_hours(&b.id, h0).await.unwrap().len(),
        1,
        "a flush with nothing gathered adds nothing"
    );
}
