//! Signing secrets and secret custom header values at rest: what a copy of the SQLite file
//! or a raw DynamoDB item holds, key rotation, and a sealed secret moved onto another
//! endpoint.

use hooklane::{
    domain::{endpoint::RetiringSecret, headers::CustomHeaders, Endpoint},
    secrets::{key_id, SecretsCipher},
    signing::SigningSecret,
    store::{sqlite::SqliteStore, Store},
};
use hooklane_testkit::fixtures::{account_with_endpoints, t0};

const OLD: [u8; 32] = [1; 32];
const NEW: [u8; 32] = [2; 32];

/// Rotates `ep`'s secret as the API does: a new one, the old one retiring; and gives it a
/// secret `Authorization` header.
async fn rotate(store: &dyn Store, ep: &mut Endpoint) {
    let read = ep.version();
    let old = std::mem::replace(&mut ep.secret, SigningSecret::generate());
    ep.retiring_secret = Some(RetiringSecret {
        secret: old,
        until: hooklane::clock::add(t0(), std::time::Duration::from_secs(86_400)),
    });
    let credential = SigningSecret::generate()
        .expose()
        .replace("whsec_", "Bearer ");
    ep.headers = CustomHeaders::parse(Some(&serde_json::json!({
        "authorization": credential,
        "x-tenant": "t_1",
    })))
    .unwrap();
    store.update_endpoint(ep, &read).await.unwrap();
}

