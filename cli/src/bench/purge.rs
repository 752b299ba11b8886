//! W6 purge: W4's steady traffic while retention removes a large delivered backlog. It
//! prints the steady latency before and during the purge, and how long the purge took.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// The delivered backlog the purge removes: `events` events to 10 endpoints.
#[derive(Debug, Clone, Copy)]
struct PurgeSize {
    events: usize,
    /// Steady events a second (to 10 endpoints).
    rate: u32,
    retention: &'static str,
    interval: &'static str,
    /// The longest the purge of the whole backlog may take to show in the log.
    wait: Duration,
}

const FULL: PurgeSize = PurgeSize {
    events: 20_000,
    rate: 100,
    retention: "10s",
    // The backlog (200,000 deliveries) is written within the first minute on this kind of
    // machine, so the second purge finds all of it past retention.
    interval: "60s",
    wait: Duration::from_secs(240),
};

const QUICK: PurgeSize = PurgeSize {
    events: 200,
    rate: 50,
    retention: "1s",
    interval: "2s",
    wait: Duration::from_secs(30),
};

const ENDPOINTS: usize = 10;

pub(super) async fn purge_latency(options: &BenchOptions) -> Result<Value, BenchError> {
    let size = if options.quick { QUICK } else { FULL };
    let farm = Farm::start().await?;
    // The backlog's arrivals are only counted; the steady ones are timed.
    farm.set_record_arrivals(false);
    let (old, steady) = (names("w6-old", ENDPOINTS), names("w6", ENDPOINTS));
    for name in &steady {
        farm.set_record_arrivals_of(name, true);
    }
    let target = Target::start_logged(
        options,
        &[
            ("HOOKLANE_RETENTION", size.retention),
            ("HOOKLANE_PURGE_INTERVAL", size.interval),
            ("RUST_LOG", "warn,hooklane::dispatcher=info"),
        ],
    )
    .await?;
    let api = Arc::new(Api::new(&target));
    let run = uuid_fragment();
    let (old_account, account) = (format!("bench-w6-{run}-old"), format!("bench-w6-{run}"));
    api.setup(&old_account, &farm, &old).await?;
    api.setup(&account, &farm, &steady).await?;

    // Phase 1: the backlog, published and delivered.
    let backlog = size.events * ENDPOINTS;
    publish_many(
        &api,
        &old_account,
        &old_account,
        size.events,
        32,
        &PublishClock::default(),
    )
    .await?;
    farm.wait_until(Duration::from_secs(180), |f| delivered(f, &old) >= backlog)
        .await;
    let bytes_before = target.database_bytes().map(|(file, _)| file);

    // Phase 2: steady traffic until purges have removed the whole backlog, and as long again
    // as the last purge took (or 5 s) after it, for the latency once it is over.
    let clock = PublishClock::default();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = tokio::spawn(publish_steadily(
        Arc::clone(&api),
        account.clone(),
        Duration::from_secs(1) / size.rate,
        clock.clone(),
        Arc::clone(&stop),
    ));
    let started = Instant::now();
    let purges = loop {
        let purges = logged_purges(&target);
        if purges.iter().map(|p| p.deliveries).sum::<u64>() >= backlog as u64 {
            break purges;
        }
        if started.elapsed() > size.wait {
            stop.store(true, Ordering::Relaxed);
            return Err(BenchError::Api(format!(
                "the purge had not removed the {backlog} old deliveries after {} s (log: {purges:?})",
                size.wait.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let last = purges.last().map_or(Duration::ZERO, |p| p.took);
    tokio::time::sleep(last.max(Duration::from_secs(if options.quick { 1 } else { 5 }))).await;
    stop.store(true, Ordering::Relaxed);
    let (published, _) = publisher
        .await
        .map_err(|e| BenchError::Api(e.to_string()))??;
    let expected = published * steady.len();
    farm.wait_until(Duration::from_secs(30), |f| {
        delivered(f, &steady) >= expected
    })
    .await;
    let arrived = delivered(&farm, &steady);
    // The split needs every purge that ran beside the timed deliveries, not only the
    // backlog's: with a retention of seconds, purges of the steady traffic's own deliveries
    // follow it, and one still running has not been logged. Counted as outside, they made the
    // purge look harmless. So wait for a purge that ends after the last arrival.
    let last_arrival = Instant::now();
    let beside = loop {
        let all = logged_purges(&target);
        if all.iter().any(|p| p.ended > last_arrival) {
            break all;
        }
        if last_arrival.elapsed() > size.wait {
            return Err(BenchError::Api(format!(
                "no purge ended in the {} s after the steady traffic (log: {all:?})",
                size.wait.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let split = split_by_purges(&farm, &steady, &clock, &beside, purges.len());
    let bytes_after = target.database_bytes().map(|(file, _)| file);
    target.stop().await;

    let purged: u64 = purges.iter().map(|p| p.deliveries).sum();
    let took: Duration = purges.iter().map(|p| p.took).sum();
    Ok(json!({
        "workload": "W6 purge",
        "deliveries_per_s_offered": size.rate as usize * ENDPOINTS,
        "purged_deliveries": purged,
        "purged_attempts": purges.iter().map(|p| p.attempts).sum::<u64>(),
        "purged_events": purges.iter().map(|p| p.events).sum::<u64>(),
        "purge_s": round3(took.as_secs_f64()),
        "purged_deliveries_per_s": round(purged as f64 / took.as_secs_f64().max(0.001)),
        "deliveries_during_purge": split.during.len(),
        // To the hundredth: the p99s are about 2 ms, and a tenth is 5 % of that.
        "p50_ms": round2(percentile(&split.outside(), 50.0)),
        "p99_ms": round2(percentile(&split.outside(), 99.0)),
        "p50_ms_during_purge": round2(percentile(&split.during, 50.0)),
        "p99_ms_during_purge": round2(percentile(&split.during, 99.0)),
        // The backlog's purge runs over a database 200,000 deliveries larger than the later
        // ones and the gaps between them do: the later purges are the like-for-like
        // comparison with those gaps.
        "p99_ms_during_backlog_purge": round2(percentile(&split.during_backlog, 99.0)),
        "p99_ms_during_later_purges": round2(percentile(&split.during_later, 99.0)),
        "deliveries_during_backlog_later_purges": [split.during_backlog.len(), split.during_later.len()],
        // The two sides of "outside" compared with each other: how far apart two p99s of
        // this traffic are with no purge in either, the noise the ratio above is read against.
        // "After" is what ran between the purges that follow the backlog's.
        "p99_ms_before_purge": round2(percentile(&split.before, 99.0)),
        "p99_ms_after_purge": round2(percentile(&split.after, 99.0)),
        "deliveries_before_after_purge": [split.before.len(), split.after.len()],
        "purges_beside_steady_traffic": beside.len(),
        "database_mb_before_purge": bytes_before.map(|b| b / (1024 * 1024)),
        "database_mb_after": bytes_after.map(|b| b / (1024 * 1024)),
        "lost": expected - arrived.min(expected),
    }))
}

/// One purge, from `serve`'s log line at its end.
#[derive(Debug, Clone, Copy)]
struct Purge {
    ended: Instant,
    took: Duration,
    deliveries: u64,
    attempts: u64,
    events: u64,
}

impl Purge {
    fn started(&self) -> Instant {
        self.ended.checked_sub(self.took).unwrap_or(self.ended)
    }
}

/// The purges `serve` has logged so far ("removed what is past retention").
fn logged_purges(target: &Target) -> Vec<Purge> {
    target
        .log_lines()
        .into_iter()
        .filter_map(|(read, line)| {
            let line: Value = serde_json::from_str(&line).ok()?;
            let fields = &line["fields"];
            (fields["message"] == "removed what is past retention").then(|| Purge {
                ended: read,
                took: Duration::from_millis(fields["took_ms"].as_u64().unwrap_or(0)),
                deliveries: fields["deliveries"].as_u64().unwrap_or(0),
                attempts: fields["attempts"].as_u64().unwrap_or(0),
                events: fields["events"].as_u64().unwrap_or(0),
            })
        })
        .collect()
}

/// The steady deliveries' latencies (ms), by when they ran against the purges.
struct Split {
    /// Published before the first purge started.
    before: Vec<f64>,
    /// Published or arrived while a purge ran.
    during: Vec<f64>,
    /// Of those, beside a purge of the backlog (the first purges, until they had removed
    /// it), and beside only later ones.
    during_backlog: Vec<f64>,
    during_later: Vec<f64>,
    /// The rest: arrived after the first purge had started, and ran beside none.
    after: Vec<f64>,
}

impl Split {
    /// Before and after together, sorted.
    fn outside(&self) -> Vec<f64> {
        let mut outside: Vec<f64> = self.before.iter().chain(&self.after).copied().collect();
        outside.sort_by(f64::total_cmp);
        outside
    }
}

fn split_by_purges(
    farm: &Farm,
    endpoints: &[String],
    clock: &PublishClock,
    purges: &[Purge],
    backlog_purges: usize,
) -> Split {
    let mut split = Split {
        before: Vec::new(),
        during: Vec::new(),
        during_backlog: Vec::new(),
        during_later: Vec::new(),
        after: Vec::new(),
    };
    let first_start = purges.iter().map(Purge::started).min();
    for (published, arrived) in timed_arrivals(farm, endpoints, clock) {
        let latency = ms_between(published, arrived);
        let beside = |p: &Purge| p.started() <= arrived && published <= p.ended;
        if let Some(index) = purges.iter().position(beside) {
            split.during.push(latency);
            if index < backlog_purges {
                split.during_backlog.push(latency);
            } else {
                split.during_later.push(latency);
            }
        } else if first_start.is_some_and(|start| arrived < start) {
            split.before.push(latency);
        } else {
            split.after.push(latency);
        }
    }
    for side in [
        &mut split.before,
        &mut split.during,
        &mut split.during_backlog,
        &mut split.during_later,
        &mut split.after,
    ] {
        side.sort_by(f64::total_cmp);
    }
    split
}
