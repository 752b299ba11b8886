//! What only the SQLite store does (the store contract runs from the integration tests,
//! `tests/core/stores.rs`).

use super::rows::*;
use super::schema::*;
use super::*;

/// The deliveries table of the first release, before any column was added.
const FIRST_RELEASE_DELIVERIES: &str =
    "CREATE TABLE deliveries (id TEXT PRIMARY KEY, account_id TEXT NOT NULL, event_id TEXT NOT NULL, \
     endpoint_id TEXT NOT NULL, event_type TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL, \
     next_try_at INTEGER, last_status INTEGER, last_error TEXT, client_errors INTEGER NOT NULL, \
     created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);";

async fn poll_once<F: std::future::Future>(
    future: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    let mut future = Some(future);
    std::future::poll_fn(|cx| {
        let future = future.take().expect("polled once");
        std::task::Poll::Ready(future.poll(cx))
    })
    .await
}

/// A job the hold helpers queue: it runs until `release` sends.
type HoldingJob = Box<dyn FnOnce(&mut Connection) -> StoreResult<()> + Send>;

/// Holds the thread that `queue` sends the job to until `release` sends: what is queued
/// there meanwhile is surely queued, and unanswered. Await the job once released.
async fn hold<Fut: std::future::Future<Output = StoreResult<()>>>(
    queue: impl FnOnce(HoldingJob) -> Fut,
) -> (std::sync::mpsc::Sender<()>, std::pin::Pin<Box<Fut>>) {
    let (started, has_started) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let mut holder = Box::pin(queue(Box::new(move |_| {
        let _ = started.send(());
        let _ = released.recv();
        Ok(())
    })));
    assert!(poll_once(holder.as_mut()).await.is_pending());
    has_started.recv().unwrap();
    (release, holder)
}

/// Holds the store thread in a job of its own (see [`hold`]).
async fn hold_store_thread(
    store: &SqliteStore,
) -> (
    std::sync::mpsc::Sender<()>,
    std::pin::Pin<Box<impl std::future::Future<Output = StoreResult<()>> + '_>>,
) {
    hold(|job| store.run_then(job, |_| {})).await
}

/// A store with one endpoint, which a first try has read (so the store keeps it), and
/// a second event with its delivery, not yet published.
async fn store_that_knows_its_endpoint() -> (SqliteStore, Endpoint, Event, Delivery) {
    use crate::fixtures::{account, delivery, endpoint, event, t0};
    let store = SqliteStore::in_memory().unwrap();
    store.create_account(&account("acme")).await.unwrap();
    let ep = endpoint("acme", "ep_a", t0());
    store.create_endpoint(&ep).await.unwrap();
    let (ev1, ev2) = (event("acme", "evt_1", t0()), event("acme", "evt_2", t0()));
    let (d1, d2) = (delivery(&ev1, &ep, t0()), delivery(&ev2, &ep, t0()));
    store
        .publish(&ev1, std::slice::from_ref(&d1))
        .await
        .unwrap();
    store.load_work(&d1.id).await.unwrap().unwrap();
    (store, ep, ev2, d2)
}

