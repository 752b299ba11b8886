//! The embedded shape's engine room: the fan-out of published events, worker slots over the
//! in-memory lanes, the window's refill from the store, plus the periodic resync, health
//! check and notification sender.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::{
    sync::{watch, Semaphore},
    task::JoinHandle,
};

use crate::{
    domain::Trigger,
    queue::{
        embedded::EmbeddedQueue,
        window::{self, PendingSource},
    },
    service::{
        deliver::{self, AttemptError, RecordRetry},
        health, notifications,
    },
    store::sqlite::{PurgePace, Purged, SqliteStore},
    telemetry, App,
};

/// A delivery not sent for want of this process's own resources (file descriptors) goes
/// back to the queue for this long, drawn between the two: long enough for the requests
/// still using the dropped connection pool to be answered and its sockets closed.
const UNSENT_RETRY_MIN: Duration = Duration::from_secs(2);
const UNSENT_RETRY_MAX: Duration = Duration::from_secs(8);

/// How often the database's lock file is checked: one removed (by an operator cleaning up)
/// is taken again before a second `serve` can start on the same file.
const LOCK_CHECK_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// Global worker slots: requests in flight across all endpoints.
    pub workers: usize,
    /// Attempts answered whose record is still being written: while publishing keeps the
    /// store thread busy, a record waits for its batch to commit, and a worker slot held
    /// until then would leave the endpoints idle (64 slots over a 0.8 s commit made 73
    /// attempts a second). Bounded, so that memory stays flat if the store stalls.
    pub recording: usize,
    /// How often the queue's window pages the whole backlog in again (the backstop for a
    /// delivery the window lost track of).
    pub sweep_interval: Duration,
    pub health_interval: Duration,
    /// How often what is past retention is removed (`HOOKLANE_RETENTION`).
    pub purge_interval: Duration,
    pub notify_interval: Duration,
    /// How long shutdown waits for attempts in flight.
    pub drain_timeout: Duration,
    /// How an attempt's record is written again while the store refuses it.
    pub record_retry: RecordRetry,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            workers: 64,
            recording: 4096,
            sweep_interval: Duration::from_secs(60),
            health_interval: Duration::from_secs(60),
            purge_interval: Duration::from_secs(60),
            notify_interval: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(12),
            record_retry: RecordRetry::PATIENT,
        }
    }
}

/// Running background tasks; stop them with the watch sender given to [`start`].
pub struct Running {
    pub handles: Vec<JoinHandle<()>>,
}

impl Running {
    pub async fn join(self) {
        for handle in self.handles {
            let _ = handle.await;
        }
    }
}

