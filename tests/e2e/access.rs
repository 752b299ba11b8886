//! Access control: every route against every kind of credential (none, the admin token,
//! scoped API keys with the right scope, the wrong one, limited to another account,
//! expired, revoked, tampered; account tokens of the account, of another one, expired,
//! revoked, tampered; a read-only portal link's token), in both shapes; nothing but health, the OpenAPI document and the
//! static page answers without a credential. Revocation's latency, admin-token rotation.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{Scratch, Server, ADMIN_TOKEN};

fn fill(template: &str, ids: &[(&str, &str)]) -> String {
    ids.iter().fold(template.to_owned(), |path, (name, value)| {
        path.replace(&format!("{{{name}}}"), value)
    })
}

async fn call(server: &Server, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let verb = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = reqwest::Client::new()
        .request(verb, format!("{}{path}", server.base))
        .header("content-type", "application/json")
        // A body that every route accepts the shape of, so no route can fail on it first.
        .body("{}");
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    if path.starts_with("/v1/") {
        assert_eq!(
            cache_control(&response),
            Some("no-store"),
            "{method} {path} answered {status}"
        );
    }
    (status, response.json().await.unwrap_or(Value::Null))
}

fn cache_control(response: &reqwest::Response) -> Option<&str> {
    response
        .headers()
        .get(reqwest::header::CACHE_CONTROL)
        .and_then(|v| v.to_str().ok())
}

/// Every time in an answer is RFC 3339 in UTC with three fractional digits
/// (`2026-01-31T12:00:00.000Z`), so that times compare as their text does.
fn times_are_written_one_way(body: &Value, what: &str) {
    match body {
        Value::String(text) if chrono::DateTime::parse_from_rfc3339(text).is_ok() => {
            let bytes = text.as_bytes();
            assert!(
                bytes.len() == 24
                    && bytes[19] == b'.'
                    && bytes[20..23].iter().all(u8::is_ascii_digit)
                    && bytes[23] == b'Z',
                "`{text}` is not written as 2026-01-31T12:00:00.000Z: {what}"
            );
        }
        Value::Array(items) => items
            .iter()
            .for_each(|item| times_are_written_one_way(item, what)),
        Value::Object(fields) => fields
            .values()
            .for_each(|field| times_are_written_one_way(field, what)),
        _ => {}
    }
}

async fn mint(server: &Server, account: &str, ttl_seconds: u64) -> Value {
    let (status, token) = server
        .post(
            &format!("/v1/accounts/{account}/tokens"),
            json!({"ttl_seconds": ttl_seconds}),
        )
        .await;
    assert_eq!(status, 201, "{token}");
    times_are_written_one_way(&token, "a minted token");
    token
}

/// Every operation of the OpenAPI document the server serves: method, path template and
/// the scope it declares (`None`: any credential; `Some("")`: public, no credential).
async fn documented_scopes(server: &Server) -> Vec<(String, String, Option<String>)> {
    let document: Value = reqwest::get(format!("{}/openapi.json", server.base))
        .await
        .expect("openapi.json")
        .json()
        .await
        .expect("openapi json");
    let mut operations = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            let security = &operation["security"][0];
            let scope = match security["bearer"].as_array() {
                None => {
                    assert_eq!(security, &json!({}), "{method} {path}: {security}");
                    Some(String::new())
                }
                Some(scopes) if scopes.is_empty() => None,
                Some(scopes) => Some(scopes[0].as_str().expect("a scope name").to_owned()),
            };
            operations.push((method.to_uppercase(), path.clone(), scope));
        }
    }
    operations
}

/// What an account token may do on its own account (docs/ACCESS.md).
const ACCOUNT_TOKEN_SCOPES: [&str; 5] = [
    "accounts:read",
    "endpoints:read",
    "endpoints:write",
    "deliveries:read",
    "deliveries:replay",
];
/// What a read-only portal link's token holds (docs/ACCESS.md).
const READ_ONLY_SCOPES: [&str; 3] = ["accounts:read", "endpoints:read", "deliveries:read"];

const SCOPES: [&str; 10] = [
    "accounts:read",
    "accounts:write",
    "tokens:write",
    "endpoints:read",
    "endpoints:write",
    "events:publish",
    "events:erase",
    "deliveries:read",
    "deliveries:replay",
    "admin",
];

