use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
use url::Url;

use super::ssrf::{AddressPolicy, GuardedResolver};

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
        let mut builder = self.client.post(request.url);
        for (name, value) in request.headers {
            builder = builder.header(name.as_ref(), value);
        }
        let mut reply = builder
            .body(request.body)
            .send()
            .await
            .map_err(|e| describe(&e))?;
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
            response.error = Some(format!("refused: {refused}"));
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
