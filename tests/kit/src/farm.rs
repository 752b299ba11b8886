//! A fake endpoint farm: one HTTP/1.1 server on 127.0.0.1 that plays any number of
//! customer webhook endpoints (`/ep/{name}`), each with its own configurable, possibly
//! hostile, behaviour, and records every request it receives.
//!
//! HTTP is implemented by hand on top of tokio sockets so that the farm can misbehave
//! in ways a real HTTP library would refuse to: garbage instead of a status line,
//! closing mid-response, dripping or endless bodies, thousands of headers.
//!
//! Bookkeeping is exact: a request counts as in flight from the moment its head is
//! parsed until its response is completely written or its connection is gone, which a
//! drop guard guarantees on every path.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Largest request head (request line plus headers) accepted; larger heads get 431.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest request body accepted; larger bodies get 413.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Longest chunk-size or trailer line accepted in a chunked request body.
const MAX_CHUNK_LINE_BYTES: usize = 8 * 1024;
/// While waiting (latency, drip), pipelined bytes from the client are buffered up to this.
const MAX_BUFFERED_WHILE_WAITING: usize = 1024 * 1024;
const READ_RESERVE_BYTES: usize = 8 * 1024;
const LINGER_AFTER_REJECT: Duration = Duration::from_secs(2);
const COPY_BODY_BELOW_BYTES: usize = 64 * 1024;
/// Size of each write when streaming huge or endless bodies.
const STREAM_CHUNK_BYTES: usize = 64 * 1024;
/// The Content-Length announced by [`Hostile::DripBody`].
pub const DRIP_CONTENT_LENGTH: u64 = 1024 * 1024;

const ENDPOINT_PREFIX: &str = "/ep/";
const DEFAULT_BODY: &[u8] = br#"{"ok":true}"#;
const FAILURE_BODY: &[u8] = br#"{"ok":false}"#;
const NOT_FOUND_BODY: &[u8] = br#"{"error":"no such endpoint"}"#;
const ERROR_BODY: &[u8] = br#"{"error":"bad request"}"#;
const CLOSE_MID_RESPONSE_BYTES: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-len";
const INVALID_HTTP_BYTES: &[u8] = b"SSH-2.0-NotHttp\r\n\x00\xff\xfe\x01garbage\x7f\r\n\r\n";

static FILLER: [u8; STREAM_CHUNK_BYTES] = [b'x'; STREAM_CHUNK_BYTES];

/// The fake endpoint farm. Cloning is cheap and every clone observes the same server;
/// the listener stops accepting once the last clone is dropped.
#[derive(Clone)]
pub struct Farm {
    state: Arc<State>,
    _accept_loop: Arc<AbortOnDrop>,
}

/// One request as the farm received it.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// Endpoint name from `/ep/{name}`; `""` for requests to any other path.
    pub endpoint: String,
    pub received_at: SystemTime,
    pub instant: Instant,
    pub method: String,
    /// Full request target, including any query string.
    pub path: String,
    /// Header names lower-cased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub webhook_id: Option<String>,
    pub webhook_timestamp: Option<String>,
    pub webhook_signature: Option<String>,
    /// The status the farm answered with, or 0 if it sent no valid status line
    /// (hostile behaviours, or the client left before the answer was written).
    /// While the request is still in flight this is the status it is about to send.
    pub status: u16,
    /// Which accepted connection carried the request (1-based, in accept order).
    pub connection_id: u64,
}

impl Arrival {
    /// The first value of the header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header_value(&self.headers, name)
    }

    /// Whether the webhook verifies with the `whsec_…` secret `secret`, now, as a receiver
    /// checks it.
    pub fn verify_with(&self, secret: &str) -> Result<(), String> {
        use hooklane::signing::{self, SigningSecret};
        let secret = SigningSecret::parse(secret).map_err(|e| e.to_string())?;
        signing::verify(
            &[&secret],
            self.webhook_id.as_deref().unwrap_or(""),
            self.webhook_timestamp.as_deref().unwrap_or(""),
            self.webhook_signature.as_deref().unwrap_or(""),
            &self.body,
            chrono::Utc::now().timestamp(),
            signing::DEFAULT_TOLERANCE_SECS,
        )
        .map_err(|e| e.to_string())
    }
}

/// How an endpoint answers.
///
/// Precedence for each request: a failure (`fail_first`, then `failure_rate`) answers
/// `failure_status`; otherwise `hostile`, if set, replaces the normal answer; otherwise
/// the endpoint answers `status`. `latency` is waited before any of these.
#[derive(Debug, Clone, PartialEq)]
pub struct Behavior {
    pub status: u16,
    pub latency: Duration,
    pub failure_rate: f64,
    pub failure_status: u16,
    /// The first N requests carrying the same `webhook-id` get `failure_status`.
    /// Requests without a `webhook-id` share one counter.
    pub fail_first: u32,
    /// Retry-After value sent with every non-2xx answer.
    pub retry_after: Option<String>,
    /// Location header sent with normal (non-failure) answers.
    pub location: Option<String>,
    /// Body of normal answers; defaults to `{"ok":true}`.
    pub response_body: Option<Bytes>,
    pub hostile: Option<Hostile>,
}

/// Ways an endpoint can misbehave. All of them close the connection afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hostile {
    /// Read the request, never answer, keep the socket open until the client leaves.
    Hang,
    /// 200 with a Content-Length of [`DRIP_CONTENT_LENGTH`], then one body byte per interval.
    DripBody { interval: Duration },
    /// 200 with chunked encoding and chunks forever, as fast as the client reads.
    EndlessBody,
    /// 200 with Content-Length `bytes`, streamed without allocating it.
    HugeBody { bytes: u64 },
    /// Send the status line and part of the headers, then close.
    CloseMidResponse,
    /// Answer bytes that are not HTTP, then close.
    InvalidHttp,
    /// 200 with `count` extra response headers.
    ManyHeaders { count: usize },
}

impl Default for Behavior {
    fn default() -> Self {
        Behavior {
            status: 200,
            latency: Duration::ZERO,
            failure_rate: 0.0,
            failure_status: 500,
            fail_first: 0,
            retry_after: None,
            location: None,
            response_body: None,
            hostile: None,
        }
    }
}

impl Behavior {
    /// 200 at once.
    pub fn ok() -> Self {
        Self::default()
    }

    /// 200 after `latency`.
    pub fn slow(latency: Duration) -> Self {
        Behavior {
            latency,
            ..Self::default()
        }
    }

    /// Always answer `code`.
    pub fn status(code: u16) -> Self {
        Behavior {
            status: code,
            ..Self::default()
        }
    }

    /// Answer 500 with probability `rate`, 200 otherwise.
    pub fn flaky(rate: f64) -> Self {
        Behavior {
            failure_rate: rate,
            ..Self::default()
        }
    }

    /// Answer 500 to the first `n` attempts of each webhook-id, 200 afterwards.
    pub fn failing_first(n: u32) -> Self {
        Behavior {
            fail_first: n,
            ..Self::default()
        }
    }

