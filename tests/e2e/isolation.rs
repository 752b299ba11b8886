//! The seed's verification: one hung endpoint cannot slow 50 healthy ones.

use std::time::{Duration, Instant};

use hooklane_cli::farm::{Behavior, Farm};
use serde_json::json;

use crate::support::{Scratch, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_endpoint_does_not_block_others() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("slow", Behavior::slow(Duration::from_secs(30)));
    let scratch = Scratch::new("isolation");
    let server = Server::start(&scratch, &[("HOOKLANE_WORKERS", "20")]).await;
    server.create_account("acme").await;
    server
        .create_endpoint("acme", &farm.url("slow"), json!({}))
        .await;
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
}
