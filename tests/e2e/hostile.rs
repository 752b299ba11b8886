//! Hostile receivers: every attempt ends within the deadline with bounded memory and a clear
//! error, frees its slot, and nobody else notices.

use std::time::{Duration, Instant};

use hooklane_testkit::farm::{Behavior, Farm, Hostile};
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

const BODY_CAP: usize = 64 * 1024;

struct Case {
    name: &'static str,
    behavior: Behavior,
    /// Words the recorded error must contain.
    error_contains: &'static str,
}

fn cases() -> Vec<Case> {
    let mut cases = vec![
        Case {
            name: "hang-60s",
            behavior: Behavior::slow(Duration::from_secs(60)),
            error_contains: "deadline",
        },
        Case {
            name: "drip",
            behavior: Behavior::hostile(Hostile::DripBody {
                interval: Duration::from_secs(1),
            }),
            error_contains: "deadline",
        },
        Case {
            name: "endless",
            behavior: Behavior::hostile(Hostile::EndlessBody),
            error_contains: "",
        },
        Case {
            name: "one-gib",
            behavior: Behavior::hostile(Hostile::HugeBody { bytes: 1 << 30 }),
            error_contains: "",
        },
        Case {
            name: "close-mid",
            behavior: Behavior::hostile(Hostile::CloseMidResponse),
            error_contains: "connection",
        },
        Case {
            name: "invalid-http",
            behavior: Behavior::hostile(Hostile::InvalidHttp),
            error_contains: "",
        },
        Case {
            name: "many-headers",
            behavior: Behavior::hostile(Hostile::ManyHeaders { count: 10_000 }),
            error_contains: "",
        },
    ];
    for (code, name) in [
        (301, "redirect-301"),
        (302, "redirect-302"),
        (307, "redirect-307"),
        (308, "redirect-308"),
    ] {
        cases.push(Case {
            name,
            behavior: Behavior::redirect(code, "http://169.254.169.254/latest/meta-data/"),
            error_contains: "not followed",
        });
    }
    cases
}

