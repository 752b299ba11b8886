//! Item codecs: the domain types as DynamoDB items and back, keys, shards and SDK errors.

use super::*;

pub(super) fn sdk<E: std::error::Error>(error: E) -> StoreError {
    StoreError::Backend(error_text(&error))
}

pub(super) fn build_error(error: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Backend(format!("malformed DynamoDB request: {error}"))
}

pub(super) fn is_condition_failed<E: ProvideErrorMetadata, R>(error: &SdkError<E, R>) -> bool {
    error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        == Some("ConditionalCheckFailedException")
}

/// Whether DynamoDB refused the request for the table's (or the account's) throughput: it
/// may go through after a pause, and wrote nothing.
pub(super) fn is_throttled<E: ProvideErrorMetadata, R>(error: &SdkError<E, R>) -> bool {
    matches!(
        error
            .as_service_error()
            .and_then(ProvideErrorMetadata::code),
        Some(
            "ProvisionedThroughputExceededException"
                | "ThrottlingException"
                | "RequestLimitExceeded"
        )
    )
}

/// `send`'s answer, sent again after a pause while DynamoDB refuses it for throughput
/// (up to [`UNPROCESSED_ROUNDS`] times, pausing as for a batch read's unprocessed keys),
/// once the SDK's own tries are spent: for a write whose failure costs more than waiting,
/// such as an attempt's record after the endpoint answered (left failed, its message is
/// handed out again and the webhook sent twice). No pause ends past `until`, if given: a
/// caller with a time limit of its own (a sender's batch has its function's timeout) gets
/// the refusal back in time to act on it.
pub(super) async fn sent_through_throttling<T, E, R, F, Fut>(
    until: Option<tokio::time::Instant>,
    mut send: F,
) -> Result<T, SdkError<E, R>>
where
    E: ProvideErrorMetadata,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, SdkError<E, R>>>,
{
    let mut round = 0;
    loop {
        let answer = send().await;
        match &answer {
            Err(error) if is_throttled(error) && round < UNPROCESSED_ROUNDS => {
                round += 1;
                let pause = unprocessed_pause(round);
                if until.is_some_and(|until| tokio::time::Instant::now() + pause > until) {
                    return answer;
                }
                tokio::time::sleep(pause).await;
            }
            _ => return answer,
        }
    }
}

/// `item` with a token of its own in [`PUT_TOKEN`], for [`put_written`] to tell the put's
/// own item from one another call wrote with the same attributes (a second create of the
/// same account is a conflict).
pub(super) fn with_put_token(mut item: Item) -> Item {
    item.insert(
        PUT_TOKEN.to_owned(),
        s(uuid::Uuid::new_v4().simple().to_string()),
    );
    item
}

/// The attribute of [`with_put_token`]; no reader looks at it.
const PUT_TOKEN: &str = "put_token";

/// A conditional put's answer: `Some` once `sent` is written. A try whose answer has not
/// begun after the read timeout is sent again by the SDK, and DynamoDB applies a `PutItem`
/// once per try (a transaction's token makes its tries one; a put has none): when the
/// first was applied, the next finds its own item and fails its condition. Sent by
/// [`put_once`], the refusal carries the item that failed it; that item is the put's own
/// when it is `sent`, [`with_put_token`]'s token included.
pub(super) fn put_written<R: std::fmt::Debug>(
    result: Result<
        aws_sdk_dynamodb::operation::put_item::PutItemOutput,
        SdkError<aws_sdk_dynamodb::operation::put_item::PutItemError, R>,
    >,
    sent: &Item,
) -> StoreResult<Option<()>> {
    use aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException;
    let own = match &result {
        Err(SdkError::ServiceError(refused)) => matches!(
            refused.err(),
            ConditionalCheckFailedException(failed) if failed.item() == Some(sent)
        ),
        _ => false,
    };
    if own {
        return Ok(Some(()));
    }
    Ok(written(result)?.map(|_| ()))
}

/// What a conditional write judged by its own item asks for: the item that failed its
/// condition (no more capacity used than without it).
pub(super) fn own_item_on_refusal() -> aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure
{
    aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld
}

