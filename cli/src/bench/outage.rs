//! W5 outage: every endpoint of many accounts answers 503 while one healthy account keeps
//! publishing. It prints what a platform's worst day costs: memory as the backlog grows and
//! after a crash, restart time, log pages, the publish call, and whether delivery keeps up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;

/// The outage's size: `accounts` × `endpoints` failing endpoints, `events` fanned out to
/// every endpoint of their account (spread over the accounts in turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutageSize {
    pub accounts: usize,
    pub endpoints: usize,
    pub events: usize,
}

impl OutageSize {
    /// 9 × 100 endpoints, 9,000 events: 900,000 deliveries.
    pub const FULL: Self = Self {
        accounts: 9,
        endpoints: 100,
        events: 9_000,
    };
    /// Seconds, for the test suite.
    pub const QUICK: Self = Self {
        accounts: 2,
        endpoints: 10,
        events: 40,
    };

    fn deliveries(&self) -> usize {
        self.events * self.endpoints
    }
}

/// The healthy account: 10 endpoints, an event every 100 ms.
const HEALTHY_ENDPOINTS: usize = 10;
const HEALTHY_INTERVAL: Duration = Duration::from_millis(100);
const PUBLISHERS: usize = 32;

pub(super) async fn outage(options: &BenchOptions) -> Result<Value, BenchError> {
    let size = options.outage;
    let quick = options.quick;
    let farm = Farm::start().await?;
    // 900k arrivals of full records would be gigabytes in this process: the failing
    // endpoints are only counted, the healthy ones (whose latency is timed) recorded.
    farm.set_record_arrivals(false);
    let healthy = names("w5-ok", HEALTHY_ENDPOINTS);
    for name in &healthy {
        farm.set_record_arrivals_of(name, true);
    }
    let run = uuid_fragment();
    let mut failing = Vec::new();
    let mut accounts = Vec::new();
    for a in 0..size.accounts {
        let endpoints = names(&format!("w5-down{a}"), size.endpoints);
        for name in &endpoints {
            farm.configure(name, Behavior::status(503));
        }
        failing.extend(endpoints.iter().cloned());
        accounts.push((format!("bench-w5-{run}-{a}"), endpoints));
    }
    // The default schedule (first retry after 30 s) in a full run; a quick run retries
    // within a second so that work is due when it restarts.
    let env: &[(&str, &str)] = if quick {
        &[("HOOKLANE_RETRY_SCHEDULE", "1,1,1,1,1,1,1,1,1,1")]
    } else {
        &[]
    };
    let mut target = Target::start(options, env).await?;
    let api = Arc::new(Api::new(&target));
    let mut endpoint_ids = Vec::new();
    for (account, endpoints) in &accounts {
        endpoint_ids.push(api.setup(account, &farm, endpoints).await?);
    }
    let healthy_account = format!("bench-w5-{run}-ok");
    api.setup(&healthy_account, &farm, &healthy).await?;

    let rss = RssSampler::start(target.pid());
    let clock = PublishClock::default();
    let stop_healthy = Arc::new(AtomicBool::new(false));
    let healthy_publisher = tokio::spawn(publish_steadily(
        Arc::clone(&api),
        healthy_account.clone(),
        HEALTHY_INTERVAL,
        clock.clone(),
        Arc::clone(&stop_healthy),
    ));

    // Phase 1: the outage's events, from 32 publishers at once, each call timed, and their
    // fan-out, which goes on after the calls have answered: the phase ends once the server
    // has created as many deliveries as the outage's events go to (the healthy account's
    // hundred a second count too, so it ends that much early).
    let created_before = api.deliveries_created().await?;
    let attempts_before = failing_attempts(&farm, &failing);
    let threads = sched::Phase::start(target.pid());
    let started = Instant::now();
    let calls = publish_timed(&api, &accounts, size.events).await?;
    let calls_took = started.elapsed();
    api.wait_for_deliveries(
        created_before + size.deliveries() as u64,
        Duration::from_secs(600),
    )
    .await?;
    let publishing = started.elapsed();
    let threads = threads.end();
    let attempts_publishing = failing_attempts(&farm, &failing) - attempts_before;
    let rss_published = rss_mb(target.pid());

    // Phase 2: publishing has stopped; the backlog is worked off.
    let settle = if quick {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(10)
    };
    let attempts_before = failing_attempts(&farm, &failing);
    tokio::time::sleep(settle).await;
    let attempts_after = failing_attempts(&farm, &failing) - attempts_before;

    // Phase 3: the log, read while the backlog is there.
    // The first account's events are those whose index is 0 modulo the accounts' number
    // (`publish_timed`).
    let first_events: Vec<String> = (0..size.events)
        .step_by(accounts.len())
        .map(|i| format!("{}-{i}", accounts[0].0))
        .collect();
    let (first_pages, cursor_pages) =
        read_log(&api, &accounts[0].0, &endpoint_ids[0], &first_events, quick).await?;

    stop_healthy.store(true, Ordering::Relaxed);
    let (healthy_events, healthy_calls) = healthy_publisher
        .await
        .map_err(|e| BenchError::Api(e.to_string()))??;
    let healthy_expected = healthy_events * healthy.len();
    farm.wait_until(Duration::from_secs(30), |f| {
        delivered(f, &healthy) >= healthy_expected
    })
    .await;
    let healthy_latencies = latencies_ms(&farm, &healthy, &clock);
    // The same, by when the event was published: while the outage's calls ran, while its
    // fan-out ran, after.
    let calls_end = started + calls_took;
    let fan_out_end = started + publishing;
    let by_phase = |from: Instant, to: Instant| -> Vec<f64> {
        let mut phase: Vec<f64> = timed_arrivals(&farm, &healthy, &clock)
            .into_iter()
            .filter(|(published, _)| *published >= from && *published < to)
            .map(|(published, arrived)| ms_between(published, arrived))
            .collect();
        phase.sort_by(f64::total_cmp);
        phase
    };
    let healthy_during_calls = by_phase(started, calls_end);
    let healthy_during_fan_out = by_phase(calls_end, fan_out_end);
    let healthy_after = by_phase(fan_out_end, Instant::now());
    let healthy_arrived = delivered(&farm, &healthy);
    // An answered attempt is recorded a moment after the endpoint answers; a kill before
    // that sends it again after the restart (at-least-once). The crash below is for the
    // outage's backlog, so the healthy account's records are let in first: a healthy
    // delivery sent twice is then a real duplicate, not the kill's.
    recorded(&api, &healthy_account).await?;
    let rss_peak = rss.stop().await;
    let database_bytes = target.database_bytes();

    // Phase 4: a crash (SIGKILL) with the whole backlog pending, and a start on that file.
    target.crash().await;
    let attempts_at_crash = failing_attempts(&farm, &failing);
    let restarted = Instant::now();
    let to_health = target.restart().await?;
    let rss = RssSampler::start(target.pid());
    let first_attempt = farm
        .wait_until(Duration::from_secs(30), |f| {
            failing_attempts(f, &failing) > attempts_at_crash
        })
        .await
        .then(|| restarted.elapsed());
    tokio::time::sleep(settle).await;
    let rss_restart_peak = rss.stop().await;
    let never_attempted = never_attempted(&farm, &failing, size);
    target.stop().await;

    let deliveries = size.deliveries();
    Ok(json!({
        "workload": "W5 outage",
        "failing_endpoints": failing.len(),
        "deliveries": deliveries,
        "serve_rss_mb_peak": rss_peak,
        "serve_rss_mb_after_publish": rss_published,
        "restart_to_health_s": round3(to_health.as_secs_f64()),
        "restart_first_attempt_s": first_attempt.map(|d| round3(d.as_secs_f64())),
        "serve_rss_mb_after_restart": rss_restart_peak,
        "endpoint_log_first_page_p50_ms": round(percentile(&first_pages.endpoint, 50.0)),
        "endpoint_log_first_page_p99_ms": round(percentile(&first_pages.endpoint, 99.0)),
        "filtered_log_first_page_p50_ms": round(percentile(&first_pages.filtered, 50.0)),
        "filtered_log_first_page_p99_ms": round(percentile(&first_pages.filtered, 99.0)),
        "cursor_page_p50_ms": round(percentile(&cursor_pages, 50.0)),
        "cursor_page_p99_ms": round(percentile(&cursor_pages, 99.0)),
        "event_deliveries_page_p50_ms": round(percentile(&first_pages.event, 50.0)),
        "event_deliveries_page_p99_ms": round(percentile(&first_pages.event, 99.0)),
        "publish_calls_s": round3(calls_took.as_secs_f64()),
        "publish_deliveries_per_s": round(deliveries as f64 / publishing.as_secs_f64()),
        "publish_call_p50_ms": round(percentile(&calls, 50.0)),
        "publish_call_p99_ms": round(percentile(&calls, 99.0)),
        "attempts_per_s_while_publishing": round(attempts_publishing as f64 / publishing.as_secs_f64()),
        "store_thread_on_cpu_publishing": threads.store_on_cpu,
        "store_thread_waiting_publishing": threads.store_waiting,
        "serve_threads_waiting_publishing": threads.serve_waiting,
        "attempts_per_s_after_publishing": round(attempts_after as f64 / settle.as_secs_f64()),
        "healthy_p50_ms": round(percentile(&healthy_latencies, 50.0)),
        "healthy_p99_ms": round(percentile(&healthy_latencies, 99.0)),
        "healthy_p99_ms_during_calls": round(percentile(&healthy_during_calls, 99.0)),
        "healthy_p99_ms_during_fan_out": round(percentile(&healthy_during_fan_out, 99.0)),
        "healthy_p99_ms_after": round(percentile(&healthy_after, 99.0)),
        "healthy_publish_call_p50_ms": round(percentile(&healthy_calls, 50.0)),
        "healthy_publish_call_p99_ms": round(percentile(&healthy_calls, 99.0)),
        "database_bytes_per_delivery": database_bytes.map(|(file, _)| file / deliveries.max(1) as u64),
        "wal_mb": database_bytes.map(|(_, wal)| wal / (1024 * 1024)),
        "never_attempted": never_attempted,
        "lost": healthy_expected - healthy_arrived.min(healthy_expected),
        "duplicates": duplicates(&farm, &healthy),
    }))
}

