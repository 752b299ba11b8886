//! Accounts, endpoints (and their disabling), the notification outbox and settings.

use super::rows::*;
use super::worker::*;
use super::*;
use crate::store::NotificationFailure;

impl SqliteStore {
    pub(super) async fn create_account(&self, account: &Account) -> StoreResult<()> {
        let account = account.clone();
        self.run(move |conn| insert_account(conn, &account)).await
    }

    /// Every publish reads its account: kept in memory until a write changes it.
    pub(super) async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        if let Some(kept) = self.fresh.account(id) {
            return Ok(kept);
        }
        let generation = self.fresh.generation();
        let account = self.read_account(id).await?;
        self.fresh
            .remember_account(generation, id, account.as_ref());
        Ok(account)
    }

    async fn read_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        let id = id.clone();
        self.read(move |conn| {
            conn.prepare_cached(
                "SELECT id, name, owner_email, created_at, publish_rate, publish_burst FROM accounts WHERE id = ?1",
            )
            .and_then(|mut s| {
                s.query_row(params![id.as_str()], account_from_row)
                    .optional()
            })
            .map_err(backend)
        })
        .await
    }

    pub(super) async fn update_account(&self, account: &Account) -> StoreResult<()> {
        let account = account.clone();
        self.run(move |conn| rewrite_account(conn, &account)).await
    }

    pub(super) async fn create_endpoint(&self, e: &Endpoint) -> StoreResult<()> {
        let e = e.clone();
        let sealed = sealed_secrets(&e, &self.secrets)?;
        self.run(move |conn| insert_endpoint(conn, &e, &sealed))
            .await
    }

    pub(super) async fn get_endpoint(
        &self,
        account: &AccountId,
        id: &EndpointId,
    ) -> StoreResult<Option<Endpoint>> {
        let (account, id) = (account.clone(), id.clone());
        let cipher = self.secrets.clone();
        self.read(move |conn| {
            conn.query_row(
                &format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE id = ?1 AND account_id = ?2"
                ),
                params![id.as_str(), account.as_str()],
                |row| endpoint_from_row(row, &cipher),
            )
            .optional()
            .map_err(backend)
        })
        .await
    }

    /// Every publish reads its account's endpoints: kept in memory until a write changes
    /// one (each secret opened once, not on every publish).
    pub(super) async fn list_endpoints(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
        if let Some(kept) = self.fresh.endpoints_of(account) {
            return Ok(Vec::clone(&kept));
        }
        let generation = self.fresh.generation();
        let endpoints = self.read_endpoints(account).await?;
        self.fresh
            .remember_endpoints_of(generation, account, endpoints.clone());
        Ok(endpoints)
    }

    async fn read_endpoints(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
        let account = account.clone();
        let cipher = self.secrets.clone();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(&format!("SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE account_id = ?1 ORDER BY created_at, id"))
                .map_err(backend)?;
            let rows = stmt.query_map(params![account.as_str()], |row| endpoint_from_row(row, &cipher)).map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    pub(super) async fn update_endpoint(
        &self,
        e: &Endpoint,
        read: &EndpointVersion,
    ) -> StoreResult<()> {
        let (e, read) = (e.clone(), *read);
        let sealed = sealed_secrets(&e, &self.secrets)?;
        self.run(move |conn| rewrite_endpoint(conn, &e, &sealed, &read))
            .await
    }

    pub(super) async fn delete_endpoint(&self, deletion: &EndpointDeletion) -> StoreResult<bool> {
        let EndpointDeletion {
            account_id: account,
            endpoint_id: id,
            at: now,
        } = deletion.clone();
        self.run(move |conn| {
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            let deleted = tx
                .execute("DELETE FROM endpoints WHERE id = ?1 AND account_id = ?2", params![id.as_str(), account.as_str()])
                .map_err(backend)?;
            if deleted > 0 {
                tx.execute(
                    "UPDATE deliveries SET status = 'abandoned', next_try_at = NULL, last_error = 'endpoint deleted', updated_at = ?2 \
                     WHERE endpoint_id = ?1 AND status = 'pending'",
                    params![id.as_str(), to_millis(now)],
                )
                .map_err(backend)?;
            }
            tx.commit().map_err(backend)?;
            Ok(deleted > 0)
        })
        .await
    }

    pub(super) async fn failing_endpoints(
        &self,
        failing_before: Timestamp,
    ) -> StoreResult<Vec<Endpoint>> {
        let cipher = self.secrets.clone();
        self.read_on_the_store_thread(move |conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE failing_since IS NOT NULL AND failing_since <= ?1 \
                     AND status = 'active' ORDER BY failing_since"
                ))
                .map_err(backend)?;
            let rows = stmt.query_map(params![to_millis(failing_before)], |row| endpoint_from_row(row, &cipher)).map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    pub(super) async fn disable_endpoint(
        &self,
        request: &DisableRequest,
    ) -> StoreResult<Option<DisableOutcome>> {
        let r = request.clone();
        let outcome = self.run(move |conn| {
            let tx = JobSavepoint::begin(conn).map_err(backend)?;
            let changed = tx
                .execute(
                    "UPDATE endpoints SET status = 'disabled', disabled_reason = ?3, updated_at = ?4 \
                     WHERE id = ?1 AND account_id = ?2 AND status = 'active' AND failing_since IS ?5",
                    params![
                        r.endpoint_id.as_str(),
                        r.account_id.as_str(),
                        r.reason,
                        to_millis(r.now),
                        opt_millis(r.expected_failing_since)
                    ],
                )
                .map_err(backend)?;
            if changed == 0 {
                return Ok(None);
            }
            let abandoned = tx
                .execute(
                    "UPDATE deliveries SET status = 'abandoned', next_try_at = NULL, last_error = ?2, updated_at = ?3 \
                     WHERE endpoint_id = ?1 AND status = 'pending'",
                    params![r.endpoint_id.as_str(), format!("abandoned: {}", r.reason), to_millis(r.now)],
                )
                .map_err(backend)?;
            if let Some(n) = &r.notification {
                tx.execute(
                    "INSERT INTO notifications (id, account_id, recipient, subject, body, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![n.id, n.account_id.as_str(), n.recipient.as_str(), n.subject, n.body, to_millis(n.created_at)],
                )
                .map_err(backend)?;
            }
            if let Some((event, deliveries)) = &r.operational_event {
                insert_event(&tx, event).map_err(backend)?;
                insert_deliveries(&tx, deliveries).map_err(backend)?;
            }
            tx.commit().map_err(backend)?;
            Ok(Some(DisableOutcome {
                abandoned: u64::try_from(abandoned).unwrap_or(0),
            }))
        })
        .await?;
        if outcome.is_some() {
            crate::telemetry::deliveries_created(
                request
                    .operational_event
                    .as_ref()
                    .map_or(0, |(_, d)| d.len()),
            );
        }
        Ok(outcome)
    }

    /// Due is `claimed_until` once claimed (a claim, or a retry's wait), else `created_at`,
    /// in the order of the `notifications_due` index.
    pub(super) async fn unsent_notifications(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> StoreResult<Vec<Notification>> {
        self.read_on_the_store_thread(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, account_id, recipient, subject, body, created_at FROM notifications \
                     WHERE sent_at IS NULL AND given_up_at IS NULL \
                     AND coalesce(claimed_until, created_at) <= ?1 \
                     ORDER BY coalesce(claimed_until, created_at), id LIMIT ?2",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map(params![to_millis(now), limit], |row| {
                    Ok(Notification {
                        id: row.get(0)?,
                        account_id: AccountId::from_trusted(row.get(1)?),
                        recipient: EmailAddress::from_trusted(row.get(2)?),
                        subject: row.get(3)?,
                        body: row.get(4)?,
                        created_at: from_millis(row.get(5)?),
                    })
                })
                .map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
        })
        .await
    }

    pub(super) async fn claim_notification(
        &self,
        id: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreResult<bool> {
        let id = id.to_owned();
        self.run(move |conn| {
            let claimed = conn
                .execute(
                    "UPDATE notifications SET claimed_until = ?3 WHERE id = ?1 AND sent_at IS NULL \
                     AND given_up_at IS NULL AND (claimed_until IS NULL OR claimed_until <= ?2)",
                    params![id, to_millis(now), to_millis(until)],
                )
                .map_err(backend)?;
            Ok(claimed == 1)
        })
        .await
    }

    pub(super) async fn mark_notification_sent(&self, id: &str, now: Timestamp) -> StoreResult<()> {
        let id = id.to_owned();
        self.run(move |conn| {
            conn.execute(
                "UPDATE notifications SET sent_at = ?2 WHERE id = ?1",
                params![id, to_millis(now)],
            )
            .map_err(backend)?;
            Ok(())
        })
        .await
    }

    /// A retry holds the notification as a claim does, until its wait is over; mail given
    /// up is purged with the retention, as sent mail is.
    pub(super) async fn mark_notification_failed(
        &self,
        id: &str,
        now: Timestamp,
        failure: &NotificationFailure,
    ) -> StoreResult<()> {
        let id = id.to_owned();
        let failure = failure.clone();
        self.run(move |conn| {
            let unsent = "WHERE id = ?1 AND sent_at IS NULL AND given_up_at IS NULL";
            match failure {
                NotificationFailure::Retry { at, error } => conn.execute(
                    &format!(
                        "UPDATE notifications SET claimed_until = ?2, last_error = ?3 {unsent}"
                    ),
                    params![id, to_millis(at), error],
                ),
                NotificationFailure::GiveUp { error } => conn.execute(
                    &format!(
                        "UPDATE notifications SET given_up_at = ?2, last_error = ?3, \
                         claimed_until = NULL {unsent}"
                    ),
                    params![id, to_millis(now), error],
                ),
            }
            .map_err(backend)?;
            Ok(())
        })
        .await
    }

    pub(super) async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        let key = key.to_owned();
        self.read_on_the_store_thread(move |conn| {
            conn.query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |row| row.get(0),
            )
            .optional()
            .map_err(backend)
        })
        .await
    }

    pub(super) async fn put_setting_if_absent(
        &self,
        key: &str,
        value: &str,
    ) -> StoreResult<String> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.run(move |conn| {
            conn.execute(
                "INSERT OR IGNORE INTO settings (key, value) VALUES (?1, ?2)",
                params![key, value],
            )
            .map_err(backend)?;
            conn.query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |row| row.get(0),
            )
            .map_err(backend)
        })
        .await
    }

    pub(super) async fn replace_setting(
        &self,
        key: &str,
        old: &str,
        new: &str,
    ) -> StoreResult<bool> {
        let (key, old, new) = (key.to_owned(), old.to_owned(), new.to_owned());
        self.run(move |conn| {
            conn.execute(
                "UPDATE settings SET value = ?3 WHERE key = ?1 AND value = ?2",
                params![key, old, new],
            )
            .map(|changed| changed == 1)
            .map_err(backend)
        })
        .await
    }

    pub(super) async fn settings_cipher(&self) -> StoreResult<crate::secrets::SecretsCipher> {
        Ok(self.secrets.clone())
    }

    pub(super) async fn put_setting(&self, key: &str, value: &str) -> StoreResult<()> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.run(move |conn| write_setting(conn, &key, &value))
            .await
    }
}

