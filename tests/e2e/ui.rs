//! The /ui page in real headless Chromium (tests/ui/*.cjs with playwright-core): a customer
//! with an account token filters to a failed delivery, opens its attempts, replays it and
//! sees it delivered, then resends the rest in bulk; portal links open the page read-only,
//! for another account, and (expired) not at all; and a customer manages their own endpoint
//! from a portal link, checked at the receiver; and the page works mounted under a base path,
//! behind a proxy that strips it.

use std::{
    path::PathBuf,
    process::Output,
    sync::{Arc, Mutex},
    time::Duration,
};

use hooklane_testkit::farm::{Arrival, Behavior, Farm};
use serde_json::{json, Value};

use crate::support::{Scratch, Server, ADMIN_TOKEN};

fn node_modules() -> PathBuf {
    let dir = std::env::var_os("HOOKLANE_TEST_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("HOOKLANE_TEST_NODE_MODULES is not set: run the tests with scripts/test, which installs playwright-core and chromium")
        });
    assert!(
        dir.join("playwright-core").is_dir(),
        "{} has no playwright-core: run scripts/test-env-browser",
        dir.display()
    );
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium is missing: run scripts/test-env-browser"
    );
    dir
}

/// Runs `tests/ui/{script}` in node with `env`, printing its output; fails if it fails.
async fn run_browser(script: &str, screenshots: &std::path::Path, env: &[(&str, &str)]) -> Output {
    let node_modules = node_modules();
    let _ = std::fs::remove_dir_all(screenshots);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/ui")
        .join(script);
    let mut command = tokio::process::Command::new("node");
    command
        .arg(&path)
        .env("HOOKLANE_TEST_NODE_MODULES", &node_modules)
        .env("HOOKLANE_UI_SCREENSHOTS", screenshots)
        .env("HOOKLANE_UI_ADMIN_TOKEN", ADMIN_TOKEN)
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .unwrap_or_else(|_| panic!("{script} ran for more than 3 minutes"))
        .expect("run node");
    println!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "the browser test {script} failed (screenshots in {})",
        screenshots.display()
    );
    output
}

async fn portal_link(server: &Server, account: &str, body: Value) -> String {
    let (status, made) = server
        .post(&format!("/v1/accounts/{account}/portal"), body)
        .await;
    assert_eq!(status, 201, "{made}");
    made["url"].as_str().expect("url").to_owned()
}

