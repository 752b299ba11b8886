//! Publishing outbox rows through the batch route, one request per account and size, and
//! sorting the answers into published, refused for good (the row is marked), try this account
//! again later, try everything again later, and stop: the token can never publish.

use std::time::Duration;

use hooklane::domain::outcome::parse_retry_after;
use serde_json::Value;

use super::{OutboxRow, RelayError};

/// Events one batch request holds at most (the API's limit).
const MAX_EVENTS: usize = 100;
/// A batch's rows together stay under this many bytes (well under the API's 3.7 MB for a
/// batch, so a request stays small to retry); a larger row goes alone.
const MAX_BODY_BYTES: usize = 192 * 1024;

/// What publishing a set of rows came to.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Row ids Hooklane has an event for now (new, or there already).
    pub published: Vec<String>,
    /// How many of those were there already (a row published again after a crash).
    pub existing: usize,
    /// Rows Hooklane refused for good, with its reason: never retried by themselves.
    pub refused: Vec<(String, String)>,
    /// Accounts whose every row was answered for good (published or refused).
    pub answered: Vec<String>,
    /// Accounts answered "not now" (Hooklane's 429 `rate_limited`, its publish limit; or its
    /// 500 `unreadable_item`): their rows not listed above stay unsent, and the next accounts'
    /// rows were published all the same.
    pub paused: Vec<AccountRetry>,
    /// Set when the API as a whole could not be reached or failed: publishing stopped there,
    /// and the rows not listed above stay unsent and are read again. Its error is a
    /// [`RelayError::Token`] when Hooklane refused the token (its own 401).
    pub error: Option<Retry>,
    /// Set when Hooklane answered that the token may not publish (its own 403 `forbidden`):
    /// no row can ever be published with it, and the relay stops with this error. The rows
    /// not listed above stay unsent.
    pub stop: Option<RelayError>,
}

/// A retryable answer: the rows are fine, and are sent again later.
#[derive(Debug)]
pub struct Retry {
    /// The answer's `Retry-After`, as a wait.
    pub after: Option<Duration>,
    pub error: RelayError,
}

/// A retryable answer that concerns one account.
#[derive(Debug)]
pub struct AccountRetry {
    pub account: String,
    pub retry: Retry,
}

/// Who a retryable answer holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// That account alone: its publish limit (429 `rate_limited`), or an item of its that
    /// Hooklane cannot read (500 `unreadable_item`).
    Account,
    /// Every account: the API cannot be reached, is down or overloaded (502, 503, 504, a
    /// gateway's 429 or 500), the token is refused (Hooklane's 401: the relay stops if it
    /// goes on), or what answers is not the batch route (a gateway's 401 or 403 included).
    Api,
}

/// Why publishing stopped before every account was answered.
enum Halt {
    Retry(Scope, Retry),
    /// The token can never publish.
    Stop(RelayError),
}

/// What the relay stops with when its token lacks `events:publish`.
pub const CANNOT_PUBLISH: &str = "the token cannot publish: it lacks events:publish; use the \
     admin token or an API key with events:publish";

/// Hooklane's answer to a token that may not publish, as the relay says it.
fn cannot_publish(detail: &str) -> RelayError {
    RelayError::Token(format!("{CANNOT_PUBLISH} (Hooklane: {detail})"))
}

/// Hooklane's answer to a token it does not take (unknown, revoked, expired), as the relay
/// says it.
fn token_refused(detail: &str) -> RelayError {
    RelayError::Token(format!(
        "Hooklane refused the token ({detail}); use the admin token or an API key with \
         events:publish"
    ))
}

/// What Hooklane says of the relay's token before anything is published.
#[derive(Debug)]
pub enum TokenCheck {
    /// It may publish (the admin token, or a key with `events:publish` or `admin`).
    Publishes,
    /// It never can (an account token, a key without `events:publish`): the relay stops.
    CannotPublish(RelayError),
    /// Hooklane's own 401: unknown, revoked or expired (or, for a few seconds, an admin
    /// token just rotated in through another API instance).
    Refused(RelayError),
    /// No answer of Hooklane's (it cannot be reached, a gateway or an older Hooklane
    /// answered): the batch route's answers decide.
    Unknown(String),
}

