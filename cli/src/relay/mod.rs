//! `hooklane relay`: publishes the rows of a platform's own outbox table (in PostgreSQL or
//! SQLite, written in the platform's business transactions) to a Hooklane API, then marks
//! them sent. The row id is the event id, so a row published again after a crash (between
//! the publish and the mark) finds its event and makes no second one (docs/OUTBOX.md).

mod postgres;
mod publish;
mod sqlite;

use std::time::Duration;

pub use publish::Publisher;

/// How `hooklane relay` was asked to run.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// `postgres://…` (or `postgresql://…`) or `sqlite:///path/to/file.db`.
    pub source: String,
    /// The Hooklane API's base URL.
    pub url: String,
    /// An admin token (or an account token, for one account's rows).
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

    async fn unsent(&mut self, limit: usize) -> Result<Vec<OutboxRow>, RelayError> {
        match self {
            Self::Postgres(s) => s.unsent(limit).await,
            Self::Sqlite(s) => s.unsent(limit).await,
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

/// Runs until `stop` completes. Errors of the database or the API are logged and retried
/// with a growing pause; only invalid options end it.
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
    loop {
        let work = relay(&options, &publisher, &mut backoff);
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

/// One connection's life: drains the table, then waits for more, until an error.
async fn relay(
    options: &RelayOptions,
    publisher: &Publisher,
    backoff: &mut Backoff,
) -> Result<(), RelayError> {
    let mut source = Source::open(options).await?;
    tracing::info!(table = %options.table, "relay connected to the outbox");
    loop {
        // Read, publish, mark: a crash in between publishes again, which finds the event.
        loop {
            let rows = source.unsent(options.batch).await?;
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
            if let Some(error) = outcome.error {
                // What is left stays unsent and is read again.
                return Err(error);
            }
            backoff.reset();
            if !full {
                break;
            }
        }
        source.wait(options.poll_interval).await?;
    }
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
}
