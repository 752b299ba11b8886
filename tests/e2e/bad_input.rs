//! Bad input gets a 4xx with a JSON error naming the field, and nothing is half-written.

use serde_json::{json, Value};

use crate::support::{Scratch, Server};

async fn expect_error(server: &Server, path: &str, body: Value, status: u16, field: Option<&str>) {
    let (got, response) = server.post(path, body.clone()).await;
    assert_eq!(got, status, "{path} {body}: {response}");
    assert!(response["error"]["code"].is_string(), "{response}");
    assert!(response["error"]["message"].is_string(), "{response}");
    assert_eq!(
        response["error"]["field"].as_str(),
        field,
        "{path} {body}: {response}"
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_the_field_named() {
    let scratch = Scratch::new("input");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let accounts = "/v1/accounts";
    let endpoints = "/v1/accounts/acme/endpoints";
    let events = "/v1/accounts/acme/events";
    let url = "http://127.0.0.1:9/x";

    // What is refused: the status, and the field the error names.
    let refused = [
        (accounts, json!({"name": "x"}), 400, Some("owner_email")),
        (
            accounts,
            json!({"name": "x", "owner_email": "nope"}),
            422,
            Some("owner_email"),
        ),
        // SES sends only to ASCII addresses: a domain in Punycode is taken instead.
        (
            accounts,
            json!({"name": "x", "owner_email": "jörg@bücher.example"}),
            422,
            Some("owner_email"),
        ),
        (
            accounts,
            json!({"id": "bad id", "name": "x", "owner_email": "a@b.co"}),
            422,
            Some("id"),
        ),
        (
            accounts,
            json!({"id": "acme", "name": "x", "owner_email": "a@b.co"}),
            409,
            None,
        ),
        // An object nested in the body is read from an object only: serde would fill it
        // from an array as well.
        (
            accounts,
            json!({"name": "x", "owner_email": "a@b.co", "publish_rate_limit": [5]}),
            400,
            Some("publish_rate_limit"),
        ),
        (endpoints, json!({}), 400, Some("url")),
        (endpoints, json!({"url": 42}), 400, Some("url")),
        (endpoints, json!({"url": "not a url"}), 422, Some("url")),
        (
            endpoints,
            json!({"url": "ftp://example.com/x"}),
            422,
            Some("url"),
        ),
        (
            endpoints,
            json!({"url": url, "colour": "red"}),
            400,
            Some("colour"),
        ),
        (
            endpoints,
            json!({"url": url, "max_in_flight": -1}),
            400,
            Some("max_in_flight"),
        ),
        (
            endpoints,
            json!({"url": url, "max_in_flight": 0}),
            422,
            Some("max_in_flight"),
        ),
        (
            endpoints,
            json!({"url": url, "event_types": "invoice.paid"}),
            400,
            Some("event_types"),
        ),
        (
            endpoints,
            json!({"url": url, "event_types": ["bad type"]}),
            422,
            Some("event_types"),
        ),
        (events, json!({"data": {}}), 400, Some("type")),
        (events, json!({"type": "invoice.paid"}), 400, Some("data")),
        (
            events,
            json!({"type": "invoice..paid", "data": {}}),
            422,
            Some("type"),
        ),
        (
            events,
            json!({"type": ["x"], "data": {}}),
            400,
            Some("type"),
        ),
        (
            events,
            json!({"id": "has spaces", "type": "a.b", "data": {}}),
            422,
            Some("id"),
        ),
    ];
    for (path, body, status, field) in refused {
        expect_error(&server, path, body, status, field).await;
    }
    // Over the request's limit (six times HOOKLANE_MAX_PAYLOAD and 16 KiB): the body is
    // refused as a whole, naming no field.
    let (status, body) = server
        .post(
            events,
            json!({"type": "a.b", "data": {"blob": "x".repeat(6 * 256 * 1024 + 16 * 1024)}}),
        )
        .await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (413, &Value::Null),
        "{body}"
    );
    // A route without event data keeps to HOOKLANE_MAX_PAYLOAD and 16 KiB: a body parsed
    // whole, open to account tokens and portal links.
    let (status, body) = server
        .post(
            endpoints,
            json!({"url": "https://example.com/hook", "description": "x".repeat(300 * 1024)}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["message"].as_str()),
        (
            413,
            Some("the request body is larger than the limit of 278528 bytes")
        ),
        "{body}"
    );
    // Within it, but the webhook body is over HOOKLANE_MAX_PAYLOAD: `data` is named.
    let (status, body) = server
        .post(
            events,
            json!({"type": "a.b", "data": {"blob": "x".repeat(260 * 1024)}}),
        )
        .await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (413, &json!("data")),
        "{body}"
    );

    let (status, body) = server
        .raw_post(endpoints, "application/json", "{\"url\": ")
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("malformed_json")),
        "{body}"
    );
    let (status, body) = server.raw_post(endpoints, "text/plain", "{}").await;
    assert_eq!(status, 415, "{body}");
    for (query, field) in [
        ("status=lost", "status"),
        ("limit=0", "limit"),
        ("cursor=garbage", "cursor"),
    ] {
        let (status, body) = server
            .get(&format!("/v1/accounts/acme/deliveries?{query}"))
            .await;
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (400, Some(field)),
            "{body}"
        );
    }
    let (status, body) = server.get("/v1/accounts/nobody/endpoints").await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = server
        .post(
            events.replace("acme", "nobody").as_str(),
            json!({"type": "a.b", "data": {}}),
        )
        .await;
    assert_eq!(status, 404);

    // A body must be an object: serde would otherwise read `[]` as a struct of absent fields.
    for path in [
        "/v1/accounts/acme/tokens",
        "/v1/accounts/acme/endpoints",
        "/v1/accounts/acme/endpoints/ep_x/secret/rotate",
    ] {
        let (status, body) = server.raw_post(path, "application/json", "[]").await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("invalid_body")),
            "{path}: {body}"
        );
    }

    // A batch: empty, too long, or with one bad item names the item, and writes nothing
    // (not even the valid items before the bad one).
    let batch = "/v1/accounts/acme/events/batch";
    expect_error(&server, batch, json!({"events": []}), 422, Some("events")).await;
    let too_many = json!({ "events": vec![json!({"type": "a.b", "data": {}}); 101] });
    expect_error(&server, batch, too_many, 422, Some("events")).await;
    let bad_type = json!({"events": [
        {"id": "evt_batch_ok", "type": "a.b", "data": {}},
        {"type": "not a type", "data": {}},
    ]});
    expect_error(&server, batch, bad_type, 422, Some("events[1].type")).await;
    let repeated = json!({"events": [
        {"id": "evt_batch_ok", "type": "a.b", "data": {}},
        {"id": "evt_batch_ok", "type": "a.b", "data": {}},
    ]});
    expect_error(&server, batch, repeated, 422, Some("events[1].id")).await;
    let big = "x".repeat(300 * 1024);
    let oversize =
        json!({"events": [{"type": "a.b", "data": {}}, {"type": "a.b", "data": {"big": big}}]});
    expect_error(&server, batch, oversize, 413, Some("events[1].data")).await;
    let no_data = json!({"events": [{"type": "a.b"}]});
    expect_error(&server, batch, no_data, 400, Some("events[0].data")).await;
    let as_array =
        json!({"events": [{"id": "evt_batch_ok", "type": "a.b", "data": {}}, ["a.b", {}]]});
    expect_error(&server, batch, as_array, 400, Some("events[1]")).await;
    let (status, _) = server.get("/v1/accounts/acme/events/evt_batch_ok").await;
    assert_eq!(status, 404, "nothing of a refused batch is written");

    // Nothing was half-written by any of the above.
    let (_, list) = server.get(endpoints).await;
    assert_eq!(list["data"].as_array().map(Vec::len), Some(0), "{list}");
    assert!(server.deliveries("acme", "").await.is_empty());
}