/// Starts the workers, the window's refill from the store and the periodic jobs. Nothing
/// is loaded up front: the window pages the backlog in by due time, so start-up takes the
/// same time whatever the backlog.
pub async fn start(
    app: App,
    queue: Arc<EmbeddedQueue>,
    store: Arc<SqliteStore>,
    config: DispatcherConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<Running, crate::service::ServiceError> {
    queue.resync();
    let mut handles = vec![
        tokio::spawn(crate::queue::fan_out::run(
            app.clone(),
            Arc::clone(&store),
            shutdown.clone(),
        )),
        tokio::spawn(window::run(
            Arc::clone(&queue),
            Arc::clone(&store) as Arc<dyn PendingSource>,
            Arc::clone(&app.clock),
            shutdown.clone(),
        )),
        tokio::spawn(run_workers(
            app.clone(),
            Arc::clone(&queue),
            config.clone(),
            shutdown.clone(),
        )),
    ];
    handles.push(every(
        config.sweep_interval,
        shutdown.clone(),
        app.clone(),
        move |_| {
            queue.resync();
            async { Ok(()) }
        },
    ));
    let held = Arc::clone(&store);
    handles.push(every(
        LOCK_CHECK_INTERVAL,
        shutdown.clone(),
        app.clone(),
        move |_| {
            let result = held.keep_lock().map_err(Into::into);
            async move { result }
        },
    ));
    let retention = app.config.retention;
    let pace = PurgePace::every(config.purge_interval);
    let stop = shutdown.clone();
    // A wall clock stepped forward would cut retention short by the step.
    let purge_clock = Arc::new(std::sync::Mutex::new(crate::clock::Unhurried::default()));
    handles.push(every(
        config.purge_interval,
        shutdown.clone(),
        app.clone(),
        move |app| {
            let store = Arc::clone(&store);
            let stop = stop.clone();
            let now = purge_clock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .now(app.clock.now(), std::time::Instant::now());
            async move {
                let cutoff = crate::clock::sub(now, retention);
                let started = std::time::Instant::now();
                let purged = store.purge_before(cutoff, pace, &stop).await?;
                if purged != Purged::default() {
                    let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    tracing::info!(
                        deliveries = purged.deliveries,
                        attempts = purged.attempts,
                        events = purged.events,
                        notifications = purged.notifications,
                        overdue_s = purged.overdue.as_secs(),
                        took_ms,
                        stopped_for_shutdown = *stop.borrow(),
                        "removed what is past retention"
                    );
                }
                Ok(())
            }
        },
    ));
    handles.push(every(
        config.health_interval,
        shutdown.clone(),
        app.clone(),
        |app| async move { health::check(&app).await.map(|_| ()) },
    ));
    handles.push(every(
        config.notify_interval,
        shutdown,
        app,
        |app| async move { notifications::flush(&app).await.map(|_| ()) },
    ));
    Ok(Running { handles })
}

fn every<F, Fut>(
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
    app: App,
    job: F,
) -> JoinHandle<()>
where
    F: Fn(App) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), crate::service::ServiceError>> + Send,
{
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    if let Err(error) = job(app.clone()).await {
                        tracing::error!(%error, "periodic job failed; will run again");
                    }
                }
                _ = shutdown.changed() => break,
            }
        }
    })
}

