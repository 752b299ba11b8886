//! Endpoint health: failing past the threshold disables; a success before it clears the clock.

use std::time::Duration;

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::json;

use crate::support::{Scratch, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_past_the_threshold_disables_abandons_and_notifies() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("dead", Behavior::status(500));
    let scratch = Scratch::new("health");
    let server = Server::start(
        &scratch,
        &[
            (
                "HOOKLANE_RETRY_SCHEDULE",
                "0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3",
            ),
            ("HOOKLANE_DISABLE_AFTER", "2s"),
            ("HOOKLANE_OPERATIONS_ACCOUNT", "ops"),
        ],
    )
    .await;
    server.create_account("ops").await;
    server
        .create_endpoint(
            "ops",
            &farm.url("ops-inbox"),
            json!({"event_types": ["endpoint.disabled"]}),
        )
        .await;
    server.create_account("acme").await;
    let [dead] = server.farm_endpoints("acme", &farm, ["dead"]).await;
    for i in 0..3 {
        server
            .publish("acme", "invoice.paid", json!({"i": i}))
            .await;
    }
    let disabled = server
        .eventually(Duration::from_secs(20), || async {
            server
                .get(&format!("/v1/accounts/acme/endpoints/{dead}"))
                .await
                .1["status"]
                == "disabled"
        })
        .await;
    assert!(disabled, "endpoint was not disabled");
    let (_, endpoint) = server
        .get(&format!("/v1/accounts/acme/endpoints/{dead}"))
        .await;
    assert!(
        endpoint["disabled_reason"]
            .as_str()
            .unwrap_or("")
            .contains("failed"),
        "{endpoint}"
    );
    // The audit log has it, done by Hooklane itself: actor `system`, no address.
    let (status, log) = server.get("/v1/accounts/acme/audit").await;
    assert_eq!(status, 200, "{log}");
    let entry = &log["data"][0];
    assert_eq!(entry["action"], "endpoint.disabled", "{log}");
    assert_eq!(
        entry["actor"],
        json!({"type": "system", "id": null}),
        "{log}"
    );
    assert_eq!(entry["target"]["id"], dead.as_str(), "{log}");
    assert_eq!(entry["address"], json!(null), "{log}");
    let deliveries = server.deliveries("acme", "").await;
    assert_eq!(deliveries.len(), 3);
    assert!(
        deliveries.iter().all(|d| d["status"] == "abandoned"),
        "{deliveries:?}"
    );
    // Nothing more is sent to a disabled endpoint.
    let before = farm.arrival_count("dead");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(farm.arrival_count("dead"), before);
    // The owner is told (log notifier) and the operations account gets `endpoint.disabled`.
    let told = server
        .eventually(Duration::from_secs(5), || async {
            server.log_text().contains("owner notification")
        })
        .await;
    assert!(told, "no owner notification in the log");
    let log = server.log_text();
    assert!(
        log.contains("owner@acme.example") && log.contains("Webhook endpoint disabled"),
        "{log}"
    );
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("ops-inbox")
            == 1)
            .await,
        "no endpoint.disabled event"
    );
    let ops = &farm.arrivals("ops-inbox")[0];
    let body: serde_json::Value = serde_json::from_slice(&ops.body).expect("json");
    assert_eq!(body["type"], "endpoint.disabled");
    assert_eq!(body["data"]["endpoint_id"], dead.as_str());
    assert_eq!(body["data"]["account_id"], "acme");
    // Re-enabling starts a fresh clock; new events flow again.
    farm.configure("dead", Behavior::ok());
    let (status, enabled) = server
        .post(
            &format!("/v1/accounts/acme/endpoints/{dead}/enable"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{enabled}");
    assert_eq!(enabled["status"], "active");
    assert_eq!(enabled["failing_since"], serde_json::Value::Null);
    server
        .publish("acme", "invoice.paid", json!({"after": "enable"}))
        .await;
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("dead") == 1)
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_before_the_threshold_clears_the_clock() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("wobbly", Behavior::failing_first(1));
    let scratch = Scratch::new("health-clear");
    let server = Server::start(
        &scratch,
        &[
            ("HOOKLANE_RETRY_SCHEDULE", "1.5,1.5"),
            ("HOOKLANE_DISABLE_AFTER", "3s"),
        ],
    )
    .await;
    server.create_account("acme").await;
    let [wobbly] = server.farm_endpoints("acme", &farm, ["wobbly"]).await;
    server.publish("acme", "invoice.paid", json!({})).await;
    let path = format!("/v1/accounts/acme/endpoints/{wobbly}");
    let failing = server
        .eventually(Duration::from_secs(5), || async {
            !server.get(&path).await.1["failing_since"].is_null()
        })
        .await;
    assert!(failing, "a failed attempt must start the failing clock");
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("wobbly") == 1)
            .await
    );
    let cleared = server
        .eventually(Duration::from_secs(5), || async {
            server.get(&path).await.1["failing_since"].is_null()
        })
        .await;
    assert!(cleared, "a success must clear the failing clock");
    // Well past the threshold since the first failure, the endpoint is still active.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, endpoint) = server.get(&path).await;
    assert_eq!(endpoint["status"], "active", "{endpoint}");
}
