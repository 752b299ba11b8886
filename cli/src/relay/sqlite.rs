//! The outbox table in a SQLite file, read by polling (SQLite has no notifications across
//! processes). Each call runs on the blocking pool.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use rusqlite::{Connection, OpenFlags};

use super::{OutboxRow, RelayError};

pub struct SqliteSource {
    connection: Arc<Mutex<Connection>>,
    table: String,
}

fn db(error: rusqlite::Error) -> RelayError {
    RelayError::Source(format!("SQLite: {error}"))
}

impl SqliteSource {
    /// `path` is what follows `sqlite://`: `/abs/file.db` (from `sqlite:///abs/file.db`).
    pub fn open(path: &str, table: &str) -> Result<Self, RelayError> {
        let path = PathBuf::from(path);
        if path.as_os_str().is_empty() {
            return Err(RelayError::Options(
                "--source sqlite:///path/to/file.db needs a path".into(),
            ));
        }
        // The platform creates the file and the table; the relay never does.
        let connection = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(db)?;
        // The platform's own writers hold the lock now and then: wait for it.
        connection
            .busy_timeout(std::time::Duration::from_secs(10))
            .map_err(db)?;
        Ok(Self {
            connection: Arc::new(Mutex::new(connection)),
            table: table.to_owned(),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, RelayError> + Send + 'static,
    ) -> Result<T, RelayError> {
        let connection = Arc::clone(&self.connection);
        tokio::task::spawn_blocking(move || {
            let mut connection = connection
                .lock()
                .map_err(|_| RelayError::Source("SQLite: connection poisoned".into()))?;
            work(&mut connection)
        })
        .await
        .map_err(|e| RelayError::Source(format!("SQLite task: {e}")))?
    }

    /// The oldest `limit` unsent rows of the accounts not in `skip`.
    pub async fn unsent(
        &mut self,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<OutboxRow>, RelayError> {
        // The accounts left out go in as one bound JSON array, read by `json_each`: any
        // number of them, and no id ever in the statement's text.
        let sql = format!(
            "SELECT id, account_id, type, data FROM {} \
             WHERE sent_at IS NULL AND error IS NULL \
             AND account_id NOT IN (SELECT value FROM json_each(?2)) \
             ORDER BY created_at, id LIMIT ?1",
            self.table
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let skip = serde_json::Value::from(skip.to_vec()).to_string();
        self.with(move |connection| {
            let mut statement = connection.prepare(&sql).map_err(db)?;
            let rows = statement
                .query_map(rusqlite::params![limit, skip], |row| {
                    Ok(OutboxRow {
                        id: row.get(0)?,
                        account_id: row.get(1)?,
                        event_type: row.get(2)?,
                        data: row.get(3)?,
                    })
                })
                .map_err(db)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db)
        })
        .await
    }

    pub async fn mark_sent(&mut self, ids: &[String]) -> Result<(), RelayError> {
        let sql = format!(
            "UPDATE {} SET sent_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?1",
            self.table
        );
        let ids = ids.to_vec();
        self.with(move |connection| {
            let transaction = connection.transaction().map_err(db)?;
            {
                let mut statement = transaction.prepare(&sql).map_err(db)?;
                for id in &ids {
                    statement.execute([id]).map_err(db)?;
                }
            }
            transaction.commit().map_err(db)
        })
        .await
    }

    pub async fn mark_failed(&mut self, id: &str, reason: &str) -> Result<(), RelayError> {
        let sql = format!("UPDATE {} SET error = ?2 WHERE id = ?1", self.table);
        let (id, reason) = (id.to_owned(), reason.to_owned());
        self.with(move |connection| {
            connection.execute(&sql, [&id, &reason]).map_err(db)?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A paused account's rows are left out of the read, however many; the others' come in
    /// their order, and a paused account's are still there, in theirs, once it is not.
    #[tokio::test]
    async fn the_read_leaves_out_paused_accounts() {
        let dir = std::env::temp_dir().join(format!(
            "hooklane-relay-sqlite-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("platform.db");
        let db = Connection::open(&file).unwrap();
        db.execute_batch(include_str!("../../../docs/outbox/sqlite.sql"))
            .unwrap();
        for (n, (id, account)) in [
            ("h1", "hot"),
            ("h2", "hot"),
            ("h3", "hot"),
            ("c1", "cool"),
            ("o1", "o'ther"),
            ("c2", "cool"),
        ]
        .iter()
        .enumerate()
        {
            db.execute(
                "INSERT INTO hooklane_outbox (id, account_id, type, data, created_at) \
                 VALUES (?1, ?2, 'a.b', '{}', ?3)",
                rusqlite::params![id, account, format!("2026-01-01T00:00:0{n}.000Z")],
            )
            .unwrap();
        }
        let mut source =
            SqliteSource::open(&file.display().to_string(), "hooklane_outbox").unwrap();
        let ids = |rows: Vec<OutboxRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(
            ids(source.unsent(3, &[]).await.unwrap()),
            ["h1", "h2", "h3"]
        );
        let hot = ["hot".to_owned()];
        assert_eq!(
            ids(source.unsent(3, &hot).await.unwrap()),
            ["c1", "o1", "c2"]
        );
        let two = ["hot".to_owned(), "o'ther".to_owned()];
        assert_eq!(ids(source.unsent(3, &two).await.unwrap()), ["c1", "c2"]);
        assert_eq!(
            ids(source.unsent(2, &["cool".to_owned()]).await.unwrap()),
            ["h1", "h2"]
        );
        drop(source);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
