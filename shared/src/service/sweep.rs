//! The sweep: pending deliveries handed to the queue again, after a restart or a lost message.

use std::time::{Duration, Instant};

use super::ServiceResult;
use crate::{
    clock::Timestamp,
    store::{DueCursor, PageAfter, PendingRef},
    App,
};

const PAGE: u32 = 1000;

/// How long the scheduled sweep walks due deliveries: with the unfanned events' recovery
/// before it and the unfinished erasures after it, inside the sweeper's 240 s timeout (a
/// template test adds them up).
pub const WALK_BUDGET: Duration = Duration::from_secs(120);

/// The pending deliveries due at or before a time, page by page in due order.
struct PendingPages {
    due_before: Timestamp,
    page: PageAfter<DueCursor>,
    done: bool,
}

impl PendingPages {
    fn new(due_before: Timestamp, limit: u32) -> Self {
        Self {
            due_before,
            page: PageAfter::first(limit),
            done: false,
        }
    }

    /// The next page; `None` once the last has been handed out.
    async fn next(&mut self, app: &App) -> ServiceResult<Option<Vec<PendingRef>>> {
        if self.done {
            return Ok(None);
        }
        let page = app
            .store
            .pending_deliveries(self.due_before, &self.page)
            .await?;
        self.done = page.next.is_none();
        self.page.after = page.next;
        Ok(Some(page.refs))
    }
}

/// Hands every pending delivery due at or before `due_before` to the queue again. The
/// queue ignores the ones it already holds, so this is how a lost message or a restart
/// never loses a delivery. Returns how many were handed over.
pub async fn enqueue_pending(app: &App, due_before: Timestamp) -> ServiceResult<usize> {
    let mut pages = PendingPages::new(due_before, PAGE);
    let mut total = 0;
    while let Some(page) = pages.next(app).await? {
        total += page.len();
        app.queue.enqueue(page).await?;
    }
    Ok(total)
}

/// What one sweep found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Deliveries handed back to the queue (due for longer than the grace period).
    pub requeued: usize,
    /// Deliveries due at `now`, requeued or not: the due backlog (of those walked, when the
    /// walk did not cover them all).
    pub due: usize,
    /// The earliest due time among them (exact either way: every walk starts with the
    /// oldest).
    pub oldest_due: Option<Timestamp>,
    /// Whether this walk covered every due delivery.
    pub complete: bool,
    /// Where the next sweep goes on after its first page, when this one ran out of time.
    pub resume_at: Option<DueCursor>,
}

/// The scheduled sweep of the AWS shape: re-queues what has been due for longer than `grace`
/// (its message was lost, or its schedule never fired; see [`requeued_now`] for when again),
/// and measures the due backlog; the previous sweep ran `since_last` ago.
/// A backlog more than one sweep walks in its time is covered over several: each starts
/// with the oldest page, then goes on from `resume` (where the last one stopped), and says
/// where the next should go on.
pub async fn sweep_overdue(
    app: &App,
    now: Timestamp,
    (grace, since_last): (Duration, Duration),
    resume: Option<DueCursor>,
) -> ServiceResult<SweepReport> {
    sweep_overdue_within(app, now, (grace, since_last), resume, PAGE, WALK_BUDGET).await
}

