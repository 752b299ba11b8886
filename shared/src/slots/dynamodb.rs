//! Slot leases and token buckets as items of the `control` table, changed only by
//! conditional writes (optimistic concurrency on a `version` attribute).
//!
//! - `slots#{endpoint}`: `holders` maps holder id → lease expiry (epoch ms). Taking a slot
//!   rewrites the map without the expired holders, plus the new one, if `version` is still
//!   the one read. So at most `cap` live leases exist, and a dead holder's entry is pruned
//!   by the first acquire after its expiry. `waiting` maps delivery id → when its
//!   re-queued message comes back (epoch ms): deliveries that found every slot held, for a
//!   holder with time left to take meanwhile (at most `WAITING_MAX`, a hint only).
//! - `rate#{endpoint}`: `tokens` (in thousandths) and `refilled_at` (epoch ms).
//! - `publish#{account}`: the account's publish bucket, the same two attributes.

use std::{collections::HashMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use aws_sdk_dynamodb::{
    error::{ProvideErrorMetadata, SdkError},
    operation::update_item::builders::UpdateItemFluentBuilder,
    types::AttributeValue,
    Client,
};
use rand::Rng;

use super::{RateLimiter, SlotError, SlotLeases, SlotToken, WAITING_MAX};
use crate::{
    aws::error_text,
    clock::{from_millis, to_millis, Clock, Timestamp},
    domain::{
        rate::{PublishRate, TokenBucket},
        AccountId, DeliveryId, EndpointId,
    },
    limits::{LimitError, PublishBuckets},
};

/// Tries of one acquire when other senders change the same item at the same moment.
const CONTENDED_TRIES: u32 = 8;

pub struct DynamoSlots {
    client: Client,
    table: String,
    clock: Arc<dyn Clock>,
}

impl DynamoSlots {
    /// `table` is the store's `control` table (`TableNames::control`).
    pub fn new(client: Client, table: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        Self {
            client,
            table: table.into(),
            clock,
        }
    }

    /// An update of one control item.
    fn update(&self, pk: &str) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.to_owned()))
    }

    async fn read(&self, pk: &str) -> Result<Option<HashMap<String, AttributeValue>>, SlotError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(failure)?;
        Ok(out.item)
    }

    /// Writes `fields` over the item if its version is still `version` (`None`: absent).
    /// False when someone else changed it first.
    /// Stores a token bucket (an endpoint's rate or an account's publishes) over `version`.
    async fn write_bucket(
        &self,
        pk: &str,
        version: Option<u64>,
        bucket: TokenBucket,
    ) -> Result<bool, SlotError> {
        let fields = vec![
            ("tokens", number(bucket.milli_tokens)),
            ("refilled_at", number(bucket.refilled_at_ms)),
        ];
        self.write_if_version(pk, version, fields).await
    }

    async fn write_if_version(
        &self,
        pk: &str,
        version: Option<u64>,
        fields: Vec<(&str, AttributeValue)>,
    ) -> Result<bool, SlotError> {
        let mut request = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", AttributeValue::S(pk.to_owned()))
            .item("version", number(version.map_or(1, |v| v + 1)));
        for (name, value) in fields {
            request = request.item(name, value);
        }
        request = match version {
            Some(v) => request
                .condition_expression("version = :v")
                .expression_attribute_values(":v", number(v)),
            None => request.condition_expression("attribute_not_exists(pk)"),
        };
        applied(request.send().await)
    }
}

impl DynamoSlots {
    /// The common case in one conditional write, without a read: the item exists and holds
    /// few enough entries (live or expired) for all of `holders` to join them, each leased
    /// until `expiry`. Concurrent senders do not conflict here the way version-checked
    /// writes do. False when the item is missing or too full.
    async fn add_holders_if_room(
        &self,
        pk: &str,
        holders: &[String],
        cap: u32,
        expiry: i64,
    ) -> Result<bool, SlotError> {
        let Some(room) = usize::try_from(cap)
            .ok()
            .and_then(|cap| cap.checked_sub(holders.len()))
        else {
            return Ok(false);
        };
        let assignments: Vec<String> = (0..holders.len())
            .map(|n| format!("holders.#holder{n} = :expiry"))
            .collect();
        let mut request = self
            .update(pk)
            // Bumping the version makes a concurrent pruning writer re-read.
            .update_expression(format!(
                "SET {}, version = version + :one",
                assignments.join(", ")
            ))
            // (`attribute_exists` first: the emulator fails on `size` of a missing attribute.)
            .condition_expression("attribute_exists(holders) AND size(holders) <= :room")
            .expression_attribute_values(":expiry", number(expiry))
            .expression_attribute_values(":one", number(1))
            .expression_attribute_values(":room", number(room));
        for (n, holder) in holders.iter().enumerate() {
            request = request.expression_attribute_names(format!("#holder{n}"), holder);
        }
        match request.send().await {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failed(&e) => Ok(false),
            // A missing item has no `holders` map to add to: the slow path creates it.
            Err(e)
                if e.as_service_error().and_then(ProvideErrorMetadata::code)
                    == Some("ValidationException") =>
            {
                Ok(false)
            }
            Err(e) => Err(failure(e)),
        }
    }

