//! The embedded queue: a bounded window of in-memory lanes over the store's pending deliveries.
//!
//! Due work sits in per-endpoint lanes; the dispatcher takes from lanes round-robin across
//! accounts, then across an account's endpoints, and only from endpoints below their
//! in-flight cap and with a rate-limit token. A saturated endpoint's backlog never holds a
//! worker, and an account holding its share of the dispatcher's leases waits for them to
//! complete while the others are taken. The store stays the source of truth and the window
//! holds only part of it (see [`WindowLimits`]): what does not fit stays in the store, and
//! `queue::window` pages it back in by due time as room frees up. Enqueueing a known
//! delivery again is a no-op, except a replay of one whose lease is still out (its attempt
//! has just ended it): that is queued when the lease completes.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque},
    sync::Mutex,
    time::Duration,
};

use async_trait::async_trait;
use tokio::sync::Notify;

use super::{Queue, QueueError};
use crate::{
    clock::{to_millis, Timestamp},
    domain::{rate, AccountId, DeliveryId, EndpointId},
    store::PendingRef,
};

/// An endpoint's rate limit in the lanes (the rule is `domain::rate`).
#[derive(Debug)]
struct TokenBucket {
    per_second: u32,
    bucket: rate::TokenBucket,
}

impl TokenBucket {
    fn new(per_second: u32, now_ms: i64) -> Self {
        Self {
            per_second,
            bucket: rate::TokenBucket::full(per_second, now_ms),
        }
    }

    fn has_token(&mut self, now_ms: i64) -> bool {
        // This process's own bucket: a clock stepped back moves it back too.
        self.bucket = self
            .bucket
            .rewound(now_ms)
            .refilled(self.per_second, now_ms);
        self.bucket.has_token()
    }

    fn take(&mut self) {
        self.bucket = self.bucket.taken();
    }

    fn next_token_ms(&self) -> i64 {
        self.bucket.next_token_ms(self.per_second)
    }
}

#[derive(Debug)]
struct EndpointLane {
    account: AccountId,
    due: VecDeque<PendingRef>,
    in_flight: u32,
    max_in_flight: u32,
    listed: bool,
    waiting_for_token: bool,
}

impl EndpointLane {
    fn below_cap(&self) -> bool {
        self.in_flight < self.max_in_flight
    }
}

#[derive(Debug, Default)]
struct AccountLane {
    ready_endpoints: VecDeque<EndpointId>,
    listed: bool,
}

/// A pending delivery's place in due order: due time (ms), then id. The window's pages and
/// its horizon are in this order.
pub type DueKey = (i64, DeliveryId);

fn due_key(item: &PendingRef) -> DueKey {
    (to_millis(item.due), item.delivery_id.clone())
}

/// How much of the backlog the window keeps in memory. The rest stays in the store only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimits {
    /// Deliveries not yet due, earliest first; later ones are dropped and paged in again.
    pub waiting: usize,
    /// Due deliveries across all lanes; past this each lane is held to `lane_floor`. Below
    /// it a lane takes all its due work (a busy healthy endpoint never waits on the store).
    pub due: usize,
    /// Rows one read of a spilled lane's work brings back.
    pub refill: usize,
    /// Due deliveries a lane may always hold, however full the window: a healthy endpoint
    /// always has its next work in memory, behind no other endpoint's backlog.
    pub lane_floor: usize,
}

// An entry costs about half a kilobyte (its ids, twice over with the set of known ones):
// 30,000 hold some 15 MB. Due work still feeds 1,250 endpoints' lanes at their floor, and
// a healthy endpoint's lane takes all its due work until the due total is reached. W5 at a
// fifth of its size (with the store's page cache halved too) peaked at 121 MB of RSS, not
// 142 MB as with 20,000 + 40,000, at the same rates; W1's rate did not change (A/B).
impl Default for WindowLimits {
    fn default() -> Self {
        Self {
            waiting: 10_000,
            due: 20_000,
            refill: 1_024,
            lane_floor: 16,
        }
    }
}

/// Sent and unrecorded deliveries held apart until their resend time. While the store
/// refuses records, the dispatcher sends one probe at a time and each takes its record's
/// retries (2 minutes), so this is reached only after days of that.
const HELD_MAX: usize = 10_000;

/// Buckets of endpoints with no lane kept before any is looked at to be dropped.
const SPARE_BUCKETS: usize = 1024;

/// How long an endpoint's bucket takes to refill from empty: it holds one second's tokens.
/// A bucket left alone this long is full (a clock step either way counts as that too).
const BUCKET_REFILL_MS: i64 = 1000;

#[derive(Debug, Default)]
struct Lanes {
    limits: WindowLimits,
    /// Queued (waiting or due) or in flight; enqueueing these again is a no-op (but see
    /// `after_lease`).
    known: HashSet<DeliveryId>,
    /// Not yet due, in due order.
    waiting: BTreeMap<DueKey, PendingRef>,
    /// Sent but not recorded, keyed by when they may be sent again. The store's row still
    /// reads as due, so they stay known (every read of the store skips them), and apart
    /// from `waiting`, whose bound drops its latest entries to be read again.
    unrecorded: BTreeMap<DueKey, PendingRef>,
    /// How many of `unrecorded` each endpoint has: a spilled lane's read returns their rows
    /// first (still due in the store), so it reads as many more.
    unrecorded_of: HashMap<EndpointId, usize>,
    /// `None`: every pending delivery not yet due is in `waiting`. `Some(k)`: those before
    /// `k` are; from `k` on, some may be in the store only.
    horizon: Option<DueKey>,
    /// The lowest key dropped since the current page of the horizon was read.
    dropped_since_read: Option<DueKey>,
    /// Endpoints with due deliveries in the store only (their lane was full).
    spilled: HashSet<EndpointId>,
    /// Spilled endpoints whose lanes ran low, and the horizon: work for `queue::window`.
    refill_wanted: bool,
    due_total: usize,
    token_timers: BinaryHeap<Reverse<(i64, EndpointId)>>,
    endpoints: HashMap<EndpointId, EndpointLane>,
    /// Rate-limit buckets outlive lanes: a lane is dropped whenever it runs empty, and a
    /// fresh full bucket each time would let trickling traffic ignore the limit. One whose
    /// lane is gone is dropped once full again (see [`Lanes::forget_full_buckets`]).
    buckets: HashMap<EndpointId, TokenBucket>,
    /// When buckets without a lane were last looked for.
    buckets_swept_ms: i64,
    accounts: HashMap<AccountId, AccountLane>,
    ready_accounts: VecDeque<AccountId>,
    in_flight_total: usize,
    /// Leases whose endpoint slot was given back before the lease completed.
    slot_released: HashSet<DeliveryId>,
    /// Leases taken and not completed.
    leased: HashSet<DeliveryId>,
    /// Deliveries a replay queued while leased (the attempt had just ended them, and the
    /// lease was not yet completed): queued when the lease completes.
    after_lease: HashMap<DeliveryId, PendingRef>,
    /// The dispatcher's bound on leases taken and not completed (each holds a recording
    /// permit until its attempt is written); 0 when none is shared out.
    in_flight_bound: usize,
    /// Leases taken and not completed, by account.
    outstanding: HashMap<AccountId, usize>,
    /// Accounts with ready work that hold their share of `in_flight_bound`: listed again
    /// as their leases complete.
    held: HashSet<AccountId>,
}