/// [`sweep_overdue`] in pages of `page`, starting no page once `budget` has passed.
async fn sweep_overdue_within(
    app: &App,
    now: Timestamp,
    (grace, since_last): (Duration, Duration),
    resume: Option<DueCursor>,
    page: u32,
    budget: Duration,
) -> ServiceResult<SweepReport> {
    let started = Instant::now();
    let cutoff = now - chrono::TimeDelta::from_std(grace).unwrap_or_default();
    let mut report = SweepReport {
        requeued: 0,
        due: 0,
        oldest_due: None,
        complete: true,
        resume_at: None,
    };
    let mut pages = PendingPages::new(now, page);
    let mut resume = resume;
    while let Some(page) = pages.next(app).await? {
        report.due += page.len();
        for pending in &page {
            report.oldest_due = Some(match report.oldest_due {
                Some(oldest) if oldest <= pending.due => oldest,
                _ => pending.due,
            });
        }
        let overdue: Vec<_> = page
            .into_iter()
            .filter(|p| p.due <= cutoff)
            .filter(|p| {
                requeued_now(
                    (now - p.due).to_std().unwrap_or_default(),
                    grace,
                    since_last,
                )
            })
            .collect();
        report.requeued += overdue.len();
        if !overdue.is_empty() {
            app.queue.enqueue(overdue).await?;
        }
        // Once the oldest due delivery is listed (its due time is the figure the alarm
        // watches), on from where the last sweep stopped: at least a page from there, so
        // that sweeps out of time still cover the backlog.
        if report.oldest_due.is_some() {
            if let Some(from) = resume.take() {
                if !pages.done && pages.page.after.as_ref().is_some_and(|at| *at <= from) {
                    if pages.page.after.as_ref().is_some_and(|at| *at < from) {
                        pages.page.after = Some(from);
                        report.complete = false;
                    }
                    continue;
                }
            }
        }
        // Out of time once the oldest due delivery is listed (or, over a front of entries
        // a page passes over, at twice the time): the figure the alarm watches stays exact.
        let spent = started.elapsed();
        if !pages.done && spent >= budget && (report.oldest_due.is_some() || spent >= budget * 2) {
            report.complete = false;
            report.resume_at = pages.page.after.clone();
            tracing::warn!(
                due = report.due,
                requeued = report.requeued,
                "the due backlog is more than one sweep walks in its time: the next goes on from here"
            );
            break;
        }
    }
    crate::telemetry::due_backlog(
        report.due,
        report
            .oldest_due
            .and_then(|due| (now - due).to_std().ok())
            .unwrap_or_default(),
    );
    Ok(report)
}

