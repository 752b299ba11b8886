//! The delivery log, per account and per endpoint: newest first, cursor pagination, every
//! filter, and attempt detail.

use std::{collections::HashSet, time::Duration};

use chrono::SecondsFormat;
use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

async fn ids(server: &Server, path: &str) -> Vec<String> {
    let (status, page) = server.get(path).await;
    assert_eq!(status, 200, "{path}: {page}");
    page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| d["id"].as_str().expect("id").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_pages_newest_first_and_filters() {
    let farm = Farm::start().await.expect("farm");
    farm.configure(
        "gone",
        Behavior::status(410).with_body(r#"{"error":"no such hook"}"#),
    );
    let scratch = Scratch::new("delivery-log");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "1")]).await;
    server.create_account("acme").await;
    let [ok, gone] = server.farm_endpoints("acme", &farm, ["ok", "gone"]).await;
    let mut cut = None;
    for (n, event_type) in ["a.x", "a.x", "a.x", "b.y", "b.y"].iter().enumerate() {
        if n == 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            cut = Some(chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server.publish("acme", event_type, json!({"n": n})).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cut = cut.expect("cut");
    let settled = server
        .eventually(Duration::from_secs(20), || async {
            server
                .deliveries("acme", "")
                .await
                .iter()
                .all(|d| d["status"] != "pending")
        })
        .await;
    assert!(settled, "deliveries did not settle");

    // Pages of two, newest first, each delivery once, the cursor ending at the last page.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/accounts/acme/deliveries?limit=2&cursor={c}"),
            None => "/v1/accounts/acme/deliveries?limit=2".to_owned(),
        };
        let (status, page) = server.get(&path).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        seen.extend(page["data"].as_array().expect("data").iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 10);
    assert_eq!(pages, 5);
    let unique: HashSet<&str> = seen.iter().filter_map(|d| d["id"].as_str()).collect();
    assert_eq!(unique.len(), 10, "a delivery appeared twice");
    let created: Vec<&str> = seen
        .iter()
        .filter_map(|d| d["created_at"].as_str())
        .collect();
    let mut newest_first = created.clone();
    newest_first.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(created, newest_first);
    let row = &seen[0];
    for field in [
        "event_id",
        "event_type",
        "status",
        "attempts",
        "last_status",
        "next_try_at",
        "last_error",
        "created_at",
    ] {
        assert!(row.get(field).is_some(), "row has no {field}: {row}");
    }

    let count = |filter: &'static str| {
        let server = &server;
        async move {
            ids(server, &format!("/v1/accounts/acme/deliveries?{filter}"))
                .await
                .len()
        }
    };
    assert_eq!(count("status=failed").await, 5);
    assert_eq!(count("status=delivered").await, 5);
    assert_eq!(count("status=pending").await, 0);
    assert_eq!(count("status_code=410").await, 5);
    assert_eq!(count("status_code=200").await, 5);
    assert_eq!(count("status_code=500").await, 0);
    assert_eq!(count("event_type=b.y").await, 4);
    assert_eq!(
        ids(
            &server,
            &format!("/v1/accounts/acme/deliveries?endpoint={ok}")
        )
        .await
        .len(),
        5
    );
    assert_eq!(
        ids(
            &server,
            &format!("/v1/accounts/acme/deliveries?since={cut}")
        )
        .await
        .len(),
        4
    );
    assert_eq!(
        ids(
            &server,
            &format!("/v1/accounts/acme/deliveries?until={cut}")
        )
        .await
        .len(),
        6
    );
    let endpoint_log = ids(
        &server,
        &format!(
            "/v1/accounts/acme/endpoints/{gone}/deliveries?event_type=a.x&status=failed&until={cut}"
        ),
    )
    .await;
    assert_eq!(endpoint_log.len(), 3);

    // Attempt detail of a failed delivery: what the endpoint answered.
    let (_, attempts) = server
        .get(&format!(
            "/v1/accounts/acme/deliveries/{}/attempts",
            endpoint_log[0]
        ))
        .await;
    let attempts = attempts["data"].as_array().expect("attempts").clone();
    assert_eq!(attempts.len(), 2);
    let first: &Value = &attempts[0];
    assert_eq!(first["number"], 1);
    assert_eq!(first["trigger"], "scheduled");
    assert_eq!(first["status_code"], 410);
    assert_eq!(first["response_body"], r#"{"error":"no such hook"}"#);
    assert_eq!(first["response_body_truncated"], false);
    assert!(first["latency_ms"].is_u64() && first["started_at"].is_string());
    let headers = first["response_headers"].as_array().expect("headers");
    assert!(
        headers
            .iter()
            .any(|h| h[0] == "content-length" && h[1] == "24"),
        "{headers:?}"
    );
}

