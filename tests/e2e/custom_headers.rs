//! Custom headers on an endpoint, in both shapes: sent with every attempt, secret values
//! never shown by the API or written to the audit log, changed by merge patch, and bad
//! names or values refused with the field named and nothing written.

use std::time::Duration;

use hooklane_testkit::farm::Farm;
use serde_json::{json, Value};

use crate::support::{Scratch, Server};

const SECRET: &str = "Bearer s3cret-9f2c41";

/// Publishes one event and waits for its `n`th arrival at `name`; returns that arrival's
/// headers as (name, value) pairs.
async fn next_arrival(server: &Server, farm: &Farm, name: &str, n: usize) -> Vec<(String, String)> {
    server
        .publish("acme", "invoice.paid", json!({"n": n}))
        .await;
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| f.success_count(name) >= n)
            .await,
        "delivery {n} never arrived"
    );
    farm.arrivals(name).remove(n - 1).headers
}

fn value<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

async fn custom_headers_go_with_every_attempt(server: &Server) {
    let farm = Farm::start().await.expect("farm");
    server.create_account("acme").await;
    let (status, made) = server
        .post(
            "/v1/accounts/acme/endpoints",
            json!({
                "url": farm.url("custom"),
                "headers": {
                    "X-Tenant": "t_1",
                    "Authorization": SECRET,
                    "X-Api-Key": {"value": "key-77", "secret": true},
                },
            }),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().expect("id").to_owned();
    let shown = json!({
        "authorization": {"value": null, "secret": true},
        "x-api-key": {"value": null, "secret": true},
        "x-tenant": {"value": "t_1", "secret": false},
    });
    assert_eq!(made["headers"], shown, "{made}");
    let path = format!("/v1/accounts/acme/endpoints/{id}");
    let (_, read) = server.get(&path).await;
    assert_eq!(read["headers"], shown, "{read}");
    let (_, listed) = server.get("/v1/accounts/acme/endpoints").await;
    for body in [&made, &read, &listed] {
        let text = body.to_string();
        assert!(
            !text.contains("s3cret") && !text.contains("key-77"),
            "{text}"
        );
    }

    // Sent with the attempt, beside Hooklane's own headers.
    let sent = next_arrival(server, &farm, "custom", 1).await;
    assert_eq!(value(&sent, "x-tenant"), Some("t_1"), "{sent:?}");
    assert_eq!(value(&sent, "authorization"), Some(SECRET), "{sent:?}");
    assert_eq!(value(&sent, "x-api-key"), Some("key-77"), "{sent:?}");
    assert!(value(&sent, "webhook-signature").is_some(), "{sent:?}");
    assert_eq!(value(&sent, "content-type"), Some("application/json"));

    // A merge patch: one removed, one added, the secret ones kept without being resent.
    let (status, patched) = server
        .request(
            reqwest::Method::PATCH,
            &path,
            Some(json!({"headers": {"x-tenant": null, "X-Region": "eu"}})),
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    let names: Vec<&String> = patched["headers"]
        .as_object()
        .expect("headers")
        .keys()
        .collect();
    assert_eq!(
        names,
        ["authorization", "x-api-key", "x-region"],
        "{patched}"
    );
    let sent = next_arrival(server, &farm, "custom", 2).await;
    assert_eq!(value(&sent, "x-tenant"), None, "{sent:?}");
    assert_eq!(value(&sent, "x-region"), Some("eu"), "{sent:?}");
    assert_eq!(value(&sent, "authorization"), Some(SECRET), "{sent:?}");

    // Bad names and values: the field named, the endpoint unchanged.
    for (headers, field) in [
        (json!({"Host": "evil.example"}), "headers.Host"),
        (json!({"Webhook-Id": "x"}), "headers.Webhook-Id"),
        (
            json!({"Transfer-Encoding": "chunked"}),
            "headers.Transfer-Encoding",
        ),
        (json!({"x-a": "line\r\nX-Injected: 1"}), "headers.x-a"),
        (json!({"x a": "v"}), "headers.x a"),
        (
            json!({"x-a": {"value": "v", "secret": "yes"}}),
            "headers.x-a.secret",
        ),
        (json!(["x-a"]), "headers"),
    ] {
        let (status, body) = server
            .request(
                reqwest::Method::PATCH,
                &path,
                Some(json!({"headers": headers, "description": "changed"})),
            )
            .await;
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (422, Some(field)),
            "{headers}: {body}"
        );
    }
    let too_many: serde_json::Map<String, Value> =
        (0..21).map(|i| (format!("x-{i}"), json!("v"))).collect();
    let (status, body) = server
        .post(
            "/v1/accounts/acme/endpoints",
            json!({"url": farm.url("other"), "headers": too_many}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (422, Some("headers")),
        "{body}"
    );
    let (_, after) = server.get(&path).await;
    assert_eq!(
        after["headers"], patched["headers"],
        "a refused change wrote something"
    );
    assert_eq!(after["description"], patched["description"]);
    let (_, listed) = server.get("/v1/accounts/acme/endpoints").await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1));

    // The audit log names the headers changed, never a value.
    let (_, audit) = server.get("/v1/accounts/acme/audit").await;
    let text = audit.to_string();
    assert!(
        !text.contains("s3cret") && !text.contains("key-77"),
        "{text}"
    );
    let updated = audit["data"]
        .as_array()
        .and_then(|entries| entries.iter().find(|e| e["action"] == "endpoint.updated"))
        .cloned()
        .expect("an endpoint.updated entry");
    assert_eq!(
        updated["details"]["changed"],
        json!(["headers"]),
        "{updated}"
    );

    // `null` removes them all.
    let (status, cleared) = server
        .request(
            reqwest::Method::PATCH,
            &path,
            Some(json!({"headers": null})),
        )
        .await;
    assert_eq!(
        (status, &cleared["headers"]),
        (200, &json!({})),
        "{cleared}"
    );
    let sent = next_arrival(server, &farm, "custom", 3).await;
    assert_eq!(value(&sent, "authorization"), None, "{sent:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_custom_headers() {
    let scratch = Scratch::new("custom-headers");
    let server = Server::start(&scratch, &[]).await;
    custom_headers_go_with_every_attempt(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_custom_headers() {
    let scratch = Scratch::new("aws-custom-headers");
    let prefix = crate::aws_pipeline::unique("headers");
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &[]).await;
    custom_headers_go_with_every_attempt(&server).await;
    crate::iam::assert_allowed(&server);
}