/// A delivery handed to a worker; give it back with [`EmbeddedQueue::complete`].
pub type Lease = PendingRef;

/// Figures for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    pub waiting: usize,
    pub due: usize,
    pub in_flight: usize,
}

impl Lanes {
    /// [`Lanes::add`] for a replay: one of a leased delivery is kept for the lease's end.
    /// Only a replay: everything else that queues a leased delivery (the window's reads of
    /// the store, whose row is pending while it is tried; a fan-out's repeat) would send
    /// it again before its schedule says so.
    fn add_replayed(&mut self, item: PendingRef) {
        if self.leased.contains(&item.delivery_id) {
            self.after_lease.insert(item.delivery_id.clone(), item);
        } else {
            self.add(item);
        }
    }

    fn add(&mut self, item: PendingRef) {
        if !self.known.insert(item.delivery_id.clone()) {
            return;
        }
        self.waiting.insert(due_key(&item), item);
        if self.waiting.len() > self.limits.waiting.max(1) {
            if let Some((key, dropped)) = self.waiting.pop_last() {
                self.known.remove(&dropped.delivery_id);
                self.lower_horizon(key);
            }
        }
    }

    /// After [`Lanes::complete`], under the same lock: no read of the store comes between.
    fn hold(&mut self, item: PendingRef) {
        self.known.insert(item.delivery_id.clone());
        *self
            .unrecorded_of
            .entry(item.endpoint_id.clone())
            .or_default() += 1;
        self.unrecorded.insert(due_key(&item), item);
        if self.unrecorded.len() > HELD_MAX {
            // Forgotten, it is read from the store as due: sent again early, never lost.
            if let Some((_, dropped)) = self.unrecorded.pop_last() {
                self.known.remove(&dropped.delivery_id);
                self.unheld(&dropped.endpoint_id);
            }
        }
    }

