//! Replays: a final delivery is sent again on request, as a manual attempt that restarts
//! the retry schedule; bulk "resend since T" follows its filters; every request is audited.

use std::time::Duration;

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

async fn delivery(server: &Server, account: &str, id: &str) -> Value {
    let (status, body) = server
        .get(&format!("/v1/accounts/{account}/deliveries/{id}"))
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Waits until the delivery is in `status` (and not pending); returns it.
async fn wait_for(server: &Server, account: &str, id: &str, status: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        last = delivery(server, account, id).await;
        if last["status"] == status {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("delivery {id} never became {status}: {last}");
}

async fn triggers(server: &Server, account: &str, id: &str) -> Vec<(u64, String, Option<u64>)> {
    let (status, attempts) = server
        .get(&format!("/v1/accounts/{account}/deliveries/{id}/attempts"))
        .await;
    assert_eq!(status, 200, "{attempts}");
    attempts["data"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| {
            (
                a["number"].as_u64().expect("number"),
                a["trigger"].as_str().expect("trigger").to_owned(),
                a["status_code"].as_u64(),
            )
        })
        .collect()
}

/// Asks for the delivery `id` of acme to be sent again; the answer's status and body.
async fn replay_of(server: &Server, id: &str) -> (u16, Value) {
    server
        .post(
            &format!("/v1/accounts/acme/deliveries/{id}/replay"),
            json!({}),
        )
        .await
}

fn first_delivery(event: &Value) -> String {
    event["deliveries"][0]["id"]
        .as_str()
        .expect("delivery id")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_replay_is_a_manual_attempt_that_restarts_the_schedule() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("down", Behavior::status(500));
    farm.configure("hang", Behavior::slow(Duration::from_secs(30)));
    let scratch = Scratch::new("replay-one");
    // One retry: an attempt, a retry after 0.5–1 s, then failed.
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "1")]).await;
    server.create_account("acme").await;
    let (down, _) = server
        .create_endpoint(
            "acme",
            &farm.url("down"),
            json!({"event_types": ["invoice.paid"]}),
        )
        .await;
    server
        .create_endpoint(
            "acme",
            &farm.url("hang"),
            json!({"event_types": ["user.created"]}),
        )
        .await;
    let event = server
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    let id = first_delivery(&event);
    let failed = wait_for(&server, "acme", &id, "failed").await;
    assert_eq!(failed["attempts"], 2);

    // Still failing: the manual attempt fails, and the schedule starts over with a
    // scheduled retry instead of failing at once (attempt numbers keep counting).
    let (status, replay) = replay_of(&server, &id).await;
    assert_eq!(status, 202, "{replay}");
    assert_eq!(
        (&replay["count"], &replay["actor"], &replay["scope"]),
        (&json!(1), &json!("admin"), &json!("delivery"))
    );
    assert_eq!(replay["delivery_id"], id.as_str());
    let again = wait_for(&server, "acme", &id, "failed").await;
    assert_eq!(again["attempts"], 4, "{again}");
    assert_eq!(
        triggers(&server, "acme", &id).await,
        [
            (1, "scheduled".to_owned(), Some(500)),
            (2, "scheduled".to_owned(), Some(500)),
            (3, "manual".to_owned(), Some(500)),
            (4, "scheduled".to_owned(), Some(500)),
        ]
    );

    // The endpoint recovers; the replay delivers.
    farm.configure("down", Behavior::ok());
    let (status, replay) = replay_of(&server, &id).await;
    assert_eq!(status, 202, "{replay}");
    let delivered = wait_for(&server, "acme", &id, "delivered").await;
    assert_eq!(delivered["attempts"], 5);
    assert_eq!(delivered["last_status"], 200);
    assert_eq!(
        triggers(&server, "acme", &id).await.last(),
        Some(&(5, "manual".to_owned(), Some(200)))
    );
    let arrivals = farm.arrivals("down");
    assert_eq!(arrivals.len(), 5);
    assert!(arrivals
        .iter()
        .all(|a| a.webhook_id.as_deref() == event["id"].as_str()));

    // A delivered delivery can be sent again too (the customer lost it).
    let (status, _) = replay_of(&server, &id).await;
    assert_eq!(status, 202);
    wait_for(&server, "acme", &id, "delivered").await;
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("down") == 2)
            .await
    );

    // A pending delivery is still being tried: 409, and nothing is audited.
    let hanging = server.publish("acme", "user.created", json!({})).await;
    let (status, body) = replay_of(&server, &first_delivery(&hanging)).await;
    assert_eq!(status, 409, "{body}");
    // A disabled endpoint must be enabled first.
    let (status, _) = server
        .post(
            &format!("/v1/accounts/acme/endpoints/{down}/disable"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = replay_of(&server, &id).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = replay_of(&server, "dlv_unknown").await;
    assert_eq!(status, 404, "{body}");

    let (status, audit) = server.get("/v1/accounts/acme/replays").await;
    assert_eq!(status, 200, "{audit}");
    let audit = audit["data"].as_array().expect("replays");
    assert_eq!(audit.len(), 3, "{audit:?}");
    assert!(audit
        .iter()
        .all(|r| r["delivery_id"] == id.as_str() && r["actor"] == "admin" && r["count"] == 1));
    let times: Vec<&str> = audit
        .iter()
        .map(|r| r["requested_at"].as_str().expect("time"))
        .collect();
    let mut newest_first = times.clone();
    newest_first.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(times, newest_first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_replay_resends_what_matches_since_t_and_is_audited() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("main", Behavior::status(503));
    farm.configure("other", Behavior::status(503));
    let scratch = Scratch::new("replay-bulk");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "1")]).await;
    server.create_account("acme").await;
    let [main, other] = server
        .farm_endpoints("acme", &farm, ["main", "other"])
        .await;

    let before_all = chrono::Utc::now();
    let early = server
        .publish("acme", "invoice.paid", json!({"n": 0}))
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let since = chrono::Utc::now();
    let mut later = Vec::new();
    for (n, event_type) in ["invoice.paid", "invoice.paid", "user.created"]
        .iter()
        .enumerate()
    {
        later.push(
            server
                .publish("acme", event_type, json!({"n": n + 1}))
                .await,
        );
    }
    let main_delivery = |event: &Value| -> String {
        event["deliveries"]
            .as_array()
            .expect("deliveries")
            .iter()
            .find(|d| d["endpoint_id"] == main.as_str())
            .and_then(|d| d["id"].as_str())
            .expect("main delivery")
            .to_owned()
    };
    let all_deliveries: Vec<String> = std::iter::once(&early)
        .chain(&later)
        .flat_map(|e| e["deliveries"].as_array().expect("deliveries").clone())
        .map(|d| d["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(all_deliveries.len(), 8);
    for id in &all_deliveries {
        wait_for(&server, "acme", id, "failed").await;
    }
    farm.configure("main", Behavior::ok());
    farm.configure("other", Behavior::ok());

    // Replayed by a customer with an account token.
    let (status, token) = server
        .post("/v1/accounts/acme/tokens", json!({"ttl_seconds": 600}))
        .await;
    assert_eq!(status, 201, "{token}");
    let token_id = token["token_id"].as_str().expect("token id").to_owned();
    let bulk = |body: Value| {
        let token = token["token"].as_str().expect("token").to_owned();
        let url = format!("{}/v1/accounts/acme/endpoints/{main}/replay", server.base);
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .expect("bulk replay");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.expect("json"))
        }
    };
    let (status, replay) = bulk(json!({
        "since": since.to_rfc3339(),
        "event_types": ["invoice.paid"],
    }))
    .await;
    assert_eq!(status, 202, "{replay}");
    assert_eq!(replay["count"], 2, "{replay}");
    assert_eq!(replay["actor"], format!("token:{token_id}"));
    assert_eq!(replay["statuses"], json!(["failed", "abandoned"]));
    for event in &later[..2] {
        let done = wait_for(&server, "acme", &main_delivery(event), "delivered").await;
        assert_eq!(done["attempts"], 3);
    }
    // Outside the filter: untouched.
    for event in [&early, &later[2]] {
        let untouched = delivery(&server, "acme", &main_delivery(event)).await;
        assert_eq!(
            (&untouched["status"], &untouched["attempts"]),
            (&json!("failed"), &json!(2))
        );
    }
    let (_, others) = server
        .get(&format!(
            "/v1/accounts/acme/endpoints/{other}/deliveries?status=failed"
        ))
        .await;
    assert_eq!(others["data"].as_array().map(Vec::len), Some(4), "{others}");
    assert_eq!(farm.success_count("other"), 0);

    // Since the very start, default statuses: the two still failed, not the delivered ones.
    let (status, replay) = bulk(json!({"since": before_all.to_rfc3339()})).await;
    assert_eq!((status, &replay["count"]), (202, &json!(2)), "{replay}");
    for event in [&early, &later[2]] {
        wait_for(&server, "acme", &main_delivery(event), "delivered").await;
    }
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f
            .distinct_ids_succeeded("main")
            == 4)
            .await
    );

    // Refusals name the field.
    for (body, code, field) in [
        (json!({"since": "yesterday"}), 400, "since"),
        (
            json!({"since": since.to_rfc3339(), "statuses": ["pending"]}),
            422,
            "statuses",
        ),
        (
            json!({"since": since.to_rfc3339(), "statuses": ["lost"]}),
            400,
            "statuses",
        ),
        (
            json!({"since": since.to_rfc3339(), "until": before_all.to_rfc3339()}),
            422,
            "until",
        ),
        (
            json!({"since": since.to_rfc3339(), "event_types": ["not a type"]}),
            422,
            "event_types",
        ),
        (json!({"until": since.to_rfc3339()}), 400, "since"),
    ] {
        let (status, error) = bulk(body.clone()).await;
        assert_eq!(
            (status, error["error"]["field"].as_str()),
            (code, Some(field)),
            "{body}: {error}"
        );
    }

    let (status, audit) = server.get("/v1/accounts/acme/replays?limit=1").await;
    assert_eq!(status, 200, "{audit}");
    let newest = &audit["data"][0];
    assert_eq!(newest["scope"], "endpoint");
    assert_eq!(newest["endpoint_id"], main.as_str());
    assert_eq!(newest["count"], 2);
    let cursor = audit["next_cursor"].as_str().expect("a second page");
    let (_, page) = server
        .get(&format!(
            "/v1/accounts/acme/replays?limit=1&cursor={cursor}"
        ))
        .await;
    let first = &page["data"][0];
    assert_eq!(first["event_types"], json!(["invoice.paid"]));
    assert_eq!(first["actor"], format!("token:{token_id}"));
    assert!(
        first["since"].is_string() && first["until"].is_null(),
        "{first}"
    );
    assert!(page["next_cursor"].is_null(), "{page}");
}
