//! `hooklane relay` end to end: rows of a platform's outbox table, inserted in its business
//! transactions in a real PostgreSQL (Debian's server, started here on 127.0.0.1) or in
//! SQLite, arrive signed through the embedded `serve`; rolled-back rows never do; a relay
//! killed with `kill -9` anywhere (between the publish and the mark included) loses no row
//! and makes no second event. Commit-to-publish latency with LISTEN/NOTIFY is printed.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, Instant},
};

use hooklane_testkit::farm::Farm;
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    process::{Child, Command},
    sync::Notify,
};

use crate::support::{Scratch, Server, ADMIN_TOKEN};

const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/outbox");

// ---------------------------------------------------------------------------------------------
// A throwaway PostgreSQL server, shared by the tests of this file (one database each).

struct Postgres {
    port: u16,
    /// Closing it (the test process ends) stops the server and removes its files.
    _watchdog: std::process::ChildStdin,
}

fn postgres_bin(name: &str) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .into_iter()
        .rev()
        .map(|v| v.join("bin").join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "PostgreSQL's {name} is not installed (/usr/lib/postgresql/*/bin): run the tests \
                 with scripts/test, whose scripts/test-env installs Debian's postgresql"
            )
        })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// PostgreSQL refuses to run as root: as root, the server runs as the `postgres` user the
/// Debian package creates.
fn as_postgres_user(program: &Path) -> std::process::Command {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if root {
        let mut command = std::process::Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        std::process::Command::new(program)
    }
}

fn start_postgres() -> Postgres {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("hooklane-e2e-pg-{}", std::process::id()));
    let data = dir.join("data");
    std::fs::create_dir_all(&dir).expect("postgres dir");
    // The server's user owns its directory (a no-op when that is us).
    let owned = std::process::Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !owned {
        eprintln!(
            "relay: could not chown {} to postgres (fine when not root)",
            dir.display()
        );
    }
    let init = as_postgres_user(&postgres_bin("initdb"))
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--no-locale",
        ])
        .output()
        .expect("run initdb");
    assert!(
        init.status.success(),
        "initdb failed:\n{}{}",
        String::from_utf8_lossy(&init.stdout),
        String::from_utf8_lossy(&init.stderr)
    );
    let port = free_port();
    // A watchdog shell: it starts the server, waits for its stdin to close (this process
    // ended, however), then stops the server and removes its files.
    let server = as_postgres_user(&postgres_bin("postgres"));
    let mut argv: Vec<String> = vec![server.get_program().to_string_lossy().into_owned()];
    argv.extend(server.get_args().map(|a| a.to_string_lossy().into_owned()));
    argv.extend(
        [
            "-D",
            &data.display().to_string(),
            "-p",
            &port.to_string(),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "unix_socket_directories=",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=50",
        ]
        .map(str::to_owned),
    );
    let script = r#"DIR="$1"; shift; "$@" >"$DIR/server.log" 2>&1 & cat >/dev/null; kill -QUIT "$(head -n 1 "$DIR/data/postmaster.pid" 2>/dev/null)" 2>/dev/null; sleep 2; rm -rf "$DIR""#;
    let mut watchdog = std::process::Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(&dir)
        .args(&argv)
        .stdin(Stdio::piped())
        .spawn()
        .expect("start postgres");
    let stdin = watchdog.stdin.take().expect("watchdog stdin");
    // Reaped by init when it ends; nothing waits on it here.
    drop(watchdog);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "PostgreSQL did not start on port {port}; its log:\n{}",
            std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "relay: PostgreSQL started on 127.0.0.1:{port} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Postgres {
        port,
        _watchdog: stdin,
    }
}

fn postgres() -> &'static Postgres {
    static SERVER: OnceLock<Postgres> = OnceLock::new();
    SERVER.get_or_init(start_postgres)
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                return client;
            }
            Err(error) if Instant::now() < deadline => {
                let _ = error;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("cannot connect to {url}: {error}"),
        }
    }
}

/// A new database with the documented outbox table and an `orders` table; its URL.
async fn database(name: &str) -> String {
    let server = postgres();
    let admin = connect(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        server.port
    ))
    .await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    let url = format!("postgres://postgres@127.0.0.1:{}/{name}", server.port);
    let client = connect(&url).await;
    let ddl = std::fs::read_to_string(Path::new(DOCS).join("postgres.sql")).expect("ddl");
    client
        .batch_execute(&ddl)
        .await
        .expect("docs/outbox/postgres.sql");
    client
        .batch_execute("CREATE TABLE orders (id text PRIMARY KEY, total integer NOT NULL)")
        .await
        .expect("orders");
    url
}

// ---------------------------------------------------------------------------------------------
// The relay process, and a proxy that can hold an answer back.

struct Relay {
    child: Child,
    args: Vec<String>,
    log: PathBuf,
}

impl Relay {
    async fn start(scratch: &Scratch, source: &str, url: &str, poll: &str) -> Self {
        Self::start_with(scratch, source, url, poll, &[]).await
    }

    /// [`Relay::start`] with more options (`--batch 4`).
    async fn start_with(
        scratch: &Scratch,
        source: &str,
        url: &str,
        poll: &str,
        more: &[&str],
    ) -> Self {
        Self::start_as(scratch, source, url, poll, ADMIN_TOKEN, more).await
    }

