//! Erasure of an event's content on request: the payload, and the endpoints' answers to it.

use super::items::*;
use super::*;
use crate::{
    domain::event::EVENT_ERASED,
    store::{Erasure, PageAfter},
};

/// How long one call goes through an event's deliveries before it stops, leaving its place
/// on the event item for the next: the API function's timeout is 30 s, as is an HTTP API's,
/// and an event sent to 100,000 endpoints takes minutes.
pub const ERASE_BUDGET: std::time::Duration = std::time::Duration::from_secs(20);

/// Deliveries read per page while erasing.
const ERASE_PAGE: u32 = 100;

/// On the event item: the endpoint whose delivery an unfinished erasure did last (they are
/// done in endpoint-id order).
const ERASE_AFTER: &str = "erase_after";

/// The control table's list (its `listed` index) of the erasures a call left unfinished:
/// the sweeper goes on with them, so an erasure answered 202 ends even if nobody repeats it.
const UNFINISHED: &str = "erasures";

/// How many unfinished erasures the sweeper looks at in one run.
const UNFINISHED_PER_RUN: usize = 20;

/// The sweeper starts erasure calls for this long at most, each up to [`ERASE_BUDGET`]: its
/// run spends [`FINISHING_LONGEST`] at most on them.
const FINISHING_STARTS: std::time::Duration = std::time::Duration::from_secs(10);
pub const FINISHING_LONGEST: std::time::Duration =
    std::time::Duration::from_secs(FINISHING_STARTS.as_secs() + ERASE_BUDGET.as_secs());

fn unfinished_pk(account: &AccountId, id: &EventId) -> String {
    format!("erasure#{account}#{id}")
}

impl DynamoStore {
    /// The payload is removed first: from then on no attempt can send it (the sender
    /// reads an event without one as erased). Pending deliveries are then ended, and the
    /// response bodies emptied, a page at a time in endpoint-id order, until
    /// [`ERASE_BUDGET`]: a call that runs out records where it stopped on the event item,
    /// and the next goes on from there. One that an attempt moves on meanwhile is ended by
    /// the sender when next taken. Once through them all, erasing again starts over: an
    /// attempt's record can land just after its delivery was cleared (docs/OPERATIONS.md).
    pub(super) async fn erase_event(
        &self,
        account: &AccountId,
        id: &EventId,
        now: Timestamp,
    ) -> StoreResult<Option<Erasure>> {
        let Some(item) = self
            .get(
                &self.tables.events,
                account_key(account.as_str(), id.as_str()),
            )
            .await?
        else {
            return Ok(None);
        };
        let (stored, unreadable) = match event_from_item(&item) {
            Ok(event) => (event, false),
            // An outbox write fan-out rejected (or will, or could not mark) keeps its `data`
            // for the operator; it may be what the request is about, so it goes too. It has
            // no deliveries.
            Err(StoreError::Rejected(_) | StoreError::Corrupt(_)) => {
                (rejected_write(&item, account, id, now), true)
            }
            Err(error) => return Err(error),
        };
        let event = stored.erased(now);
        let erased_at = event.erased_at.map_or(to_millis(now), to_millis);
        // An outbox writer's `data` goes with the payload (`data` is a reserved word), and
        // the event leaves the `missed` index: there is nothing left to send.
        let update = self
            .client
            .update_item()
            .table_name(&self.tables.events)
            .set_key(Some(account_key(account.as_str(), id.as_str())))
            .condition_expression("attribute_exists(id)")
            .expression_attribute_names("#data", "data")
            .expression_attribute_names("#missed", MISSED_AT)
            .expression_attribute_values(":at", n(erased_at));
        let update = if unreadable {
            // Without its data, a write whose only fault was its data would read as an
            // erased event, and fan-out would give it deliveries: it stays refused, done.
            update
                .update_expression(
                    "SET erased_at = if_not_exists(erased_at, :at), \
                     rejected = if_not_exists(rejected, :why), fanned_out = :done \
                     REMOVE payload, #data, #missed, #shard",
                )
                .expression_attribute_names("#shard", UNFANNED_SHARD)
                .expression_attribute_values(":why", s("erased on request before fan-out read it"))
                .expression_attribute_values(":done", AttributeValue::Bool(true))
        } else {
            update.update_expression(
                "SET erased_at = if_not_exists(erased_at, :at) REMOVE payload, #data, #missed",
            )
        };
        let result = update.send().await;
        if written(result)?.is_none() {
            // Removed by retention between the read and the update.
            return Ok(None);
        }
        // Written by an earlier call from an endpoint id it read.
        let after = match item.get(ERASE_AFTER) {
            Some(AttributeValue::S(endpoint)) => Some(EndpointId::from_trusted(endpoint.clone())),
            _ => None,
        };
        let resumed = after.is_some();
        let started = std::time::Instant::now();
        let mut page = PageAfter {
            after,
            limit: ERASE_PAGE,
        };
        let mut ended = 0;
        loop {
            let read = self.event_deliveries(&event, &page).await?;
            ended += self.erase_deliveries(read.deliveries, now).await?;
            let Some(next) = read.next else {
                break;
            };
            if started.elapsed() >= self.erase_budget {
                // Listed first: an erasure marked unfinished is always one the sweeper finds.
                self.list_unfinished(account, id, expiry(&item), now)
                    .await?;
                self.mark_erasure(account, id, Some(&next)).await?;
                return Ok(Some(Erasure {
                    event,
                    ended,
                    complete: false,
                }));
            }
            page.after = Some(next);
        }
        if resumed {
            self.mark_erasure(account, id, None).await?;
            self.forget_unfinished(account, id).await?;
        }
        Ok(Some(Erasure {
            event,
            ended,
            complete: true,
        }))
    }