/// A client of the batch publish route.
#[derive(Debug, Clone)]
pub struct Publisher {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// How the API answered one batch.
enum Answer {
    /// One result per event, in order: created by this request, or there already; for one
    /// there already, the reason it is not this row's event when it is not (its id reused
    /// for another type or data).
    Published(Vec<Result<bool, String>>),
    /// The event at this index is refused, for this reason; nothing was written.
    RefusedAt(usize, String),
    /// Every event of the batch is refused for this reason (the account does not exist).
    RefusedAll(String),
    /// The API refused the batch without naming an event (it is too large, or it could not
    /// read it): halves are tried, and a row alone is refused with the reason.
    Narrow(String),
    Retry(Scope, Retry),
    /// The token can never publish: nothing of this batch, nor of any other, is written.
    Stop(RelayError),
}

impl Publisher {
    pub fn new(base: &str, token: &str) -> Result<Self, RelayError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| RelayError::Options(format!("HTTP client: {e}")))?;
        let base = base.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(RelayError::Options(format!(
                "--url {base:?} must start with http:// or https://"
            )));
        }
        Ok(Self {
            http,
            base: base.to_owned(),
            token: token.to_owned(),
        })
    }

    /// Asks Hooklane who the token is (`GET /v1/whoami`): a token that can never publish is
    /// known before any row is read, and before a row of another account than an account
    /// token's is answered "account not found" (and marked refused).
    pub async fn check_token(&self) -> TokenCheck {
        let url = format!("{}/v1/whoami", self.base);
        let response = match self
            .http
            .get(&url)
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(10))
            .send()
            .await
        {
            Ok(response) => response,
            Err(error) => return TokenCheck::Unknown(format!("GET {url}: {error}")),
        };
        let status = response.status().as_u16();
        let body: Value = match response.text().await {
            Ok(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
            Err(error) => return TokenCheck::Unknown(format!("GET {url}: {error}")),
        };
        let code = body["error"]["code"].as_str();
        match (status, body["scopes"].as_array()) {
            (200, Some(scopes)) => {
                let scopes: Vec<&str> = scopes.iter().filter_map(Value::as_str).collect();
                if scopes
                    .iter()
                    .any(|s| *s == "admin" || *s == "events:publish")
                {
                    TokenCheck::Publishes
                } else {
                    let kind = body["kind"].as_str().unwrap_or("unknown");
                    TokenCheck::CannotPublish(cannot_publish(&format!(
                        "GET /v1/whoami: a credential of kind `{kind}`, with scopes [{}]",
                        scopes.join(", ")
                    )))
                }
            }
            (401, _) if code == Some("unauthorized") => {
                let message = body["error"]["message"].as_str().unwrap_or_default();
                TokenCheck::Refused(token_refused(&format!("HTTP 401: {message}")))
            }
            _ => TokenCheck::Unknown(format!("GET {url}: HTTP {status}: {body}")),
        }
    }

    /// Publishes `rows` (in order within each account), each idempotent on its id. An account
    /// answered "not now" keeps its later rows (they are never sent before its earlier ones)
    /// and the next account goes on; a failure of the whole API stops here, and so does an
    /// answer that the token may not publish.
    pub async fn publish(&self, rows: &[OutboxRow]) -> Outcome {
        let mut outcome = Outcome::default();
        let mut accounts: Vec<&str> = Vec::new();
        for row in rows {
            if !accounts.contains(&row.account_id.as_str()) {
                accounts.push(&row.account_id);
            }
        }
        'accounts: for account in accounts {
            let mut pending: Vec<&OutboxRow> =
                rows.iter().filter(|r| r.account_id == account).collect();
            while !pending.is_empty() {
                let take = batch_len(&pending);
                let batch: Vec<&OutboxRow> = pending.drain(..take).collect();
                match self.publish_batch(account, batch, &mut outcome).await {
                    Ok(()) => {}
                    Err(Halt::Retry(Scope::Account, retry)) => {
                        outcome.paused.push(AccountRetry {
                            account: account.to_owned(),
                            retry,
                        });
                        continue 'accounts;
                    }
                    Err(Halt::Retry(Scope::Api, retry)) => {
                        outcome.error = Some(retry);
                        return outcome;
                    }
                    Err(Halt::Stop(error)) => {
                        outcome.stop = Some(error);
                        return outcome;
                    }
                }
            }
            outcome.answered.push(account.to_owned());
        }
        outcome
    }

    /// One batch, split or trimmed until the API takes it or refuses each row.
    async fn publish_batch(
        &self,
        account: &str,
        mut batch: Vec<&OutboxRow>,
        outcome: &mut Outcome,
    ) -> Result<(), Halt> {
        let mut queue: Vec<Vec<&OutboxRow>> = Vec::new();
        loop {
            if batch.is_empty() {
                match queue.pop() {
                    Some(next) => batch = next,
                    None => return Ok(()),
                }
                continue;
            }
            match self.send(account, &batch).await {
                Answer::Published(results) => {
                    for (row, result) in batch.iter().zip(results) {
                        match result {
                            Ok(created) => {
                                outcome.published.push(row.id.clone());
                                if !created {
                                    outcome.existing += 1;
                                }
                            }
                            Err(reason) => outcome.refused.push((row.id.clone(), reason)),
                        }
                    }
                    batch.clear();
                }
                Answer::RefusedAt(index, reason) if index < batch.len() => {
                    let row = batch.remove(index);
                    outcome.refused.push((row.id.clone(), reason));
                }
                Answer::RefusedAt(_, reason) | Answer::RefusedAll(reason) => {
                    for row in batch.drain(..) {
                        outcome.refused.push((row.id.clone(), reason.clone()));
                    }
                }
                Answer::Narrow(reason) if batch.len() == 1 => {
                    outcome.refused.push((batch[0].id.clone(), reason));
                    batch.clear();
                }
                Answer::Narrow(_) => {
                    let second = batch.split_off(batch.len() / 2);
                    queue.push(second);
                }
                Answer::Retry(scope, retry) => return Err(Halt::Retry(scope, retry)),
                Answer::Stop(error) => return Err(Halt::Stop(error)),
            }
        }
    }

    async fn send(&self, account: &str, batch: &[&OutboxRow]) -> Answer {
        // Checked before it goes in the URL: `../x` or `a#b` would address another route,
        // or another account.
        if hooklane::domain::AccountId::parse(account).is_err() {
            return Answer::RefusedAll(format!(
                "`{account}` is not an account id (1 to 128 letters, digits, `_.:-`)"
            ));
        }
        let mut events = Vec::with_capacity(batch.len());
        for (index, row) in batch.iter().enumerate() {
            // The API reads `data` as a JSON value too; a row whose data is not JSON is
            // refused here, without sending the rest.
            let Ok(data) = serde_json::from_str::<Value>(&row.data) else {
                return Answer::RefusedAt(index, "its data is not JSON".into());
            };
            events.push(serde_json::json!({"id": row.id, "type": row.event_type, "data": data}));
        }
        let url = format!("{}/v1/accounts/{account}/events/batch", self.base);
        let response = match self
            .http
            .post(&url)
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::json!({ "events": events }).to_string())
            .send()
            .await
        {
            Ok(response) => response,
            Err(error) => return retry(Scope::Api, None, format!("POST {url}: {error}")),
        };
        let status = response.status().as_u16();
        let after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            // A date already past is no answer: the relay's own backoff applies.
            .and_then(|value| parse_retry_after(value, chrono::Utc::now()));
        let body: Value = match response.text().await {
            Ok(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
            Err(error) => return retry(Scope::Api, after, format!("POST {url}: {error}")),
        };
        classify(status, after, &body, account, batch)
    }
}