    /// Answer `code` with a Location header (for 301/302/307/308).
    pub fn redirect(code: u16, location: impl Into<String>) -> Self {
        Behavior {
            status: code,
            location: Some(location.into()),
            ..Self::default()
        }
    }

    /// Misbehave as described by `hostile`.
    pub fn hostile(hostile: Hostile) -> Self {
        Behavior {
            hostile: Some(hostile),
            ..Self::default()
        }
    }

    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    pub fn with_failure_status(mut self, status: u16) -> Self {
        self.failure_status = status;
        self
    }

    pub fn with_retry_after(mut self, value: impl Into<String>) -> Self {
        self.retry_after = Some(value.into());
        self
    }

    pub fn with_body(mut self, body: impl Into<Bytes>) -> Self {
        self.response_body = Some(body.into());
        self
    }
}

impl Farm {
    /// Binds 127.0.0.1 on an ephemeral port and starts accepting connections.
    /// Must be called within a tokio runtime.
    pub async fn start() -> io::Result<Farm> {
        Self::start_on(0).await
    }

    /// Like [`Farm::start`] on a chosen loopback port: a receiver that comes back after
    /// being down (connections refused meanwhile).
    pub async fn start_on(port: u16) -> io::Result<Farm> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            addr,
            endpoints: RwLock::default(),
            record_arrivals: AtomicBool::new(true),
            connections_accepted: AtomicUsize::new(0),
            connections_open: AtomicUsize::new(0),
        });
        let accept_loop = tokio::spawn(accept_connections(listener, Arc::clone(&state)));
        Ok(Farm {
            state,
            _accept_loop: Arc::new(AbortOnDrop(accept_loop)),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.state.addr
    }

    /// `http://127.0.0.1:PORT/ep/{endpoint}`
    pub fn url(&self, endpoint: &str) -> String {
        format!("http://{}{ENDPOINT_PREFIX}{endpoint}", self.state.addr)
    }

    /// Sets how `endpoint` answers from now on. Unconfigured endpoints answer 200 at once.
    pub fn configure(&self, endpoint: &str, behavior: Behavior) {
        lock(&self.state.endpoint(endpoint)).behavior = Arc::new(behavior);
    }

    /// Every request received by `endpoint` since the last reset, in arrival order.
    /// Empty while arrival recording is off (see [`Farm::set_record_arrivals`]).
    pub fn arrivals(&self, endpoint: &str) -> Vec<Arrival> {
        self.read_endpoint(endpoint, |ep| ep.arrivals.clone())
            .unwrap_or_default()
    }

    pub fn arrival_count(&self, endpoint: &str) -> usize {
        self.read_endpoint(endpoint, |ep| ep.arrival_count)
            .unwrap_or(0)
    }

    /// Requests answered with a complete 2xx response.
    pub fn success_count(&self, endpoint: &str) -> usize {
        self.read_endpoint(endpoint, |ep| ep.success_count)
            .unwrap_or(0)
    }

    /// Distinct `webhook-id` values received.
    pub fn distinct_ids(&self, endpoint: &str) -> usize {
        self.read_endpoint(endpoint, |ep| ep.webhook_ids.len())
            .unwrap_or(0)
    }

    /// Distinct `webhook-id` values that got at least one complete 2xx response.
    pub fn distinct_ids_succeeded(&self, endpoint: &str) -> usize {
        self.read_endpoint(endpoint, |ep| ep.ids_succeeded)
            .unwrap_or(0)
    }

    /// Most requests in progress at once for `endpoint` since the last reset.
    pub fn peak_concurrency(&self, endpoint: &str) -> usize {
        self.read_endpoint(endpoint, |ep| ep.peak_concurrency)
            .unwrap_or(0)
    }

    pub fn in_flight(&self, endpoint: &str) -> usize {
        self.read_endpoint(endpoint, |ep| ep.in_flight).unwrap_or(0)
    }

    /// Endpoints that received at least one request since the last reset, sorted.
    pub fn endpoints(&self) -> Vec<String> {
        let mut names: Vec<String> = read(&self.state.endpoints)
            .iter()
            .filter(|(_, endpoint)| lock(endpoint).arrival_count > 0)
            .map(|(name, _)| name.clone())
            .collect();
        names.sort_unstable();
        names
    }

    pub fn total_arrivals(&self) -> usize {
        read(&self.state.endpoints)
            .values()
            .map(|endpoint| lock(endpoint).arrival_count)
            .sum()
    }

    /// TCP connections accepted since start (not affected by reset).
    pub fn connections_accepted(&self) -> usize {
        self.state.connections_accepted.load(Ordering::Relaxed)
    }

    /// TCP connections currently open.
    pub fn connections_open(&self) -> usize {
        self.state.connections_open.load(Ordering::Relaxed)
    }

    /// Turns keeping full [`Arrival`] records on or off (on by default). Counters,
    /// webhook-id sets and concurrency are tracked either way; turning records off
    /// keeps memory flat in long benchmarks.
    pub fn set_record_arrivals(&self, record: bool) {
        self.state.record_arrivals.store(record, Ordering::Relaxed);
    }

    /// [`Farm::set_record_arrivals`] for one endpoint, whatever the farm-wide setting: a
    /// benchmark keeps records of the few endpoints it times and counts the rest.
    pub fn set_record_arrivals_of(&self, endpoint: &str, record: bool) {
        lock(&self.state.endpoint(endpoint)).record = Some(record);
    }

    /// Checks `cond` every ~20 ms until it holds (true) or `timeout` passes (false).
    pub async fn wait_until(&self, timeout: Duration, cond: impl Fn(&Farm) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            tokio::time::sleep((deadline - now).min(Duration::from_millis(20))).await;
        }
    }

    /// Forgets arrivals, counters, webhook-ids (including `fail_first` progress) and
    /// peaks; keeps behaviours. Requests still in flight stay counted in `in_flight`
    /// but their outcome is not counted again.
    pub fn reset(&self) {
        for endpoint in read(&self.state.endpoints).values() {
            lock(endpoint).reset();
        }
    }

    fn read_endpoint<T>(&self, name: &str, f: impl FnOnce(&Endpoint) -> T) -> Option<T> {
        let endpoint = read(&self.state.endpoints).get(name).cloned()?;
        let guard = lock(&endpoint);
        Some(f(&guard))
    }
}

impl fmt::Debug for Farm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Farm")
            .field("addr", &self.state.addr)
            .field("connections_accepted", &self.connections_accepted())
            .finish_non_exhaustive()
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct State {
    addr: SocketAddr,
    endpoints: RwLock<HashMap<String, Arc<Mutex<Endpoint>>>>,
    record_arrivals: AtomicBool,
    connections_accepted: AtomicUsize,
    connections_open: AtomicUsize,
}

#[derive(Default)]
struct Endpoint {
    behavior: Arc<Behavior>,
    /// Overrides the farm-wide `record_arrivals` for this endpoint; kept across resets.
    record: Option<bool>,
    /// Bumped by reset so that requests admitted before it don't touch the new counts.
    generation: u64,
    arrivals: Vec<Arrival>,
    arrival_count: usize,
    success_count: usize,
    /// Attempts and success per webhook-id.
    webhook_ids: HashMap<String, WebhookIdRecord>,
    attempts_without_id: u32,
    ids_succeeded: usize,
    in_flight: usize,
    peak_concurrency: usize,
}