/// Makes a key with the admin token; returns its credential and id.
async fn key(
    server: &Server,
    scopes: &[&str],
    accounts: Option<&[&str]>,
    expires: Option<String>,
) -> (String, String) {
    let mut body = json!({"name": format!("matrix {}", scopes.join(" ")), "scopes": scopes});
    if let Some(accounts) = accounts {
        body["accounts"] = json!(accounts);
    }
    if let Some(at) = expires {
        body["expires_at"] = json!(at);
    }
    let (status, made) = server.post("/v1/keys", body).await;
    assert_eq!(status, 201, "{made}");
    let credential = made["secret"]
        .as_str()
        .expect("the key's secret")
        .to_owned();
    assert!(credential.starts_with("hl_key_"), "{made}");
    (credential, made["id"].as_str().expect("id").to_owned())
}

/// One character of a credential's secret part changed.
fn tampered(credential: &str) -> String {
    let mut bytes = credential.as_bytes().to_vec();
    let last = bytes.len() - 2;
    bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).expect("ascii")
}

/// The kinds of credential the matrix tries on every route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NoCredential,
    AdminToken,
    AdminKey,
    /// An unlimited key with exactly the route's scope (or, for a route that needs none,
    /// an unrelated one).
    RightScope,
    /// An unlimited key with every scope but the route's (and `admin`).
    WrongScope,
    /// A key with every scope but `admin`, limited to another account.
    OtherAccountKey,
    Token,
    OtherAccountToken,
    /// A read-only portal link's token for the route's account.
    ReadOnlyToken,
    ExpiredKey,
    RevokedKey,
    TamperedKey,
    ExpiredToken,
    RevokedToken,
    TamperedToken,
}

/// What the documented rules (docs/ACCESS.md) say `kind` gets from a route needing `scope`
/// (`None`: any credential) that is (or is not) under an account: `Ok` reaches the handler.
fn expected(kind: Kind, scope: Option<&str>, under_account: bool) -> Result<(), u16> {
    use Kind::*;
    let token_may = |scope: Option<&str>| match scope {
        None => true,
        Some(scope) => under_account && ACCOUNT_TOKEN_SCOPES.contains(&scope),
    };
    match kind {
        NoCredential | ExpiredKey | RevokedKey | TamperedKey | ExpiredToken | RevokedToken
        | TamperedToken => Err(401),
        AdminToken | AdminKey | RightScope => Ok(()),
        WrongScope => scope.map_or(Ok(()), |_| Err(403)),
        OtherAccountKey | OtherAccountToken if under_account => Err(404),
        OtherAccountKey => scope.map_or(Ok(()), |_| Err(403)),
        ReadOnlyToken => match scope {
            None => Ok(()),
            Some(scope) if under_account && READ_ONLY_SCOPES.contains(&scope) => Ok(()),
            Some(_) => Err(403),
        },
        OtherAccountToken | Token => {
            if token_may(scope) {
                Ok(())
            } else {
                Err(403)
            }
        }
    }
}

/// Every documented route with every kind of credential: a denied request gets exactly the
/// documented status and an error body, never data; an allowed one reaches its handler.
/// Returns (routes, kinds) checked.
/// Accounts alpha and gamma, gamma with an endpoint (to a closed port), an event and its
/// delivery: their ids.
async fn alpha_and_gammas_delivery(server: &Server) -> (String, String, String) {
    for account in ["alpha", "gamma"] {
        server.create_account(account).await;
    }
    let (endpoint, _) = server
        .create_endpoint("gamma", "http://127.0.0.1:9/hook", json!({}))
        .await;
    let event = server
        .publish("gamma", "invoice.paid", json!({"n": 1}))
        .await;
    let event_id = event["id"].as_str().expect("event id").to_owned();
    let delivery = event["deliveries"][0]["id"]
        .as_str()
        .expect("delivery")
        .to_owned();
    (endpoint, event_id, delivery)
}

