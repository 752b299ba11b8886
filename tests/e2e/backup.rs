//! The embedded shape's file kept safe, as docs/OPERATIONS.md tells operators: its backup and
//! restore commands (the code blocks after `<!-- run by tests/e2e/backup.rs: NAME -->`) run
//! here against a `serve` under traffic, and a file of a newer schema version is refused.
//!
//! The commands use the `sqlite3` CLI (Debian's `sqlite3` package, on the machine); without it
//! the test fails, never skips.

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use hooklane_testkit::farm::Farm;
use serde_json::json;

use crate::support::{Scratch, Server, ADMIN_TOKEN};

const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/OPERATIONS.md");
/// Where the page's commands put backups; the tests put a directory of their own there.
const BACKUPS: &str = "/backups/";
/// How long the documented backup may take here.
const BACKUP_LIMIT: Duration = Duration::from_secs(30);
/// Events written straight into the file before the test's traffic, of some 3 KB each: a
/// file of tens of MB, as a backup of a real one copies while commits go on. (The CLI's
/// `.backup` restarts at each commit of another process, and on such a file never ends.)
const BULK_EVENTS: u32 = 20_000;

/// The code block right after `<!-- run by tests/e2e/backup.rs: NAME -->` on the page.
fn documented(name: &str) -> String {
    let page = std::fs::read_to_string(PAGE).expect("read docs/OPERATIONS.md");
    let marker = format!("<!-- run by tests/e2e/backup.rs: {name} -->");
    let mut lines = page
        .lines()
        .skip_while(|line| line.trim_end() != marker)
        .skip(1);
    let fence = lines.next().unwrap_or_else(|| {
        panic!("docs/OPERATIONS.md has no `{marker}` followed by the {name} commands")
    });
    assert!(
        fence.starts_with("```"),
        "docs/OPERATIONS.md: no code block right after `{marker}`"
    );
    let block: Vec<&str> = lines.take_while(|line| !line.starts_with("```")).collect();
    block.join("\n") + "\n"
}

/// Fails the test unless the `sqlite3` CLI runs: the documented commands need it.
fn require_sqlite3() {
    let version = std::process::Command::new("sqlite3")
        .arg("-version")
        .output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "the sqlite3 CLI does not run ({version:?}): docs/OPERATIONS.md backs up with it; \
         install Debian's sqlite3 package"
    );
}

/// Runs a documented block with `sh -e` in `dir` (the database's directory), its
/// [`BACKUPS`] in `backups`; fails the test if it fails or takes longer than `limit` (then
/// ending it with what it started).
async fn run_block(block: &str, dir: &Path, backups: &Path, limit: Duration) {
    let script = block.replace(BACKUPS, &format!("{}/", backups.display()));
    let shell = tokio::process::Command::new("sh")
        .arg("-ec")
        .arg(&script)
        .current_dir(dir)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run sh");
    let group = shell.id().expect("the shell's pid");
    let Ok(output) = tokio::time::timeout(limit, shell.wait_with_output()).await else {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{group}")])
            .status();
        panic!("had not finished after {limit:?}:\n{script}");
    };
    let output = output.expect("run sh");
    assert!(
        output.status.success(),
        "{script}\nexited with {}: {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Events the traffic had acknowledged, with when their answer came.
type Acknowledged = Arc<Mutex<Vec<(String, Instant)>>>;

/// Publishes to acme until `stop`, recording each acknowledged event; returns the count of
/// publishes not answered 202.
async fn publish_until(base: String, stop: Arc<AtomicBool>, acknowledged: Acknowledged) -> usize {
    let http = reqwest::Client::new();
    let padding = "x".repeat(2_000);
    let (mut n, mut refused) = (0u64, 0);
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let answer = http
            .post(format!("{base}/v1/accounts/acme/events"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"type": "order.created", "data": {"n": n, "padding": padding}}))
            .send()
            .await;
        let at = Instant::now();
        match answer {
            Ok(answer) if answer.status() == 202 => {
                let body: serde_json::Value = answer.json().await.expect("publish answer");
                let id = body["id"].as_str().expect("event id").to_owned();
                acknowledged.lock().unwrap().push((id, at));
            }
            _ => refused += 1,
        }
    }
    refused
}

/// The ids of acme's events in a SQLite file, after checking it whole.
fn events_in(file: &Path) -> std::collections::HashSet<String> {
    let db = rusqlite::Connection::open(file).expect("open the backup");
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok", "the backup {} is not sound", file.display());
    let mut statement = db
        .prepare("SELECT id FROM events WHERE account_id = 'acme'")
        .expect("events of the backup");
    let ids = statement
        .query_map([], |r| r.get(0))
        .expect("events of the backup")
        .collect::<Result<_, _>>()
        .expect("events of the backup");
    ids
}

