//! Accounts, endpoints, the notification outbox and settings.

use super::items::*;
use super::write::Write;
use super::*;
use crate::store::NotificationFailure;

impl DynamoStore {
    pub(super) async fn create_account(&self, account: &Account) -> StoreResult<()> {
        self.audited_change(&AuditedChange::CreateAccount(account.clone()), &[])
            .await
    }

    pub(super) async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>> {
        self.get(&self.tables.accounts, key1("id", id.as_str()))
            .await?
            .map(|item| account_from_item(&item))
            .transpose()
    }

    pub(super) async fn get_endpoint(
        &self,
        account: &AccountId,
        id: &EndpointId,
    ) -> StoreResult<Option<Endpoint>> {
        self.get_endpoint_item(account, id).await
    }

    pub(super) async fn update_account(&self, account: &Account) -> StoreResult<()> {
        self.audited_change(&AuditedChange::UpdateAccount(account.clone()), &[])
            .await
    }

    pub(super) async fn list_endpoints(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>> {
        let items = self
            .query_all(self.partition_query(&self.tables.endpoints, "account_id", account.as_str()))
            .await?;
        let mut endpoints = items
            .iter()
            .filter(|item| !is_tombstone(item))
            .map(|item| endpoint_from_item(item, &self.secrets))
            .collect::<StoreResult<Vec<_>>>()?;
        endpoints.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(endpoints)
    }

    pub(super) async fn create_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()> {
        let change = AuditedChange::CreateEndpoint {
            endpoint: endpoint.clone(),
            limit: None,
        };
        self.audited_change(&change, &[]).await
    }

    pub(super) async fn update_endpoint(
        &self,
        endpoint: &Endpoint,
        read: &EndpointVersion,
    ) -> StoreResult<()> {
        let change = AuditedChange::UpdateEndpoint {
            endpoint: endpoint.clone(),
            read: *read,
        };
        self.audited_change(&change, &[]).await
    }

    pub(super) async fn delete_endpoint(&self, deletion: &EndpointDeletion) -> StoreResult<bool> {
        let (account, id, now) = (&deletion.account_id, &deletion.endpoint_id, deletion.at);
        // A tombstone rather than a delete: the account's deliveries are found through its
        // endpoints' ids (see `deliveries_of_event`, `list_deliveries`). It keeps no secret
        // and reads as absent everywhere. Like a disable, it sits in the `disabling`
        // partition of the `failing` index (a clock for the index alone) until its pending
        // work is abandoned, so that the health check finishes a delete that stopped part
        // way (`finish_deleting`). The account's count of endpoints goes down with it, in
        // one transaction.
        let tombstone = Write::update(
            &self.tables.endpoints,
            account_key(account.as_str(), id.as_str()),
            "SET #deleted = :now, updated_at = :now, #status = :disabled, \
             failing_shard = :disabling, failing_since = :index_only \
             REMOVE secret, retiring_secret, retiring_until, headers",
        )
        .condition("attribute_exists(id) AND attribute_not_exists(#deleted)")
        .name("#deleted", DELETED_AT)
        .name("#status", "status")
        .value(":now", n(to_millis(now)))
        .value(":disabled", s("disabled"))
        .value(":disabling", s(DISABLING_SHARD))
        .value(":index_only", n(INDEX_ONLY_SINCE));
        let count = self.endpoint_count_write(account, -1, None);
        match self
            .transact(vec![tombstone.transact_item()?, count.transact_item()?])
            .await
        {
            Ok(()) => {}
            Err(TransactionFailure::Conditions(_)) => return Ok(false),
            Err(failure) => return Err(failure.into_store_error()),
        }
        // The delete is made: what its abandon could not do, the health check finishes.
        if let Err(error) = self.finish_deleting(account, id, now).await {
            tracing::warn!(endpoint.id = %id, %error, "the deleted endpoint's pending work is left for the health check");
        }
        Ok(true)
    }

    /// The `unsent` index is sorted by `created_key`, which for a notification is when it is
    /// due: made at first, then the end of its claim or of its wait after a failed send
    /// (`claim_notification` and `mark_notification_failed` move it). Reading only up to
    /// `now` reads past the held ones, however many; a given-up one leaves the index.
    pub(super) async fn unsent_notifications(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> StoreResult<Vec<Notification>> {
        // Every key made at or before `now` sorts before the bare millisecond that follows.
        let after_now = format!("{:016}", to_millis(now).max(0).saturating_add(1));
        let out = self
            .client
            .query()
            .table_name(&self.tables.control)
            .index_name(UNSENT)
            .key_condition_expression("#u = :u AND created_key < :after_now")
            .expression_attribute_names("#u", UNSENT)
            .expression_attribute_values(":u", s(UNSENT))
            .expression_attribute_values(":after_now", s(after_now))
            .limit(i32::try_from(limit.max(1)).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(sdk)?;
        out.items
            .unwrap_or_default()
            .iter()
            .map(notification_from_item)
            .collect()
    }

    /// Conditional on the item itself, which is read consistently: the `unsent` index a
    /// sender listed it from lags its writes, so it may still list a notification that was
    /// just sent, or that another sender is sending.
    pub(super) async fn claim_notification(
        &self,
        id: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreResult<bool> {
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.control)
            .key("pk", notification_pk(id))
            .update_expression("SET claimed_until = :until, created_key = :due")
            .condition_expression(
                "attribute_exists(#u) AND (attribute_not_exists(claimed_until) OR claimed_until <= :now)",
            )
            .expression_attribute_names("#u", UNSENT)
            .expression_attribute_values(":now", n(to_millis(now)))
            .expression_attribute_values(":until", n(to_millis(until)))
            .expression_attribute_values(":due", s(time_key(until, id)))
            .send()
            .await;
        Ok(written(result)?.is_some())
    }

    pub(super) async fn mark_notification_sent(&self, id: &str, now: Timestamp) -> StoreResult<()> {
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.control)
            .key("pk", notification_pk(id))
            // Sent mail goes with the retention, as the SQLite store's purge removes it.
            .update_expression("SET sent_at = :now, expires_at = :expires REMOVE #u")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_names("#u", UNSENT)
            .expression_attribute_values(":now", n(to_millis(now)))
            .expression_attribute_values(":expires", self.log_expiry(now))
            .send()
            .await;
        written(result)?;
        Ok(())
    }

    /// A retry holds the notification as a claim does, until its wait is over; giving up
    /// takes it out of the `unsent` index and lets it expire with the retention, as sent
    /// mail does. Either keeps the error in `last_error`.
    pub(super) async fn mark_notification_failed(
        &self,
        id: &str,
        now: Timestamp,
        failure: &NotificationFailure,
    ) -> StoreResult<()> {
        let update = self
            .client
            .update_item()
            .table_name(&self.tables.control)
            .key("pk", notification_pk(id))
            .condition_expression("attribute_exists(#u)")
            .expression_attribute_names("#u", UNSENT);
        let update = match failure {
            NotificationFailure::Retry { at, error } => update
                .update_expression(
                    "SET claimed_until = :at, created_key = :due, last_error = :error",
                )
                .expression_attribute_values(":at", n(to_millis(*at)))
                .expression_attribute_values(":due", s(time_key(*at, id)))
                .expression_attribute_values(":error", s(error)),
            NotificationFailure::GiveUp { error } => update
                .update_expression(
                    "SET given_up_at = :now, last_error = :error, expires_at = :expires \
                     REMOVE #u, claimed_until",
                )
                .expression_attribute_values(":now", n(to_millis(now)))
                .expression_attribute_values(":error", s(error))
                .expression_attribute_values(":expires", self.log_expiry(now)),
        };
        written(update.send().await)?;
        Ok(())
    }

    pub(super) async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        Ok(self
            .get(&self.tables.control, key1("pk", &format!("setting#{key}")))
            .await?
            .and_then(|item| opt_s(&item, "value")))
    }

    pub(super) async fn put_setting_if_absent(
        &self,
        key: &str,
        value: &str,
    ) -> StoreResult<String> {
        let pk = format!("setting#{key}");
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.control)
            .item("pk", s(&pk))
            .item("value", s(value))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        if written(result)?.is_some() {
            return Ok(value.to_owned());
        }
        self.get_setting(key)
            .await?
            .ok_or_else(|| StoreError::Backend(format!("setting {key} vanished")))
    }

    pub(super) async fn replace_setting(
        &self,
        key: &str,
        old: &str,
        new: &str,
    ) -> StoreResult<bool> {
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.control)
            .set_key(Some(key1("pk", &format!("setting#{key}"))))
            .update_expression("SET #value = :new")
            .condition_expression("#value = :old")
            .expression_attribute_names("#value", "value")
            .expression_attribute_values(":old", s(old))
            .expression_attribute_values(":new", s(new))
            .send()
            .await;
        Ok(written(result)?.is_some())
    }

    pub(super) async fn settings_cipher(&self) -> StoreResult<crate::secrets::SecretsCipher> {
        self.secrets
            .cipher()
            .cloned()
            .map_err(|e| StoreError::Backend(e.to_string()))
    }

    pub(super) async fn put_setting(&self, key: &str, value: &str) -> StoreResult<()> {
        let change = AuditedChange::PutSetting {
            key: key.to_owned(),
            value: value.to_owned(),
        };
        self.audited_change(&change, &[]).await
    }
}
