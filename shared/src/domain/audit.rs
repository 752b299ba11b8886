//! The audit log: who changed what of an account, when, and from which address. Every
//! change to accounts, endpoints, secrets, keys and tokens, and every replay and erasure,
//! leaves one entry; the automatic ones (the health check disabling an endpoint) name the
//! actor `system`.

use std::fmt;

use serde_json::{Map, Value};

use super::{access::ApiKeyId, ids::AccountId, Principal};
use crate::clock::Timestamp;

/// An entry's id: `aud_` and a UUIDv7, so that ids sort by the time they were made.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AuditId(String);

impl AuditId {
    pub fn generate() -> Self {
        Self(format!("aud_{}", uuid::Uuid::now_v7().simple()))
    }

    /// For values read back from our own storage.
    pub fn from_trusted(raw: String) -> Self {
        Self(raw)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AuditId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who made a change: the credential of the request, or Hooklane itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    Admin,
    Key(ApiKeyId),
    /// An account token, by its id (`tok_…`).
    Token(String),
    /// Hooklane on its own (the health check disabling a failing endpoint).
    System,
}

impl Actor {
    /// As [`Principal::actor`] names callers: `admin`, `key:<key id>`, `token:<token id>`;
    /// and `system`.
    pub fn to_text(&self) -> String {
        match self {
            Self::Admin => "admin".to_owned(),
            Self::Key(id) => format!("key:{id}"),
            Self::Token(id) => format!("token:{id}"),
            Self::System => "system".to_owned(),
        }
    }

    /// Reads [`Actor::to_text`] back; `None` for anything else.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "admin" => Some(Self::Admin),
            "system" => Some(Self::System),
            _ => {
                if let Some(id) = raw.strip_prefix("key:") {
                    ApiKeyId::parse(id).map(Self::Key)
                } else {
                    raw.strip_prefix("token:")
                        .filter(|id| !id.is_empty())
                        .map(|id| Self::Token(id.to_owned()))
                }
            }
        }
    }

    /// The kind, as the API shows it: `admin`, `key`, `token` or `system`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Key(_) => "key",
            Self::Token(_) => "token",
            Self::System => "system",
        }
    }

    /// The key or token id; `None` for the admin token and the system.
    pub fn id(&self) -> Option<&str> {
        match self {
            Self::Key(id) => Some(id.as_str()),
            Self::Token(id) => Some(id),
            Self::Admin | Self::System => None,
        }
    }
}

impl From<&Principal> for Actor {
    fn from(principal: &Principal) -> Self {
        match principal {
            Principal::Admin => Self::Admin,
            Principal::Key { key_id, .. } => Self::Key(key_id.clone()),
            Principal::Account { token_id, .. } => Self::Token(token_id.clone()),
        }
    }
}

/// Who asks for a change, and from where: what the service records with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub actor: Actor,
    /// The client's IP address as the server saw it (the TCP peer, or API Gateway's
    /// source IP); `None` when there is no client.
    pub address: Option<String>,
}

impl Caller {
    pub fn new(actor: Actor, address: Option<String>) -> Self {
        Self { actor, address }
    }

    /// Hooklane itself, with no address.
    pub fn system() -> Self {
        Self::new(Actor::System, None)
    }
}