/// Sends `put` (its table and condition) with `item`, asking for the item that refuses it:
/// [`put_written`]'s answer.
pub(super) async fn put_once(
    put: aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder,
    item: Item,
) -> StoreResult<Option<()>> {
    let result = put
        .set_item(Some(item.clone()))
        .return_values_on_condition_check_failure(own_item_on_refusal())
        .send()
        .await;
    put_written(result, &item)
}

/// The output of a conditional write, or `None` when its condition did not hold.
pub(super) fn written<T, E, R>(result: Result<T, SdkError<E, R>>) -> StoreResult<Option<T>>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match result {
        Ok(out) => Ok(Some(out)),
        Err(e) if is_condition_failed(&e) => Ok(None),
        Err(e) => Err(sdk(e)),
    }
}

pub(super) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

pub(super) fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(super) fn key1(name: &str, value: &str) -> Item {
    Item::from([(name.to_owned(), s(value))])
}

/// The key of an item of the tables keyed by account, then id: endpoints and events.
pub(super) fn account_key(account: &str, id: &str) -> Item {
    key2("account_id", account, "id", id)
}

pub(super) fn key2(name: &str, value: &str, sort_name: &str, sort_value: &str) -> Item {
    Item::from([
        (name.to_owned(), s(value)),
        (sort_name.to_owned(), s(sort_value)),
    ])
}

/// Every delivery this store writes has the id derived from its (account, event, event
/// time, endpoint) (`DeliveryId::derived`, what `Delivery::new_pending` gives, with the
/// event's time as the delivery's): an event's deliveries are found by those ids, without an
/// index. Another id is refused rather than stored unfindable.
pub(super) fn derived_ids_only(deliveries: &[Delivery]) -> StoreResult<()> {
    match deliveries.iter().find(|d| {
        d.id != DeliveryId::derived(&d.account_id, &d.event_id, d.created_at, &d.endpoint_id)
    }) {
        None => Ok(()),
        Some(d) => Err(StoreError::Backend(format!(
            "delivery {} does not have the id derived from its event and endpoint",
            d.id
        ))),
    }
}

pub(super) fn put_if_absent(
    table: &str,
    item: Item,
    key_attribute: &str,
) -> StoreResult<TransactWriteItem> {
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(#k)")
        .expression_attribute_names("#k", key_attribute)
        .build()
        .map_err(build_error)?;
    Ok(TransactWriteItem::builder().put(put).build())
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("DynamoDB item without a valid `{what}`"))
}

pub(super) fn get_s(item: &Item, name: &str) -> StoreResult<String> {
    opt_s(item, name).ok_or_else(|| corrupt(name))
}

pub(super) fn opt_s(item: &Item, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Some(v.clone()),
        _ => None,
    }
}

pub(super) fn get_n<T: std::str::FromStr>(item: &Item, name: &str) -> StoreResult<T> {
    opt_n(item, name)?.ok_or_else(|| corrupt(name))
}

/// An item's TTL (`expires_at`, epoch seconds), if it has a readable one.
pub(super) fn expiry(item: &Item) -> Option<i64> {
    opt_n::<i64>(item, "expires_at").ok().flatten()
}

pub(super) fn opt_n<T: std::str::FromStr>(item: &Item, name: &str) -> StoreResult<Option<T>> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse().map(Some).map_err(|_| corrupt(name)),
        Some(AttributeValue::Null(_)) | None => Ok(None),
        Some(_) => Err(corrupt(name)),
    }
}

pub(super) fn get_bool(item: &Item, name: &str) -> bool {
    matches!(item.get(name), Some(AttributeValue::Bool(true)))
}

/// The key of a delivery's item: its endpoint's log partition and its id. `None` for an id
/// no delivery can have (given from outside).
pub(super) fn delivery_key(id: &DeliveryId) -> Option<Item> {
    let partition = id.log_partition()?;
    Some(key2("log", partition, "id", id.as_str()))
}

/// The key of a delivery item read back (or of its `pending` index entry).
pub(super) fn stored_delivery_key(item: &Item) -> StoreResult<Item> {
    delivery_key(&DeliveryId::from_trusted(get_s(item, "id")?)).ok_or_else(|| corrupt("id"))
}

