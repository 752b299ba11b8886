//! `hooklane relay`: publishes the rows of a platform's own outbox table (in PostgreSQL or
//! SQLite, written in the platform's business transactions) to a Hooklane API, then marks
//! them sent. The row id is the event id, so a row published again after a crash (between
//! the publish and the mark) finds its event and makes no second one (docs/OUTBOX.md). An
//! account Hooklane answers "not now" (its 429 `rate_limited`, or 500 `unreadable_item`) waits
//! alone: its rows are left out of the reads until its `Retry-After`, and the other accounts'
//! rows go on. A token that can never publish (Hooklane's 403 `forbidden`: it lacks
//! `events:publish`) stops the relay with an error, as does one Hooklane keeps refusing (its
//! 401) for [`TOKEN_REFUSED_FOR`].

mod pause;
mod postgres;
mod publish;
mod sqlite;

use std::time::{Duration, Instant};

use pause::Pauses;
pub use publish::{Publisher, TokenCheck, CANNOT_PUBLISH};

/// How `hooklane relay` was asked to run.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// `postgres://…` (or `postgresql://…`) or `sqlite:///path/to/file.db`.
    pub source: String,
    /// The Hooklane API's base URL.
    pub url: String,
    /// The admin token, or an API key with `events:publish` (limited to some accounts: their rows).
    pub token: String,
    /// The outbox table, optionally schema-qualified.
    pub table: String,
    /// The PostgreSQL `LISTEN` channel the table's trigger notifies.
    pub channel: String,
    /// How often the table is read without a notification (SQLite: always).
    pub poll_interval: Duration,
    /// Rows read (and at most published) at a time.
    pub batch: usize,
}

/// One unsent row of the outbox table.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    pub id: String,
    pub account_id: String,
    pub event_type: String,
    /// The event's data, as JSON text.
    pub data: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("invalid option: {0}")]
    Options(String),
    #[error("outbox database: {0}")]
    Source(String),
    #[error("Hooklane API: {0}")]
    Api(String),
    /// Hooklane does not take the token, or it may not publish: retrying cannot help.
    #[error("{0}")]
    Token(String),
}

/// How long Hooklane's own 401 must go on, with no answer that took the token in between,
/// before the relay stops: another API instance takes an admin token just rotated in only
/// once its credential cache expires (5 s on Lambda, 1 s in `serve`). A token that is
/// unknown, revoked or expired is refused for good.
#[cfg(not(test))]
pub const TOKEN_REFUSED_FOR: Duration = Duration::from_secs(10);
#[cfg(test)]
pub const TOKEN_REFUSED_FOR: Duration = Duration::from_secs(1);

/// The outbox table, wherever it lives.
enum Source {
    Postgres(postgres::PostgresSource),
    Sqlite(sqlite::SqliteSource),
}

impl Source {
    async fn open(options: &RelayOptions) -> Result<Self, RelayError> {
        let source = options.source.as_str();
        if source.starts_with("postgres://") || source.starts_with("postgresql://") {
            Ok(Self::Postgres(
                postgres::PostgresSource::connect(source, &options.table, &options.channel).await?,
            ))
        } else if let Some(path) = source.strip_prefix("sqlite://") {
            Ok(Self::Sqlite(sqlite::SqliteSource::open(
                path,
                &options.table,
            )?))
        } else {
            Err(RelayError::Options(
                "--source must be postgres://… or sqlite:///path/to/file.db".into(),
            ))
        }
    }

