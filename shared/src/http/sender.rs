use std::{
    sync::{Arc, PoisonError, RwLock},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use bytes::Bytes;
use url::Url;

use super::ssrf::{AddressPolicy, GuardedResolver, RefusedAddress, SsrfError};

/// How long a connection is kept idle for the next webhook to its host. An endpoint sent to
/// at least this often keeps its connection (the busy ones, where reuse saves the most
/// handshakes); each host sent to within it holds one descriptor, so at 100 deliveries a
/// second to distinct hosts about 400 are held (at 60 s it was 6,000, past the 1,024
/// open files a systemd service or a Lambda gets). Below the 5 s after which Node.js,
/// Apache and uvicorn close an idle connection, so a request rarely goes out on a connection
/// the receiver is closing.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Idle connections kept per host: as many as `serve`'s default workers, the most requests
/// in flight at once, so a host taking all of them reuses them all. It bounds nothing for
/// many hosts (one connection each); the idle timeout does.
const POOL_MAX_IDLE_PER_HOST: usize = 64;

/// Dropping a pool only tells its connections' tasks to close their sockets: the connection
/// is tried again once they have had this long to run.
const POOL_DROP_SETTLE: Duration = Duration::from_millis(100);

/// A pool is not replaced again within this long of the last replacement: what runs out
/// again so soon is likely held elsewhere than in idle connections, and each replacement
/// costs every busy host a new handshake.
const POOL_RENEWAL_MIN_INTERVAL: Duration = Duration::from_secs(1);

// Linux's numbers (EMFILE, ENFILE and ENOMEM are the same on macOS and the BSDs).
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;
const ENOMEM: i32 = 12;
#[cfg(not(any(target_os = "macos", target_os = "ios", target_os = "freebsd")))]
const ENOBUFS: i32 = 105;
#[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
const ENOBUFS: i32 = 55;

/// Why a webhook never left this process: a resource of its own ran out when it was to open
/// the connection (or look its host up). Not the endpoint's failure: nothing is recorded
/// against it, and the delivery is tried again soon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LocalFault {
    /// `EMFILE`: this process is at its open-files limit.
    #[error("this process is out of file descriptors (EMFILE: Too many open files)")]
    ProcessFileLimit,
    /// `ENFILE`: the host is at its system-wide limit of open files.
    #[error("the host is out of file descriptors (ENFILE: Too many open files in system)")]
    SystemFileLimit,
    /// `ENOBUFS` or `ENOMEM`: the kernel has no memory for another socket.
    #[error("the kernel has no memory for another socket (ENOBUFS/ENOMEM)")]
    SocketMemory,
    /// Too little of this Lambda invocation is left to send the webhook and still record its
    /// answer before the function is stopped: sent then, it could go unrecorded and be sent
    /// again.
    #[error("too little of the invocation is left to send the webhook and record its answer")]
    InvocationTime,
}

impl LocalFault {
    /// Every fault: what the metric's `cause` may be (see [`Self::label`]).
    pub const ALL: [Self; 4] = [
        Self::ProcessFileLimit,
        Self::SystemFileLimit,
        Self::SocketMemory,
        Self::InvocationTime,
    ];

    /// The fault an OS error code stands for, if it is one.
    pub fn of_os_error(code: i32) -> Option<Self> {
        match code {
            EMFILE => Some(Self::ProcessFileLimit),
            ENFILE => Some(Self::SystemFileLimit),
            ENOBUFS | ENOMEM => Some(Self::SocketMemory),
            _ => None,
        }
    }

