//! Publishing outbox rows through the batch route, one request per account and size, and
//! sorting the answers into published, refused for good (the row is marked) and try again.

use std::time::Duration;

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
    /// Set when the API could not be reached or failed: the rows not listed above stay
    /// unsent and are read again.
    pub error: Option<RelayError>,
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
    Retry(RelayError),
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

    /// Publishes `rows` (in order within each account), each idempotent on its id.
    pub async fn publish(&self, rows: &[OutboxRow]) -> Outcome {
        let mut outcome = Outcome::default();
        let mut accounts: Vec<&str> = Vec::new();
        for row in rows {
            if !accounts.contains(&row.account_id.as_str()) {
                accounts.push(&row.account_id);
            }
        }
        for account in accounts {
            let mut pending: Vec<&OutboxRow> =
                rows.iter().filter(|r| r.account_id == account).collect();
            while !pending.is_empty() {
                let take = batch_len(&pending);
                let batch: Vec<&OutboxRow> = pending.drain(..take).collect();
                if let Err(error) = self.publish_batch(account, batch, &mut outcome).await {
                    outcome.error = Some(error);
                    return outcome;
                }
            }
        }
        outcome
    }

    /// One batch, split or trimmed until the API takes it or refuses each row.
    async fn publish_batch(
        &self,
        account: &str,
        mut batch: Vec<&OutboxRow>,
        outcome: &mut Outcome,
    ) -> Result<(), RelayError> {
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
                Answer::Retry(error) => return Err(error),
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
            Err(error) => return Answer::Retry(RelayError::Api(format!("POST {url}: {error}"))),
        };
        let status = response.status().as_u16();
        let body: Value = match response.text().await {
            Ok(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
            Err(error) => return Answer::Retry(RelayError::Api(format!("POST {url}: {error}"))),
        };
        classify(status, &body, account, batch)
    }
}

/// What an answer of the batch route means for the rows sent. Only Hooklane's own answers
/// refuse rows for good; anything else (a proxy's 404 or 400, a mistyped `--url` that
/// reaches an unknown route) is tried again, as nothing is wrong with the rows.
fn classify(status: u16, body: &Value, account: &str, rows: &[&OutboxRow]) -> Answer {
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
            _ => Answer::Retry(RelayError::Api(format!(
                "unexpected answer to a batch of {sent}: {body}"
            ))),
        },
        404 if code == Some("not_found") && message == "account not found" => {
            Answer::RefusedAll(format!(
                "account `{account}` not found (HTTP 404; with an account token, the token may \
                 only publish for its own account)"
            ))
        }
        413 => Answer::Narrow(format!("HTTP 413: {message}")),
        400 | 422 => match refused_index(body) {
            Some(index) => Answer::RefusedAt(index, format!("HTTP {status}: {message}")),
            // Hooklane's own answer naming no event (a body it could not read, an event id
            // it holds as rejected): the row at fault is found by halving.
            None if code.is_some() => Answer::Narrow(format!("HTTP {status}: {message}")),
            None => Answer::Retry(RelayError::Api(format!("HTTP {status}: {message}"))),
        },
        // 401, 403 (the token), 408, 429, 5xx, and answers not of the batch route: nothing
        // is wrong with the rows.
        _ => Answer::Retry(RelayError::Api(format!("HTTP {status}: {message}"))),
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
mod tests {
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
        let retried = |a: &Answer| matches!(a, Answer::Retry(_));
        let account = json!({"error": {"code": "not_found", "message": "account not found"}});
        assert!(refused_all(&classify(404, &account, "acme", &[])));
        let route = json!({"error": {"code": "not_found", "message": "route not found"}});
        assert!(retried(&classify(404, &route, "acme", &[])));
        let proxy = Value::String("<html>Not Found</html>".into());
        assert!(retried(&classify(404, &proxy, "acme", &[])));
        assert!(retried(&classify(400, &proxy, "acme", &[])));
        // Hooklane's own 400 naming no event (a body it could not read): narrowed down.
        let unread = json!({"error": {"code": "malformed_json", "message": "x"}});
        assert!(matches!(
            classify(400, &unread, "acme", &[]),
            Answer::Narrow(_)
        ));
        let item =
            json!({"error": {"code": "invalid_field", "field": "events[1].type", "message": "x"}});
        assert!(matches!(
            classify(422, &item, "acme", &[]),
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

    #[test]
    fn the_refused_event_is_found_by_its_field() {
        let body =
            serde_json::json!({"error": {"code": "invalid_field", "field": "events[12].type"}});
        assert_eq!(refused_index(&body), Some(12));
        assert_eq!(refused_index(&serde_json::json!({"error": {}})), None);
    }
}