macro_rules! vocabulary {
    ($(#[$doc:meta])* $name:ident { $($variant:ident => $text:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }

            pub fn parse(raw: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str() == raw)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

vocabulary! {
    /// What was done: a fixed vocabulary, one per kind of change.
    AuditAction {
        AccountCreated => "account.created",
        AccountUpdated => "account.updated",
        EndpointCreated => "endpoint.created",
        EndpointUpdated => "endpoint.updated",
        EndpointDeleted => "endpoint.deleted",
        EndpointDisabled => "endpoint.disabled",
        EndpointEnabled => "endpoint.enabled",
        EndpointSecretRotated => "endpoint.secret_rotated",
        KeyCreated => "key.created",
        KeyRevoked => "key.revoked",
        TokenCreated => "token.created",
        TokenRevoked => "token.revoked",
        TokensRevoked => "tokens.revoked",
        PortalLinkCreated => "portal_link.created",
        ReplayCreated => "replay.created",
        EventErased => "event.erased",
        AdminTokenRotated => "admin_token.rotated",
        EventTypeCreated => "event_type.created",
        EventTypeUpdated => "event_type.updated",
        EventTypeDeleted => "event_type.deleted",
    }
}

vocabulary! {
    /// What kind of thing a change was made to.
    TargetKind {
        Account => "account",
        Endpoint => "endpoint",
        Key => "key",
        Token => "token",
        Replay => "replay",
        Event => "event",
        AdminToken => "admin_token",
        EventType => "event_type",
    }
}

/// The thing a change was made to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditTarget {
    pub kind: TargetKind,
    pub id: String,
}

impl AuditTarget {
    pub fn new(kind: TargetKind, id: impl fmt::Display) -> Self {
        Self {
            kind,
            id: id.to_string(),
        }
    }
}

/// What credentials and signing secrets start with: a details value that does is replaced,
/// whatever put it there, so that no entry ever holds one.
const SECRET_PREFIXES: [&str; 4] = ["whsec_", "hl_key_", "hl_acct_", "hl_admin_"];
pub const REDACTED: &str = "[redacted]";

/// One audit entry. `account_id` is `None` for a change over no one account (a key that
/// reaches every account, the admin token): the operator's log.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    pub id: AuditId,
    pub account_id: Option<AccountId>,
    pub at: Timestamp,
    pub actor: Actor,
    pub action: AuditAction,
    pub target: AuditTarget,
    pub address: Option<String>,
    /// A small object of what changed; never a secret.
    pub details: Map<String, Value>,
}

impl AuditEntry {
    /// A new entry with a fresh id; secret-looking values in `details` are redacted.
    pub fn new(
        account_id: Option<AccountId>,
        at: Timestamp,
        caller: &Caller,
        action: AuditAction,
        target: AuditTarget,
        mut details: Map<String, Value>,
    ) -> Self {
        details.values_mut().for_each(redact);
        Self {
            id: AuditId::generate(),
            account_id,
            at,
            actor: caller.actor.clone(),
            action,
            target,
            address: caller.address.clone(),
            details,
        }
    }
}

fn redact(value: &mut Value) {
    match value {
        Value::String(text) if SECRET_PREFIXES.iter().any(|p| text.contains(p)) => {
            *text = REDACTED.to_owned();
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        Value::Object(map) => map.values_mut().for_each(redact),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_survive_their_text() {
        let key = ApiKeyId::generate();
        for actor in [
            Actor::Admin,
            Actor::System,
            Actor::Key(key),
            Actor::Token("tok_0123".into()),
        ] {
            assert_eq!(Actor::parse(&actor.to_text()), Some(actor));
        }
        assert_eq!(Actor::parse("key:nope"), None);
        assert_eq!(Actor::parse("token:"), None);
        assert_eq!(Actor::parse("root"), None);
    }

    #[test]
    fn the_vocabulary_survives_its_names() {
        for action in AuditAction::ALL {
            assert_eq!(AuditAction::parse(action.as_str()), Some(*action));
        }
        for kind in TargetKind::ALL {
            assert_eq!(TargetKind::parse(kind.as_str()), Some(*kind));
        }
        assert_eq!(AuditAction::parse("endpoint.exploded"), None);
    }

    #[test]
    fn details_never_hold_a_secret() {
        let details = serde_json::json!({
            "url": "https://example.com/hooks",
            "secret": "whsec_c2VjcmV0",
            "nested": {"token": "Bearer hl_acct_abc"},
            "list": ["ok", "hl_key_0.x"],
        });
        let Value::Object(details) = details else {
            unreachable!()
        };
        let entry = AuditEntry::new(
            None,
            chrono::Utc::now(),
            &Caller::system(),
            AuditAction::EndpointUpdated,
            AuditTarget::new(TargetKind::Endpoint, "ep_1"),
            details,
        );
        let text = Value::Object(entry.details.clone()).to_string();
        assert!(!text.contains("whsec_") && !text.contains("hl_"), "{text}");
        assert_eq!(entry.details["url"], "https://example.com/hooks");
        assert_eq!(entry.details["secret"], REDACTED);
        assert!(entry.id.as_str().starts_with("aud_"));
    }
}