/// The write of `create_account`, on the store thread; `audited_change` runs it too.
pub(super) fn insert_account(conn: &Connection, account: &Account) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO accounts (id, name, owner_email, created_at, publish_rate, publish_burst) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            account.id.as_str(),
            account.name,
            account.owner_email.as_str(),
            to_millis(account.created_at),
            account.publish_rate_limit.map(|r| r.per_second),
            account.publish_rate_limit.map(|r| r.burst),
        ],
    )
    .map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::Conflict {
                entity: "account",
                id: account.id.to_string(),
            }
        } else {
            backend(e)
        }
    })?;
    Ok(())
}

/// The write of `update_account`.
pub(super) fn rewrite_account(conn: &Connection, account: &Account) -> StoreResult<()> {
    let changed = conn
            .execute(
                "UPDATE accounts SET name = ?2, owner_email = ?3, publish_rate = ?4, publish_burst = ?5 \
                 WHERE id = ?1",
                params![
                    account.id.as_str(),
                    account.name,
                    account.owner_email.as_str(),
                    account.publish_rate_limit.map(|r| r.per_second),
                    account.publish_rate_limit.map(|r| r.burst),
                ],
            )
            .map_err(backend)?;
    if changed == 0 {
        return Err(StoreError::NotFound("account"));
    }
    Ok(())
}