    /// The fault behind `error`, if one is anywhere in its chain of sources: an `io::Error`
    /// with its OS code (itself, or wrapped inside another `io::Error`), or a name lookup
    /// that failed with one.
    pub fn find(error: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut next = Some(error);
        while let Some(cause) = next {
            if let Some(io) = cause.downcast_ref::<std::io::Error>() {
                if let Some(fault) = io.raw_os_error().and_then(Self::of_os_error) {
                    return Some(fault);
                }
                // A wrapping `io::Error` gives its inner error's source, not the inner error.
                if let Some(fault) = io.get_ref().and_then(|inner| Self::find(inner)) {
                    return Some(fault);
                }
            }
            if let Some(SsrfError::LookupFailed {
                os_error: Some(code),
                ..
            }) = cause.downcast_ref::<SsrfError>()
            {
                if let Some(fault) = Self::of_os_error(*code) {
                    return Some(fault);
                }
            }
            next = cause.source();
        }
        None
    }

    /// A metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::ProcessFileLimit | Self::SystemFileLimit => "file_descriptors",
            Self::SocketMemory => "socket_memory",
            Self::InvocationTime => "invocation_time",
        }
    }
}

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
    /// Set when nothing was sent because this process ran out of a resource of its own
    /// (`error` says so too): no attempt to record against the endpoint.
    pub unsent: Option<LocalFault>,
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
/// Clones share one client, which is replaced (and its pool of idle connections dropped)
/// when a connection cannot be opened for want of descriptors.
#[derive(Clone)]
pub struct HttpSender {
    pool: Arc<RwLock<Pool>>,
    config: Arc<SenderConfig>,
}

/// The client in use, which holds the pool of idle connections.
struct Pool {
    client: reqwest::Client,
    /// Counts replacements: a send that met the limit replaces the client it used, not a
    /// newer one another send has already put in its place.
    generation: u64,
    /// When the last replacement was made (none yet: the first client may be replaced at
    /// once, however new).
    renewed_at: Option<Instant>,
}

/// Why an exchange came to no complete response.
enum Failure {
    /// Nothing was sent: this process ran out of a resource of its own.
    Local(LocalFault),
    /// What the attempt records.
    Other(String),
}

impl HttpSender {
    pub fn new(config: SenderConfig) -> Result<Self, SenderBuildError> {
        let client = build_client(&config)?;
        Ok(Self {
            pool: Arc::new(RwLock::new(Pool {
                client,
                generation: 0,
                renewed_at: None,
            })),
            config: Arc::new(config),
        })
    }

    /// The client in use and its generation. A clone: the lock is never held across a send.
    fn client(&self) -> (reqwest::Client, u64) {
        // A client and two numbers: nothing a panic could leave half-written.
        let pool = self.pool.read().unwrap_or_else(PoisonError::into_inner);
        (pool.client.clone(), pool.generation)
    }

    /// Replaces the client of `generation` with a fresh one, so that its pool, and with it
    /// every idle connection, is dropped (once the requests still using it are answered).
    /// Not when another send has replaced it already, nor within
    /// [`POOL_RENEWAL_MIN_INTERVAL`] of the last replacement. `true` when it was replaced here.
    fn renew(&self, generation: u64) -> bool {
        let due = {
            let pool = self.pool.read().unwrap_or_else(PoisonError::into_inner);
            pool.generation == generation
                && pool
                    .renewed_at
                    .is_none_or(|at| at.elapsed() >= POOL_RENEWAL_MIN_INTERVAL)
        };
        if !due {
            return false;
        }
        let fresh = match build_client(&self.config) {
            Ok(client) => client,
            Err(error) => {
                // It was built from the same settings before: not expected.
                tracing::error!(%error, "cannot build a fresh HTTP client; the idle connections stay");
                return false;
            }
        };
        let old = {
            let mut pool = self.pool.write().unwrap_or_else(PoisonError::into_inner);
            if pool.generation != generation {
                return false;
            }
            pool.generation += 1;
            pool.renewed_at = Some(Instant::now());
            std::mem::replace(&mut pool.client, fresh)
        };
        drop(old);
        true
    }

