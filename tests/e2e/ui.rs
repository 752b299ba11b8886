//! The /ui page in real headless Chromium (tests/ui/delivery_log.cjs with playwright-core):
//! a customer with an account token filters to a failed delivery, opens its attempts,
//! replays it and sees it delivered, then resends the rest in bulk; then portal links open
//! the page read-only, for another account, and (expired) not at all.

use std::{path::PathBuf, time::Duration};

use hooklane_testkit::farm::{Behavior, Farm};
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
    let node_modules = node_modules();
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
    let _ = std::fs::remove_dir_all(&screenshots);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/ui/delivery_log.cjs");
    let output = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("node")
            .arg(&script)
            .env("HOOKLANE_TEST_NODE_MODULES", &node_modules)
            .env("HOOKLANE_UI_BASE", &server.base)
            .env("HOOKLANE_UI_TOKEN", token["token"].as_str().expect("token"))
            .env("HOOKLANE_UI_REPLAY_DELIVERY", &failing[0])
            .env("HOOKLANE_UI_BULK_DELIVERY", &failing[1])
            .env("HOOKLANE_UI_DELIVERED_DELIVERY", &delivered)
            .env("HOOKLANE_UI_SCREENSHOTS", &screenshots)
            .env("HOOKLANE_UI_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("HOOKLANE_UI_PORTAL_READ_ONLY", &read_only_link)
            .env("HOOKLANE_UI_PORTAL_OTHER", &other_link)
            .env("HOOKLANE_UI_PORTAL_EXPIRED", &expired_link)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser test ran for more than 3 minutes")
    .expect("run node");
    println!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "the browser test failed (screenshots in {})",
        screenshots.display()
    );

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
