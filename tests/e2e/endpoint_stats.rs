//! `GET …/endpoints/{endpoint}/stats`: every attempt counted in its endpoint's hour, with the
//! last failure and the failing streak, in both shapes (run on the servers of test_events.rs).

use std::time::Duration;

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::{json, Value};

use crate::support::Server;

fn sum(periods: &Value, field: &str) -> u64 {
    periods
        .as_array()
        .expect("periods")
        .iter()
        .map(|p| p[field].as_u64().expect("a count"))
        .sum()
}

/// Needs a server that retries at least twice, a second apart (`HOOKLANE_RETRY_SCHEDULE=1,1,1`).
pub async fn every_attempt_shows_in_the_endpoint_s_stats(server: &Server) {
    let farm = Farm::start().await.expect("farm");
    farm.configure("flaky", Behavior::failing_first(2).with_failure_status(503));
    server.create_account("stats").await;
    let (flaky, _) = server
        .create_endpoint("stats", &farm.url("flaky"), json!({}))
        .await;
    let path = format!("/v1/accounts/stats/endpoints/{flaky}/stats");
    let (status, fresh) = server.get(&path).await;
    assert_eq!(status, 200, "{fresh}");
    let nothing = json!({"attempts": 0, "succeeded": 0, "failed": 0, "success_rate": null});
    assert_eq!(
        (&fresh["last_24h"], &fresh["last_7d"]),
        (&nothing, &nothing)
    );
    assert_eq!(
        fresh["hours"].as_array().map(Vec::len),
        Some(168),
        "{fresh}"
    );
    assert_eq!(fresh["days"].as_array().map(Vec::len), Some(7), "{fresh}");
    assert_eq!(
        (&fresh["failing_since"], &fresh["last_failure"]),
        (&Value::Null, &Value::Null)
    );

    // 503, 503, then 200: three attempts, one delivery.
    server
        .publish("stats", "invoice.paid", json!({"n": 1}))
        .await;
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| f.success_count("flaky") == 1)
            .await,
        "the delivery never succeeded"
    );
    // On AWS a batch's counts are written when the batch is done.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let stats = server.get(&path).await.1;
        if stats["last_24h"]["attempts"] == 3 || std::time::Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Without the hours, which are many.
    let brief = json!({"last_24h": stats["last_24h"], "last_failure": stats["last_failure"]});
    assert_eq!(stats["last_24h"]["attempts"], 3, "{brief}");
    assert_eq!(stats["endpoint_id"], flaky.as_str());
    assert_eq!(stats["last_24h"], stats["last_7d"]);
    assert_eq!(
        (
            &stats["last_24h"]["succeeded"],
            &stats["last_24h"]["failed"]
        ),
        (&json!(1), &json!(2)),
        "{brief}"
    );
    let rate = stats["last_24h"]["success_rate"].as_f64().expect("a rate");
    assert!((rate - 1.0 / 3.0).abs() < 1e-9, "{brief}");
    assert_eq!(stats["last_failure"]["status_code"], 503, "{brief}");
    assert!(
        stats["last_failure"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("503")),
        "{brief}"
    );
    assert_eq!(stats["failing_since"], Value::Null, "recovered: {brief}");
    assert_eq!(
        (
            sum(&stats["hours"], "succeeded"),
            sum(&stats["hours"], "failed")
        ),
        (1, 2)
    );
    assert_eq!(
        (
            sum(&stats["days"], "succeeded"),
            sum(&stats["days"], "failed")
        ),
        (1, 2)
    );

    // Another account's endpoint, or none, is not found.
    server.create_account("other").await;
    for path in [
        format!("/v1/accounts/other/endpoints/{flaky}/stats"),
        "/v1/accounts/stats/endpoints/ep_01none/stats".to_owned(),
    ] {
        let (status, body) = server.get(&path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(body["error"]["code"], "not_found", "{body}");
    }
}
