//! `hooklane bench --quick` keeps working: six workloads, nothing lost, W1 at a given fan-out
//! and at a given publish rate.

use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_quick_runs_every_workload() {
    let (ok, stdout, stderr) = bench(&["--quick"]).await;
    println!("{stdout}");
    assert!(ok, "bench failed: {stdout}{stderr}");
    let results: Vec<Value> = stdout
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect();
    let names: Vec<&str> = results
        .iter()
        .filter_map(|r| r["workload"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "W1 throughput",
            "W2 isolation",
            "W3 flaky",
            "W4 steady latency",
            "W5 outage",
            "W6 purge"
        ]
    );
    for result in &results {
        if let Some(lost) = result.get("lost") {
            assert_eq!(lost, 0, "{result}");
        }
    }
    assert_eq!(results[1]["healthy_arrived_share"], 1.0);
    assert_eq!(results[1]["slow_peak_concurrency"], 4);
    assert_eq!(results[2]["delivered_share"], 1.0);
    assert!(results[0]["deliveries_per_s"].as_f64().unwrap_or(0.0) > 0.0);
    // W1 reads where serve's threads spent the publishing, the store thread by its name.
    for row in [
        "store_thread_on_cpu_publishing",
        "store_thread_waiting_publishing",
        "serve_threads_waiting_publishing",
    ] {
        assert!(results[0][row].is_number(), "{row} in {}", results[0]);
    }
    // W5 prints every row of its table, each measured: a number, not null.
    let outage = &results[4];
    for row in [
        "serve_rss_mb_peak",
        "serve_rss_mb_after_publish",
        "restart_to_health_s",
        "restart_first_attempt_s",
        "serve_rss_mb_after_restart",
        "endpoint_log_first_page_p99_ms",
        "filtered_log_first_page_p99_ms",
        "cursor_page_p99_ms",
        "event_deliveries_page_p99_ms",
        "publish_calls_s",
        "publish_deliveries_per_s",
        "publish_call_p99_ms",
        "attempts_per_s_while_publishing",
        "store_thread_on_cpu_publishing",
        "store_thread_waiting_publishing",
        "serve_threads_waiting_publishing",
        "attempts_per_s_after_publishing",
        "healthy_p99_ms",
        "healthy_publish_call_p99_ms",
        "database_bytes_per_delivery",
    ] {
        assert!(outage[row].is_number(), "{row} in {outage}");
    }
    assert_eq!(outage["deliveries"], 400, "{outage}");
    assert_eq!(outage["never_attempted"], 0, "{outage}");
    assert_eq!(outage["duplicates"], 0, "{outage}");
    // W6 saw the purge remove its whole backlog (2,000 deliveries, their attempts and
    // events) from serve's own log while the steady traffic went on.
    let purge = &results[5];
    assert!(
        purge["purged_deliveries"].as_u64().unwrap_or(0) >= 2_000,
        "{purge}"
    );
    assert!(
        purge["purged_attempts"].as_u64().unwrap_or(0) >= 2_000,
        "{purge}"
    );
    assert!(
        purge["purged_events"].as_u64().unwrap_or(0) >= 200,
        "{purge}"
    );
    // The split knows every purge beside the timed traffic: with a 1 s retention the steady
    // deliveries' own purges follow the backlog's.
    assert!(
        purge["purges_beside_steady_traffic"].as_u64().unwrap_or(0) >= 2,
        "{purge}"
    );
    for row in ["purge_s", "p50_ms", "p99_ms", "database_mb_after"] {
        assert!(purge[row].is_number(), "{row} in {purge}");
    }
    // The deliveries beside a purge, split between the backlog's purge and the later ones.
    let parts: Vec<u64> = purge["deliveries_during_backlog_later_purges"]
        .as_array()
        .map(|parts| parts.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    assert_eq!(parts.len(), 2, "{purge}");
    assert_eq!(
        Some(parts.iter().sum::<u64>()),
        purge["deliveries_during_purge"].as_u64(),
        "{purge}"
    );
}

/// Runs `hooklane bench` with these arguments; its exit status, stdout and stderr.
async fn bench(args: &[&str]) -> (bool, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_hooklane"))
        .arg("bench")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run bench");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `hooklane bench --quick --workloads w1` with these arguments too; W1's JSON line.
async fn quick_w1(args: &[&str]) -> Value {
    let mut all = vec!["--quick", "--workloads", "w1"];
    all.extend_from_slice(args);
    let (ok, stdout, stderr) = bench(&all).await;
    assert!(ok, "bench failed: {stdout}{stderr}");
    stdout
        .lines()
        .find(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .expect("W1's JSON line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w1_fans_each_event_out_to_the_endpoints_asked_for() {
    let w1 = quick_w1(&["--throughput-endpoints", "3"]).await;
    assert_eq!(w1["endpoints"], 3, "{w1}");
    assert_eq!(
        w1["deliveries"],
        w1["events"].as_u64().unwrap_or(0) * 3,
        "{w1}"
    );
    assert_eq!(w1["lost"], 0, "{w1}");
    assert_eq!(w1["duplicates"], 0, "{w1}");
    // The file's size per delivery, read once serve stopped and its WAL was checkpointed
    // into it: a number, not null.
    assert!(
        w1["checkpointed_bytes_per_delivery"].as_u64().unwrap_or(0) > 0,
        "{w1}"
    );

    // No endpoint means no delivery to measure: refused before anything starts.
    let (ok, _, stderr) = bench(&[
        "--quick",
        "--workloads",
        "w1",
        "--throughput-endpoints",
        "0",
    ])
    .await;
    assert!(!ok);
    assert!(stderr.contains("--throughput-endpoints"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w1_publishes_at_the_rate_asked_for() {
    let w1 = quick_w1(&["--publish-rate", "200"]).await;
    assert_eq!(w1["publish_rate"], 200, "{w1}");
    assert!(w1["publishers"].is_null(), "{w1}");
    // The quick run's 100 events are due 5 ms apart, so publishing them takes at least
    // 0.495 s whatever the calls take: at most 202 a second. The closed loop's publishers
    // start each call as the last one answers, hundreds a second or more.
    let rate = w1["publish_per_s"].as_f64().unwrap_or(f64::MAX);
    assert!(rate <= 203.0, "{w1}");
    assert!(w1["publish_call_p99_ms"].is_number(), "{w1}");
    assert_eq!(w1["lost"], 0, "{w1}");
    assert_eq!(w1["duplicates"], 0, "{w1}");

    let (ok, _, stderr) = bench(&["--quick", "--workloads", "w1", "--publish-rate", "0"]).await;
    assert!(!ok);
    assert!(stderr.contains("--publish-rate"), "{stderr}");
}
