use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
use url::Url;

use super::ssrf::{AddressPolicy, GuardedResolver, RefusedAddress, SsrfError};

/// One webhook POST.
#[derive(Debug, Clone)]
pub struct OutboundRequest {
    pub url: Url,
    /// Hooklane's own headers, then the endpoint's custom ones (whose names never clash).
    pub headers: Vec<(std::borrow::Cow<'static, str>, String)>,
    pub body: Bytes,
}

/// What came back, always: a transport failure is data here, not an error.
#[derive(Debug, Clone, Default)]
pub struct OutboundResponse {
    pub status: Option<u16>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub body_truncated: bool,
    pub latency: Duration,
    /// Set when no complete response was received (the status may still be known).
    pub error: Option<String>,
}

impl OutboundResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The port the delivery service sends through.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    async fn post(&self, request: OutboundRequest) -> OutboundResponse;
}

#[derive(Debug, Clone)]
pub struct SenderConfig {
    pub connect_timeout: Duration,
    /// The whole exchange: connect, send, headers and body.
    pub deadline: Duration,
    /// The most of a response body read, in bytes (what an attempt keeps of the answer is
    /// bounded again when it is recorded: `domain::KeptResponse`).
    pub max_response_body: usize,
    pub user_agent: String,
    pub policy: AddressPolicy,
}

impl Default for SenderConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            deadline: Duration::from_secs(10),
            max_response_body: crate::domain::attempt::MAX_RESPONSE_BODY_BYTES,
            user_agent: format!("Hooklane/{}", crate::VERSION),
            policy: AddressPolicy::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client: {0}")]
pub struct SenderBuildError(String);

/// The real sender: reqwest with the SSRF-guarded resolver, no redirects, strict time limits.
#[derive(Clone)]
pub struct HttpSender {
    client: reqwest::Client,
    config: Arc<SenderConfig>,
}

impl HttpSender {
    pub fn new(config: SenderConfig) -> Result<Self, SenderBuildError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.connect_timeout)
            // A backstop only: the deadline is enforced around the whole exchange in `post`.
            .timeout(config.deadline + Duration::from_secs(1))
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .user_agent(config.user_agent.clone())
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver::new(config.policy.clone())))
            .build()
            .map_err(|e| SenderBuildError(e.to_string()))?;
        Ok(Self {
            client,
            config: Arc::new(config),
        })
    }

    async fn exchange(
        &self,
        request: OutboundRequest,
        response: &mut OutboundResponse,
    ) -> Result<(), String> {
        let host = request.url.host_str().unwrap_or_default().to_owned();
        let mut builder = self.client.post(request.url);
        for (name, value) in request.headers {
            builder = builder.header(name.as_ref(), value);
        }
        let mut reply =
            builder
                .body(request.body)
                .send()
                .await
                .map_err(|e| match refused_address(&e) {
                    Some(refused) => refused_at_send(&host, refused.reason()),
                    None => describe(&e),
                })?;
        response.status = Some(reply.status().as_u16());
        // Only as many as an attempt keeps; each is cut to size when it is kept.
        response.headers = reply
            .headers()
            .iter()
            .take(crate::domain::attempt::MAX_RESPONSE_HEADERS)
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_owned(), value)
            })
            .collect();
        let cap = self.config.max_response_body;
        while let Some(chunk) = reply
            .chunk()
            .await
            .map_err(|e| format!("reading the response body: {}", describe(&e)))?
        {
            let room = cap.saturating_sub(response.body.len());
            if chunk.len() > room {
                response.body.extend_from_slice(&chunk[..room]);
                response.body_truncated = true;
                // Enough to show in the log; the rest is not worth waiting for.
                break;
            }
            response.body.extend_from_slice(&chunk);
        }
        Ok(())
    }
}

#[async_trait]
impl Transport for HttpSender {
    async fn post(&self, request: OutboundRequest) -> OutboundResponse {
        let started = std::time::Instant::now();
        let mut response = OutboundResponse::default();
        if let Err(refused) = self.config.policy.check_url(&request.url) {
            response.error = Some(match RefusedAddress::of(refused) {
                Ok(address) => {
                    refused_at_send(request.url.host_str().unwrap_or_default(), address.reason())
                }
                // The URL's own text (its scheme, a localhost name): nothing of the network.
                Err(other) => format!("refused: {other}"),
            });
            return response;
        }
        let deadline = self.config.deadline;
        let outcome = tokio::time::timeout(deadline, self.exchange(request, &mut response)).await;
        response.latency = started.elapsed();
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(error)) => response.error = Some(error),
            Err(_) => {
                response.error = Some(format!(
                    "no complete response within the {} s deadline",
                    deadline.as_secs_f64()
                ))
            }
        }
        response
    }
}