struct WebhookIdRecord {
    attempts: u32,
    succeeded: bool,
}

impl Endpoint {
    /// Counts an attempt for `webhook_id` and returns how many came before it.
    fn count_attempt(&mut self, webhook_id: Option<&str>) -> u32 {
        let attempts = match webhook_id {
            None => &mut self.attempts_without_id,
            Some(id) => match self.webhook_ids.get_mut(id) {
                Some(record) => &mut record.attempts,
                None => {
                    let record = WebhookIdRecord {
                        attempts: 1,
                        succeeded: false,
                    };
                    self.webhook_ids.insert(id.to_owned(), record);
                    return 0;
                }
            },
        };
        let previous = *attempts;
        *attempts = attempts.saturating_add(1);
        previous
    }

    fn reset(&mut self) {
        self.generation += 1;
        self.arrivals = Vec::new();
        self.arrival_count = 0;
        self.success_count = 0;
        self.webhook_ids = HashMap::new();
        self.attempts_without_id = 0;
        self.ids_succeeded = 0;
        self.peak_concurrency = self.in_flight;
    }
}

impl State {
    fn endpoint(&self, name: &str) -> Arc<Mutex<Endpoint>> {
        if let Some(endpoint) = read(&self.endpoints).get(name) {
            return Arc::clone(endpoint);
        }
        let mut endpoints = self
            .endpoints
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(endpoints.entry(name.to_owned()).or_default())
    }

    /// Records the request and decides how to answer it. The returned ticket keeps the
    /// request counted as in flight until it is dropped.
    fn admit(&self, request: Request, connection_id: u64) -> (Plan, RequestTicket) {
        let routed_name = endpoint_name(&request.path).map(str::to_owned);
        let endpoint_handle = self.endpoint(routed_name.as_deref().unwrap_or(""));
        let webhook_id = header_value(&request.headers, "webhook-id").map(str::to_owned);
        let record = lock(&endpoint_handle)
            .record
            .unwrap_or_else(|| self.record_arrivals.load(Ordering::Relaxed));
        let mut arrival = record.then(|| Arrival {
            endpoint: routed_name.clone().unwrap_or_default(),
            received_at: SystemTime::now(),
            instant: Instant::now(),
            webhook_id: webhook_id.clone(),
            webhook_timestamp: header_value(&request.headers, "webhook-timestamp")
                .map(str::to_owned),
            webhook_signature: header_value(&request.headers, "webhook-signature")
                .map(str::to_owned),
            method: request.method,
            path: request.path,
            headers: request.headers,
            body: request.body,
            status: 0,
            connection_id,
        });

        let mut guard = lock(&endpoint_handle);
        let endpoint = &mut *guard;
        let plan = if routed_name.is_some() {
            let behavior = Arc::clone(&endpoint.behavior);
            let earlier_attempts = endpoint.count_attempt(webhook_id.as_deref());
            let failing = earlier_attempts < behavior.fail_first
                || (behavior.failure_rate > 0.0 && rand::random::<f64>() < behavior.failure_rate);
            Plan::Answer { behavior, failing }
        } else {
            Plan::NotFound
        };
        let status = plan.status();

        endpoint.arrival_count += 1;
        let arrival_index = arrival.take().map(|mut arrival| {
            arrival.status = status;
            endpoint.arrivals.push(arrival);
            endpoint.arrivals.len() - 1
        });
        endpoint.in_flight += 1;
        endpoint.peak_concurrency = endpoint.peak_concurrency.max(endpoint.in_flight);
        let ticket = RequestTicket {
            generation: endpoint.generation,
            endpoint: Arc::clone(&endpoint_handle),
            arrival_index,
            webhook_id,
            status,
            status_line_sent: false,
            completed: false,
        };
        (plan, ticket)
    }
}

enum Plan {
    NotFound,
    Answer {
        behavior: Arc<Behavior>,
        failing: bool,
    },
}

impl Plan {
    fn status(&self) -> u16 {
        match self {
            Plan::NotFound => 404,
            Plan::Answer {
                failing: true,
                behavior,
            } => behavior.failure_status,
            Plan::Answer { behavior, .. } => match &behavior.hostile {
                None => behavior.status,
                Some(Hostile::Hang | Hostile::InvalidHttp) => 0,
                Some(_) => 200,
            },
        }
    }
}

/// Drop guard for one admitted request: on drop it ends the in-flight count and books
/// the outcome, however the request ended.
struct RequestTicket {
    endpoint: Arc<Mutex<Endpoint>>,
    generation: u64,
    arrival_index: Option<usize>,
    webhook_id: Option<String>,
    status: u16,
    status_line_sent: bool,
    completed: bool,
}

impl RequestTicket {
    fn mark_complete(&mut self) {
        self.status_line_sent = true;
        self.completed = true;
    }
}

impl Drop for RequestTicket {
    fn drop(&mut self) {
        let mut guard = lock(&self.endpoint);
        let endpoint = &mut *guard;
        endpoint.in_flight = endpoint.in_flight.saturating_sub(1);
        if endpoint.generation != self.generation {
            return;
        }
        if !self.status_line_sent {
            if let Some(arrival) = self
                .arrival_index
                .and_then(|index| endpoint.arrivals.get_mut(index))
            {
                arrival.status = 0;
            }
        }
        if self.completed && is_success(self.status) {
            endpoint.success_count += 1;
            if let Some(record) = self
                .webhook_id
                .as_deref()
                .and_then(|id| endpoint.webhook_ids.get_mut(id))
            {
                if !record.succeeded {
                    record.succeeded = true;
                    endpoint.ids_succeeded += 1;
                }
            }
        }
    }
}

/// Keeps `connections_open` accurate however a connection task ends.
struct OpenConnection<'a>(&'a AtomicUsize);

impl<'a> OpenConnection<'a> {
    fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        OpenConnection(counter)
    }
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn accept_connections(listener: TcpListener, state: Arc<State>) {
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                let connection_id = state.connections_accepted.fetch_add(1, Ordering::Relaxed) + 1;
                tokio::spawn(serve_connection(
                    Arc::clone(&state),
                    stream,
                    connection_id as u64,
                ));
            }
            // Usually file-descriptor exhaustion: back off rather than spin or give up.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn serve_connection(state: Arc<State>, mut stream: TcpStream, connection_id: u64) {
    let _open = OpenConnection::new(&state.connections_open);
    // Drip writes single bytes; don't let Nagle batch them.
    stream.set_nodelay(true).ok();
    let mut buffer = BytesMut::with_capacity(READ_RESERVE_BYTES);
    loop {
        let request = match read_request(&mut stream, &mut buffer).await {
            Ok(Some(request)) => request,
            Ok(None) | Err(ReadError::Disconnected) => return,
            Err(ReadError::Reject(status)) => {
                let response = PlainResponse {
                    status,
                    body: ERROR_BODY,
                    json: true,
                    location: None,
                    retry_after: None,
                };
                write_plain(&mut stream, &response, false, false).await.ok();
                // Lingering close: drain what the client is still sending, so that closing
                // doesn't reset the connection before it has read the error response.
                stream.shutdown().await.ok();
                tokio::time::timeout(LINGER_AFTER_REJECT, wait_for_disconnect(&mut stream))
                    .await
                    .ok();
                return;
            }
        };
        let keep_alive = request.keep_alive;
        let head_request = request.method == "HEAD";
        let (plan, ticket) = state.admit(request, connection_id);
        let reuse = respond(
            &mut stream,
            &mut buffer,
            plan,
            ticket,
            keep_alive,
            head_request,
        )
        .await;
        if !reuse {
            return;
        }
    }
}

