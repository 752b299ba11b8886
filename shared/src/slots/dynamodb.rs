//! Slot leases and token buckets as items of the `control` table, changed only by
//! conditional writes (optimistic concurrency on a `version` attribute).
//!
//! - `slots#{endpoint}`: `holders` maps holder id → lease expiry (epoch ms). Taking a slot
//!   rewrites the map without the expired holders, plus the new one, if `version` is still
//!   the one read. So at most `cap` live leases exist, and a dead holder's entry is pruned
//!   by the first acquire after its expiry.
//! - `rate#{endpoint}`: `tokens` (in thousandths) and `refilled_at` (epoch ms).

use std::{collections::HashMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use aws_sdk_dynamodb::{
    error::{ProvideErrorMetadata, SdkError},
    types::AttributeValue,
    Client,
};
use rand::Rng;

use super::{RateLimiter, SlotError, SlotLeases, SlotToken};
use crate::{
    aws::error_text,
    clock::{from_millis, to_millis, Clock, Timestamp},
    domain::EndpointId,
};

/// Tries of one acquire when other senders change the same item at the same moment.
const CONTENDED_TRIES: u32 = 8;
const MILLI_TOKENS: i64 = 1000;

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

    /// When each live lease on the endpoint's slots runs out, earliest first (what an
    /// operator or a test looks at to see why an endpoint is busy).
    pub async fn live_leases(&self, endpoint: &EndpointId) -> Result<Vec<Timestamp>, SlotError> {
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
        match request.send().await {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(failure(e)),
        }
    }
}

impl DynamoSlots {
    /// The common case in one conditional write, without a read: the item exists and holds
    /// fewer than `cap` entries (live or expired), so this holder joins them. Concurrent
    /// senders do not conflict here the way version-checked writes do. False when the item
    /// is missing or full.
    async fn add_holder_if_room(
        &self,
        pk: &str,
        holder: &str,
        cap: u32,
        lease_ms: i64,
    ) -> Result<bool, SlotError> {
        let expiry = to_millis(self.clock.now()) + lease_ms;
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.to_owned()))
            // Bumping the version makes a concurrent pruning writer re-read.
            .update_expression("SET holders.#holder = :expiry, version = version + :one")
            // (`attribute_exists` first: the emulator fails on `size` of a missing attribute.)
            .condition_expression("attribute_exists(holders) AND size(holders) < :cap")
            .expression_attribute_names("#holder", holder)
            .expression_attribute_values(":expiry", number(expiry))
            .expression_attribute_values(":one", number(1))
            .expression_attribute_values(":cap", number(cap))
            .send()
            .await;
        match result {
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
}

fn failure<E: std::error::Error>(error: E) -> SlotError {
    SlotError(error_text(&error))
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
        let holder = uuid::Uuid::new_v4().simple().to_string();
        let lease_ms = i64::try_from(lease_for.as_millis()).unwrap_or(i64::MAX / 2);
        if self.add_holder_if_room(&pk, &holder, cap, lease_ms).await? {
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
            if self
                .write_if_version(&pk, version, vec![("holders", AttributeValue::M(live))])
                .await?
            {
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
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(slots_key(&token.endpoint)))
            // Bumping the version makes a concurrent acquire re-read instead of writing
            // this holder back.
            .update_expression("REMOVE holders.#holder SET version = version + :one")
            .condition_expression("attribute_exists(holders.#holder)")
            .expression_attribute_names("#holder", &token.holder)
            .expression_attribute_values(":one", number(1))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) if is_condition_failed(&e) => Ok(()),
            Err(e) => Err(failure(e)),
        }
    }
}

#[async_trait]
impl RateLimiter for DynamoSlots {
    async fn try_take(&self, endpoint: &EndpointId, per_second: u32) -> Result<bool, SlotError> {
        let pk = rate_key(endpoint);
        let capacity = i64::from(per_second.max(1)) * MILLI_TOKENS;
        for try_number in 0..CONTENDED_TRIES {
            let item = self.read(&pk).await?;
            let now = to_millis(self.clock.now());
            let (version, tokens) = match &item {
                Some(item) => {
                    let stored: i64 = read_number(item, "tokens").unwrap_or(capacity);
                    let refilled_at: i64 = read_number(item, "refilled_at").unwrap_or(now);
                    // per_second tokens a second = per_second thousandths a millisecond.
                    let refill = (now - refilled_at).max(0) * i64::from(per_second);
                    (
                        read_number::<u64>(item, "version"),
                        (stored + refill).min(capacity),
                    )
                }
                None => (None, capacity),
            };
            if tokens < MILLI_TOKENS {
                return Ok(false);
            }
            let written = self
                .write_if_version(
                    &pk,
                    version,
                    vec![
                        ("tokens", number(tokens - MILLI_TOKENS)),
                        ("refilled_at", number(now)),
                    ],
                )
                .await?;
            if written {
                return Ok(true);
            }
            back_off(try_number).await;
        }
        Ok(false)
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
        store::dynamodb::{create_tables, tests::emulator_client, TableNames},
        testing::slow_receiver,
    };

    pub(crate) async fn slots() -> DynamoSlots {
        let client = emulator_client().await;
        let tables = TableNames::with_prefix(&format!("s{}", uuid::Uuid::new_v4().simple()));
        create_tables(&client, &tables).await.unwrap();
        DynamoSlots::new(client, tables.control, Arc::new(SystemClock))
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
    async fn the_token_bucket_allows_the_rate_and_refills() {
        // A manual clock: the emulator's round trips take real time, which would refill the
        // bucket under a loaded machine.
        let clock = Arc::new(ManualClock::new(crate::clock::from_millis(
            1_700_000_000_000,
        )));
        let client = emulator_client().await;
        let tables = TableNames::with_prefix(&format!("s{}", uuid::Uuid::new_v4().simple()));
        create_tables(&client, &tables).await.unwrap();
        let slots = DynamoSlots::new(client, tables.control, clock.clone());
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
}