/// Sort key that orders by time, then id: `0001700000000000#dlv_…`.
pub(super) fn time_key(at: Timestamp, id: &str) -> String {
    format!("{:016}#{id}", to_millis(at).max(0))
}

/// When a pending delivery is due as the sweeper sees it: its next try, or the time its
/// re-queued message is expected (`due_key` of a deferred delivery), whichever is later.
pub(super) fn indexed_due(item: &Item) -> StoreResult<Timestamp> {
    let next = get_n::<i64>(item, "next_try_at")?;
    let keyed = opt_s(item, "due_key")
        .and_then(|key| key.get(..16)?.parse::<i64>().ok())
        .unwrap_or(next);
    Ok(from_millis(next.max(keyed)))
}

pub(super) fn time_bound(at: Timestamp) -> String {
    format!("{:016}", to_millis(at).max(0))
}

/// One of `shards` partitions for an id (FNV-1a): stable, so an index entry never moves.
pub(super) fn shard_of(id: &str, shards: u32) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in id.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash % shards).to_string()
}

/// The `pending` index partition of a delivery id.
pub fn pending_shard(id: &str) -> String {
    shard_of(id, PENDING_SHARDS)
}

/// The `unfanned` index partition of an event id.
pub fn unfanned_shard(id: &str) -> String {
    shard_of(id, UNFANNED_SHARDS)
}

/// The walk's control item: how far it has looked (`watermark`), and where a walk left
/// part-way stopped (the window's end and the last endpoint done).
pub(super) fn walk_state(watermark: Option<i64>, walking: Option<(Timestamp, &str, &str)>) -> Item {
    let mut item = key1("pk", FIRST_TRY_WATERMARK);
    if let Some(watermark) = watermark {
        item.insert("watermark".into(), n(watermark));
    }
    if let Some((until, account, endpoint)) = walking {
        item.insert("walking_until".into(), n(to_millis(until)));
        item.insert("walked_account".into(), s(account));
        item.insert("walked_endpoint".into(), s(endpoint));
    }
    item
}

pub(super) fn account_item(account: &Account) -> Item {
    let mut item = Item::from([
        ("id".into(), s(account.id.as_str())),
        ("name".into(), s(&account.name)),
        ("owner_email".into(), s(account.owner_email.as_str())),
        ("created_at".into(), n(to_millis(account.created_at))),
    ]);
    if let Some(rate) = account.publish_rate_limit {
        item.insert("publish_rate".into(), n(rate.per_second));
        item.insert("publish_burst".into(), n(rate.burst));
    }
    item
}

pub(super) fn account_from_item(item: &Item) -> StoreResult<Account> {
    Ok(Account {
        id: AccountId::from_trusted(get_s(item, "id")?),
        name: get_s(item, "name")?,
        owner_email: EmailAddress::from_trusted(get_s(item, "owner_email")?),
        created_at: from_millis(get_n(item, "created_at")?),
        publish_rate_limit: match (
            opt_n::<u32>(item, "publish_rate")?,
            opt_n::<u32>(item, "publish_burst")?,
        ) {
            (Some(per_second), Some(burst)) => {
                Some(crate::domain::rate::PublishRate { per_second, burst })
            }
            _ => None,
        },
    })
}

