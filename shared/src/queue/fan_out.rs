//! The embedded shape's fan-out, in the place of AWS's DynamoDB stream: a publish stores its
//! event alone and answers, and this task creates the event's deliveries a moment later.
//! Each account's events are fanned out in their own turns, several accounts at once, so a
//! quiet account's event is not queued behind an outage's thousands (the store thread takes
//! the accounts' fan-out writes in turn as well). What is listed survives a restart: the
//! list is in the file, and the task starts with what it holds.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use tokio::{sync::watch, task::JoinSet};

use crate::{
    domain::AccountId,
    service::{fan_out::fan_out_batch, ServiceError},
    store::{sqlite::SqliteStore, FannedOut},
    App,
};

/// Accounts fanned out at the same time.
const ACCOUNTS_AT_ONCE: usize = 16;
/// The deliveries an account's turn creates at most (an event's alone may be more); after
/// it, the account goes to the back of the line. Bounds what a turn holds in memory too.
const DELIVERIES_PER_TURN: usize = 1_024;
/// An account's events in one turn at most.
const EVENTS_PER_TURN: usize = 64;
/// How long an account whose fan-out failed waits before its next turn.
const AFTER_A_FAILURE: Duration = Duration::from_secs(1);

/// Runs until `shutdown`; a turn in progress is finished first (what it has not marked is
/// fanned out again at the next start, which creates nothing twice).
pub async fn run(app: App, store: Arc<SqliteStore>, mut shutdown: watch::Receiver<bool>) {
    let mut line = Line::default();
    loop {
        match store.accounts_with_unfanned().await {
            Ok(accounts) => {
                line.add(accounts);
                break;
            }
            Err(error) => {
                tracing::error!(%error, "cannot read the events waiting for fan-out; trying again");
                tokio::select! {
                    () = tokio::time::sleep(AFTER_A_FAILURE) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
    let mut turns: JoinSet<(AccountId, bool)> = JoinSet::new();
    // Whose turn each task is, for one that panics.
    let mut whose: HashMap<tokio::task::Id, AccountId> = HashMap::new();
    loop {
        while turns.len() < ACCOUNTS_AT_ONCE {
            let Some(account) = line.next() else {
                break;
            };
            let (app, store, mine) = (app.clone(), Arc::clone(&store), account.clone());
            let task = turns.spawn(async move {
                let began = app.clock.now();
                let more = match turn(&app, &store, &account).await {
                    Ok(more) => more,
                    Err(error) => {
                        // A full disk or a lock held elsewhere shows in `/health`.
                        if let ServiceError::Store(failure) = &error {
                            crate::service::note_write_failure(&app, began, failure);
                        }
                        tracing::error!(account.id = %account, %error, "fan-out failed; the account's events wait for its next turn");
                        // Its next turn comes after a pause, not at once.
                        tokio::time::sleep(AFTER_A_FAILURE).await;
                        true
                    }
                };
                (account, more)
            });
            whose.insert(task.id(), mine);
        }
        tokio::select! {
            Some(ended) = turns.join_next_with_id() => line.task_ended(&mut whose, ended),
            accounts = store.unfanned_signalled() => line.add(accounts),
            _ = shutdown.changed() => break,
        }
    }
    while turns.join_next().await.is_some() {}
}

/// Fans out the account's oldest listed events, as many as [`DELIVERIES_PER_TURN`] allows
/// at its number of endpoints. Returns whether more may be waiting.
async fn turn(app: &App, store: &SqliteStore, account: &AccountId) -> Result<bool, ServiceError> {
    let endpoints = app.store.list_endpoints(account).await?.len();
    let limit = (DELIVERIES_PER_TURN / endpoints.max(1)).clamp(1, EVENTS_PER_TURN);
    let events = store
        .unfanned_of(account, u32::try_from(limit).unwrap_or(1))
        .await?;
    if events.is_empty() {
        return Ok(false);
    }
    let outcome = fan_out_batch(app, &events).await;
    if !outcome.unknown_account.is_empty() {
        // The account is gone: its events have no one to go to.
        let gone: Vec<FannedOut> = outcome
            .unknown_account
            .iter()
            .filter_map(|&position| events.get(position))
            .map(|event| FannedOut {
                event: event.clone(),
                missed: false,
            })
            .collect();
        app.store.mark_fanned_out(&gone).await?;
    }
    match outcome.error {
        Some(error) => Err(error),
        None => {
            // Deliveries written: a fault a refused turn noted is over. (A turn that wrote
            // none, its events matching no endpoint, proves nothing: its one write, the
            // mark, may have failed and been left to the sweeper.)
            if outcome.created > 0 {
                crate::telemetry::store_write_succeeded(&app.store);
            }
            Ok(events.len() == limit)
        }
    }
}

/// The accounts waiting for a turn, in order, each once; and those in a turn now, with
/// whether they were signalled again during it.
#[derive(Default)]
struct Line {
    waiting: VecDeque<AccountId>,
    queued: HashSet<AccountId>,
    in_turn: HashSet<AccountId>,
    again: HashSet<AccountId>,
}

impl Line {
    fn add(&mut self, accounts: impl IntoIterator<Item = AccountId>) {
        for account in accounts {
            if self.in_turn.contains(&account) {
                self.again.insert(account);
            } else if self.queued.insert(account.clone()) {
                self.waiting.push_back(account);
            }
        }
    }

    fn next(&mut self) -> Option<AccountId> {
        let account = self.waiting.pop_front()?;
        self.queued.remove(&account);
        self.in_turn.insert(account.clone());
        Some(account)
    }

    /// A turn's task ended, `whose` telling whose it was: its account goes back in line
    /// if it may have more. A turn that panicked left its events listed, so its account
    /// goes on; without this it stayed in its turn until the next start.
    fn task_ended(
        &mut self,
        whose: &mut HashMap<tokio::task::Id, AccountId>,
        ended: Result<(tokio::task::Id, (AccountId, bool)), tokio::task::JoinError>,
    ) {
        let (id, account, more) = match ended {
            Ok((id, (account, more))) => (id, Some(account), more),
            Err(failed) => (failed.id(), None, true),
        };
        if let Some(account) = whose.remove(&id).or(account) {
            self.turn_ended(account, more);
        }
    }

    fn turn_ended(&mut self, account: AccountId, more: bool) {
        self.in_turn.remove(&account);
        let again = self.again.remove(&account);
        if more || again {
            self.add([account]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use tokio::sync::watch;

    use crate::{
        fixtures::{account_with_endpoints, app_on, event, t0},
        store::{sqlite::SqliteStore, Store},
        App, PublishMode, SystemClock,
    };

    fn app(store: &Arc<SqliteStore>) -> App {
        App {
            publish: PublishMode::ThroughStream,
            ..app_on(Arc::clone(store) as Arc<dyn Store>, Arc::new(SystemClock))
        }
    }

    /// The fan-out task on `store`, until [`stop`] ends it.
    fn start(store: &Arc<SqliteStore>) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (stop, stopped) = watch::channel(false);
        let running = tokio::spawn(super::run(app(store), Arc::clone(store), stopped));
        (stop, running)
    }

    async fn stop((stop, running): (watch::Sender<bool>, tokio::task::JoinHandle<()>)) {
        stop.send(true).unwrap();
        running.await.unwrap();
    }

    /// Polls `done` every 10 ms for up to 10 s.
    async fn eventually<F, Fut>(what: &str, mut done: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        for _ in 0..1_000 {
            if done().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("not within 10 s: {what}");
    }

    /// Once the fan-out has emptied the list: the endpoints `event` has deliveries to, sorted.
    async fn fanned_out_to(store: &Arc<SqliteStore>, event: &crate::domain::Event) -> Vec<String> {
        eventually("the event is off the list", || {
            let store = Arc::clone(store);
            async move { unfanned(&store).await == 0 }
        })
        .await;
        let mut to: Vec<String> = store
            .deliveries_of_event(event)
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.endpoint_id.to_string())
            .collect();
        to.sort();
        to
    }

    async fn unfanned(store: &SqliteStore) -> usize {
        let later = t0() + chrono::TimeDelta::days(3650);
        store
            .unfanned_events(None, later, 10_000)
            .await
            .unwrap()
            .events
            .len()
    }

    /// Publishes an empty `invoice.paid` event of id `id` to the account `acme`.
    async fn publish_to_acme(app: &App, id: &str) {
        crate::service::publish::publish(
            app,
            &crate::domain::AccountId::parse("acme").unwrap(),
            crate::service::publish::NewEvent {
                id: Some(id.into()),
                event_type: "invoice.paid".into(),
                data: serde_json::json!({}),
            },
        )
        .await
        .unwrap();
    }

    /// A fan-out the store refuses (another process holds the write lock past the busy
    /// timeout) is a store fault `/health` reports, as a refused attempt record is; the
    /// turn that goes through after clears it.
    #[tokio::test]
    async fn a_fan_out_the_store_refuses_is_a_store_fault() {
        let (store, database) = crate::fixtures::sqlite_file_store("fan-out-refused");
        account_with_endpoints(store.as_ref(), "acme", ["ep_1"]).await;
        let app = app(&store);
        publish_to_acme(&app, "evt_1").await;
        assert!(crate::telemetry::store_fault(&app.store).is_none());
        let lock = rusqlite::Connection::open(&database).unwrap();
        lock.execute_batch("BEGIN IMMEDIATE").unwrap();
        let (_stop, running) = start(&store);
        eventually("the refused fan-out is a store fault", || {
            let app = app.clone();
            async move { crate::telemetry::store_fault(&app.store).is_some() }
        })
        .await;
        assert_eq!(unfanned(&store).await, 1, "still listed for its next turn");
        lock.execute_batch("COMMIT").unwrap();
        eventually("the next turn fans it out and clears the fault", || {
            let (app, store) = (app.clone(), Arc::clone(&store));
            async move {
                unfanned(&store).await == 0 && crate::telemetry::store_fault(&app.store).is_none()
            }
        })
        .await;
        running.abort();
        std::fs::remove_dir_all(database.parent().unwrap()).unwrap();
    }

    /// A turn that wrote no delivery (its event matches no endpoint; its one write, the
    /// mark, may fail unreported) does not clear a store fault.
    #[tokio::test]
    async fn a_turn_that_wrote_no_delivery_leaves_a_store_fault() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        account_with_endpoints(store.as_ref(), "acme", [] as [&str; 0]).await;
        let app = app(&store);
        publish_to_acme(&app, "evt_1").await;
        // After the publish's own write, which clears it.
        crate::telemetry::store_write_failed(&app.store, (t0(), t0()), &"disk full");
        let task = start(&store);
        eventually("the event is off the list", || {
            let store = Arc::clone(&store);
            async move { unfanned(&store).await == 0 }
        })
        .await;
        stop(task).await;
        assert!(crate::telemetry::store_fault(&app.store).is_some());
    }

    #[tokio::test]
    async fn a_published_event_gets_its_deliveries_and_leaves_the_list() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        account_with_endpoints(store.as_ref(), "acme", ["ep_1", "ep_2"]).await;
        let task = start(&store);
        let published = crate::service::publish::publish(
            &app(&store),
            &crate::domain::AccountId::parse("acme").unwrap(),
            crate::service::publish::NewEvent {
                id: Some("evt_1".into()),
                event_type: "invoice.paid".into(),
                data: serde_json::json!({"n": 1}),
            },
        )
        .await
        .unwrap();
        assert_eq!(
            published.deliveries.len(),
            2,
            "the answer lists what will exist"
        );
        let event = published.event.clone();
        eventually(
            "both deliveries exist and the event is off the list",
            || {
                let (store, event) = (Arc::clone(&store), event.clone());
                async move {
                    store.deliveries_of_event(&event).await.unwrap().len() == 2
                        && unfanned(&store).await == 0
                }
            },
        )
        .await;
        let mut stored = store.deliveries_of_event(&event).await.unwrap();
        let mut answered = published.deliveries;
        stored.sort_by(|a, b| a.id.cmp(&b.id));
        answered.sort_by(|a, b| a.id.cmp(&b.id));
        let ids =
            |ds: &[crate::domain::Delivery]| ds.iter().map(|d| d.id.clone()).collect::<Vec<_>>();
        assert_eq!(
            ids(&stored),
            ids(&answered),
            "the ones the publish answered"
        );
        stop(task).await;
    }

    /// The list is in the file: what a stopped server left is fanned out at the next start.
    #[tokio::test]
    async fn what_a_stop_left_listed_is_fanned_out_at_the_next_start() {
        let dir =
            std::env::temp_dir().join(format!("hooklane-fan-out-restart-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hooklane.db");
        let secrets = || crate::testing::test_secrets(None);
        let events: Vec<_> = (0..70)
            .map(|i| event("acme", &format!("evt_{i}"), t0()))
            .collect();
        {
            let store = SqliteStore::open(&path, secrets()).unwrap();
            account_with_endpoints(&store, "acme", ["ep_1"]).await;
            for event in &events {
                store.put_event(event).await.unwrap();
            }
            assert_eq!(unfanned(&store).await, 70);
        }
        let store = Arc::new(SqliteStore::open(&path, secrets()).unwrap());
        let task = start(&store);
        eventually("every event fanned out", || {
            let store = Arc::clone(&store);
            async move { unfanned(&store).await == 0 }
        })
        .await;
        for event in &events {
            assert_eq!(store.deliveries_of_event(event).await.unwrap().len(), 1);
        }
        stop(task).await;
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A quiet account's event is fanned out while a busy account's backlog still waits.
    #[tokio::test]
    async fn a_quiet_account_is_not_queued_behind_a_busy_ones_backlog() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        account_with_endpoints(store.as_ref(), "busy", ["ep_b1", "ep_b2", "ep_b3"]).await;
        account_with_endpoints(store.as_ref(), "quiet", ["ep_q"]).await;
        for i in 0..3_000 {
            store
                .put_event(&event("busy", &format!("evt_{i}"), t0()))
                .await
                .unwrap();
        }
        let quiet = event("quiet", "evt_q", t0() + chrono::TimeDelta::seconds(1));
        store.put_event(&quiet).await.unwrap();
        let task = start(&store);
        eventually("the quiet account's delivery exists", || {
            let (store, quiet) = (Arc::clone(&store), quiet.clone());
            async move { !store.deliveries_of_event(&quiet).await.unwrap().is_empty() }
        })
        .await;
        let left = unfanned(&store).await;
        assert!(
            left > 1_000,
            "the busy account's backlog was mostly fanned out first: {left} of 3,000 events left"
        );
        stop(task).await;
    }

    /// An event of an account that does not exist (gone since) gets no deliveries and is
    /// taken off the list, not read again and again.
    #[tokio::test]
    async fn an_event_of_no_account_leaves_the_list() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let stray = event("gone", "evt_stray", t0());
        store.put_event(&stray).await.unwrap();
        let task = start(&store);
        eventually("the stray event is off the list", || {
            let store = Arc::clone(&store);
            async move { unfanned(&store).await == 0 }
        })
        .await;
        assert!(store.deliveries_of_event(&stray).await.unwrap().is_empty());
        stop(task).await;
    }

    /// An event goes to the endpoints that existed when it was published (allowing a second
    /// for clocks apart), whenever its fan-out runs: one created since (a customer adding an
    /// endpoint while the event waits to be fanned out) does not get it, and is not sent the
    /// account's past events.
    #[tokio::test]
    async fn an_endpoint_created_after_the_event_does_not_get_it() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        account_with_endpoints(store.as_ref(), "acme", ["ep_a"]).await;
        let published = t0() + chrono::TimeDelta::seconds(1);
        let waiting = event("acme", "evt_waiting", published);
        store.put_event(&waiting).await.unwrap();
        for (id, at) in [
            (
                "ep_within",
                published + chrono::TimeDelta::milliseconds(999),
            ),
            (
                "ep_late",
                published + chrono::TimeDelta::milliseconds(1_000),
            ),
        ] {
            store
                .create_endpoint(&crate::fixtures::endpoint("acme", id, at))
                .await
                .unwrap();
        }
        let task = start(&store);
        assert_eq!(fanned_out_to(&store, &waiting).await, ["ep_a", "ep_within"]);
        stop(task).await;
    }

    /// An event to more endpoints than a part goes on after the part recorded on it: a
    /// fan-out that stopped after writing and queueing the deliveries to ep_a and ep_b (here,
    /// only its mark is made) is finished with the other three, in parts of two.
    #[tokio::test]
    async fn an_event_in_parts_goes_on_after_the_part_recorded() {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let five = ["ep_a", "ep_b", "ep_c", "ep_d", "ep_e"];
        account_with_endpoints(store.as_ref(), "acme", five).await;
        let big = event("acme", "evt_big", t0());
        store.put_event(&big).await.unwrap();
        // Created between two parts, a second after the event: it does not get it, though its id
        // sorts after the mark.
        let later = t0() + chrono::TimeDelta::seconds(1);
        store
            .create_endpoint(&crate::fixtures::endpoint("acme", "ep_f", later))
            .await
            .unwrap();
        let through = crate::domain::EndpointId::parse("ep_b").unwrap();
        store
            .record_fan_out_progress(&big.account_id, &big.id, &through)
            .await
            .unwrap();
        let (stop_task, stopped) = watch::channel(false);
        let app = App {
            config: Arc::new(crate::config::CoreConfig {
                fan_out_part: 2,
                ..Default::default()
            }),
            ..app(&store)
        };
        let running = tokio::spawn(super::run(app, Arc::clone(&store), stopped));
        assert_eq!(fanned_out_to(&store, &big).await, ["ep_c", "ep_d", "ep_e"]);
        assert_eq!(
            store
                .fan_out_progress(&big.account_id, &big.id)
                .await
                .unwrap()
                .map(|ep| ep.to_string())
                .as_deref(),
            Some("ep_e"),
            "each part recorded"
        );
        stop((stop_task, running)).await;
    }

    /// A turn whose task panicked gives its account back to the line (its events are still
    /// listed), and a turn that ended with more waiting does too; one that found its
    /// account's list empty does not.
    #[tokio::test]
    async fn a_turn_that_panicked_gives_its_account_back_to_the_line() {
        let account = |name: &str| crate::domain::AccountId::parse(name).unwrap();
        let mut line = super::Line::default();
        line.add([account("panics"), account("done"), account("more")]);
        let mut turns = tokio::task::JoinSet::new();
        let mut whose = std::collections::HashMap::new();
        while let Some(next) = line.next() {
            let mine = next.clone();
            let task = turns.spawn(async move {
                match next.as_str() {
                    // A panic that skips the panic hook: the test's log shows no backtrace.
                    "panics" => std::panic::resume_unwind(Box::new("a turn panicked")),
                    "done" => (next, false),
                    _ => (next, true),
                }
            });
            whose.insert(task.id(), mine);
        }
        while let Some(ended) = turns.join_next_with_id().await {
            line.task_ended(&mut whose, ended);
        }
        assert!(whose.is_empty(), "{whose:?}");
        let mut back: Vec<String> = std::iter::from_fn(|| line.next())
            .map(|a| a.as_str().to_owned())
            .collect();
        back.sort();
        assert_eq!(back, ["more", "panics"]);
    }
}