    /// The exchange; if its connection could not be opened for want of descriptors (or
    /// socket memory), the idle connections are dropped and it is tried once more. Nothing
    /// was sent the first time, so the second is not a repeat.
    async fn exchange_or_reconnect(
        &self,
        request: &OutboundRequest,
        response: &mut OutboundResponse,
    ) -> Result<(), Failure> {
        let (client, generation) = self.client();
        // The client is moved in and dropped with the exchange: it keeps no pool alive below.
        let fault = match self.exchange(client, request, response).await {
            Err(Failure::Local(fault)) => fault,
            done => return done,
        };
        let host = request.url.host_str().unwrap_or_default();
        if self.renew(generation) {
            tracing::warn!(
                host,
                cause = %fault,
                "a webhook's connection could not be opened: idle connections dropped, connecting again"
            );
        }
        tokio::time::sleep(POOL_DROP_SETTLE).await;
        *response = OutboundResponse::default();
        let (client, _) = self.client();
        let again = self.exchange(client, request, response).await;
        let outcome = match &again {
            Err(Failure::Local(_)) => "put_back",
            _ => "retried",
        };
        crate::telemetry::send_out_of_resources(fault.label(), outcome);
        again
    }

    async fn exchange(
        &self,
        client: reqwest::Client,
        request: &OutboundRequest,
        response: &mut OutboundResponse,
    ) -> Result<(), Failure> {
        let host = request.url.host_str().unwrap_or_default();
        let mut builder = client.post(request.url.clone());
        for (name, value) in &request.headers {
            builder = builder.header(name.as_ref(), value.as_str());
        }
        let sent = builder.body(request.body.clone()).send().await;
        // Its pool lives on in the client in use, or is dropped if that was replaced.
        drop(client);
        let mut reply = sent.map_err(|e| match refused_address(&e) {
            Some(refused) => Failure::Other(refused_at_send(host, refused.reason())),
            None => match local_fault_of(e.is_connect(), &e) {
                Some(fault) => Failure::Local(fault),
                None => Failure::Other(describe(&e)),
            },
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
            .map_err(|e| Failure::Other(format!("reading the response body: {}", describe(&e))))?
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

/// The fault of this process's own behind a failed send, if the send failed while
/// `connecting` (the name lookup included): only then is it sure nothing reached the
/// endpoint. Out of memory writing the body or reading the answer, the request may have been
/// taken, so that is the attempt's failure like any other.
fn local_fault_of(
    connecting: bool,
    error: &(dyn std::error::Error + 'static),
) -> Option<LocalFault> {
    if connecting {
        LocalFault::find(error)
    } else {
        None
    }
}

fn build_client(config: &SenderConfig) -> Result<reqwest::Client, SenderBuildError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(config.connect_timeout)
        // A backstop only: the deadline is enforced around the whole exchange in `post`.
        .timeout(config.deadline + Duration::from_secs(1))
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .tcp_nodelay(true)
        .user_agent(config.user_agent.clone())
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver::new(config.policy.clone())))
        .build()
        .map_err(|e| SenderBuildError(e.to_string()))
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
        let outcome = tokio::time::timeout(
            deadline,
            self.exchange_or_reconnect(&request, &mut response),
        )
        .await;
        response.latency = started.elapsed();
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(Failure::Other(error))) => response.error = Some(error),
            Ok(Err(Failure::Local(fault))) => {
                response.error = Some(format!("not sent: {fault}"));
                response.unsent = Some(fault);
            }
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
                sender.client().0,
                &request(&format!("http://localhost:{port}/hook")),
                &mut response,
            )
            .await;
        let Err(Failure::Other(named)) = named else {
            panic!("a refused name is a failed attempt");
        };
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

