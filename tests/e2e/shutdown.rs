//! Shutdown of `serve`: SIGTERM ends it within a bound whatever its clients do, lets what
//! is in flight finish within that bound, and a second signal ends it at once.

use std::time::{Duration, Instant};

use hooklane_testkit::farm::{Behavior, Farm};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    task::JoinHandle,
};

use crate::support::{Scratch, Server, ADMIN_TOKEN};

/// Within how long of SIGTERM `serve` has exited, whatever is still open (docs/OPERATIONS.md).
// serve exits within 15 s of noticing the signal; the rest is room for a loaded machine
// between the kill and that.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(17);

/// A connection that sends the head of an account's creation, then its 1,000-byte body one
/// byte a second, until the server closes it.
async fn slow_body(server: &Server) -> JoinHandle<()> {
    let mut stream = TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/accounts HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let task = tokio::spawn(async move {
        for _ in 0..1000 {
            if stream.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    // The head is in and the body is being read when the test goes on.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    task
}

fn send_signal(server: &Server, signal: &str) {
    let pid = server.pid().expect("serve is running");
    let sent = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal} {pid}: {sent}");
}

/// Whether `serve` has exited (and waits to be reaped).
fn exited(server: &Server) -> bool {
    server
        .proc_status("State")
        .is_none_or(|state| state.starts_with('Z'))
}

/// Waits up to `bound` for `serve` to exit after a signal already sent; its exit status.
async fn exit_within(server: &mut Server, bound: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    while !exited(server) {
        assert!(
            started.elapsed() < bound,
            "serve still running {bound:?} after SIGTERM; log:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A signal to a process that has exited does nothing: this reaps it.
    server.terminate().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_its_body_a_byte_a_second_does_not_hold_the_shutdown() {
    let scratch = Scratch::new("shutdown-slow-body");
    let mut server = Server::start(&scratch, &[]).await;
    let client = slow_body(&server).await;
    let started = Instant::now();
    let exit = tokio::time::timeout(SHUTDOWN_BOUND, server.terminate())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "serve still running {SHUTDOWN_BOUND:?} after SIGTERM; log:\n{}",
                server.log_text()
            )
        });
    let took = started.elapsed();
    println!("shutdown with a slow client: {took:?}, {exit}");
    assert!(exit.success(), "serve exited with {exit}");
    let log = server.log_text();
    assert!(
        log.contains("closing them unanswered"),
        "the cut connection was not logged:\n{log}"
    );
    client.abort();
}

/// A request whose body is still arriving at SIGTERM is answered once it is in (within the
/// grace), and what it created is there after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_progress_at_sigterm_is_answered_and_kept() {
    let scratch = Scratch::new("shutdown-in-progress");
    let mut server = Server::start(&scratch, &[]).await;
    let body = json!({"id": "late", "name": "Late", "owner_email": "owner@late.example"})
        .to_string()
        .into_bytes();
    let mut stream = TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/accounts HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let (first, rest) = body.split_at(body.len() / 2);
    stream.write_all(first).await.expect("first half");
    tokio::time::sleep(Duration::from_millis(500)).await;
    send_signal(&server, "TERM");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stream.write_all(rest).await.expect("second half");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("no answer, or the connection was not closed after it")
        .expect("read the answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 201"),
        "the request in progress was not answered: {answer}"
    );
    let exit = exit_within(&mut server, SHUTDOWN_BOUND).await;
    assert!(exit.success(), "serve exited with {exit}");
    server.restart().await;
    let (status, account) = server.get("/v1/accounts/late").await;
    assert_eq!(status, 200, "the answered creation was lost: {account}");
}

/// An attempt in flight at SIGTERM is recorded before `serve` exits, even with a client
/// holding a connection open: the restart does not send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_in_flight_at_sigterm_is_recorded_though_a_connection_is_cut() {
    let farm = Farm::start().await.expect("farm");
    farm.configure("slow", Behavior::slow(Duration::from_secs(3)));
    let scratch = Scratch::new("shutdown-attempt");
    let mut server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    server.farm_endpoints("acme", &farm, ["slow"]).await;
    server
        .publish("acme", "order.created", json!({"order": 1}))
        .await;
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.in_flight("slow") == 1)
            .await,
        "the attempt never started"
    );
    let client = slow_body(&server).await;
    let exit = tokio::time::timeout(SHUTDOWN_BOUND, server.terminate())
        .await
        .unwrap_or_else(|_| panic!("serve still running {SHUTDOWN_BOUND:?} after SIGTERM"));
    assert!(exit.success(), "serve exited with {exit}");
    client.abort();
    server.restart().await;
    let delivered = server
        .eventually(Duration::from_secs(5), || async {
            server.deliveries("acme", "&status=delivered").await.len() == 1
        })
        .await;
    assert!(delivered, "the attempt in flight was not recorded");
    // Time for a resend, were the attempt not recorded.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(farm.arrival_count("slow"), 1, "the attempt was sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_ends_serve_at_once() {
    let scratch = Scratch::new("shutdown-second");
    let mut server = Server::start(&scratch, &[]).await;
    let client = slow_body(&server).await;
    send_signal(&server, "TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !exited(&server),
        "serve exited on the first signal already: the test shows nothing"
    );
    let started = Instant::now();
    // `terminate` sends the second SIGTERM.
    let exit = tokio::time::timeout(Duration::from_secs(3), server.terminate())
        .await
        .unwrap_or_else(|_| panic!("serve still running 3 s after a second SIGTERM"));
    println!(
        "second signal: exited after {:?}, {exit}",
        started.elapsed()
    );
    assert_eq!(exit.code(), Some(143), "serve exited with {exit}");
    client.abort();
}