async fn run_workers(
    app: App,
    queue: Arc<EmbeddedQueue>,
    config: DispatcherConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let workers = config.workers.max(1);
    let slots = Arc::new(Semaphore::new(workers));
    let recording = Arc::new(Semaphore::new(config.recording.max(workers)));
    queue.share_in_flight(config.recording.max(workers));
    let record_retry = config.record_retry;
    // While the store refuses writes, new sends go one at a time: each is a webhook that
    // cannot be recorded, and is sent again later. One still goes, to find when writes are
    // taken again (as do the records being written again).
    let probe = Arc::new(Semaphore::new(1));
    loop {
        let (permit, record_permit) = tokio::select! {
            permits = async {
                let record = Arc::clone(&recording).acquire_owned().await?;
                let slot = Arc::clone(&slots).acquire_owned().await?;
                Ok::<_, tokio::sync::AcquireError>((slot, record))
            } => match permits {
                Ok(permits) => permits,
                Err(_) => break,
            },
            _ = shutdown.changed() => break,
        };
        let clock = Arc::clone(&app.clock);
        let lease = tokio::select! {
            lease = queue.take(|| clock.now()) => lease,
            _ = shutdown.changed() => break,
        };
        let probe_permit = loop {
            if telemetry::store_fault(&app.store).is_none() {
                break None;
            }
            tokio::select! {
                permit = Arc::clone(&probe).acquire_owned() => break permit.ok(),
                // The fault may clear while the probe is out.
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = shutdown.changed() => {
                    // Not sent: back to the queue, as it was.
                    queue.complete(&lease, app.clock.now());
                    queue.add(vec![lease.clone()]);
                    break None;
                }
            }
        };
        if *shutdown.borrow() {
            break;
        }
        let (app, queue, stop) = (app.clone(), Arc::clone(&queue), shutdown.clone());
        tokio::spawn(async move {
            let _probe = probe_permit;
            telemetry::endpoint_in_flight(&lease.endpoint_id, 1.0);
            let slot_given_back = AtomicBool::new(false);
            // Answered: the endpoint's slot and the worker slot are free for the next
            // request while the record is written.
            let permit = std::sync::Mutex::new(Some(permit));
            let give_back_slot = || {
                if !slot_given_back.swap(true, Ordering::Relaxed) {
                    telemetry::endpoint_in_flight(&lease.endpoint_id, -1.0);
                    queue.release_slot(&lease, app.clock.now());
                    if let Ok(mut permit) = permit.lock() {
                        permit.take();
                    }
                }
            };
            // A record the store refuses is written again while the lease is held: the
            // webhook is sent, and the delivery would read as unattempted and be sent again.
            let result = deliver::attempt_recording(
                &app,
                &lease.delivery_id,
                Trigger::Scheduled,
                &give_back_slot,
                record_retry,
                Some(&stop),
            )
            .await;
            give_back_slot();
            if !matches!(result, Err(AttemptError::Unrecorded { .. })) {
                queue.complete(&lease, app.clock.now());
            }
            match result {
                Ok(result) => {
                    if let Some(next) = result.follow_up() {
                        queue.add(vec![next.clone()]);
                    }
                }
                Err(AttemptError::Unrecorded {
                    error, resend_at, ..
                }) => {
                    // Sent, not recorded: sending it again is a duplicate, so not before its
                    // schedule (and Retry-After) would have sent the next one.
                    tracing::error!(delivery.id = %lease.delivery_id, %error, %resend_at, "attempt sent but not recorded; not sent again before resend_at");
                    queue.complete_holding(&lease, resend_at, app.clock.now());
                }
                Err(AttemptError::Unsent(fault)) => {
                    // Not sent, nothing recorded (the attempt logged why): back to the queue
                    // soon, spread out so the deliveries put back together do not all
                    // reconnect at once.
                    let after = UNSENT_RETRY_MIN
                        + (UNSENT_RETRY_MAX - UNSENT_RETRY_MIN).mul_f64(rand::random::<f64>());
                    tracing::debug!(delivery.id = %lease.delivery_id, cause = %fault, retry_in_ms = after.as_millis(), "webhook not sent; back to the queue");
                    let mut again = lease;
                    again.due = crate::clock::add(app.clock.now(), after);
                    queue.add(vec![again]);
                }
                Err(AttemptError::Service(error)) => {
                    // Nothing was sent (or the attempt is recorded, and its row says when the
                    // next is due): the row is still pending in the store; try again shortly.
                    tracing::error!(delivery.id = %lease.delivery_id, %error, "attempt could not be completed; retrying in 5 s");
                    let mut again = lease;
                    again.due = crate::clock::add(app.clock.now(), Duration::from_secs(5));
                    queue.add(vec![again]);
                }
            }
            drop(record_permit);
        });
    }
    // Drained when every record is written: each attempt holds a recording permit to the end.
    let all = u32::try_from(config.recording.max(workers)).unwrap_or(u32::MAX);
    if tokio::time::timeout(config.drain_timeout, recording.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("shutdown: attempts still in flight after the drain timeout; they will be retried after restart");
    }
}

#[cfg(test)]
mod tests {
    use std::{
        path::{Path, PathBuf},
        sync::{
            atomic::{AtomicUsize, Ordering},
            mpsc, Mutex,
        },
        time::Instant,
    };

    use axum::body::Body;
    use tower::ServiceExt;

    use super::*;
    use crate::{
        clock::{Clock, Timestamp},
        domain::{Delivery, DeliveryStatus},
        fixtures,
        http::{OutboundRequest, OutboundResponse, Transport},
        queue::embedded::{QueueStats, WindowLimits},
        store::{PendingRef, Store},
    };

    /// Real time from `t0`, plus what a test skips ahead.
    struct RunningClock {
        started: Instant,
        skipped: Mutex<Duration>,
    }

    impl RunningClock {
        fn new() -> Self {
            Self {
                started: Instant::now(),
                skipped: Mutex::new(Duration::ZERO),
            }
        }

        fn skip(&self, by: Duration) {
            *self.skipped.lock().unwrap() += by;
        }
    }

    impl Clock for RunningClock {
        fn now(&self) -> Timestamp {
            let skipped = *self.skipped.lock().unwrap();
            crate::clock::add(fixtures::t0(), self.started.elapsed() + skipped)
        }
    }

    /// A receiver answering 200 to every webhook, counting them. As its first answer leaves
    /// it, another connection takes the database's write lock (as a backup tool would),
    /// held until the test lets go: the attempt's record meets it.
    struct LockingReceiver {
        database: PathBuf,
        posts: AtomicUsize,
        release: Mutex<Option<mpsc::Receiver<()>>>,
    }

