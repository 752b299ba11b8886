//! Rows: the domain types read from and written to SQLite, and the listing cursor.

use super::*;

pub(super) const ATTEMPT_COLUMNS: &str =
    "delivery_id, number, trigger, started_at, latency_ms, status_code, \
     response_headers, response_body, response_body_truncated, error";

pub(super) const ENDPOINT_COLUMNS: &str = "id, account_id, url, description, secret, retiring_secret, retiring_until, status, \
     event_types, max_in_flight, rate_limit, failing_since, disabled_reason, created_at, updated_at, headers";

/// An endpoint's secrets as stored, sealed: the signing secret, the retiring one, and the
/// custom headers (their secret values sealed).
pub(super) struct Sealed {
    secret: String,
    retiring: Option<String>,
    headers: Option<String>,
}

/// An endpoint's secrets sealed by `cipher`.
pub(super) fn sealed_secrets(e: &Endpoint, cipher: &SecretsCipher) -> StoreResult<Sealed> {
    let failed = |err: crate::secrets::SecretsError| StoreError::Backend(err.to_string());
    let seal = |secret: &SigningSecret| {
        cipher
            .seal(&secret.expose(), &e.account_id, &e.id)
            .map_err(failed)
    };
    Ok(Sealed {
        secret: seal(&e.secret)?,
        retiring: e
            .retiring_secret
            .as_ref()
            .map(|r| seal(&r.secret))
            .transpose()?,
        headers: SecretsAccess::from(cipher.clone())
            .seal_headers(&e.headers, &e.account_id, &e.id)
            .map_err(failed)?,
    })
}

/// An endpoint's values for `ENDPOINT_COLUMNS`, in that order (`?1` to `?16`), with its
/// secrets as [`sealed_secrets`] made them.
pub(super) fn endpoint_row<'a>(e: &'a Endpoint, sealed: &'a Sealed) -> impl rusqlite::Params + 'a {
    let event_types = e
        .event_types
        .patterns()
        .map(|p| serde_json::to_string(p).unwrap_or_default());
    (
        e.id.as_str(),
        e.account_id.as_str(),
        e.url.as_str(),
        e.description.as_str(),
        sealed.secret.as_str(),
        sealed.retiring.as_deref(),
        e.retiring_secret.as_ref().map(|r| to_millis(r.until)),
        e.status.as_str(),
        event_types,
        e.max_in_flight,
        e.rate_limit_per_second,
        opt_millis(e.failing_since),
        e.disabled_reason.as_deref(),
        to_millis(e.created_at),
        to_millis(e.updated_at),
        sealed.headers.as_deref(),
    )
}

pub(super) const DELIVERY_COLUMNS: &str =
    "id, account_id, event_id, endpoint_id, event_type, status, attempts, next_try_at, \
     last_status, last_error, client_errors, created_at, updated_at, schedule_start, next_trigger";

pub(super) fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

pub(super) fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation)
}

pub(super) fn opt_millis(at: Option<Timestamp>) -> Option<i64> {
    at.map(to_millis)
}

pub(super) fn corrupt(what: &str, detail: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Text,
        format!("{what}: {detail}").into(),
    )
}

pub(super) fn u32_col(row: &Row<'_>, idx: usize) -> rusqlite::Result<u32> {
    let raw: i64 = row.get(idx)?;
    u32::try_from(raw).map_err(|e| corrupt("u32 column", e))
}