fn retry(scope: Scope, after: Option<Duration>, message: String) -> Answer {
    Answer::Retry(
        scope,
        Retry {
            after,
            error: RelayError::Api(message),
        },
    )
}

/// What an answer of the batch route (with its `Retry-After`, as a wait) means for the rows
/// sent. Only Hooklane's own answers refuse rows for good, or stop the relay; anything else (a
/// proxy's 404 or 400, a mistyped `--url` that reaches an unknown route, API Gateway's 403
/// `{"message": "Missing Authentication Token"}` or a WAF's) is tried again, as nothing is
/// wrong with the rows.
fn classify(
    status: u16,
    after: Option<Duration>,
    body: &Value,
    account: &str,
    rows: &[&OutboxRow],
) -> Answer {
    let sent = rows.len();
    let message = body["error"]["message"]
        .as_str()
        .map_or_else(|| body.to_string(), str::to_owned);
    let code = body["error"]["code"].as_str();
    match status {
        200..=299 => match body["results"].as_array() {
            Some(results) if results.len() == sent => Answer::Published(
                results
                    .iter()
                    .zip(rows)
                    .map(|(result, row)| published(result, row))
                    .collect(),
            ),
            _ => retry(
                Scope::Api,
                after,
                format!("unexpected answer to a batch of {sent}: {body}"),
            ),
        },
        404 if code == Some("not_found") && message == "account not found" => {
            Answer::RefusedAll(format!(
                "account `{account}` not found (HTTP 404; a key limited to some accounts may \
                 only publish for those)"
            ))
        }
        413 => Answer::Narrow(format!("HTTP 413: {message}")),
        // Hooklane's own 409: a row's id is already another event (another type or other
        // data). Retrying cannot change that; the row is refused and the rest go on.
        409 if code == Some("conflict") => match refused_index(body) {
            Some(index) => Answer::RefusedAt(index, format!("HTTP {status}: {message}")),
            None => Answer::Narrow(format!("HTTP {status}: {message}")),
        },
        400 | 422 => match refused_index(body) {
            Some(index) => Answer::RefusedAt(index, format!("HTTP {status}: {message}")),
            // Hooklane's own answer naming no event (a body it could not read, an event id
            // it holds as rejected): the row at fault is found by halving.
            None if code.is_some() => Answer::Narrow(format!("HTTP {status}: {message}")),
            None => retry(Scope::Api, after, format!("HTTP {status}: {message}")),
        },
        // Nothing is wrong with the rows. Hooklane's own 429 (the account's publish limit) and
        // 500 (an item of the account cannot be read; an outage of its storage is a 503) hold
        // back that account alone. A 429 or 500 without that code is API Gateway's throttling
        // or a Lambda that failed (`{"message": …}`), or a panic: the next account's would
        // fail too.
        429 if code == Some("rate_limited") => {
            retry(Scope::Account, after, format!("HTTP {status}: {message}"))
        }
        500 if code == Some("unreadable_item") => {
            retry(Scope::Account, after, format!("HTTP {status}: {message}"))
        }
        // Hooklane's own 403: the token lacks `events:publish` (an account token, which never
        // holds it, or a key made without it). Keys' scopes never change and every account's
        // rows would get the same: retrying cannot help, and the relay stops saying why.
        403 if code == Some("forbidden") => {
            Answer::Stop(cannot_publish(&format!("HTTP 403: {message}")))
        }
        // Hooklane's own 401: the token is unknown, revoked or expired. Retried like an
        // outage, as another API instance may take an admin token just rotated in only once
        // its credential cache expires; the relay stops if it goes on (`relay::run`).
        401 if code == Some("unauthorized") => Answer::Retry(
            Scope::Api,
            Retry {
                after,
                error: token_refused(&format!("HTTP 401: {message}")),
            },
        ),
        // A gateway's or proxy's 401 and 403, 408, those 429s and 500s, 502, 503, 504, and
        // answers not of the batch route: the next account would get the same.
        _ => retry(Scope::Api, after, format!("HTTP {status}: {message}")),
    }
}

