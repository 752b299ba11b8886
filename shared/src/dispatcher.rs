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
    service::{deliver, health, notifications},
    store::sqlite::{PurgePace, Purged, SqliteStore},
    telemetry, App,
};

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
    let retention = app.config.retention;
    let pace = PurgePace::every(config.purge_interval);
    let stop = shutdown.clone();
    handles.push(every(
        config.purge_interval,
        shutdown.clone(),
        app.clone(),
        move |app| {
            let store = Arc::clone(&store);
            let stop = stop.clone();
            async move {
                let cutoff = crate::clock::sub(app.clock.now(), retention);
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
        let (app, queue) = (app.clone(), Arc::clone(&queue));
        tokio::spawn(async move {
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
            let result = deliver::attempt_reporting_answer(
                &app,
                &lease.delivery_id,
                Trigger::Scheduled,
                &give_back_slot,
            )
            .await;
            give_back_slot();
            queue.complete(&lease, app.clock.now());
            match result {
                Ok(result) => {
                    if let Some(next) = result.follow_up() {
                        queue.add(vec![next.clone()]);
                    }
                }
                Err(error) => {
                    // The row is still pending in the store; try again shortly.
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