async fn access_matrix(server: &Server) -> (usize, usize) {
    use Kind::*;
    // Gamma owns real objects, so a 404 cannot come from them being absent.
    let (endpoint, event_id, delivery) = alpha_and_gammas_delivery(server).await;
    let (_, victim) = key(server, &["deliveries:read"], None, None).await;
    let revoked = mint(server, "gamma", 600).await;
    let revoked_token = revoked["token"].as_str().expect("token").to_owned();
    let revoked_token_id = revoked["token_id"].as_str().expect("token id").to_owned();
    let ids = [
        ("account", "gamma"),
        ("endpoint", endpoint.as_str()),
        ("event", event_id.as_str()),
        ("delivery", delivery.as_str()),
        ("key", victim.as_str()),
        ("token_id", revoked_token_id.as_str()),
    ];

    let soon = (chrono::Utc::now() + chrono::Duration::seconds(2)).to_rfc3339();
    let (admin_key, _) = key(server, &["admin"], None, None).await;
    let (other_key, _) = key(server, &SCOPES[..9], Some(&["alpha"]), None).await;
    let (expired_key, _) = key(server, &["admin"], None, Some(soon)).await;
    let (revoked_key, revoked_id) = key(server, &["admin"], None, None).await;
    let (status, body) = server
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/keys/{revoked_id}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["revoked_at"].is_string(), "{body}");
    times_are_written_one_way(&body, "a revoked key");
    let token = mint(server, "gamma", 600).await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let other_token = mint(server, "alpha", 600).await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let expired_token = mint(server, "gamma", 1).await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let (status, link) = server
        .post(
            "/v1/accounts/gamma/portal",
            json!({"ttl_seconds": 600, "read_only": true}),
        )
        .await;
    assert_eq!(status, 201, "{link}");
    let read_only_token = link["url"]
        .as_str()
        .and_then(|url| url.split_once("#token="))
        .map(|(_, token)| token.to_owned())
        .expect("a portal link carries its token in the fragment");
    // One key per scope, and one with every scope but it.
    let mut right = std::collections::HashMap::new();
    let mut wrong = std::collections::HashMap::new();
    for scope in SCOPES {
        // Minting a token needs the scopes the token carries too (a credential hands on no
        // more than it holds); the key with only `tokens:write` is refused below.
        let mut holds = vec![scope];
        if scope == "tokens:write" {
            holds.extend(ACCOUNT_TOKEN_SCOPES);
        }
        right.insert(scope, key(server, &holds, None, None).await.0);
        let others: Vec<&str> = SCOPES
            .iter()
            .copied()
            .filter(|s| *s != scope && *s != "admin")
            .collect();
        wrong.insert(scope, key(server, &others, None, None).await.0);
    }
    let path = format!("/v1/accounts/gamma/tokens/{revoked_token_id}");
    let (status, body) = server.request(reqwest::Method::DELETE, &path, None).await;
    assert_eq!(status, 204, "{body}");
    let tampered_key = tampered(&right["deliveries:read"]);
    let tampered_token = tampered(&token);
    tokio::time::sleep(Duration::from_millis(2100)).await;

    let operations = documented_scopes(server).await;
    let routes: Vec<_> = operations
        .iter()
        .filter(|(_, _, s)| s.as_deref() != Some(""))
        .collect();
    println!(
        "access: {} documented operations, {} behind a credential",
        operations.len(),
        routes.len()
    );
    assert!(routes.len() >= 28, "{operations:?}");
    for audit in ["/v1/accounts/{account}/audit", "/v1/audit"] {
        assert!(
            routes.iter().any(|(m, p, _)| m == "GET" && p == audit),
            "the matrix covers GET {audit}"
        );
    }
    // Denials first, so that the objects are all there for them; allowed calls may change
    // or delete them (a later allowed call then meets the handler's own 404).
    let denied_first = [
        NoCredential,
        ExpiredKey,
        RevokedKey,
        TamperedKey,
        ExpiredToken,
        RevokedToken,
        TamperedToken,
        WrongScope,
        OtherAccountKey,
        OtherAccountToken,
        ReadOnlyToken,
        Token,
        AdminToken,
        AdminKey,
        RightScope,
    ];
    let mut checked = 0;
    for kind in denied_first {
        for (method, template, scope) in &routes {
            let scope = scope.as_deref();
            let path = fill(template, &ids);
            let credential: Option<String> = match kind {
                NoCredential => None,
                AdminToken => Some(ADMIN_TOKEN.to_owned()),
                AdminKey => Some(admin_key.clone()),
                RightScope => Some(right[scope.unwrap_or("accounts:read")].clone()),
                WrongScope => Some(wrong[scope.unwrap_or("admin")].clone()),
                OtherAccountKey => Some(other_key.clone()),
                Token => Some(token.clone()),
                OtherAccountToken => Some(other_token.clone()),
                ReadOnlyToken => Some(read_only_token.clone()),
                ExpiredKey => Some(expired_key.clone()),
                RevokedKey => Some(revoked_key.clone()),
                TamperedKey => Some(tampered_key.clone()),
                ExpiredToken => Some(expired_token.clone()),
                RevokedToken => Some(revoked_token.clone()),
                TamperedToken => Some(tampered_token.clone()),
            };
            let (status, body) = call(server, method, &path, credential.as_deref()).await;
            let want = expected(kind, scope, template.contains("{account}"));
            let what = format!("{kind:?} on {method} {path} (needs {scope:?}): {status} {body}");
            match want {
                Err(code) => {
                    assert_eq!(status, code, "{what}");
                    let keys: Vec<&String> = body
                        .as_object()
                        .map(|o| o.keys().collect())
                        .unwrap_or_default();
                    assert_eq!(keys, ["error"], "an error and nothing else: {what}");
                }
                Ok(()) => {
                    assert!(
                        status != 401
                            && status != 403
                            && body["error"]["message"] != "account not found",
                        "{what}"
                    );
                    if (200..300).contains(&status) {
                        times_are_written_one_way(&body, &what);
                    }
                }
            }
            checked += 1;
        }
        if kind == ReadOnlyToken {
            // The kinds so far are all refused everywhere but `whoami` and reads: nothing
            // changed.
            let (status, body) = server
                .get(&format!("/v1/accounts/gamma/endpoints/{endpoint}"))
                .await;
            assert_eq!(
                status, 200,
                "the denied calls left gamma's endpoint: {body}"
            );
        }
    }
    for (_, template, _) in operations
        .iter()
        .filter(|(_, _, s)| s.as_deref() == Some(""))
    {
        let (status, body) = call(server, "GET", template, None).await;
        assert_eq!(status, 200, "{template} is public: {body}");
    }
    assert_eq!(checked, routes.len() * denied_first.len());
    println!(
        "access: matrix of {} routes x {} credential kinds = {checked} requests, each as documented",
        routes.len(),
        denied_first.len()
    );
    (routes.len(), denied_first.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_every_kind_of_credential_as_documented() {
    let scratch = Scratch::new("access");
    let server = Server::start(&scratch, &[]).await;
    access_matrix(&server).await;
    // The page itself is public; it holds no data.
    let page = reqwest::get(format!("{}/ui", server.base))
        .await
        .expect("ui");
    assert_eq!(page.status().as_u16(), 200);
}

/// A key that may mint tokens but holds fewer scopes than an account token carries cannot
/// mint one: it would hand on more than it holds (a `tokens:write` key minting a token that
/// changes endpoints and replays deliveries). One that holds them all, or the admin token, can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_mints_no_token_broader_than_itself() {
    let scratch = Scratch::new("mint-scopes");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let path = "/v1/accounts/acme/tokens";
    let (narrow, _) = key(&server, &["tokens:write"], Some(&["acme"]), None).await;
    let (status, body) = call(&server, "POST", path, Some(&narrow)).await;
    assert_eq!(status, 403, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("endpoints:write"), "{message}");
    let mut all = vec!["tokens:write"];
    all.extend(ACCOUNT_TOKEN_SCOPES);
    let (full, _) = key(&server, &all, Some(&["acme"]), None).await;
    let (status, body) = call(&server, "POST", path, Some(&full)).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(mint(&server, "acme", 60).await["account_id"], "acme");
}

