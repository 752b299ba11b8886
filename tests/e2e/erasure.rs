//! Erasure (`DELETE /v1/accounts/{account}/events/{event}`), on both shapes: the payload
//! and the endpoints' answers go, the log stays, nothing more is sent, and the grants of
//! the AWS template allow what it does.

use std::time::Duration;

use hooklane_testkit::farm::{Behavior, Farm};
use hooklane_testkit::testing::require_emulator;
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

const SECRET: &str = "4111-1111-1111-1111";

async fn attempts(server: &Server, account: &str, delivery: &str) -> Vec<Value> {
    let (status, body) = server
        .get(&format!(
            "/v1/accounts/{account}/deliveries/{delivery}/attempts"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    body["data"].as_array().cloned().unwrap_or_default()
}

fn delivery_to<'a>(event: &'a Value, endpoint: &str) -> &'a Value {
    event["deliveries"]
        .as_array()
        .and_then(|all| all.iter().find(|d| d["endpoint_id"] == endpoint))
        .unwrap_or_else(|| panic!("no delivery to {endpoint} in {event}"))
}

/// One endpoint takes the event (and echoes it), one keeps failing; the event is erased
/// while its retry is pending.
async fn erase_scenario(server: &Server, farm: &Farm) {
    farm.configure("ok", Behavior::ok().with_body(format!("got {SECRET}")));
    farm.configure(
        "down",
        Behavior::status(503).with_body(format!("no room for {SECRET}")),
    );
    server.create_account("acme").await;
    let [ok, down] = server.farm_endpoints("acme", farm, ["ok", "down"]).await;
    let (status, published) = server
        .post(
            "/v1/accounts/acme/events",
            json!({"id": "evt_card", "type": "card.added", "data": {"number": SECRET}}),
        )
        .await;
    assert_eq!(status, 202, "{published}");
    let kept = server
        .publish("acme", "card.added", json!({"number": "kept"}))
        .await;
    let kept_id = kept["id"].as_str().expect("id").to_owned();
    assert!(
        farm.wait_until(Duration::from_secs(20), |f| f.success_count("ok") == 2
            && f.distinct_ids("down") == 2)
            .await,
        "both events reached both endpoints once; serve log:\n{}",
        server.log_text()
    );
    let down_delivery = delivery_to(&published, &down)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let ok_delivery = delivery_to(&published, &ok)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    // The attempts are recorded (the farm counts them as they are answered).
    assert!(
        server
            .eventually(Duration::from_secs(10), || async {
                attempts(server, "acme", &down_delivery).await.len() == 1
                    && attempts(server, "acme", &ok_delivery).await.len() == 1
            })
            .await,
        "the first attempts were recorded"
    );
    assert!(
        attempts(server, "acme", &ok_delivery).await[0]["response_body"]
            .as_str()
            .is_some_and(|b| b.contains(SECRET))
    );

    let (status, erased) = server
        .request(
            reqwest::Method::DELETE,
            "/v1/accounts/acme/events/evt_card",
            None,
        )
        .await;
    assert_eq!(status, 200, "{erased}");
    // On a slow machine the one-second retry may be in flight as the erasure runs: its
    // record lands after it, the delivery pending and the endpoint's answer kept. The sender
    // ends the delivery when it next takes it, and erasing again clears that answer, as
    // docs/OPERATIONS.md says.
    let erased = if delivery_to(&erased, &down)["status"] == "failed" {
        erased
    } else {
        let path = "/v1/accounts/acme/events/evt_card";
        assert!(
            server
                .eventually(Duration::from_secs(10), || async {
                    delivery_to(&server.get(path).await.1, &down)["status"] == "failed"
                })
                .await,
            "the sender ended the delivery an attempt had moved on: {erased}"
        );
        let (status, again) = server.request(reqwest::Method::DELETE, path, None).await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(again["erased_at"], erased["erased_at"], "{again}");
        again
    };
    let tries_of = |farm: &Farm| {
        farm.arrivals("down")
            .iter()
            .filter(|a| a.webhook_id.as_deref() == Some("evt_card"))
            .count()
    };
    let tries_at_erasure = tries_of(farm);
    assert_eq!(erased["id"], "evt_card");
    assert_eq!(erased["type"], "card.added");
    assert_eq!(erased["data"], Value::Null, "{erased}");
    let erased_at = erased["erased_at"].as_str().expect("erased_at").to_owned();
    assert!(!erased.to_string().contains(SECRET), "{erased}");
    assert_eq!(delivery_to(&erased, &ok)["status"], "delivered");
    let ended = delivery_to(&erased, &down);
    assert_eq!(ended["status"], "failed", "{erased}");
    assert!(
        ended["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("erased")),
        "{ended}"
    );

    let (status, read) = server.get("/v1/accounts/acme/events/evt_card").await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read, erased, "a read shows what the erasure answered");
    // On a slow machine the failing endpoint's one-second retry may have run before the
    // erasure: its attempts are the tries the farm saw by then (one still in flight at the
    // erasure is not recorded).
    for (delivery, tries) in [(&ok_delivery, 1), (&down_delivery, tries_at_erasure)] {
        let attempts = attempts(server, "acme", delivery).await;
        assert!(
            (1..=tries).contains(&attempts.len()),
            "the attempts stay in the log: {} of {tries}",
            attempts.len()
        );
        for attempt in &attempts {
            assert_eq!(attempt["response_body"], "", "{attempts:?}");
            assert!(attempt["status_code"].is_u64());
        }
    }
    let (_, kept_read) = server
        .get(&format!("/v1/accounts/acme/events/{kept_id}"))
        .await;
    assert_eq!(
        kept_read["data"]["number"], "kept",
        "another event keeps its content"
    );

    // Its retry (due a second after the first try) is never sent; the kept event's are.
    let kept_tries = |farm: &Farm| farm.arrival_count("down") - tries_of(farm);
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| kept_tries(f) >= 3)
            .await,
        "the kept event was retried"
    );
    assert_eq!(
        tries_of(farm),
        tries_at_erasure,
        "the erased event was not sent again"
    );

    // Again: the same answer. Publishing the id again returns the erased event.
    let (status, again) = server
        .request(
            reqwest::Method::DELETE,
            "/v1/accounts/acme/events/evt_card",
            None,
        )
        .await;
    assert_eq!(
        (status, again["erased_at"].as_str()),
        (200, Some(erased_at.as_str()))
    );
    let (status, republished) = server
        .post(
            "/v1/accounts/acme/events",
            json!({"id": "evt_card", "type": "card.added", "data": {"number": SECRET}}),
        )
        .await;
    assert_eq!(status, 200, "{republished}");
    assert_eq!(republished["data"], Value::Null);
    let (status, missing) = server
        .request(
            reqwest::Method::DELETE,
            "/v1/accounts/acme/events/evt_none",
            None,
        )
        .await;
    assert_eq!(status, 404, "{missing}");
    assert_eq!(missing["error"]["code"], "not_found", "{missing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasing_an_event_removes_its_content_and_keeps_its_log() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("erasure");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "1,1,1")]).await;
    erase_scenario(&server, &farm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasing_an_event_on_the_aws_shape_removes_its_content_with_the_template_s_grants() {
    require_emulator();
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("aws-erasure");
    let prefix = crate::aws_pipeline::unique("erase");
    let env = [("HOOKLANE_RETRY_SCHEDULE".to_owned(), "1,1,1".to_owned())];
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &env).await;
    erase_scenario(&server, &farm).await;
    crate::iam::assert_allowed(&server);
}

/// On AWS a `DELETE` of an event to many endpoints can run out of time (answered 202, where
/// it stopped kept on the event item). The sweeper finishes one nobody repeats, with its own
/// role's grants: here the test's own erasure call, given no time, stops after the first
/// page of 100 deliveries as a call out of time does, and the serve's sweeper empties the
/// answers on the second page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_left_unfinished_on_aws_is_finished_by_the_sweeper_with_its_grants() {
    use hooklane::store::{
        dynamodb::{DynamoStore, Retention, TableNames},
        Store,
    };
    require_emulator();
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("aws-erasure-sweeper");
    let prefix = crate::aws_pipeline::unique("erasesweep");
    let env = [
        ("HOOKLANE_RETRY_SCHEDULE".to_owned(), "1".to_owned()),
        ("HOOKLANE_SWEEP_INTERVAL".to_owned(), "500ms".to_owned()),
        // More than a page of them (the default is 100).
        ("HOOKLANE_MAX_ENDPOINTS".to_owned(), "101".to_owned()),
    ];
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &env).await;
    server.create_account("acme").await;
    let mut endpoints = Vec::new();
    for i in 0..101 {
        let name = format!("e{i:03}");
        let (id, _) = server
            .create_endpoint("acme", &farm.url(&name), json!({}))
            .await;
        endpoints.push((id, name));
    }
    endpoints.sort();
    // The last in endpoint-id order is on the erasure's second page: it fails once, then
    // echoes the event, so its answers are on the delivery item and in the attempts table.
    let (last, last_name) = endpoints.last().cloned().expect("endpoints");
    farm.configure(
        &last_name,
        Behavior::failing_first(1).with_body(format!("echo {SECRET}")),
    );
    let event = server
        .publish("acme", "card.added", json!({"number": SECRET}))
        .await;
    let event_id = event["id"].as_str().expect("id").to_owned();
    let delivery = delivery_to(&event, &last)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let echoed = || async {
        attempts(&server, "acme", &delivery)
            .await
            .iter()
            .filter(|a| a["response_body"].as_str().is_some_and(|b| !b.is_empty()))
            .count()
    };
    assert!(
        server
            .eventually(Duration::from_secs(30), || async { echoed().await == 2 })
            .await,
        "both attempts of the last delivery were recorded with their answers: {:?}",
        attempts(&server, "acme", &delivery).await
    );

    let client = hooklane_testkit::testing::emulator_client().await;
    let store = DynamoStore::new(
        client,
        TableNames::with_prefix(&prefix),
        Retention::default(),
        hooklane_testkit::testing::test_secrets(None),
    )
    .with_erase_budget(Duration::ZERO);
    let account = hooklane::domain::AccountId::parse("acme").unwrap();
    let event_id = hooklane::domain::EventId::parse(&event_id).unwrap();
    let call = store
        .erase_event(&account, &event_id, chrono::Utc::now())
        .await
        .expect("erase")
        .expect("the event");
    // The serve's sweeper may take it up at once: what it leaves is checked below.
    assert!(!call.complete, "stopped after the first page");
    assert!(
        server
            .eventually(Duration::from_secs(30), || async {
                store.unfinished_erasures().await.unwrap().is_empty()
            })
            .await,
        "the sweeper did not finish the erasure; serve log:\n{}",
        server.log_text()
    );
    assert_eq!(echoed().await, 0, "the sweeper emptied the answers");
    let (status, read) = server
        .get(&format!("/v1/accounts/acme/events/{event_id}"))
        .await;
    assert_eq!(status, 200, "{read}");
    assert!(read["erased_at"].is_string(), "{read}");
    crate::iam::assert_allowed(&server);
}