/// An endpoint's item, its signing secrets sealed by `secrets` (refused without a key).
pub(super) fn endpoint_item(e: &Endpoint, secrets: &SecretsAccess) -> StoreResult<Item> {
    let seal = |secret: &SigningSecret| {
        secrets
            .seal(secret, &e.account_id, &e.id)
            .map_err(|err| StoreError::Backend(format!("endpoint {}: {err}", e.id)))
    };
    let mut item = Item::from([
        ("account_id".into(), s(e.account_id.as_str())),
        ("id".into(), s(e.id.as_str())),
        ("url".into(), s(e.url.as_str())),
        ("description".into(), s(&e.description)),
        ("secret".into(), s(seal(&e.secret)?)),
        ("status".into(), s(e.status.as_str())),
        ("max_in_flight".into(), n(e.max_in_flight)),
        ("created_at".into(), n(to_millis(e.created_at))),
        ("updated_at".into(), n(to_millis(e.updated_at))),
    ]);
    if let Some(retiring) = &e.retiring_secret {
        item.insert("retiring_secret".into(), s(seal(&retiring.secret)?));
        item.insert("retiring_until".into(), n(to_millis(retiring.until)));
    }
    if let Some(patterns) = e.event_types.patterns() {
        item.insert(
            "event_types".into(),
            AttributeValue::L(patterns.iter().map(s).collect()),
        );
    }
    if let Some(rate) = e.rate_limit_per_second {
        item.insert("rate_limit".into(), n(rate));
    }
    if let Some(since) = e.failing_since {
        item.insert("failing_since".into(), n(to_millis(since)));
        item.insert("failing_shard".into(), s(FAILING_SHARD));
    }
    if let Some(reason) = &e.disabled_reason {
        item.insert("disabled_reason".into(), s(reason));
    }
    let headers = secrets
        .seal_headers(&e.headers, &e.account_id, &e.id)
        .map_err(|err| StoreError::Backend(format!("endpoint {}: {err}", e.id)))?;
    if let Some(headers) = headers {
        item.insert("headers".into(), s(headers));
    }
    Ok(item)
}

/// A deleted endpoint's item: kept (without its secrets) so that the account's deliveries
/// stay findable by their derived ids; hidden from every endpoint read.
pub(super) fn is_tombstone(item: &Item) -> bool {
    item.contains_key(DELETED_AT)
}

/// An endpoint from its item, its signing secrets opened by `secrets` (or withheld).
pub(super) fn endpoint_from_item(item: &Item, secrets: &SecretsAccess) -> StoreResult<Endpoint> {
    let id = EndpointId::from_trusted(get_s(item, "id")?);
    let account_id = AccountId::from_trusted(get_s(item, "account_id")?);
    let open = |what: &str, stored: &str| {
        secrets
            .open(stored, &account_id, &id)
            .map_err(|e| StoreError::Corrupt(format!("endpoint {id} {what}: {e}")))
    };
    let url = get_s(item, "url")?;
    let secret = get_s(item, "secret")?;
    let status = get_s(item, "status")?;
    let patterns = match item.get("event_types") {
        Some(AttributeValue::L(list)) => Some(
            list.iter()
                .map(|v| match v {
                    AttributeValue::S(p) => Ok(p.clone()),
                    _ => Err(corrupt("event_types")),
                })
                .collect::<StoreResult<Vec<_>>>()?,
        ),
        _ => None,
    };
    let retiring_secret = match (
        opt_s(item, "retiring_secret"),
        opt_n::<i64>(item, "retiring_until")?,
    ) {
        (Some(secret), Some(until)) => Some(RetiringSecret {
            secret: open("retiring_secret", &secret)?,
            until: from_millis(until),
        }),
        _ => None,
    };
    let secret = open("secret", &secret)?;
    let headers = secrets
        .open_headers(opt_s(item, "headers").as_deref(), &account_id, &id)
        .map_err(|e| StoreError::Corrupt(format!("endpoint {id} headers: {e}")))?;
    Ok(Endpoint {
        id,
        account_id,
        url: EndpointUrl::parse(&url).map_err(|_| corrupt("url"))?,
        description: opt_s(item, "description").unwrap_or_default(),
        secret,
        retiring_secret,
        status: EndpointStatus::parse(&status).ok_or_else(|| corrupt("status"))?,
        event_types: EventTypeFilter::parse(patterns.as_deref())
            .map_err(|_| corrupt("event_types"))?,
        max_in_flight: get_n(item, "max_in_flight")?,
        rate_limit_per_second: opt_n(item, "rate_limit")?,
        headers,
        failing_since: opt_n::<i64>(item, "failing_since")?
            .filter(|since| *since != INDEX_ONLY_SINCE)
            .map(from_millis),
        disabled_reason: opt_s(item, "disabled_reason"),
        created_at: from_millis(get_n(item, "created_at")?),
        updated_at: from_millis(get_n(item, "updated_at")?),
    })
}