    /// Removes `holders` of the endpoint's item in one write (if any of them is still there).
    async fn remove_holders(
        &self,
        endpoint: &EndpointId,
        holders: &[&str],
    ) -> Result<(), SlotError> {
        if holders.is_empty() {
            return Ok(());
        }
        let paths: Vec<String> = (0..holders.len())
            .map(|n| format!("holders.#holder{n}"))
            .collect();
        let present: Vec<String> = (0..holders.len())
            .map(|n| format!("attribute_exists(holders.#holder{n})"))
            .collect();
        let mut request = self
            .update(&slots_key(endpoint))
            // Bumping the version makes a concurrent acquire re-read instead of writing
            // these holders back.
            .update_expression(format!(
                "REMOVE {} SET version = version + :one",
                paths.join(", ")
            ))
            .condition_expression(present.join(" OR "))
            .expression_attribute_values(":one", number(1));
        for (n, holder) in holders.iter().enumerate() {
            request = request.expression_attribute_names(format!("#holder{n}"), *holder);
        }
        // Nothing of this endpoint's is held any more: nothing to give back.
        applied(request.send().await).map(drop)
    }
}

impl DynamoSlots {
    /// Adds `entries` to the item's waiting list in one write while the list has room; an
    /// item written before lists existed gets one. A full list is left as it is.
    async fn add_waiting(
        &self,
        pk: &str,
        entries: &[(DeliveryId, Timestamp)],
    ) -> Result<(), SlotError> {
        let room = WAITING_MAX.saturating_sub(entries.len());
        let assignments: Vec<String> = (0..entries.len())
            .map(|n| format!("waiting.#w{n} = :w{n}"))
            .collect();
        let mut request = self
            .update(pk)
            .update_expression(format!("SET {}", assignments.join(", ")))
            .condition_expression("attribute_exists(waiting) AND size(waiting) <= :room")
            .expression_attribute_values(":room", number(room))
            .return_values_on_condition_check_failure(
                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
            );
        for (n, (delivery, back_at)) in entries.iter().enumerate() {
            request = request
                .expression_attribute_names(format!("#w{n}"), delivery.as_str())
                .expression_attribute_values(format!(":w{n}"), number(to_millis(*back_at)));
        }
        match request.send().await {
            Ok(_) => return Ok(()),
            Err(e) if is_condition_failed(&e) => {
                let seen = match e.as_service_error() {
                    Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(failed)) => failed.item(),
                    _ => None,
                };
                match seen.and_then(|item| item.get("waiting")) {
                    Some(AttributeValue::M(listed)) => {
                        return self.replace_stale_waiting(pk, listed, entries).await;
                    }
                    Some(_) => return Ok(()),
                    // No list yet (or the item is gone): created below.
                    None if seen.is_some() => {}
                    None => return Ok(()),
                }
            }
            Err(e) => return Err(failure(e)),
        }
        let list: HashMap<String, AttributeValue> = entries
            .iter()
            .map(|(delivery, back_at)| (delivery.to_string(), number(to_millis(*back_at))))
            .collect();
        let created = self
            .update(pk)
            .update_expression("SET waiting = :list")
            // Only beside live slot holders: a missing item is not created by a hint.
            .condition_expression("attribute_exists(pk) AND attribute_not_exists(waiting)")
            .expression_attribute_values(":list", AttributeValue::M(list))
            .send()
            .await;
        applied(created).map(drop)
    }
}

