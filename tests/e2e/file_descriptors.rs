//! Out of file descriptors: a send whose connection cannot be opened because `serve` has no
//! descriptor left is Hooklane's fault, not the endpoint's. The sender closes its idle
//! connections and connects again, or puts the delivery back without an attempt.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use hooklane_testkit::farm::Farm;
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

/// The open-files limit `serve` runs under, soft and hard.
const OPEN_FILES: u64 = 160;

/// Endpoints, each on its own listener (its own port, so its own key in the sender's
/// connection pool): more than the limit, so their connections cannot all stay open.
const ENDPOINTS: usize = 300;

/// What a connect() that met the limit says (EMFILE).
const EMFILE_TEXT: &str = "Too many open files";

/// Every delivery of one event to 300 endpoints on 300 ports, under a limit of 160 open
/// files: each endpoint gets its webhook, each delivery has exactly one attempt (a success),
/// and none records a failure caused by the process's own limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_file_descriptors_is_not_recorded_against_the_endpoints() {
    let farms: Vec<Farm> = join_all((0..ENDPOINTS).map(|_| Farm::start()))
        .await
        .into_iter()
        .map(|farm| farm.expect("farm"))
        .collect();
    let scratch = Scratch::new("file-descriptors");
    let server = Server::start_with_open_files(
        &scratch,
        &[
            ("HOOKLANE_MAX_ENDPOINTS", "400"),
            // A failed attempt is tried again only after 10 minutes: within the test, one
            // failure stays failed.
            ("HOOKLANE_RETRY_SCHEDULE", "600"),
        ],
        OPEN_FILES,
    )
    .await;
    server.create_account("acme").await;
    for farm in &farms {
        server
            .create_endpoint("acme", &farm.url("ep"), json!({}))
            .await;
    }
    let started = Instant::now();
    server
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;

    // Until every endpoint has its webhook, or a delivery has a failed attempt.
    let deadline = Duration::from_secs(20);
    let mut deliveries: Vec<Value>;
    loop {
        deliveries = server.deliveries("acme", "").await;
        let received = farms.iter().filter(|f| f.success_count("ep") > 0).count();
        let failed = deliveries
            .iter()
            .any(|d| d["last_error"].is_string() && d["status"] != "delivered");
        if received == ENDPOINTS && deliveries.iter().all(|d| d["status"] == "delivered") {
            break;
        }
        if failed || started.elapsed() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = started.elapsed();
    let received = farms.iter().filter(|f| f.success_count("ep") > 0).count();
    let requests: usize = farms.iter().map(|f| f.arrival_count("ep")).sum();
    let log = server.log_text();
    let deferred = log.matches("webhook not sent").count();
    let renewed = log
        .matches("idle connections dropped, connecting again")
        .count();
    println!(
        "file descriptors: {received}/{ENDPOINTS} endpoints reached, {requests} requests, \
         in {} ms; {renewed} sends met the limit and connected again, {deferred} were put back",
        took.as_millis()
    );

    let mut problems = Vec::new();
    if received != ENDPOINTS {
        problems.push(format!(
            "{} of {ENDPOINTS} endpoints got no webhook",
            ENDPOINTS - received
        ));
    }
    if requests != ENDPOINTS {
        problems.push(format!("{requests} requests for {ENDPOINTS} deliveries"));
    }
    let mut emfile = Vec::new();
    for delivery in &deliveries {
        if delivery["status"] != "delivered" || delivery["attempts"] != 1 {
            problems.push(format!(
                "delivery {} is {} after {} attempts: {}",
                delivery["id"], delivery["status"], delivery["attempts"], delivery["last_error"]
            ));
        }
        if delivery["attempts"].as_u64().unwrap_or(0) > 1 || delivery["status"] != "delivered" {
            let (_, attempts) = server
                .get(&format!(
                    "/v1/accounts/acme/deliveries/{}/attempts",
                    delivery["id"].as_str().unwrap_or_default()
                ))
                .await;
            for attempt in attempts["data"].as_array().cloned().unwrap_or_default() {
                let error = attempt["error"].as_str().unwrap_or_default();
                if error.contains(EMFILE_TEXT) {
                    emfile.push(error.to_owned());
                }
            }
        }
    }
    if !emfile.is_empty() {
        problems.push(format!(
            "{} attempts failed for the process's own limit, the first: {}",
            emfile.len(),
            emfile[0]
        ));
    }
    // Otherwise the test proved nothing: the limit must have been met.
    if problems.is_empty() && renewed + deferred == 0 {
        problems.push("the sender never met the limit: nothing was tested".to_owned());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