pub(super) fn event_from_item(item: &Item) -> StoreResult<Event> {
    if let Some(reason) = opt_s(item, "rejected") {
        return Err(StoreError::Rejected(reason));
    }
    // An erased event keeps its item without the payload; any other item needs one, or the
    // `data` an outbox writer gives instead (docs/OUTBOX.md), which makes the same body on
    // every read.
    let erased_at = opt_n::<i64>(item, "erased_at")?.map(from_millis);
    let mut event = Event {
        id: EventId::from_trusted(get_s(item, "id")?),
        account_id: AccountId::from_trusted(get_s(item, "account_id")?),
        event_type: EventType::from_trusted(get_s(item, "type")?),
        created_at: from_millis(get_n(item, "created_at")?),
        payload: String::new(),
        erased_at,
    };
    event.payload = match opt_s(item, "payload") {
        Some(payload) => payload,
        None if erased_at.is_some() => String::new(),
        None => super::outbox::payload_from_data(item, &event).ok_or_else(|| corrupt("payload"))?,
    };
    Ok(event)
}

/// A new delivery's item, as written now.
pub(super) fn new_delivery_item(
    d: &Delivery,
    written_at: Timestamp,
    late_fan_out: Option<std::time::Duration>,
) -> StoreResult<Item> {
    let partition =
        d.id.log_partition()
            .ok_or_else(|| StoreError::Backend(format!("delivery {} has no derived id", d.id)))?;
    let mut item = Item::from([
        ("log".into(), s(partition)),
        ("id".into(), s(d.id.as_str())),
        ("account_id".into(), s(d.account_id.as_str())),
        ("event_id".into(), s(d.event_id.as_str())),
        ("endpoint_id".into(), s(d.endpoint_id.as_str())),
        ("event_type".into(), s(d.event_type.as_str())),
        ("status".into(), s(d.status.as_str())),
        ("attempts".into(), n(d.attempts)),
        ("client_errors".into(), n(d.client_error_count)),
        ("created_at".into(), n(to_millis(d.created_at))),
        ("updated_at".into(), n(to_millis(d.updated_at))),
    ]);
    item.insert("schedule_start".into(), n(d.schedule_start));
    item.insert("next_trigger".into(), s(d.next_trigger.as_str()));
    if let Some(at) = d.next_try_at {
        item.insert("next_try_at".into(), n(to_millis(at)));
    }
    if let Some(code) = d.last_status {
        item.insert("last_status".into(), n(code));
    }
    if let Some(error) = &d.last_error {
        item.insert("last_error".into(), s(error));
    }
    // A new delivery stays out of the `pending` index (entering and leaving it would cost
    // two index writes for a first try that delivers): it enters after a failed try, on a
    // replay, or when `walk_unsent_first_tries` finds it still unsent. One written long
    // after its event's time may sit where the walk has already looked, and one dated far
    // ahead (a platform clock running fast) where it will not look for a long time: it
    // enters now.
    let out_of_step = late_fan_out
        .and_then(|late| chrono::TimeDelta::from_std(late).ok())
        .is_some_and(|late| (written_at - d.created_at).abs() > late);
    if d.status == DeliveryStatus::Pending && out_of_step {
        let due = d.next_try_at.unwrap_or(written_at);
        item.insert("pending_shard".into(), s(pending_shard(d.id.as_str())));
        item.insert("due_key".into(), s(time_key(due, d.id.as_str())));
    }
    Ok(item)
}

pub(super) fn delivery_from_item(item: &Item) -> StoreResult<Delivery> {
    let status = get_s(item, "status")?;
    Ok(Delivery {
        id: DeliveryId::from_trusted(get_s(item, "id")?),
        event_id: EventId::from_trusted(get_s(item, "event_id")?),
        endpoint_id: EndpointId::from_trusted(get_s(item, "endpoint_id")?),
        account_id: AccountId::from_trusted(get_s(item, "account_id")?),
        event_type: EventType::from_trusted(get_s(item, "event_type")?),
        status: DeliveryStatus::parse(&status).ok_or_else(|| corrupt("status"))?,
        attempts: get_n(item, "attempts")?,
        next_try_at: opt_n::<i64>(item, "next_try_at")?.map(from_millis),
        last_status: opt_n(item, "last_status")?,
        last_error: opt_s(item, "last_error"),
        client_error_count: get_n(item, "client_errors")?,
        schedule_start: opt_n(item, "schedule_start")?.unwrap_or(0),
        next_trigger: opt_s(item, "next_trigger")
            .and_then(|t| Trigger::parse(&t))
            .unwrap_or(Trigger::Scheduled),
        queued_until: opt_n::<i64>(item, "queued_until")?.map(from_millis),
        created_at: from_millis(get_n(item, "created_at")?),
        updated_at: from_millis(get_n(item, "updated_at")?),
    })
}

