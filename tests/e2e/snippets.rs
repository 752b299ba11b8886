//! The verification snippets of docs/VERIFYING.md, run against webhooks that `serve` really
//! sent. Each snippet is a file under docs/verifying/ and the page's code blocks must be those
//! files byte for byte, so what customers copy is what runs here. Python, Node.js, Go and Ruby
//! run as small command-line programs; the Rust snippet is compiled into this test.
//!
//! A missing interpreter or toolchain fails the test: scripts/test-env installs Go and Ruby,
//! Node.js comes with the machine, Python is the test venv.

#[path = "../../docs/verifying/verify.rs"]
mod rust_snippet;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use hooklane::signing::SigningSecret;
use hooklane_testkit::farm::{Arrival, Farm};
use serde_json::json;

use crate::support::{test_python, Scratch, Server};

const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs");
const PAGE: &str = "VERIFYING.md";
/// Set to 1 to rewrite the page's code blocks from docs/verifying/ instead of failing.
const BLESS: &str = "HOOKLANE_BLESS_DOCS";
/// The marker that ties the fenced code block after it to a file under docs/.
const MARKER_START: &str = "<!-- snippet: ";
const SNIPPET_FILES: [&str; 5] = [
    "verifying/verify.py",
    "verifying/verify.mjs",
    "verifying/verify.go",
    "verifying/verify.rb",
    "verifying/verify.rs",
];

// ---------------------------------------------------------------------------------------------
// The page and the files cannot drift.

/// The code block languages of docs/VERIFYING.md's snippets.
const LANGUAGES: [&str; 6] = ["python", "js", "javascript", "go", "ruby", "rust"];