/// What an attempt records for a host that is, or resolves to, a refused address: one text
/// for every address and reason (the customer reads it); the reason is logged, for the
/// operator (an endpoint created while the allow-list let it, a name whose DNS changed).
fn refused_at_send(host: &str, reason: &SsrfError) -> String {
    tracing::warn!(
        host,
        reason = %reason,
        "a webhook is not sent: its host is, or resolves to, a refused address"
    );
    super::ssrf::REFUSED_AT_SEND.to_owned()
}

/// The refused address behind a failed request, if that is why it failed: the guarded
/// resolver's error, somewhere in the chain (as itself, or inside an `io::Error`).
fn refused_address(error: &reqwest::Error) -> Option<&RefusedAddress> {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<RefusedAddress>() {
            return Some(refused);
        }
        if let Some(refused) = cause
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<RefusedAddress>())
        {
            return Some(refused);
        }
        source = cause.source();
    }
    None
}

/// A one-line account of a reqwest error, with the cause that matters to a customer.
fn describe(error: &reqwest::Error) -> String {
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !causes.contains(&text) {
            causes.push(text);
        }
        source = cause.source();
    }
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else if error.is_body() || error.is_decode() {
        "bad response body"
    } else if error.is_request() {
        "request failed"
    } else {
        "HTTP error"
    };
    if causes.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {}", causes.join(": "))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::http::ssrf::{forbidden_reason, REFUSED_AT_SEND};

    /// A listener on 127.0.0.1 that counts the connections it gets and answers none.
    async fn counting_listener() -> (u16, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        (port, connections)
    }

    fn request(url: &str) -> OutboundRequest {
        OutboundRequest {
            url: Url::parse(url).unwrap(),
            headers: Vec::new(),
            body: Bytes::from_static(b"{}"),
        }
    }

    /// Two refused reasons, the same recorded text; and that text tells none of them.
    #[test]
    fn refused_reasons_are_recorded_alike() {
        let refused = |ip: &str| SsrfError::ResolvesForbidden {
            host: "hooks.example.com".into(),
            reason: forbidden_reason(ip.parse().unwrap()).unwrap(),
        };
        let private = refused_at_send("hooks.example.com", &refused("10.0.0.1"));
        let loopback = refused_at_send("hooks.example.com", &refused("127.0.0.1"));
        assert_eq!(private, loopback);
        assert_eq!(private, REFUSED_AT_SEND);
        for detail in ["RFC 1918", "private", "loopback", "10.0.0.1", "127.0.0.1"] {
            assert!(!private.contains(detail), "{private}");
        }
    }

    /// Sending to a refused address, whatever its reason and however it is reached (an
    /// address in the URL: refused before any connection; a name: refused by the resolver),
    /// records the same text, and nothing is contacted. Only 127.0.0.1 and 0.0.0.0 (this
    /// machine) are named; both are refused before any connection.
    #[tokio::test]
    async fn a_refused_address_records_one_text_whatever_its_reason() {
        let (port, connections) = counting_listener().await;
        let sender = HttpSender::new(SenderConfig::default()).unwrap();
        let loopback = sender
            .post(request(&format!("http://127.0.0.1:{port}/hook")))
            .await;
        let unspecified = sender
            .post(request(&format!("http://0.0.0.0:{port}/hook")))
            .await;
        // `post` refuses localhost names outright (a URL's text): the resolver is reached
        // through the exchange, as for any other name.
        let mut response = OutboundResponse::default();
        let named = sender
            .exchange(
                request(&format!("http://localhost:{port}/hook")),
                &mut response,
            )
            .await
            .unwrap_err();
        assert_eq!(loopback.error.as_deref(), Some(REFUSED_AT_SEND));
        assert_eq!(unspecified.error.as_deref(), Some(REFUSED_AT_SEND));
        assert_eq!(named, REFUSED_AT_SEND);
        assert_eq!(response.status, None);
        assert_eq!(connections.load(Ordering::SeqCst), 0);
        // The URL's own text is still said as it is.
        let scheme = sender.post(request("ftp://127.0.0.1/")).await;
        assert!(
            scheme
                .error
                .as_deref()
                .unwrap_or("")
                .contains("scheme `ftp`"),
            "{scheme:?}"
        );
    }
}
