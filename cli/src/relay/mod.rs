//! `hooklane relay`: publishes the rows of a platform's own outbox table (in PostgreSQL or
//! SQLite, written in the platform's business transactions) to a Hooklane API, then marks
//! them sent. The row id is the event id, so a row published again after a crash (between
//! the publish and the mark) finds its event and makes no second one (docs/OUTBOX.md). An
//! account Hooklane answers "not now" (its 429 `rate_limited`, or 500 `unreadable_item`) waits
//! alone: its rows are left out of the reads until its `Retry-After`, and the other accounts'
//! rows go on.

mod pause;
mod postgres;
mod publish;
mod sqlite;

use std::time::{Duration, Instant};

use pause::Pauses;
pub use publish::Publisher;

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
}

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
/// pause, on a new connection; the API's are handled in [`relay`], on the same one. Only
/// invalid options end it.
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
    let mut backoff = Backoff::default();
    // Kept across reconnections: a paused account stays paused.
    let mut pauses = Pauses::default();
    loop {
        let work = relay(&options, &publisher, &mut backoff, &mut pauses);
        tokio::select! {
            () = &mut stop => return Ok(()),
            result = work => match result {
                Err(RelayError::Options(message)) => return Err(RelayError::Options(message)),
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

/// One connection's life: drains the table, then waits for more, until a database error.
/// A retryable answer of the API pauses its account, or every publish, and the connection
/// stays.
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
            match &outcome.error {
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
}
