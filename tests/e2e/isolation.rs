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
    // The farm counts a request until it sees its connection close. At the 10 s deadline
    // serve drops the slow endpoint's requests and sends the next ones at once, and the farm
    // may take a new request before it sees an old one's close: from then on it counts
    // requests serve has given up. So the cap is read before the first deadline can pass.
    let before_deadline = tokio::spawn({
        let farm = farm.clone();
        let at = tokio::time::Instant::from_std(started + Duration::from_millis(9_500));
        async move {
            tokio::time::sleep_until(at).await;
            farm.peak_concurrency("slow")
        }
    });
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
    let peak = if elapsed < Duration::from_millis(9_500) {
        before_deadline.abort();
        farm.peak_concurrency("slow")
    } else {
        before_deadline.await.expect("the peak before the deadline")
    };
    println!(
        "isolation: {delivered}/{expected} healthy deliveries in {:.1} s ({:.0}/s); slow endpoint peak concurrency {peak} before the deadline, {} in all",
        elapsed.as_secs_f64(),
        delivered as f64 / elapsed.as_secs_f64(),
        farm.peak_concurrency("slow")
    );
    assert!(
        fraction > 0.99,
        "only {fraction:.4} of healthy deliveries arrived within 30 s"
    );
    assert!(peak <= 4, "slow endpoint saw {peak} concurrent requests");
    assert!(peak >= 1, "the slow endpoint was never tried");
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

/// The threads of a process whose name starts with `prefix`: (nice value, nanoseconds on a CPU).
#[cfg(target_os = "linux")]
fn threads(pid: u32, prefix: &str) -> Vec<(i64, u64)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("read the task list");
    let mut found = Vec::new();
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).expect("read a thread's stat");
        // After the name in parentheses: state is field 3, nice field 19.
        let rest = &stat[stat.rfind(')').expect("stat has the name") + 2..];
        let nice: i64 = rest
            .split(' ')
            .nth(16)
            .expect("nice")
            .parse()
            .expect("number");
        let schedstat = std::fs::read_to_string(path.join("schedstat")).expect("schedstat");
        let on_cpu: u64 = schedstat
            .split(' ')
            .next()
            .expect("run time")
            .parse()
            .expect("ns");
        found.push((nice, on_cpu));
    }
    found
}

/// `serve` sends, fans out and pages due work on a runtime of its own whose threads run 5
/// nice steps below the API's, so that on a busy machine a publish call waits for the store
/// and not for a core that the sends hold.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_run_below_the_apis_cpu_priority() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("priority");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let names: Vec<String> = (0..10).map(|i| format!("ok{i}")).collect();
    for name in &names {
        server
            .create_endpoint("acme", &farm.url(name), json!({}))
            .await;
    }
    for i in 0..100 {
        server
            .publish("acme", "invoice.paid", json!({"invoice": i}))
            .await;
    }
    let arrived = |farm: &Farm| {
        names
            .iter()
            .map(|n| farm.distinct_ids_succeeded(n))
            .sum::<usize>()
    };
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| arrived(f) >= 1_000)
            .await,
        "{} of 1,000 deliveries arrived",
        arrived(&farm)
    );
    let pid = server.pid().expect("serve runs");
    let api = threads(pid, "tokio-rt-worker");
    let dispatch = threads(pid, "hooklane-dispat");
    assert!(
        !api.is_empty() && !dispatch.is_empty(),
        "api {api:?}, dispatch {dispatch:?}"
    );
    let api_nice = api[0].0;
    assert!(
        dispatch
            .iter()
            .all(|(nice, _)| *nice == (api_nice + 5).min(19)),
        "api threads at {api_nice}, dispatcher's {dispatch:?}"
    );
    // A thousand signed sends take tens of milliseconds; the dispatcher's threads do
    // nothing else but wait.
    let on_cpu_ms = dispatch.iter().map(|(_, ns)| ns).sum::<u64>() / 1_000_000;
    assert!(
        on_cpu_ms >= 20,
        "the dispatcher's threads ran {on_cpu_ms} ms for 1,000 sends"
    );
}
