//! Per-account publish rate limits: a token bucket per account, refilled at the account's own
//! rate or the configured default. Kept in memory (embedded) or in the control table (AWS).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;

use crate::{
    clock::{to_millis, Clock},
    domain::{
        rate::{PublishRate, TokenBucket},
        AccountId,
    },
};

#[derive(Debug, thiserror::Error)]
#[error("publish rate bucket: {0}")]
pub struct LimitError(pub String);

#[async_trait]
pub trait PublishBuckets: Send + Sync + 'static {
    /// Takes `n` tokens from the account's bucket if it holds `rate.needed(n)` of them
    /// (`None`); otherwise takes nothing and answers how long until it will.
    async fn take(
        &self,
        account: &AccountId,
        rate: PublishRate,
        n: u32,
    ) -> Result<Option<Duration>, LimitError>;
}

/// What a take decides for a bucket as read: the bucket to write, or the wait.
pub fn decide(
    stored: Option<TokenBucket>,
    rate: PublishRate,
    n: u32,
    now_ms: i64,
) -> Result<TokenBucket, Duration> {
    let bucket = stored
        .unwrap_or(TokenBucket::full_of(rate.burst, now_ms))
        .refilled_up_to(rate.per_second, rate.burst, now_ms);
    let needed = rate.needed(n);
    if bucket.has_tokens(needed) {
        Ok(bucket.taken_n(n))
    } else {
        Err(bucket.wait_for(needed, rate.per_second))
    }
}

/// The embedded shape's buckets: one process serves every publish.
pub struct MemoryBuckets {
    clock: Arc<dyn Clock>,
    buckets: Mutex<HashMap<AccountId, TokenBucket>>,
}

impl MemoryBuckets {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            buckets: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl PublishBuckets for MemoryBuckets {
    async fn take(
        &self,
        account: &AccountId,
        rate: PublishRate,
        n: u32,
    ) -> Result<Option<Duration>, LimitError> {
        let now = to_millis(self.clock.now());
        let mut buckets = self
            .buckets
            .lock()
            .map_err(|_| LimitError("the bucket map was poisoned".into()))?;
        // This process's own buckets: a clock stepped back moves them back too.
        let stored = buckets.get(account).map(|bucket| bucket.rewound(now));
        match decide(stored, rate, n, now) {
            Ok(bucket) => {
                buckets.insert(account.clone(), bucket);
                Ok(None)
            }
            Err(wait) => Ok(Some(wait)),
        }
    }
}

/// No limit at all: for tests and tools that publish without the API.
pub struct Unlimited;

#[async_trait]
impl PublishBuckets for Unlimited {
    async fn take(
        &self,
        _: &AccountId,
        _: PublishRate,
        _: u32,
    ) -> Result<Option<Duration>, LimitError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{from_millis, ManualClock};

    #[tokio::test]
    async fn memory_buckets_are_per_account_and_refill() {
        let clock = Arc::new(ManualClock::new(from_millis(1_700_000_000_000)));
        let buckets = MemoryBuckets::new(clock.clone());
        let rate = PublishRate::new(10, Some(3), "x").unwrap();
        let acme = AccountId::parse("acme").unwrap();
        let mut refused = None;
        for _ in 0..3 {
            assert_eq!(buckets.take(&acme, rate, 1).await.unwrap(), None);
        }
        if let Some(wait) = buckets.take(&acme, rate, 1).await.unwrap() {
            refused = Some(wait);
        }
        assert_eq!(
            refused,
            Some(Duration::from_millis(100)),
            "a token every 100 ms"
        );
        let other = AccountId::parse("other").unwrap();
        assert_eq!(buckets.take(&other, rate, 1).await.unwrap(), None);
        clock.advance(Duration::from_millis(100));
        assert_eq!(buckets.take(&acme, rate, 1).await.unwrap(), None);
    }
}
