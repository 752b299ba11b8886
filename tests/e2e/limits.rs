//! Limits: one account's publish storm is throttled (429 + Retry-After) while another
//! account's publishes all go through, on both shapes; oversize bodies refused unread, and a
//! payload within the limit taken however its request escapes it; an account's endpoints
//! capped, and listed in pages of bounded size.

use std::time::{Duration, Instant};

use hooklane_testkit::testing::emulated_shape;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::aws_pipeline::{stack_env, with};
use crate::support::{Scratch, Server, ADMIN_TOKEN};

/// What a storm of publishes got back.
#[derive(Debug, Default)]
struct Tally {
    accepted: usize,
    throttled: usize,
    other: Vec<(u16, String)>,
    retry_after: Vec<u64>,
}

/// `count` publishes for `account` from `parallel` clients at once, spread over `bases`
/// (several servers share the account's bucket on AWS), each client pausing `pause` between two.
async fn storm(
    bases: &[String],
    account: &str,
    count: usize,
    parallel: usize,
    pause: Duration,
) -> Tally {
    let http = reqwest::Client::new();
    let mut clients = Vec::new();
    for client in 0..parallel {
        let http = http.clone();
        let bases = bases.to_vec();
        let account = account.to_owned();
        clients.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            for n in (client..count).step_by(parallel) {
                let base = &bases[n % bases.len()];
                let response = http
                    .post(format!("{base}/v1/accounts/{account}/events"))
                    .bearer_auth(ADMIN_TOKEN)
                    .json(&json!({"type": "storm.tick", "data": {"n": n}}))
                    .send()
                    .await
                    .expect("publish");
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                let body: Value = response.json().await.unwrap_or(Value::Null);
                match status {
                    202 => tally.accepted += 1,
                    429 => {
                        assert_eq!(body["error"]["code"], "rate_limited", "{body}");
                        tally.throttled += 1;
                        tally
                            .retry_after
                            .push(retry_after.expect("a 429 carries Retry-After in seconds"));
                    }
                    other => tally.other.push((other, body.to_string())),
                }
                tokio::time::sleep(pause).await;
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for client in clients {
        let tally = client.await.expect("client");
        total.accepted += tally.accepted;
        total.throttled += tally.throttled;
        total.other.extend(tally.other);
        total.retry_after.extend(tally.retry_after);
    }
    total
}

/// The storm on `bases`: `noisy` (its own limit of 5/s, bursts of 10) floods while `quiet`
/// (the default of 100/s) publishes steadily; returns the noisy account's tally.
async fn storm_while_quiet_publishes(bases: &[String], admin: &Server, shape: &str) {
    admin.create_account("noisy").await;
    admin.create_account("quiet").await;
    let (status, body) = admin
        .request(
            reqwest::Method::PATCH,
            "/v1/accounts/noisy",
            Some(json!({"publish_rate_limit": {"per_second": 5, "burst": 10}})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["publish_rate_limit"],
        json!({"per_second": 5, "burst": 10})
    );
    let started = Instant::now();
    let (noisy, quiet) = tokio::join!(
        storm(bases, "noisy", 200, 8, Duration::from_millis(20)),
        storm(bases, "quiet", 40, 2, Duration::from_millis(50)),
    );
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{shape} publish storm over {elapsed:.1} s: noisy (5/s, bursts of 10) {} accepted, {} throttled \
         (Retry-After {:?}..{:?} s); quiet {} accepted, {} throttled, {} other",
        noisy.accepted,
        noisy.throttled,
        noisy.retry_after.iter().min(),
        noisy.retry_after.iter().max(),
        quiet.accepted,
        quiet.throttled,
        quiet.other.len()
    );
    assert!(noisy.other.is_empty(), "{:?}", noisy.other);
    assert_eq!(
        (quiet.accepted, quiet.throttled, quiet.other.len()),
        (40, 0, 0),
        "the other account's publishes all succeed: {:?}",
        quiet.other
    );
    // A burst of 10, then 5 a second (plus one for rounding at the edges).
    let allowed = 10 + (5.0 * elapsed).ceil() as usize + 1;
    assert!(
        (10..=allowed).contains(&noisy.accepted),
        "{} accepted in {elapsed:.1} s; at most {allowed} allowed",
        noisy.accepted
    );
    // A slow machine stretches the storm: the bound on what was let through stays exact.
    assert!(noisy.throttled >= 200usize.saturating_sub(allowed));
    assert!(
        noisy.retry_after.iter().all(|s| (1..=2).contains(s)),
        "a token comes back every 200 ms: Retry-After is 1 s (rounded up), {:?}",
        noisy.retry_after
    );
    // Waiting as told gets through.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tally = storm(bases, "noisy", 1, 1, Duration::ZERO).await;
    assert_eq!(tally.accepted, 1, "{tally:?}");
}

#[tokio::test]
async fn a_publish_storm_throttles_only_its_own_account() {
    let scratch = Scratch::new("limits-storm");
    let server = Server::start(
        &scratch,
        &[
            ("HOOKLANE_PUBLISH_RATE", "100"),
            ("HOOKLANE_PUBLISH_BURST", "100"),
        ],
    )
    .await;
    storm_while_quiet_publishes(std::slice::from_ref(&server.base), &server, "embedded").await;
    // Every 429 is counted against its account, and only there.
    let (status, metrics) = server.get("/metrics").await;
    assert_eq!(status, 200);
    let metrics = metrics.as_str().expect("the Prometheus text");
    let throttled = |account: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "hooklane_publishes_throttled_total{{account=\"{account}\"}}"
                ))
            })
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
    };
    assert!(
        throttled("noisy").is_some_and(|n| n >= 100.0),
        "{:?}",
        throttled("noisy")
    );
    assert_eq!(throttled("quiet"), None);

    // A batch counts as its events: 100 at once take the burst of the default.
    let batch = json!({"events": vec![json!({"type": "a.b", "data": {}}); 100]});
    let (status, body) = server
        .post("/v1/accounts/quiet/events/batch", batch.clone())
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = server.post("/v1/accounts/quiet/events/batch", batch).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (429, &json!("rate_limited")),
        "{body}"
    );
    // `null` gives the account the default back.
    let (status, body) = server
        .request(
            reqwest::Method::PATCH,
            "/v1/accounts/noisy",
            Some(json!({"publish_rate_limit": null})),
        )
        .await;
    assert_eq!(
        (status, &body["publish_rate_limit"]),
        (200, &Value::Null),
        "{body}"
    );
    let (status, body) = server
        .request(
            reqwest::Method::PATCH,
            "/v1/accounts/noisy",
            Some(json!({"publish_rate_limit": {"per_second": 0}})),
        )
        .await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (422, &json!("publish_rate_limit")),
        "{body}"
    );
}