    /// The oldest `limit` unsent rows, but those of the accounts in `skip` (paused).
    async fn unsent(
        &mut self,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<OutboxRow>, RelayError> {
        match self {
            Self::Postgres(s) => s.unsent(limit, skip).await,
            Self::Sqlite(s) => s.unsent(limit, skip).await,
        }
    }

    async fn mark_sent(&mut self, ids: &[String]) -> Result<(), RelayError> {
        match self {
            Self::Postgres(s) => s.mark_sent(ids).await,
            Self::Sqlite(s) => s.mark_sent(ids).await,
        }
    }

    async fn mark_failed(&mut self, id: &str, reason: &str) -> Result<(), RelayError> {
        match self {
            Self::Postgres(s) => s.mark_failed(id, reason).await,
            Self::Sqlite(s) => s.mark_failed(id, reason).await,
        }
    }

    /// Forgets the notifications received so far (PostgreSQL), before a read that sees their
    /// rows. `Err` when the notification connection is lost.
    fn drain(&mut self) -> Result<(), RelayError> {
        match self {
            Self::Postgres(s) => s.drain(),
            Self::Sqlite(_) => Ok(()),
        }
    }

    /// Waits for new rows: a notification (PostgreSQL) or the poll interval, whichever
    /// comes first. `Err` when the notification connection is lost.
    async fn wait(&mut self, poll: Duration) -> Result<(), RelayError> {
        match self {
            Self::Postgres(s) => s.wait(poll).await,
            Self::Sqlite(_) => {
                tokio::time::sleep(poll).await;
                Ok(())
            }
        }
    }
}

/// A SQL identifier the relay may put in its statements: `name` or `schema.name`.
pub(crate) fn checked_table(table: &str) -> Result<&str, RelayError> {
    let part_ok = |part: &str| {
        part.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && part.len() <= 63
    };
    if !table.is_empty() && table.split('.').count() <= 2 && table.split('.').all(part_ok) {
        Ok(table)
    } else {
        Err(RelayError::Options(format!(
            "--table {table:?}: letters, digits and _, optionally schema.table"
        )))
    }
}

/// Runs until `stop` completes. Errors of the database are logged and retried with a growing
/// pause, on a new connection; the API's are handled in [`relay`], on the same one. Invalid
/// options end it, and so does a token that cannot publish ([`RelayError::Token`]): one
/// without `events:publish` at once, one Hooklane refuses after [`TOKEN_REFUSED_FOR`].
pub async fn run(
    options: RelayOptions,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), RelayError> {
    checked_table(&options.table)?;
    if options.batch == 0 {
        return Err(RelayError::Options("--batch must be at least 1".into()));
    }
    let publisher = Publisher::new(&options.url, &options.token)?;
    tokio::pin!(stop);
    // Kept across reconnections: a paused account stays paused.
    let mut pauses = Pauses::default();
    // The token first: one that can never publish stops the relay before any row is read.
    loop {
        let check = tokio::select! {
            () = &mut stop => return Ok(()),
            check = publisher.check_token() => check,
        };
        let now = Instant::now();
        match check {
            TokenCheck::Publishes => {
                pauses.api_answered();
                break;
            }
            TokenCheck::Unknown(answer) => {
                tracing::debug!(%answer, "the token could not be checked; publishing will tell");
                break;
            }
            TokenCheck::CannotPublish(error) => return Err(error),
            TokenCheck::Refused(error) => {
                let refused_for = pauses.token_refused(now);
                if refused_for >= TOKEN_REFUSED_FOR {
                    return Err(error);
                }
                let pause = pauses.pause_api(None, now);
                tracing::error!(
                    pause = ?pause,
                    stops_in = ?TOKEN_REFUSED_FOR - refused_for,
                    error = %error,
                    "Hooklane refused the relay's token; the relay stops if it goes on"
                );
                tokio::select! {
                    () = &mut stop => return Ok(()),
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
    let mut backoff = Backoff::default();
    loop {
        let work = relay(&options, &publisher, &mut backoff, &mut pauses);
        tokio::select! {
            () = &mut stop => return Ok(()),
            result = work => match result {
                Err(error @ (RelayError::Options(_) | RelayError::Token(_))) => return Err(error),
                Err(error) => {
                    let pause = backoff.pause();
                    tracing::error!(%error, retry_in = ?pause, "relay interrupted; starting again");
                    tokio::select! {
                        () = &mut stop => return Ok(()),
                        () = tokio::time::sleep(pause) => {}
                    }
                }
                Ok(()) => return Ok(()),
            },
        }
    }
}

/// One connection's life: drains the table, then waits for more, until a database error or
/// a token that cannot publish. A retryable answer of the API pauses its account, or every
/// publish, and the connection stays.
async fn relay(
    options: &RelayOptions,
    publisher: &Publisher,
    backoff: &mut Backoff,
    pauses: &mut Pauses,
) -> Result<(), RelayError> {
    let mut source = Source::open(options).await?;
    tracing::info!(table = %options.table, "relay connected to the outbox");
    loop {
        // Read, publish, mark: a crash in between publishes again, which finds the event.
        loop {
            if let Some(until) = pauses.api_paused_until(Instant::now()) {
                tokio::time::sleep_until(until.into()).await;
                // The read below sees every row committed so far: the notifications of the
                // pause are spent, and must not pile up for a long one.
                source.drain()?;
            }
            // A paused account's rows are left out, so that they cannot fill the read and
            // hold back the others'; they stay unsent, in their order, for after its pause.
            let paused = pauses.paused_accounts(Instant::now());
            let rows = source.unsent(options.batch, &paused).await?;
            if rows.is_empty() {
                break;
            }
            let full = rows.len() == options.batch;
            let outcome = publisher.publish(&rows).await;
            for (id, reason) in &outcome.refused {
                tracing::error!(row.id = %id, reason = %reason, "Hooklane refused the outbox row; it is marked with the reason and skipped");
                source.mark_failed(id, reason).await?;
            }
            if !outcome.published.is_empty() {
                source.mark_sent(&outcome.published).await?;
                tracing::info!(
                    published = outcome.published.len(),
                    already_there = outcome.existing,
                    "outbox rows published"
                );
            }
            // Only a write proves the database works: a read alone does not (a role without
            // UPDATE, a read-only file), and the next error would pause 200 ms again, forever.
            if !(outcome.refused.is_empty() && outcome.published.is_empty()) {
                backoff.reset();
            }
            for account in &outcome.answered {
                pauses.resume_account(account);
            }
            // What is left stays unsent and is read again after the pause.
            let now = Instant::now();
            for paused in &outcome.paused {
                let pause = pauses.pause_account(&paused.account, paused.retry.after, now);
                // An item that cannot be read fails every time: a WARN at each pause is easily
                // missed, so from the fifth failure in a row each pause is an ERROR.
                if pauses.stalled(&paused.account) {
                    tracing::error!(
                        account = %paused.account,
                        until = %wall_clock(pause),
                        pause = ?pause,
                        retry_after = ?paused.retry.after,
                        error = %paused.retry.error,
                        "account stalled: its rows keep failing and wait; the other accounts' go on"
                    );
                } else {
                    tracing::warn!(
                        account = %paused.account,
                        until = %wall_clock(pause),
                        pause = ?pause,
                        retry_after = ?paused.retry.after,
                        error = %paused.retry.error,
                        "account paused: its rows wait, the other accounts' go on"
                    );
                }
            }
            // What was answered before is marked above; the rest stays unsent.
            if let Some(error) = outcome.stop {
                return Err(error);
            }
            match outcome.error {
                Some(retry) if matches!(retry.error, RelayError::Token(_)) => {
                    let refused_for = pauses.token_refused(now);
                    if refused_for >= TOKEN_REFUSED_FOR {
                        return Err(retry.error);
                    }
                    let pause = pauses.pause_api(retry.after, now);
                    tracing::error!(
                        until = %wall_clock(pause),
                        pause = ?pause,
                        stops_in = ?TOKEN_REFUSED_FOR - refused_for,
                        error = %retry.error,
                        "Hooklane refused the relay's token: every publish paused; the relay \
                         stops if it goes on"
                    );
                    continue;
                }
                Some(retry) => {
                    let pause = pauses.pause_api(retry.after, now);
                    tracing::error!(
                        until = %wall_clock(pause),
                        pause = ?pause,
                        retry_after = ?retry.after,
                        error = %retry.error,
                        "Hooklane API unavailable: every publish paused"
                    );
                    continue;
                }
                None => pauses.api_answered(),
            }
            if !full {
                break;
            }
        }
        // New rows, the poll, or the end of the first account pause, whichever comes first.
        let now = Instant::now();
        let wait = pauses.next_resume(now).map_or(options.poll_interval, |at| {
            at.saturating_duration_since(now).min(options.poll_interval)
        });
        source.wait(wait).await?;
    }
}

/// When a pause of `pause` from now ends, in RFC 3339 UTC, for the logs.
fn wall_clock(pause: Duration) -> String {
    let end = chrono::TimeDelta::from_std(pause)
        .ok()
        .and_then(|pause| chrono::Utc::now().checked_add_signed(pause))
        .unwrap_or_else(chrono::Utc::now);
    end.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// 200 ms doubling to 10 s between failed tries.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    fn pause(&mut self) -> Duration {
        let pause = Duration::from_millis(200)
            .saturating_mul(1 << self.failures.min(6))
            .min(Duration::from_secs(10));
        self.failures = self.failures.saturating_add(1);
        pause
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for good in ["hooklane_outbox", "app.hooklane_outbox", "_t1"] {
            assert!(checked_table(good).is_ok(), "{good}");
        }
        for bad in ["", "1t", "a.b.c", "t; drop table x", "\"t\"", "a-b"] {
            assert!(checked_table(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_pause_grows_to_ten_seconds_and_resets() {
        let mut backoff = Backoff::default();
        let pauses: Vec<u64> = (0..8).map(|_| backoff.pause().as_millis() as u64).collect();
        assert_eq!(pauses, [200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
        backoff.reset();
        assert_eq!(backoff.pause(), Duration::from_millis(200));
    }

    /// A database that reads but cannot mark (a role without UPDATE, a read-only file): each
    /// round reads and publishes the same rows, then fails to mark them. The reads succeed, so
    /// they must not start the backoff again: the pauses grow (0.2, 0.4, 0.8, 1.6 s), and in
    /// 2.5 s the rows are published 4 times, not every 0.2 s.
    #[tokio::test]
    async fn a_database_that_cannot_mark_is_tried_less_and_less_often() {
        // One directory per process, emptied first: a failed run's leftovers do not pile up.
        let dir =
            std::env::temp_dir().join(format!("hooklane-relay-backoff-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("platform.db");
        let db = rusqlite::Connection::open(&file).unwrap();
        db.execute_batch(include_str!("../../../docs/outbox/sqlite.sql"))
            .unwrap();
        // A trigger rather than file permissions: the tests may run as root.
        db.execute_batch(
            "INSERT INTO hooklane_outbox (id, account_id, type, data) VALUES ('o1', 'acme', 'a.b', '{}');
             CREATE TRIGGER no_marks BEFORE UPDATE ON hooklane_outbox
               BEGIN SELECT RAISE(ABORT, 'no UPDATE for this role'); END;",
        )
        .unwrap();
        let (url, seen) = publish::tests::fake_api(|_, _| (202, None)).await;
        let options = RelayOptions {
            source: format!("sqlite://{}", file.display()),
            url,
            token: "token".into(),
            table: "hooklane_outbox".into(),
            channel: "hooklane_outbox".into(),
            poll_interval: Duration::from_millis(100),
            batch: 100,
        };
        let stop = tokio::time::sleep(Duration::from_millis(2_500));
        run(options, stop).await.unwrap();
        let tries = seen.lock().unwrap().len();
        assert!(
            (2..=5).contains(&tries),
            "the rows were published {tries} times in 2.5 s: the backoff did not grow"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A SQLite outbox file in a directory of its own (emptied first), with a row of `acme`
    /// and one of `globex`; the directory and the relay's options against `url`.
    fn sqlite_outbox(name: &str, url: String) -> (std::path::PathBuf, RelayOptions) {
        let dir =
            std::env::temp_dir().join(format!("hooklane-relay-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("platform.db");
        let db = rusqlite::Connection::open(&file).unwrap();
        db.execute_batch(include_str!("../../../docs/outbox/sqlite.sql"))
            .unwrap();
        db.execute_batch(
            "INSERT INTO hooklane_outbox (id, account_id, type, data) VALUES ('o1', 'acme', 'a.b', '{}');
             INSERT INTO hooklane_outbox (id, account_id, type, data) VALUES ('o2', 'globex', 'a.b', '{}');",
        )
        .unwrap();
        let options = RelayOptions {
            source: format!("sqlite://{}", file.display()),
            url,
            token: "token".into(),
            table: "hooklane_outbox".into(),
            channel: "hooklane_outbox".into(),
            poll_interval: Duration::from_millis(100),
            batch: 100,
        };
        (dir, options)
    }

    /// The rows marked sent or failed.
    fn marked(dir: &std::path::Path) -> Vec<String> {
        let db = rusqlite::Connection::open(dir.join("platform.db")).unwrap();
        let mut statement = db
            .prepare(
                "SELECT id FROM hooklane_outbox WHERE sent_at IS NOT NULL OR error IS NOT NULL",
            )
            .unwrap();
        let ids = statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<Vec<String>, _>>()
            .unwrap();
        ids
    }

    /// Hooklane's 403 on the batch route (no `GET /v1/whoami` to ask first): the relay stops
    /// at its first answer, with the error naming the fix, and marks nothing.
    #[tokio::test]
    async fn a_token_without_events_publish_stops_the_relay() {
        let forbidden = serde_json::json!({"error": {"code": "forbidden",
            "message": "this route needs the `events:publish` scope"}});
        let (url, seen) =
            publish::tests::fake_api_with(move |_, _| (403, None, Some(forbidden.clone()))).await;
        let (dir, options) = sqlite_outbox("forbidden", url);
        let stop = tokio::time::sleep(Duration::from_secs(10));
        let started = Instant::now();
        let error = run(options, stop).await.expect_err("the relay stops");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "stopped after {:?}",
            started.elapsed()
        );
        assert!(matches!(error, RelayError::Token(_)), "{error:?}");
        assert!(error.to_string().starts_with(CANNOT_PUBLISH), "{error}");
        assert_eq!(seen.lock().unwrap().len(), 1);
        assert!(marked(&dir).is_empty(), "{:?}", marked(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Hooklane's 401 on every try: the relay stops once it has gone on for
    /// [`TOKEN_REFUSED_FOR`] (1 s under test), after trying again meanwhile, and marks nothing.
    #[tokio::test]
    async fn a_token_refused_for_good_stops_the_relay() {
        let refused = serde_json::json!({"error": {"code": "unauthorized",
            "message": "credential has been revoked"}});
        let (url, seen) =
            publish::tests::fake_api_with(move |_, _| (401, None, Some(refused.clone()))).await;
        let (dir, options) = sqlite_outbox("refused", url);
        let stop = tokio::time::sleep(Duration::from_secs(10));
        let started = Instant::now();
        let error = run(options, stop).await.expect_err("the relay stops");
        let took = started.elapsed();
        assert!(
            (TOKEN_REFUSED_FOR..Duration::from_secs(5)).contains(&took),
            "stopped after {took:?}"
        );
        let message = error.to_string();
        assert!(message.contains("refused the token"), "{message}");
        assert!(message.contains("credential has been revoked"), "{message}");
        assert!(
            seen.lock().unwrap().len() >= 3,
            "{:?}",
            seen.lock().unwrap()
        );
        assert!(marked(&dir).is_empty(), "{:?}", marked(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A 401 that passes (an admin token just rotated in, not yet taken by every instance) is
    /// retried: the rows are published once it is taken.
    #[tokio::test]
    async fn a_token_refused_for_a_moment_is_retried() {
        let refused = serde_json::json!({"error": {"code": "unauthorized",
            "message": "invalid token"}});
        let first = Instant::now();
        let (url, _) = publish::tests::fake_api_with(move |_, _| {
            if first.elapsed() < TOKEN_REFUSED_FOR / 2 {
                (401, None, Some(refused.clone()))
            } else {
                (202, None, None)
            }
        })
        .await;
        let (dir, options) = sqlite_outbox("refused-a-moment", url);
        let stop = tokio::time::sleep(TOKEN_REFUSED_FOR * 3);
        run(options, stop).await.expect("the relay runs on");
        assert_eq!(marked(&dir), ["o1", "o2"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