    /// Goes on with the erasures that calls left unfinished (answered 202), in turn (one
    /// that runs out again goes to the back of the list), starting calls for
    /// `starts_for` at most: the sweeper's part, so that an erasure ends whether or not its
    /// caller repeats it. One that fails is logged and left listed for the next run; the
    /// others go on. Returns how many it finished.
    pub async fn finish_erasures(
        &self,
        now: Timestamp,
        starts_for: std::time::Duration,
    ) -> StoreResult<usize> {
        let started = std::time::Instant::now();
        let mut finished = 0;
        for (account, id) in self.unfinished_erasures().await? {
            if started.elapsed() >= starts_for.min(FINISHING_STARTS) {
                break;
            }
            match self.finish_erasure(&account, &id, now).await {
                Ok(true) => finished += 1,
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(account.id = %account, event.id = %id, %error, "an unfinished erasure failed again; the next sweep tries it again");
                }
            }
        }
        Ok(finished)
    }

    /// One listed erasure taken further; `true` when it is done (and off the list).
    async fn finish_erasure(
        &self,
        account: &AccountId,
        id: &EventId,
        now: Timestamp,
    ) -> StoreResult<bool> {
        // The index lags its table: one finished a moment ago may still be listed, and
        // erasing it again would start over from the first delivery.
        let pk = unfinished_pk(account, id);
        if self
            .get(&self.tables.control, key1("pk", &pk))
            .await?
            .is_none()
        {
            return Ok(false);
        }
        match self.erase_event(account, id, now).await? {
            // Done, from where it stopped or from the first delivery (its place was never
            // written, or another call finished it meanwhile): off the list either way.
            Some(erasure) if erasure.complete => {
                self.forget_unfinished(account, id).await?;
                Ok(true)
            }
            // Out of time again: listed for the next run.
            Some(_) => Ok(false),
            // Removed by retention meanwhile: nothing is left to erase.
            None => {
                self.forget_unfinished(account, id).await?;
                Ok(false)
            }
        }
    }

    /// The first erasures listed as unfinished, in the order they ran out.
    pub async fn unfinished_erasures(&self) -> StoreResult<Vec<(AccountId, EventId)>> {
        let listed = self.listed(UNFINISHED, false).await?;
        listed
            .iter()
            .take(UNFINISHED_PER_RUN)
            .map(|item| {
                Ok((
                    AccountId::from_trusted(get_s(item, "account_id")?),
                    EventId::from_trusted(get_s(item, "event_id")?),
                ))
            })
            .collect()
    }

    /// Lists an erasure as unfinished until the event's own expiry (`expires_at`, or the
    /// events' retention from now).
    pub(super) async fn list_unfinished(
        &self,
        account: &AccountId,
        id: &EventId,
        expires_at: Option<i64>,
        now: Timestamp,
    ) -> StoreResult<()> {
        let retention = chrono::TimeDelta::from_std(self.retention.events).unwrap_or_default();
        let expires_at = expires_at.unwrap_or_else(|| (now + retention).timestamp());
        let created = to_millis(now);
        self.client
            .put_item()
            .table_name(&self.tables.control)
            .item("pk", s(unfinished_pk(account, id)))
            .item("list", s(UNFINISHED))
            .item("list_key", s(format!("{created:013}#{account}#{id}")))
            .item("account_id", s(account.as_str()))
            .item("event_id", s(id.as_str()))
            .item("expires_at", n(expires_at))
            .send()
            .await
            .map_err(sdk)?;
        Ok(())
    }

    async fn forget_unfinished(&self, account: &AccountId, id: &EventId) -> StoreResult<()> {
        self.client
            .delete_item()
            .table_name(&self.tables.control)
            .set_key(Some(key1("pk", &unfinished_pk(account, id))))
            .send()
            .await
            .map_err(sdk)?;
        Ok(())
    }

    /// Ends the pending ones of `deliveries` and empties the response bodies of them all,
    /// several at once; returns how many it ended.
    async fn erase_deliveries(
        &self,
        deliveries: Vec<Delivery>,
        now: Timestamp,
    ) -> StoreResult<u32> {
        let each = deliveries.into_iter().map(|delivery| async move {
            let mut ended = 0;
            if delivery.status == DeliveryStatus::Pending {
                let change = Unattempted::Fail(EVENT_ERASED.to_owned());
                if self
                    .move_unattempted(&UnattemptedMove::of(&delivery, change, now))
                    .await?
                {
                    ended = 1;
                }
            }
            self.erase_responses(&delivery.id).await?;
            StoreResult::Ok(ended)
        });
        futures_util::StreamExt::buffer_unordered(futures_util::stream::iter(each), 16)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .sum()
    }

    /// Records on the event item where an unfinished erasure stopped (`Some`), or that one
    /// went through every delivery (`None`: the next starts from the first).
    async fn mark_erasure(
        &self,
        account: &AccountId,
        id: &EventId,
        stopped_after: Option<&EndpointId>,
    ) -> StoreResult<()> {
        let update = self
            .client
            .update_item()
            .table_name(&self.tables.events)
            .set_key(Some(account_key(account.as_str(), id.as_str())))
            .condition_expression("attribute_exists(id)");
        let update = match stopped_after {
            Some(endpoint) => update
                .update_expression("SET #after = :after")
                .expression_attribute_names("#after", ERASE_AFTER)
                .expression_attribute_values(":after", s(endpoint.as_str())),
            None => update
                .update_expression("REMOVE #after")
                .expression_attribute_names("#after", ERASE_AFTER),
        };
        // Gone meanwhile (retention): nothing is left to erase.
        written(update.send().await)?;
        Ok(())
    }

    /// Empties the response bodies of a delivery's attempts: the first try kept on the
    /// delivery item and the rows of the attempts table.
    async fn erase_responses(&self, delivery: &DeliveryId) -> StoreResult<()> {
        let Some(key) = delivery_key(delivery) else {
            return Ok(());
        };
        let empty = || s("");
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.deliveries)
            .set_key(Some(key))
            .condition_expression("attribute_exists(first_try)")
            .update_expression(
                "SET first_try.response_body = :empty, first_try.response_body_truncated = :false",
            )
            .expression_attribute_values(":empty", empty())
            .expression_attribute_values(":false", AttributeValue::Bool(false))
            .send()
            .await;
        written(result)?;
        let rows = self
            .query_all(
                self.partition_query(&self.tables.attempts, "delivery_id", delivery.as_str())
                    .projection_expression("delivery_id, #number")
                    .expression_attribute_names("#number", "number"),
            )
            .await?;
        for row in rows {
            let (Some(partition), Some(number)) = (row.get("delivery_id"), row.get("number"))
            else {
                continue;
            };
            let result = self
                .client
                .update_item()
                .table_name(&self.tables.attempts)
                .key("delivery_id", partition.clone())
                .key("number", number.clone())
                .condition_expression("attribute_exists(delivery_id)")
                .update_expression("SET response_body = :empty, response_body_truncated = :false")
                .expression_attribute_values(":empty", empty())
                .expression_attribute_values(":false", AttributeValue::Bool(false))
                .send()
                .await;
            // A row that expired meanwhile has nothing left to erase.
            written(result)?;
        }
        Ok(())
    }
}

/// What a rejected outbox write says of its event, as far as it can be read: its key, and its
/// type and time when they are there in the right form (`now` when its time is not).
fn rejected_write(item: &Item, account: &AccountId, id: &EventId, now: Timestamp) -> Event {
    let created_at = opt_n::<i64>(item, "created_at").ok().flatten();
    Event {
        id: id.clone(),
        account_id: account.clone(),
        event_type: EventType::from_trusted(opt_s(item, "type").unwrap_or_default()),
        created_at: created_at.map_or(now, from_millis),
        payload: String::new(),
        erased_at: opt_n::<i64>(item, "erased_at")
            .ok()
            .flatten()
            .map(from_millis),
    }
}
