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

/// The webhook ids `name` received, sorted.
fn received(farm: &Farm, name: &str) -> Vec<String> {
    let mut ids: Vec<String> = farm
        .arrivals(name)
        .into_iter()
        .filter_map(|a| a.webhook_id)
        .collect();
    ids.sort();
    ids
}

fn sorted_ids(events: &[&Value]) -> Vec<String> {
    let mut ids: Vec<String> = events
        .iter()
        .map(|e| e["id"].as_str().expect("event id").to_owned())
        .collect();
    ids.sort();
    ids
}

/// "Resend since" with `include_missed` creates the deliveries an endpoint never had of the
/// events of its types published while it was disabled (outpost #611), once, counted apart
/// in the replay record and the audit log; without it they stay unsent. Run on the servers
/// of test_events.rs, in both shapes.
pub async fn a_resend_covers_what_the_endpoint_missed_while_disabled(server: &Server) {
    let farm = Farm::start().await.expect("farm");
    server.create_account("missed").await;
    let (paused, _) = server
        .create_endpoint(
            "missed",
            &farm.url("paused"),
            json!({"event_types": ["invoice.*"]}),
        )
        .await;
    // Receives everything: when it has an event, that event's fan-out is done.
    let (_all, _) = server
        .create_endpoint("missed", &farm.url("all"), json!({}))
        .await;
    let before = server
        .publish("missed", "invoice.paid", json!({"n": 0}))
        .await;
    // On AWS the fan-out runs a moment after the publish: it is done before the disable.
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| f.success_count("paused") == 1)
            .await
    );
    let path = |action: &str| format!("/v1/accounts/missed/endpoints/{paused}/{action}");
    let (status, body) = server.post(&path("disable"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let since = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut during = Vec::new();
    for event_type in ["invoice.paid", "invoice.refunded", "user.created"] {
        during.push(server.publish("missed", event_type, json!({})).await);
    }
    let all_four = sorted_ids(&[&before, &during[0], &during[1], &during[2]]);
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| f.success_count("all") == 4)
            .await,
        "the active endpoint never got the four events"
    );
    assert_eq!(received(&farm, "all"), all_four);

    // An endpoint still disabled cannot be resent to.
    let resend = |include_missed: Value| json!({"since": since, "include_missed": include_missed});
    let (status, body) = server.post(&path("replay"), resend(json!(true))).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = server.post(&path("enable"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let after = server
        .publish("missed", "invoice.paid", json!({"n": 4}))
        .await;
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| f.success_count("paused") == 2)
            .await
    );

    // Bad input names the field; a plain resend has nothing to send (nothing failed).
    let (status, body) = server.post(&path("replay"), resend(json!("yes"))).await;
    assert!(status == 400 || status == 422, "{status} {body}");
    assert_eq!(body["error"]["field"], "include_missed", "{body}");
    let (status, plain) = server.post(&path("replay"), json!({"since": since})).await;
    assert_eq!(status, 202, "{plain}");
    assert_eq!(
        (&plain["count"], &plain["missed"], &plain["include_missed"]),
        (&json!(0), &json!(0), &json!(false))
    );

    // With `include_missed`: the two invoice events published while it was disabled (not
    // user.created, which it does not subscribe to).
    let (status, recovered) = server.post(&path("replay"), resend(json!(true))).await;
    assert_eq!(status, 202, "{recovered}");
    assert_eq!(
        (
            &recovered["count"],
            &recovered["missed"],
            &recovered["include_missed"],
            &recovered["more"]
        ),
        (&json!(0), &json!(2), &json!(true), &json!(false)),
        "{recovered}"
    );
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| f.success_count("paused") == 4)
            .await,
        "the missed events never arrived: {:?}",
        received(&farm, "paused")
    );
    assert_eq!(
        received(&farm, "paused"),
        sorted_ids(&[&before, &during[0], &during[1], &after])
    );
    // Each is in the endpoint's log, its one attempt made on request.
    let log = server
        .deliveries("missed", &format!("&endpoint={paused}"))
        .await;
    assert_eq!(log.len(), 4, "{log:?}");
    for event in &during[..2] {
        let delivery = log
            .iter()
            .find(|d| d["event_id"] == event["id"])
            .expect("a delivery of the missed event");
        let id = delivery["id"].as_str().expect("id");
        let done = wait_for(server, "missed", id, "delivered").await;
        assert_eq!(done["attempts"], 1, "{done}");
        assert_eq!(
            triggers(server, "missed", id).await,
            [(1, "manual".to_owned(), Some(200))]
        );
    }

    // Asking again creates nothing twice.
    let (status, again) = server.post(&path("replay"), resend(json!(true))).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!((&again["count"], &again["missed"]), (&json!(0), &json!(0)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(farm.arrivals("paused").len(), 4);

    // The trail counts them apart: in the replay records and the audit log.
    let (status, replays) = server.get("/v1/accounts/missed/replays").await;
    assert_eq!(status, 200, "{replays}");
    let missed: Vec<(&Value, &Value)> = replays["data"]
        .as_array()
        .expect("replays")
        .iter()
        .map(|r| (&r["count"], &r["missed"]))
        .collect();
    assert_eq!(
        missed,
        [
            (&json!(0), &json!(0)),
            (&json!(0), &json!(2)),
            (&json!(0), &json!(0))
        ],
        "newest first"
    );
    let (status, audit) = server.get("/v1/accounts/missed/audit").await;
    assert_eq!(status, 200, "{audit}");
    let created = audit["data"]
        .as_array()
        .expect("audit")
        .iter()
        .find(|e| e["action"] == "replay.created" && e["details"]["missed"] == 2)
        .expect("the audit entry of the resend that recovered the missed events");
    assert_eq!(created["details"]["include_missed"], true, "{created}");
    assert_eq!(created["details"]["count"], 0, "{created}");
}