/// On AWS the bucket is an item of the control table: two API processes share one limit.
#[tokio::test]
async fn on_aws_the_limit_holds_across_api_processes() {
    let (settings, _shape) = emulated_shape().await;
    let env = with(stack_env(&settings), &[("HOOKLANE_PUBLISH_RATE", "100")]);
    let scratch = Scratch::new("limits-aws-a");
    let first = Server::start_aws(&scratch, &[], &env).await;
    let scratch_b = Scratch::new("limits-aws-b");
    let second = Server::start_aws(&scratch_b, &[], &env).await;
    let bases = [first.base.clone(), second.base.clone()];
    storm_while_quiet_publishes(&bases, &first, "aws (2 api processes)").await;
}

/// Sends `head` then `body` on a raw connection and reads the answer, without finishing
/// the body if the server answers first.
async fn raw_exchange(base: &str, head: String, chunks: &[Vec<u8>]) -> (u16, String) {
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream.write_all(head.as_bytes()).await.expect("head");
    for chunk in chunks {
        // The server may close once it has answered: later writes may fail.
        if stream.write_all(chunk).await.is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buffer[..n]);
                    if String::from_utf8_lossy(&answer).contains("\"error\"")
                        && answer.ends_with(b"}")
                    {
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "no answer while the body was unfinished: the server waited for the rest"
    );
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn oversize_bodies_are_refused_before_they_are_read_whole() {
    let scratch = Scratch::new("limits-size");
    let server = Server::start(&scratch, &[("HOOKLANE_MAX_PAYLOAD", "64KiB")]).await;
    server.create_account("acme").await;
    // Room for the payload with every character `\u`-escaped (6 bytes), and for the rest.
    let limit = 6 * 64 * 1024 + 16 * 1024;
    let path = "/v1/accounts/acme/events";

    // A Content-Length over the limit: answered 413 before a byte of the body is sent.
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        100 * 1024 * 1024
    );
    let (status, text) = raw_exchange(&server.base, head, &[]).await;
    assert_eq!(status, 413, "{text}");
    // The unread body makes the connection unusable: a client must not reuse it.
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert!(
        text.contains("payload_too_large") && text.contains(&format!("{limit} bytes")),
        "{text}"
    );

    // A chunked body with no length: cut off past the limit, while the client is still
    // sending (the final chunk is never sent).
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let opening = br#"{"type":"a.b","data":{"blob":""#;
    let mut chunks = vec![[
        format!("{:x}\r\n", opening.len()).as_bytes(),
        opening,
        b"\r\n",
    ]
    .concat()];
    let piece = vec![b'x'; 16 * 1024];
    for _ in 0..=limit / piece.len() {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(&piece);
        chunk.extend_from_slice(b"\r\n");
        chunks.push(chunk);
    }
    let (status, text) = raw_exchange(&server.base, head, &chunks).await;
    assert_eq!(status, 413, "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert!(text.contains(&format!("{limit} bytes")), "{text}");

    // Under the limit is fine; an event over HOOKLANE_MAX_PAYLOAD is refused by its size.
    let (status, body) = server
        .post(
            path,
            json!({"type": "a.b", "data": {"blob": "x".repeat(60 * 1024)}}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = server
        .post(
            path,
            json!({"type": "a.b", "data": {"blob": "x".repeat(70 * 1024)}}),
        )
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (413, &json!("payload_too_large")),
        "{body}"
    );

    // A batch may carry more than one event's worth: 8 events of 60 KiB go through.
    let events = vec![json!({"type": "a.b", "data": {"blob": "x".repeat(60 * 1024)}}); 8];
    let (status, body) = server
        .post(
            "/v1/accounts/acme/events/batch",
            json!({ "events": events }),
        )
        .await;
    assert_eq!(status, 202, "{body}");
}

/// `text` as a JSON string the way Python's `json.dumps` writes it by default
/// (`ensure_ascii=True`, which `requests.post(json=…)` uses): every character past ASCII as
/// `\uXXXX`, those past the BMP as two of them. With `all`, ASCII letters too (`\u0061`).
fn escaped(text: &str, all: bool) -> String {
    let mut out = String::with_capacity(text.len() * 6 + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c.is_ascii_graphic() || c == ' ') && !(all && c.is_ascii_alphabetic()) => {
                out.push(c)
            }
            c => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

/// A publish is limited by its webhook body (`HOOKLANE_MAX_PAYLOAD`), however the client
/// escaped the text of its request: Python's `requests` sends `日本` as `\u65e5\u672c`,
/// twice its UTF-8 size (an emoji's 4 bytes as 12). Such an event within the limit is taken
/// and delivered as UTF-8, the text unchanged, even with every letter escaped; one over the
/// limit is refused naming `data`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_within_the_limit_is_taken_however_its_text_is_escaped() {
    let farm = hooklane_testkit::farm::Farm::start().await.expect("farm");
    let scratch = Scratch::new("limits-escaped");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    server
        .create_endpoint("acme", &farm.url("receiver"), json!({}))
        .await;
    let publish = |id: &str, data: String| {
        let server = &server;
        let body = format!(r#"{{"id":"{id}","type":"a.b","data":{data}}}"#);
        async move {
            let (status, text) = server.post_text("/v1/accounts/acme/events", body).await;
            (
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        }
    };
    let limit = 256 * 1024;

    // 244 KB of UTF-8 as Python sends it: 492 KB of request.
    let (blob, emoji) = ("日本".repeat(40_000), "😀".repeat(1_000));
    let data = format!(
        r#"{{"blob":{},"emoji":{}}}"#,
        escaped(&blob, false),
        escaped(&emoji, false)
    );
    assert!(data.len() > 2 * (blob.len() + emoji.len()) && blob.len() + emoji.len() < limit);
    let (status, answer) = publish("escaped.1", data).await;
    assert_eq!(status, 202, "{answer}");
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("receiver")
            == 1)
            .await
    );
    let webhook = farm.arrivals("receiver").remove(0).body;
    assert!(webhook.len() <= limit, "{} bytes", webhook.len());
    let delivered: Value = serde_json::from_slice(&webhook).expect("json");
    assert_eq!(delivered["data"], json!({"blob": blob, "emoji": emoji}));

    // Just under the limit as a webhook, every letter escaped: six times its size.
    let letters = "a".repeat(limit - 200);
    let data = format!(r#"{{"blob":{}}}"#, escaped(&letters, true));
    assert!(data.len() > 6 * (limit - 200));
    let (status, answer) = publish("escaped.2", data).await;
    assert_eq!(status, 202, "{answer}");
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("receiver")
            == 2)
            .await
    );
    let delivered: Value =
        serde_json::from_slice(&farm.arrivals("receiver").remove(1).body).expect("json");
    assert_eq!(delivered["data"], json!({"blob": letters}));

    // Over the limit once re-written as UTF-8: refused for its size, naming `data`.
    let data = format!(r#"{{"blob":{}}}"#, escaped(&"日本".repeat(44_000), false));
    let (status, answer) = publish("escaped.3", data).await;
    assert_eq!(
        (status, &answer["error"]["code"], &answer["error"]["field"]),
        (413, &json!("payload_too_large"), &json!("data")),
        "{answer}"
    );
    let (status, _) = server.get("/v1/accounts/acme/events/escaped.3").await;
    assert_eq!(status, 404, "nothing written");
}

/// An account has at most `HOOKLANE_MAX_ENDPOINTS` endpoints: each event goes to every one,
/// so a token that may make endpoints cannot turn one publish into thousands of requests.
/// A deleted endpoint makes room; another account has its own limit.
#[tokio::test]
async fn an_account_has_at_most_its_limit_of_endpoints() {
    let scratch = Scratch::new("max-endpoints");
    let server = Server::start(&scratch, &[("HOOKLANE_MAX_ENDPOINTS", "2")]).await;
    server.create_account("acme").await;
    server.create_account("globex").await;
    let url = "http://127.0.0.1:9/x";
    let (first, _) = server.create_endpoint("acme", url, json!({})).await;
    server.create_endpoint("acme", url, json!({})).await;
    let path = "/v1/accounts/acme/endpoints";
    let (status, body) = server.post(path, json!({"url": url})).await;
    assert_eq!(status, 409, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("HOOKLANE_MAX_ENDPOINTS"), "{message}");
    server.create_endpoint("globex", url, json!({})).await;
    let (status, _) = server
        .request(reqwest::Method::DELETE, &format!("{path}/{first}"), None)
        .await;
    assert_eq!(status, 204);
    server.create_endpoint("acme", url, json!({})).await;

    // Creates sent at once: only as many as there is room for.
    server.create_account("initech").await;
    let path = "/v1/accounts/initech/endpoints";
    let creates = (0..6).map(|_| server.post(path, json!({"url": url})));
    let answers = futures_util::future::join_all(creates).await;
    let mut statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    statuses.sort();
    assert_eq!(statuses, [201, 201, 409, 409, 409, 409], "{answers:?}");
    let (_, listed) = server.get(path).await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(2), "{listed}");
}

/// Lists every endpoint of acme through `limit`-sized pages; returns the pages' ids and
/// their sizes in bytes.
async fn endpoint_pages(server: &Server, limit: u32) -> (Vec<Vec<String>>, Vec<usize>) {
    let (mut pages, mut sizes) = (Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/v1/accounts/acme/endpoints?limit={limit}");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let (status, page) = server.get(&path).await;
        assert_eq!(status, 200, "{path}: {page}");
        sizes.push(page.to_string().len());
        let ids = page["data"].as_array().expect("data").iter();
        pages.push(
            ids.map(|e| e["id"].as_str().expect("id").to_owned())
                .collect(),
        );
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (pages, sizes),
        }
    }
    panic!("the endpoint list never ended");
}