/// Writes the answer for one request; returns whether the connection may be reused.
async fn respond(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
    plan: Plan,
    mut ticket: RequestTicket,
    keep_alive: bool,
    head_request: bool,
) -> bool {
    let (behavior, failing) = match plan {
        Plan::NotFound => {
            let response = PlainResponse {
                status: 404,
                body: NOT_FOUND_BODY,
                json: true,
                location: None,
                retry_after: None,
            };
            return finish_plain(stream, &response, &mut ticket, keep_alive, head_request).await;
        }
        Plan::Answer { behavior, failing } => (behavior, failing),
    };

    if !behavior.latency.is_zero()
        && !wait_unless_disconnected(stream, buffer, behavior.latency).await
    {
        return false;
    }

    let status = ticket.status;
    let retry_after = (!is_success(status))
        .then_some(behavior.retry_after.as_deref())
        .flatten();
    if failing {
        let response = PlainResponse {
            status,
            body: FAILURE_BODY,
            json: true,
            location: None,
            retry_after,
        };
        return finish_plain(stream, &response, &mut ticket, keep_alive, head_request).await;
    }

    let Some(hostile) = &behavior.hostile else {
        let response = PlainResponse {
            status,
            body: behavior.response_body.as_deref().unwrap_or(DEFAULT_BODY),
            json: behavior.response_body.is_none(),
            location: behavior.location.as_deref(),
            retry_after,
        };
        return finish_plain(stream, &response, &mut ticket, keep_alive, head_request).await;
    };

    // Hostile answers always end the connection; errors only mean the client left.
    let _ = match hostile {
        Hostile::Hang => {
            wait_for_disconnect(stream).await;
            Ok(())
        }
        Hostile::DripBody { interval } => drip_body(stream, buffer, &mut ticket, *interval).await,
        Hostile::EndlessBody => endless_body(stream, &mut ticket).await,
        Hostile::HugeBody { bytes } => huge_body(stream, &mut ticket, *bytes).await,
        Hostile::CloseMidResponse => stream
            .write_all(CLOSE_MID_RESPONSE_BYTES)
            .await
            .map(|()| ticket.status_line_sent = true),
        Hostile::InvalidHttp => stream.write_all(INVALID_HTTP_BYTES).await,
        Hostile::ManyHeaders { count } => many_headers(stream, &mut ticket, *count).await,
    };
    false
}

async fn finish_plain(
    stream: &mut TcpStream,
    response: &PlainResponse<'_>,
    ticket: &mut RequestTicket,
    keep_alive: bool,
    head_request: bool,
) -> bool {
    match write_plain(stream, response, keep_alive, head_request).await {
        Ok(()) => {
            ticket.mark_complete();
            keep_alive
        }
        Err(_) => false,
    }
}

struct PlainResponse<'a> {
    status: u16,
    body: &'a [u8],
    json: bool,
    location: Option<&'a str>,
    retry_after: Option<&'a str>,
}