    fn unheld(&mut self, endpoint: &EndpointId) {
        if let Some(count) = self.unrecorded_of.get_mut(endpoint) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.unrecorded_of.remove(endpoint);
            }
        }
    }

    fn lower_horizon(&mut self, key: DueKey) {
        let lower = |current: &mut Option<DueKey>| {
            if current.as_ref().is_none_or(|c| key < *c) {
                *current = Some(key.clone());
            }
        };
        lower(&mut self.horizon);
        lower(&mut self.dropped_since_read);
        self.refill_wanted = true;
    }

    fn promote_due(&mut self, now_ms: i64) {
        while let Some(entry) = self.unrecorded.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let item = entry.remove();
            self.unheld(&item.endpoint_id);
            self.make_due(item, now_ms);
        }
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let item = entry.remove();
            self.make_due(item, now_ms);
        }
        if self.needs_next_page(now_ms) {
            self.refill_wanted = true;
        }
        while let Some(Reverse((at, _))) = self.token_timers.peek() {
            // One further ahead than a bucket ever waits was set before the clock stepped
            // back: it goes now, and the bucket (rewound too) says whether a token is there.
            if *at > now_ms && *at <= now_ms.saturating_add(BUCKET_REFILL_MS) {
                break;
            }
            if let Some(Reverse((_, endpoint))) = self.token_timers.pop() {
                if let Some(lane) = self.endpoints.get_mut(&endpoint) {
                    lane.waiting_for_token = false;
                }
                self.list_if_ready(&endpoint, now_ms);
            }
        }
    }

    /// The store holds work the window should see next: the waiting list ran low, or
    /// deliveries past the horizon are already due.
    fn needs_next_page(&self, now_ms: i64) -> bool {
        self.horizon
            .as_ref()
            .is_some_and(|(due, _)| self.waiting.len() < self.limits.waiting / 2 || *due <= now_ms)
    }

    /// Whether a lane holding `lane_len` due deliveries takes one more.
    fn lane_room(&self, lane_len: usize) -> bool {
        lane_len < self.limits.lane_floor || self.due_total < self.limits.due
    }

    /// A spilled lane this short asks for its work from the store.
    fn low_mark(&self) -> usize {
        if self.due_total < self.limits.due {
            (self.limits.refill / 2).max(1)
        } else {
            (self.limits.lane_floor / 2).max(1)
        }
    }

    fn make_due(&mut self, item: PendingRef, now_ms: i64) {
        let queued = self
            .endpoints
            .get(&item.endpoint_id)
            .map_or(0, |l| l.due.len());
        if !self.lane_room(queued) {
            // The row stays pending in the store; the lane asks for it when it runs low.
            self.known.remove(&item.delivery_id);
            self.spilled.insert(item.endpoint_id.clone());
            return;
        }
        let lane = self
            .endpoints
            .entry(item.endpoint_id.clone())
            .or_insert_with(|| EndpointLane {
                account: item.account_id.clone(),
                due: VecDeque::new(),
                in_flight: 0,
                max_in_flight: item.max_in_flight.max(1),
                listed: false,
                waiting_for_token: false,
            });
        lane.max_in_flight = item.max_in_flight.max(1);
        match item.rate_limit_per_second {
            None => {
                self.buckets.remove(&item.endpoint_id);
            }
            Some(rate) => {
                let current = self.buckets.get(&item.endpoint_id).map(|b| b.per_second);
                if current != Some(rate) {
                    self.buckets
                        .insert(item.endpoint_id.clone(), TokenBucket::new(rate, now_ms));
                }
            }
        }
        let endpoint_id = item.endpoint_id.clone();
        lane.due.push_back(item);
        self.due_total += 1;
        self.list_if_ready(&endpoint_id, now_ms);
    }

    /// Puts an endpoint on its account's ready list if it can take work now.
    fn list_if_ready(&mut self, endpoint: &EndpointId, now_ms: i64) {
        let Some(lane) = self.endpoints.get_mut(endpoint) else {
            return;
        };
        if lane.listed || lane.waiting_for_token || lane.due.is_empty() || !lane.below_cap() {
            return;
        }
        if let Some(bucket) = self.buckets.get_mut(endpoint) {
            if !bucket.has_token(now_ms) {
                lane.waiting_for_token = true;
                self.token_timers
                    .push(Reverse((bucket.next_token_ms(), endpoint.clone())));
                return;
            }
        }
        lane.listed = true;
        let account_id = lane.account.clone();
        let account = self.accounts.entry(account_id.clone()).or_default();
        account.ready_endpoints.push_back(endpoint.clone());
        if !account.listed {
            account.listed = true;
            self.ready_accounts.push_back(account_id);
        }
    }

    /// The leases one account may hold at once: an equal part of `in_flight_bound` among
    /// the accounts holding any, with room for one more. In an outage the failing accounts'
    /// records wait behind their publishes in the one writer; without shares their leases
    /// held every permit, and nothing was taken for a healthy account until records were
    /// written.
    fn share(&self) -> usize {
        if self.in_flight_bound == 0 {
            return usize::MAX;
        }
        (self.in_flight_bound / (self.outstanding.len() + 1)).max(1)
    }

    fn holds_its_share(&self, account: &AccountId) -> bool {
        self.outstanding.get(account).copied().unwrap_or(0) >= self.share()
    }

    /// Lists again the held accounts now below their share, after a lease of `completed`
    /// completed: only that account can have dropped below it, unless an account stopped
    /// holding any and every share grew. (Looking at every held account on every
    /// completion cost as much as accounts held.)
    fn release_held(&mut self, completed: &AccountId, shares_grew: bool) {
        let below: Vec<AccountId> = if shares_grew {
            let share = self.share();
            self.held
                .iter()
                .filter(|a| self.outstanding.get(*a).copied().unwrap_or(0) < share)
                .cloned()
                .collect()
        } else if self.held.contains(completed) && !self.holds_its_share(completed) {
            vec![completed.clone()]
        } else {
            Vec::new()
        };
        for account_id in below {
            self.held.remove(&account_id);
            let Some(account) = self.accounts.get_mut(&account_id) else {
                continue;
            };
            if !account.listed && !account.ready_endpoints.is_empty() {
                account.listed = true;
                self.ready_accounts.push_back(account_id);
            }
        }
    }

    fn take(&mut self, now_ms: i64) -> Option<Lease> {
        while let Some(account_id) = self.ready_accounts.pop_front() {
            if self.holds_its_share(&account_id) {
                if let Some(account) = self.accounts.get_mut(&account_id) {
                    account.listed = false;
                }
                self.held.insert(account_id);
                continue;
            }
            let Some(account) = self.accounts.get_mut(&account_id) else {
                continue;
            };
            account.listed = false;
            let Some(endpoint_id) = account.ready_endpoints.pop_front() else {
                self.accounts.remove(&account_id);
                continue;
            };
            let account_has_more = !account.ready_endpoints.is_empty();
            if account_has_more {
                account.listed = true;
                self.ready_accounts.push_back(account_id.clone());
            }
            let Some(lane) = self.endpoints.get_mut(&endpoint_id) else {
                continue;
            };
            lane.listed = false;
            let Some(lease) = lane.due.pop_front() else {
                continue;
            };
            self.due_total = self.due_total.saturating_sub(1);
            let remaining = lane.due.len();
            lane.in_flight += 1;
            if remaining < self.low_mark() && self.spilled.contains(&endpoint_id) {
                self.refill_wanted = true;
            }
            if let Some(bucket) = self.buckets.get_mut(&endpoint_id) {
                bucket.take();
            }
            self.in_flight_total += 1;
            self.leased.insert(lease.delivery_id.clone());
            *self
                .outstanding
                .entry(lease.account_id.clone())
                .or_default() += 1;
            self.list_if_ready(&endpoint_id, now_ms);
            return Some(lease);
        }
        None
    }

    fn release_slot(&mut self, lease: &Lease, now_ms: i64) {
        if self.slot_released.insert(lease.delivery_id.clone()) {
            self.free_endpoint_slot(lease, now_ms);
        }
    }

    fn complete(&mut self, lease: &Lease, now_ms: i64) {
        self.known.remove(&lease.delivery_id);
        self.leased.remove(&lease.delivery_id);
        if let Some(again) = self.after_lease.remove(&lease.delivery_id) {
            self.add(again);
        }
        self.in_flight_total = self.in_flight_total.saturating_sub(1);
        let mut shares_grew = false;
        if let Some(count) = self.outstanding.get_mut(&lease.account_id) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.outstanding.remove(&lease.account_id);
                shares_grew = true;
            }
        }
        if !self.held.is_empty() {
            self.release_held(&lease.account_id, shares_grew);
        }
        if !self.slot_released.remove(&lease.delivery_id) {
            self.free_endpoint_slot(lease, now_ms);
        }
    }

    fn free_endpoint_slot(&mut self, lease: &Lease, now_ms: i64) {
        let Some(lane) = self.endpoints.get_mut(&lease.endpoint_id) else {
            return;
        };
        lane.in_flight = lane.in_flight.saturating_sub(1);
        if lane.in_flight == 0 && lane.due.is_empty() && !lane.waiting_for_token {
            self.endpoints.remove(&lease.endpoint_id);
            self.forget_full_buckets(now_ms);
            return;
        }
        self.list_if_ready(&lease.endpoint_id, now_ms);
    }

    /// Drops the buckets of endpoints with no lane that have refilled: a full bucket is what
    /// a new lane would start with, so nothing is lost, and the buckets of endpoints quiet,
    /// disabled or deleted no longer stay for the life of the process. Looked for once
    /// there are [`SPARE_BUCKETS`] more buckets than lanes, at most once a second.
    fn forget_full_buckets(&mut self, now_ms: i64) {
        if self.buckets.len() <= self.endpoints.len() + SPARE_BUCKETS
            || now_ms.abs_diff(self.buckets_swept_ms) < BUCKET_REFILL_MS.unsigned_abs()
        {
            return;
        }
        self.buckets_swept_ms = now_ms;
        let endpoints = &self.endpoints;
        self.buckets.retain(|endpoint, bucket| {
            endpoints.contains_key(endpoint)
                || now_ms.abs_diff(bucket.bucket.refilled_at_ms) < BUCKET_REFILL_MS.unsigned_abs()
        });
    }

    fn next_wake_ms(&self) -> Option<i64> {
        let first = |list: &BTreeMap<DueKey, PendingRef>| list.first_key_value().map(|(k, _)| k.0);
        [
            first(&self.waiting),
            first(&self.unrecorded),
            self.token_timers.peek().map(|Reverse((at, _))| *at),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// The in-process queue and scheduler of the embedded shape.
#[derive(Debug, Default)]
pub struct EmbeddedQueue {
    lanes: Mutex<Lanes>,
    wake: Notify,
    /// Signalled when the window wants work paged in from the store (`queue::window`).
    refill: Notify,
}

impl EmbeddedQueue {
    pub fn new() -> Self {
        Self::with_limits(WindowLimits::default())
    }

    pub fn with_limits(limits: WindowLimits) -> Self {
        Self {
            lanes: Mutex::new(Lanes {
                limits,
                ..Lanes::default()
            }),
            ..Self::default()
        }
    }

    fn with_lanes<T>(&self, f: impl FnOnce(&mut Lanes) -> T) -> T {
        let mut guard = match self.lanes.lock() {
            Ok(guard) => guard,
            // The lanes hold no invariant a panic mid-update could break badly enough to
            // lose deliveries: the store and the window's resync are the backstop.
            Err(poisoned) => poisoned.into_inner(),
        };
        let result = f(&mut guard);
        if std::mem::take(&mut guard.refill_wanted) {
            self.refill.notify_one();
        }
        result
    }

    /// Shares `bound` leases (taken and not yet completed) out among the accounts holding
    /// any: the dispatcher's recording permits, so that no account's backlog holds them
    /// all.
    pub fn share_in_flight(&self, bound: usize) {
        self.with_lanes(|lanes| lanes.in_flight_bound = bound);
    }

    pub fn limits(&self) -> WindowLimits {
        self.with_lanes(|lanes| lanes.limits)
    }

    /// Forgets what the window knows of the store: every pending delivery is paged in again
    /// from the earliest due (known ones are skipped). On start, and as the periodic backstop.
    pub fn resync(&self) {
        self.with_lanes(|lanes| {
            lanes.horizon = Some((i64::MIN, DeliveryId::from_trusted(String::new())));
            lanes.refill_wanted = true;
        });
    }

    /// Waits until the window asks for work from the store.
    pub async fn refill_requested(&self) {
        self.refill.notified().await;
    }

    /// Spilled endpoints whose lanes ran low (at most `max`), each with how many of its
    /// earliest due rows to read; they count as refilled from now on.
    pub fn spilled_to_refill(&self, max: usize) -> Vec<(EndpointId, u32)> {
        self.with_lanes(|lanes| {
            let low = lanes.low_mark();
            let ready: Vec<EndpointId> = lanes
                .spilled
                .iter()
                .filter(|e| lanes.endpoints.get(*e).is_none_or(|l| l.due.len() < low))
                .take(max)
                .cloned()
                .collect();
            ready
                .into_iter()
                .map(|endpoint| {
                    lanes.spilled.remove(&endpoint);
                    let held = lanes
                        .endpoints
                        .get(&endpoint)
                        .map_or(0, |l| l.due.len() + l.in_flight as usize)
                        + lanes.unrecorded_of.get(&endpoint).copied().unwrap_or(0);
                    // A full window holds each lane to its floor: read no more than fits.
                    let room = if lanes.due_total < lanes.limits.due {
                        lanes.limits.refill
                    } else {
                        lanes.limits.lane_floor
                    };
                    let limit = u32::try_from(room + held).unwrap_or(u32::MAX);
                    (endpoint, limit)
                })
                .collect()
        })
    }

    /// Marks an endpoint spilled again: its refill failed, or read as many rows as it asked
    /// for and may have left some in the store.
    pub fn respill(&self, endpoint: EndpointId) {
        self.with_lanes(|lanes| {
            lanes.spilled.insert(endpoint);
        });
    }

    /// Where the next page of the store's pending deliveries starts, if one is wanted now.
    pub fn next_page_from(&self, now: Timestamp) -> Option<DueKey> {
        let now_ms = to_millis(now);
        self.with_lanes(|lanes| {
            // What is due leaves the waiting list first: the page is then read for room
            // that is really free, and due rows past the horizon come before waiting ones.
            lanes.promote_due(now_ms);
            if !lanes.needs_next_page(now_ms) {
                return None;
            }
            lanes.dropped_since_read = None;
            lanes.horizon.clone()
        })
    }

    /// Adds a page read from [`EmbeddedQueue::next_page_from`]; `end` is the key of its last
    /// row if the page was full (the store may hold more from there), `None` if it was not.
    /// Returns how many of its rows the window kept (new, and not dropped for want of room).
    pub fn add_page(&self, items: Vec<PendingRef>, end: Option<DueKey>, now: Timestamp) -> usize {
        let now_ms = to_millis(now);
        let kept = self.with_lanes(|lanes| {
            let ids: Vec<DeliveryId> = items
                .iter()
                .filter(|i| !lanes.known.contains(&i.delivery_id))
                .map(|i| i.delivery_id.clone())
                .collect();
            for item in items {
                lanes.add(item);
            }
            lanes.promote_due(now_ms);
            let dropped = lanes.dropped_since_read.take();
            lanes.horizon = match (end, dropped) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            ids.iter().filter(|id| lanes.known.contains(*id)).count()
        });
        self.wake.notify_one();
        kept
    }

    pub fn add(&self, items: Vec<PendingRef>) {
        self.with_lanes(|lanes| {
            for item in items {
                lanes.add(item);
            }
        });
        self.wake.notify_one();
    }

    /// [`EmbeddedQueue::add`] for deliveries a replay made pending again.
    pub fn add_replayed(&self, items: Vec<PendingRef>) {
        self.with_lanes(|lanes| {
            for item in items {
                lanes.add_replayed(item);
            }
        });
        self.wake.notify_one();
    }

    /// Takes the next delivery that may be attempted now, if any.
    pub fn try_take(&self, now: Timestamp) -> Option<Lease> {
        let now_ms = to_millis(now);
        self.with_lanes(|lanes| {
            lanes.promote_due(now_ms);
            lanes.take(now_ms)
        })
    }

    /// Waits until a delivery may be attempted and takes it. `now` is read on every pass.
    pub async fn take(&self, now: impl Fn() -> Timestamp) -> Lease {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let current = now();
            let now_ms = to_millis(current);
            let (lease, wake_ms) = self.with_lanes(|lanes| {
                lanes.promote_due(now_ms);
                (lanes.take(now_ms), lanes.next_wake_ms())
            });
            if let Some(lease) = lease {
                return lease;
            }
            let sleep_for = wake_ms
                .map(|at| Duration::from_millis(u64::try_from(at - now_ms).unwrap_or(0).max(1)))
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep(sleep_for) => {}
            }
        }
    }

    /// Frees a lease's endpoint slot once the endpoint has answered, while the attempt is
    /// still being recorded: the cap bounds requests at the endpoint, and waiting for the
    /// store's commit as well held each slot about a third longer under load (W1).
    /// The delivery stays known (not queued again) until [`EmbeddedQueue::complete`].
    pub fn release_slot(&self, lease: &Lease, now: Timestamp) {
        let now_ms = to_millis(now);
        self.with_lanes(|lanes| lanes.release_slot(lease, now_ms));
        self.wake.notify_one();
    }

    /// Returns a lease: frees the endpoint's slot (unless released already) and forgets
    /// the delivery.
    pub fn complete(&self, lease: &Lease, now: Timestamp) {
        let now_ms = to_millis(now);
        self.with_lanes(|lanes| lanes.complete(lease, now_ms));
        self.wake.notify_one();
    }

    /// Returns the lease of a webhook sent whose attempt could not be recorded: its row still
    /// reads as due in the store, and sending it again before `resend_at` is a duplicate.
    pub fn complete_holding(&self, lease: &Lease, resend_at: Timestamp, now: Timestamp) {
        let (now_ms, mut again) = (to_millis(now), lease.clone());
        again.due = resend_at;
        self.with_lanes(|lanes| {
            // A replay queued meanwhile (another writer ended the row, then a person asked
            // for it again) made it pending anew: it goes as the replay asked.
            let replayed = lanes.after_lease.contains_key(&lease.delivery_id);
            lanes.complete(lease, now_ms);
            if !replayed {
                lanes.hold(again);
            }
        });
        self.wake.notify_one();
    }

    pub fn stats(&self) -> QueueStats {
        self.with_lanes(|lanes| QueueStats {
            waiting: lanes.waiting.len() + lanes.unrecorded.len(),
            due: lanes.due_total,
            in_flight: lanes.in_flight_total,
        })
    }

    pub fn is_known(&self, delivery: &DeliveryId) -> bool {
        self.with_lanes(|lanes| lanes.known.contains(delivery))
    }
}