/// One result of a published batch: created, or there already. An event there already with
/// another type or data is not this row's: its id was used before (the row sent, then deleted
/// and written again), and the row is refused rather than taken for published. An erased one
/// has no data to compare.
fn published(result: &Value, row: &OutboxRow) -> Result<bool, String> {
    if result["created"].as_bool().unwrap_or(true) {
        return Ok(true);
    }
    let event = &result["event"];
    let same_type = event["type"].as_str() == Some(row.event_type.as_str());
    let erased = event.get("erased_at").is_some_and(|at| !at.is_null());
    let same_data = erased
        || serde_json::from_str::<Value>(&row.data)
            .is_ok_and(|data| same_json(&data, &event["data"]));
    if same_type && same_data {
        Ok(false)
    } else {
        Err(format!(
            "the id is already an event of type `{}` with other data: an id is used once",
            event["type"].as_str().unwrap_or_default()
        ))
    }
}

/// Whether two JSON values are the same, numbers compared by value within a relative 1e-12:
/// a number written and read again on its way through the API may come back a last digit
/// apart.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y
                || match (x.as_f64(), y.as_f64()) {
                    (Some(x), Some(y)) => (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
                    _ => false,
                }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| same_json(x, y)))
        }
        _ => a == b,
    }
}

/// The index of `events[3].type` in an error's `field`.
fn refused_index(body: &Value) -> Option<usize> {
    let field = body["error"]["field"].as_str()?;
    let rest = field.strip_prefix("events[")?;
    rest[..rest.find(']')?].parse().ok()
}

