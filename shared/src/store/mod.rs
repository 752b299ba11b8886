//! The Store port: durable state, the source of truth for every delivery.

use async_trait::async_trait;

use crate::{
    clock::Timestamp,
    domain::{
        Account, AccountId, ApiKey, ApiKeyId, Attempt, AuditEntry, Decision, Delivery, DeliveryId,
        DeliveryStatus, EmailAddress, Endpoint, EndpointId, EndpointVersion, Event, EventId,
        EventType, EventTypeDef, HourCount, MissedEvent, Replay, ReplayId,
    },
};

pub mod cursor;
#[cfg(feature = "aws")]
pub mod dynamodb;
pub mod sqlite;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{entity} `{id}` already exists")]
    Conflict { entity: &'static str, id: String },
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The account has as many of these as it may have.
    #[error("the account's limit of {0} is reached")]
    LimitReached(&'static str),
    /// A conditional replace found the record changed since it was read: read it again.
    #[error("{0} was changed by another request meanwhile")]
    Changed(&'static str),
    #[error("{0}")]
    Locked(String),
    #[error("storage failure: {0}")]
    Backend(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// An event item written through the outbox that fan-out refused (docs/OUTBOX.md): it
    /// exists, has no deliveries, and never will; the reason names the attribute and rule.
    #[error("the event item was rejected by fan-out and has no deliveries: {0}")]
    Rejected(String),
    /// A publish under the id of a stored event that is another event (its type or data
    /// differ: [`crate::domain::Event::conflict_with`]). Nothing was written: of a batch, no
    /// item.
    #[error(transparent)]
    EventConflict(#[from] crate::domain::EventConflict),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// One event of [`Store::publish_batch`]: with its deliveries, or alone (`None`).
pub type BatchItem = (Event, Option<Vec<Delivery>>);

/// Publishing an event id that already exists returns the first event and creates nothing,
/// when it is the same event again (a retry); another event under that id is refused with
/// [`StoreError::EventConflict`]. Its deliveries are not read with it: an event may have
/// 100,000, and a retry's answer lists a page of them ([`Store::event_deliveries`]).
#[derive(Debug, Clone, PartialEq)]
pub enum PublishOutcome {
    Created,
    AlreadyExists { event: Event },
}

/// What erasing an event (`Store::erase_event`) did. Its deliveries are not read with it:
/// an event may have 100,000 ([`Store::event_deliveries`] reads them a page at a time).
#[derive(Debug, Clone, PartialEq)]
pub struct Erasure {
    /// The event as stored now: no payload, `erased_at` set.
    pub event: Event,
    /// How many deliveries this call ended (`failed`,
    /// [`crate::domain::event::EVENT_ERASED`]).
    pub ended: u32,
    /// False when the store stopped part-way through the event's deliveries (DynamoDB, past
    /// its time for one call): the payload is gone and no attempt can send it, but some
    /// response bodies remain, and some pending deliveries wait to be ended (by the sender
    /// when it takes them, or by the next call). Erasing again goes on where this one stopped.
    pub complete: bool,
}

/// A page of an event's deliveries ([`Store::event_deliveries`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventDeliveries {
    /// Up to the limit asked for, in endpoint-id order.
    pub deliveries: Vec<Delivery>,
    /// Where the next page starts (after this endpoint), when the event may have more.
    pub next: Option<EndpointId>,
}

impl EventDeliveries {
    /// The first `limit` of `deliveries` (in endpoint-id order, with at least one more read
    /// when there are more), and where the next page starts if there were more.
    pub fn first(mut deliveries: Vec<Delivery>, limit: u32) -> Self {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let more = deliveries.len() > limit;
        deliveries.truncate(limit);
        let next = more
            .then(|| deliveries.last().map(|d| d.endpoint_id.clone()))
            .flatten();
        Self { deliveries, next }
    }

    /// Whether the event may have deliveries after these.
    pub fn more(&self) -> bool {
        self.next.is_some()
    }
}

/// Writing an event alone (`Store::put_event`): an id that exists returns the stored
/// event, and nothing is written.
#[derive(Debug, Clone, PartialEq)]
pub enum PutEventOutcome {
    Created,
    AlreadyExists(Event),
}

/// Everything one attempt needs, read together.
#[derive(Debug, Clone)]
pub struct DeliveryWork {
    pub delivery: Delivery,
    /// `None` when the event is no longer stored (past its retention): the delivery can
    /// never be sent.
    pub event: Option<Event>,
    /// `None` when the endpoint was deleted after fan-out.
    pub endpoint: Option<Endpoint>,
}

/// The result of one attempt, written in one transaction: the attempt row, the delivery's
/// new state (only if it is still pending with `expected_attempts`; its `next_trigger`
/// goes back to `scheduled`), the endpoint's health.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub attempt: Attempt,
    pub expected_attempts: u32,
    pub decision: Decision,
    pub client_error_count: u32,
    pub endpoint_id: EndpointId,
    /// The delivery's account: the embedded store takes each account's writes in turn.
    pub account_id: AccountId,
    pub success: bool,
    pub now: Timestamp,
}

impl AttemptRecord {
    /// This attempt as its endpoint's hour counts it (`Store::endpoint_hours`).
    pub fn hour_count(&self) -> HourCount {
        HourCount::of_attempt(
            self.now,
            self.success,
            self.attempt.status_code,
            self.attempt.error.as_deref(),
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum RecordOutcome {
    Recorded {
        endpoint_failing_since: Option<Timestamp>,
    },
    /// Someone else already moved the delivery on; nothing was written.
    Stale,
}

/// An event whose fan-out is done (`Store::mark_fanned_out`).
#[derive(Debug, Clone, PartialEq)]
pub struct FannedOut {
    pub event: Event,
    /// A disabled endpoint would have received it ([`Event::missed_by_any`]).
    pub missed: bool,
}

/// A page of `Store::unfanned_events`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UnfannedPage {
    pub events: Vec<Event>,
    /// The creation time of the last entry looked at (listed or not), where the next page
    /// starts; `None` when there was none.
    pub last: Option<Timestamp>,
}

/// A pending delivery moved on without an attempt (`Store::move_unattempted`).
#[derive(Debug, Clone, PartialEq)]
pub enum Unattempted {
    /// Its endpoint is busy and its message went back to the queue for this time: until
    /// then `pending_deliveries` does not list it, so the sweeper does not take it for lost
    /// (`Delivery::queued_until`).
    Defer(Timestamp),
    /// It can never be sent (its event is past retention): it ends `failed` with this reason.
    Fail(String),
    /// Its endpoint is disabled or deleted, which abandons the endpoint's pending work, and
    /// this one was missed: it ends `abandoned` with this reason.
    Abandon(String),
}

/// Moving a delivery on without an attempt, only if it is still pending with
/// `expected_attempts` (the attempts it had when it was seen).
#[derive(Debug, Clone, PartialEq)]
pub struct UnattemptedMove {
    pub delivery: DeliveryId,
    pub expected_attempts: u32,
    pub change: Unattempted,
    pub at: Timestamp,
}

impl UnattemptedMove {
    /// Moves `delivery` on from the state it was read in.
    pub fn of(delivery: &Delivery, change: Unattempted, at: Timestamp) -> Self {
        Self {
            delivery: delivery.id.clone(),
            expected_attempts: delivery.attempts,
            change,
            at,
        }
    }
}

/// Deleting an endpoint (`Store::delete_endpoint`).
#[derive(Debug, Clone)]
pub struct EndpointDeletion {
    pub account_id: AccountId,
    pub endpoint_id: EndpointId,
    pub at: Timestamp,
}

/// One page of a list: at most `limit` items after `after`, the last item of the previous
/// page.
#[derive(Debug, Clone)]
pub struct PageAfter<Id> {
    pub after: Option<Id>,
    pub limit: u32,
}

impl<Id> PageAfter<Id> {
    /// The first page, of at most `limit` items.
    pub fn first(limit: u32) -> Self {
        Self { after: None, limit }
    }
}

/// Where a walk of due deliveries stands: the due time and id of the last delivery it looked
/// at (listed, or left out as its endpoint's is inactive).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DueCursor {
    pub due: Timestamp,
    pub id: DeliveryId,
}

/// A page of due deliveries ([`Store::pending_deliveries`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PendingPage {
    pub refs: Vec<PendingRef>,
    /// Where the next page starts; `None` when nothing more is due.
    pub next: Option<DueCursor>,
}

/// One account token, by its account and id (tokens themselves are not stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRef {
    pub account: AccountId,
    pub token_id: String,
}

/// A pending delivery as the dispatcher needs it: what, for whom, when, and the lane limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRef {
    pub delivery_id: DeliveryId,
    pub endpoint_id: EndpointId,
    pub account_id: AccountId,
    pub due: Timestamp,
    pub max_in_flight: u32,
    pub rate_limit_per_second: Option<u32>,
}

impl PendingRef {
    /// `delivery`, to `endpoint` (whose lane limits it carries), due at `due`.
    pub fn new(delivery: &Delivery, endpoint: &Endpoint, due: Timestamp) -> Self {
        Self {
            delivery_id: delivery.id.clone(),
            endpoint_id: endpoint.id.clone(),
            account_id: endpoint.account_id.clone(),
            due,
            max_in_flight: endpoint.max_in_flight,
            rate_limit_per_second: endpoint.rate_limit_per_second,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct DeliveryQuery {
    pub endpoint_id: Option<EndpointId>,
    pub status: Option<DeliveryStatus>,
    pub event_type: Option<String>,
    pub since: Option<Timestamp>,
    pub until: Option<Timestamp>,
    pub status_code: Option<u16>,
    /// Opaque position from a previous page.
    pub cursor: Option<String>,
    pub limit: u32,
}

impl DeliveryQuery {
    /// Whether a delivery is one this query lists, by its filters (the window and the
    /// cursor are bounds that each store reads through an index).
    pub fn matches(&self, delivery: &Delivery) -> bool {
        self.endpoint_id
            .as_ref()
            .is_none_or(|e| *e == delivery.endpoint_id)
            && self.status.is_none_or(|s| s == delivery.status)
            && self
                .event_type
                .as_deref()
                .is_none_or(|t| t == delivery.event_type.as_str())
            && self
                .status_code
                .is_none_or(|c| delivery.last_status == Some(c))
    }
}

/// Deliveries a log page reads at most: a filter that matches few of them answers a short
/// page (perhaps empty) with a cursor that continues after the last one read, so that every
/// call costs bounded reads however sparse the filter is.
pub const LIST_EXAMINE_BUDGET: usize = 2_000;

#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// Mail to send, kept in an outbox so that a crash after the state change still sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    pub id: String,
    pub account_id: AccountId,
    pub recipient: EmailAddress,
    pub subject: String,
    pub body: String,
    pub created_at: Timestamp,
}

/// What becomes of a notification whose send failed. Either way it keeps `error`, for an
/// operator to read in the store.
#[derive(Debug, Clone, PartialEq)]
pub enum NotificationFailure {
    /// Tried again from `at`: until then it is neither read nor claimed.
    Retry { at: Timestamp, error: String },
    /// Never tried again: kept, as sent mail is (for the retention), but no longer read.
    GiveUp { error: String },
}

/// Disabling an endpoint, all in one transaction, and only if it is still active.
#[derive(Debug, Clone)]
pub struct DisableRequest {
    pub account_id: AccountId,
    pub endpoint_id: EndpointId,
    pub reason: String,
    pub now: Timestamp,
    /// Only disable if `failing_since` is still this (a success in between wins).
    pub expected_failing_since: Option<Timestamp>,
    pub notification: Option<Notification>,
    /// The `endpoint.disabled` operational event and its deliveries.
    pub operational_event: Option<(Event, Vec<Delivery>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisableOutcome {
    pub abandoned: u64,
}

/// A replay to carry out; the store fills in `replay.count`, and sets `replay.more` when more
/// deliveries matched than `limit` (a `more` already set, by the recovery of missed events,
/// stays). The record keeps `replay.missed` as given.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    pub replay: Replay,
    /// At most this many deliveries, oldest first.
    pub limit: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOutcome {
    /// The audit record as written, with its count.
    pub replay: Replay,
    /// The deliveries now pending, for the queue.
    pub queued: Vec<PendingRef>,
}

/// A change written together with its audit entries (`Store::audited_change`).
#[derive(Debug, Clone)]
pub enum AuditedChange {
    /// As `Store::create_account`.
    CreateAccount(Account),
    /// As `Store::update_account`.
    UpdateAccount(Account),
    /// As `Store::create_endpoint`; with a `limit`, refused with `LimitReached` when the
    /// account has that many endpoints already (counted in the same write).
    CreateEndpoint {
        endpoint: Endpoint,
        limit: Option<usize>,
    },
    /// As `Store::update_endpoint`.
    UpdateEndpoint {
        endpoint: Endpoint,
        read: EndpointVersion,
    },
    /// As `Store::create_api_key`.
    CreateApiKey(ApiKey),
    /// As `Store::revoke_token`.
    RevokeToken {
        account: AccountId,
        token_id: String,
        at: Timestamp,
    },
    /// As `Store::revoke_account_tokens`.
    RevokeAccountTokens {
        account: AccountId,
        before: Timestamp,
    },
    /// As `Store::put_setting`.
    PutSetting { key: String, value: String },
}

/// What is revoked of one account token (`Store::token_revocation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenRevocation {
    /// When the token itself was revoked.
    pub revoked_at: Option<Timestamp>,
    /// Every token of its account issued at or before this time is revoked.
    pub account_tokens_before: Option<Timestamp>,
}

impl TokenRevocation {
    /// Whether a token issued at `issued_at` (`None`: before tokens said) is revoked.
    pub fn revokes(&self, issued_at: Option<Timestamp>) -> bool {
        self.revoked_at.is_some()
            || self
                .account_tokens_before
                .is_some_and(|before| issued_at.is_none_or(|issued| issued <= before))
    }
}

/// A page of an account's missed events (see [`Store::missed_events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissedQuery {
    pub account: AccountId,
    /// Created at or after (to the millisecond).
    pub since: Timestamp,
    /// Created before (to the millisecond).
    pub until: Option<Timestamp>,
    /// The creation time and id of the last event of the previous page.
    pub after: Option<(Timestamp, EventId)>,
    pub limit: u32,
}

/// How long [`Store::record_attempt`] pauses, in all, for a backend that refuses its writes
/// for throughput: no pause of its own ends later than this after the record began, and past
/// it a refusal comes back once the SDK's own tries of that write are spent. The sender
/// counts it in its longest batch ([`crate::service::sender::longest_batch`]), which its
/// function's timeout covers.
pub const RECORD_THROTTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(6);

/// Declares the [`Store`] trait from one list of its methods, and `delegate_store!`, the
/// `impl Store` of an adapter whose inherent methods of the same names and signatures do the
/// work (so that an adapter keeps them in files by concern: `sqlite/`, `dynamodb/`). The
/// leading `$` is handed to the inner macro, whose own parameters need one.
macro_rules! store_port {
    ($d:tt $($(#[$doc:meta])* async fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*) => {
        #[async_trait]
        pub trait Store: Send + Sync + 'static {
            $($(#[$doc])* async fn $name(&self $(, $arg: $ty)*) -> $ret;)*
        }

        /// `impl Store for $store`, each method calling the store's own of that name.
        macro_rules! delegate_store {
            ($d store:ty) => {
                // The signatures name the port's types as this module sees them.
                const _: () = {
                    #[allow(unused_imports)]
                    use $crate::{clock::*, domain::*, store::*};

                    #[async_trait::async_trait]
                    impl Store for $d store {
                        $(async fn $name(&self $(, $arg: $ty)*) -> $ret {
                            <$d store>::$name(self $(, $arg)*).await
                        })*
                    }
                };
            };
        }
        pub(crate) use delegate_store;
    };
}

store_port! { $
    async fn create_account(&self, account: &Account) -> StoreResult<()>;
    async fn get_account(&self, id: &AccountId) -> StoreResult<Option<Account>>;
    /// Rewrites an existing account (its id stays); `NotFound` when there is none.
    async fn update_account(&self, account: &Account) -> StoreResult<()>;

    async fn create_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()>;
    async fn get_endpoint(
        &self,
        account: &AccountId,
        id: &EndpointId,
    ) -> StoreResult<Option<Endpoint>>;
    async fn list_endpoints(&self, account: &AccountId) -> StoreResult<Vec<Endpoint>>;
    /// Replaces the mutable fields of an existing endpoint, if it still has the version
    /// `read` (`StoreError::Changed` otherwise).
    async fn update_endpoint(&self, endpoint: &Endpoint, read: &EndpointVersion)
        -> StoreResult<()>;
    /// Deletes the endpoint and abandons its pending deliveries; the history stays.
    async fn delete_endpoint(&self, deletion: &EndpointDeletion) -> StoreResult<bool>;

    // Every method that writes deliveries (the publishes, the two `add_deliveries`, and
    // `disable_endpoint`'s operational event) counts them in `telemetry::deliveries_created`
    // as each of its writes commits: only the store knows how many a write that failed
    // part-way wrote, and a retry finds those written and counts none of them again.

    /// Writes the event and its deliveries in one transaction (the outbox). Idempotent on the
    /// event's id: the same event again (see [`Event::conflict_with`]) is answered with the
    /// stored one; another event under that id is [`StoreError::EventConflict`], and nothing
    /// is written.
    async fn publish(&self, event: &Event, deliveries: &[Delivery]) -> StoreResult<PublishOutcome>;
    /// Several publishes at once, each idempotent on its event id as [`Store::publish`] is,
    /// and answered in order. An item with deliveries is written with them; one with `None`
    /// is the event alone, as [`Store::put_event`] writes it (for a store's change stream to
    /// fan out). One transaction on SQLite; on DynamoDB one per 100 items or 4 MB. An item
    /// whose id is another stored event refuses the batch ([`StoreError::EventConflict`])
    /// and nothing is written: on DynamoDB a batch of several transactions (an event with
    /// deliveries is its own) is compared with the stored events before the first; only a
    /// publish of one of its ids landing meanwhile leaves the transactions before it written.
    async fn publish_batch(&self, items: &[BatchItem]) -> StoreResult<Vec<PublishOutcome>>;
    /// Writes the event without deliveries, exactly as the outbox helper does, so that the
    /// store's change stream (where there is one) hands it to fan-out. Idempotent on the id
    /// as [`Store::publish`] is.
    async fn put_event(&self, event: &Event) -> StoreResult<PutEventOutcome>;
    /// Adds deliveries of an event stored without them (fan-out of an outbox event), each
    /// only if its (event, endpoint) has none yet; returns the ones added. Callers give a
    /// delivery the id derived from its (event, endpoint) (`service::fan_out::delivery_id_for`).
    async fn add_deliveries(&self, deliveries: &[Delivery]) -> StoreResult<Vec<Delivery>>;
    /// [`Store::add_deliveries`] for the deliveries of one event, as its fan-out adds them.
    /// The embedded store adds none to an event erased meanwhile, and keeps what it adds for
    /// the first try, as it keeps a publish's. A backend that refuses writes for throughput
    /// is waited for until `deadline` at most (the fan-out's): past it, the refusal comes
    /// back once the SDK's own tries of the writes under way are spent.
    async fn add_deliveries_of(
        &self,
        event: &Event,
        deliveries: &[Delivery],
        deadline: Option<tokio::time::Instant>,
    ) -> StoreResult<Vec<Delivery>>;
    async fn get_event(&self, account: &AccountId, id: &EventId) -> StoreResult<Option<Event>>;
    /// Events stored without their deliveries (`put_event`) whose fan-out is not marked done,
    /// created after `after` (if given) and at or before `created_before`, oldest first, at
    /// most `limit` looked at: the ones whose change-stream record was lost. Cheap when there
    /// are none. Items that cannot be read as events are rejected, not listed.
    async fn unfanned_events(
        &self,
        after: Option<Timestamp>,
        created_before: Timestamp,
        limit: u32,
    ) -> StoreResult<UnfannedPage>;
    /// Marks the fan-out of these events done (they leave `unfanned_events`), and those a
    /// disabled endpoint missed as [`Store::mark_missed`] does, in the same write.
    async fn mark_fanned_out(&self, events: &[FannedOut]) -> StoreResult<()>;
    /// How far a fan-out of the event got before it was cut short: the last endpoint, in id
    /// order, up to which every delivery was written and queued
    /// ([`Store::record_fan_out_progress`]). `None` when nothing was recorded, or the event
    /// is not stored.
    async fn fan_out_progress(
        &self,
        account: &AccountId,
        event: &EventId,
    ) -> StoreResult<Option<EndpointId>>;
    /// Records that the event's deliveries to every endpoint up to `through` (in id order)
    /// are written and queued, so that a fan-out cut short (out of time, or stopped) goes on
    /// after it. Only forward: a mark at or before the recorded one changes nothing, nor does
    /// one of an event no longer stored.
    async fn record_fan_out_progress(
        &self,
        account: &AccountId,
        event: &EventId,
        through: &EndpointId,
    ) -> StoreResult<()>;
    /// Marks these stored events missed: a disabled endpoint would have received them
    /// ([`Event::missed_by_any`]), so a resend asking for them finds them by time. Marking
    /// again changes nothing; an event no longer stored, or erased, is passed over.
    async fn mark_missed(&self, events: &[Event]) -> StoreResult<()>;
    /// The account's events marked missed, created in the query's window, oldest first.
    async fn missed_events(&self, query: &MissedQuery) -> StoreResult<Vec<MissedEvent>>;
    /// The deliveries of a stored event (its id and creation time are what is used).
    async fn deliveries_of_event(&self, event: &Event) -> StoreResult<Vec<Delivery>>;
    /// A page of a stored event's deliveries in endpoint-id order: at most `page.limit` of
    /// them, to endpoints after `page.after`, and where the next page starts when there may
    /// be more. An event sent to 100,000 endpoints is read a page at a time, each page reading
    /// in proportion to its length: on DynamoDB, where an event's deliveries are found by key
    /// (one candidate per endpoint the account ever had), a page looks at no more than
    /// [`LIST_EXAMINE_BUDGET`] candidates (or its limit and one), so an event sent to few of
    /// many endpoints may answer short pages, even empty ones, with a next.
    async fn event_deliveries(
        &self,
        event: &Event,
        page: &PageAfter<EndpointId>,
    ) -> StoreResult<EventDeliveries>;
    /// Erases an event's content on request: the payload goes, and so do the response
    /// bodies of the attempts to send it; the event, its deliveries and attempts stay in the
    /// log, and deliveries still pending end `failed`. `None` if there is no such event.
    /// Erasing again changes nothing (the first `erased_at` stays), unless the last call was
    /// not complete ([`Erasure::complete`]): then it goes on where that one stopped.
    async fn erase_event(
        &self,
        account: &AccountId,
        id: &EventId,
        now: Timestamp,
    ) -> StoreResult<Option<Erasure>>;

    async fn load_work(&self, delivery: &DeliveryId) -> StoreResult<Option<DeliveryWork>>;
    /// Records an attempt. A backend that refuses its writes for throughput (DynamoDB past a
    /// table's capacity) is waited for as [`RECORD_THROTTLE_WAIT`] says.
    async fn record_attempt(&self, record: &AttemptRecord) -> StoreResult<RecordOutcome>;
    /// Changes a delivery that is still pending with `expected_attempts` without recording
    /// an attempt. `false` (nothing written) when it moved on meanwhile or does not exist.
    async fn move_unattempted(&self, request: &UnattemptedMove) -> StoreResult<bool>;
    /// The endpoint's attempts counted by the hour (`record_attempt` counts them), for the
    /// hours starting at or after `since`, oldest first.
    async fn endpoint_hours(
        &self,
        endpoint: &EndpointId,
        since: Timestamp,
    ) -> StoreResult<Vec<HourCount>>;
    /// Writes the hour counts of attempts recorded so far, where a store gathers them
    /// first (DynamoDB: one write per endpoint and hour, not one per attempt). Callers call it
    /// when a batch of attempts is done; counts not yet written are lost with the process.
    async fn flush_hour_counts(&self) -> StoreResult<()>;
    /// Pending deliveries of active endpoints due at or before `due_before`, at most `limit`
    /// of them in due order (then id), after `after`; and where the next page starts. A page
    /// costs reads in proportion to its length, not to how many are due: one that passes over
    /// many deliveries of inactive endpoints may hold fewer than `limit`, even none, and
    /// still have a next.
    async fn pending_deliveries(
        &self,
        due_before: Timestamp,
        page: &PageAfter<DueCursor>,
    ) -> StoreResult<PendingPage>;

    async fn get_delivery(
        &self,
        account: &AccountId,
        id: &DeliveryId,
    ) -> StoreResult<Option<Delivery>>;
    async fn list_deliveries(
        &self,
        account: &AccountId,
        query: &DeliveryQuery,
    ) -> StoreResult<Page<Delivery>>;
    async fn list_attempts(&self, delivery: &DeliveryId) -> StoreResult<Vec<Attempt>>;

    /// In one transaction: each final delivery of the request's scope that matches its
    /// filter, and whose endpoint is active, goes back to `pending`, due now, with
    /// `next_trigger = manual`, `schedule_start = attempts` (the retry schedule restarts,
    /// attempt numbers keep counting) and its client-error count reset; and the audit
    /// record is written with the count. Deliveries already pending are left alone.
    async fn replay(&self, request: &ReplayRequest) -> StoreResult<ReplayOutcome>;
    /// The account's replay records, newest first, after `after` (paging).
    async fn list_replays(
        &self,
        account: &AccountId,
        page: &PageAfter<ReplayId>,
    ) -> StoreResult<Page<Replay>>;

    /// Active endpoints whose `failing_since` is at or before `failing_before`.
    async fn failing_endpoints(&self, failing_before: Timestamp) -> StoreResult<Vec<Endpoint>>;
    /// `None` if the endpoint is gone, no longer active, or recovered meanwhile.
    async fn disable_endpoint(
        &self,
        request: &DisableRequest,
    ) -> StoreResult<Option<DisableOutcome>>;

    /// Notifications to send at `now`, soonest due first: neither sent nor given up, and not
    /// held at `now` by a claim or a retry's wait. A notification is due when made, and
    /// again when its claim or wait runs out; what is held or given up is read past, so it
    /// keeps no other from being read. On DynamoDB an index read, which may lag the last
    /// second of writes.
    async fn unsent_notifications(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> StoreResult<Vec<Notification>>;
    /// Takes an unsent notification for sending until `until`, so that one sender sends it:
    /// false when it is sent or given up already, or another sender's claim (or its retry's
    /// wait) has not run out at `now`.
    async fn claim_notification(
        &self,
        id: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreResult<bool>;
    async fn mark_notification_sent(&self, id: &str, now: Timestamp) -> StoreResult<()>;
    /// Records a send of an unsent notification that failed at `now` (see
    /// [`NotificationFailure`]); nothing for one sent or given up meanwhile, or unknown.
    async fn mark_notification_failed(
        &self,
        id: &str,
        now: Timestamp,
        failure: &NotificationFailure,
    ) -> StoreResult<()>;

    /// Stores a new API key; a key of the same id is a conflict.
    async fn create_api_key(&self, key: &ApiKey) -> StoreResult<()>;
    async fn get_api_key(&self, id: &ApiKeyId) -> StoreResult<Option<ApiKey>>;
    /// Every API key, revoked ones included, newest first.
    async fn list_api_keys(&self) -> StoreResult<Vec<ApiKey>>;
    /// Marks the key revoked at `at` (a key revoked before keeps its first time); the key
    /// as stored now, `None` if there is no such key.
    async fn revoke_api_key(&self, id: &ApiKeyId, at: Timestamp) -> StoreResult<Option<ApiKey>>;

    /// Revokes one token of the account (the first revocation's time stays). Tokens are not
    /// stored, so any id can be revoked; the record may go once no token of that id can
    /// still be valid (90 days, the longest lifetime).
    async fn revoke_token(&self, token: &TokenRef, at: Timestamp) -> StoreResult<()>;
    /// Revokes every token of the account issued at or before `before`; an earlier time
    /// than one already recorded changes nothing.
    async fn revoke_account_tokens(&self, account: &AccountId, before: Timestamp)
        -> StoreResult<()>;
    /// What is revoked of the account's token `token_id`, read strongly consistently.
    async fn token_revocation(&self, token: &TokenRef) -> StoreResult<TokenRevocation>;

    /// Makes `change` and appends `entries` to the audit log as one: in one transaction on
    /// SQLite (a failure of either writes neither); on DynamoDB the change, then the entries
    /// (a change that fails writes no entry).
    async fn audited_change(&self, change: &AuditedChange, entries: &[AuditEntry])
        -> StoreResult<()>;
    /// Appends an entry to the audit log (its id is new: an entry of the same id is a
    /// conflict).
    async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()>;
    /// An account's audit log (`None`: the operator's, of changes over no one account),
    /// newest first by (`at`, `id`), a page of at most `limit` (1 to 500), after `cursor`
    /// ([`cursor`] of the last entry of the previous page, as the delivery log's).
    async fn list_audit(
        &self,
        account: Option<&AccountId>,
        page: &PageAfter<String>,
    ) -> StoreResult<Page<AuditEntry>>;

    /// Adds a type to the event-type catalog; a type of that name is a conflict.
    async fn create_event_type(&self, def: &EventTypeDef) -> StoreResult<()>;
    /// Rewrites a catalog entry (its name and `created_at` stay); `NotFound` when there is none.
    async fn update_event_type(&self, def: &EventTypeDef) -> StoreResult<()>;
    async fn get_event_type(&self, name: &EventType) -> StoreResult<Option<EventTypeDef>>;
    /// The whole catalog, by name.
    async fn list_event_types(&self) -> StoreResult<Vec<EventTypeDef>>;
    /// `false` when there was no such type.
    async fn delete_event_type(&self, name: &EventType) -> StoreResult<bool>;

    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>>;
    /// Stores the value, replacing any.
    async fn put_setting(&self, key: &str, value: &str) -> StoreResult<()>;
    /// Stores the value unless the key exists; returns the value now stored.
    async fn put_setting_if_absent(&self, key: &str, value: &str) -> StoreResult<String>;
    /// Replaces the value if it is still `old`; `false` when it was changed meanwhile.
    async fn replace_setting(&self, key: &str, old: &str, new: &str) -> StoreResult<bool>;
    /// The cipher of secret settings (the account-token signing key): the one that seals
    /// endpoint secrets; an error in a process given no secrets key.
    async fn settings_cipher(&self) -> StoreResult<crate::secrets::SecretsCipher>;
}