async fn write_plain(
    stream: &mut TcpStream,
    response: &PlainResponse<'_>,
    keep_alive: bool,
    head_request: bool,
) -> io::Result<()> {
    let status = response.status;
    let mut head = status_line(status);
    let may_have_body = !(status < 200 || status == 204 || status == 304);
    if may_have_body {
        let _ = write!(head, "content-length: {}\r\n", response.body.len());
        if response.json {
            head.push_str("content-type: application/json\r\n");
        }
    }
    if let Some(location) = response.location {
        let _ = write!(head, "location: {location}\r\n");
    }
    if let Some(retry_after) = response.retry_after {
        let _ = write!(head, "retry-after: {retry_after}\r\n");
    }
    if !keep_alive {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    let body = if may_have_body && !head_request {
        response.body
    } else {
        &[]
    };
    stream
        .write_all_buf(&mut Buf::chain(head.as_bytes(), body))
        .await
}

async fn drip_body(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
    ticket: &mut RequestTicket,
    interval: Duration,
) -> io::Result<()> {
    let mut head = status_line(200);
    let _ = write!(
        head,
        "content-type: application/octet-stream\r\ncontent-length: {DRIP_CONTENT_LENGTH}\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    ticket.status_line_sent = true;
    for sent in 0..DRIP_CONTENT_LENGTH {
        if sent > 0 && !wait_unless_disconnected(stream, buffer, interval).await {
            return Ok(());
        }
        stream.write_all(b"x").await?;
    }
    ticket.completed = true;
    Ok(())
}

async fn endless_body(stream: &mut TcpStream, ticket: &mut RequestTicket) -> io::Result<()> {
    let mut head = status_line(200);
    head.push_str(
        "content-type: application/octet-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
    );
    stream.write_all(head.as_bytes()).await?;
    ticket.status_line_sent = true;
    let mut chunk = format!("{STREAM_CHUNK_BYTES:x}\r\n").into_bytes();
    chunk.extend_from_slice(&FILLER);
    chunk.extend_from_slice(b"\r\n");
    loop {
        stream.write_all(&chunk).await?;
    }
}

async fn huge_body(
    stream: &mut TcpStream,
    ticket: &mut RequestTicket,
    bytes: u64,
) -> io::Result<()> {
    let mut head = status_line(200);
    let _ = write!(
        head,
        "content-type: application/octet-stream\r\ncontent-length: {bytes}\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    ticket.status_line_sent = true;
    let mut remaining = bytes;
    while remaining > 0 {
        let len = remaining.min(STREAM_CHUNK_BYTES as u64) as usize;
        stream.write_all(&FILLER[..len]).await?;
        remaining -= len as u64;
    }
    ticket.completed = true;
    Ok(())
}

async fn many_headers(
    stream: &mut TcpStream,
    ticket: &mut RequestTicket,
    count: usize,
) -> io::Result<()> {
    let mut head = status_line(200);
    head.reserve(count * 24);
    for index in 0..count {
        let _ = write!(head, "x-farm-filler-{index}: {index}\r\n");
    }
    let _ = write!(
        head,
        "content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        DEFAULT_BODY.len()
    );
    stream
        .write_all_buf(&mut Buf::chain(head.as_bytes(), DEFAULT_BODY))
        .await?;
    ticket.mark_complete();
    Ok(())
}

/// Sleeps for `duration` unless the client closes first (returns false then). Bytes the
/// client sends meanwhile (pipelined requests) are kept in `buffer`, up to a cap.
async fn wait_unless_disconnected(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
    duration: Duration,
) -> bool {
    let sleep = tokio::time::sleep(duration);
    tokio::pin!(sleep);
    loop {
        if buffer.len() >= MAX_BUFFERED_WHILE_WAITING {
            sleep.await;
            return true;
        }
        buffer.reserve(READ_RESERVE_BYTES);
        tokio::select! {
            () = &mut sleep => return true,
            read = stream.read_buf(buffer) => {
                if matches!(read, Ok(0) | Err(_)) {
                    return false;
                }
            }
        }
    }
}

/// Reads and discards until the client closes the connection.
async fn wait_for_disconnect(stream: &mut TcpStream) {
    let mut scratch = [0u8; 4096];
    while matches!(stream.read(&mut scratch).await, Ok(n) if n > 0) {}
}

fn status_line(status: u16) -> String {
    let mut line = String::with_capacity(192);
    let _ = write!(line, "HTTP/1.1 {status} {}\r\n", reason_phrase(status));
    line
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        410 => "Gone",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Status",
    }
}

fn is_success(status: u16) -> bool {
    (200..300).contains(&status)
}

/// The endpoint name of `/ep/{name}[/...][?...]`; None for any other target.
fn endpoint_name(path: &str) -> Option<&str> {
    let rest = path.strip_prefix(ENDPOINT_PREFIX)?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let name = &rest[..end];
    (!name.is_empty()).then_some(name)
}

fn header_value<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(header, _)| header.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

// ---------------------------------------------------------------------------------
// Request parsing

struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Bytes,
    keep_alive: bool,
}

enum ReadError {
    /// The connection ended or failed; nothing more can be said to the client.
    Disconnected,
    /// The request is unacceptable: answer this status and close.
    Reject(u16),
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> Self {
        ReadError::Disconnected
    }
}

enum BodyFraming {
    Empty,
    Length(usize),
    Chunked,
}

struct RequestHead {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    framing: BodyFraming,
    keep_alive: bool,
    expects_continue: bool,
}

/// Reads one request. `Ok(None)` means the client closed cleanly between requests.
async fn read_request(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
) -> Result<Option<Request>, ReadError> {
    let mut scanned = 0;
    let head_len = loop {
        // Tolerate stray CRLFs between requests (RFC 9112 §2.2).
        while buffer.starts_with(b"\r\n") {
            buffer.advance(2);
            scanned = 0;
        }
        if let Some(end) = find(&buffer[scanned..], b"\r\n\r\n") {
            break scanned + end + 4;
        }
        if buffer.len() >= MAX_HEAD_BYTES {
            return Err(ReadError::Reject(431));
        }
        scanned = buffer.len().saturating_sub(3);
        if fill(stream, buffer).await? == 0 {
            return if buffer.is_empty() {
                Ok(None)
            } else {
                Err(ReadError::Disconnected)
            };
        }
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(ReadError::Reject(431));
    }
    let head_bytes = buffer.split_to(head_len);
    let head = parse_head(&head_bytes).map_err(ReadError::Reject)?;

    if head.expects_continue && !matches!(head.framing, BodyFraming::Empty) && buffer.is_empty() {
        stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    let body = match head.framing {
        BodyFraming::Empty => Bytes::new(),
        BodyFraming::Length(length) => read_exact_body(stream, buffer, length).await?,
        BodyFraming::Chunked => read_chunked_body(stream, buffer).await?,
    };
    Ok(Some(Request {
        method: head.method,
        path: head.path,
        headers: head.headers,
        body,
        keep_alive: head.keep_alive,
    }))
}

fn parse_head(head: &[u8]) -> Result<RequestHead, u16> {
    let mut lines = head
        .split(|&byte| byte == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let request_line = lines.next().ok_or(400u16)?;
    let request_line = std::str::from_utf8(request_line).map_err(|_| 400u16)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(400);
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_graphic()) || target.is_empty() {
        return Err(400);
    }
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err(505),
    };

    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            continue;
        }
        // Obsolete line folding is rejected, as RFC 9112 allows.
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(400);
        }
        let colon = line.iter().position(|&b| b == b':').ok_or(400u16)?;
        let name = &line[..colon];
        if name.is_empty() || name.iter().any(|b| b.is_ascii_whitespace()) {
            return Err(400);
        }
        let value = line[colon + 1..].trim_ascii();
        headers.push((
            String::from_utf8_lossy(name).to_ascii_lowercase(),
            String::from_utf8_lossy(value).into_owned(),
        ));
    }

    let framing = body_framing(&headers)?;
    let connection_has = |token: &str| {
        headers
            .iter()
            .filter(|(name, _)| name == "connection")
            .flat_map(|(_, value)| value.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    let keep_alive = if http11 {
        !connection_has("close")
    } else {
        connection_has("keep-alive")
    };
    let expects_continue = http11
        && header_value(&headers, "expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    Ok(RequestHead {
        method: method.to_owned(),
        path: target.to_owned(),
        headers,
        framing,
        keep_alive,
        expects_continue,
    })
}

fn body_framing(headers: &[(String, String)]) -> Result<BodyFraming, u16> {
    let mut transfer_codings = headers
        .iter()
        .filter(|(name, _)| name == "transfer-encoding")
        .flat_map(|(_, value)| value.split(','))
        .map(str::trim)
        .filter(|coding| !coding.is_empty())
        .peekable();
    if transfer_codings.peek().is_some() {
        return match transfer_codings.last() {
            Some(last) if last.eq_ignore_ascii_case("chunked") => Ok(BodyFraming::Chunked),
            _ => Err(501),
        };
    }
    let mut length = None;
    for (_, value) in headers.iter().filter(|(name, _)| name == "content-length") {
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(400);
        }
        let parsed: u64 = value.parse().map_err(|_| 413u16)?;
        if length.is_some_and(|previous| previous != parsed) {
            return Err(400);
        }
        length = Some(parsed);
    }
    match length {
        None | Some(0) => Ok(BodyFraming::Empty),
        Some(length) if length > MAX_BODY_BYTES as u64 => Err(413),
        Some(length) => Ok(BodyFraming::Length(length as usize)),
    }
}

async fn read_exact_body(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
    length: usize,
) -> Result<Bytes, ReadError> {
    if buffer.len() < length {
        buffer.reserve(length - buffer.len());
    }
    while buffer.len() < length {
        if fill(stream, buffer).await? == 0 {
            return Err(ReadError::Disconnected);
        }
    }
    // Small bodies are copied out so that an Arrival doesn't pin the whole read buffer.
    if length < COPY_BODY_BELOW_BYTES {
        let body = Bytes::copy_from_slice(&buffer[..length]);
        buffer.advance(length);
        Ok(body)
    } else {
        Ok(buffer.split_to(length).freeze())
    }
}

