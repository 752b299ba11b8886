//! An endpoint's rate limit as a token bucket: `per_second` tokens a second, holding at
//! most one second's worth. Kept in thousandths of a token so that a refill after any
//! number of milliseconds is exact. The embedded lanes and the DynamoDB buckets both use it.

/// Thousandths of a token in one token.
pub const MILLI: i64 = 1000;

/// A bucket as stored: its tokens (in thousandths) when it was last refilled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    pub milli_tokens: i64,
    pub refilled_at_ms: i64,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(per_second: u32, now_ms: i64) -> Self {
        Self {
            milli_tokens: capacity(per_second),
            refilled_at_ms: now_ms,
        }
    }

    /// The bucket at `now_ms`: `per_second` thousandths a millisecond since its last refill,
    /// up to its capacity. A clock that went back refills nothing.
    pub fn refilled(self, per_second: u32, now_ms: i64) -> Self {
        let elapsed = (now_ms - self.refilled_at_ms).max(0);
        let rate = i64::from(per_second.max(1));
        Self {
            milli_tokens: self
                .milli_tokens
                .saturating_add(elapsed.saturating_mul(rate))
                .min(capacity(per_second)),
            refilled_at_ms: now_ms.max(self.refilled_at_ms),
        }
    }

    pub fn has_token(&self) -> bool {
        self.milli_tokens >= MILLI
    }

    /// The bucket with one token taken (callers check `has_token` first).
    pub fn taken(self) -> Self {
        Self {
            milli_tokens: self.milli_tokens - MILLI,
            ..self
        }
    }

    /// When the next whole token will be there.
    pub fn next_token_ms(&self, per_second: u32) -> i64 {
        let missing = (MILLI - self.milli_tokens).max(0);
        let rate = i64::from(per_second.max(1));
        self.refilled_at_ms + (missing + rate - 1) / rate
    }
}

/// One second's worth.
fn capacity(per_second: u32) -> i64 {
    i64::from(per_second.max(1)) * MILLI
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_allows_one_seconds_worth_then_refills_at_the_rate() {
        let mut bucket = TokenBucket::full(3, 0);
        let mut taken = 0;
        while bucket.has_token() {
            bucket = bucket.taken();
            taken += 1;
        }
        assert_eq!(taken, 3, "a full bucket holds one second's worth");
        assert_eq!(bucket.next_token_ms(3), 334, "a token every 1000/3 ms");
        assert!(!bucket.refilled(3, 333).has_token());
        assert!(bucket.refilled(3, 334).has_token());
        assert_eq!(
            bucket.refilled(3, 60_000).milli_tokens,
            3 * MILLI,
            "never more than one second's worth"
        );
        assert_eq!(
            bucket.refilled(3, -5),
            TokenBucket {
                milli_tokens: 0,
                refilled_at_ms: 0
            },
            "a clock that went back refills nothing"
        );
    }
}
