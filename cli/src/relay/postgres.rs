//! The outbox table in PostgreSQL: rows read and marked through one connection, which also
//! `LISTEN`s on the channel the table's trigger notifies at each commit of new rows.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls};

use super::{OutboxRow, RelayError};

pub struct PostgresSource {
    client: Client,
    table: String,
    /// One message per notification; closed when the connection is lost.
    notified: mpsc::UnboundedReceiver<()>,
}

fn db(error: tokio_postgres::Error) -> RelayError {
    RelayError::Source(format!("PostgreSQL: {error}"))
}

impl PostgresSource {
    pub async fn connect(url: &str, table: &str, channel: &str) -> Result<Self, RelayError> {
        super::checked_table(channel).map_err(|_| {
            RelayError::Options(format!("--channel {channel:?}: letters, digits and _"))
        })?;
        let (client, mut connection) = tokio_postgres::connect(url, NoTls).await.map_err(db)?;
        let (notify, notified) = mpsc::unbounded_channel();
        // The connection is driven here; notifications go to the relay's loop.
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => {
                        if notify.send(()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "PostgreSQL connection lost");
                        return;
                    }
                }
            }
        });
        // Listening before the first read: a row committed after it is notified.
        client
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .map_err(db)?;
        Ok(Self {
            client,
            table: table.to_owned(),
            notified,
        })
    }

    /// The oldest `limit` unsent rows of the accounts not in `skip`.
    pub async fn unsent(
        &mut self,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<OutboxRow>, RelayError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // The accounts left out are one bound array (`<> ALL` of an empty one is true).
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT id, account_id, type, data::text FROM {} \
                     WHERE sent_at IS NULL AND error IS NULL AND account_id <> ALL($2) \
                     ORDER BY created_at, id LIMIT $1",
                    self.table
                ),
                &[&limit, &skip],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(OutboxRow {
                    id: row.try_get(0).map_err(db)?,
                    account_id: row.try_get(1).map_err(db)?,
                    event_type: row.try_get(2).map_err(db)?,
                    data: row.try_get(3).map_err(db)?,
                })
            })
            .collect()
    }

    pub async fn mark_sent(&mut self, ids: &[String]) -> Result<(), RelayError> {
        self.client
            .execute(
                &format!(
                    "UPDATE {} SET sent_at = clock_timestamp() WHERE id = ANY($1)",
                    self.table
                ),
                &[&ids],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    pub async fn mark_failed(&mut self, id: &str, reason: &str) -> Result<(), RelayError> {
        self.client
            .execute(
                &format!("UPDATE {} SET error = $2 WHERE id = $1", self.table),
                &[&id, &reason],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    /// Takes the notifications received so far, without waiting.
    pub fn drain(&mut self) -> Result<(), RelayError> {
        loop {
            match self.notified.try_recv() {
                Ok(()) => {}
                Err(mpsc::error::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    return Err(RelayError::Source(
                        "PostgreSQL: the listening connection closed".into(),
                    ))
                }
            }
        }
    }

    /// Until a notification (or several: they are taken together) or `poll`.
    pub async fn wait(&mut self, poll: Duration) -> Result<(), RelayError> {
        match tokio::time::timeout(poll, self.notified.recv()).await {
            Ok(Some(())) => {
                while self.notified.try_recv().is_ok() {}
                Ok(())
            }
            Ok(None) => Err(RelayError::Source(
                "PostgreSQL: the listening connection closed".into(),
            )),
            Err(_) => Ok(()),
        }
    }
}
