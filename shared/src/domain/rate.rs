//! Rate limits as token buckets: `per_second` tokens a second, holding at most `burst`
//! (an endpoint's bucket holds one second's worth). Kept in thousandths of a token so that
//! a refill after any number of milliseconds is exact. The embedded lanes, the publish
//! limits and the DynamoDB buckets all use it.

use std::time::Duration;

use super::InvalidField;

/// Thousandths of a token in one token.
pub const MILLI: i64 = 1000;

/// How far behind a bucket's last refill its process's clock must be to count as stepped
/// back ([`TokenBucket::rewound`]).
pub const CLOCK_STEP_MS: i64 = 1000;

/// A bucket as stored: its tokens (in thousandths) when it was last refilled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    pub milli_tokens: i64,
    pub refilled_at_ms: i64,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(per_second: u32, now_ms: i64) -> Self {
        Self::full_of(per_second, now_ms)
    }

    /// A bucket holding `burst` tokens.
    pub fn full_of(burst: u32, now_ms: i64) -> Self {
        Self {
            milli_tokens: capacity(burst),
            refilled_at_ms: now_ms,
        }
    }

    /// The bucket at `now_ms`: `per_second` thousandths a millisecond since its last refill,
    /// up to its capacity. A clock that went back refills nothing (another instance's, a
    /// little behind, sharing the bucket); see [`Self::rewound`] for a bucket one process
    /// keeps.
    pub fn refilled(self, per_second: u32, now_ms: i64) -> Self {
        self.refilled_up_to(per_second, per_second, now_ms)
    }

    /// As [`refilled`](Self::refilled), holding at most `burst` tokens.
    pub fn refilled_up_to(self, per_second: u32, burst: u32, now_ms: i64) -> Self {
        let elapsed = (now_ms - self.refilled_at_ms).max(0);
        let rate = i64::from(per_second.max(1));
        let cap = capacity(burst);
        Self {
            milli_tokens: self
                .milli_tokens
                .saturating_add(elapsed.saturating_mul(rate))
                .min(cap),
            refilled_at_ms: now_ms.max(self.refilled_at_ms),
        }
    }

    /// A bucket only this process keeps, whose clock stepped back by more than
    /// [`CLOCK_STEP_MS`] (NTP, a VM restored): it refills from its new time on, rather than
    /// nothing until the clock is back where it was. Not for a shared bucket: there a clock
    /// behind is another instance's, and moving the bucket back to it would let the
    /// instances refill the difference at every turn.
    pub fn rewound(self, now_ms: i64) -> Self {
        if now_ms + CLOCK_STEP_MS < self.refilled_at_ms {
            Self {
                refilled_at_ms: now_ms,
                ..self
            }
        } else {
            self
        }
    }

    /// Whether `n` whole tokens are there.
    pub fn has_tokens(&self, n: u32) -> bool {
        self.milli_tokens >= i64::from(n) * MILLI
    }

    /// The bucket with `n` tokens taken. It may go below zero (a batch larger than what is
    /// left): the tokens it borrowed are paid back by waiting before the next take.
    pub fn taken_n(self, n: u32) -> Self {
        Self {
            milli_tokens: self.milli_tokens - i64::from(n) * MILLI,
            ..self
        }
    }

    /// How long until `n` whole tokens are there at `per_second`.
    pub fn wait_for(&self, n: u32, per_second: u32) -> Duration {
        let missing = (i64::from(n) * MILLI - self.milli_tokens).max(0);
        let rate = i64::from(per_second.max(1));
        Duration::from_millis(u64::try_from((missing + rate - 1) / rate).unwrap_or(0))
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

/// `tokens` in thousandths (at least one token).
fn capacity(tokens: u32) -> i64 {
    i64::from(tokens.max(1)) * MILLI
}

/// A publish rate limit: `per_second` events a second on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PublishRate {
    pub per_second: u32,
    pub burst: u32,
}

/// The most either number of a [`PublishRate`] may be.
pub const MAX_PUBLISH_RATE: u32 = 1_000_000;

impl PublishRate {
    /// A limit of `per_second` events a second and bursts of `burst` (`per_second` when
    /// unset); `field` names the setting in an error.
    pub fn new(
        per_second: u32,
        burst: Option<u32>,
        field: &'static str,
    ) -> Result<Self, InvalidField> {
        let burst = burst.unwrap_or(per_second);
        for (value, name) in [(per_second, "per_second"), (burst, "burst")] {
            if !(1..=MAX_PUBLISH_RATE).contains(&value) {
                return Err(InvalidField::new(
                    field,
                    format!("{name} must be from 1 to {MAX_PUBLISH_RATE}, not {value}"),
                ));
            }
        }
        Ok(Self { per_second, burst })
    }

    /// How many of `wanted` tokens a take must find: a batch larger than the burst needs a
    /// full bucket, not more than it can ever hold.
    pub fn needed(&self, wanted: u32) -> u32 {
        wanted.clamp(1, self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_bucket_holds_its_burst_and_lends_to_a_large_batch() {
        let rate = PublishRate::new(2, Some(5), "x").unwrap();
        let mut bucket = TokenBucket::full_of(rate.burst, 0);
        let mut taken = 0;
        while bucket.has_tokens(1) {
            bucket = bucket.taken_n(1);
            taken += 1;
        }
        assert_eq!(taken, 5, "a full bucket holds the burst");
        assert_eq!(bucket.wait_for(1, 2), Duration::from_millis(500));
        let later = bucket.refilled_up_to(2, 5, 10_000);
        assert!(
            later.has_tokens(5) && !later.has_tokens(6),
            "never more than the burst"
        );
        // A batch of 8 needs a full bucket (5), takes 8, and leaves 3 to pay back.
        assert_eq!(rate.needed(8), 5);
        let after = later.taken_n(8);
        assert_eq!(after.milli_tokens, -3 * MILLI);
        assert_eq!(after.wait_for(1, 2), Duration::from_secs(2));
        for bad in [(0, None), (1, Some(0)), (MAX_PUBLISH_RATE + 1, None)] {
            assert!(PublishRate::new(bad.0, bad.1, "x").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_clock_stepped_back_refills_from_its_own_time() {
        let hour = 3_600_000;
        let empty = TokenBucket::full_of(2, hour).taken_n(2);
        // A clock 300 ms behind: no refill, and the last refill stays put.
        let skewed = empty.rewound(hour - 300).refilled(2, hour - 300);
        assert!(!skewed.has_tokens(1));
        assert_eq!(skewed.refilled_at_ms, hour);
        // Stepped back an hour: a second later, a second's tokens, not an hour's wait.
        let stepped = empty.rewound(0).refilled(2, 0);
        let stepped = stepped.rewound(1000).refilled(2, 1000);
        assert!(stepped.has_tokens(2), "{stepped:?}");
        // A shared bucket is not moved back: two instances a few seconds apart taking in
        // turn get no more than the rate.
        let (mut shared, mut granted) = (TokenBucket::full_of(2, hour), 0);
        for turn in 0..40i64 {
            let now = hour + turn * 50 - if turn % 2 == 0 { 5_000 } else { 0 };
            shared = shared.refilled(2, now);
            if shared.has_tokens(1) {
                shared = shared.taken_n(1);
                granted += 1;
            }
        }
        assert!(granted <= 2 + 4, "{granted} granted in 2 s at 2/s");
    }

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