async fn attempts(server: &Server, endpoint: &str) -> Vec<Value> {
    let Some(delivery) = server
        .deliveries("acme", &format!("&endpoint={endpoint}"))
        .await
        .into_iter()
        .next()
    else {
        return Vec::new();
    };
    let (_, attempts) = server
        .get(&format!(
            "/v1/accounts/acme/deliveries/{}/attempts",
            delivery["id"].as_str().unwrap_or("")
        ))
        .await;
    attempts["data"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_receivers_are_contained() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("hostile");
    // One attempt each within the test: the first retry is 10 minutes away.
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "600")]).await;
    server.create_account("acme").await;
    let cases = cases();
    let mut endpoint_ids = Vec::new();
    for case in &cases {
        farm.configure(case.name, case.behavior.clone());
        let (id, _) = server
            .create_endpoint(
                "acme",
                &farm.url(case.name),
                json!({"event_types": ["hostile.*"]}),
            )
            .await;
        endpoint_ids.push(id);
    }
    server
        .create_endpoint(
            "acme",
            &farm.url("healthy"),
            json!({"event_types": ["healthy.*"]}),
        )
        .await;
    let started = Instant::now();
    server.publish("acme", "hostile.probe", json!({})).await;

    // Meanwhile a healthy endpoint gets 50 events, fast.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let healthy_started = Instant::now();
    for i in 0..50 {
        server
            .publish("acme", "healthy.ping", json!({"i": i}))
            .await;
    }
    assert!(
        farm.wait_until(Duration::from_secs(5), |f| f.success_count("healthy") == 50)
            .await
    );
    let healthy_took = healthy_started.elapsed();
    println!(
        "hostile: 50 healthy deliveries took {} ms while 11 hostile receivers were being tried",
        healthy_took.as_millis()
    );
    assert!(
        healthy_took < Duration::from_secs(3),
        "healthy endpoint slowed to {healthy_took:?}"
    );

    // Every hostile attempt ends within the 10 s deadline (plus scheduling slack).
    let mut all_done = false;
    while started.elapsed() < Duration::from_secs(25) && !all_done {
        all_done = true;
        for id in &endpoint_ids {
            all_done &= attempts(&server, id).await.len() == 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(all_done, "some hostile attempts did not end within 25 s");
    for (case, id) in cases.iter().zip(&endpoint_ids) {
        let attempt = &attempts(&server, id).await[0];
        let latency = attempt["latency_ms"].as_u64().unwrap_or(u64::MAX);
        let body_len = attempt["response_body"]
            .as_str()
            .map(str::len)
            .unwrap_or(usize::MAX);
        let error = attempt["error"].as_str().unwrap_or("");
        println!(
            "hostile: {:<13} latency {:>5} ms, stored body {:>5} B, status {:>4}, error: {}",
            case.name,
            latency,
            body_len,
            attempt["status_code"],
            if error.is_empty() { "-" } else { error }
        );
        assert!(
            latency <= 10_500,
            "{}: attempt took {latency} ms",
            case.name
        );
        assert!(
            body_len <= BODY_CAP,
            "{}: stored {body_len} bytes",
            case.name
        );
        assert!(
            error.contains(case.error_contains),
            "{}: error `{error}` lacks `{}`",
            case.name,
            case.error_contains
        );
        let delivery = &server.deliveries("acme", &format!("&endpoint={id}")).await[0];
        match case.name {
            // A complete (if oversized) 200 counts: the receiver got the webhook and said so.
            "endless" | "one-gib" => {
                assert_eq!(delivery["status"], "delivered", "{}: {delivery}", case.name)
            }
            _ => {
                assert_eq!(delivery["status"], "pending", "{}: {delivery}", case.name);
                assert!(
                    !error.is_empty(),
                    "{}: a failed attempt must say why",
                    case.name
                );
            }
        }
    }
    // Redirect targets were never contacted (nothing on the farm but the redirecting endpoints).
    assert_eq!(farm.arrival_count(""), 0);
    // Slots are free again: the farm has nothing in flight and a new round is attempted at once.
    assert!(
        farm.wait_until(Duration::from_secs(5), |f| cases
            .iter()
            .all(|c| f.in_flight(c.name) == 0))
            .await
    );
    let peak_kib = server.peak_rss_kib().unwrap_or(0);
    println!(
        "hostile: server peak RSS {} MiB after a 1 GiB body and an endless one",
        peak_kib / 1024
    );
    assert!(
        peak_kib > 0 && peak_kib < 200 * 1024,
        "peak RSS {peak_kib} KiB"
    );
}

/// Transparent huge pages made one live object hold 2 MiB of the allocator's memory; `serve`
/// turns them off for itself, whatever the host's setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_its_memory_in_small_pages() {
    let scratch = Scratch::new("pages");
    let server = Server::start(&scratch, &[]).await;
    assert_eq!(
        server.proc_status("THP_enabled").as_deref(),
        Some("0"),
        "THP_enabled of serve's /proc status (the kernel prints it since Linux 5.0)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_for_a_while_gets_it_on_the_next_attempt() {
    // Find a free port, then leave it closed: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let scratch = Scratch::new("down");
    let server = Server::start(
        &scratch,
        &[("HOOKLANE_RETRY_SCHEDULE", "1,1,1,1,1,1,1,1,1,1")],
    )
    .await;
    server.create_account("acme").await;
    server
        .create_endpoint(
            "acme",
            &format!("http://127.0.0.1:{port}/ep/back"),
            json!({}),
        )
        .await;
    server.publish("acme", "invoice.paid", json!({})).await;
    let refused = server
        .eventually(Duration::from_secs(10), || async {
            server.deliveries("acme", "").await[0]["attempts"]
                .as_u64()
                .unwrap_or(0)
                >= 2
        })
        .await;
    assert!(refused, "no attempts while the receiver was down");
    let delivery = &server.deliveries("acme", "").await[0];
    assert_eq!(delivery["status"], "pending", "{delivery}");
    assert!(
        delivery["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("connect"),
        "{delivery}"
    );
    let farm = Farm::start_on(port)
        .await
        .expect("receiver comes back on the same port");
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("back") == 1)
            .await,
        "not delivered after coming back"
    );
    let delivered = server
        .eventually(Duration::from_secs(5), || async {
            server.deliveries("acme", "").await[0]["status"] == "delivered"
        })
        .await;
    assert!(delivered);
    assert!(server
        .deliveries("acme", "&status=abandoned")
        .await
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_refused_at_send_time_is_a_clear_failed_attempt() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("ssrf-send");
    let mut server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "600")]).await;
    server.create_account("acme").await;
    server.farm_endpoints("acme", &farm, ["inside"]).await;
    // Started with the tests' allow-list, serve says what it lets webhooks reach.
    let log = server.log_text();
    assert!(
        log.contains("HOOKLANE_ALLOW_CIDRS lets webhooks reach") && log.contains("127.0.0.0/8"),
        "{log}"
    );
    // The operator removes the allow-list: the same endpoint now points at a refused address.
    server.restart_with(&[("HOOKLANE_ALLOW_CIDRS", "")]).await;
    server.publish("acme", "invoice.paid", json!({})).await;
    let attempted = server
        .eventually(Duration::from_secs(10), || async {
            server.deliveries("acme", "").await[0]["attempts"] == 1
        })
        .await;
    assert!(attempted);
    // The customer reads one text for every refused address, as endpoint create answers:
    // not why (a loopback, a private or a metadata address), which is the server's network.
    let refused = "refused: the host is, or resolves to, an address Hooklane does not send to";
    let delivery = &server.deliveries("acme", "").await[0];
    assert_eq!(delivery["last_error"], refused, "{delivery}");
    let (status, attempts) = server
        .get(&format!(
            "/v1/accounts/acme/deliveries/{}/attempts",
            delivery["id"].as_str().expect("the delivery's id")
        ))
        .await;
    assert_eq!(status, 200, "{attempts}");
    let attempt = &attempts["data"][0];
    assert_eq!(attempt["error"], refused, "{attempt}");
    // The operator's log says why.
    let log = server.log_text();
    assert!(
        log.lines()
            .any(|line| line.contains("a webhook is not sent")
                && line.contains("loopback")
                && line.contains("127.0.0.1")),
        "the server's log does not say why; log:\n{log}"
    );
    assert_eq!(
        farm.total_arrivals(),
        0,
        "the refused address was contacted"
    );
}