/// Waits until no delivery of `account` is pending in the store (at most 30 s).
async fn recorded(api: &Api, account: &str) -> Result<(), BenchError> {
    let path = format!("/v1/accounts/{account}/deliveries?status=pending&limit=1");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (page, _) = api.get_timed(&path).await?;
        let pending = page["data"].as_array().map_or(0, Vec::len);
        if pending == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Api(format!(
                "{account}: deliveries still pending 30 s after they arrived"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn failing_attempts(farm: &Farm, failing: &[String]) -> usize {
    failing.iter().map(|name| farm.arrival_count(name)).sum()
}

/// Outage deliveries no attempt has reached yet: zero once the backlog has had its first
/// tries, as it should before the run ends.
fn never_attempted(farm: &Farm, failing: &[String], size: OutageSize) -> usize {
    let reached: usize = failing.iter().map(|name| farm.distinct_ids(name)).sum();
    size.deliveries().saturating_sub(reached)
}

/// Publishes `events` events to the accounts in turn, `PUBLISHERS` calls at a time, and
/// returns each call's time in milliseconds, sorted.
async fn publish_timed(
    api: &Api,
    accounts: &[(String, Vec<String>)],
    events: usize,
) -> Result<Vec<f64>, BenchError> {
    let results: Vec<Result<f64, BenchError>> = futures_util::stream::iter(0..events)
        .map(|i| async move {
            let account = &accounts[i % accounts.len()].0;
            let started = Instant::now();
            api.post(
                &format!("/v1/accounts/{account}/events"),
                json!({"id": format!("{account}-{i}"), "type": "bench.outage", "data": {"i": i}}),
            )
            .await?;
            Ok(started.elapsed().as_secs_f64() * 1000.0)
        })
        .buffer_unordered(PUBLISHERS)
        .collect()
        .await;
    let mut calls = results.into_iter().collect::<Result<Vec<f64>, _>>()?;
    calls.sort_by(f64::total_cmp);
    Ok(calls)
}

struct LogPages {
    /// First pages of one endpoint's log.
    endpoint: Vec<f64>,
    /// First pages of the account's log under every filter the API offers.
    filtered: Vec<f64>,
    /// Pages of some events' deliveries, each event's read to its end.
    event: Vec<f64>,
}

/// Times the delivery log of one failing account: first pages of its endpoints' logs, first
/// pages under each filter and combinations of them, pages deep into the log by cursor, and
/// the pages of some of its events' deliveries.
async fn read_log(
    api: &Api,
    account: &str,
    endpoints: &[String],
    events: &[String],
    quick: bool,
) -> Result<(LogPages, Vec<f64>), BenchError> {
    let rounds = if quick { 2 } else { 10 };
    let base = format!("/v1/accounts/{account}/deliveries?limit=50");
    let mut pages = LogPages {
        endpoint: Vec::new(),
        filtered: Vec::new(),
        event: Vec::new(),
    };
    // Events spread over the publishing, each read in pages of 50 to its end.
    let spread = (events.len() / (rounds * 4)).max(1);
    for event in events.iter().step_by(spread).take(rounds * 4) {
        let start = format!("/v1/accounts/{account}/events/{event}/deliveries?limit=50");
        let mut path = start.clone();
        // An event goes to at most every endpoint of the account: a few pages.
        let mut ended = false;
        for _ in 0..=endpoints.len().div_ceil(50) {
            let (page, took) = api.get_timed(&path).await?;
            pages.event.push(took);
            match page["next_cursor"].as_str() {
                Some(next) => path = format!("{start}&cursor={next}"),
                None => {
                    ended = true;
                    break;
                }
            }
        }
        if !ended {
            return Err(BenchError::Api(format!(
                "{start}: still a next page after one per 50 endpoints"
            )));
        }
    }
    for (i, endpoint) in endpoints.iter().cycle().take(rounds * 4).enumerate() {
        let (_, took) = api
            .get_timed(&format!("{base}&endpoint={endpoint}"))
            .await?;
        pages.endpoint.push(took);
        let path = format!("/v1/accounts/{account}/endpoints/{endpoint}/deliveries?limit=50");
        let (_, took) = api.get_timed(&path).await?;
        pages.endpoint.push(took);
        if i % 2 == 0 {
            let (_, took) = api
                .get_timed(&format!("{base}&endpoint={endpoint}&status=failed"))
                .await?;
            pages.endpoint.push(took);
        }
    }
    let now = chrono::Utc::now();
    let hour_ago =
        (now - chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let minute_ago =
        (now - chrono::Duration::minutes(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let filters = [
        "status=pending".to_owned(),
        "status=failed".to_owned(),
        "status=delivered".to_owned(),
        "event_type=bench.outage".to_owned(),
        "event_type=bench.none".to_owned(),
        "status_code=503".to_owned(),
        "status_code=200".to_owned(),
        "event_type=bench.outage&status=pending&status_code=503".to_owned(),
        format!("since={hour_ago}&until={minute_ago}"),
        format!("status=failed&since={hour_ago}"),
    ];
    for _ in 0..rounds {
        for filter in &filters {
            let (_, took) = api.get_timed(&format!("{base}&{filter}")).await?;
            pages.filtered.push(took);
        }
    }
    let mut cursor_pages = Vec::new();
    for start in [format!("{base}&endpoint={}", endpoints[0]), base.clone()] {
        let mut cursor: Option<String> = None;
        for _ in 0..rounds * 4 {
            let path = match &cursor {
                Some(c) => format!("{start}&cursor={c}"),
                None => start.clone(),
            };
            let (page, took) = api.get_timed(&path).await?;
            if cursor.is_some() {
                cursor_pages.push(took);
            }
            cursor = page["next_cursor"].as_str().map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
    }
    pages.endpoint.sort_by(f64::total_cmp);
    pages.filtered.sort_by(f64::total_cmp);
    pages.event.sort_by(f64::total_cmp);
    cursor_pages.sort_by(f64::total_cmp);
    Ok((pages, cursor_pages))
}

/// Resident memory of a process in MB, from /proc.
fn rss_mb(pid: Option<u32>) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

/// The highest resident memory of a process, sampled every 100 ms until stopped.
struct RssSampler {
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    fn start(pid: Option<u32>) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&peak);
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_millis(100));
            loop {
                ticker.tick().await;
                if let Some(mb) = rss_mb(pid) {
                    seen.fetch_max(mb, Ordering::Relaxed);
                }
            }
        });
        Self { peak, task }
    }

    async fn stop(self) -> Option<u64> {
        self.task.abort();
        let _ = self.task.await;
        Some(self.peak.load(Ordering::Relaxed)).filter(|mb| *mb > 0)
    }
}