async fn status_of(server: &Server, id: &str) -> Value {
    server
        .get(&format!("/v1/accounts/acme/deliveries/{id}"))
        .await
        .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_replays_a_failed_delivery_in_the_browser() {
    node_modules();
    let farm = Farm::start().await.expect("farm");
    farm.configure(
        "shop",
        Behavior::status(500).with_body("shop is down for maintenance"),
    );
    let scratch = Scratch::new("ui");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "1")]).await;
    server.create_account("acme").await;
    let [shop, _] = server
        .farm_endpoints("acme", &farm, ["shop", "books"])
        .await;
    server.create_account("globex").await;
    server
        .create_endpoint("globex", &farm.url("globex-hook"), json!({}))
        .await;
    // Made first, so that it has expired by the time the browser follows it.
    let expired_link = portal_link(&server, "globex", json!({"ttl_seconds": 1})).await;
    let mut failing = Vec::new();
    let mut delivered = None;
    for n in 0..2 {
        let event = server
            .publish("acme", "invoice.paid", json!({"invoice": n}))
            .await;
        for d in event["deliveries"].as_array().expect("deliveries") {
            let id = d["id"].as_str().expect("id").to_owned();
            if d["endpoint_id"] == shop.as_str() {
                failing.push(id);
            } else {
                delivered = Some(id);
            }
        }
    }
    let delivered = delivered.expect("a delivery to the healthy endpoint");
    let settled = server
        .eventually(Duration::from_secs(20), || async {
            let mut all = failing.iter().map(|id| (id, "failed")).collect::<Vec<_>>();
            all.push((&delivered, "delivered"));
            for (id, want) in all {
                if status_of(&server, id).await["status"] != want {
                    return false;
                }
            }
            true
        })
        .await;
    assert!(settled, "the seeded deliveries did not settle");
    farm.configure("shop", Behavior::ok());
    let (status, token) = server
        .post("/v1/accounts/acme/tokens", json!({"ttl_seconds": 900}))
        .await;
    assert_eq!(status, 201, "{token}");

    let read_only_link = portal_link(
        &server,
        "acme",
        json!({"ttl_seconds": 900, "read_only": true}),
    )
    .await;
    let other_link = portal_link(&server, "globex", json!({"ttl_seconds": 900})).await;

    let screenshots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    run_browser(
        "delivery_log.cjs",
        &screenshots,
        &[
            ("HOOKLANE_UI_BASE", &server.base),
            ("HOOKLANE_UI_TOKEN", token["token"].as_str().expect("token")),
            ("HOOKLANE_UI_REPLAY_DELIVERY", &failing[0]),
            ("HOOKLANE_UI_BULK_DELIVERY", &failing[1]),
            ("HOOKLANE_UI_DELIVERED_DELIVERY", &delivered),
            ("HOOKLANE_UI_PORTAL_READ_ONLY", &read_only_link),
            ("HOOKLANE_UI_PORTAL_OTHER", &other_link),
            ("HOOKLANE_UI_PORTAL_EXPIRED", &expired_link),
        ],
    )
    .await;

    // What the page showed is what the API says.
    for id in &failing {
        let delivery = status_of(&server, id).await;
        assert_eq!(delivery["status"], "delivered", "{delivery}");
        let (_, attempts) = server
            .get(&format!("/v1/accounts/acme/deliveries/{id}/attempts"))
            .await;
        let last = attempts["data"]
            .as_array()
            .and_then(|a| a.last())
            .cloned()
            .expect("attempts");
        assert_eq!(
            (&last["trigger"], &last["status_code"]),
            (&json!("manual"), &json!(200))
        );
    }
    // The test event sent from the page reached the healthy endpoint, and only it.
    let tested: Vec<_> = farm
        .arrivals("books")
        .into_iter()
        .filter(|a| a.body.windows(13).any(|w| w == b"hooklane.test"))
        .collect();
    assert_eq!(tested.len(), 1, "books got {} test events", tested.len());
    assert!(farm
        .arrivals("shop")
        .iter()
        .all(|a| !a.body.windows(13).any(|w| w == b"hooklane.test")));
    let (_, replays) = server.get("/v1/accounts/acme/replays").await;
    let replays = replays["data"].as_array().expect("replays");
    assert_eq!(replays.len(), 2, "{replays:?}");
    let token_actor = format!("token:{}", token["token_id"].as_str().expect("id"));
    assert!(replays.iter().all(|r| r["actor"] == token_actor.as_str()));
    for name in [
        "1-failed-delivery.png",
        "2-confirm.png",
        "3-after-replay.png",
        "5-test-event.png",
        "6-portal-read-only.png",
        "7-portal-other-account.png",
        "8-portal-expired.png",
    ] {
        assert!(screenshots.join(name).exists(), "{name} was not taken");
    }
}