/// The endpoint list comes in pages of at most `limit` endpoints and about 1 MiB, so that
/// the AWS shape's answer stays inside Lambda's 6 MB with the most an endpoint can hold.
async fn the_endpoint_list_comes_in_pages_of_bounded_size(server: &Server) {
    server.create_account("acme").await;
    let headers: serde_json::Map<String, Value> = (0..20)
        .map(|i| (format!("X-Wide-{i}"), json!("w".repeat(1000))))
        .collect();
    let mut created = Vec::new();
    for _ in 0..60 {
        let url = "http://127.0.0.1:9/x";
        let (id, _) = server
            .create_endpoint("acme", url, json!({"headers": headers}))
            .await;
        created.push(id);
    }
    let (pages, sizes) = endpoint_pages(server, 500).await;
    assert!(
        pages.len() >= 2 && sizes.iter().all(|&bytes| bytes < (1 << 20) + 64 * 1024),
        "pages of {sizes:?} bytes"
    );
    // Every endpoint once (two created in one millisecond are listed in id order).
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };
    created = sorted(created);
    assert_eq!(sorted(pages.concat()), created);
    let (pages, _) = endpoint_pages(server, 7).await;
    assert!(pages.iter().all(|page| page.len() <= 7), "{pages:?}");
    assert_eq!(sorted(pages.concat()), created);
    // A cursor of another list (the audit log's) is refused, not read as a place in this one.
    let (_, audit) = server.get("/v1/accounts/acme/audit?limit=1").await;
    let other = audit["next_cursor"].as_str().expect("an audit cursor");
    let other = format!("cursor={other}");
    for (query, field) in [
        ("limit=0", "limit"),
        ("cursor=nope", "cursor"),
        ("page=2", "page"),
        (other.as_str(), "cursor"),
    ] {
        let (status, body) = server
            .get(&format!("/v1/accounts/acme/endpoints?{query}"))
            .await;
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (400, Some(field)),
            "{body}"
        );
    }
}

