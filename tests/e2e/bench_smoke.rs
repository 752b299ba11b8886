//! `hooklane bench --quick` keeps working: four workloads, nothing lost.

use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_quick_runs_every_workload() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_hooklane"))
        .args(["bench", "--quick"])
        .kill_on_drop(true)
        .output()
        .await
        .expect("run bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "bench failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
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
            "W4 steady latency"
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
}