fn verifies_with(arrival: &Arrival, secret: &str) -> bool {
    arrival.verify_with(secret).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_manages_an_endpoint_from_a_portal_link() {
    node_modules();
    let farm = Farm::start().await.expect("farm");
    // Each webhook's first request fails, so that the health panel shows failures and retries.
    farm.configure(
        "portal-hook",
        Behavior::failing_first(1).with_failure_status(503),
    );
    let scratch = Scratch::new("ui-endpoints");
    let server = Server::start(&scratch, &[("HOOKLANE_RETRY_SCHEDULE", "1")]).await;
    server.create_account("initech").await;
    for entry in [
        json!({"name": "invoice.paid", "description": "An invoice was paid.", "example": {"invoice_id": "in_1"}}),
        json!({"name": "order.created", "description": "An order was placed."}),
        json!({"name": "legacy.ping", "deprecated": true}),
    ] {
        let (status, made) = server.post("/v1/event-types", entry).await;
        assert_eq!(status, 201, "{made}");
    }
    let link = portal_link(&server, "initech", json!({"ttl_seconds": 900})).await;
    let screenshots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-endpoint-screenshots");
    let results = scratch.path().join("ui-endpoints.json");
    let receiver = farm.url("portal-hook");
    run_browser(
        "endpoints.cjs",
        &screenshots,
        &[
            ("HOOKLANE_UI_BASE", &server.base),
            ("HOOKLANE_UI_PORTAL", &link),
            ("HOOKLANE_UI_ACCOUNT", "initech"),
            ("HOOKLANE_UI_RECEIVER", &receiver),
            // Never connected to: the SSRF guard refuses the address when the endpoint is made.
            (
                "HOOKLANE_UI_REFUSED_URL",
                "http://169.254.169.254/latest/meta-data",
            ),
            ("HOOKLANE_UI_RESULTS", &results.to_string_lossy()),
        ],
    )
    .await;
    let shown: Value =
        serde_json::from_slice(&std::fs::read(&results).expect("the script's results"))
            .expect("JSON results");
    let (before, after) = (
        shown["before"].as_str().expect("before"),
        shown["after"].as_str().expect("after"),
    );

    // At the receiver: the test event, then order.created, and nothing else.
    let arrivals = farm.arrivals("portal-hook");
    let types: Vec<String> = arrivals
        .iter()
        .map(|a| {
            let body: Value = serde_json::from_slice(&a.body).expect("JSON body");
            body["type"].as_str().unwrap_or("").to_owned()
        })
        .collect();
    // Each first attempt failed (503) and was retried.
    assert_eq!(
        types,
        [
            "hooklane.test",
            "hooklane.test",
            "order.created",
            "order.created"
        ],
        "{types:?}"
    );
    let statuses: Vec<u16> = arrivals.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [503, 200, 503, 200]);
    for arrival in &arrivals {
        assert_eq!(arrival.header("x-tenant"), Some("t-42"));
        assert_eq!(arrival.header("authorization"), Some("Bearer let-me-in"));
    }
    // The secret the page showed signed the test event; after the rotation, the old and the
    // new secret each verify the next delivery.
    assert!(verifies_with(&arrivals[1], before), "the test event");
    assert!(
        !verifies_with(&arrivals[1], after),
        "signed with a secret made later"
    );
    assert!(
        verifies_with(&arrivals[3], before),
        "the old secret, in its grace period"
    );
    assert!(verifies_with(&arrivals[3], after), "the new secret");

    // Every change is in the audit log, by the portal link's token.
    let (_, audit) = server.get("/v1/accounts/initech/audit?limit=50").await;
    let mut actions: Vec<(String, String)> = audit["data"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["target"]["type"] == "endpoint")
        .map(|e| {
            (
                e["action"].as_str().unwrap_or("").to_owned(),
                e["actor"]["type"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    actions.reverse();
    let want = [
        "endpoint.created",
        "endpoint.updated",
        "endpoint.secret_rotated",
        "endpoint.disabled",
        "endpoint.enabled",
        "endpoint.deleted",
    ];
    assert_eq!(
        actions.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>(),
        want,
        "{audit}"
    );
    assert!(
        actions.iter().all(|(_, actor)| actor == "token"),
        "{actions:?}"
    );
    let (_, endpoints) = server.get("/v1/accounts/initech/endpoints").await;
    assert_eq!(endpoints["data"], json!([]), "{endpoints}");
    for name in [
        "10-endpoint-refused.png",
        "11-endpoint-form.png",
        "12-endpoint-secret.png",
        "13-test-event.png",
        "14-endpoint-edited.png",
        "15-rotate.png",
        "16-rotated-and-delivered.png",
        "17-endpoint-disabled.png",
        "18-endpoint-deleted.png",
    ] {
        assert!(screenshots.join(name).exists(), "{name} was not taken");
    }
}

/// A reverse proxy in front of `upstream` that mounts it at `/base/` and strips that prefix,
/// as a platform's proxy or an API Gateway base-path mapping does. Anything outside
/// `/base/` gets a 404 and is recorded in the list returned, so a page that asks the host's
/// root for its files or the API fails as it would in such a deployment.
fn base_path_proxy(listener: tokio::net::TcpListener, upstream: String) -> Arc<Mutex<Vec<String>>> {
    use axum::{body::Body, extract::Request, http::StatusCode, response::Response};

    let refused = Arc::new(Mutex::new(Vec::new()));
    let seen = refused.clone();
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: Request| {
        let (http, upstream, refused) = (http.clone(), upstream.clone(), seen.clone());
        async move {
            let (parts, body) = request.into_parts();
            let target = parts
                .uri
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/");
            let Some(rest) = target.strip_prefix("/base/") else {
                refused
                    .lock()
                    .expect("refused list")
                    .push(format!("{} {target}", parts.method));
                return Response::builder()
                    .status(StatusCode::NOT_FOUND)
                    .body(Body::from("not under /base/"))
                    .expect("404");
            };
            let body = axum::body::to_bytes(body, 16 << 20)
                .await
                .expect("request body");
            let mut headers = parts.headers.clone();
            // reqwest sets its own; the body is forwarded whole and undecoded.
            for name in ["host", "content-length", "connection", "accept-encoding"] {
                headers.remove(name);
            }
            let answer = http
                .request(parts.method.clone(), format!("{upstream}/{rest}"))
                .headers(headers)
                .body(body)
                .send()
                .await
                .expect("upstream");
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                if !matches!(
                    name.as_str(),
                    "content-length" | "transfer-encoding" | "connection"
                ) {
                    response = response.header(name, value);
                }
            }
            let bytes = answer.bytes().await.expect("upstream body");
            response.body(Body::from(bytes)).expect("response")
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_works_under_a_base_path_behind_a_proxy() {
    node_modules();
    let farm = Farm::start().await.expect("farm");
    // The proxy's address first: the server's public URL names it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the proxy");
    let mount = format!(
        "http://{}/base/",
        listener.local_addr().expect("proxy address")
    );
    let scratch = Scratch::new("ui-base-path");
    let server = Server::start(&scratch, &[("HOOKLANE_PUBLIC_URL", &mount)]).await;
    let refused = base_path_proxy(listener, server.base.clone());
    server.create_account("acme").await;
    let [endpoint] = server.farm_endpoints("acme", &farm, ["mounted"]).await;
    let event = server
        .publish("acme", "invoice.paid", json!({"invoice": 1}))
        .await;
    let delivery = event["deliveries"][0]["id"]
        .as_str()
        .expect("delivery")
        .to_owned();
    let link = portal_link(&server, "acme", json!({"ttl_seconds": 900})).await;

    let screenshots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-base-path-screenshots");
    run_browser(
        "base_path.cjs",
        &screenshots,
        &[
            ("HOOKLANE_UI_PORTAL", &link),
            ("HOOKLANE_UI_MOUNT", &mount),
            ("HOOKLANE_UI_ACCOUNT", "acme"),
            ("HOOKLANE_UI_ENDPOINT", &endpoint),
            ("HOOKLANE_UI_DELIVERY", &delivery),
        ],
    )
    .await;
    let refused = refused.lock().expect("refused list").clone();
    assert!(refused.is_empty(), "outside the mount: {refused:?}");
    for name in ["20-base-path.png", "21-base-path-slash.png"] {
        assert!(screenshots.join(name).exists(), "{name} was not taken");
    }
}