/// Answers under `/v1` carry endpoints' signing secrets, keys, tokens and portal links: none
/// may be kept by a cache (a browser's, a proxy's), and neither may errors, which one header
/// on every answer covers whatever the route. The page under `/ui` has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_under_v1_may_be_cached() {
    let scratch = Scratch::new("no-store");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let (endpoint, secret) = server
        .create_endpoint("acme", "http://127.0.0.1:9/hook", json!({}))
        .await;
    let endpoint = format!("/v1/accounts/acme/endpoints/{endpoint}");
    let key = json!({"name": "cache", "scopes": ["deliveries:read"]});
    let refused_url = json!({"url": "http://10.0.0.1/hook"});
    let requests = [
        ("GET", endpoint.as_str(), Some(ADMIN_TOKEN), None, 200),
        ("POST", "/v1/keys", Some(ADMIN_TOKEN), Some(key), 201),
        (
            "POST",
            "/v1/accounts/acme/tokens",
            Some(ADMIN_TOKEN),
            Some(json!({})),
            201,
        ),
        (
            "POST",
            "/v1/accounts/acme/portal",
            Some(ADMIN_TOKEN),
            Some(json!({})),
            201,
        ),
        // A configured admin token is not rotated here: an error, as uncachable.
        ("POST", "/v1/admin-token", Some(ADMIN_TOKEN), None, 409),
        ("GET", endpoint.as_str(), None, None, 401),
        (
            "GET",
            "/v1/accounts/acme/endpoints/ep_missing",
            Some(ADMIN_TOKEN),
            None,
            404,
        ),
        ("GET", "/v1/nowhere", Some(ADMIN_TOKEN), None, 404),
        ("PUT", endpoint.as_str(), Some(ADMIN_TOKEN), None, 405),
        (
            "PATCH",
            endpoint.as_str(),
            Some(ADMIN_TOKEN),
            Some(refused_url),
            422,
        ),
        (
            "POST",
            "/v1/accounts/acme/events",
            Some(ADMIN_TOKEN),
            Some(json!([])),
            400,
        ),
    ];
    let client = reqwest::Client::new();
    for (method, path, credential, body, want) in requests {
        let mut request = client.request(
            reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
            format!("{}{path}", server.base),
        );
        if let Some(credential) = credential {
            request = request.bearer_auth(credential);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let cache = cache_control(&response).map(str::to_owned);
        let text = response.text().await.unwrap_or_default();
        assert_eq!(status, want, "{method} {path}: {text}");
        if path == endpoint && status == 200 {
            assert!(
                text.contains(&secret),
                "the read carries the secret: {text}"
            );
        }
        assert_eq!(
            cache.as_deref(),
            Some("no-store"),
            "{method} {path} answered {status} with Cache-Control {cache:?}"
        );
    }
    // The page's own header stays.
    let page = reqwest::get(format!("{}/ui", server.base))
        .await
        .expect("ui");
    assert_eq!(cache_control(&page), Some("no-cache"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_shape_answers_every_kind_of_credential_as_documented() {
    let scratch = Scratch::new("aws-access");
    let prefix = crate::aws_pipeline::unique("access");
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &[]).await;
    access_matrix(&server).await;
    crate::iam::assert_allowed(&server);
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

/// Sends a request with `credential` until it is refused with 401; how long after `since`.
async fn refused_after(server: &Server, credential: &str, path: &str, since: Instant) -> Duration {
    loop {
        let (status, body) = call(server, "GET", path, Some(credential)).await;
        if status == 401 {
            assert_eq!(
                body["error"]["message"], "credential has been revoked",
                "{body}"
            );
            return since.elapsed();
        }
        assert_eq!(status, 200, "before the revocation takes: {body}");
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "still accepted 10 s after its revocation"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Revokes a key, a token, all of an account's tokens and all of its keys, each while it is
/// in use, and measures how long after the revoking request was sent the credential is
/// refused.
async fn revocation_latency(server: &Server, shape: &str) -> Duration {
    server.create_account("acme").await;
    let probe = "/v1/accounts/acme";
    let (key_credential, key_id) = key(server, &["accounts:read"], Some(&["acme"]), None).await;
    let token = mint(server, "acme", 600).await;
    let (first, first_id) = (
        token["token"].as_str().expect("token").to_owned(),
        token["token_id"].as_str().expect("id").to_owned(),
    );
    let second = mint(server, "acme", 600).await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    // Keys for the bulk revocation: two limited to acme (one to beta as well), and one for
    // every account, which is the operator's and stays.
    server.create_account("beta").await;
    let (acme_key, acme_key_id) = key(server, &["accounts:read"], Some(&["acme"]), None).await;
    let (shared_key, shared_key_id) =
        key(server, &["accounts:read"], Some(&["acme", "beta"]), None).await;
    let (everywhere_key, _) = key(server, &["accounts:read"], None, None).await;
    for credential in [&key_credential, &first, &second, &acme_key, &shared_key] {
        // In use, so that whatever can be cached is.
        let (status, body) = call(server, "GET", probe, Some(credential)).await;
        assert_eq!(status, 200, "{body}");
    }
    let mut worst = Duration::ZERO;
    let revocations = [
        ("key", format!("/v1/keys/{key_id}"), key_credential.clone()),
        (
            "token",
            format!("/v1/accounts/acme/tokens/{first_id}"),
            first.clone(),
        ),
        (
            "token (all of its account's)",
            "/v1/accounts/acme/tokens".to_owned(),
            second.clone(),
        ),
        (
            "key (all of its account's)",
            "/v1/accounts/acme/keys".to_owned(),
            acme_key.clone(),
        ),
    ];
    let mut bulk_keys = Value::Null;
    for (what, path, credential) in revocations {
        let sent = Instant::now();
        let (status, body) = server.request(reqwest::Method::DELETE, &path, None).await;
        assert!(status == 200 || status == 204, "{path}: {status} {body}");
        if path.ends_with("/keys") {
            bulk_keys = body;
        }
        let latency = refused_after(server, &credential, probe, sent).await;
        println!("revocation ({shape}): a revoked {what} is refused {latency:?} after the revoking request was sent");
        worst = worst.max(latency);
    }
    // The bulk revocation answered the keys it revoked: acme's two live ones, not the one
    // revoked before it, not the key for every account.
    let mut listed: Vec<&str> = bulk_keys["data"]
        .as_array()
        .expect("a list of keys")
        .iter()
        .map(|k| {
            assert!(k["revoked_at"].is_string(), "{k}");
            k["id"].as_str().expect("key id")
        })
        .collect();
    listed.sort_unstable();
    let mut want = vec![acme_key_id.as_str(), shared_key_id.as_str()];
    want.sort_unstable();
    assert_eq!(listed, want, "{bulk_keys}");
    let (status, body) = call(server, "GET", "/v1/accounts/beta", Some(&shared_key)).await;
    assert_eq!(
        status, 401,
        "a key limited to acme and beta is revoked for beta too: {body}"
    );
    let (status, body) = call(server, "GET", probe, Some(&everywhere_key)).await;
    assert_eq!(status, 200, "a key for every account stays: {body}");
    let (status, body) = server
        .request(reqwest::Method::DELETE, "/v1/accounts/acme/keys", None)
        .await;
    assert_eq!(
        (status, body["data"].as_array().map(Vec::len)),
        (200, Some(0)),
        "revoking again revokes nothing: {body}"
    );
    let (status, body) = server
        .request(reqwest::Method::DELETE, "/v1/accounts/nobody/keys", None)
        .await;
    assert_eq!(status, 404, "{body}");
    // A token minted after the account's revocation works.
    let fresh = mint(server, "acme", 600).await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let (status, body) = call(server, "GET", probe, Some(&fresh)).await;
    assert_eq!(status, 200, "a token minted afterwards: {body}");
    // A token id of the wrong form, or an account that does not exist: 404.
    let (status, _) = server
        .request(
            reqwest::Method::DELETE,
            "/v1/accounts/acme/tokens/tok_nope",
            None,
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = server
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/accounts/nobody/tokens/{first_id}"),
            None,
        )
        .await;
    assert_eq!(status, 404);
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_credentials_are_refused_within_a_second() {
    let scratch = Scratch::new("revocation");
    let server = Server::start(&scratch, &[]).await;
    let worst = revocation_latency(&server, "embedded").await;
    assert!(worst < Duration::from_secs(1), "{worst:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_shape_refuses_revoked_credentials_within_its_bound() {
    let scratch = Scratch::new("aws-revocation");
    let prefix = crate::aws_pipeline::unique("revoke");
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &[]).await;
    // One api instance here, the revoking one, which forgets what it read at once. Other
    // instances keep a read for at most LAMBDA_CREDENTIAL_CACHE (5 s), which
    // service::access's tests model with a manual clock.
    let worst = revocation_latency(&server, "aws, the revoking instance").await;
    assert!(worst < Duration::from_secs(1), "{worst:?}");
    crate::iam::assert_allowed(&server);
}

async fn rotate_admin_token(server: &Server, token: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/admin-token", server.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("rotate");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Without a configured admin token, `serve` keeps it (as a digest) and replaces it on
/// request: the old one is refused at once, the new one works, also after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_rotates_without_a_restart() {
    let scratch = Scratch::new("admin-rotation");
    let mut server = Server::start(&scratch, &[("HOOKLANE_ADMIN_TOKEN", "")]).await;
    let printed = server
        .startup_output()
        .iter()
        .filter(|line| line.starts_with("admin token"))
        .find_map(|line| {
            line.rsplit_once(": ")
                .map(|(_, token)| token.trim().to_owned())
        })
        .expect("the generated admin token is printed once");
    assert!(printed.starts_with("hl_admin_"), "{printed}");
    let (status, body) = call(&server, "GET", "/v1/whoami", Some(&printed)).await;
    assert_eq!(
        (status, body["kind"].as_str()),
        (200, Some("admin")),
        "{body}"
    );
    let (status, body) = rotate_admin_token(&server, &printed).await;
    assert_eq!(status, 201, "{body}");
    let new = body["token"].as_str().expect("the new token").to_owned();
    let (status, body) = call(&server, "GET", "/v1/whoami", Some(&printed)).await;
    assert_eq!(status, 401, "the old token, at once: {body}");
    let (status, _) = call(&server, "GET", "/v1/whoami", Some(&new)).await;
    assert_eq!(status, 200);
    // The operator's audit log has the rotation, and neither token.
    let (status, log) = call(&server, "GET", "/v1/audit", Some(&new)).await;
    assert_eq!(status, 200, "{log}");
    assert_eq!(log["data"][0]["action"], "admin_token.rotated", "{log}");
    assert_eq!(log["data"][0]["address"], "127.0.0.1", "{log}");
    assert!(
        !log.to_string().contains(&printed) && !log.to_string().contains(&new),
        "{log}"
    );
    server.kill9().await;
    server.restart().await;
    assert!(
        server
            .startup_output()
            .iter()
            .all(|l| !l.starts_with("admin token")),
        "printed once only"
    );
    let (status, _) = call(&server, "GET", "/v1/whoami", Some(&new)).await;
    assert_eq!(status, 200, "the new token after a restart");
    let (status, _) = call(&server, "GET", "/v1/whoami", Some(&printed)).await;
    assert_eq!(status, 401);
    let mut file = std::fs::read(&server.database).unwrap_or_default();
    let mut wal = server.database.clone().into_os_string();
    wal.push("-wal");
    file.extend(std::fs::read(wal).unwrap_or_default());
    for token in [&printed, &new] {
        assert!(
            !file.windows(token.len()).any(|w| w == token.as_bytes()),
            "the token is kept only as a digest"
        );
    }

    // A configured token is the operator's to change.
    let configured = Scratch::new("admin-configured");
    let server = Server::start(&configured, &[]).await;
    let (status, body) = rotate_admin_token(&server, ADMIN_TOKEN).await;
    assert_eq!(status, 409, "{body}");
}

/// A token or portal link minted by a key that expires does not outlive the key: the key's
/// end is the credential's, whatever lifetime was asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_key_mints_outlives_the_key() {
    let scratch = Scratch::new("mint-expiry");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let ends = chrono::Utc::now() + chrono::Duration::minutes(10);
    let ends_text = ends.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut scopes = vec!["tokens:write"];
    scopes.extend(ACCOUNT_TOKEN_SCOPES);
    let (minter, _) = key(&server, &scopes, Some(&["acme"]), Some(ends_text.clone())).await;
    let (admin, _) = key(&server, &["admin"], None, Some(ends_text)).await;
    for (credential, path, ttl) in [
        (&minter, "/v1/accounts/acme/tokens", 7_776_000),
        (&admin, "/v1/accounts/acme/portal", 604_800),
    ] {
        let response = reqwest::Client::new()
            .post(format!("{}{path}", server.base))
            .bearer_auth(credential)
            .json(&json!({"ttl_seconds": ttl}))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status().as_u16(), 201, "{path}");
        let made: Value = response.json().await.expect("json");
        let expires: chrono::DateTime<chrono::Utc> = made["expires_at"]
            .as_str()
            .and_then(|at| at.parse().ok())
            .expect("expires_at");
        assert!(
            expires <= ends,
            "{path}: a token until {expires}, the key that minted it until {ends}"
        );
    }
}

/// The placeholders of a path template, `{account}` aside.
fn placeholders(template: &str) -> Vec<&str> {
    template
        .split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .filter(|name| *name != "account")
        .collect()
}

/// Another account's ids under the caller's own account's path: every route looks its ids up
/// within the path's account, so a credential of alpha naming gamma's endpoint, event or
/// delivery is answered 404 and changes nothing of gamma's. (The matrix above puts another
/// account in the path, which the account check refuses before any id is looked up.)
async fn foreign_ids_under_own_account(server: &Server) -> usize {
    let (endpoint, event_id, delivery) = alpha_and_gammas_delivery(server).await;
    let ids = [
        ("account", "alpha"),
        ("endpoint", endpoint.as_str()),
        ("event", event_id.as_str()),
        ("delivery", delivery.as_str()),
    ];
    let gamma = |what: &str| format!("/v1/accounts/gamma/{what}");
    let (_, endpoint_before) = server.get(&gamma(&format!("endpoints/{endpoint}"))).await;
    // Every scope but admin, limited to alpha; and alpha's own account token.
    let (alpha_key, _) = key(server, &SCOPES[..9], Some(&["alpha"]), None).await;
    let alpha_token = mint(server, "alpha", 600).await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let mut checked = 0;
    for (method, template, scope) in documented_scopes(server).await {
        let names = placeholders(&template);
        if !template.contains("{account}")
            || names.is_empty()
            || !names
                .iter()
                .all(|n| ["endpoint", "event", "delivery"].contains(n))
        {
            continue;
        }
        let path = fill(&template, &ids);
        let mut credentials = vec![alpha_key.as_str()];
        if scope
            .as_deref()
            .is_some_and(|s| ACCOUNT_TOKEN_SCOPES.contains(&s))
        {
            credentials.push(alpha_token.as_str());
        }
        // A body each route takes, so that only the lookup can refuse it.
        let sent = if template.ends_with("/endpoints/{endpoint}/replay") {
            json!({"since": "2026-01-01T00:00:00Z"})
        } else {
            json!({})
        };
        let verb = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        for credential in credentials {
            let (status, body) = server
                .request_as(credential, verb.clone(), &path, Some(sent.clone()))
                .await;
            assert_eq!(status, 404, "{method} {path}: {body}");
            assert!(
                body["error"].is_object() && !body.to_string().contains("gamma"),
                "{method} {path}: {body}"
            );
            checked += 1;
        }
    }
    // Gamma's are as they were: nothing deleted, erased, changed or replayed.
    // (Its failing clock is the sender's: its deliveries go to a closed port meanwhile.)
    let as_set = |mut endpoint: Value| {
        endpoint["failing_since"] = Value::Null;
        endpoint
    };
    let (status, after) = server.get(&gamma(&format!("endpoints/{endpoint}"))).await;
    assert_eq!((status, as_set(after)), (200, as_set(endpoint_before)));
    let (status, stored) = server.get(&gamma(&format!("events/{event_id}"))).await;
    assert_eq!(status, 200, "{stored}");
    assert!(stored["erased_at"].is_null(), "{stored}");
    let (status, attempts) = server
        .get(&gamma(&format!("deliveries/{delivery}/attempts")))
        .await;
    assert_eq!(status, 200, "{attempts}");
    let manual = attempts["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["trigger"] == "manual")
        .count();
    assert_eq!(manual, 0, "a replay reached gamma's delivery: {attempts}");
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_accounts_ids_under_ones_own_account_are_not_found() {
    let scratch = Scratch::new("foreign-ids");
    let server = Server::start(&scratch, &[]).await;
    let checked = foreign_ids_under_own_account(&server).await;
    assert!(checked >= 12, "only {checked} requests checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_shape_finds_no_other_accounts_ids_under_ones_own_account() {
    let scratch = Scratch::new("aws-foreign-ids");
    let prefix = crate::aws_pipeline::unique("foreign");
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &[]).await;
    let checked = foreign_ids_under_own_account(&server).await;
    assert!(checked >= 12, "only {checked} requests checked");
    crate::iam::assert_allowed(&server);
}
