//! Retries follow the jittered schedule, and the event arrives on attempt N+1.

use std::time::Duration;

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::json;

use crate::support::{Scratch, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_recovering_after_n_failures_gets_attempt_n_plus_one() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("flaky", Behavior::failing_first(3));
    let scratch = Scratch::new("retries");
    // Scaled-down schedule: 1 s, 2 s, 3 s, 4 s (each drawn from [d/2, d]).
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "1,2,3,4")]).await;
    server.create_account("acme").await;
    server.farm_endpoints("acme", &farm, ["flaky"]).await;
    let event = server
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    let event_id = event["id"].as_str().expect("id").to_owned();
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| f.success_count("flaky") == 1)
            .await,
        "never delivered"
    );
    let arrivals = farm.arrivals("flaky");
    assert_eq!(arrivals.len(), 4, "delivered on attempt {}", arrivals.len());
    assert!(arrivals
        .iter()
        .all(|a| a.webhook_id.as_deref() == Some(event_id.as_str())));
    assert_eq!(
        arrivals.iter().map(|a| a.status).collect::<Vec<_>>(),
        [500, 500, 500, 200]
    );
    let schedule = [1.0, 2.0, 3.0];
    for (i, pair) in arrivals.windows(2).enumerate() {
        let gap = pair[1]
            .instant
            .duration_since(pair[0].instant)
            .as_secs_f64();
        let full = schedule[i];
        // [d/2, d], plus a little for dispatch and the machine's load.
        assert!(
            gap >= full / 2.0 - 0.05 && gap <= full + 0.5,
            "gap {i}: {gap:.3} s outside [{}, {full}]",
            full / 2.0
        );
    }
    // The endpoint's 200 reaches the farm before Hooklane has recorded it.
    let mut deliveries = serde_json::Value::Null;
    for _ in 0..100 {
        (_, deliveries) = server
            .get(&format!("/v1/accounts/acme/events/{event_id}"))
            .await;
        if deliveries["deliveries"][0]["status"] != "pending" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delivery = &deliveries["deliveries"][0];
    assert_eq!(delivery["status"], "delivered");
    assert_eq!(delivery["attempts"], 4);
    let delivery_id = delivery["id"].as_str().expect("delivery id");
    let (_, attempts) = server
        .get(&format!(
            "/v1/accounts/acme/deliveries/{delivery_id}/attempts"
        ))
        .await;
    let codes: Vec<_> = attempts["data"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["status_code"].clone())
        .collect();
    assert_eq!(codes, [json!(500), json!(500), json!(500), json!(200)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_schedule_the_delivery_fails() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("down", Behavior::status(503));
    let scratch = Scratch::new("exhausted");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "0.2,0.2")]).await;
    server.create_account("acme").await;
    server.farm_endpoints("acme", &farm, ["down"]).await;
    server.publish("acme", "invoice.paid", json!({})).await;
    let failed = server
        .failed_within(Duration::from_secs(15), "acme", 1)
        .await;
    assert!(failed, "delivery did not fail after the schedule");
    assert_eq!(
        farm.arrival_count("down"),
        3,
        "schedule of 2 retries means 3 attempts"
    );
    let delivery = &server.deliveries("acme", "").await[0];
    assert!(
        delivery["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("schedule exhausted"),
        "{delivery}"
    );
    assert_eq!(delivery["next_try_at"], serde_json::Value::Null);
}