fn wal_of(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_backup_under_traffic_restores_every_acknowledged_event() {
    require_sqlite3();
    let (backup_block, restore_block) = (documented("backup"), documented("restore"));
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new("backup");
    let backups = scratch.path().join("backups");
    std::fs::create_dir_all(&backups).expect("backups directory");
    let mut server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    server.farm_endpoints("acme", &farm, ["backup"]).await;
    server.create_account("bulk").await;
    assert!(server.terminate().await.success(), "serve stopped cleanly");
    rusqlite::Connection::open(&server.database)
        .expect("open the file")
        .execute_batch(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {BULK_EVENTS}) \
             INSERT INTO events (account_id, id, type, created_at, payload) \
             SELECT 'bulk', 'evt_bulk_' || i, 'bulk.filled', CAST(unixepoch('subsec') * 1000 AS INTEGER), \
             json_object('padding', hex(randomblob(1500))) FROM n;"
        ))
        .expect("fill the file");
    server.restart().await;
    let size = std::fs::metadata(&server.database).map_or(0, |m| m.len());

    // Publishes (and their deliveries' attempts) commit throughout the backup.
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Acknowledged::default();
    let traffic_started = Instant::now();
    let traffic: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(publish_until(
                server.base.clone(),
                Arc::clone(&stop),
                Arc::clone(&acknowledged),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let started = Instant::now();
    run_block(&backup_block, scratch.path(), &backups, BACKUP_LIMIT).await;
    let ended = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop.store(true, Ordering::Relaxed);
    for task in traffic {
        assert_eq!(
            task.await.expect("traffic"),
            0,
            "a publish was not answered 202"
        );
    }
    let traffic_took = traffic_started.elapsed();
    let acknowledged = acknowledged.lock().unwrap().clone();
    let before: Vec<&String> = acknowledged
        .iter()
        .filter(|(_, at)| *at < started)
        .map(|(id, _)| id)
        .collect();
    let after: Vec<&String> = acknowledged
        .iter()
        .filter(|(_, at)| *at > ended)
        .map(|(id, _)| id)
        .collect();
    assert!(
        !before.is_empty() && !after.is_empty(),
        "traffic before and after the backup: {} and {}",
        before.len(),
        after.len()
    );
    let made: Vec<PathBuf> = std::fs::read_dir(&backups)
        .expect("backups directory")
        .map(|entry| entry.expect("backup").path())
        .collect();
    let [backup] = made.as_slice() else {
        panic!("the backup commands made {made:?}, not one file");
    };
    let kept = events_in(backup);
    let missing: Vec<&&String> = before.iter().filter(|id| !kept.contains(**id)).collect();
    assert!(
        missing.is_empty(),
        "the backup lacks {} of the {} events acknowledged before it started: {missing:?}",
        missing.len(),
        before.len()
    );
    println!(
        "backup: the documented backup of a {} MB file took {} ms beside {:.0} publishes/s; it \
         holds all {} events acknowledged before it",
        size / 1_000_000,
        (ended - started).as_millis(),
        acknowledged.len() as f64 / traffic_took.as_secs_f64(),
        before.len()
    );

    // A crash leaves the WAL beside the file; the documented restore puts the backup in place.
    server.kill9().await;
    let wal = std::fs::metadata(wal_of(&server.database)).map(|m| m.len());
    assert!(
        wal.as_ref().is_ok_and(|len| *len > 0),
        "kill -9 left no WAL to restore beside: {wal:?}"
    );
    let named = restore_block
        .split_whitespace()
        .find_map(|word| word.strip_prefix(BACKUPS))
        .expect("the restore commands name a backup under /backups/");
    std::fs::rename(backup, backups.join(named)).expect("name the backup as the page does");
    run_block(&restore_block, scratch.path(), &backups, BACKUP_LIMIT).await;
    server.restart().await;
    for id in &before {
        let (status, event) = server.get(&format!("/v1/accounts/acme/events/{id}")).await;
        assert_eq!(
            status, 200,
            "event {id}, acknowledged before the backup: {event}"
        );
    }
    for id in &after {
        let (status, event) = server.get(&format!("/v1/accounts/acme/events/{id}")).await;
        assert_eq!(
            status, 404,
            "event {id}, published after the backup, is in the restored file: {event}"
        );
    }
}

#[tokio::test]
async fn serve_refuses_a_file_of_a_newer_schema_version_before_listening() {
    let scratch = Scratch::new("newer-schema");
    let mut server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    assert!(server.terminate().await.success(), "serve stopped cleanly");
    let newer = 1_000;
    let ours: i32 = {
        let db = rusqlite::Connection::open(&server.database).expect("open the file");
        let ours = db
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("user_version");
        db.pragma_update(None, "user_version", newer)
            .expect("stamp a newer version");
        ours
    };
    let serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_hooklane"))
        .arg("serve")
        .env("HOOKLANE_LISTEN", "127.0.0.1:0")
        .env("HOOKLANE_DATABASE", &server.database)
        .env("HOOKLANE_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn serve");
    let output = tokio::time::timeout(Duration::from_secs(15), serve.wait_with_output())
        .await
        .unwrap_or_else(|_| {
            panic!("serve kept running on a file of schema version {newer} (this build: {ours})")
        })
        .expect("serve output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(2), "{stdout}{stderr}");
    assert!(!stdout.contains("listening"), "{stdout}");
    for part in [
        format!("schema version {newer}"),
        format!("up to {ours}"),
        "newer hooklane".to_owned(),
    ] {
        assert!(stderr.contains(&part), "{part:?} is not in: {stderr}");
    }
    let db = rusqlite::Connection::open(&server.database).expect("open the file");
    let version: i32 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("user_version");
    assert_eq!(version, newer, "the refused file was changed");
}
