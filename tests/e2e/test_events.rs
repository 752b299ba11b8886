//! `POST …/endpoints/{endpoint}/test`: a signed `hooklane.test` event to one endpoint only,
//! logged and delivered like any other, in both shapes; the same servers then check the
//! endpoint stats (endpoint_stats.rs) and the resend of events missed while disabled
//! (replay.rs).

use std::time::Duration;

use hooklane_testkit::farm::Farm;
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

/// The customer's check of a new endpoint: a test event reaches it (and only it) signed
/// with its secret, and shows in its delivery log; a disabled or unknown endpoint is refused.
async fn a_test_event_reaches_only_its_endpoint(server: &Server) {
    let farm = Farm::start().await.expect("farm");
    server.create_account("acme").await;
    // Subscribed to other types only: the test event goes to it anyway.
    let (tested, secret) = server
        .create_endpoint(
            "acme",
            &farm.url("tested"),
            json!({"event_types": ["invoice.*"]}),
        )
        .await;
    // Subscribed to everything: it must not get another endpoint's test event.
    let (bystander, _) = server
        .create_endpoint("acme", &farm.url("bystander"), json!({}))
        .await;

    let path = format!("/v1/accounts/acme/endpoints/{tested}/test");
    let (status, sent) = server.post(&path, Value::Null).await;
    assert_eq!(status, 202, "{sent}");
    assert_eq!(sent["type"], "hooklane.test", "{sent}");
    let deliveries = sent["deliveries"].as_array().expect("deliveries");
    assert_eq!(deliveries.len(), 1, "{sent}");
    assert_eq!(deliveries[0]["endpoint_id"], tested.as_str(), "{sent}");

    assert!(
        farm.wait_until(Duration::from_secs(20), |f| f.success_count("tested") == 1)
            .await,
        "the test event never arrived"
    );
    let arrival = farm.arrivals("tested").remove(0);
    assert_eq!(arrival.webhook_id.as_deref(), sent["id"].as_str());
    arrival
        .verify_with(&secret)
        .expect("the test event verifies with the endpoint's secret");
    let body: Value = serde_json::from_slice(&arrival.body).expect("JSON body");
    assert_eq!(body["type"], "hooklane.test", "{body}");
    assert_eq!(body["data"]["endpoint_id"], tested.as_str(), "{body}");

    // In the log as delivered, like any delivery.
    let delivery = deliveries[0]["id"].as_str().expect("delivery id");
    assert!(
        server
            .eventually(Duration::from_secs(10), || async {
                let (_, d) = server
                    .get(&format!("/v1/accounts/acme/deliveries/{delivery}"))
                    .await;
                d["status"] == "delivered"
            })
            .await,
        "the test delivery is not logged as delivered"
    );
    // Give a stray delivery to the bystander time to show, then check there is none.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(farm.arrivals("bystander").len(), 0);

    let (status, body) = server
        .post(
            &format!("/v1/accounts/acme/endpoints/{tested}/disable"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.post(&path, Value::Null).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("disabled")),
        "{body}"
    );
    let (status, body) = server
        .post("/v1/accounts/acme/endpoints/ep_nosuch/test", Value::Null)
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(farm.arrivals("tested").len(), 1);

    // Test events have a bucket of their own: ten at once, then one a second (the first
    // one above took a token). A burst of them is refused past that, and leaves the
    // account's publishing alone.
    // Sent until the first refusal; the bucket refills at one a second meanwhile (a slow
    // emulator makes the burst take seconds), so the count allowed grows with the time.
    let path = format!("/v1/accounts/acme/endpoints/{bystander}/test");
    let started = std::time::Instant::now();
    let mut sent = 0;
    let refused = loop {
        let (status, body) = server.post(&path, Value::Null).await;
        match status {
            202 if sent < 40 => sent += 1,
            429 => break body,
            _ => panic!("after {sent} sent: {status} {body}"),
        }
    };
    let refilled = started.elapsed().as_secs() as usize + 1;
    assert!(
        (9..=10 + refilled).contains(&sent),
        "{sent} sent in {:?} before a refusal",
        started.elapsed()
    );
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("test events"), "{refused}");
    server.publish("acme", "invoice.paid", json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_test_event() {
    let scratch = Scratch::new("test-event");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "1,1,1")]).await;
    a_test_event_reaches_only_its_endpoint(&server).await;
    crate::endpoint_stats::every_attempt_shows_in_the_endpoint_s_stats(&server).await;
    crate::replay::a_resend_covers_what_the_endpoint_missed_while_disabled(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_test_event() {
    let scratch = Scratch::new("aws-test-event");
    let prefix = crate::aws_pipeline::unique("testevent");
    let env = [("HOOKLANE_RETRY_SCHEDULE".to_owned(), "1,1,1".to_owned())];
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &env).await;
    a_test_event_reaches_only_its_endpoint(&server).await;
    crate::endpoint_stats::every_attempt_shows_in_the_endpoint_s_stats(&server).await;
    crate::replay::a_resend_covers_what_the_endpoint_missed_while_disabled(&server).await;
    crate::iam::assert_allowed(&server);
}