/// The page with the code block after every `<!-- snippet: FILE -->` marker replaced by FILE.
/// Errors name markers without a file or a code block, and code blocks in one of `languages`
/// that have no marker (untested code on the page).
pub(crate) fn synced_page(
    page: &str,
    languages: &[&str],
    read: impl Fn(&str) -> std::io::Result<String>,
) -> Result<String, String> {
    let lines: Vec<&str> = page.split_inclusive('\n').collect();
    let mut out = String::with_capacity(page.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        out.push_str(line);
        i += 1;
        let trimmed = line.trim_end();
        if let Some(rest) = trimmed.strip_prefix(MARKER_START) {
            let file = rest
                .strip_suffix(" -->")
                .ok_or_else(|| format!("malformed marker: {trimmed}"))?;
            let content = read(file).map_err(|e| format!("{file}: {e}"))?;
            let fence = lines
                .get(i)
                .filter(|l| l.starts_with("```"))
                .ok_or_else(|| format!("no code block right after the marker for {file}"))?;
            out.push_str(fence);
            let end = (i + 1..lines.len())
                .find(|&j| lines[j].trim_end() == "```")
                .ok_or_else(|| format!("the code block for {file} is not closed"))?;
            out.push_str(&content);
            if !content.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(lines[end]);
            i = end + 1;
        } else if let Some(info) = trimmed.strip_prefix("```") {
            let language = info.split_whitespace().next().unwrap_or("");
            if languages.contains(&language) {
                return Err(format!(
                    "a {language} code block without a `{MARKER_START}FILE -->` marker: \
                     every snippet on the page must be a tested file"
                ));
            }
            // Copy other blocks (shell, text) as they are, so a marker inside is not read.
            while i < lines.len() {
                out.push_str(lines[i]);
                i += 1;
                if lines[i - 1].trim_end() == "```" {
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// docs/`page` shows each of `files` (under docs/) exactly once, and its code blocks in
/// `languages` are those files byte for byte. With `HOOKLANE_BLESS_DOCS=1`, a page that
/// differs is rewritten from the files instead (`folder` names where they are).
pub(crate) fn assert_page_shows_exactly(
    page_name: &str,
    files: &[&str],
    languages: &[&str],
    folder: &str,
) {
    let page_path = Path::new(DOCS).join(page_name);
    let page = std::fs::read_to_string(&page_path)
        .unwrap_or_else(|e| panic!("read docs/{page_name}: {e}"));
    for file in files {
        assert_eq!(
            page.matches(&format!("{MARKER_START}{file} -->")).count(),
            1,
            "docs/{page_name} must show docs/{file} exactly once"
        );
    }
    let synced = synced_page(&page, languages, |file| {
        std::fs::read_to_string(Path::new(DOCS).join(file))
    })
    .unwrap_or_else(|e| panic!("docs/{page_name}: {e}"));
    if synced != page && std::env::var(BLESS).as_deref() == Ok("1") {
        std::fs::write(&page_path, &synced).expect("rewrite the page");
        return;
    }
    assert!(
        synced == page,
        "docs/{page_name} differs from the files under docs/{folder}/ (edit the files, then run \
         this test with {BLESS}=1 to copy them into the page)"
    );
}

#[test]
fn verifying_md_shows_exactly_the_tested_snippet_files() {
    assert_page_shows_exactly(PAGE, &SNIPPET_FILES, &LANGUAGES, "verifying");
}

/// The example request on the page is really signed with the example secret it names.
#[test]
fn the_example_webhook_on_the_page_is_signed_with_the_example_secret() {
    const EXAMPLE_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let page = std::fs::read_to_string(Path::new(DOCS).join(PAGE)).expect("read the page");
    assert!(page.contains(EXAMPLE_SECRET));
    let start = page.find("```http\n").expect("the example request") + "```http\n".len();
    let request = &page[start..start + page[start..].find("\n```").expect("end of the example")];
    let (head, body) = request
        .split_once("\n\n")
        .expect("headers, blank line, body");
    let header = |name: &str| {
        head.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in the example"))
    };
    let timestamp: i64 = header("webhook-timestamp").parse().expect("timestamp");
    let secret = SigningSecret::parse(EXAMPLE_SECRET).expect("example secret");
    assert_eq!(
        secret.sign(header("webhook-id"), timestamp, body.as_bytes()),
        header("webhook-signature")
    );
    let parsed: serde_json::Value = serde_json::from_str(body).expect("the example body is JSON");
    assert_eq!(parsed["id"].as_str(), Some(header("webhook-id")));
}

#[test]
fn the_page_check_catches_drift() {
    let page = "# t\n\n<!-- snippet: a.py -->\n```python\nprint(1)\n```\n\n```sh\nls\n```\n";
    let read = |_: &str| Ok("print(1)\n".to_owned());
    assert_eq!(synced_page(page, &LANGUAGES, read).as_deref(), Ok(page));
    let changed = |_: &str| Ok("print(2)\n".to_owned());
    assert_ne!(synced_page(page, &LANGUAGES, changed).as_deref(), Ok(page));
    let untested = "```go\nfunc main() {}\n```\n";
    assert!(synced_page(untested, &LANGUAGES, read).is_err());
    let unmarked = "<!-- snippet: a.py -->\n\ntext\n";
    assert!(synced_page(unmarked, &LANGUAGES, read).is_err());
}

// ---------------------------------------------------------------------------------------------
// The snippets against real deliveries.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Language {
    Python,
    Node,
    Go,
    Ruby,
    Rust,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Valid,
    Invalid(String),
}

/// What a receiver got: the raw body and the three headers.
#[derive(Clone)]
struct Received {
    body: Vec<u8>,
    id: String,
    timestamp: String,
    signature: String,
}

impl Received {
    fn from_arrival(arrival: &Arrival) -> Self {
        Self {
            body: arrival.body.to_vec(),
            id: arrival.webhook_id.clone().expect("webhook-id"),
            timestamp: arrival
                .webhook_timestamp
                .clone()
                .expect("webhook-timestamp"),
            signature: arrival
                .webhook_signature
                .clone()
                .expect("webhook-signature"),
        }
    }
}

/// One snippet, ready to run.
struct Snippet {
    language: Language,
    /// The interpreter or the compiled program (none for Rust).
    program: PathBuf,
    script: Option<PathBuf>,
    scratch: PathBuf,
    calls: AtomicU32,
}

fn snippet_file(name: &str) -> PathBuf {
    Path::new(DOCS).join("verifying").join(name)
}

fn must_run(command: &mut Command, what: &str, hint: &str) -> std::process::Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}. {hint}"))
}

impl Snippet {
    fn prepare(language: Language, scratch: &Scratch) -> Self {
        let (program, script) = match language {
            Language::Python => (test_python(), Some(snippet_file("verify.py"))),
            Language::Node => (PathBuf::from("node"), Some(snippet_file("verify.mjs"))),
            Language::Ruby => (PathBuf::from("ruby"), Some(snippet_file("verify.rb"))),
            Language::Go => {
                let binary = scratch.path().join("verify-go");
                let mut build = Command::new("go");
                build
                    .arg("build")
                    .arg("-o")
                    .arg(&binary)
                    .arg(snippet_file("verify.go"));
                if std::env::var_os("GOCACHE").is_none() {
                    build.env("GOCACHE", std::env::temp_dir().join("hooklane-e2e-gocache"));
                }
                let output = must_run(
                    &mut build,
                    "`go build` for docs/verifying/verify.go",
                    "Run the tests with scripts/test, which installs Go (Debian golang-go).",
                );
                assert!(
                    output.status.success(),
                    "docs/verifying/verify.go does not build:\n{}",
                    String::from_utf8_lossy(&output.stderr)
                );
                (binary, None)
            }
            Language::Rust => (PathBuf::new(), None),
        };
        Self {
            language,
            program,
            script,
            scratch: scratch.path().to_owned(),
            calls: AtomicU32::new(0),
        }
    }

    fn verify(&self, received: &Received, secrets: &[&str]) -> Verdict {
        if self.language == Language::Rust {
            return match rust_snippet::verify_webhook(
                &received.body,
                &received.id,
                &received.timestamp,
                &received.signature,
                secrets,
            ) {
                Ok(()) => Verdict::Valid,
                Err(reason) => Verdict::Invalid(reason),
            };
        }
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let body_file = self.scratch.join(format!("body-{call}.bin"));
        std::fs::write(&body_file, &received.body).expect("write the body file");
        let mut command = Command::new(&self.program);
        command.args(&self.script);
        command
            .arg(&body_file)
            .args([&received.id, &received.timestamp, &received.signature])
            .args(secrets);
        let hint = match self.language {
            Language::Node => {
                "Node.js must be installed: the Node.js snippet is part of the suite."
            }
            _ => "Run the tests with scripts/test, which provisions Python, Go and Ruby.",
        };
        let output = must_run(
            &mut command,
            &format!("the {:?} snippet", self.language),
            hint,
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        match (output.status.code(), stdout.strip_prefix("invalid: ")) {
            (Some(0), _) if stdout == "valid\n" => Verdict::Valid,
            (Some(1), Some(reason)) => Verdict::Invalid(reason.trim_end().to_owned()),
            _ => panic!(
                "the {:?} snippet neither accepted nor rejected cleanly ({}):\n{stdout}{}",
                self.language,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ),
        }
    }
}

#[track_caller]
fn assert_valid(snippet: &Snippet, case: &str, received: &Received, secrets: &[&str]) {
    let verdict = snippet.verify(received, secrets);
    assert_eq!(
        verdict,
        Verdict::Valid,
        "{:?} snippet, {case}",
        snippet.language
    );
}

#[track_caller]
fn assert_invalid(snippet: &Snippet, case: &str, received: &Received, secrets: &[&str], why: &str) {
    match snippet.verify(received, secrets) {
        Verdict::Invalid(reason) => assert!(
            reason.contains(why),
            "{:?} snippet, {case}: rejected, but for the wrong reason: {reason}",
            snippet.language
        ),
        Verdict::Valid => panic!(
            "{:?} snippet, {case}: ACCEPTED a webhook it must reject",
            snippet.language
        ),
    }
}

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Our own signature over `received` with `timestamp`, as `serve` would have made it then.
fn signed_at(received: &Received, secret: &str, timestamp: i64) -> Received {
    let secret = SigningSecret::parse(secret).expect("secret");
    Received {
        timestamp: timestamp.to_string(),
        signature: secret.sign(&received.id, timestamp, &received.body),
        ..received.clone()
    }
}

async fn wait_for(farm: &Farm, deliveries: usize) -> Vec<Arrival> {
    assert!(
        farm.wait_until(Duration::from_secs(15), |f| f.success_count("receiver")
            == deliveries)
            .await,
        "the farm did not get {deliveries} webhook(s)"
    );
    farm.arrivals("receiver")
}

/// Every case of the page's promises, for one snippet.
async fn check_snippet(language: Language) {
    let scratch = Scratch::new(&format!("snippets-{language:?}").to_lowercase());
    let snippet = Snippet::prepare(language, &scratch);
    let farm = Farm::start().await.expect("farm");
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let (endpoint, old_secret) = server
        .create_endpoint("acme", &farm.url("receiver"), json!({}))
        .await;
    let first = server
        .publish(
            "acme",
            "invoice.paid",
            json!({"invoice": "inv_1001", "amount": 4200, "note": "ünïcode ✓ \"quoted\""}),
        )
        .await;
    let arrivals = wait_for(&farm, 1).await;
    let real = Received::from_arrival(&arrivals[0]);
    assert_eq!(Some(real.id.as_str()), first["id"].as_str());
    let wrong_secret = SigningSecret::generate().expose();

    // The webhook as sent: accepted. Everything below is rejected, each for its reason.
    assert_valid(&snippet, "a real delivery", &real, &[&old_secret]);
    let parsed: serde_json::Value = serde_json::from_slice(&real.body).expect("json body");
    let reserialised = Received {
        body: serde_json::to_vec_pretty(&parsed).expect("json"),
        ..real.clone()
    };
    assert_ne!(reserialised.body, real.body);
    assert_invalid(
        &snippet,
        "re-serialised JSON",
        &reserialised,
        &[&old_secret],
        "no signature matches",
    );
    let tampered = Received {
        body: String::from_utf8(real.body.clone())
            .expect("utf-8")
            .replace("4200", "4201")
            .into_bytes(),
        ..real.clone()
    };
    assert_ne!(tampered.body, real.body);
    assert_invalid(
        &snippet,
        "a changed amount",
        &tampered,
        &[&old_secret],
        "no signature matches",
    );
    assert_invalid(
        &snippet,
        "a wrong secret",
        &real,
        &[&wrong_secret],
        "no signature matches",
    );
    let other_id = Received {
        id: "evt_someone_else".to_owned(),
        ..real.clone()
    };
    assert_invalid(
        &snippet,
        "another webhook-id",
        &other_id,
        &[&old_secret],
        "no signature matches",
    );
    let unsigned = Received {
        signature: String::new(),
        ..real.clone()
    };
    assert_invalid(
        &snippet,
        "no signature header",
        &unsigned,
        &[&old_secret],
        "missing",
    );
    let unknown_version = Received {
        signature: real.signature.replace("v1,", "v2,"),
        ..real.clone()
    };
    assert_invalid(
        &snippet,
        "only a v2 signature",
        &unknown_version,
        &[&old_secret],
        "no signature matches",
    );

    // The 5-minute tolerance: a correct signature made 10 minutes ago (or ahead) is refused,
    // while the same signing done now is accepted (so the refusal is about time).
    let now = now_unix();
    assert_valid(
        &snippet,
        "signed by the test just now",
        &signed_at(&real, &old_secret, now),
        &[&old_secret],
    );
    assert_valid(
        &snippet,
        "signed 4 minutes ago",
        &signed_at(&real, &old_secret, now - 240),
        &[&old_secret],
    );
    assert_invalid(
        &snippet,
        "signed 10 minutes ago",
        &signed_at(&real, &old_secret, now - 600),
        &[&old_secret],
        "timestamp",
    );
    assert_invalid(
        &snippet,
        "signed 10 minutes ahead",
        &signed_at(&real, &old_secret, now + 600),
        &[&old_secret],
        "timestamp",
    );

    // A rotation with a grace period: the next webhook carries two signatures, and a receiver
    // holding either secret (or both) accepts it.
    let (status, rotated) = server
        .post(
            &format!("/v1/accounts/acme/endpoints/{endpoint}/secret/rotate"),
            json!({"grace_period_seconds": 3600}),
        )
        .await;
    assert_eq!(status, 200, "rotate: {rotated}");
    let new_secret = rotated["secret"].as_str().expect("new secret").to_owned();
    assert_ne!(new_secret, old_secret);
    let second = server
        .publish(
            "acme",
            "invoice.paid",
            json!({"invoice": "inv_1002", "amount": 990}),
        )
        .await;
    let arrivals = wait_for(&farm, 2).await;
    let during = arrivals
        .iter()
        .find(|a| a.webhook_id.as_deref() == second["id"].as_str())
        .map(Received::from_arrival)
        .expect("the webhook sent during the rotation");
    assert_eq!(
        during
            .signature
            .split(' ')
            .filter(|s| s.starts_with("v1,"))
            .count(),
        2,
        "two signatures during a rotation: {}",
        during.signature
    );
    assert_valid(
        &snippet,
        "rotation, old secret alone",
        &during,
        &[&old_secret],
    );
    assert_valid(
        &snippet,
        "rotation, new secret alone",
        &during,
        &[&new_secret],
    );
    assert_valid(
        &snippet,
        "rotation, old and new secrets",
        &during,
        &[&old_secret, &new_secret],
    );
    assert_valid(
        &snippet,
        "rotation, wrong then new secret",
        &during,
        &[&wrong_secret, &new_secret],
    );
    assert_invalid(
        &snippet,
        "rotation, a wrong secret",
        &during,
        &[&wrong_secret],
        "no signature matches",
    );
    let during_tampered = Received {
        body: serde_json::to_vec_pretty(
            &serde_json::from_slice::<serde_json::Value>(&during.body).expect("json"),
        )
        .expect("json"),
        ..during.clone()
    };
    assert_invalid(
        &snippet,
        "rotation, re-serialised JSON",
        &during_tampered,
        &[&old_secret, &new_secret],
        "no signature matches",
    );
    // The webhook from before the rotation was signed by the old secret only.
    assert_invalid(
        &snippet,
        "pre-rotation webhook, new secret",
        &real,
        &[&new_secret],
        "no signature matches",
    );
    println!("snippets: the {language:?} snippet (docs/VERIFYING.md) ran against real deliveries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_snippet_verifies_real_webhooks() {
    check_snippet(Language::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_snippet_verifies_real_webhooks() {
    check_snippet(Language::Node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_snippet_verifies_real_webhooks() {
    check_snippet(Language::Go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ruby_snippet_verifies_real_webhooks() {
    check_snippet(Language::Ruby).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_snippet_verifies_real_webhooks() {
    check_snippet(Language::Rust).await;
}