/// Every item of a list read through `limit`-sized pages from `path` (its `id`, or `name`
/// for event types), and the pages' sizes in bytes.
async fn list_pages(server: &Server, path: &str, limit: u32) -> (Vec<Vec<String>>, Vec<usize>) {
    let (mut pages, mut sizes) = (Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut query = format!("{path}?limit={limit}");
        if let Some(cursor) = &cursor {
            query.push_str(&format!("&cursor={cursor}"));
        }
        let (status, page) = server.get(&query).await;
        assert_eq!(status, 200, "{query}: {page}");
        sizes.push(page.to_string().len());
        let items = page["data"].as_array().expect("data").iter();
        pages.push(
            items
                .map(|item| {
                    item.get("id")
                        .unwrap_or(&item["name"])
                        .as_str()
                        .expect("a key")
                        .to_owned()
                })
                .collect(),
        );
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (pages, sizes),
        }
    }
    panic!("{path} never ended");
}

/// The event-type catalog and the API keys come in pages of at most `limit` items and about
/// 1 MiB: a type's schema and example may be 64 KiB each, and a key may name many accounts,
/// so either list whole could outgrow the 6 MB Lambda may answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_and_the_keys_come_in_pages_of_bounded_size() {
    let scratch = Scratch::new("catalog-pages");
    let server = Server::start(&scratch, &[]).await;
    let wide = "w".repeat(60_000);
    let mut names = Vec::new();
    for i in 0..20 {
        let name = format!("wide.type{i:02}");
        let (status, body) = server
            .post(
                "/v1/event-types",
                json!({
                    "name": name,
                    "schema": {"type": "object", "description": wide},
                    "example": {"pad": wide},
                }),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        names.push(name);
    }
    let (pages, sizes) = list_pages(&server, "/v1/event-types", 500).await;
    assert!(
        pages.len() >= 2 && sizes.iter().all(|&bytes| bytes < (1 << 20) + 256 * 1024),
        "pages of {sizes:?} bytes"
    );
    assert_eq!(pages.concat(), names, "every type once, by name");
    let (pages, _) = list_pages(&server, "/v1/event-types", 3).await;
    assert!(pages.iter().all(|page| page.len() <= 3), "{pages:?}");
    assert_eq!(pages.concat(), names);

    let mut keys = Vec::new();
    for i in 0..5 {
        let (status, made) = server
            .post(
                "/v1/keys",
                json!({"name": format!("key {i}"), "scopes": ["events:publish"]}),
            )
            .await;
        assert_eq!(status, 201, "{made}");
        keys.push(made["id"].as_str().expect("an id").to_owned());
    }
    keys.reverse();
    let (pages, _) = list_pages(&server, "/v1/keys", 2).await;
    assert_eq!(pages.len(), 3, "{pages:?}");
    assert_eq!(pages.concat(), keys, "every key once, newest first");

    // A cursor of another list is refused, not read as a place in this one.
    let (_, types) = server.get("/v1/event-types?limit=1").await;
    let of_types = format!(
        "cursor={}",
        types["next_cursor"].as_str().expect("a cursor")
    );
    let (_, listed) = server.get("/v1/keys?limit=1").await;
    let of_keys = format!(
        "cursor={}",
        listed["next_cursor"].as_str().expect("a cursor")
    );
    for (path, query, field) in [
        ("/v1/event-types", of_keys.as_str(), "cursor"),
        ("/v1/keys", of_types.as_str(), "cursor"),
        ("/v1/keys", "limit=0", "limit"),
        ("/v1/event-types", "page=2", "page"),
    ] {
        let (status, body) = server.get(&format!("{path}?{query}")).await;
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (400, Some(field)),
            "{path}?{query}: {body}"
        );
    }
}

