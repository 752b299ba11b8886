//! Endpoints: created within the account's limit, changed, enabled and disabled, their secret
//! rotated; each change audited and made over the endpoint as it was read.
use std::time::Duration;

use rand::Rng;

use super::{audit, ServiceError, ServiceResult};
use crate::{
    clock::Timestamp,
    domain::{
        endpoint::{self, RetiringSecret},
        headers::CustomHeaders,
        stats::{hour_of, EndpointStats, STATS_HOURS},
        AccountId, AuditAction, AuditTarget, Caller, Endpoint, EndpointId, EndpointStatus,
        EndpointUrl, EndpointVersion, EventTypeFilter, InvalidField, TargetKind,
    },
    http::SsrfError,
    signing::SigningSecret,
    store::{AuditedChange, DisableRequest, EndpointDeletion, StoreError},
    App,
};

#[derive(Debug, Clone, Default)]
pub struct NewEndpoint {
    pub url: String,
    pub description: Option<String>,
    pub event_types: Option<Vec<String>>,
    pub max_in_flight: Option<u32>,
    pub rate_limit_per_second: Option<u32>,
    /// A `whsec_…` secret to use instead of a generated one.
    pub secret: Option<String>,
    /// Custom headers, as the API takes them (`CustomHeaders::parse`).
    pub headers: Option<serde_json::Value>,
}

/// A partial update; `Some(None)` clears an optional field.
#[derive(Debug, Clone, Default)]
pub struct EndpointChanges {
    pub url: Option<String>,
    pub description: Option<String>,
    pub event_types: Option<Option<Vec<String>>>,
    pub max_in_flight: Option<u32>,
    pub rate_limit_per_second: Option<Option<u32>>,
    /// A merge patch of the custom headers (`CustomHeaders::patched`); `Some(None)` removes
    /// them all.
    pub headers: Option<Option<serde_json::Value>>,
}

/// Refuses URLs whose host is, or resolves to, an address webhooks must never reach.
/// A host that does not resolve yet is accepted: it is checked again at every send.
async fn check_reachable(app: &App, url: &EndpointUrl) -> ServiceResult<()> {
    let policy = app.config.address_policy();
    policy.check_url(url.as_url()).map_err(refused)?;
    if let Some(url::Host::Domain(host)) = url.as_url().host() {
        let port = url.as_url().port_or_known_default().unwrap_or(443);
        let lookup =
            tokio::time::timeout(Duration::from_secs(2), policy.resolve_checked(host, port)).await;
        if let Ok(Err(
            error @ (SsrfError::Forbidden { .. } | SsrfError::ResolvesForbidden { .. }),
        )) = lookup
        {
            return Err(refused(error).into());
        }
    }
    Ok(())
}

/// The one answer to every refused address. Whatever the address and its reason, the answer
/// is the same, so whoever sets a URL cannot use it to learn which internal names the
/// server's DNS knows or what kind of address they lead to.
const REFUSED_ADDRESS: &str =
    "the host is, or resolves to, an address Hooklane is not allowed to send to";

/// The answer to a URL the address policy refuses. A refused address gets [`REFUSED_ADDRESS`]
/// and its reason goes to the log only; what is wrong with the URL's text itself (its scheme,
/// credentials, a localhost name) is said as it is, since it tells nothing of the network.
fn refused(error: SsrfError) -> InvalidField {
    match error {
        SsrfError::Forbidden { .. } | SsrfError::ResolvesForbidden { .. } => {
            tracing::info!(reason = %error, "an endpoint url is refused");
            InvalidField::new("url", REFUSED_ADDRESS)
        }
        other => InvalidField::new("url", other.to_string()),
    }
}

/// Records a change to endpoint `id` of `account`.
async fn audited(
    app: &App,
    caller: &Caller,
    account: &AccountId,
    id: &EndpointId,
    action: AuditAction,
    details: serde_json::Value,
) -> ServiceResult<()> {
    audit::record(
        app,
        caller,
        Some(account),
        action,
        AuditTarget::new(TargetKind::Endpoint, id),
        audit::details(details),
    )
    .await
}

/// Writes `endpoint` (created, or changed from the version `read`) with the entry of
/// `action` on it.
async fn write_audited(
    app: &App,
    caller: &Caller,
    endpoint: &Endpoint,
    read: Option<EndpointVersion>,
    action: AuditAction,
    details: serde_json::Value,
) -> ServiceResult<()> {
    let entry = audit::entry(
        app,
        caller,
        Some(&endpoint.account_id),
        action,
        AuditTarget::new(TargetKind::Endpoint, &endpoint.id),
        details,
    );
    let change = match read {
        None => AuditedChange::CreateEndpoint {
            endpoint: endpoint.clone(),
            limit: Some(app.config.max_endpoints),
        },
        Some(read) => AuditedChange::UpdateEndpoint {
            endpoint: endpoint.clone(),
            read,
        },
    };
    audit::change(app, change, &[entry]).await
}

