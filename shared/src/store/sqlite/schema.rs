//! The schema, and the changes an older file gets on open.

use super::*;

/// The version of the file's layout that this build writes, in the file's header (`PRAGMA
/// user_version`), and the newest it opens: a file of a later version, which a newer build
/// migrated, is refused at open (see [`migrate`]). A file of an earlier version (0: made
/// before the version was kept) is migrated and stamped with this one.
///
/// Bump it by one in the change that changes what a file holds: a table, column or index
/// (`SCHEMA`, `ATTEMPTS_TABLE`, the `ADDED_*` lists, `INDEXES_OF_ADDED_COLUMNS`) or a
/// migration step, one that rewrites rows without changing the layout included. The test
/// `the_schema_version_changes_with_the_layout` (tests.rs) records a digest of a new file's
/// layout for each version and fails until the bump and the new version's line are made.
pub(super) const SCHEMA_VERSION: i32 = 2;

/// The file's schema version; a newer one than this build's is refused, naming both.
pub(super) fn schema_version(conn: &Connection) -> StoreResult<i32> {
    let found: i32 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(backend)?;
    if found > SCHEMA_VERSION {
        let file = conn
            .path()
            .filter(|p| !p.is_empty())
            .unwrap_or("the database");
        return Err(StoreError::Backend(format!(
            "{file} has schema version {found}, and this hooklane knows versions up to \
             {SCHEMA_VERSION}: a newer hooklane has migrated it. Run that release or a newer \
             one; to go back to this one, restore a backup taken before the upgrade \
             (docs/OPERATIONS.md)"
        )));
    }
    Ok(found)
}

/// Makes an older file's layout this build's, in one transaction with stamping it with
/// [`SCHEMA_VERSION`]: a migration that fails changes nothing. A file of a newer version
/// is refused, unchanged.
pub(super) fn migrate(conn: &Connection) -> StoreResult<()> {
    // A file already of this version needs nothing, and no write lock: `serve` starts while
    // another process (a backup) holds it.
    if schema_version(conn)? == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)
        .map_err(backend)?;
    // Again, under the lock: another process may have migrated it meanwhile.
    let found = schema_version(&tx)?;
    let rebuilt = drop_descending_log_indexes(&tx).map_err(backend)?;
    if rebuilt > 0 {
        tracing::info!(
            indexes = rebuilt,
            "making the delivery log's indexes again in ascending order, once: about 5 s per million deliveries"
        );
    }
    tx.execute_batch(SCHEMA).map_err(backend)?;
    add_missing_columns(&tx, "deliveries", ADDED_DELIVERY_COLUMNS).map_err(backend)?;
    add_missing_columns(&tx, "events", ADDED_EVENT_COLUMNS).map_err(backend)?;
    add_missing_columns(&tx, "accounts", ADDED_ACCOUNT_COLUMNS).map_err(backend)?;
    add_missing_columns(&tx, "endpoints", ADDED_ENDPOINT_COLUMNS).map_err(backend)?;
    add_missing_columns(&tx, "replays", ADDED_REPLAY_COLUMNS).map_err(backend)?;
    add_missing_columns(&tx, "notifications", ADDED_NOTIFICATION_COLUMNS).map_err(backend)?;
    tx.execute_batch(INDEXES_OF_ADDED_COLUMNS)
        .map_err(backend)?;
    migrate_attempts_to_time_order(&tx).map_err(backend)?;
    if found != SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(backend)?;
    }
    tx.commit().map_err(backend)
}