async fn read_chunked_body(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
) -> Result<Bytes, ReadError> {
    let mut body = BytesMut::new();
    loop {
        let size_line = read_line(stream, buffer).await?;
        let size_text = size_line[..]
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default();
        let size_text =
            std::str::from_utf8(size_text.trim_ascii()).map_err(|_| ReadError::Reject(400))?;
        let size = usize::from_str_radix(size_text, 16).map_err(|_| ReadError::Reject(400))?;
        if size == 0 {
            // Trailer section, ended by an empty line; trailers are ignored.
            while !read_line(stream, buffer).await?.is_empty() {}
            return Ok(body.freeze());
        }
        if body.len().saturating_add(size) > MAX_BODY_BYTES {
            return Err(ReadError::Reject(413));
        }
        while buffer.len() < size + 2 {
            if fill(stream, buffer).await? == 0 {
                return Err(ReadError::Disconnected);
            }
        }
        if &buffer[size..size + 2] != b"\r\n" {
            return Err(ReadError::Reject(400));
        }
        body.extend_from_slice(&buffer[..size]);
        buffer.advance(size + 2);
    }
}

/// Reads one CRLF-terminated line and returns it without the line ending.
async fn read_line(stream: &mut TcpStream, buffer: &mut BytesMut) -> Result<BytesMut, ReadError> {
    let mut scanned = 0;
    loop {
        if let Some(end) = buffer[scanned..].iter().position(|&b| b == b'\n') {
            let mut line = buffer.split_to(scanned + end + 1);
            line.truncate(line.len() - 1);
            if line.ends_with(b"\r") {
                line.truncate(line.len() - 1);
            }
            return Ok(line);
        }
        if buffer.len() > MAX_CHUNK_LINE_BYTES {
            return Err(ReadError::Reject(400));
        }
        scanned = buffer.len();
        if fill(stream, buffer).await? == 0 {
            return Err(ReadError::Disconnected);
        }
    }
}