    impl LockingReceiver {
        fn new(database: &Path) -> (Self, mpsc::Sender<()>) {
            let (release, released) = mpsc::channel();
            let receiver = Self {
                database: database.to_owned(),
                posts: AtomicUsize::new(0),
                release: Mutex::new(Some(released)),
            };
            (receiver, release)
        }

        fn posts(&self) -> usize {
            self.posts.load(Ordering::SeqCst)
        }
    }

    #[async_trait::async_trait]
    impl Transport for LockingReceiver {
        async fn post(&self, _: OutboundRequest) -> OutboundResponse {
            self.posts.fetch_add(1, Ordering::SeqCst);
            if let Some(released) = self.release.lock().unwrap().take() {
                let lock = rusqlite::Connection::open(&self.database).unwrap();
                lock.execute_batch("BEGIN IMMEDIATE").unwrap();
                std::thread::spawn(move || {
                    // Let go when told, or after a while should the test have failed.
                    let _ = released.recv_timeout(Duration::from_secs(30));
                    lock.execute_batch("COMMIT").unwrap();
                });
            }
            OutboundResponse {
                status: Some(200),
                headers: Vec::new(),
                body: Vec::new(),
                body_truncated: false,
                latency: Duration::from_millis(1),
                error: None,
                unsent: None,
            }
        }
    }

    struct Running {
        app: App,
        queue: Arc<EmbeddedQueue>,
        store: Arc<SqliteStore>,
        receiver: Arc<LockingReceiver>,
        release: mpsc::Sender<()>,
        delivery: Delivery,
        /// Deliveries stored beside it, not queued.
        others: Vec<(Delivery, crate::domain::Endpoint)>,
        clock: Arc<RunningClock>,
        stop: watch::Sender<bool>,
        dir: PathBuf,
    }

    impl Running {
        async fn stored(&self) -> Delivery {
            self.store
                .get_delivery(&self.delivery.account_id, &self.delivery.id)
                .await
                .unwrap()
                .unwrap()
        }

        /// Whether every one of `others` is delivered.
        async fn others_delivered(&self) -> bool {
            for (delivery, _) in &self.others {
                let stored = self
                    .store
                    .get_delivery(&delivery.account_id, &delivery.id)
                    .await
                    .unwrap()
                    .unwrap();
                if stored.status != DeliveryStatus::Delivered {
                    return false;
                }
            }
            true
        }

        /// `GET /health` of the API over this app.
        async fn health(&self) -> (u16, serde_json::Value) {
            let router = crate::api::router(crate::api::ApiState::new(
                self.app.clone(),
                crate::tokens::TokenKey::generate(),
                crate::service::access::AdminToken::fixed("test-admin-token-0123456789"),
                Duration::ZERO,
                Arc::new(crate::limits::Unlimited),
            ));
            let request = axum::http::Request::get("/health")
                .body(Body::empty())
                .unwrap();
            let response = router.oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
                .await
                .unwrap();
            (status, serde_json::from_slice(&body).unwrap())
        }
    }

    /// The dispatcher over a SQLite file, with one delivery queued to a [`LockingReceiver`]
    /// and `others` stored, not queued.
    async fn dispatching_to_a_locking_receiver(name: &str, others: usize) -> Running {
        dispatching_with(name, others, WindowLimits::default(), RecordRetry::PATIENT).await
    }