impl DynamoSlots {
    /// A full waiting list as `listed` holds it: the entries whose messages are back already
    /// make room for `entries` (and an entry listed again is updated), in one write if the
    /// list is still as read.
    async fn replace_stale_waiting(
        &self,
        pk: &str,
        listed: &HashMap<String, AttributeValue>,
        entries: &[(DeliveryId, Timestamp)],
    ) -> Result<(), SlotError> {
        let now = to_millis(self.clock.now());
        let is_new = |delivery: &DeliveryId| !listed.contains_key(delivery.as_str());
        let stale: Vec<&String> = listed
            .iter()
            .filter(|(id, at)| {
                !matches!(at, AttributeValue::N(raw) if raw.parse::<i64>().is_ok_and(|at| at > now))
                    && !entries.iter().any(|(d, _)| d.as_str() == id.as_str())
            })
            .map(|(id, _)| id)
            .collect();
        let room = (WAITING_MAX + stale.len()).saturating_sub(listed.len());
        let mut kept: Vec<&(DeliveryId, Timestamp)> =
            entries.iter().filter(|(d, _)| !is_new(d)).collect();
        kept.extend(entries.iter().filter(|(d, _)| is_new(d)).take(room));
        if kept.is_empty() {
            return Ok(());
        }
        let set: Vec<String> = (0..kept.len())
            .map(|n| format!("waiting.#w{n} = :w{n}"))
            .collect();
        let mut expression = format!("SET {}", set.join(", "));
        if !stale.is_empty() {
            let remove: Vec<String> = (0..stale.len()).map(|n| format!("waiting.#s{n}")).collect();
            expression.push_str(&format!(" REMOVE {}", remove.join(", ")));
        }
        let mut request = self
            .update(pk)
            .update_expression(expression)
            .condition_expression("size(waiting) = :seen")
            .expression_attribute_values(":seen", number(listed.len()));
        for (n, (delivery, back_at)) in kept.iter().enumerate() {
            request = request
                .expression_attribute_names(format!("#w{n}"), delivery.as_str())
                .expression_attribute_values(format!(":w{n}"), number(to_millis(*back_at)));
        }
        for (n, id) in stale.iter().enumerate() {
            request = request.expression_attribute_names(format!("#s{n}"), id.as_str());
        }
        // Changed meanwhile: the hint is dropped, the messages come back all the same.
        applied(request.send().await).map(drop)
    }
}

/// The item's waiting list as read, to carry over when the item is rewritten whole.
fn waiting_of(item: Option<&HashMap<String, AttributeValue>>) -> AttributeValue {
    match item.and_then(|i| i.get("waiting")) {
        Some(list @ AttributeValue::M(_)) => list.clone(),
        _ => AttributeValue::M(HashMap::new()),
    }
}

fn holder_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn lease_millis(lease_for: Duration) -> i64 {
    i64::try_from(lease_for.as_millis()).unwrap_or(i64::MAX / 2)
}

fn failure<E: std::error::Error>(error: E) -> SlotError {
    SlotError(error_text(&error))
}

/// Whether a conditional write went through: `false` when its condition no longer held.
fn applied<T, E, R>(result: Result<T, SdkError<E, R>>) -> Result<bool, SlotError>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    match result {
        Ok(_) => Ok(true),
        Err(e) if is_condition_failed(&e) => Ok(false),
        Err(e) => Err(failure(e)),
    }
}

fn is_condition_failed<E: ProvideErrorMetadata, R>(error: &SdkError<E, R>) -> bool {
    error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        == Some("ConditionalCheckFailedException")
}