#[tokio::test]
async fn no_token_no_access_and_publish_is_idempotent() {
    let scratch = Scratch::new("auth");
    let server = Server::start(&scratch, &[]).await;
    let client = reqwest::Client::new();
    let response = client
        .get(format!("{}/v1/accounts/acme", server.base))
        .send()
        .await
        .expect("get");
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "unauthorized");
    let response = client
        .get(format!("{}/v1/accounts/acme", server.base))
        .bearer_auth("wrong-token")
        .send()
        .await
        .expect("get");
    assert_eq!(response.status(), 401);
    let health = client
        .get(format!("{}/health", server.base))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), 200);

    server.create_account("acme").await;
    server
        .create_endpoint("acme", "http://127.0.0.1:9/hook", json!({}))
        .await;
    let first = server
        .post(
            "/v1/accounts/acme/events",
            json!({"id": "evt-42", "type": "a.b", "data": {"n": 1}}),
        )
        .await;
    assert_eq!(first.0, 202, "{}", first.1);
    let again = server
        .post(
            "/v1/accounts/acme/events",
            json!({"id": "evt-42", "type": "a.b", "data": {"n": 1}}),
        )
        .await;
    assert_eq!(again.0, 200, "{}", again.1);
    assert_eq!(
        again.1["data"],
        json!({"n": 1}),
        "the first event is returned"
    );
    assert_eq!(
        first.1["deliveries"][0]["id"],
        again.1["deliveries"][0]["id"]
    );
    // Another event under that id (other data, another type) is refused, naming the field:
    // taken for the first, it would never be sent.
    for (body, field) in [
        (
            json!({"id": "evt-42", "type": "a.b", "data": {"n": 2}}),
            "data",
        ),
        (
            json!({"id": "evt-42", "type": "a.c", "data": {"n": 1}}),
            "type",
        ),
    ] {
        let (status, refused) = server.post("/v1/accounts/acme/events", body).await;
        assert_eq!(status, 409, "{refused}");
        assert_eq!(refused["error"]["code"], "conflict", "{refused}");
        assert_eq!(refused["error"]["field"], field, "{refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("event `evt-42` was already published with")),
            "{refused}"
        );
    }
    // The first publish's delivery is written by the fan-out, a moment after its answer.
    server.fanned_out("acme", &first.1).await;
    assert_eq!(
        server.deliveries("acme", "").await.len(),
        1,
        "a repeated id creates nothing"
    );

    // A batch with an item under the id of another event is refused naming it, and writes
    // none of its items.
    let (status, refused) = server
        .post(
            "/v1/accounts/acme/events/batch",
            json!({"events": [
                {"id": "evt-44", "type": "a.b", "data": {"n": 6}},
                {"id": "evt-42", "type": "a.b", "data": {"n": 3}},
            ]}),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["field"], "events[1].data", "{refused}");
    let (status, _) = server.get("/v1/accounts/acme/events/evt-44").await;
    assert_eq!(status, 404, "nothing of a refused batch is written");

    // A batch answers each event in order; an id published before is returned, not made again.
    let batch = json!({"events": [
        {"id": "evt-42", "type": "a.b", "data": {"n": 1}},
        {"id": "evt-43", "type": "a.b", "data": {"n": 4}},
        {"type": "a.b", "data": {"n": 5}},
    ]});
    let (status, answer) = server
        .post("/v1/accounts/acme/events/batch", batch.clone())
        .await;
    assert_eq!(status, 202, "{answer}");
    let results = answer["results"].as_array().expect("results");
    let created: Vec<bool> = results.iter().map(|r| r["created"] == true).collect();
    assert_eq!(created, [false, true, true], "{answer}");
    assert_eq!(results[0]["event"]["data"], json!({"n": 1}), "{answer}");
    assert_eq!(results[1]["event"]["id"], "evt-43");
    assert_eq!(
        results[1]["event"]["deliveries"].as_array().map(Vec::len),
        Some(1)
    );
    for result in results {
        server.fanned_out("acme", &result["event"]).await;
    }
    assert_eq!(server.deliveries("acme", "").await.len(), 3);
    let (_, again) = server.post("/v1/accounts/acme/events/batch", batch).await;
    let created: Vec<bool> = again["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["created"] == true)
        .collect();
    assert_eq!(
        created,
        [false, false, true],
        "only the item without an id is new: {again}"
    );
}

