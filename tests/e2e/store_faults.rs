//! A store that refuses writes for a while: another process holds the database's write lock
//! past the busy timeout, as a backup tool may. A webhook already sent is recorded once the
//! lock is gone and not sent again meanwhile, and `/health` says what is wrong.

use std::time::{Duration, Instant};

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

/// How long the lock is held: past the 10 s after which `/health` reports failing writes,
/// which start failing at the 5 s busy timeout.
const HOLD: Duration = Duration::from_secs(15);
const HOLD_AT_MOST: Duration = Duration::from_secs(40);

async fn health(server: &Server) -> (u16, Value) {
    let response = reqwest::get(format!("{}/health", server.base))
        .await
        .expect("health");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_after_a_send_neither_repeats_the_webhook_nor_hides_from_health() {
    let farm = Farm::start().await.expect("farm");
    // Answers after a moment, so that the lock is taken between the POST and its record.
    farm.configure("locked", Behavior::slow(Duration::from_millis(3000)));
    let scratch = Scratch::new("store-faults");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    server.farm_endpoints("acme", &farm, ["locked"]).await;
    let answer = server
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    let delivery = answer["deliveries"][0]["id"]
        .as_str()
        .expect("delivery id")
        .to_owned();
    let sent = farm
        .wait_until(Duration::from_secs(10), |f| {
            f.in_flight("locked") + f.arrival_count("locked") > 0
        })
        .await;
    assert!(sent, "the webhook was never sent");
    let lock = rusqlite::Connection::open(&server.database).expect("open the file");
    lock.execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let locked = Instant::now();
    // What `/health` answered while the lock was held, each change once. Held for `HOLD`
    // (the old code sent again every 5-10 s), and on until `/health` says so, within a bound
    // (a loaded machine is slow to get there).
    let mut during: Vec<(u16, Value)> = Vec::new();
    while locked.elapsed() < HOLD
        || (locked.elapsed() < HOLD_AT_MOST && !during.iter().any(|(status, _)| *status == 503))
    {
        let answer = health(&server).await;
        if during.last() != Some(&answer) {
            during.push(answer);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let locked_for = locked.elapsed();
    lock.execute_batch("COMMIT").expect("let go of the lock");
    drop(lock);

    let path = format!("/v1/accounts/acme/deliveries/{delivery}");
    let recorded = server
        .eventually(Duration::from_secs(20), || async {
            server.get(&path).await.1["attempts"] == 1
        })
        .await;
    // Time for a send that should not come.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, stored) = server.get(&path).await;
    let after = health(&server).await;
    let mut problems = Vec::new();
    let received = farm.arrival_count("locked");
    if received != 1 {
        problems.push(format!(
            "the receiver got the webhook {received} times over a {} s lock",
            locked_for.as_secs()
        ));
    }
    if !recorded || stored["status"] != "delivered" {
        problems.push(format!(
            "the attempt was not recorded after the lock: {stored}"
        ));
    }
    let degraded = during.iter().any(|(status, body)| {
        *status == 503
            && body["status"] == "degraded"
            && body["store"]
                .as_str()
                .is_some_and(|s| s.starts_with("writes failing for ") && s.contains("locked"))
    });
    if !degraded {
        problems.push("/health never answered 503 while writes failed".to_owned());
    }
    if after != (200, json!({"status": "ok"})) {
        problems.push(format!("/health after the lock: {after:?}"));
    }
    assert!(
        problems.is_empty(),
        "{problems:#?}\n/health during the lock: {during:?}"
    );
}
