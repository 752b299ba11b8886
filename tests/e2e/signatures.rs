//! What `serve` sends verifies with independent Standard Webhooks libraries, and holds the
//! numbers the event was published with.

use std::time::Duration;

use hooklane_testkit::farm::{Arrival, Farm};
use serde_json::json;

use crate::support::{test_python, Scratch, Server, ADMIN_TOKEN};

const PYTHON_VERIFY: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
secret, msg_id, timestamp, signature, body_path = sys.argv[1:6]
body = open(body_path, "rb").read()
payload = Webhook(secret).verify(body, {"webhook-id": msg_id, "webhook-timestamp": timestamp, "webhook-signature": signature})
assert payload["id"] == msg_id, payload
print("verified", payload["type"])
"#;

/// A secret no endpoint has.
const WRONG_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// `serve` (in a scratch directory named `name`) with the account acme and its one endpoint,
/// the farm's `receiver`.
struct Acme {
    server: Server,
    scratch: Scratch,
    farm: Farm,
    endpoint: String,
    secret: String,
}

async fn acme_sending_to_the_farm(name: &str) -> Acme {
    let farm = Farm::start().await.expect("farm");
    let scratch = Scratch::new(name);
    let server = Server::start(&scratch, &[]).await;
    server.create_account("acme").await;
    let (endpoint, secret) = server
        .create_endpoint("acme", &farm.url("receiver"), json!({}))
        .await;
    Acme {
        server,
        scratch,
        farm,
        endpoint,
        secret,
    }
}