/// A store on a file in a fresh directory of its own (`name`), with the account acme and
/// its endpoint `ep_a`. The caller removes the directory.
async fn file_store_with_endpoint(name: &str) -> (std::path::PathBuf, SqliteStore, Endpoint) {
    use crate::fixtures::{account, endpoint, t0};
    let dir = std::env::temp_dir().join(format!("hooklane-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(
        dir.join(format!("{name}.db")),
        crate::secrets::SecretsCipher::ephemeral().unwrap(),
    )
    .unwrap();
    store.create_account(&account("acme")).await.unwrap();
    let ep = endpoint("acme", "ep_a", t0());
    store.create_endpoint(&ep).await.unwrap();
    (dir, store, ep)
}

/// Everything past retention before `cutoff`, removed without pauses between slices.
async fn purge_past(store: &SqliteStore, cutoff: crate::clock::Timestamp) -> Purged {
    store
        .purge_before(
            cutoff,
            super::PurgePace::FLAT_OUT,
            &tokio::sync::watch::channel(false).1,
        )
        .await
        .unwrap()
}

/// Every event's payload once [`change_payloads_behind_the_stores_back`] has run.
const CHANGED_PAYLOAD: &str = "{\"changed\":1}";

/// Changes every event's payload behind the store's back (no store write does this, so what
/// the store keeps is not forgotten): a first try that reads the old payload used the kept copy.
async fn change_payloads_behind_the_stores_back(store: &SqliteStore) {
    store
        .run_then(
            |conn| {
                conn.execute("UPDATE events SET payload = ?1", [CHANGED_PAYLOAD])
                    .map_err(backend)
            },
            |_| {},
        )
        .await
        .unwrap();
}

/// [`store_that_knows_its_endpoint`] with its second event published, and then every
/// event's payload changed behind the store's back ([`change_payloads_behind_the_stores_back`]).
async fn published_then_changed_behind_the_stores_back() -> (SqliteStore, Event, Delivery) {
    let (store, _, ev2, d2) = store_that_knows_its_endpoint().await;
    store
        .publish(&ev2, std::slice::from_ref(&d2))
        .await
        .unwrap();
    change_payloads_behind_the_stores_back(&store).await;
    (store, ev2, d2)
}

/// `account` and its endpoints as a publish reads them, with the API's reader held: they
/// come back only if they were kept in memory.
async fn publish_reads_with_the_reader_held(
    store: &SqliteStore,
    account: &AccountId,
) -> (Option<crate::domain::Account>, Vec<Endpoint>) {
    let (release, holder) = hold(|job| store.read(job)).await;
    let wait = std::time::Duration::from_secs(10);
    let kept = tokio::time::timeout(wait, store.get_account(account))
        .await
        .expect("the account was read again, behind the held reader")
        .unwrap();
    let endpoints = tokio::time::timeout(wait, store.list_endpoints(account))
        .await
        .expect("the endpoints were read again, behind the held reader")
        .unwrap();
    release.send(()).unwrap();
    holder.await.unwrap();
    (kept, endpoints)
}

#[tokio::test]
async fn a_first_try_takes_what_the_publish_wrote_without_reading_it() {
    let (store, ev2, d2) = published_then_changed_behind_the_stores_back().await;
    let kept = store.load_work(&d2.id).await.unwrap().unwrap();
    assert_eq!(
        kept.event.unwrap().payload,
        ev2.payload,
        "the first try used the kept copy"
    );
    let read = store.load_work(&d2.id).await.unwrap().unwrap();
    assert_eq!(
        read.event.unwrap().payload,
        CHANGED_PAYLOAD,
        "a second load reads the database"
    );
}

/// The sweeper's reads (failing endpoints, unsent notifications, a setting) run on the
/// store thread but change nothing: what a publish left for its first tries stays kept.
#[tokio::test]
async fn the_sweepers_reads_forget_nothing_kept() {
    let (store, ev2, d2) = published_then_changed_behind_the_stores_back().await;
    store
        .failing_endpoints(crate::fixtures::t0())
        .await
        .unwrap();
    store
        .unsent_notifications(crate::fixtures::t0(), 10)
        .await
        .unwrap();
    store.get_setting("admin").await.unwrap();
    let kept = store.load_work(&d2.id).await.unwrap().unwrap();
    assert_eq!(
        kept.event.unwrap().payload,
        ev2.payload,
        "the first try still used the kept copy"
    );
}

#[tokio::test]
async fn a_write_whose_caller_stopped_waiting_is_still_seen_by_the_next_first_try() {
    let (store, ep, ev2, d2) = store_that_knows_its_endpoint().await;
    let moved = Endpoint {
        url: EndpointUrl::parse("https://moved.example.com/hooks").unwrap(),
        ..ep.clone()
    };
    // Hold the store thread in a job of its own, so that the update is surely queued and
    // unanswered when it is dropped, as when an API client disconnects.
    let (release, holder) = hold_store_thread(&store).await;
    {
        let read = ep.version();
        let mut update = std::pin::pin!(store.update_endpoint(&moved, &read));
        assert!(poll_once(update.as_mut()).await.is_pending());
    }
    release.send(()).unwrap();
    holder.await.unwrap();
    store
        .publish(&ev2, std::slice::from_ref(&d2))
        .await
        .unwrap();
    let work = store.load_work(&d2.id).await.unwrap().unwrap();
    assert_eq!(work.endpoint.unwrap().url, moved.url);
}

#[tokio::test]
async fn a_small_publish_is_written_before_another_accounts_earlier_large_ones() {
    use crate::fixtures::{account, delivery, endpoint, event, t0};
    let store = SqliteStore::in_memory().unwrap();
    // Each large publish is more rows than a batch takes with another: one per batch.
    let fan = MAX_BATCH_ROWS * 3 / 4;
    let publish = |owner: &str, id: &str, endpoints: usize| {
        let ev = event(owner, id, t0());
        let deliveries: Vec<Delivery> = (0..endpoints)
            .map(|i| delivery(&ev, &endpoint(owner, &format!("ep_{i}"), t0()), t0()))
            .collect();
        let store = store.clone();
        async move { store.publish(&ev, &deliveries).await }
    };
    for owner in ["busy", "calm"] {
        store.create_account(&account(owner)).await.unwrap();
    }
    let (release, holder) = hold_store_thread(&store).await;
    // Queued while the store thread is held: three large publishes, then a small one.
    let mut queued = Vec::new();
    for id in ["evt_1", "evt_2", "evt_3"] {
        queued.push(Box::pin(publish("busy", id, fan)));
    }
    queued.push(Box::pin(publish("calm", "evt_small", 1)));
    for call in &mut queued {
        assert!(poll_once(call.as_mut()).await.is_pending());
    }
    release.send(()).unwrap();
    holder.await.unwrap();
    for call in queued {
        call.await.unwrap();
    }
    let order: Vec<String> = store
        .run(|conn| {
            conn.prepare("SELECT event_id FROM deliveries GROUP BY event_id ORDER BY MIN(rowid)")
                .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
                .map_err(backend)
        })
        .await
        .unwrap();
    // The calm account is quiet (one small job) beside a busy one: its batch goes first.
    assert_eq!(order, ["evt_small", "evt_1", "evt_2", "evt_3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_accounts_publish_ends_a_long_batch_early() {
    use crate::fixtures::{account, delivery, endpoint, event, t0};
    let store = SqliteStore::in_memory().unwrap();
    for owner in ["busy", "calm"] {
        store.create_account(&account(owner)).await.unwrap();
    }
    let busy = AccountId::from_trusted("busy".into());
    // 200 of the busy account's writes of 2 ms each, queued at once: one batch of 400 ms.
    let (release, holder) = hold_store_thread(&store).await;
    let (running, is_running) = std::sync::mpsc::channel();
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut writes = Vec::new();
    for i in 0..200 {
        let (running, answered) = (running.clone(), Arc::clone(&answered));
        let write = store.run_for(
            (Lane::Account(busy.clone()), 3, false),
            move |_| {
                if i == 10 {
                    let _ = running.send(());
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
                Ok(())
            },
            move |_| {
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            },
        );
        let mut write = Box::pin(write);
        assert!(poll_once(write.as_mut()).await.is_pending());
        writes.push(write);
    }
    release.send(()).unwrap();
    holder.await.unwrap();
    is_running.recv().unwrap();
    // The calm account publishes while that batch runs: it waits for a part of it only.
    let ev = event("calm", "evt_calm", t0());
    let d = delivery(&ev, &endpoint("calm", "ep_a", t0()), t0());
    store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
    let before = answered.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (1..100).contains(&before),
        "busy writes answered before the publish: {before} of 200"
    );
    for write in writes {
        write.await.unwrap();
    }
    assert_eq!(answered.load(std::sync::atomic::Ordering::SeqCst), 200);
}

#[tokio::test]
async fn the_backlog_is_counted_across_slices_with_its_oldest_row() {
    use crate::fixtures::{account, delivery, endpoint, event, t0};
    let store = SqliteStore::in_memory().unwrap();
    store.create_account(&account("acme")).await.unwrap();
    let slice = usize::try_from(BACKLOG_SLICE).unwrap();
    // Two full slices and some; the oldest row is in the middle slice in due order.
    let ev = event("acme", "evt_1", t0());
    let mut deliveries: Vec<Delivery> = (0..2 * slice + 7)
        .map(|i| {
            let mut d = delivery(&ev, &endpoint("acme", &format!("ep_{i:05}"), t0()), t0());
            d.next_try_at = Some(crate::clock::add(
                t0(),
                std::time::Duration::from_secs(i as u64),
            ));
            d
        })
        .collect();
    let oldest = crate::clock::sub(t0(), std::time::Duration::from_secs(3_600));
    deliveries[slice + 3].created_at = oldest;
    store.publish(&ev, &deliveries).await.unwrap();
    assert_eq!(
        store.backlog().await.unwrap(),
        ((2 * slice + 7) as u64, Some(oldest))
    );
    let empty = SqliteStore::in_memory().unwrap();
    assert_eq!(empty.backlog().await.unwrap(), (0, None));
}

/// The store thread checkpoints the WAL itself only well past the point where the
/// checkpointer asks it for a restart: between the request (every 100 ms at most) and the
/// restart, W1's writes add some 2,000 pages, and the store thread's own checkpoint (fsyncs,
/// and copying what the checkpointer has not) held every publish 13–30 ms at a commit.
#[tokio::test]
async fn the_store_thread_checkpoints_itself_only_far_past_the_restart_point() {
    let (dir, store, _) = file_store_with_endpoint("backstop").await;
    let backstop: i64 = store
        .read_on_the_store_thread(|conn| {
            conn.query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
                .map_err(backend)
        })
        .await
        .unwrap();
    assert!(
        backstop >= 4 * WAL_RESTART_PAGES,
        "the store thread checkpoints itself past {backstop} pages, the restart is asked past {}",
        WAL_RESTART_PAGES
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_wal_restart_gives_up_at_once_while_a_reader_holds_a_snapshot() {
    let dir = std::env::temp_dir().join(format!("hooklane-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("restart.db");
    let writer = Connection::open(&path).unwrap();
    writer.pragma_update(None, "journal_mode", "WAL").unwrap();
    writer.busy_timeout(BUSY_TIMEOUT).unwrap();
    writer
        .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    let reader = Connection::open(&path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let seen: i64 = reader
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 1);
    writer.execute("INSERT INTO t VALUES (2)", []).unwrap();
    // The store thread runs the restart between batches: every write waits while it does.
    let started = std::time::Instant::now();
    assert!(!restart_wal(&writer), "the reader is still in the WAL");
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_secs(1),
        "the restart waited {waited:?} for the reader"
    );
    reader.execute_batch("COMMIT").unwrap();
    assert!(restart_wal(&writer), "no reader left: the WAL starts over");
    drop((reader, writer));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn an_older_file_keeps_its_attempts_in_the_time_ordered_table() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(&format!(
        "{FIRST_RELEASE_DELIVERIES} \
         CREATE TABLE attempts (delivery_id TEXT NOT NULL, number INTEGER NOT NULL, trigger TEXT NOT NULL, \
         started_at INTEGER NOT NULL, latency_ms INTEGER NOT NULL, status_code INTEGER, \
         response_headers TEXT NOT NULL, response_body TEXT NOT NULL, response_body_truncated INTEGER NOT NULL, \
         error TEXT, PRIMARY KEY (delivery_id, number)); \
         INSERT INTO deliveries VALUES ('dlv_1', 'acme', 'evt_1', 'ep_1', 'a.b', 'pending', 2, 5000, 500, 'x', 0, 1000, 2); \
         INSERT INTO attempts VALUES ('dlv_1', 1, 'scheduled', 1000, 12, 500, '[]', 'no', 0, NULL); \
         INSERT INTO attempts VALUES ('dlv_1', 2, 'scheduled', 3000, 15, 503, '[]', 'later', 0, NULL);"
    ))
    .unwrap();
    let store = older_file_opened(conn);
    let attempts = store
        .list_attempts(&DeliveryId::from_trusted("dlv_1".into()))
        .await
        .unwrap();
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.number, a.status_code, a.response_body.as_str()))
            .collect::<Vec<_>>(),
        vec![(1, Some(500), "no"), (2, Some(503), "later")]
    );
    let layout = store
        .run(|conn| table_columns(conn, "attempts").map_err(backend))
        .await
        .unwrap();
    assert_eq!(
        layout.first().map(String::as_str),
        Some("delivery_created_at")
    );
}

/// A store over a connection holding a file of an older layout, as `open` makes it.
fn older_file_opened(conn: Connection) -> SqliteStore {
    SqliteStore::init(
        conn,
        None,
        crate::secrets::SecretsCipher::ephemeral().unwrap(),
        reads_on_the_store_thread,
    )
    .unwrap()
}

#[tokio::test]
async fn an_older_file_gains_the_replay_columns() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(&format!(
        "{FIRST_RELEASE_DELIVERIES} \
         INSERT INTO deliveries VALUES ('dlv_1', 'acme', 'evt_1', 'ep_1', 'a.b', 'failed', 3, NULL, 500, 'x', 0, 1, 2);"
    ))
    .unwrap();
    let store = older_file_opened(conn);
    let delivery = store
        .run(|conn| {
            conn.query_row(
                &format!("SELECT {DELIVERY_COLUMNS} FROM deliveries"),
                [],
                delivery_from_row,
            )
            .map_err(backend)
        })
        .await
        .unwrap();
    assert_eq!(delivery.schedule_start, 0);
    assert_eq!(delivery.next_trigger, Trigger::Scheduled);
}

#[tokio::test]
async fn an_older_file_gains_the_headers_column_and_its_endpoints_have_none() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(
        "CREATE TABLE endpoints (id TEXT PRIMARY KEY, account_id TEXT NOT NULL, url TEXT NOT NULL, \
           description TEXT NOT NULL, secret TEXT NOT NULL, retiring_secret TEXT, retiring_until INTEGER, \
           status TEXT NOT NULL, event_types TEXT, max_in_flight INTEGER NOT NULL, rate_limit INTEGER, \
           failing_since INTEGER, disabled_reason TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL); \
         INSERT INTO endpoints VALUES ('ep_1', 'acme', 'https://a.example/h', '', \
           'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', NULL, NULL, 'active', NULL, 4, NULL, NULL, NULL, 1, 2);",
    )
    .unwrap();
    let store = older_file_opened(conn);
    let endpoint = store
        .get_endpoint(
            &AccountId::from_trusted("acme".into()),
            &EndpointId::from_trusted("ep_1".into()),
        )
        .await
        .unwrap()
        .expect("the older row");
    assert!(endpoint.headers.is_empty());
}

/// A file made while the log's indexes were declared descending has them made again,
/// ascending, on open; its log still reads newest first, filtered or not, page by page.
#[tokio::test]
async fn an_older_file_gets_its_log_indexes_ascending_and_reads_newest_first() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(&format!(
        "{FIRST_RELEASE_DELIVERIES} \
         CREATE INDEX deliveries_by_endpoint ON deliveries(endpoint_id, created_at DESC, id DESC); \
         CREATE INDEX deliveries_by_account ON deliveries(account_id, created_at DESC, id DESC); \
         CREATE INDEX deliveries_by_account_type ON deliveries(account_id, event_type, created_at DESC, id DESC); \
         CREATE INDEX deliveries_by_account_failure ON deliveries(account_id, status, created_at DESC, id DESC) WHERE status IN ('failed', 'abandoned'); \
         CREATE INDEX deliveries_by_endpoint_failure ON deliveries(endpoint_id, status, created_at DESC, id DESC) WHERE status IN ('failed', 'abandoned'); \
         CREATE INDEX deliveries_by_account_error_code ON deliveries(account_id, last_status, created_at DESC, id DESC) WHERE last_status >= 300; \
         INSERT INTO deliveries VALUES ('dlv_1', 'acme', 'evt_1', 'ep_1', 'a.b', 'failed', 3, NULL, 503, 'x', 0, 1000, 2); \
         INSERT INTO deliveries VALUES ('dlv_2', 'acme', 'evt_2', 'ep_1', 'a.b', 'delivered', 1, NULL, 200, NULL, 0, 2000, 2); \
         INSERT INTO deliveries VALUES ('dlv_3', 'acme', 'evt_3', 'ep_1', 'a.b', 'failed', 3, NULL, 503, 'x', 0, 3000, 2);"
    ))
    .unwrap();
    let store = older_file_opened(conn);
    let layout = store
        .run(|conn| {
            LOG_INDEXES
                .iter()
                .map(|index| {
                    conn.query_row(
                        "SELECT count(*), coalesce(sum(desc), 0) FROM pragma_index_xinfo(?1) WHERE key = 1",
                        [index],
                        |row| Ok((*index, row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)),
                    )
                })
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)
        })
        .await
        .unwrap();
    for (index, columns, descending) in layout {
        assert!(columns >= 3, "{index} exists with its columns: {columns}");
        assert_eq!(descending, 0, "{index} is ascending");
    }
    let account = AccountId::from_trusted("acme".into());
    let mut seen = Vec::new();
    for status in [None, Some(DeliveryStatus::Failed)] {
        let mut query = DeliveryQuery {
            status,
            limit: 2,
            ..DeliveryQuery::default()
        };
        let mut ids = Vec::new();
        loop {
            let page = store.list_deliveries(&account, &query).await.unwrap();
            ids.extend(page.items.iter().map(|d| d.id.as_str().to_owned()));
            match page.next_cursor {
                Some(cursor) => query.cursor = Some(cursor),
                None => break,
            }
        }
        seen.push(ids);
    }
    assert_eq!(
        seen,
        vec![vec!["dlv_3", "dlv_2", "dlv_1"], vec!["dlv_3", "dlv_1"]]
    );
}