/// The base64 bodies of an endpoint's secrets and its secret header values: what must not
/// be found in storage.
fn bodies(ep: &Endpoint) -> Vec<String> {
    std::iter::once(&ep.secret)
        .chain(ep.retiring_secret.as_ref().map(|r| &r.secret))
        .map(|s| s.expose().trim_start_matches("whsec_").to_owned())
        .chain(
            ep.headers
                .iter()
                .filter(|(_, h)| h.secret)
                .map(|(_, h)| h.value.clone()),
        )
        .collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn cipher(current: &[u8; 32], previous: Option<&[u8; 32]>) -> SecretsCipher {
    SecretsCipher::new(current, previous).unwrap()
}

async fn secrets_of(store: &dyn Store, ep: &Endpoint) -> Result<Vec<String>, String> {
    let stored = store
        .get_endpoint(&ep.account_id, &ep.id)
        .await
        .map_err(|e| e.to_string())?
        .expect("the endpoint is stored");
    Ok(bodies(&stored))
}

#[tokio::test]
async fn the_sqlite_file_holds_no_secret_and_a_rotation_reseals_under_the_new_key() {
    let dir = std::env::temp_dir().join(format!("hooklane-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("secrets.db");
    let store = SqliteStore::open(&path, cipher(&OLD, None)).unwrap();
    let [mut a, b] = account_with_endpoints(&store, "acme", ["ep_a", "ep_b"]).await;
    rotate(&store, &mut a).await;
    drop(store);

    // A copy of the database (file and WAL) holds no secret body, only sealed values.
    let mut raw = std::fs::read(&path).unwrap();
    raw.extend(std::fs::read(dir.join("secrets.db-wal")).unwrap_or_default());
    let searched: Vec<String> = bodies(&a).into_iter().chain(bodies(&b)).collect();
    assert_eq!(searched.len(), 4, "three signing secrets, one header value");
    for body in &searched {
        assert!(!contains(&raw, body), "a secret in the raw file");
    }
    let sealed = format!("enc:v1:{}:", key_id(&OLD));
    assert!(contains(&raw, &sealed));
    println!(
        "raw SQLite: {} bytes searched for {} secret bodies: 0 found; sealed values present",
        raw.len(),
        searched.len()
    );

    // A plaintext secret from before encryption is read and sealed by the next re-seal.
    let raw_conn = rusqlite::Connection::open(&path).unwrap();
    raw_conn
        .execute(
            "UPDATE endpoints SET secret = ?1 WHERE id = 'ep_b'",
            [b.secret.expose()],
        )
        .unwrap();
    drop(raw_conn);

    // Without the key that sealed them: a clear error, never another secret.
    let stranger = SqliteStore::open(&path, cipher(&NEW, None)).unwrap();
    let refused = secrets_of(&stranger, &a).await.unwrap_err();
    assert!(refused.contains(&key_id(&OLD)), "{refused}");
    assert!(
        refused.contains("HOOKLANE_SECRETS_KEY_PREVIOUS"),
        "{refused}"
    );
    assert!(stranger.reseal_secrets().await.is_err());
    drop(stranger);

    // New key with the previous one: everything reads, and re-sealing moves it all over.
    let rotated = SqliteStore::open(&path, cipher(&NEW, Some(&OLD))).unwrap();
    assert_eq!(secrets_of(&rotated, &a).await.unwrap(), bodies(&a));
    assert_eq!(rotated.reseal_secrets().await.unwrap(), 2);
    assert_eq!(rotated.reseal_secrets().await.unwrap(), 0, "nothing left");
    drop(rotated);
    let raw_conn = rusqlite::Connection::open(&path).unwrap();
    let stored: Vec<(String, Option<String>, Option<String>)> = raw_conn
        .prepare("SELECT secret, retiring_secret, headers FROM endpoints")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let now_sealed = format!("enc:v1:{}:", key_id(&NEW));
    for value in stored
        .iter()
        .flat_map(|(s, r, _)| std::iter::once(s).chain(r))
    {
        assert!(value.starts_with(&now_sealed), "{value}");
    }
    let headers: Vec<&String> = stored.iter().filter_map(|(_, _, h)| h.as_ref()).collect();
    assert_eq!(headers.len(), 1);
    assert!(
        headers[0].contains(&now_sealed) && !headers[0].contains(&key_id(&OLD)),
        "the secret header value is sealed under the new key: {}",
        headers[0]
    );
    drop(raw_conn);
    let only_new = SqliteStore::open(&path, cipher(&NEW, None)).unwrap();
    assert_eq!(secrets_of(&only_new, &a).await.unwrap(), bodies(&a));
    assert_eq!(secrets_of(&only_new, &b).await.unwrap(), bodies(&b));
    drop(only_new);

    // A sealed secret copied onto another endpoint's row does not open there.
    let raw_conn = rusqlite::Connection::open(&path).unwrap();
    raw_conn
        .execute(
            "UPDATE endpoints SET secret = (SELECT secret FROM endpoints WHERE id = 'ep_a') \
             WHERE id = 'ep_b'",
            [],
        )
        .unwrap();
    drop(raw_conn);
    let store = SqliteStore::open(&path, cipher(&NEW, None)).unwrap();
    let refused = secrets_of(&store, &b).await.unwrap_err();
    assert!(refused.contains("another endpoint"), "{refused}");
    // The start's re-seal opens every secret, those under the current key too: it refuses.
    let refused = store.reseal_secrets().await.unwrap_err().to_string();
    assert!(
        refused.contains("endpoint ep_b") && refused.contains("another endpoint"),
        "{refused}"
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The raw DynamoDB item (what an export holds) after a create and a rotation.
#[cfg(feature = "aws")]
#[tokio::test]
async fn a_raw_dynamodb_item_holds_no_secret_and_does_not_open_on_another_endpoint() {
    use hooklane::aws::aws_sdk_dynamodb::types::AttributeValue;
    use hooklane::store::dynamodb::{DynamoStore, Retention};
    let base = hooklane_testkit::testing::emulator_store().await;
    let (client, tables) = (base.client().clone(), base.tables().clone());
    let store = DynamoStore::new(
        client.clone(),
        tables.clone(),
        Retention::default(),
        cipher(&OLD, None),
    );
    let [mut a, b] = account_with_endpoints(&store, "acme", ["ep_a", "ep_b"]).await;
    rotate(&store, &mut a).await;
    let raw_item = |id: &'static str| {
        let (client, table) = (client.clone(), tables.endpoints.clone());
        async move {
            client
                .get_item()
                .table_name(table)
                .key("account_id", AttributeValue::S("acme".into()))
                .key("id", AttributeValue::S(id.into()))
                .send()
                .await
                .unwrap()
                .item
                .unwrap()
        }
    };
    let item = raw_item("ep_a").await;
    let dump = format!("{item:?}");
    for body in bodies(&a) {
        assert!(!dump.contains(&body), "a secret in the raw item");
    }
    let secret = item["secret"].as_s().unwrap().clone();
    assert!(secret.starts_with(&format!("enc:v1:{}:", key_id(&OLD))));
    assert!(item["retiring_secret"]
        .as_s()
        .unwrap()
        .starts_with("enc:v1:"));
    assert!(item["headers"].as_s().unwrap().contains("enc:v1:"));
    println!(
        "raw DynamoDB item: {} characters searched for {} secret bodies: 0 found",
        dump.len(),
        bodies(&a).len()
    );

    // Without the sealing key: a clear error. With it as the previous key: readable.
    let stranger = DynamoStore::new(
        client.clone(),
        tables.clone(),
        Retention::default(),
        cipher(&NEW, None),
    );
    let refused = secrets_of(&stranger, &a).await.unwrap_err();
    assert!(refused.contains(&key_id(&OLD)), "{refused}");
    let rotated = DynamoStore::new(
        client.clone(),
        tables.clone(),
        Retention::default(),
        cipher(&NEW, Some(&OLD)),
    );
    assert_eq!(secrets_of(&rotated, &a).await.unwrap(), bodies(&a));
    assert_eq!(secrets_of(&rotated, &b).await.unwrap(), bodies(&b));
    // A write under the rotated keys seals under the new one (the lazy re-seal).
    rotated.update_endpoint(&b, &b.version()).await.unwrap();
    let item = raw_item("ep_b").await;
    assert!(item["secret"]
        .as_s()
        .unwrap()
        .starts_with(&format!("enc:v1:{}:", key_id(&NEW))));

    // A store withholding secrets (a function without the key) reads endpoints without
    // them and writes none.
    let withheld = DynamoStore::new(
        client.clone(),
        tables.clone(),
        Retention::default(),
        hooklane::secrets::SecretsAccess::Withheld,
    );
    let listed = withheld.list_endpoints(&a.account_id).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|e| e.secret.is_withheld()
        && e.retiring_secret
            .as_ref()
            .is_none_or(|r| r.secret.is_withheld())));
    let refused = withheld
        .update_endpoint(&listed[0], &listed[0].version())
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("holds no secrets key"),
        "{refused}"
    );
    let refused = withheld
        .update_endpoint(&a, &a.version())
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("holds no secrets key"),
        "{refused}"
    );
    // Nor does it send: a delivery it loads is left pending, never sent unsigned.
    let event = hooklane_testkit::fixtures::event("acme", "evt_1", t0());
    let delivery = hooklane_testkit::fixtures::delivery(&event, &a, t0());
    store
        .publish(&event, std::slice::from_ref(&delivery))
        .await
        .unwrap();
    let app = hooklane_testkit::fixtures::app_on(
        std::sync::Arc::new(withheld),
        std::sync::Arc::new(hooklane::SystemClock),
    );
    let refused = hooklane::service::deliver::attempt(
        &app,
        &delivery.id,
        hooklane::domain::Trigger::Scheduled,
    )
    .await
    .unwrap_err();
    assert!(
        refused.to_string().contains("holds no secrets key"),
        "{refused}"
    );
    let stored = store
        .get_delivery(&delivery.account_id, &delivery.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, hooklane::domain::DeliveryStatus::Pending);
    assert_eq!(stored.attempts, 0);

    // ep_a's sealed secret copied onto ep_b's item does not open there.
    client
        .update_item()
        .table_name(&tables.endpoints)
        .key("account_id", AttributeValue::S("acme".into()))
        .key("id", AttributeValue::S("ep_b".into()))
        .update_expression("SET secret = :s")
        .expression_attribute_values(":s", AttributeValue::S(secret))
        .send()
        .await
        .unwrap();
    let refused = secrets_of(&store, &b).await.unwrap_err();
    assert!(refused.contains("another endpoint"), "{refused}");
    let _ = raw_item("ep_b").await;
}

