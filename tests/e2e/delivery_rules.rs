//! The 4xx rule, the 3xx rule, the 10 s deadline and the response-body cap.

use std::time::Duration;

use hooklane_testkit::farm::{Behavior, Farm, Hostile};
use serde_json::json;

use crate::support::{Scratch, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_client_errors_fail_early_and_other_4xx_keep_retrying() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("gone", Behavior::status(410));
    farm.configure("unprocessable", Behavior::status(422));
    let scratch = Scratch::new("4xx");
    let server = Server::start(
        &scratch,
        &[("HOOKLANE_RETRY_SCHEDULE", "0.2,0.2,0.2,0.2,0.2,0.2")],
    )
    .await;
    server.create_account("acme").await;
    let [gone, unprocessable] = server
        .farm_endpoints("acme", &farm, ["gone", "unprocessable"])
        .await;
    server.publish("acme", "invoice.paid", json!({})).await;
    let settled = server
        .failed_within(Duration::from_secs(20), "acme", 2)
        .await;
    assert!(settled, "deliveries did not fail");
    assert_eq!(
        farm.arrival_count("gone"),
        3,
        "410 three times must fail early"
    );
    assert_eq!(
        farm.arrival_count("unprocessable"),
        7,
        "422 is not a client-error stop: full schedule (1 + 6)"
    );
    let gone_delivery = &server
        .deliveries("acme", &format!("&endpoint={gone}"))
        .await[0];
    assert!(
        gone_delivery["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("failed early"),
        "{gone_delivery}"
    );
    assert_eq!(gone_delivery["last_status"], 410);
    let other = &server
        .deliveries("acme", &format!("&endpoint={unprocessable}"))
        .await[0];
    assert_eq!(other["attempts"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_failures_and_never_followed() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("moved", Behavior::redirect(307, farm.url("target")));
    let scratch = Scratch::new("3xx");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "0.2,0.2")]).await;
    server.create_account("acme").await;
    server.farm_endpoints("acme", &farm, ["moved"]).await;
    server.publish("acme", "invoice.paid", json!({})).await;
    let failed = server
        .failed_within(Duration::from_secs(15), "acme", 1)
        .await;
    assert!(failed, "a redirecting endpoint must end failed");
    assert_eq!(
        farm.arrival_count("moved"),
        3,
        "3xx retries like any failure"
    );
    assert_eq!(farm.arrival_count("target"), 0, "the redirect was followed");
    let delivery = &server.deliveries("acme", "").await[0];
    assert_eq!(delivery["last_status"], 307);
    assert!(
        delivery["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("not followed"),
        "{delivery}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dripping_body_is_cut_at_the_ten_second_deadline() {
    let farm = Farm::start().await.expect("farm");
    farm.configure(
        "drip",
        Behavior::hostile(Hostile::DripBody {
            interval: Duration::from_millis(500),
        }),
    );
    farm.configure(
        "huge",
        Behavior::hostile(Hostile::HugeBody {
            bytes: 50 * 1024 * 1024,
        }),
    );
    farm.configure("fine", Behavior::ok());
    let scratch = Scratch::new("deadline");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "600")]).await;
    server.create_account("acme").await;
    let [drip, huge, fine] = server
        .farm_endpoints("acme", &farm, ["drip", "huge", "fine"])
        .await;
    server.publish("acme", "invoice.paid", json!({})).await;
    // The healthy endpoint is not held up by the other two.
    assert!(
        farm.wait_until(Duration::from_secs(5), |f| f.success_count("fine") == 1)
            .await
    );
    let attempted = server
        .eventually(Duration::from_secs(20), || async {
            server
                .deliveries("acme", &format!("&endpoint={drip}"))
                .await[0]["attempts"]
                == 1
        })
        .await;
    assert!(attempted, "the dripping endpoint's attempt never ended");
    let delivery = &server
        .deliveries("acme", &format!("&endpoint={drip}"))
        .await[0];
    assert_eq!(delivery["status"], "pending");
    let (_, attempts) = server
        .get(&format!(
            "/v1/accounts/acme/deliveries/{}/attempts",
            delivery["id"].as_str().unwrap()
        ))
        .await;
    let attempt = &attempts["data"][0];
    let latency = attempt["latency_ms"].as_u64().expect("latency");
    assert!(
        (9_500..=11_500).contains(&latency),
        "attempt took {latency} ms, the deadline is 10 s"
    );
    assert!(
        attempt["error"].as_str().unwrap_or("").contains("deadline"),
        "{attempt}"
    );
    assert_eq!(attempt["status_code"], 200);
    // A 50 MiB body is read up to the cap and stored truncated; the delivery counts.
    let huge_delivery = &server
        .deliveries("acme", &format!("&endpoint={huge}"))
        .await[0];
    assert_eq!(huge_delivery["status"], "delivered", "{huge_delivery}");
    let (_, attempts) = server
        .get(&format!(
            "/v1/accounts/acme/deliveries/{}/attempts",
            huge_delivery["id"].as_str().unwrap()
        ))
        .await;
    let attempt = &attempts["data"][0];
    assert_eq!(attempt["response_body_truncated"], true);
    assert_eq!(
        attempt["response_body"].as_str().map(str::len),
        Some(64 * 1024)
    );
    let fine_delivery = &server
        .deliveries("acme", &format!("&endpoint={fine}"))
        .await[0];
    assert_eq!(fine_delivery["status"], "delivered");
}

#[tokio::test]
async fn loopback_endpoints_are_refused_without_the_allow_list() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("ssrf");
    let server = Server::start(&scratch, &[("HOOKLANE_ALLOW_CIDRS", "")]).await;
    server.create_account("acme").await;
    let (status, body) = server
        .post("/v1/accounts/acme/endpoints", json!({"url": farm.url("x")}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "url");
    // The answer does not say why (bad_input::every_refused_address_is_answered_alike); the
    // log does.
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("not allowed to send to"),
        "{body}"
    );
    assert!(
        server.log_text().contains("loopback"),
        "{}",
        server.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_rate_limit_spaces_requests() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("rate");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    server
        .create_endpoint(
            "acme",
            &farm.url("limited"),
            json!({"rate_limit_per_second": 5, "max_in_flight": 50}),
        )
        .await;
    for i in 0..20 {
        server
            .publish("acme", "invoice.paid", json!({"i": i}))
            .await;
    }
    assert!(
        farm.wait_until(Duration::from_secs(20), |f| f.success_count("limited")
            == 20)
            .await
    );
    let times: Vec<_> = farm.arrivals("limited").iter().map(|a| a.instant).collect();
    let span = times[19].duration_since(times[0]).as_secs_f64();
    // A burst of 5, then 5 per second: the last of 20 comes about 3 s after the first.
    assert!(
        (2.7..6.0).contains(&span),
        "20 requests at 5/s took {span:.2} s"
    );
    // After the burst, one request per 200 ms: request n (from 0) cannot leave before its
    // token, (n - 4) × 200 ms after the first. Measured from the first rather than between
    // neighbours, which a busy machine brings closer (a late request, then one on time:
    // 145 ms apart in one CI run), while no request can come early.
    for (n, at) in times.iter().enumerate().skip(5) {
        let since = at.duration_since(times[0]).as_secs_f64();
        // Less the 0.1 s the first request itself may have been late by.
        let earliest = (n - 4) as f64 * 0.2 - 0.1;
        assert!(
            since >= earliest,
            "request {n} came {since:.3} s after the first, before its token at {earliest:.1} s"
        );
    }
}