    /// [`dispatching_to_a_locking_receiver`] with the queue's window and the record's retry
    /// given.
    async fn dispatching_with(
        name: &str,
        others: usize,
        window: WindowLimits,
        record_retry: RecordRetry,
    ) -> Running {
        let (store, database) = fixtures::sqlite_file_store(&format!("dispatch-{name}"));
        let dir = database.parent().unwrap().to_path_buf();
        let (receiver, release) = LockingReceiver::new(&database);
        let receiver = Arc::new(receiver);
        let clock = Arc::new(RunningClock::new());
        let queue = Arc::new(EmbeddedQueue::with_limits(window));
        let app = App {
            queue: queue.clone(),
            transport: receiver.clone(),
            ..fixtures::app_on(store.clone(), clock.clone())
        };
        let [endpoint] = fixtures::account_with_endpoints(&*store, "acme", ["ep_a"]).await;
        let (stop, stopped) = watch::channel(false);
        let hour = Duration::from_secs(3600);
        let config = DispatcherConfig {
            sweep_interval: hour,
            health_interval: hour,
            purge_interval: hour,
            notify_interval: hour,
            record_retry,
            ..DispatcherConfig::default()
        };
        start(app.clone(), queue.clone(), store.clone(), config, stopped)
            .await
            .unwrap();
        // The periodic jobs' first runs, at start, are over before the lock is taken.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = clock.now();
        let event = fixtures::event("acme", "evt_1", now);
        let delivery = fixtures::delivery(&event, &endpoint, now);
        store
            .publish(&event, std::slice::from_ref(&delivery))
            .await
            .unwrap();
        let mut stored = Vec::new();
        for n in 0..others {
            let event = fixtures::event("acme", &format!("evt_other_{n}"), now);
            let other = fixtures::delivery(&event, &endpoint, now);
            store
                .publish(&event, std::slice::from_ref(&other))
                .await
                .unwrap();
            stored.push((other, endpoint.clone()));
        }
        queue.add(vec![PendingRef::new(&delivery, &endpoint, now)]);
        Running {
            app,
            queue,
            store,
            receiver,
            release,
            delivery,
            others: stored,
            clock,
            stop,
            dir,
        }
    }