/// The account-token signing key, the same way in both stores: whoever holds it mints a token
/// for any account, which reads that account's endpoint secrets through the API. `open`
/// gives a store over the same data with the cipher given.
async fn the_token_key_is_sealed(open: &dyn Fn(SecretsCipher) -> Box<dyn Store>) {
    const SETTING: &str = "account_token_key";
    let old = open(cipher(&OLD, None));
    let key = hex(old.as_ref()).await;
    let stored = old.get_setting(SETTING).await.unwrap().unwrap();
    assert!(
        stored.starts_with(&format!("enc:v1:{}:", key_id(&OLD))) && !stored.contains(&key),
        "stored as {stored}"
    );
    assert_eq!(hex(old.as_ref()).await, key, "the same key at every start");
    drop(old);

    // A rotation of the secrets key: the same token key, sealed again under the new one.
    let rotated = open(cipher(&NEW, Some(&OLD)));
    assert_eq!(hex(rotated.as_ref()).await, key);
    let stored = rotated.get_setting(SETTING).await.unwrap().unwrap();
    assert!(
        stored.starts_with(&format!("enc:v1:{}:", key_id(&NEW))),
        "{stored}"
    );

    // A key in plaintext (an older build's, or one written without the secrets key) is
    // never used: a new sealed one replaces it.
    let planted = hooklane::tokens::TokenKey::generate().to_hex();
    rotated.put_setting(SETTING, &planted).await.unwrap();
    let replaced = hex(rotated.as_ref()).await;
    assert_ne!(replaced, planted, "the plaintext key was used");
    assert_ne!(replaced, key);
    let stored = rotated.get_setting(SETTING).await.unwrap().unwrap();
    assert!(
        stored.starts_with(&format!("enc:v1:{}:", key_id(&NEW))),
        "{stored}"
    );
}

async fn hex(store: &dyn Store) -> String {
    hooklane::service::tokens::signing_key(store)
        .await
        .unwrap()
        .to_hex()
}

#[tokio::test]
async fn the_token_signing_key_is_sealed_in_the_sqlite_file() {
    let dir = std::env::temp_dir().join(format!("hooklane-token-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("token-key.db");
    the_token_key_is_sealed(&|cipher| Box::new(SqliteStore::open(&path, cipher).unwrap())).await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn the_token_signing_key_is_sealed_in_the_control_table() {
    use hooklane::store::dynamodb::{DynamoStore, Retention};
    let base = hooklane_testkit::testing::emulator_store().await;
    let (client, tables) = (base.client().clone(), base.tables().clone());
    the_token_key_is_sealed(&|cipher| {
        Box::new(DynamoStore::new(
            client.clone(),
            tables.clone(),
            Retention::default(),
            cipher,
        ))
    })
    .await;
}