/// Waits until the receiver has taken `count` deliveries; the last of them.
async fn delivery_number(farm: &Farm, count: usize) -> Arrival {
    assert!(
        farm.wait_until(Duration::from_secs(10), |f| f.success_count("receiver")
            == count)
            .await
    );
    farm.arrivals("receiver").remove(count - 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_standardwebhooks_verifies_a_real_delivery() {
    let python = test_python();
    let Acme {
        server,
        scratch,
        farm,
        secret,
        ..
    } = acme_sending_to_the_farm("signatures").await;
    let event = server
        .publish(
            "acme",
            "invoice.paid",
            json!({"amount": 4200, "currency": "EUR", "note": "ünïcode ✓"}),
        )
        .await;
    let arrival = delivery_number(&farm, 1).await;
    assert_eq!(arrival.webhook_id.as_deref(), event["id"].as_str());
    assert_eq!(arrival.header("content-type"), Some("application/json"));
    assert!(
        arrival
            .header("user-agent")
            .unwrap_or("")
            .starts_with("Hooklane/"),
        "{:?}",
        arrival.header("user-agent")
    );
    let body_path = scratch.path().join("body.json");
    let output = python_verify(&python, &secret, &arrival, &body_path);
    assert!(
        output.status.success(),
        "standardwebhooks rejected the delivery: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("verified invoice.paid"));
    // The same check with the wrong secret must fail, or the test proves nothing.
    assert!(
        !python_verifies(&python, WRONG_SECRET, &arrival, &body_path),
        "standardwebhooks accepted a wrong secret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooklane_verify_command_checks_a_real_delivery() {
    // The scratch directory holds serve's database: it lives as long as the test.
    let Acme {
        server,
        scratch: _scratch,
        farm,
        secret,
        ..
    } = acme_sending_to_the_farm("verify-cmd").await;
    server
        .publish("acme", "user.created", json!({"user": "u_1"}))
        .await;
    let arrival = delivery_number(&farm, 1).await;
    let verify = |body: Vec<u8>| {
        let arrival = arrival.clone();
        let secret = secret.clone();
        async move {
            let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hooklane"))
                .args(["verify", "--secret", &secret])
                .args(["--id", arrival.webhook_id.as_deref().unwrap_or("")])
                .args([
                    "--timestamp",
                    arrival.webhook_timestamp.as_deref().unwrap_or(""),
                ])
                .args([
                    "--signature",
                    arrival.webhook_signature.as_deref().unwrap_or(""),
                ])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn verify");
            use tokio::io::AsyncWriteExt;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(&body).await.expect("write body");
            drop(stdin);
            let output = child.wait_with_output().await.expect("verify output");
            (
                output.status.success(),
                String::from_utf8_lossy(&output.stdout).into_owned(),
            )
        }
    };
    assert_eq!(
        verify(arrival.body.to_vec()).await,
        (true, "valid\n".to_owned())
    );
    // Re-serialised JSON is not the raw body: the verifier says so.
    let reserialised = serde_json::to_vec_pretty(
        &serde_json::from_slice::<serde_json::Value>(&arrival.body).expect("json"),
    )
    .expect("json");
    let (ok, message) = verify(reserialised).await;
    assert!(!ok);
    assert!(message.contains("raw bytes"), "{message}");
}

/// Python's standardwebhooks verifying `arrival` with `secret` (its body written to
/// `body_path` first).
fn python_verify(
    python: &std::path::Path,
    secret: &str,
    arrival: &Arrival,
    body_path: &std::path::Path,
) -> std::process::Output {
    std::fs::write(body_path, &arrival.body).expect("write body");
    std::process::Command::new(python)
        .arg("-c")
        .arg(PYTHON_VERIFY)
        .arg(secret)
        .arg(arrival.webhook_id.as_deref().unwrap_or(""))
        .arg(arrival.webhook_timestamp.as_deref().unwrap_or(""))
        .arg(arrival.webhook_signature.as_deref().unwrap_or(""))
        .arg(body_path)
        .output()
        .expect("run python")
}

fn python_verifies(
    python: &std::path::Path,
    secret: &str,
    arrival: &Arrival,
    body_path: &std::path::Path,
) -> bool {
    python_verify(python, secret, arrival, body_path)
        .status
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_rotation_either_secret_verifies_with_standardwebhooks() {
    let python = test_python();
    let Acme {
        server,
        scratch,
        farm,
        endpoint,
        secret: old_secret,
    } = acme_sending_to_the_farm("rotation").await;
    let rotate = format!("/v1/accounts/acme/endpoints/{endpoint}/secret/rotate");
    let (status, rotated) = server
        .post(&rotate, json!({"grace_period_seconds": 3600}))
        .await;
    assert_eq!(status, 200, "{rotated}");
    let new_secret = rotated["secret"].as_str().expect("secret").to_owned();
    assert_ne!(new_secret, old_secret);
    assert!(rotated["retiring_secret_until"].is_string(), "{rotated}");

    server
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    let arrival = delivery_number(&farm, 1).await;
    let signature = arrival.webhook_signature.clone().unwrap_or_default();
    assert_eq!(signature.split(' ').count(), 2, "{signature}");
    let body_path = scratch.path().join("body.json");
    assert!(
        python_verifies(&python, &old_secret, &arrival, &body_path),
        "old secret"
    );
    assert!(
        python_verifies(&python, &new_secret, &arrival, &body_path),
        "new secret"
    );
    assert!(
        !python_verifies(&python, WRONG_SECRET, &arrival, &body_path),
        "a wrong secret verified"
    );

    // A second rotation with a grace period while the first one's runs would end it at
    // once: refused, and both secrets still sign.
    let (status, refused) = server
        .post(&rotate, json!({"grace_period_seconds": 3600}))
        .await;
    assert_eq!(status, 409, "{refused}");
    let (_, read) = server
        .get(&format!("/v1/accounts/acme/endpoints/{endpoint}"))
        .await;
    assert_eq!(read["secret"], json!(new_secret), "{read}");

    // Rotating with no grace: only the newest secret signs.
    let (status, rotated) = server
        .post(&rotate, json!({"grace_period_seconds": 0}))
        .await;
    assert_eq!(status, 200, "{rotated}");
    let newest = rotated["secret"].as_str().expect("secret").to_owned();
    server
        .publish("acme", "invoice.paid", json!({"n": 2}))
        .await;
    let arrival = delivery_number(&farm, 2).await;
    assert!(python_verifies(&python, &newest, &arrival, &body_path));
    assert!(!python_verifies(&python, &new_secret, &arrival, &body_path));
}

/// `count` doubles as Python's `random.uniform(0, 1000)` makes them (53 random bits), from a
/// fixed seed (splitmix64). Read back without correct rounding, about one in eight of them
/// becomes a neighbouring double (449.49106478873813 → 449.4910647887382).
fn uniform_doubles(count: usize) -> Vec<f64> {
    let mut state: u64 = 20_240_601;
    (0..count)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 53) as f64 * 1000.0
        })
        .collect()
}

/// The numbers of the array `"values":[…]` in a JSON text, each read by Rust's own
/// (correctly rounded) parser: the test does not rely on the JSON library under test.
fn values_in(text: &str) -> Vec<f64> {
    let start = text.find(r#""values":["#).expect("a values array") + r#""values":["#.len();
    let end = start + text[start..].find(']').expect("the array's end");
    text[start..end]
        .split(',')
        .map(|n| {
            n.trim()
                .parse::<f64>()
                .unwrap_or_else(|e| panic!("{n}: {e}"))
        })
        .collect()
}

/// The values of `got` that are not, bit for bit, those of `sent`, as `sent → got`.
fn changed(sent: &[f64], got: &[f64]) -> Vec<String> {
    assert_eq!(got.len(), sent.len(), "as many values as sent");
    sent.iter()
        .zip(got)
        .filter(|(s, g)| s.to_bits() != g.to_bits())
        .map(|(s, g)| format!("{s:?} → {g:?}"))
        .collect()
}

/// An event's numbers reach the endpoint as published: the publish answer, a read of the
/// event and the signed webhook hold the same doubles, bit for bit, including those a JSON
/// parser that is not correctly rounded reads as a neighbouring double.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floats_keep_their_value_from_publish_to_webhook() {
    let Acme {
        server,
        scratch: _scratch,
        farm,
        secret,
        ..
    } = acme_sending_to_the_farm("floats").await;
    let mut sent = vec![449.491_064_788_738_13, 0.1, -2.5e-8, 1e16, 6.02214076e23];
    sent.extend(uniform_doubles(400));
    // Written by Rust's shortest round-trip formatting, as Python's `repr` writes them.
    let numbers: Vec<String> = sent.iter().map(|v| format!("{v:?}")).collect();
    let body = format!(
        r#"{{"id":"floats.1","type":"measurement.taken","data":{{"values":[{}]}}}}"#,
        numbers.join(",")
    );
    let (status, published) = server.post_text("/v1/accounts/acme/events", body).await;
    assert_eq!(status, 202, "{published}");
    let http = reqwest::Client::new();
    let read = http
        .get(format!("{}/v1/accounts/acme/events/floats.1", server.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("read")
        .text()
        .await
        .expect("read answer");
    let arrival = delivery_number(&farm, 1).await;
    arrival.verify_with(&secret).expect("signed");
    let webhook = String::from_utf8_lossy(&arrival.body).into_owned();
    for (what, text) in [
        ("publish answer", &published),
        ("event read", &read),
        ("webhook", &webhook),
    ] {
        let changed = changed(&sent, &values_in(text));
        assert!(
            changed.is_empty(),
            "the {what} changed {} of {} numbers: {}",
            changed.len(),
            sent.len(),
            changed[..changed.len().min(5)].join(", ")
        );
    }
}
