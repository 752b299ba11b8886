//! The seed's verification: one hung endpoint cannot slow 50 healthy ones.

use std::time::{Duration, Instant};

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::json;

use crate::support::{Scratch, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_endpoint_does_not_block_others() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("slow", Behavior::slow(Duration::from_secs(30)));
    let scratch = Scratch::new("isolation");
    let server = Server::start(&scratch, &[("HOOKLANE_WORKERS", "20")]).await;
    server.create_account("acme").await;
    server.farm_endpoints("acme", &farm, ["slow"]).await;
    let healthy: Vec<String> = (0..50).map(|i| format!("ok{i}")).collect();
    for name in &healthy {
        server
            .create_endpoint("acme", &farm.url(name), json!({}))
            .await;
    }
    let started = Instant::now();
    for i in 0..200 {
        server
            .publish("acme", "invoice.paid", json!({"invoice": i}))
            .await;
    }
    let expected = 200 * healthy.len();
    let arrived = |farm: &Farm| {
        healthy
            .iter()
            .map(|n| farm.distinct_ids_succeeded(n))
            .sum::<usize>()
    };
    farm.wait_until(Duration::from_secs(30), |f| arrived(f) >= expected)
        .await;
    let elapsed = started.elapsed();
    let delivered = arrived(&farm);
    let fraction = delivered as f64 / expected as f64;
    println!(
        "isolation: {delivered}/{expected} healthy deliveries in {:.1} s ({:.0}/s); slow endpoint peak concurrency {}",
        elapsed.as_secs_f64(),
        delivered as f64 / elapsed.as_secs_f64(),
        farm.peak_concurrency("slow")
    );
    assert!(
        fraction > 0.99,
        "only {fraction:.4} of healthy deliveries arrived within 30 s"
    );
    assert!(
        farm.peak_concurrency("slow") <= 4,
        "slow endpoint saw {} concurrent requests",
        farm.peak_concurrency("slow")
    );
    assert!(
        farm.peak_concurrency("slow") >= 1,
        "the slow endpoint was never tried"
    );
    for name in &healthy {
        assert_eq!(
            farm.arrival_count(name),
            farm.distinct_ids(name),
            "{name} got duplicates without a crash"
        );
    }
    // Connections are reused across deliveries rather than opened per request.
    assert!(
        farm.connections_accepted() * 10 < delivered,
        "{} connections for {delivered} deliveries",
        farm.connections_accepted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_accounts_backlog_does_not_starve_anothers_fresh_event() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("fairness");
    let server = Server::start(&scratch, &[("HOOKLANE_WORKERS", "8")]).await;
    server.create_account("big").await;
    server.create_account("small").await;
    for i in 0..5 {
        let name = format!("big{i}");
        farm.configure(&name, Behavior::slow(Duration::from_millis(100)));
        server
            .create_endpoint("big", &farm.url(&name), json!({"max_in_flight": 8}))
            .await;
    }
    server.farm_endpoints("small", &farm, ["small"]).await;
    for i in 0..150 {
        server.publish("big", "sync.batch", json!({"i": i})).await;
    }
    // The big account's 750 deliveries now hold every worker slot.
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.total_arrivals() >= 8)
            .await
    );
    let published = Instant::now();
    server.publish("small", "invoice.paid", json!({})).await;
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("small") == 1)
            .await
    );
    let waited = published.elapsed();
    let big_done: usize = (0..5).map(|i| farm.success_count(&format!("big{i}"))).sum();
    println!("fairness: small account's event arrived after {} ms, with {big_done}/750 of the big backlog done", waited.as_millis());
    assert!(
        big_done < 375,
        "the backlog drained before the check was meaningful ({big_done} done)"
    );
    assert!(
        waited < Duration::from_secs(2),
        "the fresh event waited {waited:?} behind another account's backlog"
    );
}