/// The partition of the attempts table that holds an account's replay audit records
/// (newest first by the numeric sort key, `replay::replay_sort`), kept without TTL.
pub(super) fn replays_partition(account: &AccountId) -> String {
    format!("replays#{account}")
}

pub(super) fn replay_key(replay: &Replay, sort: u128) -> Item {
    Item::from([
        (
            "delivery_id".into(),
            s(replays_partition(&replay.account_id)),
        ),
        ("number".into(), n(sort)),
    ])
}

pub(super) fn replay_item(replay: &Replay, sort: u128) -> Item {
    let mut item = replay_key(replay, sort);
    item.extend([
        ("replay_id".into(), s(replay.id.as_str())),
        ("account_id".into(), s(replay.account_id.as_str())),
        ("actor".into(), s(&replay.actor)),
        ("requested_at".into(), n(to_millis(replay.requested_at))),
        ("count".into(), n(replay.count)),
        ("more".into(), AttributeValue::Bool(replay.more)),
        ("missed".into(), n(replay.missed)),
        (
            "include_missed".into(),
            AttributeValue::Bool(replay.filter.include_missed),
        ),
        (
            "statuses".into(),
            s(serde_json::to_string(
                &replay
                    .filter
                    .statuses
                    .iter()
                    .map(|st| st.as_str())
                    .collect::<Vec<_>>(),
            )
            .unwrap_or_else(|_| "[]".into())),
        ),
        (
            "event_types".into(),
            s(serde_json::to_string(
                &replay
                    .filter
                    .event_types
                    .iter()
                    .map(EventType::as_str)
                    .collect::<Vec<_>>(),
            )
            .unwrap_or_else(|_| "[]".into())),
        ),
    ]);
    match &replay.scope {
        ReplayScope::Delivery(id) => item.insert("scope_delivery".into(), s(id.as_str())),
        ReplayScope::Endpoint(id) => item.insert("scope_endpoint".into(), s(id.as_str())),
    };
    if let Some(since) = replay.filter.since {
        item.insert("since".into(), n(to_millis(since)));
    }
    if let Some(until) = replay.filter.until {
        item.insert("until".into(), n(to_millis(until)));
    }
    item
}

pub(super) fn replay_from_item(item: &Item) -> StoreResult<Replay> {
    let scope = match (opt_s(item, "scope_delivery"), opt_s(item, "scope_endpoint")) {
        (Some(delivery), _) => ReplayScope::Delivery(DeliveryId::from_trusted(delivery)),
        (None, Some(endpoint)) => ReplayScope::Endpoint(EndpointId::from_trusted(endpoint)),
        (None, None) => return Err(corrupt("scope")),
    };
    let statuses: Vec<String> =
        serde_json::from_str(&get_s(item, "statuses")?).map_err(|_| corrupt("statuses"))?;
    let event_types: Vec<String> =
        serde_json::from_str(&get_s(item, "event_types")?).map_err(|_| corrupt("event_types"))?;
    Ok(Replay {
        id: ReplayId::from_trusted(get_s(item, "replay_id")?),
        account_id: AccountId::from_trusted(get_s(item, "account_id")?),
        actor: get_s(item, "actor")?,
        scope,
        filter: ReplayFilter {
            since: opt_n::<i64>(item, "since")?.map(from_millis),
            until: opt_n::<i64>(item, "until")?.map(from_millis),
            statuses: statuses
                .iter()
                .map(|st| DeliveryStatus::parse(st).ok_or_else(|| corrupt("statuses")))
                .collect::<StoreResult<Vec<_>>>()?,
            event_types: event_types
                .into_iter()
                .map(EventType::from_trusted)
                .collect(),
            include_missed: get_bool(item, "include_missed"),
        },
        requested_at: from_millis(get_n(item, "requested_at")?),
        count: get_n(item, "count")?,
        missed: opt_n(item, "missed")?.unwrap_or(0),
        more: get_bool(item, "more"),
    })
}