pub(super) fn opt_u16_col(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<u16>> {
    let raw: Option<i64> = row.get(idx)?;
    raw.map(|v| u16::try_from(v).map_err(|e| corrupt("u16 column", e)))
        .transpose()
}

pub(super) fn account_from_row(row: &Row<'_>) -> rusqlite::Result<Account> {
    Ok(Account {
        id: AccountId::from_trusted(row.get(0)?),
        name: row.get(1)?,
        owner_email: EmailAddress::from_trusted(row.get(2)?),
        created_at: from_millis(row.get(3)?),
        publish_rate_limit: match (row.get::<_, Option<u32>>(4)?, row.get::<_, Option<u32>>(5)?) {
            (Some(per_second), Some(burst)) => {
                Some(crate::domain::rate::PublishRate { per_second, burst })
            }
            _ => None,
        },
    })
}

pub(super) fn endpoint_from_row(
    row: &Row<'_>,
    cipher: &SecretsCipher,
) -> rusqlite::Result<Endpoint> {
    let url: String = row.get(2)?;
    let account_id = AccountId::from_trusted(row.get(1)?);
    let id = EndpointId::from_trusted(row.get(0)?);
    let open = |what: &str, stored: &str| {
        let plain = cipher
            .open(stored, &account_id, &id)
            .map_err(|e| corrupt(what, e))?;
        SigningSecret::parse(&plain).map_err(|e| corrupt(what, e))
    };
    let secret: String = row.get(4)?;
    let retiring_secret: Option<String> = row.get(5)?;
    let retiring_until: Option<i64> = row.get(6)?;
    let status: String = row.get(7)?;
    let event_types: Option<String> = row.get(8)?;
    let patterns: Option<Vec<String>> = event_types
        .map(|raw| serde_json::from_str(&raw).map_err(|e| corrupt("event_types", e)))
        .transpose()?;
    let retiring_secret = match (retiring_secret, retiring_until) {
        (Some(secret), Some(until)) => Some(RetiringSecret {
            secret: open("retiring_secret", &secret)?,
            until: from_millis(until),
        }),
        _ => None,
    };
    let rate_limit: Option<i64> = row.get(10)?;
    let secret = open("secret", &secret)?;
    let headers: Option<String> = row.get(15)?;
    let headers = SecretsAccess::from(cipher.clone())
        .open_headers(headers.as_deref(), &account_id, &id)
        .map_err(|e| corrupt("headers", e))?;
    Ok(Endpoint {
        id,
        account_id,
        url: EndpointUrl::parse(&url).map_err(|e| corrupt("url", e))?,
        description: row.get(3)?,
        secret,
        retiring_secret,
        status: EndpointStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
        event_types: EventTypeFilter::parse(patterns.as_deref())
            .map_err(|e| corrupt("event_types", e))?,
        max_in_flight: u32_col(row, 9)?,
        rate_limit_per_second: rate_limit.and_then(|v| u32::try_from(v).ok()),
        headers,
        failing_since: row.get::<_, Option<i64>>(11)?.map(from_millis),
        disabled_reason: row.get(12)?,
        created_at: from_millis(row.get(13)?),
        updated_at: from_millis(row.get(14)?),
    })
}

pub(super) fn delivery_from_row(row: &Row<'_>) -> rusqlite::Result<Delivery> {
    let status: String = row.get(5)?;
    Ok(Delivery {
        id: DeliveryId::from_trusted(row.get(0)?),
        account_id: AccountId::from_trusted(row.get(1)?),
        event_id: EventId::from_trusted(row.get(2)?),
        endpoint_id: EndpointId::from_trusted(row.get(3)?),
        event_type: EventType::from_trusted(row.get(4)?),
        status: DeliveryStatus::parse(&status)
            .ok_or_else(|| corrupt("delivery status", &status))?,
        attempts: u32_col(row, 6)?,
        next_try_at: row.get::<_, Option<i64>>(7)?.map(from_millis),
        last_status: opt_u16_col(row, 8)?,
        last_error: row.get(9)?,
        client_error_count: u32_col(row, 10)?,
        queued_until: None,
        created_at: from_millis(row.get(11)?),
        updated_at: from_millis(row.get(12)?),
        schedule_start: u32_col(row, 13)?,
        next_trigger: {
            let raw: String = row.get(14)?;
            Trigger::parse(&raw).ok_or_else(|| corrupt("next_trigger", &raw))?
        },
    })
}

pub(super) fn statuses_json(statuses: &[DeliveryStatus]) -> String {
    let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
    serde_json::to_string(&names).unwrap_or_else(|_| "[]".into())
}

pub(super) fn replay_from_row(row: &Row<'_>) -> rusqlite::Result<Replay> {
    let delivery: Option<String> = row.get(3)?;
    let endpoint: Option<String> = row.get(4)?;
    let scope = match (delivery, endpoint) {
        (Some(delivery), _) => ReplayScope::Delivery(DeliveryId::from_trusted(delivery)),
        (None, Some(endpoint)) => ReplayScope::Endpoint(EndpointId::from_trusted(endpoint)),
        (None, None) => return Err(corrupt("replay scope", "neither delivery nor endpoint")),
    };
    let statuses: String = row.get(7)?;
    let statuses: Vec<String> =
        serde_json::from_str(&statuses).map_err(|e| corrupt("replay statuses", e))?;
    let statuses = statuses
        .iter()
        .map(|s| DeliveryStatus::parse(s).ok_or_else(|| corrupt("replay status", s)))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let event_types: String = row.get(8)?;
    let event_types: Vec<String> =
        serde_json::from_str(&event_types).map_err(|e| corrupt("replay event types", e))?;
    Ok(Replay {
        id: ReplayId::from_trusted(row.get(0)?),
        account_id: AccountId::from_trusted(row.get(1)?),
        actor: row.get(2)?,
        scope,
        filter: ReplayFilter {
            since: row.get::<_, Option<i64>>(5)?.map(from_millis),
            until: row.get::<_, Option<i64>>(6)?.map(from_millis),
            statuses,
            event_types: event_types
                .into_iter()
                .map(EventType::from_trusted)
                .collect(),
            include_missed: row.get(12)?,
        },
        requested_at: from_millis(row.get(9)?),
        count: u32_col(row, 10)?,
        missed: u32_col(row, 13)?,
        more: row.get(11)?,
    })
}

/// The columns [`event_from_row`] reads.
pub(super) const EVENT_COLUMNS: &str = "account_id, id, type, created_at, payload, erased_at";

pub(super) fn event_from_row(row: &Row<'_>) -> rusqlite::Result<Event> {
    Ok(Event {
        account_id: AccountId::from_trusted(row.get(0)?),
        id: EventId::from_trusted(row.get(1)?),
        event_type: EventType::from_trusted(row.get(2)?),
        created_at: from_millis(row.get(3)?),
        payload: row.get(4)?,
        erased_at: row.get::<_, Option<i64>>(5)?.map(from_millis),
    })
}

pub(super) fn attempt_from_row(row: &Row<'_>) -> rusqlite::Result<Attempt> {
    let trigger: String = row.get(2)?;
    let headers: String = row.get(6)?;
    let latency: i64 = row.get(4)?;
    Ok(Attempt {
        delivery_id: DeliveryId::from_trusted(row.get(0)?),
        number: u32_col(row, 1)?,
        trigger: Trigger::parse(&trigger).ok_or_else(|| corrupt("trigger", &trigger))?,
        started_at: from_millis(row.get(3)?),
        latency_ms: u64::try_from(latency).unwrap_or(0),
        status_code: opt_u16_col(row, 5)?,
        response_headers: serde_json::from_str(&headers)
            .map_err(|e| corrupt("response_headers", e))?,
        response_body: row.get(7)?,
        response_body_truncated: row.get(8)?,
        error: row.get(9)?,
    })
}

pub(super) fn insert_event(tx: &Connection, event: &Event) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO events (account_id, id, type, created_at, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![event.account_id.as_str(), event.id.as_str(), event.event_type.as_str(), to_millis(event.created_at), event.payload],
    )?;
    Ok(())
}

