//! Portal links (`POST /v1/accounts/{account}/portal`), in both shapes: a link to the
//! account's page with an expiring token in its fragment, read-only on request, reaching
//! only its account, never publishing or erasing events, revoked by its token id, refused
//! with the field named on bad input.

use serde_json::{json, Value};

use crate::support::{Scratch, Server};

/// Makes a link; returns it and the token in its fragment.
async fn link(server: &Server, account: &str, body: Value) -> (Value, String) {
    let (status, made) = server
        .post(&format!("/v1/accounts/{account}/portal"), body)
        .await;
    assert_eq!(status, 201, "{made}");
    let token = made["url"]
        .as_str()
        .and_then(|url| url.split_once("#token="))
        .map(|(_, token)| token.to_owned())
        .unwrap_or_else(|| panic!("no token in the link's fragment: {made}"));
    (made, token)
}

/// The scopes `/v1/whoami` names for `token`, sorted.
async fn scopes_of(server: &Server, token: &str) -> Vec<String> {
    let (_, who) = server
        .request_as(token, reqwest::Method::GET, "/v1/whoami", None)
        .await;
    let mut scopes: Vec<String> = who["scopes"]
        .as_array()
        .expect("scopes")
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    scopes.sort_unstable();
    scopes
}

async fn portal_links_reach_one_account_and_are_revocable(server: &Server, page_base: &str) {
    server.create_account("acme").await;
    server.create_account("globex").await;
    server
        .create_endpoint("globex", "http://127.0.0.1:9/hook", json!({}))
        .await;

    let before = chrono::Utc::now();
    let (made, token) = link(server, "acme", json!({})).await;
    let url = made["url"].as_str().expect("url");
    assert!(
        url.starts_with(&format!("{page_base}/ui#token=hl_acct_")),
        "{url} is not the page under {page_base}"
    );
    assert_eq!(made["account_id"], "acme");
    assert_eq!(made["read_only"], false);
    let expires: chrono::DateTime<chrono::Utc> = made["expires_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("expires_at");
    let lifetime = (expires - before).num_seconds();
    assert!(
        (3590..=3601).contains(&lifetime),
        "an hour by default, got {lifetime} s"
    );

    // The page's sign-in: the token names its account and holds the customer's scopes.
    let (status, who) = server
        .request_as(&token, reqwest::Method::GET, "/v1/whoami", None)
        .await;
    assert_eq!((status, &who["account_id"]), (200, &json!("acme")), "{who}");
    let (status, body) = server
        .request_as(
            &token,
            reqwest::Method::POST,
            "/v1/accounts/acme/endpoints",
            Some(json!({"url": "http://127.0.0.1:9/mine"})),
        )
        .await;
    assert_eq!(status, 201, "a full link manages endpoints: {body}");
    // Nothing of another account, not even whether it exists.
    for path in ["/v1/accounts/globex/endpoints", "/v1/accounts/globex"] {
        let (status, body) = server
            .request_as(&token, reqwest::Method::GET, path, None)
            .await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    // A link cannot make links: that is the platform's (admin) call.
    let (status, body) = server
        .request_as(
            &token,
            reqwest::Method::POST,
            "/v1/accounts/acme/portal",
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 403, "{body}");

    // Read-only: the reading scopes and nothing else.
    let (made, reader) = link(
        server,
        "acme",
        json!({"read_only": true, "ttl_seconds": 60}),
    )
    .await;
    assert_eq!(made["read_only"], true, "{made}");
    assert_eq!(
        scopes_of(server, &reader).await,
        ["accounts:read", "deliveries:read", "endpoints:read"]
    );
    // It reads the endpoints, but not their signing secrets: whoever holds one can sign
    // webhooks the receiver takes for genuine. A token that may change them sees them.
    let (status, list) = server
        .request_as(
            &reader,
            reqwest::Method::GET,
            "/v1/accounts/acme/endpoints",
            None,
        )
        .await;
    assert_eq!(status, 200);
    let listed = list["data"].as_array().expect("data");
    assert!(!listed.is_empty(), "{list}");
    let one = listed[0]["id"].as_str().expect("id").to_owned();
    let (status, read) = server
        .request_as(
            &reader,
            reqwest::Method::GET,
            &format!("/v1/accounts/acme/endpoints/{one}"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    for endpoint in listed.iter().chain([&read]) {
        assert!(
            endpoint.get("secret").is_none(),
            "a read-only link is shown {endpoint}"
        );
    }
    let (status, minted) = server
        .post("/v1/accounts/acme/tokens", json!({"ttl_seconds": 60}))
        .await;
    assert_eq!(status, 201, "{minted}");
    let writer = minted["token"].as_str().expect("token").to_owned();
    let (_, read) = server
        .request_as(
            &writer,
            reqwest::Method::GET,
            &format!("/v1/accounts/acme/endpoints/{one}"),
            None,
        )
        .await;
    assert!(
        read["secret"]
            .as_str()
            .is_some_and(|s| s.starts_with("whsec_")),
        "{read}"
    );
    for (path, body) in [
        (
            "/v1/accounts/acme/endpoints",
            json!({"url": "http://127.0.0.1:9/x"}),
        ),
        (
            "/v1/accounts/acme/events",
            json!({"type": "a.b", "data": {}}),
        ),
    ] {
        let (status, body) = server
            .request_as(&reader, reqwest::Method::POST, path, Some(body))
            .await;
        assert_eq!(status, 403, "POST {path} with a read-only link: {body}");
    }

    // Revoked by its id, as any account token: refused from then on.
    let token_id = made["token_id"].as_str().expect("token_id");
    let (status, body) = server
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/accounts/acme/tokens/{token_id}"),
            None,
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = server
        .request_as(&reader, reqwest::Method::GET, "/v1/whoami", None)
        .await;
    assert_eq!(status, 401, "a revoked link still signs in: {body}");
    let (status, _) = server
        .request_as(&token, reqwest::Method::GET, "/v1/whoami", None)
        .await;
    assert_eq!(status, 200, "revoking one link leaves the others");

    // Bad input names its field; nothing is minted for it.
    for (body, field) in [
        (json!({"ttl_seconds": 0}), "ttl_seconds"),
        (json!({"ttl_seconds": 604_801}), "ttl_seconds"),
        (json!({"ttl_seconds": "an hour"}), "ttl_seconds"),
        (json!({"read_only": "yes"}), "read_only"),
        (json!({"readonly": true}), "readonly"),
    ] {
        let (status, answer) = server.post("/v1/accounts/acme/portal", body.clone()).await;
        assert!(
            (400..500).contains(&status) && answer["error"]["field"] == field,
            "{body} answered {status} {answer}"
        );
    }
    let (status, _) = server.post("/v1/accounts/nobody/portal", json!({})).await;
    assert_eq!(status, 404);

    // The account's audit log has each link made, never its token.
    let (_, audit) = server.get("/v1/accounts/acme/audit").await;
    let entries = audit["data"].as_array().expect("audit entries");
    let links: Vec<&Value> = entries
        .iter()
        .filter(|e| e["action"] == "portal_link.created")
        .collect();
    assert_eq!(links.len(), 2, "{audit}");
    assert!(links.iter().any(|e| e["details"]["read_only"] == true));
    assert!(
        !audit.to_string().contains("hl_acct_"),
        "a token in the audit log"
    );
}

/// docs/ACCESS.md's example, sent as written: the answer has the fields the page shows.
/// Its account must exist.
async fn the_documented_example_answers_as_shown(server: &Server) {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/ACCESS.md"))
        .expect("docs/ACCESS.md");
    let example = page
        .split("```sh")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .find(|block| block.contains("/portal"))
        .expect("a portal example in docs/ACCESS.md");
    let account = example
        .split("/v1/accounts/")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("the example's account");
    let body: Value = example
        .split("-d '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .and_then(|raw| serde_json::from_str(raw).ok())
        .expect("the example's JSON body");
    let shown: Vec<String> = example
        .split("# →")
        .nth(1)
        .expect("the example's answer")
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .filter(|word| !word.contains(['/', '…', ' ']) && word.as_str() != "acme")
        .filter(|word| !matches!(word.as_str(), "false" | "true"))
        .collect();
    // The account exists already (portal_links_reach_one_account_and_are_revocable).
    let (made, _) = link(server, account, body).await;
    let mut fields: Vec<String> = made.as_object().expect("object").keys().cloned().collect();
    let mut shown = shown;
    fields.sort();
    shown.sort();
    assert_eq!(
        fields, shown,
        "docs/ACCESS.md shows other fields than the API answers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_link_reaches_its_account_only_until_revoked() {
    let scratch = Scratch::new("portal");
    let server = Server::start(&scratch, &[]).await;
    let base = server.base.clone();
    portal_links_reach_one_account_and_are_revocable(&server, &base).await;
    the_documented_example_answers_as_shown(&server).await;
}

/// Publishing and erasing events are the platform's. A customer holding a full link (an
/// account token) could otherwise publish under an id the platform uses later: publishing is
/// idempotent on the id, so the platform's own event would be answered 200 with the
/// customer's data and never sent. Refused, the event and the id stay the platform's, and
/// what the page does with the customer's own webhooks still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_portal_link_neither_publishes_nor_erases_events() {
    let scratch = Scratch::new("portal-publish");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let genuine = json!({"id": "evt_genuine", "type": "invoice.paid", "data": {"amount": 100}});
    let (status, published) = server.post("/v1/accounts/acme/events", genuine).await;
    assert_eq!(status, 202, "{published}");

    let (made, link_token) = link(&server, "acme", json!({})).await;
    assert_eq!(made["read_only"], false, "{made}");
    let (status, minted) = server
        .post("/v1/accounts/acme/tokens", json!({"ttl_seconds": 60}))
        .await;
    assert_eq!(status, 201, "{minted}");
    let token = minted["token"].as_str().expect("token").to_owned();
    let forged = |id: &str| json!({"id": id, "type": "invoice.paid", "data": {"amount": 0}});
    let attempts = [
        (
            reqwest::Method::POST,
            "/v1/accounts/acme/events",
            Some(forged("evt_later")),
            "events:publish",
        ),
        (
            reqwest::Method::POST,
            "/v1/accounts/acme/events",
            Some(forged("evt_genuine")),
            "events:publish",
        ),
        (
            reqwest::Method::POST,
            "/v1/accounts/acme/events/batch",
            Some(json!({"events": [forged("evt_later")]})),
            "events:publish",
        ),
        (
            reqwest::Method::DELETE,
            "/v1/accounts/acme/events/evt_genuine",
            None,
            "events:erase",
        ),
    ];
    for (who, credential) in [
        ("a full portal link", &link_token),
        ("an account token", &token),
    ] {
        for (method, path, body, scope) in &attempts {
            let (status, answer) = server
                .request_as(credential, method.clone(), path, body.clone())
                .await;
            assert_eq!(status, 403, "{method} {path} with {who}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(scope), "{method} {path}: {answer}");
        }
    }

    // The platform's event is as it published it, not erased.
    let (status, event) = server.get("/v1/accounts/acme/events/evt_genuine").await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["data"], json!({"amount": 100}), "{event}");
    assert!(event["erased_at"].is_null(), "{event}");
    // The id the customer tried is still the platform's to use.
    let later = json!({"id": "evt_later", "type": "invoice.paid", "data": {"amount": 250}});
    let (status, event) = server.post("/v1/accounts/acme/events", later).await;
    assert_eq!(status, 202, "the platform's event was taken: {event}");
    assert_eq!(event["data"], json!({"amount": 250}), "{event}");

    // What the page does with the customer's own webhooks stays: endpoints, test events.
    let (status, endpoint) = server
        .request_as(
            &link_token,
            reqwest::Method::POST,
            "/v1/accounts/acme/endpoints",
            Some(json!({"url": "http://127.0.0.1:9/mine"})),
        )
        .await;
    assert_eq!(status, 201, "{endpoint}");
    let test = format!(
        "/v1/accounts/acme/endpoints/{}/test",
        endpoint["id"].as_str().expect("id")
    );
    let (status, sent) = server
        .request_as(&link_token, reqwest::Method::POST, &test, None)
        .await;
    assert_eq!(status, 202, "a link sends a test event: {sent}");
    assert_eq!(
        scopes_of(&server, &link_token).await,
        [
            "accounts:read",
            "deliveries:read",
            "deliveries:replay",
            "endpoints:read",
            "endpoints:write"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_shape_makes_portal_links_under_its_public_url() {
    let scratch = Scratch::new("aws-portal");
    let prefix = crate::aws_pipeline::unique("portal");
    let env = [(
        "HOOKLANE_PUBLIC_URL".to_owned(),
        "https://hooks.example.com/base".to_owned(),
    )];
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &env).await;
    portal_links_reach_one_account_and_are_revocable(&server, "https://hooks.example.com/base")
        .await;
    crate::iam::assert_allowed(&server);
}
