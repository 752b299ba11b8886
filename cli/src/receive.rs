//! `hooklane receive`: a local webhook receiver that prints and verifies what it gets.

use std::{net::SocketAddr, sync::Arc};

use hooklane::signing::SigningSecret;

use axum::{
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode, Uri},
    Router,
};

#[derive(Debug, Clone)]
pub struct ReceiveOptions {
    pub listen: SocketAddr,
    pub secrets: Vec<SigningSecret>,
    /// Answer with this status instead of 200, to watch retries happen.
    pub status: u16,
}

struct Receiver {
    secrets: Vec<SigningSecret>,
    status: StatusCode,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

async fn receive(
    State(receiver): State<Arc<Receiver>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let id = header(&headers, "webhook-id");
    let timestamp = header(&headers, "webhook-timestamp");
    let signature = header(&headers, "webhook-signature");
    let verdict = if receiver.secrets.is_empty() {
        "not checked (start with --secret whsec_… to verify)".to_owned()
    } else {
        let now = chrono::Utc::now().timestamp();
        let secrets: Vec<&SigningSecret> = receiver.secrets.iter().collect();
        match hooklane::signing::verify(
            &secrets,
            id,
            timestamp,
            signature,
            &body,
            now,
            hooklane::signing::DEFAULT_TOLERANCE_SECS,
        ) {
            Ok(()) => "valid".to_owned(),
            Err(error) => format!("invalid: {error}"),
        }
    };
    println!(
        "POST {uri}\n  webhook-id: {id}\n  webhook-timestamp: {timestamp}\n  webhook-signature: {signature}\n  signature: {verdict}\n  body: {}\n",
        String::from_utf8_lossy(&body)
    );
    if !receiver.secrets.is_empty() && verdict != "valid" {
        return StatusCode::BAD_REQUEST;
    }
    receiver.status
}

pub async fn run(options: ReceiveOptions) -> std::io::Result<()> {
    let status = StatusCode::from_u16(options.status)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let receiver = Arc::new(Receiver {
        secrets: options.secrets,
        status,
    });
    let router = Router::new().fallback(receive).with_state(receiver);
    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    println!("receiving webhooks on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await
}