async fn fill(stream: &mut TcpStream, buffer: &mut BytesMut) -> io::Result<usize> {
    buffer.reserve(READ_RESERVE_BYTES);
    stream.read_buf(buffer).await
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// How long tests wait for something that should happen promptly.
    const PATIENCE: Duration = Duration::from_secs(10);

    fn client_with_timeout(timeout: Duration) -> reqwest::Client {
        reqwest::Client::builder().timeout(timeout).build().unwrap()
    }

    fn client() -> reqwest::Client {
        client_with_timeout(PATIENCE)
    }

    async fn post_webhook(client: &reqwest::Client, url: &str, id: &str) -> reqwest::Response {
        client
            .post(url)
            .header("webhook-id", id)
            .body("{}")
            .send()
            .await
            .unwrap()
    }

    /// Writes `request` on a fresh connection and returns everything the farm sends
    /// until it closes the connection.
    async fn raw_exchange(farm: &Farm, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(farm.addr()).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut response = Vec::new();
        tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response))
            .await
            .expect("farm did not close the connection")
            .unwrap();
        String::from_utf8_lossy(&response).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn default_endpoint_answers_200_and_records_the_arrival() {
        let farm = Farm::start().await.unwrap();
        let response = client()
            .post(format!("{}?attempt=1", farm.url("alpha")))
            .header("webhook-id", "msg_1")
            .header("webhook-timestamp", "1700000000")
            .header("webhook-signature", "v1,c2lnbmF0dXJl")
            .header("X-Custom", "Yes")
            .body(r#"{"type":"invoice.paid"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.text().await.unwrap(), r#"{"ok":true}"#);
        assert!(
            farm.wait_until(PATIENCE, |f| f.success_count("alpha") == 1)
                .await
        );

        let arrivals = farm.arrivals("alpha");
        assert_eq!(arrivals.len(), 1);
        let arrival = &arrivals[0];
        assert_eq!(arrival.endpoint, "alpha");
        assert_eq!(arrival.method, "POST");
        assert_eq!(arrival.path, "/ep/alpha?attempt=1");
        assert_eq!(&arrival.body[..], br#"{"type":"invoice.paid"}"#);
        assert_eq!(arrival.webhook_id.as_deref(), Some("msg_1"));
        assert_eq!(arrival.webhook_timestamp.as_deref(), Some("1700000000"));
        assert_eq!(
            arrival.webhook_signature.as_deref(),
            Some("v1,c2lnbmF0dXJl")
        );
        assert_eq!(arrival.header("x-custom"), Some("Yes"));
        assert_eq!(arrival.header("X-CUSTOM"), Some("Yes"));
        assert_eq!(arrival.header("content-length"), Some("23"));
        assert!(arrival.headers.iter().any(|(name, _)| name == "x-custom"));
        assert_eq!(arrival.status, 200);
        assert_eq!(arrival.connection_id, 1);

        assert_eq!(farm.endpoints(), vec!["alpha".to_owned()]);
        assert_eq!(farm.total_arrivals(), 1);
        assert_eq!(farm.arrival_count("alpha"), 1);
        assert_eq!(farm.distinct_ids("alpha"), 1);
        assert_eq!(farm.distinct_ids_succeeded("alpha"), 1);
        assert_eq!(farm.arrival_count("beta"), 0);
        assert!(farm.arrivals("beta").is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fail_first_counts_attempts_per_webhook_id() {
        let farm = Farm::start().await.unwrap();
        farm.configure("ff", Behavior::failing_first(2));
        let client = client();
        let url = farm.url("ff");
        let mut statuses = Vec::new();
        for id in ["msg_a", "msg_a", "msg_a", "msg_b"] {
            statuses.push(post_webhook(&client, &url, id).await.status().as_u16());
        }
        assert_eq!(statuses, [500, 500, 200, 500]);
        assert!(farm.wait_until(PATIENCE, |f| f.in_flight("ff") == 0).await);
        assert_eq!(farm.distinct_ids("ff"), 2);
        assert_eq!(farm.distinct_ids_succeeded("ff"), 1);
        assert_eq!(farm.success_count("ff"), 1);
        let recorded: Vec<u16> = farm.arrivals("ff").iter().map(|a| a.status).collect();
        assert_eq!(recorded, [500, 500, 200, 500]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failure_rate_one_always_fails_with_retry_after() {
        let farm = Farm::start().await.unwrap();
        farm.configure(
            "down",
            Behavior::flaky(1.0)
                .with_failure_status(503)
                .with_retry_after("7"),
        );
        let client = client();
        for attempt in 0..5 {
            let response = post_webhook(&client, &farm.url("down"), &format!("m{attempt}")).await;
            assert_eq!(response.status(), 503);
            assert_eq!(response.headers()["retry-after"], "7");
        }
        assert!(
            farm.wait_until(PATIENCE, |f| f.in_flight("down") == 0)
                .await
        );
        assert_eq!(farm.success_count("down"), 0);
        assert_eq!(farm.distinct_ids_succeeded("down"), 0);
        assert_eq!(farm.distinct_ids("down"), 5);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn peak_concurrency_counts_parallel_requests() {
        let farm = Farm::start().await.unwrap();
        // Long enough that all ten are surely in progress together even on a busy machine.
        farm.configure("slow", Behavior::slow(Duration::from_secs(1)));
        let client = client();
        let requests: Vec<_> = (0..10)
            .map(|i| {
                let client = client.clone();
                let url = farm.url("slow");
                tokio::spawn(async move {
                    let response = post_webhook(&client, &url, &format!("m{i}")).await;
                    response.status().as_u16()
                })
            })
            .collect();
        for request in requests {
            assert_eq!(request.await.unwrap(), 200);
        }
        assert_eq!(farm.peak_concurrency("slow"), 10);
        assert!(
            farm.wait_until(PATIENCE, |f| f.in_flight("slow") == 0)
                .await
        );
        assert!(
            farm.wait_until(PATIENCE, |f| f.success_count("slow") == 10)
                .await
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hang_times_out_the_client_and_releases_in_flight() {
        let farm = Farm::start().await.unwrap();
        farm.configure("hang", Behavior::hostile(Hostile::Hang));
        let error = client_with_timeout(Duration::from_millis(300))
            .post(farm.url("hang"))
            .body("{}")
            .send()
            .await
            .unwrap_err();
        assert!(error.is_timeout(), "{error:?}");
        assert!(
            farm.wait_until(PATIENCE, |f| f.arrival_count("hang") == 1)
                .await
        );
        assert!(
            farm.wait_until(PATIENCE, |f| f.in_flight("hang") == 0)
                .await
        );
        assert!(
            farm.wait_until(PATIENCE, |f| f.connections_open() == 0)
                .await
        );
        assert_eq!(farm.peak_concurrency("hang"), 1);
        assert_eq!(farm.arrivals("hang")[0].status, 0);
        assert_eq!(farm.success_count("hang"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drip_body_times_out_after_a_few_bytes() {
        let farm = Farm::start().await.unwrap();
        farm.configure(
            "drip",
            Behavior::hostile(Hostile::DripBody {
                interval: Duration::from_millis(50),
            }),
        );
        let mut response = client_with_timeout(Duration::from_millis(500))
            .get(farm.url("drip"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.content_length(), Some(DRIP_CONTENT_LENGTH));
        let mut received = 0;
        let error = loop {
            match response.chunk().await {
                Ok(Some(chunk)) => received += chunk.len(),
                Ok(None) => panic!("drip body ended"),
                Err(error) => break error,
            }
        };
        assert!(error.is_timeout(), "{error:?}");
        assert!((1..100).contains(&received), "received {received} bytes");
        drop(response);
        assert!(
            farm.wait_until(PATIENCE, |f| f.in_flight("drip") == 0)
                .await
        );
        assert_eq!(farm.success_count("drip"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn huge_body_streams_exactly_the_announced_length() {
        let farm = Farm::start().await.unwrap();
        let size = 10_000_000;
        farm.configure("huge", Behavior::hostile(Hostile::HugeBody { bytes: size }));
        let mut response = client().get(farm.url("huge")).send().await.unwrap();
        assert_eq!(response.content_length(), Some(size));
        let mut received = 0u64;
        while let Some(chunk) = response.chunk().await.unwrap() {
            received += chunk.len() as u64;
        }
        assert_eq!(received, size);
        assert!(
            farm.wait_until(PATIENCE, |f| f.success_count("huge") == 1)
                .await
        );
        assert_eq!(farm.in_flight("huge"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn endless_body_ends_when_the_client_leaves() {
        let farm = Farm::start().await.unwrap();
        farm.configure("endless", Behavior::hostile(Hostile::EndlessBody));
        let mut response = client().get(farm.url("endless")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let mut received = 0;
        while received < 4 * 1024 * 1024 {
            received += response.chunk().await.unwrap().expect("body ended").len();
        }
        drop(response);
        assert!(
            farm.wait_until(PATIENCE, |f| f.in_flight("endless") == 0)
                .await
        );
        assert_eq!(farm.success_count("endless"), 0);
        assert_eq!(farm.arrivals("endless")[0].status, 200);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_headers_make_the_client_fail() {
        let farm = Farm::start().await.unwrap();
        farm.configure(
            "headers",
            Behavior::hostile(Hostile::ManyHeaders { count: 10_000 }),
        );
        let result = client().get(farm.url("headers")).send().await;
        assert!(result.is_err(), "{result:?}");
        assert!(
            farm.wait_until(PATIENCE, |f| f.in_flight("headers") == 0)
                .await
        );
        assert!(farm.arrival_count("headers") >= 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_headers_are_all_sent() {
        let farm = Farm::start().await.unwrap();
        farm.configure(
            "headers",
            Behavior::hostile(Hostile::ManyHeaders { count: 1000 }),
        );
        let response = raw_exchange(&farm, b"GET /ep/headers HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"));
        assert_eq!(response.matches("x-farm-filler-").count(), 1000);
        assert!(response.ends_with("\r\n\r\n{\"ok\":true}"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn invalid_http_and_close_mid_response_make_the_client_fail() {
        let farm = Farm::start().await.unwrap();
        farm.configure("garbage", Behavior::hostile(Hostile::InvalidHttp));
        farm.configure("cut", Behavior::hostile(Hostile::CloseMidResponse));
        let client = client();
        for endpoint in ["garbage", "cut"] {
            let result = client.post(farm.url(endpoint)).body("{}").send().await;
            assert!(result.is_err(), "{endpoint}: {result:?}");
        }
        assert!(
            farm.wait_until(PATIENCE, |f| f.in_flight("garbage") == 0
                && f.in_flight("cut") == 0)
                .await
        );
        assert!(farm.arrivals("garbage").iter().all(|a| a.status == 0));
        assert!(farm.arrivals("cut").iter().all(|a| a.status == 200));
        assert_eq!(farm.success_count("garbage") + farm.success_count("cut"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keep_alive_reuses_connections() {
        let farm = Farm::start().await.unwrap();
        let client = client();
        for i in 0..100 {
            let response = post_webhook(&client, &farm.url("ka"), &format!("m{i}")).await;
            assert_eq!(response.status(), 200);
            response.bytes().await.unwrap();
        }
        assert!(
            farm.wait_until(PATIENCE, |f| f.success_count("ka") == 100)
                .await
        );
        let connections = farm.connections_accepted();
        assert!((1..=5).contains(&connections), "{connections} connections");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unknown_paths_get_404_under_the_empty_endpoint() {
        let farm = Farm::start().await.unwrap();
        let client = client();
        for path in ["/nope", "/ep/", "/epic"] {
            let url = format!("http://{}{path}", farm.addr());
            assert_eq!(client.get(url).send().await.unwrap().status(), 404);
        }
        assert_eq!(farm.arrival_count(""), 3);
        assert_eq!(farm.endpoints(), vec![String::new()]);
        assert!(farm
            .arrivals("")
            .iter()
            .all(|a| a.status == 404 && a.endpoint.is_empty()));
        assert!(farm.wait_until(PATIENCE, |f| f.in_flight("") == 0).await);
        assert_eq!(farm.success_count(""), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_and_redirect_behaviours() {
        let farm = Farm::start().await.unwrap();
        farm.configure(
            "moved",
            Behavior::redirect(308, "http://127.0.0.1:1/elsewhere"),
        );
        farm.configure("teapot", Behavior::status(418).with_retry_after("3"));
        farm.configure("custom", Behavior::status(202).with_body("accepted!"));
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(PATIENCE)
            .build()
            .unwrap();

        let moved = client.post(farm.url("moved")).send().await.unwrap();
        assert_eq!(moved.status(), 308);
        assert_eq!(moved.headers()["location"], "http://127.0.0.1:1/elsewhere");

        let teapot = client.post(farm.url("teapot")).send().await.unwrap();
        assert_eq!(teapot.status(), 418);
        assert_eq!(teapot.headers()["retry-after"], "3");

        let custom = client.post(farm.url("custom")).send().await.unwrap();
        assert_eq!(custom.status(), 202);
        assert!(custom.headers().get("retry-after").is_none());
        assert_eq!(custom.text().await.unwrap(), "accepted!");
        assert!(
            farm.wait_until(PATIENCE, |f| f.success_count("custom") == 1)
                .await
        );
        assert_eq!(
            farm.success_count("moved") + farm.success_count("teapot"),
            0
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelined_requests_with_chunked_body_and_connection_close() {
        let farm = Farm::start().await.unwrap();
        let response = raw_exchange(
            &farm,
            b"POST /ep/raw HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nWebhook-Id: c1\r\n\r\n\
              5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: t\r\n\r\n\
              GET /ep/raw?second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(
            response.matches("HTTP/1.1 200 OK\r\n").count(),
            2,
            "{response}"
        );
        assert_eq!(
            response.matches("connection: close\r\n").count(),
            1,
            "{response}"
        );
        let arrivals = farm.arrivals("raw");
        assert_eq!(arrivals.len(), 2);
        assert_eq!(&arrivals[0].body[..], b"hello world");
        assert_eq!(arrivals[0].webhook_id.as_deref(), Some("c1"));
        assert_eq!(arrivals[1].path, "/ep/raw?second");
        assert!(arrivals[1].body.is_empty());
        assert_eq!(arrivals[0].connection_id, arrivals[1].connection_id);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_content_responses_carry_no_body() {
        let farm = Farm::start().await.unwrap();
        farm.configure("empty", Behavior::status(204));
        let response = raw_exchange(
            &farm,
            b"POST /ep/empty HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}\
              POST /ep/empty HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        )
        .await;
        assert_eq!(
            response,
            "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n"
        );
        assert!(
            farm.wait_until(PATIENCE, |f| f.success_count("empty") == 2)
                .await
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn http_1_0_closes_and_expect_continue_is_honoured() {
        let farm = Farm::start().await.unwrap();
        let response = raw_exchange(&farm, b"GET /ep/old HTTP/1.0\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(response.ends_with(r#"{"ok":true}"#));

        let mut stream = TcpStream::connect(farm.addr()).await.unwrap();
        stream
            .write_all(b"POST /ep/old HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut interim = [0u8; 25];
        stream.read_exact(&mut interim).await.unwrap();
        assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
        stream.write_all(b"later").await.unwrap();
        let mut rest = String::new();
        stream.read_to_string(&mut rest).await.unwrap();
        assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"));
        assert_eq!(&farm.arrivals("old")[1].body[..], b"later");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn malformed_and_oversized_requests_are_rejected() {
        let farm = Farm::start().await.unwrap();
        let response = raw_exchange(&farm, b"NONSENSE\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 400 "), "{response}");

        let mut huge_head = b"GET /ep/big HTTP/1.1\r\nx-padding: ".to_vec();
        huge_head.resize(huge_head.len() + 70 * 1024, b'a');
        huge_head.extend_from_slice(b"\r\n\r\n");
        let response = raw_exchange(&farm, &huge_head).await;
        assert!(response.starts_with("HTTP/1.1 431 "), "{response}");

        let response = raw_exchange(
            &farm,
            b"POST /ep/big HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n",
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 413 "), "{response}");
        assert_eq!(farm.total_arrivals(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn latency_ends_early_when_the_client_disconnects() {
        let farm = Farm::start().await.unwrap();
        farm.configure("slow", Behavior::slow(Duration::from_secs(30)));
        let mut stream = TcpStream::connect(farm.addr()).await.unwrap();
        stream
            .write_all(b"POST /ep/slow HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            .await
            .unwrap();
        assert!(
            farm.wait_until(PATIENCE, |f| f.in_flight("slow") == 1)
                .await
        );
        assert_eq!(
            farm.arrivals("slow")[0].status,
            200,
            "planned status while in flight"
        );
        drop(stream);
        assert!(
            farm.wait_until(PATIENCE, |f| f.in_flight("slow") == 0)
                .await
        );
        assert!(
            farm.wait_until(PATIENCE, |f| f.connections_open() == 0)
                .await
        );
        assert_eq!(farm.arrivals("slow")[0].status, 0);
        assert_eq!(farm.success_count("slow"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reset_forgets_arrivals_but_keeps_behaviours() {
        let farm = Farm::start().await.unwrap();
        farm.configure("kept", Behavior::failing_first(1));
        let client = client();
        let url = farm.url("kept");
        assert_eq!(post_webhook(&client, &url, "m").await.status(), 500);
        assert_eq!(post_webhook(&client, &url, "m").await.status(), 200);
        assert!(
            farm.wait_until(PATIENCE, |f| f.success_count("kept") == 1)
                .await
        );

        farm.reset();
        assert_eq!(farm.total_arrivals(), 0);
        assert!(farm.endpoints().is_empty());
        assert_eq!(farm.peak_concurrency("kept"), 0);
        assert_eq!(farm.distinct_ids("kept"), 0);
        assert_eq!(farm.success_count("kept"), 0);
        // The behaviour survives; fail_first progress starts over.
        assert_eq!(post_webhook(&client, &url, "m").await.status(), 500);
        assert_eq!(farm.arrival_count("kept"), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn counters_work_without_arrival_records() {
        let farm = Farm::start().await.unwrap();
        farm.set_record_arrivals(false);
        let client = client();
        for id in ["a", "b", "a"] {
            post_webhook(&client, &farm.url("bench"), id).await;
        }
        assert!(
            farm.wait_until(PATIENCE, |f| f.success_count("bench") == 3)
                .await
        );
        assert_eq!(farm.arrival_count("bench"), 3);
        assert_eq!(farm.distinct_ids("bench"), 2);
        assert_eq!(farm.distinct_ids_succeeded("bench"), 2);
        assert!(farm.arrivals("bench").is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_endpoint_can_keep_records_while_the_rest_are_only_counted() {
        let farm = Farm::start().await.unwrap();
        farm.set_record_arrivals(false);
        farm.set_record_arrivals_of("timed", true);
        farm.set_record_arrivals_of("counted", false);
        let client = client();
        for endpoint in ["timed", "counted", "other"] {
            post_webhook(&client, &farm.url(endpoint), "a").await;
        }
        assert!(farm.wait_until(PATIENCE, |f| f.total_arrivals() == 3).await);
        assert_eq!(farm.arrivals("timed").len(), 1);
        assert!(farm.arrivals("counted").is_empty());
        assert!(farm.arrivals("other").is_empty());
        farm.set_record_arrivals(true);
        post_webhook(&client, &farm.url("counted"), "b").await;
        post_webhook(&client, &farm.url("other"), "b").await;
        assert!(farm.wait_until(PATIENCE, |f| f.total_arrivals() == 5).await);
        assert!(
            farm.arrivals("counted").is_empty(),
            "the endpoint's own setting wins"
        );
        assert_eq!(farm.arrivals("other").len(), 1);
    }
}