/// What an attempt left, as stored in its row (with the row's keys) or in a delivery's
/// `first_try` map.
pub(super) fn attempt_detail(attempt: &Attempt) -> Item {
    let mut detail = Item::from([
        ("trigger".into(), s(attempt.trigger.as_str())),
        ("started_at".into(), n(to_millis(attempt.started_at))),
        ("latency_ms".into(), n(attempt.latency_ms)),
        (
            "response_headers".into(),
            s(serde_json::to_string(&attempt.response_headers).unwrap_or_else(|_| "[]".into())),
        ),
        ("response_body".into(), s(&attempt.response_body)),
        (
            "response_body_truncated".into(),
            AttributeValue::Bool(attempt.response_body_truncated),
        ),
    ]);
    if let Some(code) = attempt.status_code {
        detail.insert("status_code".into(), n(code));
    }
    if let Some(error) = &attempt.error {
        detail.insert("error".into(), s(error));
    }
    detail
}

/// The first try kept on a delivery item (see `record_attempt`), if any.
pub(super) fn first_try_from_item(item: &Item) -> StoreResult<Option<Attempt>> {
    let Some(AttributeValue::M(detail)) = item.get("first_try") else {
        return Ok(None);
    };
    let id = get_s(item, "id")?;
    attempt_from_detail(detail, DeliveryId::from_trusted(id), 1).map(Some)
}

pub(super) fn attempt_from_item(item: &Item) -> StoreResult<Attempt> {
    attempt_from_detail(
        item,
        DeliveryId::from_trusted(get_s(item, "delivery_id")?),
        get_n(item, "number")?,
    )
}

pub(super) fn attempt_from_detail(
    item: &Item,
    delivery_id: DeliveryId,
    number: u32,
) -> StoreResult<Attempt> {
    let trigger = get_s(item, "trigger")?;
    let headers = get_s(item, "response_headers")?;
    Ok(Attempt {
        delivery_id,
        number,
        trigger: Trigger::parse(&trigger).ok_or_else(|| corrupt("trigger"))?,
        started_at: from_millis(get_n(item, "started_at")?),
        latency_ms: get_n(item, "latency_ms")?,
        status_code: opt_n(item, "status_code")?,
        response_headers: serde_json::from_str(&headers)
            .map_err(|_| corrupt("response_headers"))?,
        response_body: opt_s(item, "response_body").unwrap_or_default(),
        response_body_truncated: get_bool(item, "response_body_truncated"),
        error: opt_s(item, "error"),
    })
}

pub(super) fn notification_from_item(item: &Item) -> StoreResult<Notification> {
    Ok(Notification {
        id: get_s(item, "id")?,
        account_id: AccountId::from_trusted(get_s(item, "account_id")?),
        recipient: EmailAddress::from_trusted(get_s(item, "recipient")?),
        subject: get_s(item, "subject")?,
        body: get_s(item, "body")?,
        created_at: from_millis(get_n(item, "created_at")?),
    })
}

/// The control table's key of a notification: written, claimed and marked sent by it.
pub(super) fn notification_pk(id: &str) -> AttributeValue {
    s(format!("notification#{id}"))
}

pub(super) fn notification_item(n_: &Notification) -> Item {
    Item::from([
        ("pk".into(), notification_pk(&n_.id)),
        ("id".into(), s(&n_.id)),
        ("account_id".into(), s(n_.account_id.as_str())),
        ("recipient".into(), s(n_.recipient.as_str())),
        ("subject".into(), s(&n_.subject)),
        ("body".into(), s(&n_.body)),
        ("created_at".into(), n(to_millis(n_.created_at))),
        (UNSENT.into(), s(UNSENT)),
        ("created_key".into(), s(time_key(n_.created_at, &n_.id))),
    ])
}