    async fn within(timeout: Duration, mut ready: impl AsyncFnMut() -> bool) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if ready().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// A webhook sent while another process holds the database's write lock past the busy
    /// timeout is recorded once the lock is gone, and never sent again meanwhile (it was,
    /// every 5 to 10 s, for as long as the lock was held).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_webhook_whose_record_meets_a_write_lock_is_sent_once_and_recorded_after() {
        let running = dispatching_to_a_locking_receiver("record-once", 0).await;
        assert!(
            within(Duration::from_secs(5), async || running.receiver.posts()
                > 0)
            .await,
            "the webhook was never sent"
        );
        // Past the store's 5 s busy timeout: the record has failed at least once.
        tokio::time::sleep(Duration::from_secs(6)).await;
        running.release.send(()).unwrap();
        let recorded = within(Duration::from_secs(20), async || {
            running.stored().await.attempts > 0
        })
        .await;
        // Time for a send that should not come.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let stored = running.stored().await;
        assert_eq!(
            running.receiver.posts(),
            1,
            "the receiver got the webhook {} times (recorded: {recorded})",
            running.receiver.posts()
        );
        assert!(recorded, "the attempt was not recorded after the lock went");
        assert_eq!(
            (stored.status, stored.attempts),
            (DeliveryStatus::Delivered, 1)
        );
        let _ = running.stop.send(true);
        std::fs::remove_dir_all(&running.dir).unwrap();
    }

    /// A webhook sent whose record failed is not sent again before its resend time (its
    /// schedule's next delay, 30 s at least), though an outage's backlog overflows the
    /// in-memory waiting list meanwhile and the resync reads its row, still due, back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sent_unrecorded_webhook_waits_for_its_resend_time_through_a_full_window() {
        let window = WindowLimits {
            waiting: 2,
            due: 2,
            refill: 2,
            lane_floor: 1,
        };
        let running = dispatching_with("unrecorded", 3, window, RecordRetry::ONCE).await;
        let stats = || running.queue.stats();
        let held = QueueStats {
            waiting: 1,
            due: 0,
            in_flight: 0,
        };
        // Sent, then its record meets the lock past the busy timeout (5 s) and is given up.
        assert!(
            within(Duration::from_secs(15), async || running.receiver.posts()
                > 0
                && stats() == held)
            .await,
            "not held: {:?} after {} sends",
            stats(),
            running.receiver.posts()
        );
        running.release.send(()).unwrap();
        // The backlog, due already, overflows the waiting list; then the periodic resync.
        let refs = running
            .others
            .iter()
            .map(|(delivery, endpoint)| {
                PendingRef::new(delivery, endpoint, delivery.next_try_at.unwrap())
            })
            .collect();
        running.app.queue.enqueue(refs).await.unwrap();
        running.queue.resync();
        let others_delivered = within(Duration::from_secs(20), async || {
            running.others_delivered().await
        })
        .await;
        assert!(
            others_delivered,
            "the backlog was not delivered: {:?}, {} sends",
            stats(),
            running.receiver.posts()
        );
        // Time for a send that should not come.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            running.receiver.posts(),
            1 + running.others.len(),
            "the unrecorded webhook was sent again before its time"
        );
        assert_eq!(running.stored().await.attempts, 0);
        running.clock.skip(Duration::from_secs(40));
        // The workers sleep in real time until the next due one: the skip wakes none.
        running.queue.add(Vec::new());
        let resent = within(Duration::from_secs(10), async || {
            running.stored().await.status == DeliveryStatus::Delivered
        })
        .await;
        assert!(resent, "not sent at its resend time: {:?}", stats());
        assert_eq!(running.receiver.posts(), 2 + running.others.len());
        let _ = running.stop.send(true);
        std::fs::remove_dir_all(&running.dir).unwrap();
    }

    /// While records fail, new sends go one at a time: three deliveries due once the first
    /// record has failed are not all sent into a store that cannot record them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn while_records_fail_new_sends_go_one_at_a_time() {
        let running = dispatching_to_a_locking_receiver("probe", 3).await;
        assert!(
            within(Duration::from_secs(5), async || running.receiver.posts()
                > 0)
            .await,
            "the webhook was never sent"
        );
        // Due once the first record has met the busy timeout (5 s) and failed.
        let due = crate::clock::add(running.clock.now(), Duration::from_secs(8));
        let refs = running
            .others
            .iter()
            .map(|(delivery, endpoint)| PendingRef::new(delivery, endpoint, due))
            .collect();
        running.app.queue.enqueue(refs).await.unwrap();
        tokio::time::sleep(Duration::from_secs(12)).await;
        let during = running.receiver.posts();
        running.release.send(()).unwrap();
        let all = within(Duration::from_secs(30), async || {
            running.others_delivered().await
        })
        .await;
        assert!(during <= 2, "{during} webhooks sent while records failed");
        assert!(all, "the others were not all delivered after the lock went");
        assert_eq!(running.receiver.posts(), 4, "each sent once");
        let _ = running.stop.send(true);
        std::fs::remove_dir_all(&running.dir).unwrap();
    }

    /// `/health` answers 503, saying why, while the store has refused writes for more than
    /// 10 s, and 200 again once a write goes through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn health_answers_503_while_store_writes_keep_failing_and_200_after() {
        let running = dispatching_to_a_locking_receiver("health", 0).await;
        assert_eq!(running.health().await.0, 200);
        assert!(
            within(Duration::from_secs(5), async || running.receiver.posts()
                > 0)
            .await,
            "the webhook was never sent"
        );
        let sent = Instant::now();
        let mut skipped = false;
        let mut answers = Vec::new();
        // The record fails at the busy timeout (5 s); then 11 s go by on the app's clock, and
        // its next write fails 5 s later: failures spread over more than the 10 s grace.
        let degraded = within(Duration::from_secs(20), async || {
            if !skipped && sent.elapsed() > Duration::from_secs(5) {
                running.clock.skip(Duration::from_secs(11));
                skipped = true;
            }
            let (status, body) = running.health().await;
            let degraded = status == 503;
            if answers.last() != Some(&(status, body.clone())) {
                answers.push((status, body));
            }
            degraded
        })
        .await;
        running.release.send(()).unwrap();
        assert!(degraded, "answers during the write fault: {answers:?}");
        let (_, body) = answers.last().unwrap();
        assert_eq!(body["status"], "degraded", "{body}");
        let store = body["store"].as_str().unwrap_or_default();
        // The fault is past its 10 s grace, however long the machine took to get here.
        let seconds: u64 = store
            .strip_prefix("writes failing for ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(seconds >= 10 && store.contains("locked"), "{body}");
        let healthy = within(Duration::from_secs(15), async || {
            running.health().await.0 == 200
        })
        .await;
        assert!(
            healthy,
            "still {:?} after the lock went",
            running.health().await
        );
        assert_eq!(
            running.health().await.1,
            serde_json::json!({"status": "ok"})
        );
        let _ = running.stop.send(true);
        std::fs::remove_dir_all(&running.dir).unwrap();
    }
}