    /// An error wrapping others, as reqwest's and hyper's do: `source` gives the next.
    #[derive(Debug)]
    struct Wrapping(&'static str, Box<dyn std::error::Error + Send + Sync>);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.1)
        }
    }

    /// Only a send that failed connecting can be known unsent: socket memory short while the
    /// body or the answer was on its way is the attempt's failure.
    #[test]
    fn a_fault_after_connecting_is_the_attempts() {
        let os = std::io::Error::from_raw_os_error;
        let error = std::io::Error::other(os(ENOMEM));
        assert_eq!(local_fault_of(false, &error), None);
        assert_eq!(local_fault_of(true, &error), Some(LocalFault::SocketMemory));
    }

    /// EMFILE, ENFILE and the rest, however deep in a chain (as a source, inside an
    /// `io::Error`, behind a name lookup), are the process's own fault; a connection refused
    /// or reset, a timeout or an unrelated error is not.
    #[test]
    fn running_out_of_descriptors_is_found_anywhere_in_the_chain() {
        let os = std::io::Error::from_raw_os_error;
        let nested = |inner: std::io::Error| {
            // reqwest -> hyper's connect error -> an io::Error wrapping the OS error.
            Wrapping(
                "client error (Connect)",
                Box::new(Wrapping(
                    "tcp open error",
                    Box::new(std::io::Error::other(Wrapping("socket", Box::new(inner)))),
                )),
            )
        };
        assert_eq!(
            LocalFault::find(&nested(os(EMFILE))),
            Some(LocalFault::ProcessFileLimit)
        );
        assert_eq!(
            LocalFault::find(&nested(os(ENFILE))),
            Some(LocalFault::SystemFileLimit)
        );
        assert_eq!(
            LocalFault::find(&nested(os(ENOBUFS))),
            Some(LocalFault::SocketMemory)
        );
        // The OS error itself, and inside an io::Error's custom error.
        assert_eq!(
            LocalFault::find(&os(EMFILE)),
            Some(LocalFault::ProcessFileLimit)
        );
        assert_eq!(
            LocalFault::find(&std::io::Error::other(os(EMFILE))),
            Some(LocalFault::ProcessFileLimit)
        );
        // A name lookup that had no descriptor (getaddrinfo's EAI_SYSTEM).
        let lookup = SsrfError::LookupFailed {
            host: "hooks.example.com".into(),
            reason: "Too many open files (os error 24)".into(),
            os_error: Some(EMFILE),
        };
        assert_eq!(
            LocalFault::find(&Wrapping("dns error", Box::new(lookup))),
            Some(LocalFault::ProcessFileLimit)
        );
        // The endpoint's failures, and errors without an OS code.
        for code in [
            111, /* ECONNREFUSED */
            104, /* ECONNRESET */
            110, /* ETIMEDOUT */
        ] {
            assert_eq!(LocalFault::find(&nested(os(code))), None, "os error {code}");
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(LocalFault::find(&nested(refused)), None);
        let unresolved = SsrfError::LookupFailed {
            host: "nowhere.example".into(),
            reason: "failed to lookup address information".into(),
            os_error: None,
        };
        assert_eq!(
            LocalFault::find(&Wrapping("dns error", Box::new(unresolved))),
            None
        );
    }

    /// A real connection refused (nothing listens on the port) is a failed attempt, recorded
    /// against the endpoint: not taken for the process's own fault.
    #[tokio::test]
    async fn a_connection_refused_is_the_endpoints_failure() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let allow = AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()], false);
        let sender = HttpSender::new(SenderConfig {
            policy: allow,
            ..SenderConfig::default()
        })
        .unwrap();
        let (client, generation) = sender.client();
        let error = client
            .post(format!("http://127.0.0.1:{port}/hook"))
            .send()
            .await
            .unwrap_err();
        assert_eq!(LocalFault::find(&error), None, "{error:?}");
        let response = sender
            .post(request(&format!("http://127.0.0.1:{port}/hook")))
            .await;
        assert_eq!(response.unsent, None);
        let recorded = response.error.unwrap_or_default();
        assert!(recorded.starts_with("connection failed"), "{recorded}");
        // Nothing to free: the client is the one it was.
        assert_eq!(sender.client().1, generation);
    }
}