/// Whether a sweep hands a delivery `overdue` past its due time to the queue again, the
/// previous sweep having run `since_last` ago. Its message may be lost, or only waiting in a
/// deep queue: SQS keeps every copy sent (a standard queue has no de-duplication), and two
/// copies taken at once are two sends. So it goes again when it passes `grace` overdue, then
/// 2, 4, 8… times `grace`: by the first sweep after each of those ages, however late or
/// skipped the sweeps between; a handful of copies over a day's backlog, not one per sweep.
pub fn requeued_now(overdue: Duration, grace: Duration, since_last: Duration) -> bool {
    if overdue < grace {
        return false;
    }
    if grace.is_zero() {
        return true;
    }
    // The last of those ages it has reached; it is due again if the previous sweep ran
    // before it reached it.
    let times = overdue.as_secs_f64() / grace.as_secs_f64();
    let reached = grace.mul_f64(2f64.powi(times.log2().floor() as i32));
    overdue.saturating_sub(since_last) < reached
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::{
        clock::{add, Clock, ManualClock},
        fixtures,
        queue::embedded::EmbeddedQueue,
        store::{sqlite::SqliteStore, Store},
        telemetry::{self, emf::EmfRecorder},
    };

    /// A delivery whose message waits in a queue a day deep is sent again a handful of
    /// times, not once a sweep: by the first sweep past the grace, then past each doubling of
    /// it, however irregular the sweeps (late, skipped, an hour apart).
    #[test]
    fn an_overdue_delivery_goes_again_at_doubling_ages_not_every_sweep() {
        let grace = Duration::from_secs(300);
        for seed in 0..50u64 {
            // Sweeps 1 s to 70 min apart, from a pseudo-random walk of the seed.
            let mut sweeps = Vec::new();
            let (mut at, mut state) = (seed * 37 % 300, seed + 1);
            while at < 86_400 {
                sweeps.push(at);
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                at += 1 + (state >> 33) % if seed % 5 == 0 { 4_200 } else { 600 };
            }
            let copies: Vec<u64> = sweeps
                .windows(2)
                .filter(|w| {
                    let (last, now) = (Duration::from_secs(w[0]), Duration::from_secs(w[1]));
                    requeued_now(now, grace, now - last)
                })
                .map(|w| w[1])
                .collect();
            // Exactly one copy by the first sweep at or past each of 5, 10, 20, 40… minutes.
            let mut expected: Vec<u64> = (0..9)
                .map(|k| 300 << k)
                .filter_map(|age| sweeps.iter().copied().find(|&at| at >= age))
                .filter(|&at| at > sweeps[0])
                .collect();
            expected.dedup();
            assert_eq!(copies, expected, "seed {seed}");
            assert!(copies.len() <= 10, "{} copies in a day", copies.len());
        }
        assert!(!requeued_now(Duration::from_secs(299), grace, grace));
        // The first sweep after an outage of the sweeper sends everything overdue again.
        let day = Duration::from_secs(86_400);
        assert!(requeued_now(Duration::from_secs(7_777), grace, day));
        assert!(requeued_now(Duration::from_secs(1), Duration::ZERO, grace));
    }

    #[tokio::test]
    async fn only_deliveries_overdue_past_the_grace_are_requeued_but_all_due_ones_are_measured() {
        let recorder = EmfRecorder::new("Hooklane", Vec::new());
        let _local = metrics::set_default_local_recorder(&recorder);
        let now = add(fixtures::t0(), Duration::from_secs(3600));
        let clock = Arc::new(ManualClock::new(now));
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let queue = Arc::new(EmbeddedQueue::new());
        let app = App {
            queue: queue.clone(),
            ..fixtures::app_on(store.clone(), clock.clone())
        };
        store
            .create_account(&fixtures::account("acme"))
            .await
            .unwrap();
        let endpoint = fixtures::endpoint("acme", "ep_1", fixtures::t0());
        store.create_endpoint(&endpoint).await.unwrap();
        let mut ids = Vec::new();
        // Due an hour ago (sent again at 5, 10, 20 and 40 minutes overdue, not now), 7
        // minutes ago, a minute ago, and in a minute.
        for (name, due) in [
            ("evt_lost", fixtures::t0()),
            ("evt_lost_lately", now - chrono::TimeDelta::minutes(7)),
            ("evt_recent", now - chrono::TimeDelta::minutes(1)),
            ("evt_future", now + chrono::TimeDelta::minutes(1)),
        ] {
            let event = fixtures::event("acme", name, due);
            let delivery = fixtures::delivery(&event, &endpoint, due);
            ids.push(delivery.id.clone());
            store.publish(&event, &[delivery]).await.unwrap();
        }

        let report = sweep_overdue(
            &app,
            clock.now(),
            (Duration::from_secs(300), Duration::from_secs(300)),
            None,
        )
        .await
        .unwrap();
        assert_eq!(
            report,
            SweepReport {
                requeued: 1,
                due: 3,
                oldest_due: Some(fixtures::t0()),
                complete: true,
                resume_at: None,
            }
        );
        assert!(queue.is_known(&ids[1]));
        assert!(!queue.is_known(&ids[0]) && !queue.is_known(&ids[2]) && !queue.is_known(&ids[3]));
        let documents = recorder.flush(0);
        let gauge = |name: &str| {
            documents
                .iter()
                .find_map(|d| d.get(name).cloned())
                .unwrap_or_else(|| panic!("no {name} in {documents:?}"))
        };
        assert_eq!(gauge(telemetry::DUE_BACKLOG), 3.0);
        assert_eq!(gauge(telemetry::OLDEST_DUE_AGE), 3600.0);
    }

    /// A backlog more than one sweep can walk in its time is covered over several: each
    /// starts with the oldest page (so the oldest due time it reports is exact), then goes on
    /// from where the last stopped, and says where the next should; once a walk reaches the
    /// end, the next starts over.
    #[tokio::test]
    async fn sweeps_out_of_time_go_on_from_where_the_last_stopped() {
        let now = add(fixtures::t0(), Duration::from_secs(3600));
        let clock = Arc::new(ManualClock::new(now));
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let app = fixtures::app_on(store.clone(), clock.clone());
        let [endpoint] = fixtures::account_with_endpoints(store.as_ref(), "acme", ["ep_1"]).await;
        let mut ids = Vec::new();
        // Seven overdue; in due order, the last first.
        for n in 0..7_u64 {
            let due = add(fixtures::t0(), Duration::from_secs(60 * (7 - n)));
            let event = fixtures::event("acme", &format!("evt_{n}"), due);
            let delivery = fixtures::delivery(&event, &endpoint, due);
            ids.push(delivery.id.clone());
            store.publish(&event, &[delivery]).await.unwrap();
        }
        ids.reverse();
        // 53 to 59 minutes overdue: within their first two graces, so each goes again when
        // a sweep walks past it.
        let grace = Duration::from_secs(1800);
        // Each sweep on a queue of its own, to see what it re-queued.
        let sweep = |resume: Option<DueCursor>| {
            let queue = Arc::new(EmbeddedQueue::new());
            let app = App {
                queue: queue.clone(),
                ..app.clone()
            };
            let ids = ids.clone();
            async move {
                let report =
                    sweep_overdue_within(&app, now, (grace, grace), resume, 2, Duration::ZERO)
                        .await
                        .unwrap();
                let requeued: Vec<usize> = (0..ids.len())
                    .filter(|&n| queue.is_known(&ids[n]))
                    .collect();
                (report, requeued)
            }
        };

        let (first, requeued) = sweep(None).await;
        assert_eq!(requeued, [0, 1], "the oldest page");
        assert_eq!((first.due, first.complete), (2, false));
        assert_eq!(
            first.oldest_due,
            Some(add(fixtures::t0(), Duration::from_secs(60)))
        );
        let (second, requeued) = sweep(first.resume_at.clone()).await;
        assert_eq!(
            requeued,
            [0, 1, 2, 3],
            "the oldest page, then on from the first sweep"
        );
        assert!(!second.complete && second.resume_at > first.resume_at);
        let (third, requeued) = sweep(second.resume_at.clone()).await;
        assert_eq!(requeued, [0, 1, 4, 5]);
        let (fourth, requeued) = sweep(third.resume_at.clone()).await;
        assert_eq!(requeued, [0, 1, 6], "to the end");
        assert_eq!(
            (fourth.complete, fourth.resume_at),
            (false, None),
            "starts over next"
        );

        // Time enough: every one, in one sweep.
        let queue = Arc::new(EmbeddedQueue::new());
        let app = App {
            queue: queue.clone(),
            ..app.clone()
        };
        let report =
            sweep_overdue_within(&app, now, (grace, grace), None, 2, Duration::from_secs(60))
                .await
                .unwrap();
        assert_eq!(
            (report.due, report.complete, report.resume_at),
            (7, true, None)
        );
        assert!(ids.iter().all(|id| queue.is_known(id)));
    }

    /// A page may list nothing and still go on (DynamoDB passes over a bounded number of
    /// inactive endpoints' entries a page): the walk goes on from where the last sweep
    /// stopped only once it has listed the oldest due delivery, whose due time is the
    /// figure the overdue alarm watches.
    #[cfg(feature = "aws")]
    #[tokio::test]
    async fn the_oldest_due_is_exact_when_the_first_pages_list_nothing() {
        let store = Arc::new(crate::testing::emulator_store().await);
        let now = add(fixtures::t0(), Duration::from_secs(3600));
        let clock = Arc::new(ManualClock::new(now));
        let app = App {
            queue: Arc::new(EmbeddedQueue::new()),
            ..fixtures::app_on(store.clone(), clock.clone())
        };
        let [live] = fixtures::account_with_endpoints(store.as_ref(), "acme", ["ep_live"]).await;
        let mut off = fixtures::endpoint("acme", "ep_off", fixtures::t0());
        off.status = crate::domain::EndpointStatus::Disabled;
        store.create_endpoint(&off).await.unwrap();
        let at = |s: u64| add(fixtures::t0(), Duration::from_secs(s));
        // The oldest eight are a disabled endpoint's; then four of the live one.
        for n in 0..12_u64 {
            let event = fixtures::event("acme", &format!("evt_{n:02}"), at(n));
            let to = if n < 8 { &off } else { &live };
            store
                .publish(&event, &[fixtures::delivery(&event, to, at(n))])
                .await
                .unwrap();
        }
        // The last sweep stopped past the first live one.
        let first_live =
            fixtures::delivery(&fixtures::event("acme", "evt_08", at(8)), &live, at(8));
        let resume = DueCursor {
            due: at(8),
            id: first_live.id,
        };
        let report = sweep_overdue_within(
            &app,
            now,
            (Duration::from_secs(300), Duration::from_secs(300)),
            Some(resume),
            2,
            Duration::from_secs(60),
        )
        .await
        .unwrap();
        assert_eq!(report.oldest_due, Some(at(8)), "{report:?}");
    }
}
