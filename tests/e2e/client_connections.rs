//! Client connections and the open-files limit: however many connections clients open,
//! `serve` keeps descriptors for its webhooks' connections.

use std::time::Duration;

use hooklane_testkit::farm::Farm;
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::support::{Scratch, Server, ADMIN_TOKEN};

/// The open-files limit `serve` runs under here, soft and hard: it holds at most half as
/// many client connections.
const OPEN_FILES: u64 = 200;

/// A request (`method`, `path`, `body`) on an open connection, and the status line of its
/// answer.
async fn request_on(stream: &mut TcpStream, method: &str, path: &str, body: &str) -> String {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .expect("no answer within 10 s")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..read]);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// Clients holding more connections than the limit allows do not leave `serve` without the
/// descriptors to send: the webhook published meanwhile is sent at its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_holding_many_connections_leave_room_for_the_webhooks() {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("open-files");
    let server = Server::start_with_open_files(
        &scratch,
        // A failed first attempt would be tried again only after a minute.
        &[("HOOKLANE_RETRY_SCHEDULE", "60,60")],
        OPEN_FILES,
    )
    .await;
    server.create_account("acme").await;
    let [endpoint] = server.farm_endpoints("acme", &farm, ["ep"]).await;
    let address = server.base.trim_start_matches("http://").to_owned();
    // The platform's connection, open (and accepted) before the crowd.
    let mut platform = TcpStream::connect(&address).await.expect("connect");
    let status = request_on(&mut platform, "GET", "/v1/accounts/acme", "").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // Clients that open connections and send nothing: more than the limit (and no more than
    // the connections `serve` may hold plus its listen backlog of 128, beyond which the
    // kernel drops new ones).
    let mut crowd = Vec::new();
    for _ in 0..OPEN_FILES + 20 {
        crowd.push(TcpStream::connect(&address).await.expect("connect"));
    }
    // Time for serve to accept what it will.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let body = json!({"type": "invoice.paid", "data": {"n": 1}}).to_string();
    let status = request_on(&mut platform, "POST", "/v1/accounts/acme/events", &body).await;
    assert!(status.starts_with("HTTP/1.1 202"), "publish: {status}");
    let sent = farm
        .wait_until(Duration::from_secs(10), |f| f.success_count("ep") == 1)
        .await;
    drop(crowd);
    let log = server.log_text();
    assert!(
        sent,
        "the webhook was not sent within 10 s with {} client connections held open; log:\n{}",
        OPEN_FILES + 20,
        log.lines()
            .filter(|l| l.contains("open files") || l.contains("attempt"))
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        log.contains("as many client connections as allowed are open"),
        "the bound was not logged"
    );
    // The farm counts the answer as it sends it; serve records the attempt a moment after.
    let filter = format!("&endpoint={endpoint}&status=delivered");
    let recorded = server
        .eventually(Duration::from_secs(10), || async {
            !server.deliveries("acme", &filter).await.is_empty()
        })
        .await;
    let deliveries = server
        .deliveries("acme", &format!("&endpoint={endpoint}"))
        .await;
    assert!(
        recorded,
        "not recorded delivered within 10 s: {deliveries:?}"
    );
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0]["status"], "delivered", "{:?}", deliveries[0]);
    assert_eq!(deliveries[0]["attempts"], 1, "{:?}", deliveries[0]);
}
