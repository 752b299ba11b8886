//! Retention in `serve`: a shutdown stops a purge in progress, and the next start removes
//! the rest.

use std::time::Duration;

use hooklane_testkit::farm::Farm;
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

/// The purge's log lines (`removed what is past retention`), oldest first.
fn purges(server: &Server) -> Vec<Value> {
    server
        .log_text()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["fields"]["message"] == "removed what is past retention")
        .map(|line| line["fields"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_stops_a_purge_in_progress_and_the_next_start_removes_the_rest() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("purge-shutdown");
    let mut server = Server::start(&scratch, &[("HOOKLANE_LOG_FORMAT", "json")]).await;
    server.create_account("acme").await;
    server.farm_endpoints("acme", &farm, ["purged"]).await;
    // 5,000 deliveries: a purge of them takes 100 transactions 20 ms apart, at least 2 s.
    let events = 5_000;
    for batch in 0..events / 100 {
        let items: Vec<Value> = (0..100)
            .map(|i| json!({"type": "order.created", "data": {"order": batch * 100 + i}}))
            .collect();
        let (status, body) = server
            .post("/v1/accounts/acme/events/batch", json!({ "events": items }))
            .await;
        assert_eq!(status, 202, "batch {batch}: {}", body["error"]);
    }
    let all_delivered = server
        .eventually(Duration::from_secs(60), || async {
            server.deliveries("acme", "&status=delivered").await.len() == events
        })
        .await;
    assert!(all_delivered, "{} arrived", farm.success_count("purged"));

    // Past a retention of 1 s by more than a second, all of it goes in the purge that starts
    // with `serve`, before it listens; SIGTERM comes as soon as it does.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    server.restart_with(&[("HOOKLANE_RETENTION", "1s")]).await;
    let exit = server.terminate().await;
    assert!(exit.success(), "serve exited with {exit}");
    let stopped = purges(&server);
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(stopped[0]["stopped_for_shutdown"], true, "{stopped:?}");
    let first = stopped[0]["deliveries"].as_u64().expect("deliveries");
    // It ended over a second before the cutoff, and less than an hour: the purge is not
    // behind, and says so.
    let overdue = stopped[0]["overdue_s"].as_u64().expect("overdue_s");
    assert!((1..3600).contains(&overdue), "{stopped:?}");
    assert!(
        first < events as u64,
        "the shutdown waited for the whole purge: {stopped:?}"
    );

    server.restart().await;
    let finished = server
        .eventually(Duration::from_secs(60), || async {
            purges(&server).len() == 2
        })
        .await;
    let both = purges(&server);
    assert!(finished, "{both:?}");
    assert_eq!(both[1]["stopped_for_shutdown"], false, "{both:?}");
    assert_eq!(
        first + both[1]["deliveries"].as_u64().expect("deliveries"),
        events as u64,
        "{both:?}"
    );
    assert!(server.deliveries("acme", "").await.is_empty());
}