/// Inserts the deliveries whose (event, endpoint) has none yet; returns which were new.
pub(super) fn insert_deliveries(
    tx: &Connection,
    deliveries: &[Delivery],
) -> rusqlite::Result<Vec<bool>> {
    let mut insert = tx.prepare_cached(&format!(
        "INSERT OR IGNORE INTO deliveries ({DELIVERY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
    ))?;
    let mut added = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        let inserted = insert.execute(params![
            d.id.as_str(),
            d.account_id.as_str(),
            d.event_id.as_str(),
            d.endpoint_id.as_str(),
            d.event_type.as_str(),
            d.status.as_str(),
            d.attempts,
            opt_millis(d.next_try_at),
            d.last_status,
            d.last_error,
            d.client_error_count,
            to_millis(d.created_at),
            to_millis(d.updated_at),
            d.schedule_start,
            d.next_trigger.as_str(),
        ])?;
        added.push(inserted == 1);
    }
    Ok(added)
}

pub(super) fn deliveries_of_event(
    conn: &Connection,
    account: &str,
    event: &str,
) -> rusqlite::Result<Vec<Delivery>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE account_id = ?1 AND event_id = ?2 ORDER BY id"
    ))?;
    let rows = stmt.query_map(params![account, event], delivery_from_row)?;
    rows.collect()
}

/// Up to `limit` of an event's deliveries to endpoints after `after` (all when `None`), in
/// endpoint-id order: a range of the `(account_id, event_id, endpoint_id)` unique index, in
/// its order, whatever the event's size (`tests::an_event_page_reads_its_index_in_order`).
pub(super) fn event_deliveries_after(
    conn: &Connection,
    account: &str,
    event: &str,
    after: Option<&str>,
    limit: u64,
) -> rusqlite::Result<Vec<Delivery>> {
    let mut stmt = conn.prepare_cached(&event_page_sql())?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    // No endpoint id is empty: '' is before them all.
    let rows = stmt.query_map(
        params![account, event, after.unwrap_or(""), limit],
        delivery_from_row,
    )?;
    rows.collect()
}

pub(super) fn event_page_sql() -> String {
    format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE account_id = ?1 AND event_id = ?2 \
         AND endpoint_id > ?3 ORDER BY endpoint_id LIMIT ?4"
    )
}
