//! The audit log, in both shapes: a scripted series of changes through the HTTP API by the
//! admin token, a scoped key and an account token, then the account's log read back a few
//! entries at a time: each change once, newest first, with its actor, target and the
//! client's address, and no secret anywhere. Bad paging parameters get a 400 naming them.

use std::time::Duration;

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

fn text(value: &Value, what: &str) -> String {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{what}: {value}"))
        .to_owned()
}

/// The whole log of `account`, read `limit` entries a page with `credential`.
async fn read_log(server: &Server, credential: &str, account: &str, limit: u32) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/v1/accounts/{account}/audit?limit={limit}");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let (status, page) = server
            .request_as(credential, reqwest::Method::GET, &path, None)
            .await;
        assert_eq!(status, 200, "{path}: {page}");
        let data = page["data"].as_array().expect("data");
        assert!(data.len() <= limit as usize, "{page}");
        entries.extend(data.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return entries,
        }
    }
    panic!("the log never ended");
}

/// What the script did, newest last: (action, actor type, actor id, target type, target id).
type Expected = Vec<(
    &'static str,
    &'static str,
    Option<String>,
    &'static str,
    String,
)>;

/// Changes acme through the API; returns what its log must hold, and every secret seen.
async fn script(server: &Server, farm: &Farm) -> (Expected, Vec<String>, String) {
    use reqwest::Method;
    let mut expected: Expected = Vec::new();
    let mut secrets = Vec::new();
    server.create_account("acme").await;
    expected.push(("account.created", "admin", None, "account", "acme".into()));

    let (endpoint, secret) = server
        .create_endpoint("acme", &farm.url("shop"), json!({}))
        .await;
    secrets.push(secret);
    expected.push((
        "endpoint.created",
        "admin",
        None,
        "endpoint",
        endpoint.clone(),
    ));

    let (status, key) = server
        .post(
            "/v1/keys",
            json!({"name": "support", "scopes": ["endpoints:write"], "accounts": ["acme"]}),
        )
        .await;
    assert_eq!(status, 201, "{key}");
    let key_id = text(&key["id"], "key id");
    let key_secret = text(&key["secret"], "key secret");
    secrets.push(key_secret.clone());
    expected.push(("key.created", "admin", None, "key", key_id.clone()));

    let endpoint_path = format!("/v1/accounts/acme/endpoints/{endpoint}");
    let (status, body) = server
        .request_as(
            &key_secret,
            Method::PATCH,
            &endpoint_path,
            Some(json!({"description": "the shop"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    expected.push((
        "endpoint.updated",
        "key",
        Some(key_id.clone()),
        "endpoint",
        endpoint.clone(),
    ));

    let (status, token) = server
        .post("/v1/accounts/acme/tokens", json!({"ttl_seconds": 600}))
        .await;
    assert_eq!(status, 201, "{token}");
    let token_id = text(&token["token_id"], "token id");
    let credential = text(&token["token"], "token");
    secrets.push(credential.clone());
    expected.push(("token.created", "admin", None, "token", token_id.clone()));

    let rotate = format!("{endpoint_path}/secret/rotate");
    let (status, rotated) = server
        .request_as(
            &credential,
            Method::POST,
            &rotate,
            Some(json!({"grace_period_seconds": 60})),
        )
        .await;
    assert_eq!(status, 200, "{rotated}");
    secrets.push(text(&rotated["secret"], "new secret"));
    expected.push((
        "endpoint.secret_rotated",
        "token",
        Some(token_id.clone()),
        "endpoint",
        endpoint.clone(),
    ));

    let revoke = format!("/v1/accounts/acme/tokens/{token_id}");
    let (status, body) = server.request(Method::DELETE, &revoke, None).await;
    assert_eq!(status, 204, "{body}");
    expected.push(("token.revoked", "admin", None, "token", token_id));

    let event = server
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    let delivery = text(&event["deliveries"][0]["id"], "delivery id");
    let delivered = server
        .eventually(Duration::from_secs(30), || async {
            let (_, d) = server
                .get(&format!("/v1/accounts/acme/deliveries/{delivery}"))
                .await;
            d["status"] == "delivered"
        })
        .await;
    assert!(delivered, "the delivery was never delivered");
    let (status, replay) = server
        .post(
            &format!("/v1/accounts/acme/deliveries/{delivery}/replay"),
            json!({}),
        )
        .await;
    assert_eq!(status, 202, "{replay}");
    expected.push((
        "replay.created",
        "admin",
        None,
        "replay",
        text(&replay["id"], "replay id"),
    ));

    let (status, body) = server.request(Method::DELETE, &endpoint_path, None).await;
    assert_eq!(status, 204, "{body}");
    expected.push(("endpoint.deleted", "admin", None, "endpoint", endpoint));
    (expected, secrets, delivery)
}

async fn the_log_records_the_script(server: &Server) {
    let farm = Farm::start().await.expect("farm");
    farm.configure("shop", Behavior::ok());
    let (expected, secrets, delivery) = script(server, &farm).await;
    let admin = crate::support::ADMIN_TOKEN;

    // Read three at a time: the pages join up without gaps or repeats.
    let log = read_log(server, admin, "acme", 3).await;
    let whole = read_log(server, admin, "acme", 500).await;
    assert_eq!(log, whole, "paged and whole reads differ");
    let got: Vec<_> = log
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap_or_default(),
                e["actor"]["type"].as_str().unwrap_or_default(),
                e["actor"]["id"].as_str().map(str::to_owned),
                e["target"]["type"].as_str().unwrap_or_default(),
                e["target"]["id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let newest_first: Expected = expected.into_iter().rev().collect();
    assert_eq!(got, newest_first, "the log, newest first: {log:#?}");
    let mut previous = None;
    for entry in &log {
        assert_eq!(entry["account_id"], "acme", "{entry}");
        assert_eq!(entry["address"], "127.0.0.1", "{entry}");
        assert!(text(&entry["id"], "id").starts_with("aud_"), "{entry}");
        // Compared as times: RFC 3339 drops a whole second's fraction, so as text
        // `…:43Z` sorts after `…:43.110Z`.
        let at = chrono::DateTime::parse_from_rfc3339(&text(&entry["at"], "at"))
            .unwrap_or_else(|e| panic!("at: {e}: {entry}"));
        let position = (at, text(&entry["id"], "id"));
        if let Some(previous) = &previous {
            assert!(
                position < *previous,
                "not newest first: {position:?} after {previous:?}"
            );
        }
        previous = Some(position);
    }
    let replay = log
        .iter()
        .find(|e| e["action"] == "replay.created")
        .expect("replay");
    assert_eq!(
        replay["details"]["scope"]["delivery"],
        delivery.as_str(),
        "{replay}"
    );
    let rotated = log
        .iter()
        .find(|e| e["action"] == "endpoint.secret_rotated")
        .expect("rotation");
    assert_eq!(rotated["details"]["grace_period_seconds"], 60, "{rotated}");
    // No secret, old or new, no key or token, anywhere in the log.
    let dump = Value::Array(log.clone()).to_string();
    for secret in &secrets {
        assert!(
            !dump.contains(secret.as_str()),
            "a secret is in the log: {dump}"
        );
    }
    assert!(!dump.contains("whsec_"), "{dump}");

    // A key limited to acme is in acme's log, not the operator's.
    let (status, operator) = server.get("/v1/audit").await;
    assert_eq!(status, 200, "{operator}");
    assert!(!operator.to_string().contains("key.created"), "{operator}");

    // The account's own token reads its log.
    let (status, token) = server
        .post("/v1/accounts/acme/tokens", json!({"ttl_seconds": 600}))
        .await;
    assert_eq!(status, 201, "{token}");
    let seen = read_log(server, &text(&token["token"], "token"), "acme", 50).await;
    assert_eq!(
        seen.len(),
        log.len() + 1,
        "the new token's creation is the newest entry"
    );
    assert_eq!(seen[0]["action"], "token.created");

    // Bad paging parameters: a 400 naming the parameter.
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=many", "limit"),
        ("cursor=not-a-cursor", "cursor"),
        ("after=x", "after"),
    ] {
        let (status, body) = server
            .get(&format!("/v1/accounts/acme/audit?{query}"))
            .await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_shape_audits_each_change() {
    let scratch = Scratch::new("audit");
    let server = Server::start(&scratch, &[]).await;
    the_log_records_the_script(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_shape_audits_each_change() {
    let scratch = Scratch::new("aws-audit");
    let prefix = crate::aws_pipeline::unique("audit");
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &[]).await;
    the_log_records_the_script(&server).await;
    crate::iam::assert_allowed(&server);
}

/// A change by `credential` with a distinctive user agent and `X-Forwarded-For`: whatever
/// the server makes of them, a customer must not read them back.
async fn patch_from_the_office(server: &Server, credential: &str, path: &str, body: Value) {
    let response = reqwest::Client::new()
        .patch(format!("{}{path}", server.base))
        .bearer_auth(credential)
        .header("user-agent", OPERATOR_AGENT)
        .header("x-forwarded-for", OPERATOR_IP)
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{path}: {text}");
}

const OPERATOR_AGENT: &str = "ops-console/7.1 (platform-internal)";
const OPERATOR_IP: &str = "198.51.100.77";

/// The platform's changes to an account (by the admin token and by its API keys) are shown to
/// the account's own tokens as `platform`, with no address and no key id or name; the
/// account's own changes, and every entry read by the admin token or a key, as recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_token_sees_the_platforms_changes_as_platform() {
    use reqwest::Method;
    let scratch = Scratch::new("audit-platform");
    let server = Server::start(&scratch, &[]).await;
    let farm = Farm::start().await.expect("farm");
    farm.configure("shop", Behavior::ok());
    let admin = crate::support::ADMIN_TOKEN;

    server.create_account("acme").await;
    let (endpoint, _) = server
        .create_endpoint("acme", &farm.url("shop"), json!({}))
        .await;
    let endpoint_path = format!("/v1/accounts/acme/endpoints/{endpoint}");
    // A key that may mint tokens holds every scope an account token does.
    let key_name = "billing-backend-eu-7f3a";
    let (status, key) = server
        .post(
            "/v1/keys",
            json!({"name": key_name, "accounts": ["acme"], "scopes": [
                "accounts:read", "endpoints:read", "endpoints:write", "deliveries:read",
                "deliveries:replay", "tokens:write"]}),
        )
        .await;
    assert_eq!(status, 201, "{key}");
    let key_id = text(&key["id"], "key id");
    let key_secret = text(&key["secret"], "key secret");

    patch_from_the_office(
        &server,
        &key_secret,
        &endpoint_path,
        json!({"description": "set by the platform"}),
    )
    .await;
    let (status, minted) = server
        .request_as(
            &key_secret,
            Method::POST,
            "/v1/accounts/acme/tokens",
            Some(json!({"ttl_seconds": 600})),
        )
        .await;
    assert_eq!(status, 201, "{minted}");
    let (status, portal) = server
        .post("/v1/accounts/acme/portal", json!({"ttl_seconds": 600}))
        .await;
    assert_eq!(status, 201, "{portal}");
    let portal_token = text(&portal["url"], "portal url")
        .split_once("#token=")
        .map(|(_, token)| token.to_owned())
        .expect("a token in the portal link");
    let portal_token_id = text(&portal["token_id"], "portal token id");
    let account_token = text(&minted["token"], "account token");

    let platform_actions = [
        "portal_link.created",
        "token.created",
        "endpoint.updated",
        "key.created",
        "endpoint.created",
        "account.created",
    ];
    for customer in [&portal_token, &account_token] {
        let log = read_log(&server, customer, "acme", 50).await;
        let actions: Vec<_> = log.iter().map(|e| e["action"].clone()).collect();
        assert_eq!(actions, platform_actions, "{log:#?}");
        // The endpoint's URL is on the farm at 127.0.0.1: the customer's own, not an address.
        let dump = Value::Array(log.clone())
            .to_string()
            .replace(&farm.url("shop"), "");
        for hidden in [
            key_id.as_str(),
            key_name,
            "127.0.0.1",
            OPERATOR_AGENT,
            OPERATOR_IP,
            "\"admin\"",
        ] {
            assert!(
                !dump.contains(hidden),
                "an account token reads {hidden:?} in its log: {dump}"
            );
        }
        for entry in &log {
            assert_eq!(
                entry["actor"],
                json!({"type": "platform", "id": null}),
                "{entry}"
            );
            assert_eq!(entry["address"], Value::Null, "{entry}");
        }
        // What was done to what stays: the customer sees a key was made for its account.
        let created = &log[3];
        assert_eq!(created["target"]["type"], "key", "{created}");
        let scopes = created["details"]["scopes"].as_array();
        assert_eq!(scopes.map(Vec::len), Some(6), "{created}");
        assert_eq!(log[2]["target"]["id"], endpoint.as_str(), "{}", log[2]);
    }

    // The admin token and the key read the entries as recorded.
    for operator in [admin, key_secret.as_str()] {
        let log = read_log(&server, operator, "acme", 50).await;
        let dump = Value::Array(log.clone()).to_string();
        assert!(dump.contains(&key_id) && dump.contains(key_name), "{dump}");
        let updated = &log[2];
        assert_eq!(updated["action"], "endpoint.updated", "{updated}");
        assert_eq!(
            updated["actor"],
            json!({"type": "key", "id": key_id}),
            "{updated}"
        );
        assert_eq!(updated["address"], "127.0.0.1", "{updated}");
        assert_eq!(log[3]["target"]["id"], key_id.as_str(), "{}", log[3]);
        assert_eq!(log[3]["details"]["name"], key_name, "{}", log[3]);
        assert_eq!(log[0]["actor"]["type"], "admin", "{}", log[0]);
    }

    // The customer's own changes are shown to it as they are, address and all.
    patch_from_the_office(
        &server,
        &portal_token,
        &endpoint_path,
        json!({"description": "set by the customer"}),
    )
    .await;
    let log = read_log(&server, &account_token, "acme", 50).await;
    assert_eq!(log[0]["action"], "endpoint.updated", "{}", log[0]);
    assert_eq!(
        log[0]["actor"],
        json!({"type": "token", "id": portal_token_id}),
        "{}",
        log[0]
    );
    assert_eq!(log[0]["address"], "127.0.0.1", "{}", log[0]);
    assert_eq!(log[1]["actor"]["type"], "platform", "{}", log[1]);
}