/// Why an address is refused stays in the server's log: the answer is the same for every
/// refused address, so a customer cannot tell a private from a loopback or a metadata
/// address, nor learn from it what the server's DNS makes of a name. What is wrong with the
/// URL's text itself (its scheme, a localhost name) is still said. Only literal addresses
/// here: nothing is resolved, and creating an endpoint contacts nothing.
#[tokio::test]
async fn every_refused_address_is_answered_alike() {
    let scratch = Scratch::new("refused-address");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let endpoints = "/v1/accounts/acme/endpoints";
    let (id, _) = server
        .create_endpoint("acme", "http://127.0.0.1:9/hook", json!({}))
        .await;
    let endpoint = format!("{endpoints}/{id}");
    // The tests' allow-list is 127.0.0.0/8 alone: ::1 is refused as loopback.
    let refused = [
        ("http://10.0.0.1/hook", "private network address"),
        ("http://[::1]:8080/hook", "loopback address"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://0.0.0.0/hook", "unspecified address"),
        ("http://[fd00:ec2::254]/hook", "unique local"),
        ("http://100.64.0.1/hook", "carrier-grade NAT"),
    ];
    let mut answers = std::collections::BTreeMap::new();
    for (url, _) in refused {
        for (method, path) in [
            (reqwest::Method::POST, endpoints),
            (reqwest::Method::PATCH, endpoint.as_str()),
        ] {
            let (status, body) = server
                .request(method.clone(), path, Some(json!({"url": url})))
                .await;
            assert_eq!(status, 422, "{method} {url}: {body}");
            assert_eq!(body["error"]["field"], "url", "{method} {url}: {body}");
            let message = body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            answers.insert(format!("{method} {url}"), message);
        }
    }
    let distinct: std::collections::BTreeSet<&String> = answers.values().collect();
    assert_eq!(
        distinct.len(),
        1,
        "refused addresses are told apart: {answers:#?}"
    );
    let log = server.log_text();
    for (url, reason) in refused {
        assert!(
            distinct.iter().all(|message| !message.contains(reason)),
            "the answer says why {url} was refused: {distinct:?}"
        );
        assert!(
            log.contains(reason),
            "the log does not say why {url} was refused"
        );
    }

    // About the URL's text, not where it leads: said as it is.
    for (url, says) in [
        ("ftp://example.com/x", "scheme must be http or https"),
        ("http://api.localhost/x", "localhost names"),
        ("https://user:secret@example.com/x", "credentials"),
    ] {
        let (status, body) = server.post(endpoints, json!({"url": url})).await;
        assert_eq!(status, 422, "{url}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{url}: {body}");
    }
    // None was written: the one endpoint still points where it did.
    let (_, list) = server.get(endpoints).await;
    assert_eq!(list["data"].as_array().map(Vec::len), Some(1), "{list}");
    let (_, stored) = server.get(&endpoint).await;
    assert_eq!(stored["url"], "http://127.0.0.1:9/hook", "{stored}");
}

/// A body sent without a `Content-Length` (chunked) is cut off at its route's limit too,
/// on the route that reads an optional body itself (a secret's rotation).
#[tokio::test]
async fn a_chunked_body_is_cut_off_at_its_routes_limit() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let scratch = Scratch::new("chunked-limit");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let (endpoint, _) = server
        .create_endpoint("acme", "http://127.0.0.1:9/hook", json!({}))
        .await;
    let mut stream = tokio::net::TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/accounts/acme/endpoints/{endpoint}/secret/rotate HTTP/1.1\r\nHost: localhost\r\n\
         Authorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n",
        crate::support::ADMIN_TOKEN
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    // 300 KB of whitespace ahead of a valid body: over 256 KiB and 16 KiB.
    let body = format!("{}{{}}", " ".repeat(300 * 1024));
    let chunk = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    // The server may answer and close before all of it is written.
    let _ = stream.write_all(chunk.as_bytes()).await;
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut answer))
        .await
        .expect("no answer within 10 s")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "a 300 KB chunked rotation body: {}",
        answer.lines().next().unwrap_or_default()
    );
    assert!(answer.contains("278528"), "{answer}");
}

/// A body over its route's limit, its length declared, is read and dropped before the 413:
/// a client still sending it reads the answer, not a reset connection. 12 MiB is more than
/// loopback's socket buffers hold, so a server that answered and closed at once would reset
/// the connection under the writer.
#[tokio::test]
async fn a_declared_body_over_the_limit_is_answered_413_not_reset() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let scratch = Scratch::new("declared-limit");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let mut stream = tokio::net::TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .expect("connect");
    let length = 12 * 1024 * 1024;
    let head = format!(
        "POST /v1/accounts/acme/events HTTP/1.1\r\nHost: localhost\r\n\
         Authorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n",
        crate::support::ADMIN_TOKEN
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let sent = stream.write_all(&vec![b' '; length]).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("no answer within 10 s");
    assert!(sent.is_ok(), "the body was not read: {sent:?}");
    assert!(read.is_ok(), "the answer could not be read: {read:?}");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
}