fn number(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn read_number<T: std::str::FromStr>(
    item: &HashMap<String, AttributeValue>,
    name: &str,
) -> Option<T> {
    match item.get(name) {
        Some(AttributeValue::N(raw)) => raw.parse().ok(),
        _ => None,
    }
}

fn slots_key(endpoint: &EndpointId) -> String {
    format!("slots#{endpoint}")
}

fn rate_key(endpoint: &EndpointId) -> String {
    format!("rate#{endpoint}")
}

async fn back_off(try_number: u32) {
    let ceiling = 10u64 * u64::from(try_number + 1);
    let pause = rand::rng().random_range(1..=ceiling);
    tokio::time::sleep(Duration::from_millis(pause)).await;
}

#[async_trait]
impl SlotLeases for DynamoSlots {
    async fn acquire(
        &self,
        endpoint: &EndpointId,
        cap: u32,
        lease_for: Duration,
    ) -> Result<Option<SlotToken>, SlotError> {
        let pk = slots_key(endpoint);
        let holder = holder_id();
        let lease_ms = lease_millis(lease_for);
        let expiry = to_millis(self.clock.now()) + lease_ms;
        if self
            .add_holders_if_room(&pk, std::slice::from_ref(&holder), cap, expiry)
            .await?
        {
            return Ok(Some(SlotToken {
                endpoint: endpoint.clone(),
                holder,
            }));
        }
        // No item yet, or full (perhaps of expired leases): read, prune, write back.
        for try_number in 0..CONTENDED_TRIES {
            let item = self.read(&pk).await?;
            let version = item.as_ref().and_then(|i| read_number::<u64>(i, "version"));
            let now = to_millis(self.clock.now());
            let mut live: HashMap<String, AttributeValue> = match item
                .as_ref()
                .and_then(|i| i.get("holders"))
            {
                Some(AttributeValue::M(holders)) => holders
                    .iter()
                    .filter(|(_, expiry)| matches!(expiry, AttributeValue::N(raw) if raw.parse::<i64>().is_ok_and(|at| at > now)))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                _ => HashMap::new(),
            };
            if live.len() >= cap as usize {
                return Ok(None);
            }
            let expiry = now + lease_ms;
            live.insert(holder.clone(), number(expiry));
            let fields = vec![
                ("holders", AttributeValue::M(live)),
                ("waiting", waiting_of(item.as_ref())),
            ];
            if self.write_if_version(&pk, version, fields).await? {
                return Ok(Some(SlotToken {
                    endpoint: endpoint.clone(),
                    holder,
                }));
            }
            back_off(try_number).await;
        }
        tracing::debug!(endpoint.id = %endpoint, "slot item too contended; treating as full");
        Ok(None)
    }

    async fn release(&self, token: &SlotToken) -> Result<(), SlotError> {
        self.remove_holders(&token.endpoint, &[token.holder.as_str()])
            .await
    }

    /// Reads the item first (so a full endpoint costs no write), then writes once: the new
    /// holders added in place when there is room among the entries, or the map rewritten
    /// without its expired entries (version-checked) when there is not.
    async fn acquire_many(
        &self,
        endpoint: &EndpointId,
        cap: u32,
        wanted: u32,
        lease_for: Duration,
    ) -> Result<Vec<SlotToken>, SlotError> {
        if wanted <= 1 {
            let one = if wanted == 1 {
                self.acquire(endpoint, cap, lease_for).await?
            } else {
                None
            };
            return Ok(one.into_iter().collect());
        }
        let pk = slots_key(endpoint);
        let lease_ms = lease_millis(lease_for);
        for try_number in 0..CONTENDED_TRIES {
            let item = self.read(&pk).await?;
            let version = item.as_ref().and_then(|i| read_number::<u64>(i, "version"));
            let now = to_millis(self.clock.now());
            let entries = match item.as_ref().and_then(|i| i.get("holders")) {
                Some(AttributeValue::M(holders)) => Some(holders),
                _ => None,
            };
            let live: HashMap<String, AttributeValue> = entries
                .into_iter()
                .flatten()
                .filter(|(_, expiry)| matches!(expiry, AttributeValue::N(raw) if raw.parse::<i64>().is_ok_and(|at| at > now)))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let free = (cap as usize).saturating_sub(live.len());
            let take = free.min(wanted as usize);
            if take == 0 {
                return Ok(Vec::new());
            }
            let holders: Vec<String> = (0..take).map(|_| holder_id()).collect();
            let expiry = now + lease_ms;
            let room_among_entries = entries.is_some_and(|all| all.len() + take <= cap as usize);
            let written = if room_among_entries {
                self.add_holders_if_room(&pk, &holders, cap, expiry).await?
            } else {
                let mut next = live;
                for holder in &holders {
                    next.insert(holder.clone(), number(expiry));
                }
                let fields = vec![
                    ("holders", AttributeValue::M(next)),
                    ("waiting", waiting_of(item.as_ref())),
                ];
                self.write_if_version(&pk, version, fields).await?
            };
            if written {
                return Ok(holders
                    .into_iter()
                    .map(|holder| SlotToken {
                        endpoint: endpoint.clone(),
                        holder,
                    })
                    .collect());
            }
            back_off(try_number).await;
        }
        tracing::debug!(endpoint.id = %endpoint, "slot item too contended; treating as full");
        Ok(Vec::new())
    }

    async fn release_many(&self, tokens: &[SlotToken]) -> Result<(), SlotError> {
        let mut by_endpoint: Vec<(&EndpointId, Vec<&str>)> = Vec::new();
        for token in tokens {
            match by_endpoint.iter_mut().find(|(e, _)| *e == &token.endpoint) {
                Some((_, holders)) => holders.push(&token.holder),
                None => by_endpoint.push((&token.endpoint, vec![&token.holder])),
            }
        }
        for (endpoint, holders) in by_endpoint {
            self.remove_holders(endpoint, &holders).await?;
        }
        Ok(())
    }

    async fn live_leases(&self, endpoint: &EndpointId) -> Result<Vec<Timestamp>, SlotError> {
        let now = to_millis(self.clock.now());
        let mut expiries: Vec<i64> = match self.read(&slots_key(endpoint)).await? {
            Some(item) => match item.get("holders") {
                Some(AttributeValue::M(holders)) => holders
                    .values()
                    .filter_map(|expiry| match expiry {
                        AttributeValue::N(raw) => raw.parse::<i64>().ok(),
                        _ => None,
                    })
                    .filter(|at| *at > now)
                    .collect(),
                _ => Vec::new(),
            },
            None => Vec::new(),
        };
        expiries.sort_unstable();
        Ok(expiries.into_iter().map(from_millis).collect())
    }

    async fn wait(
        &self,
        endpoint: &EndpointId,
        waiting: &[(DeliveryId, Timestamp)],
    ) -> Result<(), SlotError> {
        let mut entries: Vec<(DeliveryId, Timestamp)> = Vec::new();
        for (delivery, back_at) in waiting {
            // One path per delivery in an update expression.
            if !entries.iter().any(|(listed, _)| listed == delivery) {
                entries.push((delivery.clone(), *back_at));
            }
        }
        entries.truncate(WAITING_MAX);
        if entries.is_empty() {
            return Ok(());
        }
        self.add_waiting(&slots_key(endpoint), &entries).await
    }

    async fn take_waiting(
        &self,
        endpoint: &EndpointId,
        not_before: Timestamp,
    ) -> Result<Option<DeliveryId>, SlotError> {
        let pk = slots_key(endpoint);
        for try_number in 0..CONTENDED_TRIES {
            let Some(item) = self.read(&pk).await? else {
                return Ok(None);
            };
            let Some(AttributeValue::M(waiting)) = item.get("waiting") else {
                return Ok(None);
            };
            let now = to_millis(self.clock.now());
            let mut entries: Vec<(&String, Option<i64>)> = waiting
                .iter()
                .map(|(id, at)| match at {
                    AttributeValue::N(raw) => (id, raw.parse::<i64>().ok()),
                    _ => (id, None),
                })
                .collect();
            // The message due back first has waited longest.
            entries.sort_by_key(|(_, at)| *at);
            let mut removed: Vec<&String> = entries
                .iter()
                .filter(|(id, at)| at.is_none_or(|at| at <= now) || DeliveryId::parse(id).is_err())
                .map(|(id, _)| *id)
                .collect();
            let floor = to_millis(not_before);
            let pick = entries
                .iter()
                .find(|(id, at)| {
                    at.is_some_and(|at| at >= floor && at > now) && DeliveryId::parse(id).is_ok()
                })
                .map(|(id, _)| *id);
            if let Some(pick) = pick {
                removed.push(pick);
            }
            if removed.is_empty() {
                return Ok(None);
            }
            let paths: Vec<String> = (0..removed.len())
                .map(|n| format!("waiting.#r{n}"))
                .collect();
            let mut request = self
                .update(&pk)
                .update_expression(format!("REMOVE {}", paths.join(", ")));
            if pick.is_some() {
                // The pick is the last path: whoever removes it first has it.
                request = request.condition_expression(format!(
                    "attribute_exists(waiting.#r{})",
                    removed.len() - 1
                ));
            }
            for (n, id) in removed.iter().enumerate() {
                request = request.expression_attribute_names(format!("#r{n}"), id.as_str());
            }
            match request.send().await {
                Ok(_) => return Ok(pick.and_then(|id| DeliveryId::parse(id).ok())),
                Err(e) if is_condition_failed(&e) => back_off(try_number).await,
                Err(e) => return Err(failure(e)),
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl RateLimiter for DynamoSlots {
    async fn try_take(&self, endpoint: &EndpointId, per_second: u32) -> Result<bool, SlotError> {
        let pk = rate_key(endpoint);
        for try_number in 0..CONTENDED_TRIES {
            let item = self.read(&pk).await?;
            let now = to_millis(self.clock.now());
            let (version, bucket) = match &item {
                Some(item) => {
                    let stored = TokenBucket {
                        milli_tokens: read_number(item, "tokens")
                            .unwrap_or(TokenBucket::full(per_second, now).milli_tokens),
                        refilled_at_ms: read_number(item, "refilled_at").unwrap_or(now),
                    };
                    (read_number::<u64>(item, "version"), stored)
                }
                None => (None, TokenBucket::full(per_second, now)),
            };
            let bucket = bucket.refilled(per_second, now);
            if !bucket.has_token() {
                return Ok(false);
            }
            let bucket = bucket.taken();
            let written = self.write_bucket(&pk, version, bucket).await?;
            if written {
                return Ok(true);
            }
            back_off(try_number).await;
        }
        Ok(false)
    }
}

#[async_trait]
impl PublishBuckets for DynamoSlots {
    async fn take(
        &self,
        account: &AccountId,
        rate: PublishRate,
        n: u32,
    ) -> Result<Option<Duration>, LimitError> {
        let pk = format!("publish#{account}");
        let failed = |e: SlotError| LimitError(e.0);
        for try_number in 0..CONTENDED_TRIES {
            let item = self.read(&pk).await.map_err(failed)?;
            let now = to_millis(self.clock.now());
            let (version, stored) = match &item {
                Some(item) => (
                    read_number::<u64>(item, "version"),
                    read_number(item, "tokens")
                        .zip(read_number(item, "refilled_at"))
                        .map(|(milli_tokens, refilled_at_ms)| TokenBucket {
                            milli_tokens,
                            refilled_at_ms,
                        }),
                ),
                None => (None, None),
            };
            let bucket = match crate::limits::decide(stored, rate, n, now) {
                Ok(bucket) => bucket,
                Err(wait) => return Ok(Some(wait)),
            };
            let written = self
                .write_bucket(&pk, version, bucket)
                .await
                .map_err(failed)?;
            if written {
                return Ok(None);
            }
            back_off(try_number).await;
        }
        // Every try lost to another publish of the same account at the same moment: the
        // bucket is contended, which only a busy account sees.
        Ok(Some(Duration::from_secs(1)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    use super::*;
    use crate::{
        clock::{ManualClock, SystemClock},
        store::dynamodb::{create_tables, TableNames},
        testing::emulator_client,
        testing::slow_receiver,
    };

    pub(crate) async fn slots() -> DynamoSlots {
        slots_on(Arc::new(SystemClock)).await
    }

    /// Slots on a fresh control table of the emulator, reading `clock`.
    async fn slots_on(clock: Arc<dyn Clock>) -> DynamoSlots {
        let client = emulator_client().await;
        let tables = TableNames::with_prefix(&format!("s{}", uuid::Uuid::new_v4().simple()));
        create_tables(&client, &tables).await.unwrap();
        DynamoSlots::new(client, tables.control, clock)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_senders_never_exceed_the_cap() {
        let slots = Arc::new(slots().await);
        let receiver = slow_receiver(Duration::from_millis(150)).await;
        let endpoint = EndpointId::parse("ep_slow").unwrap();
        let http = reqwest::Client::new();
        let sends_each = 6;
        let refused = Arc::new(AtomicUsize::new(0));
        let mut senders = Vec::new();
        for _ in 0..3 {
            let (slots, endpoint, http, url, refused) = (
                slots.clone(),
                endpoint.clone(),
                http.clone(),
                receiver.url.clone(),
                refused.clone(),
            );
            senders.push(tokio::spawn(async move {
                let mut sent = 0;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                while sent < sends_each && tokio::time::Instant::now() < deadline {
                    match slots
                        .acquire(&endpoint, 2, Duration::from_secs(15))
                        .await
                        .unwrap()
                    {
                        Some(token) => {
                            http.post(&url).body("{}").send().await.unwrap();
                            slots.release(&token).await.unwrap();
                            sent += 1;
                        }
                        None => {
                            refused.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                sent
            }));
        }
        let mut total = 0;
        for sender in senders {
            total += sender.await.unwrap();
        }
        assert_eq!(total, 18, "every sender got its turns");
        assert_eq!(receiver.served.load(Ordering::SeqCst), 18);
        assert_eq!(receiver.now.load(Ordering::SeqCst), 0);
        let most = receiver.most.load(Ordering::SeqCst);
        assert!(
            most <= 2,
            "the receiver saw {most} requests at once; the cap is 2"
        );
        assert_eq!(most, 2, "two senders did run side by side");
        assert!(
            refused.load(Ordering::SeqCst) > 0,
            "the third sender had to wait"
        );
    }

    #[tokio::test]
    async fn a_holder_that_never_releases_blocks_only_until_its_lease_ends() {
        let slots = slots().await;
        let endpoint = EndpointId::parse("ep_crashy").unwrap();
        let lease = Duration::from_millis(1500);
        let crashed = slots.acquire(&endpoint, 1, lease).await.unwrap();
        assert!(crashed.is_some());
        let started = std::time::Instant::now();
        assert_eq!(slots.acquire(&endpoint, 1, lease).await.unwrap(), None);
        let taken = loop {
            if let Some(token) = slots.acquire(&endpoint, 1, lease).await.unwrap() {
                break token;
            }
            assert!(
                started.elapsed() < lease * 3,
                "the dead lease never ran out"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            started.elapsed() >= lease - Duration::from_millis(200),
            "the slot came free before the lease ended ({:?})",
            started.elapsed()
        );
        // Released slots come back at once; a stale release changes nothing.
        slots.release(&taken).await.unwrap();
        slots.release(&taken).await.unwrap();
        let again = slots.acquire(&endpoint, 1, lease).await.unwrap();
        assert!(again.is_some());
        assert_eq!(slots.acquire(&endpoint, 1, lease).await.unwrap(), None);
    }

    #[tokio::test]
    async fn slots_taken_together_stay_within_the_cap_and_expire_like_single_ones() {
        let slots = slots().await;
        let endpoint = EndpointId::parse("ep_grouped").unwrap();
        let lease = Duration::from_millis(1500);
        let first = slots.acquire_many(&endpoint, 4, 3, lease).await.unwrap();
        assert_eq!(first.len(), 3);
        let second = slots.acquire_many(&endpoint, 4, 3, lease).await.unwrap();
        assert_eq!(second.len(), 1, "only one slot was left");
        assert_eq!(slots.acquire(&endpoint, 4, lease).await.unwrap(), None);
        assert!(slots
            .acquire_many(&endpoint, 4, 2, lease)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(slots.live_leases(&endpoint).await.unwrap().len(), 4);

        slots.release_many(&first).await.unwrap();
        assert_eq!(slots.live_leases(&endpoint).await.unwrap().len(), 1);
        // The holder of `second` never gives it back (a crashed sender).
        let third = slots
            .acquire_many(&endpoint, 4, 5, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(third.len(), 3);
        let started = std::time::Instant::now();
        let freed = loop {
            let taken = slots.acquire_many(&endpoint, 4, 5, lease).await.unwrap();
            if !taken.is_empty() {
                break taken;
            }
            assert!(
                started.elapsed() < lease * 3,
                "the dead lease never ran out"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(freed.len(), 1, "exactly the dead holder's slot came free");
        assert_eq!(slots.live_leases(&endpoint).await.unwrap().len(), 4);
        // Stale and mixed releases are harmless.
        slots.release_many(&second).await.unwrap();
        slots
            .release_many(&[third[0].clone(), first[0].clone()])
            .await
            .unwrap();
        assert_eq!(slots.live_leases(&endpoint).await.unwrap().len(), 3);
        slots.release_many(&third).await.unwrap();
        slots.release_many(&freed).await.unwrap();
        assert!(slots.live_leases(&endpoint).await.unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_group_takes_never_exceed_the_cap() {
        let slots = Arc::new(slots().await);
        let endpoint = EndpointId::parse("ep_busy").unwrap();
        let cap = 3;
        let holding = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut senders = Vec::new();
        for _ in 0..4 {
            let (slots, endpoint, holding, most) = (
                slots.clone(),
                endpoint.clone(),
                holding.clone(),
                most.clone(),
            );
            senders.push(tokio::spawn(async move {
                let mut taken_in_all = 0;
                for _ in 0..8 {
                    let tokens = slots
                        .acquire_many(&endpoint, cap, 2, Duration::from_secs(15))
                        .await
                        .unwrap();
                    let now = holding.fetch_add(tokens.len(), Ordering::SeqCst) + tokens.len();
                    most.fetch_max(now, Ordering::SeqCst);
                    taken_in_all += tokens.len();
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    holding.fetch_sub(tokens.len(), Ordering::SeqCst);
                    slots.release_many(&tokens).await.unwrap();
                }
                taken_in_all
            }));
        }
        let mut total = 0;
        for sender in senders {
            total += sender.await.unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        assert!(
            most <= cap as usize,
            "{most} slots held at once; the cap is {cap}"
        );
        assert!(total > 0, "someone got a slot");
        assert!(slots.live_leases(&endpoint).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_token_bucket_allows_the_rate_and_refills() {
        // A manual clock: the emulator's round trips take real time, which would refill the
        // bucket under a loaded machine.
        let clock = Arc::new(ManualClock::new(crate::clock::from_millis(
            1_700_000_000_000,
        )));
        let slots = slots_on(clock.clone()).await;
        let endpoint = EndpointId::parse("ep_rated").unwrap();
        let mut allowed = 0;
        for _ in 0..5 {
            if slots.try_take(&endpoint, 3).await.unwrap() {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 3, "a full bucket holds one second's worth");
        clock.advance(Duration::from_millis(400));
        assert!(
            slots.try_take(&endpoint, 3).await.unwrap(),
            "refilled one token"
        );
        assert!(!slots.try_take(&endpoint, 3).await.unwrap());
        let other = EndpointId::parse("ep_other").unwrap();
        assert!(
            slots.try_take(&other, 1).await.unwrap(),
            "buckets are per endpoint"
        );
    }

    #[tokio::test]
    async fn the_publish_bucket_holds_the_burst_per_account() {
        let clock = Arc::new(ManualClock::new(crate::clock::from_millis(
            1_700_000_000_000,
        )));
        let slots = slots_on(clock.clone()).await;
        let rate = PublishRate::new(2, Some(4), "x").unwrap();
        let acme = AccountId::parse("acme").unwrap();
        let mut allowed = 0;
        let mut wait = None;
        for _ in 0..6 {
            match slots.take(&acme, rate, 1).await.unwrap() {
                None => allowed += 1,
                Some(w) => wait = Some(w),
            }
        }
        assert_eq!(allowed, 4, "a full bucket holds the burst");
        assert_eq!(wait, Some(Duration::from_millis(500)));
        let other = AccountId::parse("other").unwrap();
        assert_eq!(slots.take(&other, rate, 1).await.unwrap(), None);
        clock.advance(Duration::from_millis(500));
        assert_eq!(slots.take(&acme, rate, 1).await.unwrap(), None);
        assert!(slots.take(&acme, rate, 1).await.unwrap().is_some());
    }

    fn delivery(n: usize) -> DeliveryId {
        DeliveryId::parse(&format!("dlv_{n:04}")).unwrap()
    }

    #[tokio::test]
    async fn a_waiting_delivery_is_taken_once_and_only_before_its_message_is_back() {
        let clock = Arc::new(ManualClock::new(crate::clock::from_millis(
            1_700_000_000_000,
        )));
        let slots = slots_on(clock.clone()).await;
        let endpoint = EndpointId::parse("ep_waits").unwrap();
        let now = clock.now();
        let at = |secs: i64| now + chrono::Duration::seconds(secs);
        // No slot record yet: a hint creates nothing.
        slots
            .wait(&endpoint, &[(delivery(0), at(9))])
            .await
            .unwrap();
        assert_eq!(slots.take_waiting(&endpoint, now).await.unwrap(), None);

        let holder = slots
            .acquire(&endpoint, 1, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        slots
            .wait(&endpoint, &[(delivery(1), at(8)), (delivery(2), at(4))])
            .await
            .unwrap();
        // The one due back first has waited longest; a message already back is not taken.
        assert_eq!(
            slots.take_waiting(&endpoint, now).await.unwrap(),
            Some(delivery(2))
        );
        clock.advance(Duration::from_secs(8));
        assert_eq!(
            slots.take_waiting(&endpoint, clock.now()).await.unwrap(),
            None,
            "delivery 1's message is back: it is not taken, and its entry is dropped"
        );
        clock.advance(Duration::from_secs(1));
        slots
            .wait(&endpoint, &[(delivery(1), at(20))])
            .await
            .unwrap();
        assert_eq!(
            slots.take_waiting(&endpoint, clock.now()).await.unwrap(),
            Some(delivery(1))
        );
        assert_eq!(
            slots.take_waiting(&endpoint, clock.now()).await.unwrap(),
            None
        );

        // Taking the slot again after its lease ran out rewrites the record: the list stays.
        slots
            .wait(&endpoint, &[(delivery(3), at(60))])
            .await
            .unwrap();
        clock.advance(Duration::from_secs(31));
        let again = slots
            .acquire(&endpoint, 1, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(again.is_some(), "the old lease had run out");
        assert_eq!(
            slots.take_waiting(&endpoint, clock.now()).await.unwrap(),
            Some(delivery(3))
        );

        // A list full of entries whose messages are back makes room for a new one.
        let soon = crate::clock::add(clock.now(), Duration::from_secs(2));
        let full: Vec<_> = (10..10 + WAITING_MAX)
            .map(|n| (delivery(n), soon))
            .collect();
        slots.wait(&endpoint, &full).await.unwrap();
        clock.advance(Duration::from_secs(3));
        let later = crate::clock::add(clock.now(), Duration::from_secs(10));
        slots
            .wait(&endpoint, &[(delivery(50), later)])
            .await
            .unwrap();
        assert_eq!(
            slots.take_waiting(&endpoint, clock.now()).await.unwrap(),
            Some(delivery(50))
        );
        slots.release(&holder).await.unwrap();
    }

    #[tokio::test]
    async fn the_waiting_list_stays_short_and_each_entry_goes_to_one_taker() {
        let slots = Arc::new(slots().await);
        let endpoint = EndpointId::parse("ep_list").unwrap();
        let holder = slots
            .acquire(&endpoint, 1, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(holder.is_some());
        let back = crate::clock::add(slots.clock.now(), Duration::from_secs(60));
        let many: Vec<(DeliveryId, Timestamp)> =
            (0..WAITING_MAX + 5).map(|n| (delivery(n), back)).collect();
        slots.wait(&endpoint, &many).await.unwrap();
        slots
            .wait(&endpoint, &[(delivery(99), back)])
            .await
            .unwrap();
        let takers: Vec<_> = (0..4)
            .map(|_| {
                let (slots, endpoint) = (slots.clone(), endpoint.clone());
                tokio::spawn(async move {
                    let mut taken = Vec::new();
                    while let Some(d) = slots
                        .take_waiting(&endpoint, slots.clock.now())
                        .await
                        .unwrap()
                    {
                        taken.push(d);
                    }
                    taken
                })
            })
            .collect();
        let mut taken = Vec::new();
        for taker in takers {
            taken.extend(taker.await.unwrap());
        }
        taken.sort();
        let listed: Vec<DeliveryId> = (0..WAITING_MAX).map(delivery).collect();
        assert_eq!(
            taken, listed,
            "the first {WAITING_MAX} listed, each taken once"
        );
    }
}