#[async_trait]
impl Queue for EmbeddedQueue {
    async fn enqueue(&self, items: Vec<PendingRef>) -> Result<(), QueueError> {
        self.add(items);
        Ok(())
    }

    async fn enqueue_replayed(&self, items: Vec<PendingRef>) -> Result<(), QueueError> {
        self.add_replayed(items);
        Ok(())
    }

    async fn update_lane(
        &self,
        endpoint: &EndpointId,
        max_in_flight: u32,
        rate_limit_per_second: Option<u32>,
    ) {
        let now_ms = to_millis(chrono::Utc::now());
        self.with_lanes(|lanes| {
            if let Some(lane) = lanes.endpoints.get_mut(endpoint) {
                lane.max_in_flight = max_in_flight.max(1);
                lane.waiting_for_token = false;
            }
            match rate_limit_per_second {
                Some(rate) => {
                    lanes
                        .buckets
                        .insert(endpoint.clone(), TokenBucket::new(rate, now_ms));
                }
                None => {
                    lanes.buckets.remove(endpoint);
                }
            }
            lanes.list_if_ready(endpoint, now_ms);
        });
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_millis;

    fn item(delivery: &str, endpoint: &str, account: &str, due_ms: i64, cap: u32) -> PendingRef {
        PendingRef {
            delivery_id: DeliveryId::from_trusted(delivery.into()),
            endpoint_id: EndpointId::from_trusted(endpoint.into()),
            account_id: AccountId::from_trusted(account.into()),
            due: from_millis(due_ms),
            max_in_flight: cap,
            rate_limit_per_second: None,
        }
    }

    fn drain(queue: &EmbeddedQueue, now_ms: i64) -> Vec<Lease> {
        std::iter::from_fn(|| queue.try_take(from_millis(now_ms))).collect()
    }

    /// An account whose leases hold its share of the dispatcher's bound waits, and the
    /// others are taken meanwhile; it is taken again as its leases complete.
    #[test]
    fn an_account_holding_its_share_waits_and_the_others_go_on() {
        let queue = EmbeddedQueue::new();
        queue.share_in_flight(8);
        queue.add(
            (0..20)
                .map(|n| item(&format!("a{n}"), &format!("ea{n}"), "busy", 0, 4))
                .collect(),
        );
        queue.add(vec![item("b0", "eb", "quiet", 0, 4)]);
        let of = |leases: &[Lease], account: &str| {
            leases
                .iter()
                .filter(|l| l.account_id.as_str() == account)
                .count()
        };
        // Shares: 8 while nobody holds any, 4 with one account holding, 2 with two.
        let first = drain(&queue, 0);
        assert_eq!(of(&first, "quiet"), 1, "the quiet account is taken at once");
        assert_eq!(of(&first, "busy"), 2, "the busy one up to its share");
        assert!(queue.try_take(from_millis(0)).is_none(), "held, not lost");

        let quiet = first
            .iter()
            .find(|l| l.account_id.as_str() == "quiet")
            .unwrap();
        queue.complete(quiet, from_millis(1));
        let second = drain(&queue, 1);
        assert_eq!(of(&second, "busy"), 2, "listed again: its share is 4 now");

        for lease in first
            .iter()
            .chain(&second)
            .filter(|l| l.account_id.as_str() == "busy")
        {
            queue.complete(lease, from_millis(2));
        }
        let rest = drain(&queue, 2);
        assert_eq!(
            of(&rest, "busy"),
            4,
            "alone, its share is 4 once it holds any"
        );
        assert_eq!(queue.stats().in_flight, 4);
    }

    /// A held account is listed again as soon as one of its leases completes, while it
    /// still holds others.
    #[test]
    fn a_held_account_is_taken_again_after_one_of_its_leases_completes() {
        let queue = EmbeddedQueue::new();
        queue.share_in_flight(4);
        queue.add(
            (0..10)
                .map(|n| item(&format!("a{n}"), &format!("ea{n}"), "busy", 0, 4))
                .collect(),
        );
        // Its share is 4 while it holds none, 2 once it holds any.
        let first = drain(&queue, 0);
        assert_eq!(first.len(), 2);
        queue.complete(&first[0], from_millis(1));
        assert_eq!(
            drain(&queue, 1).len(),
            1,
            "listed again at one below its share"
        );
    }

    #[test]
    fn nothing_before_its_time() {
        let queue = EmbeddedQueue::new();
        queue.add(vec![item("d1", "e1", "a", 1_000, 4)]);
        assert!(queue.try_take(from_millis(999)).is_none());
        assert_eq!(
            queue
                .try_take(from_millis(1_000))
                .unwrap()
                .delivery_id
                .as_str(),
            "d1"
        );
    }

    #[test]
    fn cap_holds_and_completion_frees_a_slot() {
        let queue = EmbeddedQueue::new();
        let items = (0..10)
            .map(|i| item(&format!("d{i}"), "slow", "a", 0, 4))
            .collect();
        queue.add(items);
        let taken = drain(&queue, 0);
        assert_eq!(taken.len(), 4);
        queue.complete(&taken[0], from_millis(1));
        let next = drain(&queue, 1);
        assert_eq!(next.len(), 1);
        assert_eq!(
            queue.stats(),
            QueueStats {
                waiting: 0,
                due: 5,
                in_flight: 4
            }
        );
    }

    /// A replay asked for between an attempt's record (which ended the delivery) and the
    /// lease's completion is queued once the lease completes, not dropped as known: it was
    /// left to the periodic sweep (an end-to-end replay test waited 30 s for it). A page of
    /// the store, or any other enqueue, meanwhile still skips the leased delivery: its row
    /// is pending while it is tried, and queuing it for later would send it again early.
    #[test]
    fn a_replay_of_a_leased_delivery_is_queued_when_the_lease_completes() {
        let queue = EmbeddedQueue::new();
        queue.add(vec![
            item("d1", "e1", "a", 0, 4),
            item("d2", "e1", "a", 0, 4),
        ]);
        let taken = drain(&queue, 0);
        assert_eq!(taken.len(), 2);
        queue.add_replayed(vec![item("d1", "e1", "a", 1, 4)]);
        queue.add_page(vec![item("d1", "e1", "a", 0, 4)], None, from_millis(1));
        queue.add_page(vec![item("d2", "e1", "a", 0, 4)], None, from_millis(1));
        queue.add(vec![item("d2", "e1", "a", 0, 4)]);
        assert!(drain(&queue, 1).is_empty(), "not twice at once");
        queue.complete(&taken[0], from_millis(2));
        queue.complete(&taken[1], from_millis(2));
        let again = drain(&queue, 2);
        assert_eq!(again.len(), 1, "only the replay is queued: {again:?}");
        assert_eq!(
            (again[0].delivery_id.as_str(), again[0].due),
            ("d1", from_millis(1)),
            "the replay's"
        );
        queue.complete(&again[0], from_millis(3));
        assert!(drain(&queue, 3).is_empty(), "and only once");
    }

    #[test]
    fn a_released_slot_is_taken_again_and_completion_does_not_free_it_twice() {
        let queue = EmbeddedQueue::new();
        let items = (0..10)
            .map(|i| item(&format!("d{i}"), "e1", "a", 0, 2))
            .collect();
        queue.add(items);
        let taken = drain(&queue, 0);
        assert_eq!(taken.len(), 2);
        queue.release_slot(&taken[0], from_millis(1));
        queue.release_slot(&taken[0], from_millis(1));
        assert_eq!(drain(&queue, 1).len(), 1, "one slot freed, once");
        assert!(
            queue.is_known(&taken[0].delivery_id),
            "still known until complete"
        );
        queue.complete(&taken[0], from_millis(2));
        assert!(!queue.is_known(&taken[0].delivery_id));
        assert!(
            drain(&queue, 2).is_empty(),
            "completing a released lease frees nothing"
        );
        queue.complete(&taken[1], from_millis(3));
        assert_eq!(drain(&queue, 3).len(), 1);
    }

    #[test]
    fn saturated_endpoint_does_not_block_others() {
        let queue = EmbeddedQueue::new();
        let mut items: Vec<_> = (0..100)
            .map(|i| item(&format!("s{i}"), "slow", "big", 0, 2))
            .collect();
        items.push(item("h1", "healthy", "big", 0, 4));
        queue.add(items);
        let taken: Vec<_> = drain(&queue, 0)
            .into_iter()
            .map(|l| l.delivery_id.to_string())
            .collect();
        assert_eq!(taken.len(), 3);
        assert!(taken.contains(&"h1".to_string()));
    }

    #[test]
    fn accounts_take_turns() {
        let queue = EmbeddedQueue::new();
        // One account with a large backlog over many endpoints, then a small account.
        let mut items: Vec<_> = (0..1000)
            .map(|i| item(&format!("b{i}"), &format!("be{}", i % 50), "big", 0, 100))
            .collect();
        items.push(item("s1", "se", "small", 0, 4));
        queue.add(items);
        let first_two: Vec<_> = (0..2)
            .map(|_| queue.try_take(from_millis(0)).unwrap())
            .collect();
        assert!(
            first_two.iter().any(|l| l.account_id.as_str() == "small"),
            "{first_two:?}"
        );
    }

    #[test]
    fn duplicates_are_ignored_until_completed() {
        let queue = EmbeddedQueue::new();
        queue.add(vec![item("d1", "e", "a", 0, 4)]);
        queue.add(vec![item("d1", "e", "a", 0, 4)]);
        let lease = queue.try_take(from_millis(0)).unwrap();
        queue.add(vec![item("d1", "e", "a", 0, 4)]);
        assert!(queue.try_take(from_millis(0)).is_none());
        queue.complete(&lease, from_millis(0));
        queue.add(vec![item("d1", "e", "a", 10, 4)]);
        assert!(queue.try_take(from_millis(10)).is_some());
    }

    /// `count` deliveries due at 0 to one endpoint limited to 2 requests a second.
    fn limited_to_two_a_second(count: usize) -> Vec<PendingRef> {
        (0..count)
            .map(|i| PendingRef {
                rate_limit_per_second: Some(2),
                ..item(&format!("d{i}"), "e", "a", 0, 100)
            })
            .collect()
    }

    #[test]
    fn rate_limit_spaces_requests() {
        let queue = EmbeddedQueue::new();
        queue.add(limited_to_two_a_second(10));
        let mut taken_at = Vec::new();
        for now in (0..=3000).step_by(50) {
            while let Some(lease) = queue.try_take(from_millis(now)) {
                taken_at.push(now);
                queue.complete(&lease, from_millis(now));
            }
        }
        // Burst of 2, then one every 500 ms.
        assert_eq!(taken_at[..2], [0, 0]);
        assert_eq!(taken_at.len(), 2 + 3000 / 500);
        assert!(
            taken_at.windows(2).skip(1).all(|w| w[1] - w[0] >= 450),
            "{taken_at:?}"
        );
    }

    /// A clock stepped back (NTP) leaves a lane waiting for a token at a time of the old
    /// clock: it is taken again within a bucket's refill, not an hour later.
    #[test]
    fn a_clock_stepped_back_does_not_hold_a_rate_limited_lane_for_the_step() {
        let queue = EmbeddedQueue::new();
        queue.add(limited_to_two_a_second(4));
        let hour = 3_600_000;
        let burst = drain(&queue, hour);
        assert_eq!(burst.len(), 2, "the burst");
        for lease in &burst {
            queue.complete(lease, from_millis(hour));
        }
        assert!(queue.try_take(from_millis(hour)).is_none(), "no token left");
        // The clock goes back an hour.
        let taken = (1_000..=2_000)
            .step_by(50)
            .find_map(|now| queue.try_take(from_millis(now)).map(|_| now));
        assert!(
            taken.is_some(),
            "still waiting for the old clock's token time"
        );
    }

    #[test]
    fn rate_limit_holds_for_trickling_traffic() {
        let queue = EmbeddedQueue::new();
        let mut taken = 0;
        // One delivery at a time, each completed before the next arrives, all at t = 0.
        for i in 0..10 {
            queue.add(vec![PendingRef {
                rate_limit_per_second: Some(2),
                ..item(&format!("d{i}"), "e", "a", 0, 4)
            }]);
            if let Some(lease) = queue.try_take(from_millis(0)) {
                taken += 1;
                queue.complete(&lease, from_millis(0));
            }
        }
        assert_eq!(taken, 2);
    }

    #[test]
    fn the_buckets_of_endpoints_gone_quiet_are_dropped_once_full() {
        let queue = EmbeddedQueue::new();
        let endpoints = 3 * SPARE_BUCKETS;
        let items = (0..endpoints)
            .map(|i| PendingRef {
                rate_limit_per_second: Some(1),
                ..item(&format!("d{i}"), &format!("e{i}"), "a", 0, 4)
            })
            .collect();
        queue.add(items);
        let leases = drain(&queue, 0);
        assert_eq!(leases.len(), endpoints);
        // Completed within the second their buckets were emptied in: all kept.
        for lease in &leases[..endpoints / 2] {
            queue.complete(lease, from_millis(500));
        }
        let buckets = |q: &EmbeddedQueue| q.with_lanes(|lanes| lanes.buckets.len());
        assert_eq!(buckets(&queue), endpoints);
        // A second later the first half are full again, their lanes gone: dropped. The
        // rest still have lanes.
        for lease in &leases[endpoints / 2..] {
            queue.complete(lease, from_millis(1500));
        }
        let left = buckets(&queue);
        assert!(
            left <= endpoints / 2 + SPARE_BUCKETS,
            "{left} buckets kept for {endpoints} endpoints, none with work"
        );
        // A bucket dropped comes back full: the limit still holds for the next work.
        queue.add(vec![PendingRef {
            rate_limit_per_second: Some(1),
            ..item("again", "e0", "a", 0, 4)
        }]);
        queue.add(vec![PendingRef {
            rate_limit_per_second: Some(1),
            ..item("again2", "e0", "a", 0, 4)
        }]);
        assert_eq!(drain(&queue, 1600).len(), 1);
    }

    fn tiny_window() -> EmbeddedQueue {
        EmbeddedQueue::with_limits(WindowLimits {
            waiting: 2,
            due: 2,
            refill: 2,
            lane_floor: 1,
        })
    }

    /// [`tiny_window`] with room for 10 waiting: a lane spills on its due, not its waiting.
    fn tiny_due_window() -> EmbeddedQueue {
        EmbeddedQueue::with_limits(WindowLimits {
            waiting: 10,
            ..tiny_window().limits()
        })
    }

    #[test]
    fn a_delivery_pushed_out_of_the_waiting_list_is_read_again() {
        let queue = tiny_window();
        assert_eq!(queue.next_page_from(from_millis(0)), None, "all in memory");
        queue.add(vec![
            item("d3", "e", "a", 300, 4),
            item("d1", "e", "a", 100, 4),
            item("d2", "e", "a", 200, 4),
        ]);
        assert!(
            !queue.is_known(&DeliveryId::from_trusted("d3".into())),
            "latest pushed out"
        );
        assert_eq!(
            queue.next_page_from(from_millis(0)),
            None,
            "the waiting list is full"
        );
        let from = queue
            .next_page_from(from_millis(200))
            .expect("the store has more");
        assert_eq!(from, (300, DeliveryId::from_trusted("d3".into())));
    }

    #[test]
    fn a_delivery_pushed_out_while_a_page_is_read_is_not_skipped() {
        let queue = tiny_window();
        queue.resync();
        let from = queue.next_page_from(from_millis(0)).expect("a page");
        assert_eq!(from.0, i64::MIN);
        // While the page (rows due 500 and 600, a full page) is being read, two earlier
        // deliveries arrive and push the one due at 400 out.
        queue.add(vec![item("d4", "e4", "a", 400, 4)]);
        queue.add(vec![
            item("d1", "e1", "a", 100, 4),
            item("d2", "e2", "a", 200, 4),
        ]);
        queue.add_page(
            vec![item("d5", "e5", "a", 500, 4), item("d6", "e6", "a", 600, 4)],
            Some((600, DeliveryId::from_trusted("d6".into()))),
            from_millis(0),
        );
        let next = queue
            .next_page_from(from_millis(1_000))
            .expect("more to read");
        assert!(
            next <= (400, DeliveryId::from_trusted("d4".into())),
            "{next:?}"
        );
    }

    /// A webhook sent and not recorded is not sent again before its resend time, however
    /// full the waiting list grows meanwhile and however often the store's row (still due)
    /// is read back: by the resync, or between the lease's end and its hold.
    #[test]
    fn a_sent_unrecorded_delivery_is_held_until_its_resend_time_through_a_full_window() {
        let queue = tiny_window();
        let row = item("sent", "e", "a", 0, 4);
        queue.add(vec![row.clone()]);
        let lease = queue.try_take(from_millis(0)).expect("due");
        queue.complete_holding(&lease, from_millis(10_000), from_millis(0));
        // An outage's backlog fills the waiting list with work due before the resend time.
        queue.add(vec![
            item("w1", "e1", "a", 5_000, 4),
            item("w2", "e2", "a", 6_000, 4),
            item("w3", "e3", "a", 7_000, 4),
        ]);
        // The resync reads the row as the store has it: due at 0.
        queue.add(vec![row.clone()]);
        let taken: Vec<_> = drain(&queue, 1_000)
            .into_iter()
            .map(|l| l.delivery_id.to_string())
            .collect();
        assert!(taken.is_empty(), "sent again before its time: {taken:?}");
        assert!(queue.is_known(&row.delivery_id));
        let taken: Vec<_> = drain(&queue, 10_000)
            .into_iter()
            .map(|l| l.delivery_id.to_string())
            .collect();
        assert!(taken.contains(&"sent".to_owned()), "{taken:?}");
    }

    /// A spilled lane's read from the store returns its held rows first (still due there):
    /// it asks for as many more, or a lane with many held would read nothing new.
    #[test]
    fn a_spilled_lane_reads_past_its_held_rows() {
        let queue = tiny_due_window();
        queue.add(vec![item("h1", "e", "a", 0, 4), item("h2", "e", "a", 0, 4)]);
        for lease in drain(&queue, 0) {
            queue.complete_holding(&lease, from_millis(10_000), from_millis(0));
        }
        // The third spills: the window holds two due.
        queue.add(vec![
            item("d1", "e", "a", 0, 4),
            item("d2", "e", "a", 0, 4),
            item("d3", "e", "a", 0, 4),
        ]);
        assert_eq!(drain(&queue, 0).len(), 2);
        let wanted = queue.spilled_to_refill(8);
        let room = tiny_window().limits().refill;
        assert_eq!(
            wanted,
            [(EndpointId::from_trusted("e".into()), (room + 2 + 2) as u32)],
            "room, the two in flight and the two held"
        );
    }

    /// A replay queued while the lease was out, then the lease's record given up: the
    /// delivery is queued once, as the replay asked, not held beside it.
    #[test]
    fn a_replay_queued_during_an_unrecorded_attempt_is_queued_once() {
        let queue = EmbeddedQueue::new();
        queue.add(vec![item("d", "e", "a", 0, 4)]);
        let lease = queue.try_take(from_millis(0)).expect("due");
        queue.add_replayed(vec![item("d", "e", "a", 5, 4)]);
        queue.complete_holding(&lease, from_millis(10_000), from_millis(5));
        let again = drain(&queue, 5);
        assert_eq!(again.len(), 1, "the replay goes now");
        queue.complete(&again[0], from_millis(6));
        assert!(drain(&queue, 10_000).is_empty(), "and once");
    }

    #[test]
    fn a_full_lane_spills_and_asks_for_its_work_back_when_low() {
        let queue = tiny_due_window();
        queue.add(vec![item("d1", "e", "a", 0, 1), item("d2", "e", "a", 0, 1)]);
        queue.add(vec![item("d3", "e", "a", 0, 1)]);
        let first = queue.try_take(from_millis(0)).expect("d1");
        assert!(queue.spilled_to_refill(8).is_empty(), "lane not low yet");
        assert!(queue.try_take(from_millis(0)).is_none(), "cap 1");
        queue.complete(&first, from_millis(0));
        let second = queue.try_take(from_millis(0)).expect("d2");
        assert_eq!(second.delivery_id.as_str(), "d2");
        let wanted = queue.spilled_to_refill(8);
        assert_eq!(wanted.len(), 1, "the lane ran low with rows in the store");
        assert_eq!(wanted[0].0.as_str(), "e");
        assert!(queue.spilled_to_refill(8).is_empty(), "asked once");
    }

    #[tokio::test]
    async fn take_wakes_on_enqueue() {
        let queue = std::sync::Arc::new(EmbeddedQueue::new());
        let waiter = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.take(chrono::Utc::now).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        queue.add(vec![item("d1", "e", "a", 0, 4)]);
        let lease = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.delivery_id.as_str(), "d1");
    }
}