/// What a write answers is what a read of it returns, to the millisecond the store keeps:
/// the times a client files from an answer are those it reads back, and the event's is the
/// `created` of the webhook's body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_answers_the_times_a_read_returns() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("times-read-back");
    let server = Server::start(&scratch, &[]).await;
    let (status, account) = server
        .post(
            "/v1/accounts",
            json!({"id": "acme", "name": "Acme", "owner_email": "owner@acme.example"}),
        )
        .await;
    assert_eq!(status, 201, "{account}");
    let (_, read) = server.get("/v1/accounts/acme").await;
    assert_eq!(account["created_at"], read["created_at"], "the account");

    let (status, endpoint) = server
        .post(
            "/v1/accounts/acme/endpoints",
            json!({"url": farm.url("up")}),
        )
        .await;
    assert_eq!(status, 201, "{endpoint}");
    let id = endpoint["id"].as_str().expect("id");
    let (_, read) = server
        .get(&format!("/v1/accounts/acme/endpoints/{id}"))
        .await;
    for field in ["created_at", "updated_at"] {
        assert_eq!(endpoint[field], read[field], "the endpoint's {field}");
    }

    let event = server.publish("acme", "invoice.paid", json!({})).await;
    let id = event["id"].as_str().expect("id");
    let (_, read) = server.get(&format!("/v1/accounts/acme/events/{id}")).await;
    assert_eq!(event["created_at"], read["created_at"], "the event");
    let since = event["created_at"].as_str().expect("created_at");
    let listed = server.deliveries("acme", &format!("&since={since}")).await;
    let delivery = event["deliveries"][0]["id"].as_str().expect("a delivery");
    assert!(
        listed.iter().any(|d| d["id"] == delivery),
        "since the event's own created_at ({since}), its delivery is not listed: {listed:?}"
    );
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("up") == 1)
            .await,
        "the webhook did not arrive"
    );
    let body: Value =
        serde_json::from_slice(&farm.arrivals("up")[0].body).expect("a JSON webhook body");
    let time = |value: &Value| {
        chrono::DateTime::parse_from_rfc3339(value.as_str().expect("a time")).expect("RFC 3339")
    };
    assert_eq!(
        time(&body["created"]),
        time(&event["created_at"]),
        "the webhook's body against the publish's answer"
    );
}

/// An attempt keeps up to 64 KiB of the endpoint's answer, which as JSON can be six times
/// that (control bytes are escaped): a delivery's attempts come a page of about 1 MiB at a
/// time, so that on AWS the answer stays within what a Lambda function may return (6 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_s_attempts_come_in_pages_of_bounded_size() {
    let farm = Farm::start().await.expect("farm");
    farm.configure(
        "junk",
        Behavior::status(500).with_body(vec![0x01_u8; 64 * 1024]),
    );
    let scratch = Scratch::new("attempt-pages");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "1,1,1")]).await;
    server.create_account("acme").await;
    let [_junk] = server.farm_endpoints("acme", &farm, ["junk"]).await;
    server.publish("acme", "a.x", json!({})).await;
    let ended = server
        .eventually(Duration::from_secs(30), || async {
            server
                .deliveries("acme", "")
                .await
                .first()
                .is_some_and(|d| d["status"] == "failed" && d["attempts"] == 4)
        })
        .await;
    assert!(ended, "four attempts did not end the delivery");
    let delivery = server.deliveries("acme", "").await[0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let attempts = format!("/v1/accounts/acme/deliveries/{delivery}/attempts");

    let read_all = |query: &'static str| {
        let (server, attempts) = (&server, &attempts);
        async move {
            let (mut numbers, mut sizes) = (Vec::new(), Vec::new());
            let mut cursor: Option<String> = None;
            loop {
                let path = match &cursor {
                    Some(c) => format!("{attempts}?{query}cursor={c}"),
                    None => format!("{attempts}?{query}"),
                };
                let (status, page) = server.get(&path).await;
                assert_eq!(status, 200, "{path}");
                sizes.push(page.to_string().len());
                numbers.extend(
                    page["data"]
                        .as_array()
                        .expect("data")
                        .iter()
                        .map(|a| a["number"].clone()),
                );
                match page["next_cursor"].as_str() {
                    Some(next) => cursor = Some(next.to_owned()),
                    None => break (numbers, sizes),
                }
            }
        }
    };
    let (numbers, sizes) = read_all("").await;
    assert_eq!(numbers, [1, 2, 3, 4], "each attempt once, oldest first");
    assert!(
        sizes.len() >= 2 && sizes.iter().all(|&size| size <= 2 << 20),
        "pages of {sizes:?} bytes"
    );
    let (numbers, sizes) = read_all("limit=1&").await;
    assert_eq!((numbers.len(), sizes.len()), (4, 4));

    // A cursor of another delivery's attempts is refused, naming it.
    let foreign = hooklane::store::cursor::encode(1, "dlv_another");
    let (status, body) = server.get(&format!("{attempts}?cursor={foreign}")).await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (400, &json!("cursor")),
        "{body}"
    );
}
