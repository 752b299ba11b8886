//! Secrets at rest through the binary: what a copy of the SQLite file holds, a start with
//! the wrong key, a key rotation on the embedded shape, and `hooklane secrets reseal` on a
//! DynamoDB stack (what a Scan of its endpoints table holds before and after).

use std::{process::Stdio, time::Duration};

use hooklane::secrets::key_id;
use serde_json::json;

use crate::support::{Scratch, Server, ADMIN_TOKEN};

const OLD: [u8; 32] = [0x11; 32];
const NEW: [u8; 32] = [0x22; 32];

fn hex(key: &[u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where `needle` occurs in `haystack`.
fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The database file and its WAL, as a copy of them would hold.
fn raw_database(server: &Server) -> Vec<u8> {
    let mut raw = std::fs::read(&server.database).unwrap();
    let mut wal = server.database.clone().into_os_string();
    wal.push("-wal");
    raw.extend(std::fs::read(wal).unwrap_or_default());
    raw
}

/// `hooklane serve` that must not start: its exit code and what it wrote to stderr.
async fn refused_start(server: &Server, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_hooklane"));
    command
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("NO_COLOR", "1")
        .env("HOOKLANE_LISTEN", "127.0.0.1:0")
        .env("HOOKLANE_DATABASE", &server.database)
        .env("HOOKLANE_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("serve with the wrong key neither started nor stopped in 30 s")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_sqlite_file_holds_no_secret_a_wrong_key_stops_the_start_and_rotation_reseals() {
    let scratch = Scratch::new("secrets");
    let (old, new) = (hex(&OLD), hex(&NEW));
    let mut server = Server::start(&scratch, &[("HOOKLANE_SECRETS_KEY", &old)]).await;
    server.create_account("acme").await;
    let (a, secret_a) = server
        .create_endpoint("acme", "http://127.0.0.1:9/a", json!({}))
        .await;
    let (b, _) = server
        .create_endpoint("acme", "http://127.0.0.1:9/b", json!({}))
        .await;
    let (status, rotated) = server
        .post(
            &format!("/v1/accounts/acme/endpoints/{b}/secret/rotate"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{rotated}");
    let secret_b = rotated["secret"].as_str().unwrap().to_owned();
    server.kill9().await;

    // The three secrets' bytes (after `whsec_`) are nowhere in the file or its WAL.
    let raw = raw_database(&server);
    let bodies: Vec<&str> = [&secret_a, &secret_b]
        .iter()
        .map(|s| s.trim_start_matches("whsec_"))
        .collect();
    for body in &bodies {
        assert!(
            !contains(&raw, body),
            "a signing secret in the database file"
        );
    }
    assert!(
        !contains(&raw, "whsec_"),
        "no whsec_ value in the database file"
    );
    assert!(contains(&raw, &format!("enc:v1:{}:", key_id(&OLD))));
    println!(
        "secrets e2e: {} bytes of database and WAL searched for {} secrets: none found",
        raw.len(),
        bodies.len()
    );

    // The new key alone: the start stops with a clear error, no panic, nothing served.
    let (code, stderr) = refused_start(&server, &[("HOOKLANE_SECRETS_KEY", &new)]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("do not open with the configured key"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&key_id(&OLD)),
        "names the sealing key: {stderr}"
    );
    assert!(stderr.contains("HOOKLANE_SECRETS_KEY_PREVIOUS"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // A key that is not a key: a configuration error.
    let (code, stderr) = refused_start(&server, &[("HOOKLANE_SECRETS_KEY", "letmein")]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("HOOKLANE_SECRETS_KEY"), "{stderr}");

    // The rotation: new key, old one as the previous. Everything is re-sealed at start.
    server
        .restart_with(&[
            ("HOOKLANE_SECRETS_KEY", &new),
            ("HOOKLANE_SECRETS_KEY_PREVIOUS", &old),
        ])
        .await;
    assert!(
        server.log_text().contains("resealed=2"),
        "{}",
        server.log_text()
    );
    let (_, endpoint) = server
        .get(&format!("/v1/accounts/acme/endpoints/{a}"))
        .await;
    assert_eq!(endpoint["secret"], json!(secret_a));
    server.kill9().await;
    let raw = raw_database(&server);
    assert!(
        !contains(&raw, "whsec_"),
        "no whsec_ value after the rotation"
    );

    // Then the new key alone is enough, and the old one opens nothing.
    server
        .restart_with(&[
            ("HOOKLANE_SECRETS_KEY", &new),
            ("HOOKLANE_SECRETS_KEY_PREVIOUS", ""),
        ])
        .await;
    let (_, endpoint) = server
        .get(&format!("/v1/accounts/acme/endpoints/{b}"))
        .await;
    assert_eq!(endpoint["secret"], json!(secret_b));
    server.kill9().await;
    let (code, stderr) = refused_start(&server, &[("HOOKLANE_SECRETS_KEY", &old)]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains(&key_id(&NEW)), "{stderr}");
}

/// `hooklane secrets reseal` with the given keys on the stack whose tables start with
/// `prefix`: exit code, stdout, stderr.
async fn reseal(prefix: &str, keys: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_hooklane"));
    command
        .args(["secrets", "reseal"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOOKLANE_TABLE_PREFIX", prefix)
        .envs(std::env::vars().filter(|(k, _)| k.starts_with("AWS_")))
        .envs(keys.iter().copied());
    let out = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("secrets reseal did not finish in 60 s")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every item of the endpoints table, as a Scan (an export) returns it, as text.
async fn scanned(shape: &hooklane::aws::shape::AwsShape) -> String {
    let out = shape
        .store
        .client()
        .scan()
        .table_name(&shape.store.tables().endpoints)
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    format!("{:?}", out.items.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamodb_scan_holds_no_secret_and_secrets_reseal_moves_the_stack_to_the_new_key() {
    use hooklane::{domain::endpoint::RetiringSecret, signing::SigningSecret, store::Store};
    use hooklane_testkit::fixtures;
    let (old, new) = (hex(&OLD), hex(&NEW));
    let mut core = hooklane::config::CoreConfig::default();
    core.secrets.current = Some(OLD);
    let (settings, shape) = hooklane_testkit::testing::emulated_shape_with(core).await;
    let store = shape.store.as_ref();
    let [mut a, mut b] = fixtures::account_with_endpoints(store, "acme", ["ep_a", "ep_b"]).await;
    // A secret custom header: sealed, and re-sealed, like the signing secrets.
    a.headers = hooklane::domain::headers::CustomHeaders::parse(Some(&serde_json::json!({
        "authorization": "Bearer hdr-9c1e55",
    })))
    .unwrap();
    let read = a.version();
    store.update_endpoint(&a, &read).await.unwrap();
    let retiring = std::mem::replace(&mut b.secret, SigningSecret::generate());
    b.retiring_secret = Some(RetiringSecret {
        secret: retiring,
        until: fixtures::t0(),
    });
    let read = b.version();
    store.update_endpoint(&b, &read).await.unwrap();
    let secrets: Vec<String> = [
        &a.secret,
        &b.secret,
        &b.retiring_secret.as_ref().unwrap().secret,
    ]
    .iter()
    .map(|s| s.expose())
    .collect();
    let scan = scanned(&shape).await;
    for secret in &secrets {
        assert!(
            !scan.contains(secret.trim_start_matches("whsec_")),
            "a secret in a Scan"
        );
    }
    assert!(!scan.contains("whsec_") && !scan.contains("hdr-9c1e55"));
    assert_eq!(
        scan.matches(&format!("enc:v1:{}:", key_id(&OLD))).count(),
        4,
        "three signing secrets and a header value"
    );

    // The account-token signing key, sealed under the same key.
    let token_key = hooklane::service::tokens::signing_key(store)
        .await
        .unwrap()
        .to_hex();

    let prefix = settings.tables.prefix().to_owned();
    // The keys as a stack keeps them: SSM SecureString parameters, read by name.
    let (new_parameter, old_parameter) = (
        format!("/{prefix}/secrets-key"),
        format!("/{prefix}/secrets-key-old"),
    );
    let ssm = hooklane::aws::aws_sdk_ssm::Client::new(&hooklane::aws::load_sdk_config().await);
    for (name, value) in [(&new_parameter, &new), (&old_parameter, &old)] {
        ssm.put_parameter()
            .name(name)
            .value(value)
            .r#type(hooklane::aws::aws_sdk_ssm::types::ParameterType::SecureString)
            .send()
            .await
            .unwrap();
    }
    // The new key without the old one: the first secret stops it, naming the key.
    let rotated = [
        ("HOOKLANE_SECRETS_KEY_PARAMETER", new_parameter.as_str()),
        (
            "HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER",
            old_parameter.as_str(),
        ),
    ];
    let (code, _, stderr) = reseal(&prefix, &[("HOOKLANE_SECRETS_KEY", &new)]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&key_id(&OLD)), "{stderr}");
    let (code, stdout, stderr) = reseal(&prefix, &rotated).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("examined 2 endpoint(s); re-sealed 2"),
        "{stdout}"
    );
    let scan = scanned(&shape).await;
    assert!(!scan.contains("whsec_"));
    assert!(
        !scan.contains(&key_id(&OLD)),
        "nothing under the old key: {scan}"
    );
    assert_eq!(
        scan.matches(&format!("enc:v1:{}:", key_id(&NEW))).count(),
        4
    );
    let (code, stdout, stderr) = reseal(&prefix, &rotated).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("re-sealed 0"), "{stdout}");
    println!("secrets e2e: {stdout}");

    // The new key alone, from its parameter as a function reads it, opens everything.
    let renewed = hooklane::aws::shape::connect(&hooklane::aws::settings::AwsSettings {
        core: hooklane::config::CoreConfig::default(),
        secrets_key_parameter: Some(new_parameter.clone()),
        secrets_key_previous_parameter: None,
        ..settings
    })
    .await
    .unwrap();
    let listed = renewed
        .app
        .store
        .list_endpoints(&a.account_id)
        .await
        .unwrap();
    let opened: Vec<String> = listed
        .iter()
        .flat_map(|e| {
            std::iter::once(&e.secret).chain(e.retiring_secret.as_ref().map(|r| &r.secret))
        })
        .map(|s| s.expose())
        .collect();
    assert_eq!(opened, secrets);
    assert_eq!(
        listed[0].headers, a.headers,
        "the header opens under the new key"
    );
    // So does the account-token key: the same key, so tokens made before still work.
    let sealed = renewed
        .app
        .store
        .get_setting("account_token_key")
        .await
        .unwrap()
        .unwrap();
    assert!(
        sealed.starts_with(&format!("enc:v1:{}:", key_id(&NEW))),
        "the token key after the re-seal: {sealed}"
    );
    assert_eq!(
        hooklane::service::tokens::signing_key(renewed.app.store.as_ref())
            .await
            .unwrap()
            .to_hex(),
        token_key
    );
}