    /// [`Relay::start_with`] with another token than the admin token.
    async fn start_as(
        scratch: &Scratch,
        source: &str,
        url: &str,
        poll: &str,
        token: &str,
        more: &[&str],
    ) -> Self {
        let mut args = [
            "relay",
            "--source",
            source,
            "--url",
            url,
            "--token",
            token,
            "--poll-interval",
            poll,
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(more.iter().map(|a| (*a).to_owned()));
        let log = scratch.path().join("relay.log");
        let child = spawn_relay(&args, &log);
        Self { child, args, log }
    }

    async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    async fn restart(&mut self) {
        self.kill9().await;
        self.child = spawn_relay(&self.args, &self.log);
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the relay has connected to its outbox `times` times in all (its log says
    /// so): it has asked Hooklane about its token (`GET /v1/whoami`) before, so the next
    /// answer it gets is a publish's.
    async fn connected(&self, times: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if self
                .log_text()
                .matches("relay connected to the outbox")
                .count()
                >= times
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// The relay's exit status once it has ended, within `within` of now; `None` if it still
    /// runs then (it is left running).
    async fn exit_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .ok()
            .map(|status| status.expect("wait for the relay"))
    }

    /// Rows the relay found published already (`already_there=N` summed): republished after
    /// a kill between the publish and the mark.
    fn republished(&self) -> usize {
        self.log_text()
            .lines()
            .filter_map(|l| l.split("already_there=").nth(1))
            .filter_map(|rest| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .sum()
    }
}

fn spawn_relay(args: &[String], log: &Path) -> Child {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("relay log");
    Command::new(env!("CARGO_BIN_EXE_hooklane"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn hooklane relay")
}

/// A TCP proxy to the API. Armed, it keeps the next answer that comes back from the API
/// (which has committed the events by then) from reaching the relay, and says so.
struct HoldingProxy {
    url: String,
    hold: Arc<AtomicBool>,
    held: Arc<Notify>,
}

impl HoldingProxy {
    async fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .parse()
            .expect("the API's address");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let hold = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Notify::new());
        let (hold_flag, held_signal) = (hold.clone(), held.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                let (hold, held) = (hold_flag.clone(), held_signal.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match server_read.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if hold.swap(false, Ordering::SeqCst) {
                            held.notify_one();
                            tokio::time::sleep(Duration::from_secs(60)).await;
                            return;
                        }
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { url, hold, held }
    }

    /// Holds the next answer; returns once one is held.
    async fn hold_next_answer(&self) -> bool {
        self.hold.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(15), self.held.notified())
            .await
            .is_ok()
    }
}

// ---------------------------------------------------------------------------------------------

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Inserts `count` orders, one business transaction each (the order and its outbox row),
/// from `writers` connections at once; returns each row id with the time its commit returned.
async fn place_orders(
    url: &str,
    prefix: &str,
    count: usize,
    writers: usize,
    pause: Duration,
) -> Vec<(String, i64)> {
    let committed = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let (url, prefix, committed) = (url.to_owned(), prefix.to_owned(), committed.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&url).await;
            for n in (writer..count).step_by(writers) {
                let order = format!("{prefix}_{n:04}");
                let id = format!("{order}.placed");
                let transaction = client.transaction().await.expect("begin");
                transaction
                    .execute(
                        "INSERT INTO orders (id, total) VALUES ($1, $2)",
                        &[&order, &(n as i32)],
                    )
                    .await
                    .expect("insert order");
                transaction
                    .execute(
                        "INSERT INTO hooklane_outbox (id, account_id, type, data) \
                         VALUES ($1, 'acme', 'order.placed', jsonb_build_object('order', $2::text, 'total', $3::int))",
                        &[&id, &order, &(n as i32)],
                    )
                    .await
                    .expect("insert outbox row");
                transaction.commit().await.expect("commit");
                committed.lock().unwrap().push((id, now_micros()));
                tokio::time::sleep(pause).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    let done = committed.lock().unwrap().clone();
    done
}

async fn unsent(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM hooklane_outbox WHERE sent_at IS NULL AND error IS NULL",
            &[],
        )
        .await
        .expect("count unsent")
        .get(0)
}

async fn wait_all_sent(client: &tokio_postgres::Client, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if unsent(client).await == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unsent(client).await == 0
}

/// How many deliveries each event of `acme` has in the delivery log (one endpoint: one
/// delivery per event, so a second event for a row would show as a second entry).
async fn deliveries_by_event(server: &Server) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for delivery in server.deliveries("acme", "").await {
        let id = delivery["event_id"].as_str().unwrap_or_default().to_owned();
        *counts.entry(id).or_default() += 1;
    }
    counts
}

async fn embedded(scratch: &Scratch, farm: &Farm) -> (Server, String) {
    let server = Server::start(scratch, &[]).await;
    server.create_account("acme").await;
    let (_, secret) = server
        .create_endpoint("acme", &farm.url("relay"), json!({}))
        .await;
    (server, secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_rows_are_published_within_50_ms_and_rolled_back_ones_never() {
    let started = Instant::now();
    let url = database("relay_latency").await;
    let scratch = Scratch::new("relay-latency");
    let farm = Farm::start().await.expect("farm");
    let (server, secret) = embedded(&scratch, &farm).await;
    let relay = Relay::start(&scratch, &url, &server.base, "1s").await;
    let client = connect(&url).await;

    // The page's business transaction, as written there.
    let documented =
        std::fs::read_to_string(Path::new(DOCS).join("postgres-transaction.sql")).expect("sql");
    client
        .batch_execute(&documented)
        .await
        .expect("the documented transaction");
    // A transaction that rolls back: its row never existed.
    client
        .batch_execute(
            "BEGIN; INSERT INTO orders VALUES ('ord_rolled_back', 1); \
             INSERT INTO hooklane_outbox (id, account_id, type, data) \
             VALUES ('ord_rolled_back.placed', 'acme', 'order.placed', '{}'); ROLLBACK;",
        )
        .await
        .expect("rolled back");
    // Rows Hooklane refuses: marked with the reason, and the rest goes on.
    client
        .batch_execute(
            "INSERT INTO hooklane_outbox (id, account_id, type, data) VALUES \
             ('bad_type.1', 'acme', 'not a type', '{}'), \
             ('bad_account.1', 'no-such-account', 'order.placed', '{}'), \
             ('bad_path.1', 'acme/events/batch#', 'order.placed', '{}')",
        )
        .await
        .expect("refused rows");

    // Four writers, 200 business transactions in about a second.
    let rows = 200;
    let committed = place_orders(&url, "ord_pg", rows, 4, Duration::from_millis(15)).await;
    assert!(
        wait_all_sent(&client, Duration::from_secs(30)).await,
        "rows left unsent; relay log:\n{}",
        relay.log_text()
    );
    let sent: HashMap<String, i64> = client
        .query(
            "SELECT id, (extract(epoch from sent_at) * 1000000)::bigint FROM hooklane_outbox \
             WHERE sent_at IS NOT NULL",
            &[],
        )
        .await
        .expect("sent rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut latencies: Vec<f64> = committed
        .iter()
        .map(|(id, at)| (sent[id] - at).max(0) as f64 / 1000.0)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let (p50, p99, max) = (
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        percentile(&latencies, 100.0),
    );
    println!(
        "relay postgres: {rows} rows, commit -> published and marked sent: p50 {p50:.1} ms, \
         p99 {p99:.1} ms, max {max:.1} ms (LISTEN/NOTIFY; poll every 1 s)"
    );

    let expected: HashSet<String> = committed
        .iter()
        .map(|(id, _)| id.clone())
        .chain(["ord_1001.placed".to_owned()])
        .collect();
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| f
            .distinct_ids_succeeded("relay")
            == expected.len())
            .await,
        "{} of {} webhooks arrived; relay log:\n{}",
        farm.distinct_ids_succeeded("relay"),
        expected.len(),
        relay.log_text()
    );
    let secret = hooklane::signing::SigningSecret::parse(&secret).expect("secret");
    for arrival in farm.arrivals("relay") {
        let id = arrival.webhook_id.clone().expect("webhook-id");
        assert!(expected.contains(&id), "unexpected webhook {id}");
        let verified = hooklane::signing::verify(
            &[&secret],
            &id,
            arrival.webhook_timestamp.as_deref().expect("timestamp"),
            arrival.webhook_signature.as_deref().expect("signature"),
            &arrival.body,
            chrono::Utc::now().timestamp(),
            300,
        );
        assert_eq!(verified, Ok(()), "{id} is not signed");
    }
    let (status, _) = server
        .get("/v1/accounts/acme/events/ord_rolled_back.placed")
        .await;
    assert_eq!(status, 404, "a rolled-back row was published");
    let errors: HashMap<String, Option<String>> = client
        .query(
            "SELECT id, error FROM hooklane_outbox WHERE id LIKE 'bad_%'",
            &[],
        )
        .await
        .expect("refused rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(
        errors["bad_type.1"]
            .as_deref()
            .is_some_and(|e| e.contains("type")),
        "{errors:?}"
    );
    assert!(
        errors["bad_account.1"]
            .as_deref()
            .is_some_and(|e| e.contains("no-such-account")),
        "{errors:?}"
    );
    // An account id that would address another route (or account) in the URL is refused
    // before it is sent, not published where the URL leads.
    assert!(
        errors["bad_path.1"]
            .as_deref()
            .is_some_and(|e| e.contains("not an account id")),
        "{errors:?}"
    );
    let counts = deliveries_by_event(&server).await;
    assert_eq!(counts.len(), expected.len());
    assert!(counts.values().all(|&n| n == 1), "one event per row");
    // Budget for a busy 2-core machine: the target, 50 ms, is what a quiet one shows
    // (docs/OUTBOX.md); a relay that fell back to polling would be at ~1000 ms.
    assert!(
        p99 <= 250.0,
        "commit -> publish p99 {p99:.1} ms: the relay is not woken by NOTIFY"
    );
    println!(
        "relay postgres: {} events published once each, the rolled-back row never, 3 refused rows \
         marked ({:.1} s)",
        counts.len(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_at_any_point_loses_no_row_and_makes_no_second_event() {
    let started = Instant::now();
    let url = database("relay_kill").await;
    let scratch = Scratch::new("relay-kill");
    let farm = Farm::start().await.expect("farm");
    let (server, _) = embedded(&scratch, &farm).await;
    let proxy = HoldingProxy::start(&server.base).await;
    let mut relay = Relay::start(&scratch, &url, &proxy.url, "1s").await;
    let client = connect(&url).await;

    let rows = 300;
    let writing = {
        let url = url.clone();
        tokio::spawn(async move {
            place_orders(&url, "ord_kill", rows, 2, Duration::from_millis(12)).await
        })
    };
    let mut kills = Vec::new();
    for round in 0..4 {
        if round % 2 == 0 {
            // Hooklane has the events, the relay has not heard: the rows stay unsent. The
            // answer held is a publish's, not the one to the relay's check of its token.
            assert!(
                relay.connected(round + 1).await,
                "the relay did not connect; relay log:\n{}",
                relay.log_text()
            );
            assert!(
                proxy.hold_next_answer().await,
                "no publish to hold; relay log:\n{}",
                relay.log_text()
            );
            kills.push("after Hooklane committed the publish, before the relay marked the rows");
        } else {
            let pause = 50 + rand::random::<u64>() % 250;
            tokio::time::sleep(Duration::from_millis(pause)).await;
            kills.push("at a random moment while rows flow");
        }
        relay.kill9().await;
        let unsent_now = unsent(&client).await;
        println!(
            "relay kill -9 #{}: {}; {unsent_now} rows unsent at the kill",
            round + 1,
            kills[round]
        );
        relay.restart().await;
    }
    let committed = writing.await.expect("writers");
    assert_eq!(committed.len(), rows);
    assert!(
        wait_all_sent(&client, Duration::from_secs(60)).await,
        "rows left unsent after the restarts; relay log:\n{}",
        relay.log_text()
    );
    assert!(
        farm.wait_until(Duration::from_secs(60), |f| f
            .distinct_ids_succeeded("relay")
            == rows)
            .await,
        "{} of {rows} rows arrived; relay log:\n{}",
        farm.distinct_ids_succeeded("relay"),
        relay.log_text()
    );
    let counts = deliveries_by_event(&server).await;
    let events = counts.len();
    let second_events = counts.values().filter(|&&n| n > 1).count();
    let ids: HashSet<String> = committed.into_iter().map(|(id, _)| id).collect();
    let arrivals = farm.arrivals("relay").len();
    let republished = relay.republished();
    println!(
        "relay kill -9: {rows} rows, {} kills, {republished} rows published again after a kill \
         (found already there), {events} events, {second_events} second events, {arrivals} \
         webhook requests for {rows} rows, {:.1} s",
        kills.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(events, rows, "one event per row");
    assert_eq!(counts.keys().cloned().collect::<HashSet<_>>(), ids);
    assert_eq!(second_events, 0, "a row made a second event");
    assert!(
        republished > 0,
        "the kills after a committed publish must have left rows to publish again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_outbox_is_published_by_polling_through_a_kill() {
    let started = Instant::now();
    let scratch = Scratch::new("relay-sqlite");
    let farm = Farm::start().await.expect("farm");
    let (server, _) = embedded(&scratch, &farm).await;
    let file = scratch.path().join("platform.db");
    {
        let db = rusqlite::Connection::open(&file).expect("sqlite");
        db.pragma_update(None, "journal_mode", "WAL").expect("wal");
        let ddl = std::fs::read_to_string(Path::new(DOCS).join("sqlite.sql")).expect("ddl");
        db.execute_batch(&ddl).expect("docs/outbox/sqlite.sql");
        // SQLite takes a NULL key and any type in any column unless told not to: the table
        // refuses a row the relay could not read as text, which would stop it at that row.
        let insert = "INSERT INTO hooklane_outbox (id, account_id, type, data) VALUES (?1, 'acme', 'a.b', ?2)";
        let null_id = db.execute(insert, rusqlite::params![None::<String>, "{}"]);
        let blob = db.execute(insert, rusqlite::params!["blob.1", b"{}".to_vec()]);
        assert!(null_id.is_err() && blob.is_err(), "{null_id:?} {blob:?}");
        db.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
            .expect("orders");
    }
    let source = format!("sqlite://{}", file.display());
    let mut relay = Relay::start(&scratch, &source, &server.base, "100ms").await;

    let rows = 60;
    let writer = {
        let file = file.clone();
        tokio::task::spawn_blocking(move || {
            let mut db = rusqlite::Connection::open(&file).expect("sqlite");
            db.busy_timeout(Duration::from_secs(10))
                .expect("busy timeout");
            let mut committed = Vec::new();
            for n in 0..rows {
                let order = format!("ord_lite_{n:03}");
                let id = format!("{order}.placed");
                let tx = db.transaction().expect("begin");
                tx.execute(
                    "INSERT INTO orders VALUES (?1, ?2)",
                    rusqlite::params![order, n],
                )
                .expect("order");
                tx.execute(
                    "INSERT INTO hooklane_outbox (id, account_id, type, data) \
                     VALUES (?1, 'acme', 'order.placed', json_object('order', ?2))",
                    rusqlite::params![id, order],
                )
                .expect("outbox row");
                if n == 7 {
                    tx.rollback().expect("rollback");
                    continue;
                }
                tx.commit().expect("commit");
                committed.push((id, now_micros()));
                std::thread::sleep(Duration::from_millis(15));
            }
            committed
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    relay.kill9().await;
    relay.restart().await;
    let committed = writer.await.expect("writer");
    assert!(
        farm.wait_until(Duration::from_secs(30), |f| f
            .distinct_ids_succeeded("relay")
            == committed.len())
            .await,
        "{} of {} rows arrived; relay log:\n{}",
        farm.distinct_ids_succeeded("relay"),
        committed.len(),
        relay.log_text()
    );
    let db = rusqlite::Connection::open(&file).expect("sqlite");
    let unsent: i64 = db
        .query_row(
            "SELECT count(*) FROM hooklane_outbox WHERE sent_at IS NULL",
            [],
            |r| r.get(0),
        )
        .expect("unsent");
    let counts = deliveries_by_event(&server).await;
    println!(
        "relay sqlite: {} rows (1 rolled back), 1 kill -9, {} events, {} published again after \
         the kill, {unsent} unsent, {:.1} s",
        committed.len(),
        counts.len(),
        relay.republished(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(counts.len(), committed.len(), "one event per committed row");
    assert!(counts.values().all(|&n| n == 1));
    assert!(
        !counts.contains_key("ord_lite_007.placed"),
        "the rolled-back row was published"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = unsent;
    while left > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = db
            .query_row(
                "SELECT count(*) FROM hooklane_outbox WHERE sent_at IS NULL",
                [],
                |r| r.get(0),
            )
            .expect("unsent");
    }
    assert_eq!(left, 0, "every row is marked sent");
}

// ---------------------------------------------------------------------------------------------
// Data that is not JSON is refused at the insert, with the business change.

/// `data` texts the documented tables refuse: what Python's `json.dumps` writes by default for
/// NaN and the infinities (JSON has neither), and text cut short. Once committed, such a row
/// would only be marked refused by the relay, its webhook never sent.
const NOT_JSON: [&str; 5] = [
    r#"{"total": NaN}"#,
    r#"{"total": Infinity}"#,
    r#"{"total": -Infinity}"#,
    r#"{"order": "ord_1""#,
    "",
];

/// Python inserting `json.dumps({"total": float("nan")})` (allow_nan is True by default) into
/// the table in `argv[1]`, in a transaction: what the database says.
const PYTHON_INSERTS_NAN: &str = r#"
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
try:
    with db:
        db.execute("INSERT INTO orders VALUES ('ord_nan', 1)")
        db.execute(
            "INSERT INTO hooklane_outbox (id, account_id, type, data) VALUES (?, ?, ?, ?)",
            ("ord_nan.placed", "acme", "order.placed", json.dumps({"total": float("nan")})),
        )
    print("inserted")
except sqlite3.IntegrityError as error:
    print("refused:", error)
print("orders:", db.execute("SELECT count(*) FROM orders").fetchone()[0])
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_that_is_not_json_is_refused_at_insert_sqlite() {
    let scratch = Scratch::new("relay-not-json-sqlite");
    let file = scratch.path().join("platform.db");
    let db = rusqlite::Connection::open(&file).expect("sqlite");
    let ddl = std::fs::read_to_string(Path::new(DOCS).join("sqlite.sql")).expect("ddl");
    db.execute_batch(&ddl).expect("docs/outbox/sqlite.sql");
    db.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
        .expect("orders");
    let insert =
        "INSERT INTO hooklane_outbox (id, account_id, type, data) VALUES (?1, 'acme', 'a.b', ?2)";
    for (n, data) in NOT_JSON.iter().enumerate() {
        let inserted = db.execute(insert, rusqlite::params![format!("bad.{n}"), data]);
        assert!(
            inserted
                .as_ref()
                .is_err_and(|e| e.to_string().contains("CHECK constraint failed")),
            "data {data:?}: {inserted:?}"
        );
    }
    db.execute(insert, rusqlite::params!["good.1", r#"{"total": 42.5}"#])
        .expect("JSON data");
    drop(db);
    // Python's own SQLite (another version than the bundled one), as a platform writes it.
    let output = std::process::Command::new(crate::support::test_python())
        .args(["-c", PYTHON_INSERTS_NAN])
        .arg(&file)
        .output()
        .expect("run python");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.starts_with("refused: CHECK constraint failed") && said.contains("orders: 0"),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// PostgreSQL's `jsonb` refuses the same texts itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_that_is_not_json_is_refused_at_insert_postgres() {
    let client = connect(&database("relay_not_json").await).await;
    for (n, data) in NOT_JSON.iter().enumerate() {
        let inserted = client
            .execute(
                "INSERT INTO hooklane_outbox (id, account_id, type, data) \
                 VALUES ($1, 'acme', 'a.b', $2::text::jsonb)",
                &[&format!("bad.{n}"), data],
            )
            .await;
        assert!(
            inserted
                .as_ref()
                .is_err_and(|e| format!("{e:?}").contains("invalid input syntax for type json")),
            "data {data:?}: {inserted:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// One account at its publish rate limit waits alone.

/// The outbox of the rate-limit tests, in either database.
enum Outbox {
    Sqlite(PathBuf),
    Postgres(tokio_postgres::Client),
}

impl Outbox {
    /// Adds a row created `at_ms` milliseconds into 2026 (under a minute): the test sets the
    /// order the relay reads the rows in.
    async fn insert(&self, id: &str, account: &str, at_ms: i64) {
        match self {
            Self::Sqlite(file) => {
                let db = rusqlite::Connection::open(file).expect("sqlite");
                db.busy_timeout(Duration::from_secs(10))
                    .expect("busy timeout");
                let at = format!("2026-01-01T00:00:{:02}.{:03}Z", at_ms / 1000, at_ms % 1000);
                db.execute(
                    "INSERT INTO hooklane_outbox (id, account_id, type, data, created_at) \
                     VALUES (?1, ?2, 'order.placed', json_object('row', ?1), ?3)",
                    rusqlite::params![id, account, at],
                )
                .expect("insert outbox row");
            }
            Self::Postgres(client) => {
                client
                    .execute(
                        "INSERT INTO hooklane_outbox (id, account_id, type, data, created_at) \
                         VALUES ($1, $2, 'order.placed', jsonb_build_object('row', $1::text), \
                         timestamptz '2026-01-01 00:00:00+00' + $3::bigint * interval '1 millisecond')",
                        &[&id, &account, &at_ms],
                    )
                    .await
                    .expect("insert outbox row");
            }
        }
    }

    /// The ids of the rows marked sent, and of those marked with an error.
    async fn marked(&self) -> (HashSet<String>, Vec<String>) {
        let rows: Vec<(String, bool, bool)> = match self {
            Self::Sqlite(file) => {
                let db = rusqlite::Connection::open(file).expect("sqlite");
                db.busy_timeout(Duration::from_secs(10))
                    .expect("busy timeout");
                let mut statement = db
                    .prepare(
                        "SELECT id, sent_at IS NOT NULL, error IS NOT NULL FROM hooklane_outbox",
                    )
                    .expect("select");
                let rows = statement
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .expect("query")
                    .collect::<Result<Vec<_>, _>>()
                    .expect("rows");
                rows
            }
            Self::Postgres(client) => client
                .query(
                    "SELECT id, sent_at IS NOT NULL, error IS NOT NULL FROM hooklane_outbox",
                    &[],
                )
                .await
                .expect("select")
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect(),
        };
        let sent = rows
            .iter()
            .filter(|(_, sent, _)| *sent)
            .map(|(id, _, _)| id.clone())
            .collect();
        let failed = rows
            .into_iter()
            .filter(|(_, _, failed)| *failed)
            .map(|(id, _, _)| id)
            .collect();
        (sent, failed)
    }
}

/// Account `hot` is at its publish rate limit (2 events/s, bursts of 1, its bucket emptied
/// just before: Hooklane answers its next publish 429 with `Retry-After: 8`), and its rows
/// are the oldest, enough to fill the relay's `--batch 4` read. Account `cool`'s rows must be
/// published meanwhile, rows written during the pause too; `hot`'s after its pause, in their
/// order (its rows marked sent are always its first ones, and its events were created in that
/// order), none marked failed, and `hot` asked again only when `Retry-After` says.
async fn a_rate_limited_account_waits_alone(scratch: &Scratch, outbox: Outbox, source: &str) {
    let started = Instant::now();
    let server = Server::start(scratch, &[]).await;
    server.create_account("cool").await;
    let (status, body) = server
        .post(
            "/v1/accounts",
            json!({"id": "hot", "name": "Hot", "owner_email": "owner@hot.example",
                   "publish_rate_limit": {"per_second": 2, "burst": 1}}),
        )
        .await;
    assert_eq!(status, 201, "create account hot: {body}");
    let hot: Vec<String> = (0..6).map(|n| format!("hot_{n:02}")).collect();
    let cool: Vec<String> = (0..6).map(|n| format!("cool_{n:02}")).collect();
    let late: Vec<String> = (0..2).map(|n| format!("cool_late_{n}")).collect();
    for (n, id) in hot.iter().enumerate() {
        outbox.insert(id, "hot", n as i64).await;
    }
    for (n, id) in cool.iter().enumerate() {
        outbox.insert(id, "cool", 100 + n as i64).await;
    }
    // 16 events taken from a bucket of 1 refilled at 2/s: hot may publish again in 8 s.
    let warmup: Vec<_> = (0..16)
        .map(|n| json!({"id": format!("warmup_{n}"), "type": "order.placed", "data": {}}))
        .collect();
    let (status, body) = server
        .post("/v1/accounts/hot/events/batch", json!({ "events": warmup }))
        .await;
    assert_eq!(status, 202, "warm-up batch: {body}");
    let (status, body) = server
        .post(
            "/v1/accounts/hot/events",
            json!({"id": "probe", "type": "order.placed", "data": {}}),
        )
        .await;
    assert_eq!(status, 429, "hot is at its limit: {body}");

    let limited_at = Instant::now();
    let relay = Relay::start_with(scratch, source, &server.base, "100ms", &["--batch", "4"]).await;
    // How many of hot's rows were sent when all of cool's were, and when the late ones were.
    let mut hot_sent_when_cool: Option<(usize, Duration)> = None;
    let mut hot_sent_when_late: Option<(usize, Duration)> = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (sent, failed) = outbox.marked().await;
        assert!(
            failed.is_empty(),
            "rows marked failed: {failed:?}; relay log:\n{}",
            relay.log_text()
        );
        let hot_sent = hot.iter().filter(|id| sent.contains(*id)).count();
        assert!(
            hot[..hot_sent].iter().all(|id| sent.contains(id)),
            "a later row of hot was published before an earlier one: sent {sent:?}"
        );
        if hot_sent_when_cool.is_none() && cool.iter().all(|id| sent.contains(id)) {
            hot_sent_when_cool = Some((hot_sent, limited_at.elapsed()));
            // Rows written while hot waits are read and published too.
            for (n, id) in late.iter().enumerate() {
                outbox.insert(id, "cool", 1000 + n as i64).await;
            }
        }
        if hot_sent_when_late.is_none() && late.iter().all(|id| sent.contains(id)) {
            hot_sent_when_late = Some((hot_sent, limited_at.elapsed()));
        }
        if sent.len() == hot.len() + cool.len() + late.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rows left unsent: {} of {} sent; relay log:\n{}",
            sent.len(),
            hot.len() + cool.len() + late.len(),
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all_sent = limited_at.elapsed();
    let (hot_then, cool_after) = hot_sent_when_cool.expect("cool's rows were sent");
    let (hot_later, late_after) = hot_sent_when_late.expect("the late rows were sent");
    let log = relay.log_text();
    println!(
        "relay 429 ({source_kind}): cool's 6 rows sent {:.1} s after hot hit its limit (hot: \
         {hot_then} sent then), 2 rows written meanwhile sent at {:.1} s (hot: {hot_later}), \
         all 14 at {:.1} s; {:.1} s in all",
        cool_after.as_secs_f64(),
        late_after.as_secs_f64(),
        all_sent.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        source_kind = if source.starts_with("sqlite") {
            "sqlite"
        } else {
            "postgres"
        },
    );
    assert_eq!(
        hot_then, 0,
        "cool's rows waited behind the rate-limited account hot: when they were published, \
         {hot_then} of hot's rows were too; relay log:\n{log}"
    );
    assert_eq!(
        hot_later, 0,
        "cool's rows written during hot's pause waited for it; relay log:\n{log}"
    );
    // Hooklane has every event, and hot's were created in the rows' order.
    let mut previous: Option<chrono::DateTime<chrono::FixedOffset>> = None;
    for id in &hot {
        let (status, event) = server.get(&format!("/v1/accounts/hot/events/{id}")).await;
        assert_eq!(status, 200, "{id}: {event}");
        let created =
            chrono::DateTime::parse_from_rfc3339(event["created_at"].as_str().expect("created_at"))
                .expect("an RFC 3339 time");
        assert!(
            previous.is_none_or(|p| p <= created),
            "{id} was created before an earlier row's event"
        );
        previous = Some(created);
    }
    for id in cool.iter().chain(&late) {
        let (status, event) = server.get(&format!("/v1/accounts/cool/events/{id}")).await;
        assert_eq!(status, 200, "{id}: {event}");
    }
    // An answer of the API is no reason to leave the database: one connection throughout.
    let connects = log.matches("relay connected to the outbox").count();
    assert_eq!(
        connects, 1,
        "the relay reconnected to its database; relay log:\n{log}"
    );
    // Retry-After honoured: hot asked once at the start (8 s) and once after its first batch
    // borrowed its next tokens (2 s); a 200 ms doubling backoff asks it six times in 8 s.
    let pauses = log
        .lines()
        .filter(|l| l.contains("paused") && l.contains("account=hot"))
        .count();
    assert!(
        (1..=3).contains(&pauses),
        "hot was refused {pauses} times; relay log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_account_waits_alone_sqlite() {
    let scratch = Scratch::new("relay-429-sqlite");
    let file = scratch.path().join("platform.db");
    {
        let db = rusqlite::Connection::open(&file).expect("sqlite");
        db.pragma_update(None, "journal_mode", "WAL").expect("wal");
        let ddl = std::fs::read_to_string(Path::new(DOCS).join("sqlite.sql")).expect("ddl");
        db.execute_batch(&ddl).expect("docs/outbox/sqlite.sql");
    }
    let source = format!("sqlite://{}", file.display());
    a_rate_limited_account_waits_alone(&scratch, Outbox::Sqlite(file), &source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_account_waits_alone_postgres() {
    let url = database("relay_rate_limited").await;
    let scratch = Scratch::new("relay-429-postgres");
    let client = connect(&url).await;
    a_rate_limited_account_waits_alone(&scratch, Outbox::Postgres(client), &url).await;
}

// ---------------------------------------------------------------------------------------------
// A token that can never publish stops the relay.

/// What the relay says when its token lacks `events:publish` (cli/src/relay/publish.rs).
const CANNOT_PUBLISH: &str = "the token cannot publish: it lacks events:publish; use the admin \
     token or an API key with events:publish";

/// An outbox with the documented SQLite table; the outbox and its `--source`.
fn sqlite_outbox(scratch: &Scratch) -> (Outbox, String) {
    let file = scratch.path().join("platform.db");
    let db = rusqlite::Connection::open(&file).expect("sqlite");
    db.pragma_update(None, "journal_mode", "WAL").expect("wal");
    let ddl = std::fs::read_to_string(Path::new(DOCS).join("sqlite.sql")).expect("ddl");
    db.execute_batch(&ddl).expect("docs/outbox/sqlite.sql");
    let source = format!("sqlite://{}", file.display());
    (Outbox::Sqlite(file), source)
}

/// Accounts `acme` and `globex`, and a row of each in the outbox (`globex`'s first).
async fn two_accounts_one_row_each(server: &Server, outbox: &Outbox) {
    server.create_account("acme").await;
    server.create_account("globex").await;
    outbox.insert("globex_1.placed", "globex", 0).await;
    outbox.insert("acme_1.placed", "acme", 1).await;
}

/// No row marked (sent, or refused for good) and no event in Hooklane.
async fn nothing_published(server: &Server, outbox: &Outbox, log: &str) {
    let (sent, failed) = outbox.marked().await;
    assert!(
        sent.is_empty() && failed.is_empty(),
        "rows marked: sent {sent:?}, failed {failed:?}; relay log:\n{log}"
    );
    for (account, id) in [("acme", "acme_1.placed"), ("globex", "globex_1.placed")] {
        let (status, event) = server
            .get(&format!("/v1/accounts/{account}/events/{id}"))
            .await;
        assert_eq!(status, 404, "{id} was published: {event}");
    }
}

/// A relay given an account token (account tokens never hold `events:publish`: only the admin
/// token and API keys with it publish) stops at once, with a non-zero exit and an error that
/// names the fix, rather than retrying for ever. No row is marked: not `acme`'s, and not
/// `globex`'s either, which the token, limited to `acme`, would get "account not found" for.
async fn a_token_that_cannot_publish_stops_the_relay(
    scratch: &Scratch,
    outbox: Outbox,
    source: &str,
) {
    let server = Server::start(scratch, &[]).await;
    two_accounts_one_row_each(&server, &outbox).await;
    let (status, minted) = server
        .post("/v1/accounts/acme/tokens", json!({"ttl_seconds": 600}))
        .await;
    assert_eq!(status, 201, "{minted}");
    let token = minted["token"].as_str().expect("the token");
    let started = Instant::now();
    let mut relay = Relay::start_as(scratch, source, &server.base, "100ms", token, &[]).await;
    let Some(exit) = relay.exit_within(Duration::from_secs(10)).await else {
        panic!(
            "the relay still runs 10 s after it started with an account token; relay log:\n{}",
            relay.log_text()
        );
    };
    let log = relay.log_text();
    println!(
        "relay with an account token: exited ({exit}) after {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert!(!exit.success(), "the relay exited with {exit}; log:\n{log}");
    assert!(
        log.contains(&format!("hooklane: relay: {CANNOT_PUBLISH}")),
        "the relay's error does not name the fix; log:\n{log}"
    );
    nothing_published(&server, &outbox, &log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_cannot_publish_stops_the_relay_sqlite() {
    let scratch = Scratch::new("relay-forbidden-sqlite");
    let (outbox, source) = sqlite_outbox(&scratch);
    a_token_that_cannot_publish_stops_the_relay(&scratch, outbox, &source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_cannot_publish_stops_the_relay_postgres() {
    let url = database("relay_forbidden").await;
    let scratch = Scratch::new("relay-forbidden-postgres");
    let client = connect(&url).await;
    a_token_that_cannot_publish_stops_the_relay(&scratch, Outbox::Postgres(client), &url).await;
}

/// A revoked API key (Hooklane's 401): the relay tries again for 10 s (an API instance may
/// refuse an admin token just rotated in until its credential cache expires, 5 s at most),
/// then stops with a non-zero exit, saying the token is refused; no row is marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_refused_for_good_stops_the_relay() {
    let scratch = Scratch::new("relay-refused");
    let (outbox, source) = sqlite_outbox(&scratch);
    let server = Server::start(&scratch, &[]).await;
    two_accounts_one_row_each(&server, &outbox).await;
    let (status, key) = server
        .post(
            "/v1/keys",
            json!({"name": "relay", "scopes": ["events:publish"]}),
        )
        .await;
    assert_eq!(status, 201, "{key}");
    let credential = key["secret"].as_str().expect("the key's secret");
    let id = key["id"].as_str().expect("the key's id");
    let (status, body) = server
        .request(reqwest::Method::DELETE, &format!("/v1/keys/{id}"), None)
        .await;
    assert_eq!(status, 200, "revoke the key: {body}");
    let started = Instant::now();
    let mut relay =
        Relay::start_as(&scratch, &source, &server.base, "100ms", credential, &[]).await;
    let Some(exit) = relay.exit_within(Duration::from_secs(30)).await else {
        panic!(
            "the relay still runs 30 s after it started with a revoked key; relay log:\n{}",
            relay.log_text()
        );
    };
    let took = started.elapsed();
    let log = relay.log_text();
    println!(
        "relay with a revoked key: exited ({exit}) after {:.1} s",
        took.as_secs_f64()
    );
    assert!(!exit.success(), "the relay exited with {exit}; log:\n{log}");
    assert!(
        took >= Duration::from_secs(10),
        "the relay stopped after {took:?}, before its 10 s of grace; log:\n{log}"
    );
    assert!(
        log.contains(
            "hooklane: relay: Hooklane refused the token (HTTP 401: credential has been revoked)"
        ),
        "log:\n{log}"
    );
    nothing_published(&server, &outbox, &log).await;
}

// ---------------------------------------------------------------------------------------------
// A row whose id is already another event is set aside.

/// A row whose id Hooklane already holds as another event (here: published through the API
/// with other data) is answered 409 `conflict` naming it in the batch: the relay marks that
/// row with the reason and publishes the rows around it, never retrying it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_id_is_another_event_is_marked_refused_and_the_others_published() {
    let scratch = Scratch::new("relay-conflict");
    let (outbox, source) = sqlite_outbox(&scratch);
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let (status, body) = server
        .post(
            "/v1/accounts/acme/events",
            json!({"id": "acme_2.placed", "type": "order.placed", "data": {"row": "another"}}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    for (n, id) in ["acme_1.placed", "acme_2.placed", "acme_3.placed"]
        .iter()
        .enumerate()
    {
        outbox.insert(id, "acme", n as i64).await;
    }
    let relay = Relay::start(&scratch, &source, &server.base, "100ms").await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut sent, mut failed) = outbox.marked().await;
    while sent.len() + failed.len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        (sent, failed) = outbox.marked().await;
    }
    let log = relay.log_text();
    assert_eq!(
        sent,
        HashSet::from(["acme_1.placed".to_owned(), "acme_3.placed".to_owned()]),
        "relay log:\n{log}"
    );
    assert_eq!(failed, ["acme_2.placed"], "relay log:\n{log}");
    let Outbox::Sqlite(file) = &outbox else {
        unreachable!("a SQLite outbox")
    };
    let error: String = rusqlite::Connection::open(file)
        .expect("sqlite")
        .query_row(
            "SELECT error FROM hooklane_outbox WHERE id = 'acme_2.placed'",
            [],
            |r| r.get(0),
        )
        .expect("the refused row");
    assert!(
        error.contains("HTTP 409")
            && error.contains("event `acme_2.placed` was already published with other data"),
        "{error}"
    );
    let (status, stored) = server.get("/v1/accounts/acme/events/acme_2.placed").await;
    assert_eq!(status, 200);
    assert_eq!(
        stored["data"],
        json!({"row": "another"}),
        "the first event stays"
    );
    for id in ["acme_1.placed", "acme_3.placed"] {
        let (status, event) = server.get(&format!("/v1/accounts/acme/events/{id}")).await;
        assert_eq!((status, &event["data"]), (200, &json!({"row": id})));
    }
}
