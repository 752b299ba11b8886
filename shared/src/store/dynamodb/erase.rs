//! Erasure of an event's content on request: the payload, and the endpoints' answers to it.

use super::items::*;
use super::*;
use crate::{domain::event::EVENT_ERASED, store::Erasure};

impl DynamoStore {
    /// The payload is removed first: from then on no attempt can send it (the sender
    /// reads an event without one as erased). Pending deliveries are then ended one by one;
    /// one that an attempt moves on meanwhile is ended by the sender when next taken.
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
        // Several deliveries at once: an event sent to hundreds of endpoints is erased well
        // within the API's 30 s. An erasure cut short answers an error; repeating it finishes.
        let each = self
            .deliveries_of_event(&event)
            .await?
            .into_iter()
            .map(|delivery| async move {
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
        let ended = futures_util::StreamExt::buffer_unordered(futures_util::stream::iter(each), 16)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .sum::<StoreResult<u32>>()?;
        let deliveries = self.deliveries_of_event(&event).await?;
        Ok(Some(Erasure {
            event,
            deliveries,
            ended,
        }))
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