/// Reads before giving up on a change that other writes keep overtaking.
const CHANGE_TRIES: usize = 5;

/// Reads endpoint `id` (the first time, `read` when given), lets `change` modify it
/// (returning the details of its audit entry) and writes it over the version read. When another write landed in between (an API call,
/// the health check or the owner disabling the endpoint), it starts again from a fresh read,
/// so neither change is lost and `change` decides again on what is stored now.
async fn change_endpoint(
    app: &App,
    caller: &Caller,
    account: &AccountId,
    id: &EndpointId,
    mut read: Option<Endpoint>,
    action: AuditAction,
    mut change: impl FnMut(&mut Endpoint, Timestamp) -> ServiceResult<serde_json::Value>,
) -> ServiceResult<Endpoint> {
    for tried in 0..CHANGE_TRIES {
        if tried > 0 {
            // Apart, so that requests overtaken together do not meet again at once.
            let pause = rand::rng().random_range(1..=10 * tried as u64);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        let mut endpoint = match read.take() {
            Some(endpoint) => endpoint,
            None => get(app, account, id).await?,
        };
        let version = endpoint.version();
        let now = app.clock.now();
        let details = change(&mut endpoint, now)?;
        endpoint.touch(now);
        match write_audited(app, caller, &endpoint, Some(version), action, details).await {
            Err(ServiceError::Store(StoreError::Changed(_))) => continue,
            written => return written.map(|()| endpoint),
        }
    }
    Err(ServiceError::Conflict(
        "the endpoint kept changing while this request ran; try again".into(),
    ))
}

pub async fn create(
    app: &App,
    account: &AccountId,
    input: NewEndpoint,
    caller: &Caller,
) -> ServiceResult<Endpoint> {
    if app.store.get_account(account).await?.is_none() {
        return Err(ServiceError::NotFound("account"));
    }
    let url = EndpointUrl::parse(&input.url)?;
    let secret = match input.secret.as_deref() {
        Some(raw) => {
            SigningSecret::parse(raw).map_err(|e| InvalidField::new("secret", e.to_string()))?
        }
        None => SigningSecret::generate(),
    };
    let now = app.clock.now();
    let endpoint = Endpoint {
        id: EndpointId::generate(),
        account_id: account.clone(),
        description: endpoint::parse_description(input.description.as_deref())?,
        secret,
        retiring_secret: None,
        status: EndpointStatus::Active,
        event_types: EventTypeFilter::parse(input.event_types.as_deref())?,
        max_in_flight: endpoint::parse_max_in_flight(input.max_in_flight)?,
        rate_limit_per_second: endpoint::parse_rate_limit(input.rate_limit_per_second)?,
        headers: CustomHeaders::parse(input.headers.as_ref())?,
        failing_since: None,
        disabled_reason: None,
        created_at: now,
        updated_at: now,
        url,
    };
    check_reachable(app, &endpoint.url).await?;
    // The secret and header values stay out: an entry must never hold a secret.
    let headers: Vec<&str> = endpoint.headers.iter().map(|(name, _)| name).collect();
    let details = serde_json::json!({
        "url": endpoint.url.as_str(),
        "secret_given": input.secret.is_some(),
        "headers": headers,
    });
    // The store counts the account's endpoints with the write: two creates at once cannot
    // both take the last place.
    let written = write_audited(
        app,
        caller,
        &endpoint,
        None,
        AuditAction::EndpointCreated,
        details,
    )
    .await;
    match written {
        Err(ServiceError::Store(StoreError::LimitReached(_))) => {
            let limit = app.config.max_endpoints;
            Err(ServiceError::Conflict(format!(
                "this account has {limit} endpoints, the most it may have (HOOKLANE_MAX_ENDPOINTS); delete one first"
            )))
        }
        other => other.map(|()| endpoint),
    }
}

pub async fn get(app: &App, account: &AccountId, id: &EndpointId) -> ServiceResult<Endpoint> {
    app.store
        .get_endpoint(account, id)
        .await?
        .ok_or(ServiceError::NotFound("endpoint"))
}

/// The endpoint and its attempts of the last 7 days, hour by hour, at the store's clock.
pub async fn stats(
    app: &App,
    account: &AccountId,
    id: &EndpointId,
) -> ServiceResult<(Endpoint, EndpointStats)> {
    // The counts first: an attempt they include was recorded, failing clock and all, before
    // the endpoint is read, so the answer never counts a success on an endpoint still shown
    // failing (read the other way round, a poll once saw both).
    let now = app.clock.now();
    let since = hour_of(now) - chrono::TimeDelta::hours(STATS_HOURS as i64 - 1);
    let counts = app.store.endpoint_hours(id, since).await?;
    let endpoint = get(app, account, id).await?;
    Ok((endpoint, EndpointStats::from_counts(&counts, now)))
}

pub async fn list(app: &App, account: &AccountId) -> ServiceResult<Vec<Endpoint>> {
    if app.store.get_account(account).await?.is_none() {
        return Err(ServiceError::NotFound("account"));
    }
    Ok(app.store.list_endpoints(account).await?)
}

pub async fn update(
    app: &App,
    account: &AccountId,
    id: &EndpointId,
    changes: EndpointChanges,
    caller: &Caller,
) -> ServiceResult<Endpoint> {
    // Read first, so that a missing endpoint is a 404 before any field is a 422; the first
    // try is made from this read.
    let existing = get(app, account, id).await?;
    let changed: Vec<&str> = [
        ("url", changes.url.is_some()),
        ("description", changes.description.is_some()),
        ("event_types", changes.event_types.is_some()),
        ("max_in_flight", changes.max_in_flight.is_some()),
        (
            "rate_limit_per_second",
            changes.rate_limit_per_second.is_some(),
        ),
        ("headers", changes.headers.is_some()),
    ]
    .into_iter()
    .filter_map(|(field, given)| given.then_some(field))
    .collect();
    // Parsed once, not at each try: only the headers' merge patch depends on what is stored.
    let url = match changes.url.as_deref() {
        Some(raw) => {
            let url = EndpointUrl::parse(raw)?;
            check_reachable(app, &url).await?;
            Some(url)
        }
        None => None,
    };
    let description = changes
        .description
        .as_deref()
        .map(|d| endpoint::parse_description(Some(d)))
        .transpose()?;
    let event_types = changes
        .event_types
        .as_ref()
        .map(|types| EventTypeFilter::parse(types.as_deref()))
        .transpose()?;
    let max_in_flight = changes
        .max_in_flight
        .map(|max| endpoint::parse_max_in_flight(Some(max)))
        .transpose()?;
    let rate = changes
        .rate_limit_per_second
        .map(endpoint::parse_rate_limit)
        .transpose()?;
    let details = serde_json::json!({ "changed": changed });
    let action = AuditAction::EndpointUpdated;
    let endpoint = change_endpoint(
        app,
        caller,
        account,
        id,
        Some(existing),
        action,
        |endpoint, _| {
            if let Some(url) = &url {
                endpoint.url = url.clone();
            }
            if let Some(description) = &description {
                endpoint.description = description.clone();
            }
            if let Some(event_types) = &event_types {
                endpoint.event_types = event_types.clone();
            }
            if let Some(max) = max_in_flight {
                endpoint.max_in_flight = max;
            }
            if let Some(rate) = rate {
                endpoint.rate_limit_per_second = rate;
            }
            match &changes.headers {
                None => {}
                Some(None) => endpoint.headers = CustomHeaders::default(),
                Some(Some(patch)) => endpoint.headers = endpoint.headers.patched(Some(patch))?,
            }
            Ok(details.clone())
        },
    )
    .await?;
    app.queue
        .update_lane(
            &endpoint.id,
            endpoint.max_in_flight,
            endpoint.rate_limit_per_second,
        )
        .await;
    Ok(endpoint)
}

pub async fn delete(
    app: &App,
    account: &AccountId,
    id: &EndpointId,
    caller: &Caller,
) -> ServiceResult<()> {
    if app
        .store
        .delete_endpoint(&EndpointDeletion {
            account_id: account.clone(),
            endpoint_id: id.clone(),
            at: app.clock.now(),
        })
        .await?
    {
        let details = serde_json::json!({});
        audited(
            app,
            caller,
            account,
            id,
            AuditAction::EndpointDeleted,
            details,
        )
        .await
    } else {
        Err(ServiceError::NotFound("endpoint"))
    }
}

/// Re-enables an endpoint with a fresh health clock. Abandoned deliveries stay abandoned
/// until the customer asks for a replay.
pub async fn enable(
    app: &App,
    account: &AccountId,
    id: &EndpointId,
    caller: &Caller,
) -> ServiceResult<Endpoint> {
    let action = AuditAction::EndpointEnabled;
    change_endpoint(app, caller, account, id, None, action, |endpoint, _| {
        let was = endpoint.status;
        endpoint.status = EndpointStatus::Active;
        endpoint.failing_since = None;
        endpoint.disabled_reason = None;
        Ok(serde_json::json!({ "was": was.as_str() }))
    })
    .await
}

/// Disables an endpoint on its owner's request; its pending deliveries are abandoned.
pub async fn disable(
    app: &App,
    account: &AccountId,
    id: &EndpointId,
    caller: &Caller,
) -> ServiceResult<Endpoint> {
    let endpoint = get(app, account, id).await?;
    if endpoint.status == EndpointStatus::Active {
        let reason = "disabled through the API";
        let disabled = app
            .store
            .disable_endpoint(&DisableRequest {
                account_id: account.clone(),
                endpoint_id: id.clone(),
                reason: reason.into(),
                now: app.clock.now(),
                expected_failing_since: endpoint.failing_since,
                notification: None,
                operational_event: None,
            })
            .await?;
        if let Some(outcome) = disabled {
            let details = serde_json::json!({ "reason": reason, "abandoned": outcome.abandoned });
            audited(
                app,
                caller,
                account,
                id,
                AuditAction::EndpointDisabled,
                details,
            )
            .await?;
        }
    }
    get(app, account, id).await
}

/// Replaces the signing secret; the old one keeps signing for `grace`. Refused while an
/// earlier rotation's grace runs, unless `grace` is zero.
pub async fn rotate_secret(
    app: &App,
    account: &AccountId,
    id: &EndpointId,
    grace: Duration,
    caller: &Caller,
) -> ServiceResult<Endpoint> {
    let action = AuditAction::EndpointSecretRotated;
    change_endpoint(app, caller, account, id, None, action, |endpoint, now| {
        // One secret retires at a time: a second rotation with a grace period would end the
        // first one's at once (a double click, a retried script), and receivers still on
        // the original secret would fail every delivery. One without (an emergency) ends
        // both.
        if let Some(retiring) = endpoint.retiring_secret.as_ref().filter(|r| r.until > now) {
            if !grace.is_zero() {
                return Err(ServiceError::Conflict(format!(
                    "a rotation is under way: the previous secret signs until {}; rotate again \
                     after that, or with grace_period_seconds 0 to stop both previous secrets now",
                    retiring
                        .until
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                )));
            }
        }
        let old = std::mem::replace(&mut endpoint.secret, SigningSecret::generate());
        endpoint.retiring_secret = (!grace.is_zero()).then(|| RetiringSecret {
            secret: old,
            until: crate::clock::add(now, grace),
        });
        // Neither secret goes in: only how long the old one keeps signing.
        Ok(serde_json::json!({ "grace_period_seconds": grace.as_secs() }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::http::ssrf::forbidden_reason;

    fn reason(ip: &str) -> &'static str {
        forbidden_reason(ip.parse::<IpAddr>().unwrap()).unwrap()
    }

    /// A name the server resolves to a private address and one it resolves to loopback (and
    /// the same addresses written in the URL) are answered alike: the answer tells nothing of
    /// the server's DNS. Why is only logged.
    #[test]
    fn a_refused_address_is_answered_alike_whatever_the_reason() {
        let named = |host: &str, ip: &str| SsrfError::ResolvesForbidden {
            host: host.to_owned(),
            reason: reason(ip),
        };
        let literal = |ip: &str| SsrfError::Forbidden {
            ip: ip.parse().unwrap(),
            reason: reason(ip),
        };
        let answers: Vec<InvalidField> = [
            named("db.corp.internal", "10.1.2.3"),
            named("admin.corp.internal", "127.0.0.1"),
            named("metadata.google.internal", "169.254.169.254"),
            literal("192.168.0.1"),
            literal("::1"),
        ]
        .into_iter()
        .map(refused)
        .collect();
        let messages: Vec<&str> = answers.iter().map(|a| a.message.as_str()).collect();
        assert!(
            messages.iter().all(|m| *m == messages[0]),
            "told apart: {messages:#?}"
        );
        for answer in &answers {
            assert_eq!(answer.field, "url");
            for told in [
                "private",
                "loopback",
                "link-local",
                "internal",
                "10.1",
                "::1",
            ] {
                assert!(!answer.message.contains(told), "{answer}");
            }
        }
        // What is wrong with the URL's text itself is said as it is.
        for error in [
            SsrfError::HttpsRequired,
            SsrfError::Credentials,
            SsrfError::Scheme("ftp".to_owned()),
            SsrfError::LocalHostname {
                host: "api.localhost".to_owned(),
            },
        ] {
            let message = error.to_string();
            assert_eq!(refused(error), InvalidField::new("url", message));
        }
    }
}
