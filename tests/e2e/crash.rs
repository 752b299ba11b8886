//! Crash safety: `kill -9` with deliveries in flight loses nothing.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::json;

use crate::support::{Scratch, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_mid_flight_then_restart_delivers_everything() {
    let farm = Farm::start().await.expect("farm");
    let endpoints: Vec<String> = (0..5).map(|i| format!("crash{i}")).collect();
    // 1,500 deliveries at 16 workers × 100 ms take 9 s or more, so the kill after the
    // first 100 lands mid-run (checked below), on a fast host as on a loaded one.
    for name in &endpoints {
        farm.configure(name, Behavior::slow(Duration::from_millis(100)));
    }
    let scratch = Scratch::new("crash");
    let mut server = Server::start(&scratch, &[("HOOKLANE_WORKERS", "16")]).await;
    server.create_account("acme").await;
    let mut secrets = HashMap::new();
    for name in &endpoints {
        let (_, secret) = server
            .create_endpoint("acme", &farm.url(name), json!({}))
            .await;
        secrets.insert(name.clone(), secret);
    }
    let events = 300;
    let expected = events * endpoints.len();
    let started = Instant::now();
    // In batches of 100: one event at a time took long enough on a loaded host for
    // every delivery to be sent before the kill.
    for first in (0..events).step_by(100) {
        let batch: Vec<_> = (first..first + 100)
            .map(|i| json!({"type": "order.created", "data": {"order": i}}))
            .collect();
        let (status, answer) = server
            .post("/v1/accounts/acme/events/batch", json!({ "events": batch }))
            .await;
        assert_eq!(status, 202, "{answer}");
    }
    // Let some deliveries complete and others be mid-request, then crash.
    assert!(
        farm.wait_until(Duration::from_secs(20), |f| f.total_arrivals() >= 100)
            .await,
        "nothing arrived before the crash"
    );
    assert!(
        endpoints.iter().any(|n| farm.in_flight(n) > 0),
        "no request was in flight at the crash"
    );
    server.kill9().await;
    let at_crash = farm.total_arrivals();
    assert!(
        at_crash < expected / 2,
        "the kill came late: {at_crash} requests had begun"
    );
    server.restart().await;
    let all_arrived = |f: &Farm| {
        endpoints
            .iter()
            .map(|n| f.distinct_ids_succeeded(n))
            .sum::<usize>()
            >= expected
    };
    assert!(
        farm.wait_until(Duration::from_secs(60), all_arrived).await,
        "not every event arrived after the restart"
    );
    let elapsed = started.elapsed();
    let delivered = server
        .eventually(Duration::from_secs(20), || async {
            server.deliveries("acme", "&status=delivered").await.len() == expected
        })
        .await;
    assert!(delivered, "not every delivery is marked delivered");
    let total = farm.total_arrivals();
    let duplicates = total - expected;
    println!(
        "crash: {expected} deliveries, {at_crash} requests before kill -9, {total} requests in all, {duplicates} duplicates, {:.0} deliveries/s overall",
        expected as f64 / elapsed.as_secs_f64()
    );
    // Every request, duplicate or not, carries the event's id and a valid signature.
    for name in &endpoints {
        let secret = hooklane::signing::SigningSecret::parse(&secrets[name]).expect("secret");
        for arrival in farm.arrivals(name) {
            let body: serde_json::Value = serde_json::from_slice(&arrival.body).expect("json body");
            let id = arrival.webhook_id.as_deref().expect("webhook-id");
            assert_eq!(
                body["id"].as_str(),
                Some(id),
                "webhook-id differs from the event id"
            );
            hooklane::signing::verify(
                &[&secret],
                id,
                arrival.webhook_timestamp.as_deref().expect("timestamp"),
                arrival.webhook_signature.as_deref().expect("signature"),
                &arrival.body,
                chrono::Utc::now().timestamp(),
                600,
            )
            .expect("signature verifies");
        }
    }
}

#[tokio::test]
async fn a_second_serve_on_the_same_database_is_refused() {
    let scratch = Scratch::new("lock");
    let _first = Server::start(&scratch, &[]).await;
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_hooklane"))
        .arg("serve")
        .env("HOOKLANE_LISTEN", "127.0.0.1:0")
        .env("HOOKLANE_DATABASE", scratch.path().join("hooklane.db"))
        .env("HOOKLANE_ADMIN_TOKEN", crate::support::ADMIN_TOKEN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn second serve");
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        second.wait_with_output(),
    )
    .await
    .expect("the second serve kept running: it was not refused")
    .expect("second serve output");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("in use by another hooklane process"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_flaky_deliveries_survive_three_kill_nines() {
    use rand::Rng;
    let farm = Farm::start().await.expect("farm");
    farm.set_record_arrivals(false);
    let endpoints: Vec<String> = (0..20).map(|i| format!("flaky{i}")).collect();
    for (i, name) in endpoints.iter().enumerate() {
        // Slow enough that the kills land mid-run; every fifth endpoint slower still.
        let latency = Duration::from_millis(if i % 5 == 0 { 100 } else { 50 });
        farm.configure(name, Behavior::flaky(0.3).with_latency(latency));
    }
    let scratch = Scratch::new("crash-soak");
    // 20 quick retries: a delivery failing all 21 times at 30 % is a 1-in-10^11 event.
    let schedule = vec!["0.2"; 20].join(",");
    let mut server = Server::start(
        &scratch,
        &[
            ("HOOKLANE_RETRY_SCHEDULE", &schedule),
            ("HOOKLANE_WORKERS", "32"),
        ],
    )
    .await;
    server.create_account("acme").await;
    for name in &endpoints {
        server
            .create_endpoint("acme", &farm.url(name), json!({}))
            .await;
    }
    let events = 500;
    let expected = events * endpoints.len();
    let started = Instant::now();
    {
        use futures_util::StreamExt;
        let server = &server;
        futures_util::stream::iter(0..events)
            .for_each_concurrent(16, |i| async move {
                server
                    .publish("acme", "order.created", json!({"order": i}))
                    .await;
            })
            .await;
    }
    let delivered = |f: &Farm| {
        endpoints
            .iter()
            .map(|n| f.distinct_ids_succeeded(n))
            .sum::<usize>()
    };
    let mut rng = rand::rng();
    for kill in 1..=3 {
        let threshold = expected * (kill * 25 + rng.random_range(0..10)) / 100;
        assert!(
            farm.wait_until(Duration::from_secs(90), |f| delivered(f) >= threshold)
                .await,
            "stalled before kill {kill}"
        );
        server.kill9().await;
        println!(
            "crash-soak: kill -9 #{kill} at {} of {expected} delivered",
            delivered(&farm)
        );
        server.restart().await;
    }
    assert!(
        farm.wait_until(Duration::from_secs(120), |f| delivered(f) >= expected)
            .await,
        "lost deliveries"
    );
    let elapsed = started.elapsed();
    let marked = server
        .eventually(Duration::from_secs(30), || async {
            server.deliveries("acme", "&status=delivered").await.len() == expected
        })
        .await;
    let lost = expected - delivered(&farm);
    let requests = farm.total_arrivals();
    let successes: usize = endpoints.iter().map(|n| farm.success_count(n)).sum();
    println!(
        "crash-soak: {expected} deliveries, lost {lost}, {requests} requests ({} answered 500), {} duplicate successes (same webhook-id), {:.1} s, {:.0} deliveries/s",
        requests - successes,
        successes - expected,
        elapsed.as_secs_f64(),
        expected as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(lost, 0);
    assert!(marked, "not every delivery is marked delivered in the log");
    assert!(server.deliveries("acme", "&status=failed").await.is_empty());
}
