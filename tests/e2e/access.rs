//! Access control: account tokens reach only their own account; nothing but health, the
//! OpenAPI document and the static page answers without a token.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{Scratch, Server, ADMIN_TOKEN};

/// Every (method, path template) of the OpenAPI document the server serves.
async fn documented_operations(server: &Server) -> Vec<(String, String)> {
    let document: Value = reqwest::get(format!("{}/openapi.json", server.base))
        .await
        .expect("openapi.json")
        .json()
        .await
        .expect("openapi json");
    let mut operations = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_some() {
                operations.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    operations
}

fn fill(template: &str, ids: &[(&str, &str)]) -> String {
    ids.iter().fold(template.to_owned(), |path, (name, value)| {
        path.replace(&format!("{{{name}}}"), value)
    })
}

async fn call(server: &Server, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = reqwest::Client::new()
        .request(method, format!("{}{path}", server.base))
        .header("content-type", "application/json")
        // A body that every route accepts the shape of, so no route can fail on it first.
        .body("{}");
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn mint(server: &Server, account: &str, ttl_seconds: u64) -> Value {
    let (status, token) = server
        .post(
            &format!("/v1/accounts/{account}/tokens"),
            json!({"ttl_seconds": ttl_seconds}),
        )
        .await;
    assert_eq!(status, 201, "{token}");
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_tokens_reach_only_their_own_account() {
    let scratch = Scratch::new("access");
    let server = Server::start(&scratch, &[]).await;
    for account in ["alpha", "beta", "gamma"] {
        server.create_account(account).await;
    }
    // Beta owns real objects, so a 404 cannot come from them being absent.
    let (beta_endpoint, _) = server
        .create_endpoint("beta", "http://127.0.0.1:9/hook", json!({}))
        .await;
    let event = server
        .publish("beta", "invoice.paid", json!({"n": 1}))
        .await;
    let beta_event = event["id"].as_str().expect("event id").to_owned();
    let beta_delivery = event["deliveries"][0]["id"]
        .as_str()
        .expect("delivery")
        .to_owned();
    // Gamma's objects take the admin's probes (which may change them).
    let (gamma_endpoint, _) = server
        .create_endpoint("gamma", "http://127.0.0.1:9/hook", json!({}))
        .await;
    let gamma_event = server
        .publish("gamma", "invoice.paid", json!({"n": 1}))
        .await;
    let gamma_ids = [
        ("account", "gamma".to_owned()),
        ("endpoint", gamma_endpoint),
        ("event", gamma_event["id"].as_str().expect("id").to_owned()),
        (
            "delivery",
            gamma_event["deliveries"][0]["id"]
                .as_str()
                .expect("id")
                .to_owned(),
        ),
    ];
    let gamma_ids: Vec<(&str, &str)> = gamma_ids.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let alpha_token = mint(&server, "alpha", 600).await;
    let alpha = alpha_token["token"].as_str().expect("token").to_owned();
    assert!(alpha.starts_with("hl_acct_"), "{alpha_token}");
    assert_eq!(alpha_token["account_id"], "alpha");

    let operations = documented_operations(&server).await;
    println!("access: {} documented operations", operations.len());
    assert!(operations.len() >= 22, "{operations:?}");
    let beta_ids = [
        ("account", "beta"),
        ("endpoint", beta_endpoint.as_str()),
        ("event", beta_event.as_str()),
        ("delivery", beta_delivery.as_str()),
    ];
    let mut scoped = 0;
    for (method, template) in &operations {
        // The route exists: the admin reaches a handler, not the router's fallback.
        let probe = fill(template, &gamma_ids);
        let (status, body) = call(&server, method, &probe, Some(ADMIN_TOKEN)).await;
        assert!(
            status != 405 && body["error"]["message"] != "route not found",
            "{method} {probe} is documented but not routed: {status} {body}"
        );
        let path = fill(template, &beta_ids);
        let (status, body) = call(&server, method, &path, Some(&alpha)).await;
        if template.contains("{account}") {
            scoped += 1;
            assert!(
                status == 404 || status == 403,
                "alpha's token on {method} {path}: {status} {body}"
            );
            assert!(body["error"]["code"].is_string(), "{method} {path}: {body}");
        }
        let (status, body) = call(&server, method, &path, None).await;
        let public = template == "/health" || template == "/openapi.json";
        if public {
            assert_eq!(status, 200, "{method} {path} without a token: {body}");
        } else {
            assert_eq!(status, 401, "{method} {path} without a token: {body}");
        }
    }
    assert!(scoped >= 19, "only {scoped} account routes were checked");

    // Beta is still intact: alpha's calls changed nothing.
    let (status, endpoint) = server
        .get(&format!("/v1/accounts/beta/endpoints/{beta_endpoint}"))
        .await;
    assert_eq!(status, 200, "{endpoint}");
    assert_eq!(endpoint["status"], "active");

    // Alpha's token works on alpha, but not on admin-only routes.
    let (status, body) = call(&server, "GET", "/v1/accounts/alpha", Some(&alpha)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&server, "GET", "/v1/whoami", Some(&alpha)).await;
    assert_eq!((status, body["kind"].as_str()), (200, Some("account")));
    assert_eq!(body["account_id"], "alpha");
    let (status, _) = call(&server, "POST", "/v1/accounts", Some(&alpha)).await;
    assert_eq!(status, 403);
    let (status, _) = call(&server, "POST", "/v1/accounts/alpha/tokens", Some(&alpha)).await;
    assert_eq!(status, 403, "an account token must not mint tokens");

    // The page itself is public; it holds no data.
    let page = reqwest::get(format!("{}/ui", server.base))
        .await
        .expect("ui");
    assert_eq!(page.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_tampered_tokens_get_401() {
    let scratch = Scratch::new("tokens");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("alpha").await;
    server.create_account("beta").await;
    let token = mint(&server, "alpha", 600).await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let (status, _) = call(&server, "GET", "/v1/accounts/alpha", Some(&token)).await;
    assert_eq!(status, 200);

    // One character of the signature changed.
    let mut tampered = token.clone().into_bytes();
    let last = tampered.len() - 2;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).expect("ascii");
    // Beta's claims under alpha's signature.
    let (_, signature) = token.split_once('.').expect("two parts");
    let claims = base64_url(
        format!(
            r#"{{"a":"beta","j":"tok_x","e":{}}}"#,
            chrono::Utc::now().timestamp() + 600
        )
        .as_bytes(),
    );
    let forged = format!("hl_acct_{claims}.{signature}");
    for (name, bad) in [
        ("tampered", tampered.as_str()),
        ("forged", forged.as_str()),
        ("junk", "hl_acct_nonsense"),
        ("wrong admin", "test-admin-token-0123456789abcdeX"),
    ] {
        for path in ["/v1/accounts/alpha", "/v1/accounts/beta", "/v1/whoami"] {
            let (status, body) = call(&server, "GET", path, Some(bad)).await;
            assert_eq!(status, 401, "{name} token on {path}: {body}");
            assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        }
    }

    let short = mint(&server, "alpha", 1).await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (status, body) = call(&server, "GET", "/v1/accounts/alpha", Some(&short)).await;
    assert_eq!(status, 401, "expired token: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("expired"),
        "{body}"
    );

    // Tokens survive a restart: the signing key is kept in the database.
    let mut server = server;
    server.kill9().await;
    server.restart().await;
    let (status, body) = call(&server, "GET", "/v1/accounts/alpha", Some(&token)).await;
    assert_eq!(status, 200, "token after restart: {body}");

    let (status, body) = server
        .post("/v1/accounts/alpha/tokens", json!({"ttl_seconds": 0}))
        .await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (422, Some("ttl_seconds"))
    );
    let (status, _) = server
        .post("/v1/accounts/nobody/tokens", json!({"ttl_seconds": 60}))
        .await;
    assert_eq!(status, 404);
}

fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}