pub(super) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, owner_email TEXT NOT NULL, created_at INTEGER NOT NULL,
  publish_rate INTEGER, publish_burst INTEGER
);
CREATE TABLE IF NOT EXISTS endpoints (
  id TEXT PRIMARY KEY,
  account_id TEXT NOT NULL REFERENCES accounts(id),
  url TEXT NOT NULL,
  description TEXT NOT NULL,
  secret TEXT NOT NULL,
  retiring_secret TEXT,
  retiring_until INTEGER,
  status TEXT NOT NULL,
  event_types TEXT,
  max_in_flight INTEGER NOT NULL,
  rate_limit INTEGER,
  failing_since INTEGER,
  disabled_reason TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  headers TEXT
);
CREATE INDEX IF NOT EXISTS endpoints_by_account ON endpoints(account_id, created_at);
CREATE INDEX IF NOT EXISTS endpoints_failing ON endpoints(failing_since) WHERE failing_since IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
  account_id TEXT NOT NULL, id TEXT NOT NULL, type TEXT NOT NULL, created_at INTEGER NOT NULL, payload TEXT NOT NULL,
  erased_at INTEGER,
  missed INTEGER,
  fanned_through TEXT,
  PRIMARY KEY (account_id, id)
);
CREATE TABLE IF NOT EXISTS deliveries (
  id TEXT PRIMARY KEY,
  account_id TEXT NOT NULL,
  event_id TEXT NOT NULL,
  endpoint_id TEXT NOT NULL,
  event_type TEXT NOT NULL,
  status TEXT NOT NULL,
  attempts INTEGER NOT NULL,
  next_try_at INTEGER,
  last_status INTEGER,
  last_error TEXT,
  client_errors INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (account_id, event_id, endpoint_id)
);
CREATE INDEX IF NOT EXISTS deliveries_pending ON deliveries(next_try_at, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS deliveries_ended ON deliveries(updated_at / 1000) WHERE status != 'pending';
CREATE INDEX IF NOT EXISTS deliveries_pending_by_endpoint ON deliveries(endpoint_id, next_try_at, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS deliveries_by_endpoint ON deliveries(endpoint_id, created_at, id);
CREATE INDEX IF NOT EXISTS deliveries_by_account ON deliveries(account_id, created_at, id);
CREATE INDEX IF NOT EXISTS deliveries_by_account_type ON deliveries(account_id, event_type, created_at, id);
CREATE INDEX IF NOT EXISTS deliveries_by_account_failure ON deliveries(account_id, status, created_at, id) WHERE status IN ('failed', 'abandoned');
CREATE INDEX IF NOT EXISTS deliveries_by_endpoint_failure ON deliveries(endpoint_id, status, created_at, id) WHERE status IN ('failed', 'abandoned');
CREATE INDEX IF NOT EXISTS deliveries_by_account_error_code ON deliveries(account_id, last_status, created_at, id) WHERE last_status >= 300;
CREATE TABLE IF NOT EXISTS unfanned (
  account_id TEXT NOT NULL, created_at INTEGER NOT NULL, id TEXT NOT NULL,
  PRIMARY KEY (account_id, created_at, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS unfanned_by_time ON unfanned(created_at);
CREATE TABLE IF NOT EXISTS notifications (
  id TEXT PRIMARY KEY,
  account_id TEXT NOT NULL,
  recipient TEXT NOT NULL,
  subject TEXT NOT NULL,
  body TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  sent_at INTEGER,
  claimed_until INTEGER,
  given_up_at INTEGER,
  last_error TEXT
);
CREATE TABLE IF NOT EXISTS replays (
  id TEXT PRIMARY KEY,
  account_id TEXT NOT NULL,
  actor TEXT NOT NULL,
  delivery_id TEXT,
  endpoint_id TEXT,
  since INTEGER,
  until INTEGER,
  statuses TEXT NOT NULL,
  event_types TEXT NOT NULL,
  requested_at INTEGER NOT NULL,
  count INTEGER NOT NULL,
  more INTEGER NOT NULL,
  include_missed INTEGER NOT NULL DEFAULT 0,
  missed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS replays_by_account ON replays(account_id, id DESC);
CREATE TABLE IF NOT EXISTS api_keys (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  scopes TEXT NOT NULL,
  accounts TEXT,
  secret_sha256 TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  created_by TEXT NOT NULL,
  expires_at INTEGER,
  revoked_at INTEGER
);
CREATE TABLE IF NOT EXISTS audit_log (
  id TEXT PRIMARY KEY,
  account_id TEXT NOT NULL,
  at INTEGER NOT NULL,
  actor TEXT NOT NULL,
  action TEXT NOT NULL,
  target_kind TEXT NOT NULL,
  target_id TEXT NOT NULL,
  address TEXT,
  details TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_account ON audit_log(account_id, at DESC, id DESC);
CREATE TABLE IF NOT EXISTS token_revocations (
  account_id TEXT NOT NULL,
  token_id TEXT NOT NULL,
  revoked_at INTEGER NOT NULL,
  PRIMARY KEY (account_id, token_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS event_types (
  name TEXT PRIMARY KEY,
  description TEXT NOT NULL,
  schema TEXT,
  example TEXT,
  deprecated INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS endpoint_hours (
  endpoint_id TEXT NOT NULL,
  hour INTEGER NOT NULL,
  succeeded INTEGER NOT NULL,
  failed INTEGER NOT NULL,
  last_failure_at INTEGER,
  last_failure_status INTEGER,
  last_failure_error TEXT,
  PRIMARY KEY (endpoint_id, hour)
) WITHOUT ROWID;
"#;

pub(super) const ATTEMPTS_TABLE: &str = r#"
CREATE TABLE IF NOT EXISTS attempts (
  delivery_created_at INTEGER NOT NULL,
  delivery_id TEXT NOT NULL,
  number INTEGER NOT NULL,
  trigger TEXT NOT NULL,
  started_at INTEGER NOT NULL,
  latency_ms INTEGER NOT NULL,
  status_code INTEGER,
  response_headers TEXT NOT NULL,
  response_body TEXT NOT NULL,
  response_body_truncated INTEGER NOT NULL,
  error TEXT,
  PRIMARY KEY (delivery_created_at, delivery_id, number)
) WITHOUT ROWID;
"#;

/// Attempts are keyed by their delivery's creation time first: the attempts one batch
/// records are for deliveries created moments ago, so their rows land on the few pages at
/// the end of the table. Keyed by the (hashed) delivery id, each went to a random page,
/// and W1 made a fifth more WAL writes (406k against 319k `pwrite` calls).
/// Files from before this layout have their attempts copied over once, on open (within
/// [`migrate`]'s transaction).
pub(super) fn migrate_attempts_to_time_order(conn: &Connection) -> rusqlite::Result<()> {
    let columns = table_columns(conn, "attempts")?;
    if columns.is_empty() {
        return conn.execute_batch(ATTEMPTS_TABLE);
    }
    if columns.iter().any(|c| c == "delivery_created_at") {
        return Ok(());
    }
    conn.execute_batch(&format!(
        "ALTER TABLE attempts RENAME TO attempts_by_id; {ATTEMPTS_TABLE} \
         INSERT OR IGNORE INTO attempts (delivery_created_at, {ATTEMPT_COLUMNS}) \
         SELECT d.created_at, {ATTEMPT_COLUMNS} FROM attempts_by_id a JOIN deliveries d ON d.id = a.delivery_id; \
         DROP TABLE attempts_by_id;"
    ))
}

/// The delivery log's indexes, ascending although the logs read them newest first (backwards):
/// a new delivery then goes at the end of its range, and SQLite packs pages added to at their
/// end. Descending, each went at the front, the pages split there stayed half empty, and
/// W1's file took a quarter more (1,128 against 893 bytes per delivery).
pub(super) const LOG_INDEXES: [&str; 6] = [
    "deliveries_by_endpoint",
    "deliveries_by_account",
    "deliveries_by_account_type",
    "deliveries_by_account_failure",
    "deliveries_by_endpoint_failure",
    "deliveries_by_account_error_code",
];

/// Drops those of [`LOG_INDEXES`] that a file from before declared descending, for `SCHEMA`
/// to make again. Runs before it; returns how many it dropped.
pub(super) fn drop_descending_log_indexes(conn: &Connection) -> rusqlite::Result<usize> {
    let mut dropped = 0;
    for index in LOG_INDEXES {
        let descending: bool = conn.query_row(
            "SELECT count(*) > 0 FROM pragma_index_xinfo(?1) WHERE desc = 1",
            [index],
            |row| row.get(0),
        )?;
        if descending {
            conn.execute_batch(&format!("DROP INDEX {index}"))?;
            dropped += 1;
        }
    }
    Ok(dropped)
}

pub(super) fn table_columns(conn: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    conn.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?
        .query_map([], |row| row.get(0))?
        .collect()
}

pub(super) fn add_missing_columns(
    conn: &Connection,
    table: &str,
    columns: &[(&str, &str)],
) -> rusqlite::Result<()> {
    let existing = table_columns(conn, table)?;
    for (name, definition) in columns {
        if !existing.iter().any(|e| e == name) {
            conn.execute_batch(&format!(
                "ALTER TABLE {table} ADD COLUMN {name} {definition}"
            ))?;
        }
    }
    Ok(())
}

/// Columns added after the first release, one list per table, added to older database
/// files on open.
pub(super) const ADDED_ACCOUNT_COLUMNS: &[(&str, &str)] =
    &[("publish_rate", "INTEGER"), ("publish_burst", "INTEGER")];

pub(super) const ADDED_ENDPOINT_COLUMNS: &[(&str, &str)] = &[("headers", "TEXT")];

pub(super) const ADDED_REPLAY_COLUMNS: &[(&str, &str)] = &[
    ("include_missed", "INTEGER NOT NULL DEFAULT 0"),
    ("missed", "INTEGER NOT NULL DEFAULT 0"),
];

pub(super) const ADDED_NOTIFICATION_COLUMNS: &[(&str, &str)] = &[
    ("claimed_until", "INTEGER"),
    ("given_up_at", "INTEGER"),
    ("last_error", "TEXT"),
];

pub(super) const ADDED_EVENT_COLUMNS: &[(&str, &str)] = &[
    ("erased_at", "INTEGER"),
    ("missed", "INTEGER"),
    ("fanned_through", "TEXT"),
];

/// Indexes over columns an older file gets from the lists above, made once they exist.
/// `events_missed` holds only the events a disabled endpoint missed (`missed` is null for
/// every other): a publish to an account without one writes nothing more.
/// `notifications_due` orders the mail still to send by when it is due (made, or the end of
/// its claim or retry's wait), as `unsent_notifications` reads it; it replaces
/// `notifications_unsent`, which ordered by when it was made and kept mail given up.
pub(super) const INDEXES_OF_ADDED_COLUMNS: &str =
    "CREATE INDEX IF NOT EXISTS events_missed ON events(account_id, created_at, id) WHERE missed IS NOT NULL; \
     DROP INDEX IF EXISTS notifications_unsent; \
     CREATE INDEX IF NOT EXISTS notifications_due ON notifications(coalesce(claimed_until, created_at), id) \
     WHERE sent_at IS NULL AND given_up_at IS NULL;";

pub(super) const ADDED_DELIVERY_COLUMNS: &[(&str, &str)] = &[
    ("schedule_start", "INTEGER NOT NULL DEFAULT 0"),
    ("next_trigger", "TEXT NOT NULL DEFAULT 'scheduled'"),
];