/// How many of `rows` go in the next request: at most [`MAX_EVENTS`], and under
/// [`MAX_BODY_BYTES`] (at least one).
fn batch_len(rows: &[&OutboxRow]) -> usize {
    let mut bytes = 0;
    let mut count = 0;
    for row in rows.iter().take(MAX_EVENTS) {
        let size = row.data.len() + row.id.len() + row.event_type.len() + 40;
        if count > 0 && bytes + size > MAX_BODY_BYTES {
            break;
        }
        bytes += size;
        count += 1;
    }
    count.max(1)
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::json;

    use super::*;

    fn row(id: &str, size: usize) -> OutboxRow {
        OutboxRow {
            id: id.into(),
            account_id: "acme".into(),
            event_type: "order.placed".into(),
            data: format!("\"{}\"", "x".repeat(size)),
        }
    }

    #[test]
    fn batches_stay_under_the_apis_limits() {
        let small: Vec<OutboxRow> = (0..150).map(|n| row(&n.to_string(), 10)).collect();
        let refs: Vec<&OutboxRow> = small.iter().collect();
        assert_eq!(batch_len(&refs), MAX_EVENTS);
        let big: Vec<OutboxRow> = (0..5).map(|n| row(&n.to_string(), 100_000)).collect();
        let refs: Vec<&OutboxRow> = big.iter().collect();
        assert_eq!(batch_len(&refs), 1);
        let huge = [row("h", 1_000_000)];
        assert_eq!(batch_len(&huge.iter().collect::<Vec<_>>()), 1);
    }

    /// Rows are refused for good only on the batch route's own answers: an account it does
    /// not know, or an event it names. A 404 of a route (a mistyped `--url`), a proxy's
    /// answer, or a 400 naming no event is tried again.
    #[test]
    fn only_the_routes_own_refusals_refuse_rows() {
        use serde_json::json;
        let refused_all = |a: &Answer| matches!(a, Answer::RefusedAll(_));
        let retried = |a: &Answer| matches!(a, Answer::Retry(Scope::Api, _));
        let account = json!({"error": {"code": "not_found", "message": "account not found"}});
        assert!(refused_all(&classify(404, None, &account, "acme", &[])));
        let route = json!({"error": {"code": "not_found", "message": "route not found"}});
        assert!(retried(&classify(404, None, &route, "acme", &[])));
        let proxy = Value::String("<html>Not Found</html>".into());
        assert!(retried(&classify(404, None, &proxy, "acme", &[])));
        assert!(retried(&classify(400, None, &proxy, "acme", &[])));
        // Hooklane's own 400 naming no event (a body it could not read): narrowed down.
        let unread = json!({"error": {"code": "malformed_json", "message": "x"}});
        assert!(matches!(
            classify(400, None, &unread, "acme", &[]),
            Answer::Narrow(_)
        ));
        let item =
            json!({"error": {"code": "invalid_field", "field": "events[1].type", "message": "x"}});
        assert!(matches!(
            classify(422, None, &item, "acme", &[]),
            Answer::RefusedAt(1, _)
        ));
    }

    /// A row whose id is already an event with other content is refused, not taken for
    /// published: its event would never be sent.
    #[test]
    fn an_id_used_before_for_other_content_refuses_the_row() {
        use serde_json::json;
        let row = OutboxRow {
            id: "cust_1.updated".into(),
            account_id: "acme".into(),
            event_type: "customer.updated".into(),
            data: r#"{"v": 2}"#.into(),
        };
        let there = |data: Value| json!({"created": false, "event": {"type": "customer.updated", "data": data}});
        assert_eq!(published(&there(json!({"v": 2})), &row), Ok(false));
        // A number a last digit apart after its way through the API is the same number.
        let precise = OutboxRow {
            data: r#"{"v": 0.30000000000000004}"#.into(),
            ..row.clone()
        };
        assert_eq!(published(&there(json!({"v": 0.3})), &precise), Ok(false));
        assert!(published(&there(json!({"v": 0.31})), &precise).is_err());
        assert!(published(&there(json!({"v": 1})), &row).is_err());
        assert_eq!(published(&json!({"created": true}), &row), Ok(true));
        let erased = json!({"created": false, "event": {"type": "customer.updated", "data": null, "erased_at": "2026-12-01T00:00:00.000Z"}});
        assert_eq!(published(&erased, &row), Ok(false));
    }

    /// Hooklane's own 429 (`rate_limited`, the account's publish limit) or 500
    /// (`unreadable_item`, an item of the account) holds back that account alone; any other
    /// 429 or 500 (API Gateway's throttling, a Lambda that crashed: `{"message": …}`), and
    /// an answer the next account would get too, holds back all. `Retry-After` is kept
    /// either way.
    #[test]
    fn a_retry_holds_back_the_account_or_the_whole_api() {
        let limited = serde_json::json!({"error": {"code": "rate_limited", "message": "x"}});
        let unreadable = serde_json::json!({"error": {"code": "unreadable_item", "message": "x"}});
        let eight = Some(Duration::from_secs(8));
        let scope = |status: u16, after: Option<Duration>, body: &Value| match classify(
            status,
            after,
            body,
            "acme",
            &[],
        ) {
            Answer::Retry(scope, retry) => Some((scope, retry.after)),
            _ => None,
        };
        assert_eq!(scope(429, eight, &limited), Some((Scope::Account, eight)));
        assert_eq!(scope(429, None, &limited), Some((Scope::Account, None)));
        assert_eq!(scope(500, None, &unreadable), Some((Scope::Account, None)));
        // The gateway's and Lambda's answers, and Hooklane's own for a panic (`internal`).
        let throttled = serde_json::json!({"message": "Too Many Requests"});
        let crashed = serde_json::json!({"message": "Internal server error"});
        let internal = serde_json::json!({"error": {"code": "internal", "message": "x"}});
        assert_eq!(scope(429, eight, &throttled), Some((Scope::Api, eight)));
        assert_eq!(scope(429, None, &throttled), Some((Scope::Api, None)));
        assert_eq!(scope(500, None, &crashed), Some((Scope::Api, None)));
        assert_eq!(scope(500, None, &internal), Some((Scope::Api, None)));
        assert_eq!(
            scope(500, None, &Value::String("".into())),
            Some((Scope::Api, None))
        );
        // The codes count only with their own status.
        assert_eq!(scope(500, None, &limited), Some((Scope::Api, None)));
        assert_eq!(scope(429, None, &unreadable), Some((Scope::Api, None)));
        assert_eq!(scope(503, eight, &limited), Some((Scope::Api, eight)));
        for status in [401, 403, 408, 502, 504] {
            assert_eq!(
                scope(status, None, &limited),
                Some((Scope::Api, None)),
                "{status}"
            );
        }
    }

    pub(in crate::relay) type Seen = Arc<Mutex<Vec<(String, Vec<String>)>>>;

    /// A batch route on 127.0.0.1 that lists the requests it gets and answers each with
    /// `answer(account, how many requests of that account came before)`: a status and a
    /// `Retry-After`; 202 publishes every event.
    pub(in crate::relay) async fn fake_api(
        answer: impl Fn(&str, usize) -> (u16, Option<&'static str>) + Clone + Send + Sync + 'static,
    ) -> (String, Seen) {
        fake_api_with(move |account, before| {
            let (status, after) = answer(account, before);
            (status, after, None)
        })
        .await
    }

    /// [`fake_api`], whose answers other than 202 may carry a body of their own (else
    /// Hooklane's 429 `rate_limited`). It has no other route: `GET /v1/whoami` is a 404.
    pub(in crate::relay) async fn fake_api_with(
        answer: impl Fn(&str, usize) -> (u16, Option<&'static str>, Option<Value>)
            + Clone
            + Send
            + Sync
            + 'static,
    ) -> (String, Seen) {
        use axum::{
            extract::Path,
            http::{HeaderValue, StatusCode},
            response::IntoResponse,
            routing::post,
            Json, Router,
        };
        let seen: Seen = Arc::default();
        let log = Arc::clone(&seen);
        let route = move |Path(account): Path<String>, Json(body): Json<Value>| {
            let (log, answer) = (Arc::clone(&log), answer.clone());
            async move {
                let ids: Vec<String> = body["events"]
                    .as_array()
                    .map(|events| {
                        events
                            .iter()
                            .filter_map(|e| e["id"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let before = {
                    let mut log = log.lock().unwrap();
                    let before = log.iter().filter(|(a, _)| *a == account).count();
                    log.push((account.clone(), ids.clone()));
                    before
                };
                let (status, retry_after, body) = answer(&account, before);
                let status = StatusCode::from_u16(status).unwrap();
                let body = if status == StatusCode::ACCEPTED {
                    json!({"results": ids.iter().map(|_| json!({"created": true})).collect::<Vec<_>>()})
                } else {
                    body.unwrap_or_else(
                        || json!({"error": {"code": "rate_limited", "message": "not now"}}),
                    )
                };
                let mut response = (status, Json(body)).into_response();
                if let Some(after) = retry_after {
                    response
                        .headers_mut()
                        .insert("retry-after", HeaderValue::from_static(after));
                }
                response
            }
        };
        let app = Router::new().route("/v1/accounts/{account}/events/batch", post(route));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, seen)
    }

    fn rows_of(spec: &[(&str, &str)]) -> Vec<OutboxRow> {
        spec.iter()
            .map(|(id, account)| OutboxRow {
                id: (*id).into(),
                account_id: (*account).into(),
                event_type: "order.placed".into(),
                data: "{}".into(),
            })
            .collect()
    }

    fn ids(of: &[&str]) -> Vec<String> {
        of.iter().map(|id| (*id).to_owned()).collect()
    }

    #[tokio::test]
    async fn an_account_answered_429_does_not_hold_back_the_next() {
        let (url, seen) =
            fake_api(|account, _| (if account == "hot" { 429 } else { 202 }, Some("8"))).await;
        let publisher = Publisher::new(&url, "token").unwrap();
        let rows = rows_of(&[("h1", "hot"), ("c1", "cool"), ("h2", "hot"), ("c2", "cool")]);
        let outcome = publisher.publish(&rows).await;
        assert_eq!(outcome.published, ["c1", "c2"]);
        assert!(outcome.refused.is_empty());
        assert!(outcome.error.is_none(), "{:?}", outcome.error);
        assert_eq!(outcome.answered, ["cool"]);
        assert_eq!(outcome.paused.len(), 1, "{:?}", outcome.paused);
        assert_eq!(outcome.paused[0].account, "hot");
        assert_eq!(outcome.paused[0].retry.after, Some(Duration::from_secs(8)));
        assert_eq!(
            *seen.lock().unwrap(),
            [
                ("hot".to_owned(), ids(&["h1", "h2"])),
                ("cool".to_owned(), ids(&["c1", "c2"]))
            ]
        );
    }

    /// An account with more rows than one request holds, answered 429 on its second: its
    /// first request's rows are published, none of the later ones is sent after the 429.
    #[tokio::test]
    async fn an_account_paused_mid_way_keeps_its_later_rows() {
        let (url, seen) = fake_api(|account, before| match (account, before) {
            ("hot", 0) => (202, None),
            ("hot", _) => (429, None),
            _ => (202, None),
        })
        .await;
        let publisher = Publisher::new(&url, "token").unwrap();
        let hot: Vec<String> = (0..150).map(|n| format!("h{n:03}")).collect();
        let mut spec: Vec<(&str, &str)> = hot.iter().map(|id| (id.as_str(), "hot")).collect();
        spec.push(("c1", "cool"));
        let outcome = publisher.publish(&rows_of(&spec)).await;
        let mut published = hot[..100].to_vec();
        published.push("c1".into());
        assert_eq!(outcome.published, published);
        assert_eq!(outcome.paused.len(), 1);
        assert_eq!(outcome.paused[0].retry.after, None);
        assert!(outcome.error.is_none());
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3, "hot twice, cool once");
        assert_eq!(seen[1].1, hot[100..].to_vec());
    }

    /// The API down as a whole (a proxy's 503): the round stops at the first answer, and its
    /// `Retry-After` is kept.
    #[tokio::test]
    async fn a_failure_of_the_whole_api_stops_the_round() {
        let (url, seen) = fake_api(|_, _| (503, Some("30"))).await;
        let publisher = Publisher::new(&url, "token").unwrap();
        let outcome = publisher
            .publish(&rows_of(&[("a1", "a"), ("b1", "b")]))
            .await;
        assert!(outcome.published.is_empty() && outcome.paused.is_empty());
        assert!(outcome.answered.is_empty());
        let retry = outcome.error.expect("an API failure");
        assert_eq!(retry.after, Some(Duration::from_secs(30)));
        assert_eq!(*seen.lock().unwrap(), [("a".to_owned(), ids(&["a1"]))]);
    }

    /// Hooklane's own 403 (`forbidden`: the token lacks `events:publish`) stops the relay,
    /// naming the fix; its own 401 is retried, as the token's refusal. A 401 or 403 that is not
    /// Hooklane's JSON (API Gateway's `Missing Authentication Token` for a mistyped `--url`, a
    /// WAF's page) is retried like any answer not of the batch route.
    #[test]
    fn hooklanes_own_403_stops_the_relay_and_a_gateways_is_retried() {
        let forbidden = json!({"error": {"code": "forbidden",
            "message": "this route needs the `events:publish` scope"}});
        match classify(403, None, &forbidden, "acme", &[]) {
            Answer::Stop(RelayError::Token(message)) => {
                assert!(message.starts_with(CANNOT_PUBLISH), "{message}");
                assert!(message.contains("this route needs"), "{message}");
            }
            _ => panic!("Hooklane's 403 does not stop the relay"),
        }
        let unauthorized =
            json!({"error": {"code": "unauthorized", "message": "credential has been revoked"}});
        match classify(401, None, &unauthorized, "acme", &[]) {
            Answer::Retry(
                Scope::Api,
                Retry {
                    error: RelayError::Token(message),
                    ..
                },
            ) => {
                assert!(message.contains("refused the token"), "{message}");
                assert!(message.contains("credential has been revoked"), "{message}");
            }
            _ => panic!("Hooklane's 401 is not a refused token"),
        }
        let gateway = [
            (403, json!({"message": "Missing Authentication Token"})),
            (403, json!({"message": "Forbidden"})),
            (403, Value::String("<html>403 Forbidden</html>".into())),
            (401, json!({"message": "Unauthorized"})),
            // The codes count only with their own status.
            (401, forbidden.clone()),
            (403, unauthorized.clone()),
        ];
        for (status, body) in gateway {
            assert!(
                matches!(
                    classify(status, None, &body, "acme", &[]),
                    Answer::Retry(
                        Scope::Api,
                        Retry {
                            error: RelayError::Api(_),
                            ..
                        }
                    )
                ),
                "{status} {body}"
            );
        }
    }

    /// The batch route answering Hooklane's 403: publishing stops at the first request, with
    /// nothing published or refused, and the next account is not tried.
    #[tokio::test]
    async fn a_token_that_cannot_publish_stops_the_round() {
        let forbidden = json!({"error": {"code": "forbidden",
            "message": "this route needs the `events:publish` scope"}});
        let (url, seen) = fake_api_with(move |_, _| (403, None, Some(forbidden.clone()))).await;
        let publisher = Publisher::new(&url, "token").unwrap();
        let outcome = publisher
            .publish(&rows_of(&[("a1", "a"), ("b1", "b")]))
            .await;
        assert!(outcome.published.is_empty() && outcome.refused.is_empty());
        assert!(outcome.paused.is_empty() && outcome.error.is_none());
        let stop = outcome.stop.expect("a stop");
        assert!(stop.to_string().starts_with(CANNOT_PUBLISH), "{stop}");
        assert_eq!(*seen.lock().unwrap(), [("a".to_owned(), ids(&["a1"]))]);
    }

    /// A `GET /v1/whoami` on 127.0.0.1 answering `status` and `body`.
    async fn whoami(status: u16, body: Value) -> String {
        use axum::{http::StatusCode, routing::get, Json, Router};
        let status = StatusCode::from_u16(status).unwrap();
        let app = Router::new().route(
            "/v1/whoami",
            get(move || {
                let body = body.clone();
                async move { (status, Json(body)) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// What `GET /v1/whoami` says decides only when it is Hooklane's answer: an account
    /// token, or a key without `events:publish`, cannot publish; a 404 (an older Hooklane,
    /// a gateway) leaves it to the batch route.
    #[tokio::test]
    async fn the_token_is_checked_by_whoami() {
        let check = |status: u16, body: Value| async move {
            let url = whoami(status, body).await;
            Publisher::new(&url, "token").unwrap().check_token().await
        };
        let account = json!({"kind": "account", "account_id": "acme",
            "scopes": ["endpoints:read", "endpoints:write", "deliveries:read"]});
        match check(200, account).await {
            TokenCheck::CannotPublish(error) => {
                let message = error.to_string();
                assert!(message.starts_with(CANNOT_PUBLISH), "{message}");
                assert!(message.contains("`account`"), "{message}");
            }
            other => panic!("an account token: {other:?}"),
        }
        let reader = json!({"kind": "key", "scopes": ["deliveries:read"]});
        assert!(matches!(
            check(200, reader).await,
            TokenCheck::CannotPublish(_)
        ));
        for publisher in [
            json!({"kind": "admin", "scopes": ["admin"]}),
            json!({"kind": "key", "scopes": ["events:publish"], "accounts": ["acme"]}),
            json!({"kind": "key", "scopes": ["admin"]}),
        ] {
            assert!(
                matches!(check(200, publisher.clone()).await, TokenCheck::Publishes),
                "{publisher}"
            );
        }
        let refused = json!({"error": {"code": "unauthorized", "message": "invalid token"}});
        assert!(matches!(
            check(401, refused).await,
            TokenCheck::Refused(RelayError::Token(_))
        ));
        for (status, body) in [
            (
                404,
                json!({"error": {"code": "not_found", "message": "route not found"}}),
            ),
            (403, json!({"message": "Missing Authentication Token"})),
            (401, json!({"message": "Unauthorized"})),
            (503, json!({"message": "Service Unavailable"})),
            (200, json!({"ok": true})),
        ] {
            assert!(
                matches!(check(status, body.clone()).await, TokenCheck::Unknown(_)),
                "{status} {body}"
            );
        }
        // Nothing listening: unknown too.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        assert!(matches!(
            Publisher::new(&url, "token").unwrap().check_token().await,
            TokenCheck::Unknown(_)
        ));
    }

    /// Hooklane's 409 `conflict` naming an event of the batch (its id is already another
    /// event: another type or other data): that row is refused with the reason and the rest
    /// of the batch sent again and published; nothing is retried or held back.
    #[tokio::test]
    async fn a_row_whose_id_is_another_event_is_refused_and_the_rest_published() {
        let conflict = json!({"error": {"code": "conflict",
            "message": "events[1]: event `a2` was already published with other data: an event \
                        id names one event; publish this one under a new id",
            "field": "events[1].data"}});
        let (url, seen) = fake_api_with(move |_, before| match before {
            0 => (409, None, Some(conflict.clone())),
            _ => (202, None, None),
        })
        .await;
        let publisher = Publisher::new(&url, "token").unwrap();
        let outcome = publisher
            .publish(&rows_of(&[("a1", "a"), ("a2", "a"), ("a3", "a")]))
            .await;
        assert!(outcome.error.is_none(), "{:?}", outcome.error);
        assert!(outcome.paused.is_empty(), "{:?}", outcome.paused);
        assert_eq!(outcome.published, ["a1", "a3"]);
        assert_eq!(outcome.refused.len(), 1, "{:?}", outcome.refused);
        let (row, reason) = &outcome.refused[0];
        assert_eq!(row, "a2");
        assert!(
            reason.starts_with(
                "HTTP 409: events[1]: event `a2` was already published with other data"
            ),
            "{reason}"
        );
        assert_eq!(outcome.answered, ["a"]);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                ("a".to_owned(), ids(&["a1", "a2", "a3"])),
                ("a".to_owned(), ids(&["a1", "a3"]))
            ]
        );
        // A 409 that is not Hooklane's (no `conflict` code) is no verdict on the rows.
        let gateway = json!({"message": "Conflict"});
        assert!(matches!(
            classify(409, None, &gateway, "a", &[]),
            Answer::Retry(Scope::Api, _)
        ));
    }

    #[test]
    fn the_refused_event_is_found_by_its_field() {
        let body =
            serde_json::json!({"error": {"code": "invalid_field", "field": "events[12].type"}});
        assert_eq!(refused_index(&body), Some(12));
        assert_eq!(refused_index(&serde_json::json!({"error": {}})), None);
    }
}