/// The write of `create_endpoint`.
pub(super) fn insert_endpoint(conn: &Connection, e: &Endpoint, sealed: &Sealed) -> StoreResult<()> {
    conn.execute(
            &format!("INSERT INTO endpoints ({ENDPOINT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"),
            endpoint_row(e, sealed),
        )
        .map_err(|err| {
            if is_unique_violation(&err) {
                StoreError::Conflict { entity: "endpoint", id: e.id.to_string() }
            } else {
                backend(err)
            }
        })?;
    Ok(())
}

/// `LimitReached` when `account` has more than `limit` endpoints, counted in the savepoint
/// that inserted one (which the error rolls back): writes run one at a time, so two
/// creates cannot both take the last place.
pub(super) fn within_endpoint_limit(
    conn: &Connection,
    account: &AccountId,
    limit: usize,
) -> StoreResult<()> {
    let count: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM endpoints WHERE account_id = ?1",
            params![account.as_str()],
            |row| row.get(0),
        )
        .map_err(backend)?;
    if usize::try_from(count).unwrap_or(usize::MAX) > limit {
        return Err(StoreError::LimitReached("endpoints"));
    }
    Ok(())
}

/// The write of `update_endpoint`. Writes run one at a time on the store's connection, so
/// the version read here is still the stored one when the update runs.
pub(super) fn rewrite_endpoint(
    conn: &Connection,
    e: &Endpoint,
    sealed: &Sealed,
    read: &EndpointVersion,
) -> StoreResult<()> {
    let stored = conn
        .query_row(
            "SELECT updated_at, status FROM endpoints WHERE id = ?1 AND account_id = ?2",
            params![e.id.as_str(), e.account_id.as_str()],
            |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)),
        )
        .optional()
        .map_err(backend)?
        .ok_or(StoreError::NotFound("endpoint"))?;
    if stored != (to_millis(read.updated_at), read.status.as_str().to_owned()) {
        return Err(StoreError::Changed("endpoint"));
    }
    // `?12`, the failing clock, only when the change restarts it: it is the sender's.
    let clock = if read.moves_failing_clock(e) {
        "failing_since = ?12, "
    } else {
        ""
    };
    // The values an insert binds; `?14`, the creation time, is left as it is.
    let changed = conn
        .execute(
            &format!(
                "UPDATE endpoints SET url = ?3, description = ?4, secret = ?5, retiring_secret = ?6, \
                 retiring_until = ?7, status = ?8, event_types = ?9, max_in_flight = ?10, rate_limit = ?11, \
                 {clock}disabled_reason = ?13, updated_at = ?15, headers = ?16 WHERE id = ?1 AND account_id = ?2"
            ),
            endpoint_row(e, sealed),
        )
        .map_err(backend)?;
    if changed == 0 {
        return Err(StoreError::NotFound("endpoint"));
    }
    Ok(())
}

/// The write of `put_setting`; `audited_change` runs it too.
pub(super) fn write_setting(conn: &Connection, key: &str, value: &str) -> StoreResult<()> {
    conn.execute(
        "INSERT OR REPLACE INTO settings (key, value) VALUES (?1, ?2)",
        params![key, value],
    )
    .map_err(backend)?;
    Ok(())
}