/// A batch whose whole answer would be too large for the AWS function (6 MB) is answered
/// abridged, every event without its deliveries and a created one without its `data`; the
/// events are written all the same, and sending the batch again answers the same way, each
/// existing event with its `data` (what the outbox relay compares with what it sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_too_large_to_answer_whole_is_answered_abridged() {
    let scratch = Scratch::new("batch-abridged");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    for _ in 0..100 {
        server
            .create_endpoint("acme", "http://127.0.0.1:9/x", json!({}))
            .await;
    }
    let pad = "p".repeat(25_000);
    let events: Vec<Value> = (0..100)
        .map(|i| json!({"id": format!("evt_big_{i:03}"), "type": "a.b", "data": {"pad": pad}}))
        .collect();
    let batch = json!({ "events": events });
    for round in ["first", "again"] {
        let (status, answer) = server
            .post("/v1/accounts/acme/events/batch", batch.clone())
            .await;
        assert_eq!(status, 202, "{round}");
        let escaped = serde_json::to_string(&answer.to_string())
            .expect("text")
            .len();
        assert!(escaped < 6_000_000, "{round}: {escaped} bytes escaped");
        assert_eq!(answer["abridged"], true, "{round}");
        let results = answer["results"].as_array().expect("results");
        assert_eq!(results.len(), 100, "{round}");
        for (i, result) in results.iter().enumerate() {
            let event = &result["event"];
            assert_eq!(event["id"], format!("evt_big_{i:03}"), "{round}");
            assert!(event.get("deliveries").is_none(), "{round}: {event}");
            match round {
                "first" => {
                    assert_eq!(result["created"], true);
                    assert!(event.get("data").is_none(), "{event}");
                }
                _ => {
                    assert_eq!(result["created"], false);
                    assert_eq!(event["data"]["pad"], pad.as_str());
                }
            }
        }
    }
    // The fan-out writes an event's deliveries just after its publish is answered.
    let all_there = server
        .eventually(Duration::from_secs(20), || async {
            let (status, one) = server.get("/v1/accounts/acme/events/evt_big_042").await;
            status == 200 && one["deliveries"].as_array().map(Vec::len) == Some(100)
        })
        .await;
    assert!(all_there, "evt_big_042 has not its 100 deliveries");
    // A batch that fits is answered whole.
    let (status, small) = server
        .post(
            "/v1/accounts/acme/events/batch",
            json!({"events": [{"type": "a.b", "data": {}}]}),
        )
        .await;
    assert_eq!(status, 202);
    assert!(small.get("abridged").is_none(), "{small}");
    assert_eq!(
        small["results"][0]["event"]["deliveries"]
            .as_array()
            .map(Vec::len),
        Some(100)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_endpoint_pages() {
    let scratch = Scratch::new("endpoint-pages");
    let server = Server::start(&scratch, &[]).await;
    the_endpoint_list_comes_in_pages_of_bounded_size(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_endpoint_pages() {
    let scratch = Scratch::new("aws-endpoint-pages");
    let prefix = crate::aws_pipeline::unique("eppages");
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &[]).await;
    the_endpoint_list_comes_in_pages_of_bounded_size(&server).await;
    crate::iam::assert_allowed(&server);
}
