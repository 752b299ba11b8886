//! `/metrics` counts match what the endpoints really received.

use std::time::Duration;

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::json;

use crate::support::{Scratch, Server, ADMIN_TOKEN};

/// Sums the samples of `name` whose label set contains every `labels` pair.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let matches = metric == name
                && labels.iter().all(|(k, v)| {
                    label_text
                        .split(',')
                        .any(|pair| pair == format!("{k}=\"{v}\""))
                });
            matches.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// The text of `/metrics`, asked for with the admin token.
async fn scrape(client: &reqwest::Client, server: &Server) -> String {
    client
        .get(format!("{}/metrics", server.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_what_the_farm_received() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("m-ok", Behavior::ok());
    farm.configure("m-flaky", Behavior::failing_first(1));
    farm.configure("m-gone", Behavior::status(404));
    let scratch = Scratch::new("metrics");
    let server = Server::start(
        &scratch,
        &[("HOOKLANE_RETRY_SCHEDULE", "0.2,0.2,0.2,0.2,0.2")],
    )
    .await;
    server.create_account("acme").await;
    let [ok_id, _, _] = server
        .farm_endpoints("acme", &farm, ["m-ok", "m-flaky", "m-gone"])
        .await;
    for i in 0..10 {
        server
            .publish("acme", "invoice.paid", json!({"i": i}))
            .await;
    }
    let settled = server
        .eventually(Duration::from_secs(20), || async {
            server
                .deliveries("acme", "&status=pending")
                .await
                .is_empty()
        })
        .await;
    assert!(settled, "deliveries did not settle");
    let client = reqwest::Client::new();
    let unauthorized = client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .expect("scrape");
    assert_eq!(unauthorized.status(), 401);
    let text = scrape(&client, &server).await;
    let farm_successes = ["m-ok", "m-flaky", "m-gone"]
        .iter()
        .map(|n| farm.success_count(n))
        .sum::<usize>() as f64;
    let farm_requests = farm.total_arrivals() as f64;
    assert_eq!(farm_successes, 20.0);
    assert_eq!(farm_requests, 10.0 + 20.0 + 30.0);
    assert_eq!(
        sample(&text, "hooklane_attempts_total", &[("outcome", "success")]),
        farm_successes,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "hooklane_attempts_total",
            &[("outcome", "http_error")]
        ),
        farm_requests - farm_successes
    );
    assert_eq!(
        sample(&text, "hooklane_attempts_total", &[("attempt", "1")]),
        30.0
    );
    assert_eq!(
        sample(&text, "hooklane_attempts_total", &[("attempt", "3")]),
        10.0
    );
    assert_eq!(sample(&text, "hooklane_events_published_total", &[]), 10.0);
    assert_eq!(
        sample(&text, "hooklane_deliveries_created_total", &[]),
        30.0
    );
    assert_eq!(
        sample(
            &text,
            "hooklane_deliveries_completed_total",
            &[("status", "delivered")]
        ),
        20.0
    );
    assert_eq!(
        sample(
            &text,
            "hooklane_deliveries_completed_total",
            &[("status", "failed")]
        ),
        10.0
    );
    assert_eq!(
        sample(
            &text,
            "hooklane_account_deliveries_total",
            &[("account", "acme"), ("status", "delivered")]
        ),
        20.0
    );
    assert_eq!(
        sample(&text, "hooklane_retries_scheduled_total", &[]),
        10.0 + 20.0
    );
    assert_eq!(
        sample(&text, "hooklane_delivery_latency_seconds_count", &[]),
        20.0
    );
    assert_eq!(
        sample(&text, "hooklane_attempt_duration_seconds_count", &[]),
        farm_requests
    );
    assert_eq!(
        sample(
            &text,
            "hooklane_endpoint_attempts_total",
            &[("endpoint", &ok_id)]
        ),
        10.0
    );
    assert_eq!(
        sample(
            &text,
            "hooklane_endpoint_in_flight",
            &[("endpoint", &ok_id)]
        ),
        0.0
    );
    // The backlog gauges are refreshed every 2 s.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let text = scrape(&client, &server).await;
    assert!(text.contains("hooklane_pending_deliveries 0"), "{text}");
    assert!(
        text.contains("hooklane_oldest_pending_age_seconds 0"),
        "{text}"
    );
}