/// Eight hours of traffic with a two-hour retention: each hour 400 events, all delivered but
/// one. The purge keeps what is pending (and its event), removes the rest once old enough,
/// and the file reuses the freed pages instead of growing.
#[tokio::test]
async fn purging_past_retention_keeps_pending_work_and_the_file_stops_growing() {
    use crate::domain::Decision;
    use crate::fixtures::{attempt_record, delivery, event, t0};
    let (dir, store, ep) = file_store_with_endpoint("retention").await;
    let hour = std::time::Duration::from_secs(3600);
    let retention = 2 * hour;
    let mut kept = Vec::new();
    let mut sizes = Vec::new();
    for h in 0..8u32 {
        let at = crate::clock::add(t0(), hour * h);
        for i in 0..400 {
            let ev = event("acme", &format!("evt_{h}_{i}"), at);
            let d = delivery(&ev, &ep, at);
            store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
            if i == 0 {
                kept.push((ev, d));
                continue;
            }
            store
                .record_attempt(&attempt_record(&d, 1, Decision::Delivered, true, at))
                .await
                .unwrap();
        }
        let now = crate::clock::add(at, hour / 2);
        let purged = purge_past(&store, crate::clock::sub(now, retention)).await;
        if h >= 2 {
            // The hour that just passed retention: its 399 ended deliveries and events.
            assert_eq!(purged.deliveries, 399, "hour {h}: {purged:?}");
            assert_eq!(purged.attempts, 399, "hour {h}: {purged:?}");
            assert_eq!(purged.events, 399, "hour {h}: {purged:?}");
        } else {
            assert_eq!(purged, Purged::default(), "nothing old enough yet");
        }
        sizes.push(store.page_counts().await.unwrap().0);
    }
    for (ev, d) in &kept {
        let still = store.get_delivery(&d.account_id, &d.id).await.unwrap();
        assert_eq!(still.map(|d| d.status), Some(DeliveryStatus::Pending));
        assert!(store
            .get_event(&ev.account_id, &ev.id)
            .await
            .unwrap()
            .is_some());
    }
    let page = store
        .list_deliveries(
            &ep.account_id,
            &DeliveryQuery {
                limit: 50,
                ..DeliveryQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        page.items.len(),
        50,
        "the log still pages: {}",
        page.items.len()
    );
    println!("file pages after each hour, 2 h retention: {sizes:?}");
    // Three hours of data at most are in the file after the third hour; it stays that size.
    let plateau = sizes[3];
    assert!(
        sizes[4..]
            .iter()
            .all(|&pages| pages <= plateau + plateau / 10),
        "pages per hour: {sizes:?}"
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A delivery replayed late in the retention ends again days later: it is kept the
/// retention from when it ended, not removed by the next purge for its age (as DynamoDB's
/// TTL, set when a delivery ends, keeps it on AWS).
#[tokio::test]
async fn a_delivery_replayed_late_is_kept_the_retention_from_when_it_ended() {
    use crate::fixtures::{at, attempt, failed, publish, replay};
    let (dir, store, ep) = file_store_with_endpoint("replayed-retention").await;
    let account = AccountId::from_trusted("acme".into());
    let day = 86_400;
    let d = publish(&store, &account, 1, "invoice.paid", &[&ep])
        .await
        .remove(0);
    attempt(&store, &d.id, 2, failed()).await;
    let outcome = store
        .replay(&ReplayRequest {
            replay: replay(
                &account,
                ReplayScope::Delivery(d.id.clone()),
                ReplayFilter::single(),
                29 * day,
            ),
            limit: 1,
        })
        .await
        .unwrap();
    assert_eq!(outcome.queued.len(), 1);
    attempt(&store, &d.id, 29 * day + 1, failed()).await;

    // Published 30 days before the cutoff, ended again 9 days after it: kept.
    let purged = purge_past(&store, at(20 * day)).await;
    assert_eq!(purged, Purged::default());
    assert!(store.get_delivery(&account, &d.id).await.unwrap().is_some());
    // Once the retention has passed since it ended, it goes with its attempts and event.
    let purged = purge_past(&store, at(29 * day + 2)).await;
    assert_eq!(
        (purged.deliveries, purged.attempts, purged.events),
        (1, 2, 1)
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A purge removes nothing a publish keeps in memory (pending deliveries and their events,
/// accounts, endpoints): a purge beside steady traffic leaves its publishes and first tries
/// reading nothing, where forgetting at every slice had them read back what they wrote.
#[tokio::test]
async fn a_purge_forgets_nothing_kept() {
    use crate::domain::Decision;
    use crate::fixtures::{at, attempt, publish};
    let (dir, store, ep) = file_store_with_endpoint("purge-keeps").await;
    let account = ep.account_id.clone();
    let ended = publish(&store, &account, 1, "invoice.paid", &[&ep])
        .await
        .remove(0);
    // Its first try reads the endpoint, which the next publish's deliveries then keep.
    attempt(&store, &ended.id, 2, Decision::Delivered).await;
    let pending = publish(&store, &account, 3, "invoice.paid", &[&ep])
        .await
        .remove(0);
    change_payloads_behind_the_stores_back(&store).await;

    // What a publish reads, read once: kept from here on.
    assert!(store.get_account(&account).await.unwrap().is_some());
    assert_eq!(
        store.list_endpoints(&account).await.unwrap(),
        vec![ep.clone()]
    );

    let purged = purge_past(&store, at(10)).await;
    assert_eq!((purged.deliveries, purged.events), (1, 1), "{purged:?}");

    let (kept, endpoints) = publish_reads_with_the_reader_held(&store, &account).await;
    assert_eq!(kept.map(|a| a.id), Some(account.clone()));
    assert_eq!(endpoints, vec![ep]);
    let first = store.load_work(&pending.id).await.unwrap().unwrap();
    assert_ne!(
        first.event.unwrap().payload,
        CHANGED_PAYLOAD,
        "the first try read the database: the purge forgot the kept copy"
    );
    let second = store.load_work(&pending.id).await.unwrap().unwrap();
    assert_eq!(second.event.unwrap().payload, CHANGED_PAYLOAD);
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A purge told to stop ends after the slice it is in, so that a shutdown does not wait for
/// a backlog of days to be removed; the next purge removes the rest.
#[tokio::test]
async fn a_purge_told_to_stop_ends_after_its_slice() {
    use crate::domain::Decision;
    use crate::fixtures::{at, attempt, publish};
    let (dir, store, ep) = file_store_with_endpoint("purge-stop").await;
    let account = ep.account_id.clone();
    let ended = i64::from(SLICE_ROWS) * 2 + 20;
    for second in 0..ended {
        let d = publish(&store, &account, second, "invoice.paid", &[&ep])
            .await
            .remove(0);
        attempt(&store, &d.id, second, Decision::Delivered).await;
    }
    let (_stopping, stop) = tokio::sync::watch::channel(true);
    let purged = store
        .purge_before(at(ended), super::PurgePace::FLAT_OUT, &stop)
        .await
        .unwrap();
    let slice = u64::from(SLICE_ROWS);
    assert_eq!((purged.deliveries, purged.events), (slice, slice));
    let rest = purge_past(&store, at(ended)).await;
    let left = ended.unsigned_abs() - slice;
    assert_eq!((rest.deliveries, rest.events), (left, left));
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `serve`'s purge pauses between slices, and less once what it removes is an hour or more
/// past retention (or two intervals, if longer): a purge that keeps up removes what ended
/// within about an interval before the cutoff.
#[test]
fn a_purge_far_past_retention_pauses_less() {
    use std::time::Duration;
    let (minute, hour) = (Duration::from_secs(60), Duration::from_secs(3600));
    let pace = super::PurgePace::every(minute);
    assert_eq!(pace.pause_after(Duration::ZERO), Duration::from_millis(20));
    assert_eq!(
        pace.pause_after(hour - Duration::from_millis(1)),
        Duration::from_millis(20)
    );
    assert_eq!(pace.pause_after(hour), Duration::from_micros(2500));
    let daily = super::PurgePace::every(hour * 24);
    assert_eq!(daily.pause_after(hour * 47), Duration::from_millis(20));
    assert_eq!(daily.pause_after(hour * 48), Duration::from_micros(2500));
    assert_eq!(
        super::PurgePace::FLAT_OUT.pause_after(minute),
        Duration::ZERO
    );
    // A slice that removed nothing only read: the next follows at the shorter pause.
    assert_eq!(
        pace.pause_after_slice(&Purged::default(), false),
        Duration::from_micros(2500)
    );
    let removed = Purged {
        events: 1,
        overdue: minute,
        ..Purged::default()
    };
    assert_eq!(
        pace.pause_after_slice(&removed, false),
        Duration::from_millis(20)
    );
    // A slice cut short for a waiting write rests for its share: 5 rows of 50, 2 ms.
    let cut = Purged {
        deliveries: 5,
        ..removed
    };
    assert_eq!(pace.pause_after_slice(&cut, true), Duration::from_millis(2));
    // Only a purge that keeps up gives way to writes; one that is behind takes whole slices.
    assert!(pace.yields_after(hour - Duration::from_millis(1)));
    assert!(!pace.yields_after(hour));
    assert!(!super::PurgePace::FLAT_OUT.yields_after(Duration::ZERO));
}

/// A purge slice ends at the row after which a write waits for the store thread, so the
/// write waits for one row and the slice's commit, not for fifty rows; the next slice goes
/// on from there.
#[tokio::test]
async fn a_purge_slice_ends_at_the_row_after_which_a_write_waits() {
    use crate::domain::Decision;
    use crate::fixtures::{at, attempt, publish};
    let (dir, store, ep) = file_store_with_endpoint("purge-yield").await;
    let account = ep.account_id.clone();
    for second in 0..5 {
        let d = publish(&store, &account, second, "invoice.paid", &[&ep])
            .await
            .remove(0);
        attempt(&store, &d.id, second, Decision::Delivered).await;
    }
    let cutoff = to_millis(at(10));
    let slice = |waits_after: usize| {
        store.run_forgetting_nothing(move |conn| {
            let looked = std::cell::Cell::new(0);
            let mut purged = Purged::default();
            let ended = super::retention::purge_deliveries(conn, cutoff, &mut purged, || {
                looked.set(looked.get() + 1);
                looked.get() >= waits_after
            })?;
            Ok((ended, purged.deliveries, purged.attempts))
        })
    };
    // (none left, cut short), deliveries and attempts removed.
    assert_eq!(slice(2).await.unwrap(), ((false, true), 2, 2));
    assert_eq!(slice(usize::MAX).await.unwrap(), ((true, false), 3, 3));
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The store counts the jobs queued for its thread that have not begun: what a purge slice
/// looks at to give way.
#[tokio::test]
async fn jobs_queued_behind_the_running_one_are_counted_until_they_begin() {
    use crate::fixtures::account;
    let store = SqliteStore::in_memory().unwrap();
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (began, running) = tokio::sync::oneshot::channel::<()>();
    let blocker = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .run_forgetting_nothing(move |_| {
                    let _ = began.send(());
                    let _ = held.recv();
                    Ok(())
                })
                .await
        }
    });
    running.await.unwrap();
    assert_eq!(
        store.queued.count(),
        0,
        "the running job is no longer queued"
    );
    let writes: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let store = store.clone();
            tokio::spawn(async move { store.create_account(&account(name)).await })
        })
        .collect();
    let since = std::time::Instant::now();
    while store.queued.count() < 2 {
        assert!(
            since.elapsed() < std::time::Duration::from_secs(5),
            "never counted"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(store.queued.count(), 2);
    release.send(()).unwrap();
    blocker.await.unwrap().unwrap();
    for write in writes {
        write.await.unwrap().unwrap();
    }
    assert_eq!(store.queued.count(), 0, "every job has begun");
}

/// A purge says how far behind retention it is: how long before the cutoff the oldest
/// delivery it removed ended, or the oldest event it removed was created, whichever is
/// longer. Its pace follows from it.
#[tokio::test]
async fn a_purge_says_how_long_past_retention_what_it_removed_was() {
    use crate::domain::Decision;
    use crate::fixtures::{at, attempt, publish};
    use std::time::Duration;
    let (dir, store, ep) = file_store_with_endpoint("purge-overdue").await;
    let account = ep.account_id.clone();
    for second in [10, 40] {
        let d = publish(&store, &account, second, "invoice.paid", &[&ep])
            .await
            .remove(0);
        attempt(&store, &d.id, second + 5, Decision::Delivered).await;
    }
    let purged = purge_past(&store, at(100)).await;
    assert_eq!(purged.deliveries, 2);
    assert_eq!(purged.overdue, Duration::from_secs(85), "{purged:?}");
    // Nothing left to remove: nothing overdue.
    assert_eq!(purge_past(&store, at(200)).await, Purged::default());
    // An event no delivery needs, which went to no endpoint.
    publish(&store, &account, 150, "invoice.paid", &[]).await;
    let purged = purge_past(&store, at(300)).await;
    assert_eq!(
        (purged.events, purged.overdue),
        (1, Duration::from_secs(150))
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SQLite's plan for `sql` with `params`, its steps joined by "; ".
fn query_plan(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> String {
    let steps: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(params, |row| row.get::<_, String>(3))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    steps.join("; ")
}

/// The purge reads ended deliveries through their partial index, oldest ending first:
/// every row it reads goes, and a backlog of pending work, however old, is never read.
#[test]
fn the_purge_reads_ended_deliveries_from_their_index() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    let plan = query_plan(
        &conn,
        super::retention::ENDED_BEFORE_SQL,
        params![0, 0, 100],
    );
    println!("ended deliveries: {plan}");
    assert!(
        plan.contains("SEARCH deliveries USING INDEX deliveries_ended (<expr><?)"),
        "{plan}"
    );
    assert!(!plan.contains("TEMP B-TREE"), "a sort: {plan}");
    // While an old event is unfanned: the same walk, with a key look-up per row.
    let plan = query_plan(
        &conn,
        super::retention::ENDED_BEFORE_KEEPING_UNFANNED_SQL,
        params![0, 0, 100],
    );
    println!("ended deliveries, keeping unfanned events': {plan}");
    for step in [
        "SEARCH d USING INDEX deliveries_ended (<expr><?)",
        "SEARCH u USING ",
    ] {
        assert!(plan.contains(step), "no {step:?}: {plan}");
    }
    assert!(!plan.contains("SCAN"), "a scan: {plan}");
    assert!(!plan.contains("TEMP B-TREE"), "a sort: {plan}");
}

/// The index counts ended deliveries by the second; the purge still keeps to the cutoff to
/// the millisecond: of two deliveries that ended in the cutoff's second, the one before it
/// goes and the one after stays.
#[tokio::test]
async fn the_purge_keeps_to_the_cutoff_within_its_second() {
    use crate::domain::Decision;
    use crate::fixtures::{at, attempt_record, delivery, event};
    let (dir, store, ep) = file_store_with_endpoint("purge-second").await;
    let ms = |n: u64| crate::clock::add(at(100), std::time::Duration::from_millis(n));
    let mut ended = Vec::new();
    for (i, end) in [(0, 400), (1, 600)] {
        let ev = event("acme", &format!("evt_{i}"), at(10));
        let d = delivery(&ev, &ep, at(10));
        store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
        store
            .record_attempt(&attempt_record(&d, 1, Decision::Delivered, true, ms(end)))
            .await
            .unwrap();
        ended.push(d);
    }
    let purged = purge_past(&store, ms(500)).await;
    assert_eq!(purged.deliveries, 1);
    let account = AccountId::from_trusted("acme".into());
    assert!(store
        .get_delivery(&account, &ended[0].id)
        .await
        .unwrap()
        .is_none());
    assert!(store
        .get_delivery(&account, &ended[1].id)
        .await
        .unwrap()
        .is_some());
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An event kept by one purge (a delivery still needed it) is removed with its last
/// delivery; if the clock went back meanwhile, it was too young for that, and a later purge
/// still finds it rather than starting after it.
#[tokio::test]
async fn an_event_kept_by_a_purge_is_found_again_after_the_clock_went_back() {
    use crate::domain::Decision;
    use crate::fixtures::{at, attempt, event, publish};
    let (dir, store, ep) = file_store_with_endpoint("purge-clock-back").await;
    let account = AccountId::from_trusted("acme".into());
    let purge = |cutoff: i64| purge_past(&store, at(cutoff));
    let d = publish(&store, &account, 50, "invoice.paid", &[&ep])
        .await
        .remove(0);
    let young = event("acme", "evt_young", at(500));
    store.publish(&young, &[]).await.unwrap();
    // Pending: the delivery and its event stay, and the walk of the events passes them.
    assert_eq!(purge(100).await, Purged::default());
    // The clock goes back: the delivery ends at 40 and goes at 45; its event, at 50, stays.
    attempt(&store, &d.id, 40, Decision::Delivered).await;
    let purged = purge(45).await;
    assert_eq!((purged.deliveries, purged.events), (1, 0));
    assert_eq!(purge(60).await.events, 1, "the event, once past the cutoff");
    assert!(store
        .get_event(&account, &d.event_id)
        .await
        .unwrap()
        .is_none());
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A purge that removes a table's last row leaves nothing to start after: rows written next
/// take the freed row ids, and the next purge still finds them. Events are removed with
/// their deliveries and, when no endpoint matched, by themselves: both count.
#[tokio::test]
async fn a_purge_that_empties_the_table_starts_from_the_first_row_next_time() {
    use crate::domain::Decision;
    use crate::fixtures::{at, attempt, event, publish};
    let (dir, store, ep) = file_store_with_endpoint("purge-empty").await;
    let account = AccountId::from_trusted("acme".into());
    let publish_two = |second: i64| {
        let (store, account, ep) = (store.clone(), account.clone(), ep.clone());
        async move {
            let d = publish(&store, &account, second, "invoice.paid", &[&ep])
                .await
                .remove(0);
            attempt(&store, &d.id, second, Decision::Delivered).await;
            let unmatched = event("acme", &format!("evt_unmatched_{second}"), at(second));
            store.publish(&unmatched, &[]).await.unwrap();
        }
    };
    let purge = |cutoff: i64| {
        let store = &store;
        async move {
            let purged = purge_past(store, at(cutoff)).await;
            (purged.deliveries, purged.events)
        }
    };
    // The young pair at 50 makes the first purge stop after the old ones it removes.
    for second in [1, 2, 3, 50] {
        publish_two(second).await;
    }
    assert_eq!(purge(10).await, (3, 6));
    assert_eq!(purge(100).await, (1, 2), "both tables are empty");
    for second in [200, 201] {
        publish_two(second).await;
    }
    assert_eq!(purge(300).await, (2, 4));
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every filter combination of the delivery log (each status and none, an error code, a
/// 2xx code and none), with and without a cursor, and with no time window, either end of
/// one or both, searches an index keyed by its most selective filter and already in the
/// log's order: no table scan, no sort. Printed, so a changed plan is visible in the test
/// output.
#[test]
fn every_log_query_reads_an_index_in_order() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    add_missing_columns(&conn, "deliveries", ADDED_DELIVERY_COLUMNS).unwrap();
    let account = AccountId::from_trusted("acme".into());
    let page_cursor = crate::store::cursor::encode(1_700_000_000_000, "dlv_x");
    let statuses = [
        None,
        Some(DeliveryStatus::Pending),
        Some(DeliveryStatus::Delivered),
        Some(DeliveryStatus::Failed),
        Some(DeliveryStatus::Abandoned),
    ];
    let windows = [(false, false), (true, false), (false, true), (true, true)];
    let mut checked = 0;
    for endpoint in [false, true] {
        for status in statuses {
            for event_type in [false, true] {
                for status_code in [None, Some(503), Some(200)] {
                    for cursor in [false, true] {
                        for (since, until) in windows {
                            let query = DeliveryQuery {
                                endpoint_id: endpoint
                                    .then(|| EndpointId::from_trusted("ep_a".into())),
                                status,
                                event_type: event_type.then(|| "invoice.paid".to_owned()),
                                status_code,
                                since: since.then(|| crate::clock::from_millis(0)),
                                until: until.then(|| crate::clock::from_millis(1)),
                                cursor: cursor.then(|| page_cursor.clone()),
                                limit: 50,
                            };
                            let (sql, args) =
                                super::deliveries::list_sql(&account, &query).unwrap();
                            let plan = query_plan(&conn, &sql, rusqlite::params_from_iter(args));
                            // The index that must be searched: a failure status's partial
                            // index (the endpoint's or the account's), else the endpoint's
                            // log, else the account's by type, by error code (300 and up),
                            // or whole. Delivered, pending and 2xx are most of the log:
                            // they read it in order.
                            let failure = matches!(
                                status,
                                Some(DeliveryStatus::Failed | DeliveryStatus::Abandoned)
                            );
                            let error_code = status_code.is_some_and(|code| code >= 300);
                            let expected = match (endpoint, failure, event_type, error_code) {
                                (true, true, _, _) => "deliveries_by_endpoint_failure",
                                (true, false, _, _) => "deliveries_by_endpoint",
                                (false, true, _, _) => "deliveries_by_account_failure",
                                (false, false, true, _) => "deliveries_by_account_type",
                                (false, false, false, true) => "deliveries_by_account_error_code",
                                (false, false, false, false) => "deliveries_by_account",
                            };
                            println!("{query:?}\n    {plan}");
                            assert!(plan.starts_with("SEARCH deliveries USING INDEX "), "{plan}");
                            assert!(!plan.contains("TEMP B-TREE"), "a sort: {plan}");
                            if cursor || until {
                                assert!(
                                    plan.contains("(created_at,id)<(?,?)"),
                                    "the cursor or the window's end seeks: {plan}"
                                );
                            }
                            if since {
                                assert!(
                                    plan.contains("(created_at,id)>")
                                        || plan.contains("created_at>"),
                                    "the window's start bounds the search: {plan}"
                                );
                            }
                            let used = plan
                                .trim_start_matches("SEARCH deliveries USING INDEX ")
                                .split(' ')
                                .next()
                                .unwrap();
                            assert_eq!(used, expected, "{query:?}: {plan}");
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(checked, 2 * 5 * 2 * 3 * 2 * 4);
}

/// A page of an event's deliveries searches the `(account_id, event_id, endpoint_id)` unique
/// index from the cursor on, in its order: no scan, no sort of an event's 100,000 deliveries.
#[test]
fn an_event_page_reads_its_index_in_order() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    add_missing_columns(&conn, "deliveries", ADDED_DELIVERY_COLUMNS).unwrap();
    let plan = query_plan(
        &conn,
        &super::rows::event_page_sql(),
        params!["acme", "evt_1", "ep_a", 100],
    );
    println!("event page: {plan}");
    assert!(
        plan.starts_with("SEARCH deliveries USING INDEX sqlite_autoindex_deliveries_"),
        "{plan}"
    );
    assert!(
        plan.contains("(account_id=? AND event_id=? AND endpoint_id>?)"),
        "{plan}"
    );
    assert!(!plan.contains("TEMP B-TREE"), "a sort: {plan}");
}

/// The window's two reads search the partial indexes of pending rows in due order.
#[test]
fn the_window_reads_pending_rows_in_due_order_from_their_indexes() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    for (sql, index) in [
        (super::deliveries::pending_from_sql(), "deliveries_pending"),
        (
            super::deliveries::pending_of_endpoint_sql(),
            "deliveries_pending_by_endpoint",
        ),
    ] {
        let plan = query_plan(&conn, &sql, params![0, "x", 10]);
        println!("{index}: {plan}");
        assert!(
            plan.contains(&format!("SEARCH d USING INDEX {index} ")),
            "{plan}"
        );
        assert!(!plan.contains("SCAN"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "a sort: {plan}");
    }
}

/// A page of replays after a cursor seeks to it in the account's index, in order.
#[test]
fn a_replay_page_seeks_to_its_cursor() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    add_missing_columns(&conn, "replays", ADDED_REPLAY_COLUMNS).unwrap();
    let plan = query_plan(
        &conn,
        super::replay::REPLAYS_PAGE_SQL,
        params!["acme", "rpl_x", 10],
    );
    println!("replays page: {plan}");
    assert!(
        plan.contains("SEARCH replays USING INDEX replays_by_account (account_id=? AND id<?)"),
        "{plan}"
    );
    assert!(!plan.contains("TEMP B-TREE"), "a sort: {plan}");
}

/// An audited change and its entry are one transaction: an entry that cannot be written
/// (its id is taken) takes the change back with it.
#[tokio::test]
async fn an_audited_change_stands_or_falls_with_its_entry() {
    use crate::{
        domain::{AuditAction, AuditEntry, AuditTarget, Caller, TargetKind},
        fixtures::{account, endpoint, t0},
        store::AuditedChange,
    };
    let store = SqliteStore::in_memory().unwrap();
    store.create_account(&account("acme")).await.unwrap();
    let ep = endpoint("acme", "ep_a", t0());
    let entry = AuditEntry::new(
        Some(ep.account_id.clone()),
        t0(),
        &Caller::system(),
        AuditAction::EndpointCreated,
        AuditTarget::new(TargetKind::Endpoint, &ep.id),
        serde_json::Map::new(),
    );
    store.append_audit(&entry).await.unwrap();
    let refused = store
        .audited_change(
            &AuditedChange::CreateEndpoint {
                endpoint: ep.clone(),
                limit: None,
            },
            &[entry],
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(StoreError::Conflict {
                entity: "audit entry",
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(
        store.get_endpoint(&ep.account_id, &ep.id).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn an_older_file_gains_the_missed_event_columns_and_index() {
    use crate::fixtures::{at, typed_event};
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(
        "CREATE TABLE events (account_id TEXT NOT NULL, id TEXT NOT NULL, type TEXT NOT NULL, \
           created_at INTEGER NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (account_id, id)); \
         CREATE TABLE replays (id TEXT PRIMARY KEY, account_id TEXT NOT NULL, actor TEXT NOT NULL, \
           delivery_id TEXT, endpoint_id TEXT, since INTEGER, until INTEGER, statuses TEXT NOT NULL, \
           event_types TEXT NOT NULL, requested_at INTEGER NOT NULL, count INTEGER NOT NULL, more INTEGER NOT NULL); \
         INSERT INTO replays VALUES ('rpl_1', 'acme', 'admin', NULL, 'ep_1', 1000, NULL, '[\"failed\"]', '[]', 2000, 3, 0);",
    )
    .unwrap();
    let store = older_file_opened(conn);
    let account = AccountId::from_trusted("acme".into());
    let replays = store
        .list_replays(
            &account,
            &crate::store::PageAfter {
                after: None,
                limit: 10,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        replays
            .items
            .iter()
            .map(|r| (r.count, r.missed, r.filter.include_missed))
            .collect::<Vec<_>>(),
        [(3, 0, false)]
    );
    let event = typed_event("acme", "evt_1", "invoice.paid", at(10));
    store.publish(&event, &[]).await.unwrap();
    store
        .mark_missed(std::slice::from_ref(&event))
        .await
        .unwrap();
    let query = crate::store::MissedQuery {
        account,
        since: at(0),
        until: None,
        after: None,
        limit: 10,
    };
    assert_eq!(
        store.missed_events(&query).await.unwrap(),
        [event.as_missed()]
    );
}

/// The dispatcher's reads of what it sends have a reader thread of their own: a log page
/// answers while that reader is busy (in a backlog, with thousands of them a second).
#[tokio::test]
async fn a_log_page_does_not_wait_behind_the_dispatchers_reads() {
    use crate::fixtures::{delivery, event, t0};
    let (dir, store, ep) = file_store_with_endpoint("readers").await;
    let ev = event("acme", "evt_1", t0());
    let d = delivery(&ev, &ep, t0());
    store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();

    let (release, holder) = hold(|job| store.read_for_send(job)).await;

    let wait = std::time::Duration::from_secs(10);
    let page = tokio::time::timeout(
        wait,
        store.list_deliveries(&ev.account_id, &crate::store::DeliveryQuery::default()),
    )
    .await
    .expect("a log page waited behind the dispatcher's read")
    .unwrap();
    assert_eq!(page.items.len(), 1);
    let got = tokio::time::timeout(wait, store.get_delivery(&ev.account_id, &d.id))
        .await
        .expect("a get waited behind the dispatcher's read")
        .unwrap();
    assert_eq!(got.map(|g| g.id), Some(d.id.clone()));

    release.send(()).unwrap();
    holder.await.unwrap();
    let work = store.load_work(&d.id).await.unwrap();
    assert!(work.is_some());
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Once read, a publish's account and endpoints come from memory: a publish never waits
/// behind a log page on the API's reader (in the W5 outage the healthy account's did).
#[tokio::test]
async fn a_publish_reads_its_account_and_endpoints_without_the_reader() {
    let (dir, store, ep) = file_store_with_endpoint("kept").await;
    let acme = ep.account_id.clone();
    assert!(store.get_account(&acme).await.unwrap().is_some());
    assert_eq!(store.list_endpoints(&acme).await.unwrap(), vec![ep.clone()]);

    let (account, endpoints) = publish_reads_with_the_reader_held(&store, &acme).await;
    assert_eq!(account.map(|a| a.id), Some(acme.clone()));
    assert_eq!(endpoints, vec![ep]);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every reader opens the WAL at start (SQLite does so at a connection's first read): the
/// dispatcher's reader, first used long after start, still reads once the directory it
/// was opened in is gone.
#[tokio::test]
async fn every_reader_has_the_wal_open_from_the_start() {
    use crate::fixtures::{delivery, event, t0};
    let (dir, store, ep) = file_store_with_endpoint("warm").await;
    let ev = event("acme", "evt_1", t0());
    let d = delivery(&ev, &ep, t0());
    // The store has not read this endpoint yet, so the first try reads the delivery.
    store.publish(&ev, std::slice::from_ref(&d)).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let work = store.load_work(&d.id).await.unwrap();
    assert_eq!(work.map(|w| w.delivery.id), Some(d.id));
}

/// The checkpointer's passes while the store thread holds the busy lanes back for a WAL
/// restart: they stop once what the RESTART would copy (what the last pass could not, and
/// about what was written while it ran) is at most `CAUGHT_UP_FRAMES`, or once the quiet
/// lanes' writes keep pace (no fewer new frames than the pass before), and after
/// `CATCH_UP_PASSES` at most, or when a pass fails or the hold gives up.
#[test]
fn the_catch_up_before_a_wal_restart_stops_when_caught_up_or_outpaced() {
    use super::checkpoint::{catch_up_passes, CATCH_UP_PASSES, CAUGHT_UP_FRAMES};
    // Each pass returns the WAL's frames (those of the pass before plus `written`) and the
    // frames it copied: all of them, less `held` (a reader's snapshot holds them back).
    let passes = |written: &[(i64, i64)]| {
        let mut log = 10_000;
        let mut written = written.iter();
        catch_up_passes(move || {
            let (new, held) = written.next()?;
            log += new;
            Some((log, log - held))
        })
    };
    assert_eq!(
        passes(&[(0, 0), (300, 0), (99, 0), (20, 0)]),
        4,
        "caught up"
    );
    assert_eq!(
        passes(&[(0, 0), (CAUGHT_UP_FRAMES, 0)]),
        2,
        "as much written while a pass ran as may be left"
    );
    assert_eq!(
        passes(&[(0, 0), (10, 500), (10, 500), (10, 500), (10, 500), (10, 0)]),
        3,
        "a reader holds frames back, and the writes keep pace"
    );
    assert_eq!(
        passes(&[(0, 0), (300, 0), (400, 0)]),
        3,
        "the writes keep pace"
    );
    assert_eq!(
        passes(&[(0, 0), (900, 0), (800, 0), (700, 0), (600, 0), (500, 0)]),
        CATCH_UP_PASSES
    );
    assert_eq!(passes(&[(0, 0), (300, 0)]), 3, "a failed pass ends it");
    assert_eq!(passes(&[]), 1, "a failed first pass too");
}

/// An event erased before its fan-out leaves the list, and a fan-out already under way adds
/// nothing to it: its deliveries would send what was erased.
#[tokio::test]
async fn an_event_erased_before_its_fan_out_gets_no_deliveries() {
    use crate::fixtures::{account_with_endpoints, delivery, event, t0};
    let store = SqliteStore::in_memory().unwrap();
    let [ep] = account_with_endpoints(&store, "acme", ["ep_1"]).await;
    let ev = event("acme", "evt_1", t0());
    store.put_event(&ev).await.unwrap();
    store
        .erase_event(&ev.account_id, &ev.id, t0())
        .await
        .unwrap();
    let later = t0() + chrono::TimeDelta::days(1);
    let page = store.unfanned_events(None, later, 10).await.unwrap();
    assert!(page.events.is_empty(), "{page:?}");
    let added = store
        .add_deliveries_of(&ev, &[delivery(&ev, &ep, t0())], None)
        .await
        .unwrap();
    assert!(added.is_empty(), "{added:?}");
    assert!(store.deliveries_of_event(&ev).await.unwrap().is_empty());
}

/// Retention never removes an event still waiting for its fan-out, however old: it has no
/// deliveries yet, which is what retention looks for.
#[tokio::test]
async fn a_purge_keeps_an_event_waiting_for_its_fan_out() {
    use crate::fixtures::{account_with_endpoints, at, event};
    let store = SqliteStore::in_memory().unwrap();
    account_with_endpoints(&store, "acme", ["ep_1"]).await;
    let (waiting, fanned) = (
        event("acme", "evt_waiting", at(0)),
        event("acme", "evt_fanned", at(0)),
    );
    store.put_event(&waiting).await.unwrap();
    store.put_event(&fanned).await.unwrap();
    store
        .mark_fanned_out(&[crate::store::FannedOut {
            event: fanned.clone(),
            missed: false,
        }])
        .await
        .unwrap();
    let purged = purge_past(&store, at(86_400)).await;
    assert_eq!(
        purged.events, 1,
        "the fanned-out event, which has no deliveries"
    );
    assert!(store
        .get_event(&waiting.account_id, &waiting.id)
        .await
        .unwrap()
        .is_some());
    let page = store.unfanned_events(None, at(86_400), 10).await.unwrap();
    assert_eq!(page.events, vec![waiting]);
}

/// Makes every insert of a delivery to `endpoint` fail, as a full disk would part-way
/// through a fan-out, until [`stop_failing_inserts`]. The statement fails alone: the
/// transaction goes on.
async fn fail_inserts_to(store: &SqliteStore, endpoint: &str) {
    let sql = format!(
        "CREATE TEMP TRIGGER fail_inserts BEFORE INSERT ON deliveries \
         WHEN NEW.endpoint_id = '{endpoint}' BEGIN SELECT RAISE(ABORT, 'disk trouble'); END;"
    );
    store
        .run(move |conn| conn.execute_batch(&sql).map_err(backend))
        .await
        .unwrap();
}

async fn stop_failing_inserts(store: &SqliteStore) {
    store
        .run(|conn| {
            conn.execute_batch("DROP TRIGGER temp.fail_inserts")
                .map_err(backend)
        })
        .await
        .unwrap();
}

/// An event's fan-out writes without a savepoint: one that fails part-way leaves its first
/// deliveries, and the next fan-out of the event adds the rest, each delivery once, all of
/// them pending and due for the dispatcher.
#[tokio::test]
async fn a_fan_out_that_fails_part_way_is_completed_by_the_next_with_each_delivery_once() {
    use crate::fixtures::{account_with_endpoints, delivery, event, t0};
    let store = SqliteStore::in_memory().unwrap();
    let endpoints = account_with_endpoints(&store, "acme", ["ep_1", "ep_2", "ep_3"]).await;
    let ev = event("acme", "evt_1", t0());
    store.put_event(&ev).await.unwrap();
    let planned: Vec<Delivery> = endpoints.iter().map(|ep| delivery(&ev, ep, t0())).collect();
    let ids = |deliveries: &[Delivery]| {
        let mut ids: Vec<String> = deliveries.iter().map(|d| d.id.to_string()).collect();
        ids.sort();
        ids
    };
    // The third insert fails after the first two were written.
    fail_inserts_to(&store, "ep_3").await;
    let failed = store.add_deliveries_of(&ev, &planned, None).await;
    assert!(failed.is_err(), "{failed:?}");
    let left = store.deliveries_of_event(&ev).await.unwrap();
    assert_eq!(ids(&left), ids(&planned[..2]), "the first two stay");
    stop_failing_inserts(&store).await;
    let added = store.add_deliveries_of(&ev, &planned, None).await.unwrap();
    assert_eq!(ids(&added), ids(&planned[2..]), "the next adds the rest");
    let stored = store.deliveries_of_event(&ev).await.unwrap();
    assert_eq!(ids(&stored), ids(&planned), "each once");
    let due = store
        .pending_deliveries(t0(), &crate::store::PageAfter::first(10))
        .await
        .unwrap()
        .refs;
    let mut due: Vec<String> = due.iter().map(|p| p.delivery_id.to_string()).collect();
    due.sort();
    assert_eq!(due, ids(&planned), "all pending and due");
}

/// A fan-out that failed part-way leaves the deliveries it wrote, and they may be sent and
/// end long before the event's fan-out succeeds. Retention keeps them while the event is
/// still unfanned: purged, they would be created and sent again by the fan-out that adds
/// the rest. Other deliveries past retention go as usual.
#[tokio::test]
async fn retention_keeps_what_a_failed_fan_out_left_until_the_event_is_fanned_out() {
    use crate::domain::Decision;
    use crate::fixtures::{account_with_endpoints, at, attempt_record, delivery, event};
    use crate::store::FannedOut;
    let store = SqliteStore::in_memory().unwrap();
    let endpoints = account_with_endpoints(&store, "acme", ["ep_1", "ep_2"]).await;
    let delivered =
        |d: &Delivery, second: i64| attempt_record(d, 1, Decision::Delivered, true, at(second));
    // An event fanned out in full, delivered at second 20: past retention at 100.
    let whole = event("acme", "evt_whole", at(10));
    let whole_deliveries: Vec<Delivery> = endpoints
        .iter()
        .map(|ep| delivery(&whole, ep, at(10)))
        .collect();
    store.publish(&whole, &whole_deliveries).await.unwrap();
    for d in &whole_deliveries {
        store.record_attempt(&delivered(d, 20)).await.unwrap();
    }
    // An event whose fan-out fails at its second endpoint; the first delivery is sent.
    let ev = event("acme", "evt_1", at(10));
    store.put_event(&ev).await.unwrap();
    let planned: Vec<Delivery> = endpoints
        .iter()
        .map(|ep| delivery(&ev, ep, at(10)))
        .collect();
    fail_inserts_to(&store, "ep_2").await;
    assert!(store.add_deliveries_of(&ev, &planned, None).await.is_err());
    store
        .record_attempt(&delivered(&planned[0], 20))
        .await
        .unwrap();

    let purged = purge_past(&store, at(100)).await;
    assert_eq!(
        purged.deliveries, 2,
        "the whole event's deliveries go: {purged:?}"
    );
    let account = AccountId::from_trusted("acme".into());
    let kept = store.get_delivery(&account, &planned[0].id).await.unwrap();
    assert!(
        kept.is_some(),
        "the unfanned event's sent delivery was purged"
    );

    stop_failing_inserts(&store).await;
    let added = store.add_deliveries_of(&ev, &planned, None).await.unwrap();
    let added: Vec<&DeliveryId> = added.iter().map(|d| &d.id).collect();
    assert_eq!(
        added,
        [&planned[1].id],
        "the fan-out adds only what is missing"
    );
    store
        .mark_fanned_out(&[FannedOut {
            event: ev.clone(),
            missed: false,
        }])
        .await
        .unwrap();
    store
        .record_attempt(&delivered(&planned[1], 30))
        .await
        .unwrap();
    let purged = purge_past(&store, at(100)).await;
    assert_eq!(
        (purged.deliveries, purged.events),
        (2, 1),
        "once fanned out, its deliveries and its event go: {purged:?}"
    );
}

/// SQLite rolls the whole transaction back on some errors (a full disk, an I/O error in a
/// statement without a journal of its own). The jobs after it in the batch then wait for
/// the next: run outside a transaction, each would commit on its own and still be answered
/// with the batch's failure.
#[tokio::test]
async fn the_jobs_after_a_transaction_that_sqlite_rolled_back_wait_for_the_next_batch() {
    let store = SqliteStore::in_memory().unwrap();
    store
        .run(|conn| conn.execute_batch("CREATE TABLE t (x)").map_err(backend))
        .await
        .unwrap();
    let (release, holder) = hold_store_thread(&store).await;
    // Queued while the store thread is held, so one batch: the first ends the transaction
    // as SQLite's own rollback would.
    let mut lost = Box::pin(store.run(|conn| {
        conn.execute_batch("INSERT INTO t VALUES (1); ROLLBACK")
            .map_err(backend)?;
        StoreResult::<()>::Err(StoreError::Backend("database or disk is full".into()))
    }));
    let mut after = Box::pin(store.run(|conn| {
        conn.execute("INSERT INTO t VALUES (2)", [])
            .map(|_| ())
            .map_err(backend)
    }));
    assert!(poll_once(lost.as_mut()).await.is_pending());
    assert!(poll_once(after.as_mut()).await.is_pending());
    release.send(()).unwrap();
    holder.await.unwrap();
    let lost = lost.await;
    assert!(
        matches!(&lost, Err(StoreError::Backend(e)) if e == "database or disk is full"),
        "answered with its own error, not the commit's: {lost:?}"
    );
    after.await.expect("run in the next batch, and committed");
    let rows: Vec<i64> = store
        .run(|conn| {
            conn.prepare("SELECT x FROM t ORDER BY rowid")
                .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
                .map_err(backend)
        })
        .await
        .unwrap();
    assert_eq!(rows, [2]);
}

/// A batch that cannot begin its transaction (another process holds the file's write lock
/// past the busy timeout) runs none of its jobs: outside a transaction each would commit on
/// its own, and still be answered with the failure.
#[tokio::test]
async fn a_batch_that_cannot_begin_runs_none_of_its_jobs() {
    let (dir, store, _) = file_store_with_endpoint("cannot-begin").await;
    store
        .run(|conn| {
            conn.busy_timeout(std::time::Duration::from_millis(20))
                .map_err(backend)
        })
        .await
        .unwrap();
    let other = Connection::open(dir.join("cannot-begin.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    let answer = store
        .run(move |_| {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await;
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the job ran without a transaction: {answer:?}"
    );
    assert!(
        matches!(&answer, Err(StoreError::Backend(e)) if e.contains("could not begin")),
        "{answer:?}"
    );
    other.execute_batch("COMMIT").unwrap();
    store
        .run(|conn| conn.execute_batch("CREATE TABLE t (x)").map_err(backend))
        .await
        .expect("written once the lock is free");
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file whose notifications table predates claims opens with the column added, and the
/// mail queued in it is claimed and sent once.
#[tokio::test]
async fn mail_queued_in_a_file_without_claims_is_claimed_once() {
    use crate::fixtures::t0;
    let dir = std::env::temp_dir().join(format!("hooklane-claims-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("old.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE notifications (id TEXT PRIMARY KEY, account_id TEXT NOT NULL, \
         recipient TEXT NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL, \
         created_at INTEGER NOT NULL, sent_at INTEGER); \
         INSERT INTO notifications VALUES ('ntf_old', 'acme', 'owner@acme.example', 's', 'b', 0, NULL);",
    )
    .unwrap();
    drop(conn);
    let store =
        SqliteStore::open(&path, crate::secrets::SecretsCipher::ephemeral().unwrap()).unwrap();
    let until = crate::clock::add(t0(), std::time::Duration::from_secs(300));
    assert!(store
        .claim_notification("ntf_old", t0(), until)
        .await
        .unwrap());
    assert!(!store
        .claim_notification("ntf_old", t0(), until)
        .await
        .unwrap());
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An event a purge kept because it was still unfanned, whose fan-out then gives it no
/// delivery, is removed by the next purge: the walk's mark did not move past it.
#[tokio::test]
async fn an_event_fanned_out_to_nothing_after_a_purge_kept_it_is_removed_by_the_next() {
    use crate::fixtures::{account, at, event};
    let store = SqliteStore::in_memory().unwrap();
    store.create_account(&account("acme")).await.unwrap();
    let old = event("acme", "evt_old", at(0));
    store.put_event(&old).await.unwrap();
    let young = event("acme", "evt_young", at(10_000));
    store.publish(&young, &[]).await.unwrap();
    assert_eq!(
        purge_past(&store, at(100)).await.events,
        0,
        "unfanned: kept"
    );
    store
        .mark_fanned_out(&[crate::store::FannedOut {
            event: old.clone(),
            missed: false,
        }])
        .await
        .unwrap();
    assert_eq!(purge_past(&store, at(200)).await.events, 1);
    assert_eq!(
        store.get_event(&old.account_id, &old.id).await.unwrap(),
        None
    );
    assert!(store
        .get_event(&young.account_id, &young.id)
        .await
        .unwrap()
        .is_some());
}

/// A missed event that a purge removes after a resend read it gets no delivery from that
/// resend: one whose event is gone could never be sent.
#[tokio::test]
async fn a_resend_adds_no_delivery_for_a_missed_event_purged_since_it_was_read() {
    use crate::fixtures::{account_with_endpoints, at, event};
    let store = SqliteStore::in_memory().unwrap();
    let [ep] = account_with_endpoints(&store, "acme", ["ep_1"]).await;
    let ev = event("acme", "evt_missed", at(0));
    store.put_event(&ev).await.unwrap();
    store
        .mark_fanned_out(&[crate::store::FannedOut {
            event: ev.clone(),
            missed: true,
        }])
        .await
        .unwrap();
    let missed = store
        .missed_events(&crate::store::MissedQuery {
            account: ev.account_id.clone(),
            since: at(-10),
            until: None,
            after: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(missed.len(), 1);
    assert_eq!(purge_past(&store, at(100)).await.events, 1);
    let recovered = Delivery::recovered(&missed[0], ep.id.clone(), at(200));
    let added = store
        .add_deliveries(std::slice::from_ref(&recovered))
        .await
        .unwrap();
    assert!(added.is_empty(), "added {added:?}");
    assert!(store.load_work(&recovered.id).await.unwrap().is_none());
}

/// Disables `ep` at second 0 (its failing clock `expected`), queueing owner mail `ntf_1`.
async fn disabled_with_mail(
    store: &SqliteStore,
    ep: &crate::domain::Endpoint,
    expected: Option<crate::clock::Timestamp>,
) {
    use crate::fixtures::at;
    store
        .disable_endpoint(&crate::store::DisableRequest {
            account_id: ep.account_id.clone(),
            endpoint_id: ep.id.clone(),
            reason: "failing".into(),
            now: at(0),
            expected_failing_since: expected,
            notification: Some(crate::store::Notification {
                id: "ntf_1".into(),
                account_id: ep.account_id.clone(),
                recipient: crate::domain::EmailAddress::parse("owner@acme.example").unwrap(),
                subject: "disabled".into(),
                body: "your endpoint".into(),
                created_at: at(0),
            }),
            operational_event: None,
        })
        .await
        .unwrap();
}

/// Sent owner mail is kept a retention after it was sent, not after it was queued.
#[tokio::test]
async fn sent_mail_is_kept_a_retention_after_it_was_sent() {
    use crate::fixtures::{account_with_endpoints, at};
    let store = SqliteStore::in_memory().unwrap();
    let [mut ep] = account_with_endpoints(&store, "acme", ["ep_1"]).await;
    let read = ep.version();
    ep.failing_since = Some(at(0));
    store.update_endpoint(&ep, &read).await.unwrap();
    disabled_with_mail(&store, &ep, Some(at(0))).await;
    store
        .mark_notification_sent("ntf_1", at(1_000))
        .await
        .unwrap();
    assert_eq!(purge_past(&store, at(500)).await.notifications, 0);
    assert_eq!(purge_past(&store, at(1_500)).await.notifications, 1);
}

/// Owner mail given up keeps its error for an operator to read in the file, and is kept a
/// retention after it was given up, as sent mail is after it was sent.
#[tokio::test]
async fn mail_given_up_keeps_its_error_and_is_kept_a_retention() {
    use crate::fixtures::{account_with_endpoints, at};
    use crate::store::NotificationFailure;
    let store = SqliteStore::in_memory().unwrap();
    let [ep] = account_with_endpoints(&store, "acme", ["ep_1"]).await;
    disabled_with_mail(&store, &ep, None).await;
    let give_up = NotificationFailure::GiveUp {
        error: "MessageRejected: Email address is not verified.".into(),
    };
    store
        .mark_notification_failed("ntf_1", at(1_000), &give_up)
        .await
        .unwrap();
    let (given_up_at, error): (i64, String) = store
        .read_on_the_store_thread(|conn| {
            conn.query_row(
                "SELECT given_up_at, last_error FROM notifications WHERE id = 'ntf_1'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(backend)
        })
        .await
        .unwrap();
    assert_eq!(given_up_at, crate::clock::to_millis(at(1_000)));
    assert_eq!(error, "MessageRejected: Email address is not verified.");
    // The query docs/OPERATIONS.md gives operators lists it.
    let operations = include_str!("../../../../docs/OPERATIONS.md");
    let documented = operations
        .lines()
        .find_map(|line| line.strip_prefix("sqlite3 hooklane.db \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("docs/OPERATIONS.md lists mail given up with sqlite3")
        .to_owned();
    let listed: Vec<(String, String)> = store
        .read_on_the_store_thread(move |conn| {
            let mut statement = conn.prepare(&documented).map_err(backend)?;
            let rows = statement
                .query_map([], |r| Ok((r.get(0)?, r.get(4)?)))
                .map_err(backend)?;
            rows.collect::<Result<_, _>>().map_err(backend)
        })
        .await
        .unwrap();
    assert_eq!(
        listed,
        [(
            "ntf_1".to_owned(),
            "MessageRejected: Email address is not verified.".to_owned()
        )]
    );
    assert_eq!(purge_past(&store, at(500)).await.notifications, 0);
    assert_eq!(purge_past(&store, at(1_500)).await.notifications, 1);
}

/// The schema version a file gets from this build (`PRAGMA user_version`).
fn stamped_version(conn: &Connection) -> i32 {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// The schema version of a new file, as this build stamps it.
async fn version_of_a_new_file() -> i32 {
    let store = SqliteStore::in_memory().unwrap();
    store.run(|conn| Ok(stamped_version(conn))).await.unwrap()
}

/// The fingerprint of the schema a new file gets, per schema version (`SCHEMA_VERSION` in
/// schema.rs): one line for each version, never edited once it has been released.
const RECORDED_LAYOUTS: &[(i32, &str)] = &[
    (
        1,
        "53833a07eb8735a0859c75819d458f693be5ec3bc97b1e2637d68c85f3b95bff",
    ),
    (
        2,
        "c7c5dba66d2e6ea142a97002d14f3d04a217bbde081682e728c675784f4e2935",
    ),
];

/// A digest of everything a file's schema holds (every table, index and their SQL, as
/// `sqlite_master` keeps them, whitespace aside).
fn layout_fingerprint(conn: &Connection) -> String {
    use sha2::{Digest, Sha256};
    let mut statement = conn
        .prepare(
            "SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master ORDER BY type, name",
        )
        .unwrap();
    let rows = statement
        .query_map([], |r| {
            Ok([r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?])
        })
        .unwrap();
    let mut hasher = Sha256::new();
    for row in rows {
        let [kind, name, table, sql] = row.unwrap();
        let sql = sql.split_whitespace().collect::<Vec<_>>().join(" ");
        hasher.update(format!("{kind}\t{name}\t{table}\t{sql}\n"));
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn the_schema_version_changes_with_the_layout() {
    let store = SqliteStore::in_memory().unwrap();
    let (version, fingerprint) = store
        .run(|conn| Ok((stamped_version(conn), layout_fingerprint(conn))))
        .await
        .unwrap();
    let recorded = RECORDED_LAYOUTS
        .iter()
        .find(|(v, _)| *v == version)
        .map(|(_, f)| *f);
    match recorded {
        Some(recorded) => assert_eq!(
            recorded,
            fingerprint,
            "the schema of a new file changed (fingerprint {fingerprint}) but its version did \
             not: set SCHEMA_VERSION in schema.rs to {} and add the line ({}, \"{fingerprint}\") \
             to RECORDED_LAYOUTS; a released version's line never changes",
            version + 1,
            version + 1
        ),
        None => panic!(
            "no layout is recorded for schema version {version}: add the line ({version}, \
             \"{fingerprint}\") to RECORDED_LAYOUTS"
        ),
    }
    let versions: Vec<i32> = RECORDED_LAYOUTS.iter().map(|(v, _)| *v).collect();
    assert!(
        versions.windows(2).all(|w| w[1] == w[0] + 1),
        "RECORDED_LAYOUTS goes up one version at a time: {versions:?}"
    );
    assert_eq!(
        versions.last(),
        Some(&version),
        "the newest recorded layout is the version this build stamps"
    );
}

#[tokio::test]
async fn an_older_file_without_a_version_is_migrated_and_stamped() {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(FIRST_RELEASE_DELIVERIES).unwrap();
    assert_eq!(stamped_version(&conn), 0);
    let store = older_file_opened(conn);
    let (version, columns) = store
        .run(|conn| {
            Ok((
                stamped_version(conn),
                table_columns(conn, "deliveries").map_err(backend)?,
            ))
        })
        .await
        .unwrap();
    assert!(columns.iter().any(|c| c == "schedule_start"), "{columns:?}");
    let new = version_of_a_new_file().await;
    assert!(
        new > 0 && version == new,
        "an older file opened has schema version {version}, a new file {new}: both are \
         stamped with the version this build writes"
    );
}

/// A fresh directory of its own for a file database (`name`); the caller removes it.
fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hooklane-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn open_file(path: &std::path::Path) -> StoreResult<SqliteStore> {
    SqliteStore::open(path, crate::secrets::SecretsCipher::ephemeral().unwrap())
}

#[test]
fn a_failed_migration_changes_nothing_and_stamps_no_version() {
    let dir = scratch_dir("failed-migration");
    let path = dir.join("old.db");
    // A file whose migration fails part way: its `notifications` (a view here) cannot gain
    // the columns added since, after other tables were made and `deliveries` changed.
    Connection::open(&path)
        .unwrap()
        .execute_batch(&format!(
            "{FIRST_RELEASE_DELIVERIES} CREATE VIEW notifications AS SELECT 1 AS id;"
        ))
        .unwrap();
    assert!(
        open_file(&path).is_err(),
        "a file whose migration fails was opened"
    );
    let conn = Connection::open(&path).unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let columns = table_columns(&conn, "deliveries").unwrap();
    assert_eq!(
        (tables, columns.len(), stamped_version(&conn)),
        (vec!["deliveries".to_owned()], 13, 0),
        "the failed migration left changes behind (tables, columns of deliveries, version)"
    );
    drop(conn);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A removed lock file (an operator cleaning up) is taken again at the next check, and a
/// second store opened after it is refused; one opened before the check holds the new file,
/// and the check says two processes use the database.
#[tokio::test]
async fn a_removed_lock_file_is_taken_again_before_a_second_store_opens() {
    let dir = scratch_dir("lock-removed");
    let path = dir.join("hooklane.db");
    let lock = dir.join("hooklane.db.lock");
    let first = open_file(&path).unwrap();
    std::fs::remove_file(&lock).unwrap();
    first.keep_lock().unwrap();
    let second = open_file(&path);
    assert!(
        matches!(second, Err(StoreError::Locked(_))),
        "a second store opened: {:?}",
        second.err()
    );
    std::fs::remove_file(&lock).unwrap();
    let second = open_file(&path).unwrap();
    let refused = first.keep_lock();
    assert!(
        matches!(&refused, Err(StoreError::Locked(why)) if why.contains("two processes")),
        "{refused:?}"
    );
    drop((first, second));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file of this version is opened without the write lock: `serve` starts while another
/// process holds it (a backup, the `sqlite3` shell), rather than fail after the busy wait.
#[tokio::test]
async fn a_file_of_this_version_opens_while_another_process_holds_the_write_lock() {
    let dir = scratch_dir("open-locked");
    let path = dir.join("locked.db");
    drop(open_file(&path).unwrap());
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = std::time::Instant::now();
    let opened = open_file(&path);
    let took = started.elapsed();
    holder.execute_batch("ROLLBACK").unwrap();
    assert!(opened.is_ok(), "{:?} after {took:?}", opened.err());
}

/// `serve` checks every endpoint secret at its start, and writes only if one needs sealing
/// again: with nothing to reseal it starts while another process holds the write lock, as
/// opening the file does, instead of failing after the busy wait.
#[tokio::test]
async fn secrets_with_nothing_to_reseal_are_checked_while_another_process_holds_the_write_lock() {
    let dir = scratch_dir("reseal-locked");
    let path = dir.join("locked.db");
    let store = open_file(&path).unwrap();
    crate::fixtures::account_with_endpoints(&store, "acme", ["ep_a"]).await;
    assert_eq!(
        store.reseal_secrets().await.unwrap(),
        0,
        "sealed when created"
    );
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = std::time::Instant::now();
    let checked = store.reseal_secrets().await;
    let took = started.elapsed();
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(checked.ok(), Some(0), "after {took:?}");
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_file_of_a_newer_schema_version_is_refused_before_any_change() {
    let dir = scratch_dir("newer-schema");
    let path = dir.join("newer.db");
    let ours = version_of_a_new_file().await;
    drop(open_file(&path).unwrap());
    // What a newer build made: a version past this build's and a layout it changed (here,
    // an index it no longer has).
    let newer = ours + 1;
    Connection::open(&path)
        .unwrap()
        .execute_batch(&format!(
            "DROP INDEX replays_by_account; PRAGMA user_version = {newer};"
        ))
        .unwrap();
    let refused = open_file(&path);
    let conn = Connection::open(&path).unwrap();
    let recreated: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE name = 'replays_by_account'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let version = stamped_version(&conn);
    drop(conn);
    let Err(error) = refused else {
        panic!(
            "a file of schema version {newer} was opened by a build of version {ours} \
             (it now has version {version}, index made again: {recreated})"
        );
    };
    let message = error.to_string();
    for part in [
        format!("schema version {newer}"),
        format!("{ours}"),
        "newer hooklane".to_owned(),
        path.display().to_string(),
    ] {
        assert!(message.contains(&part), "{part:?} is not in: {message}");
    }
    assert_eq!(
        (version, recreated),
        (newer, false),
        "the refused file was changed"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
