//! Who may do what: the API's scopes, scoped API keys, and the principal a credential names.

use std::fmt;

use super::{ids::AccountId, InvalidField};
use crate::clock::Timestamp;

/// What a route needs. A route declares at most one; `admin` grants every scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    AccountsRead,
    AccountsWrite,
    TokensWrite,
    EndpointsRead,
    EndpointsWrite,
    EventsPublish,
    EventsErase,
    DeliveriesRead,
    DeliveriesReplay,
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 10] = [
        Scope::AccountsRead,
        Scope::AccountsWrite,
        Scope::TokensWrite,
        Scope::EndpointsRead,
        Scope::EndpointsWrite,
        Scope::EventsPublish,
        Scope::EventsErase,
        Scope::DeliveriesRead,
        Scope::DeliveriesReplay,
        Scope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AccountsRead => "accounts:read",
            Self::AccountsWrite => "accounts:write",
            Self::TokensWrite => "tokens:write",
            Self::EndpointsRead => "endpoints:read",
            Self::EndpointsWrite => "endpoints:write",
            Self::EventsPublish => "events:publish",
            Self::EventsErase => "events:erase",
            Self::DeliveriesRead => "deliveries:read",
            Self::DeliveriesReplay => "deliveries:replay",
            Self::Admin => "admin",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }

    /// Whether an account token holds this scope on its own account: what a customer does
    /// with their own webhooks (endpoints, the delivery log, replays, test events). Publishing
    /// and erasing events are the platform's: a customer who publishes under an id the
    /// platform uses later has the platform's event answered as already published, and
    /// dropped. Listed, not excluded, so that a new scope is not a token's until named here.
    pub fn of_account_tokens(self) -> bool {
        matches!(
            self,
            Self::AccountsRead
                | Self::EndpointsRead
                | Self::EndpointsWrite
                | Self::DeliveriesRead
                | Self::DeliveriesReplay
        )
    }

    /// Whether the scope only reads: what a read-only account token holds.
    pub fn reads_only(self) -> bool {
        matches!(
            self,
            Self::AccountsRead | Self::EndpointsRead | Self::DeliveriesRead
        )
    }

    /// The scopes of an account token, read-only or not.
    pub fn of_account_token(read_only: bool) -> impl Iterator<Item = Scope> {
        Self::ALL
            .into_iter()
            .filter(move |s| s.of_account_tokens() && (!read_only || s.reads_only()))
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key's id (`key_…`), the public half of the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApiKeyId(String);

impl ApiKeyId {
    const PREFIX: &'static str = "key_";

    /// A new time-ordered id.
    pub fn generate() -> Self {
        Self(format!("{}{}", Self::PREFIX, uuid::Uuid::now_v7().simple()))
    }

    /// `key_` and 32 lower-case hex digits, as [`ApiKeyId::generate`] makes them.
    pub fn parse(raw: &str) -> Option<Self> {
        let hex = raw.strip_prefix(Self::PREFIX)?;
        let valid = hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid.then(|| Self(raw.to_owned()))
    }

    pub fn from_trusted(raw: String) -> Self {
        Self(raw)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ApiKeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A scoped API key as stored: its secret only as a SHA-256 digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub id: ApiKeyId,
    pub name: String,
    /// Sorted, without repeats, never empty.
    pub scopes: Vec<Scope>,
    /// `None`: every account. Otherwise only these (sorted, without repeats, never empty).
    pub accounts: Option<Vec<AccountId>>,
    /// Lower-case hex SHA-256 of the secret part of the key.
    pub secret_sha256: String,
    pub created_at: Timestamp,
    /// Who made it (an actor, as audit trails name callers).
    pub created_by: String,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

pub const MAX_KEY_ACCOUNTS: usize = 100;

/// The scopes of a new key: known names, at least one, `admin` not limited to accounts.
pub fn parse_scopes(raw: &[String]) -> Result<Vec<Scope>, InvalidField> {
    if raw.is_empty() {
        return Err(InvalidField::new("scopes", "must name at least one scope"));
    }
    let mut scopes = raw
        .iter()
        .map(|name| {
            Scope::parse(name).ok_or_else(|| {
                let known: Vec<&str> = Scope::ALL.iter().map(|s| s.as_str()).collect();
                InvalidField::new(
                    "scopes",
                    format!("`{name}` is not a scope; one of {}", known.join(", ")),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    scopes.sort();
    scopes.dedup();
    Ok(scopes)
}

/// The accounts a new key is limited to: 1 to 100 well-formed ids.
pub fn parse_key_accounts(raw: &[String]) -> Result<Vec<AccountId>, InvalidField> {
    if raw.is_empty() || raw.len() > MAX_KEY_ACCOUNTS {
        return Err(InvalidField::new(
            "accounts",
            format!("must list 1 to {MAX_KEY_ACCOUNTS} accounts, or be left out for all"),
        ));
    }
    let mut accounts = raw
        .iter()
        .map(|id| {
            AccountId::parse(id).map_err(|e| InvalidField::new("accounts", e.message.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    accounts.sort();
    accounts.dedup();
    Ok(accounts)
}

/// Who is calling, as a checked credential says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The admin token: everything.
    Admin,
    /// A scoped API key.
    Key {
        key_id: ApiKeyId,
        scopes: Vec<Scope>,
        accounts: Option<Vec<AccountId>>,
        /// When the key expires, if it does: no token it mints outlives it.
        expires_at: Option<Timestamp>,
    },
    /// The holder of an account token: one account, the scopes of [`Scope::of_account_token`].
    Account {
        account_id: AccountId,
        token_id: String,
        expires_at: Timestamp,
        /// A read-only portal link's token: the reading scopes only.
        read_only: bool,
    },
}

/// Why a principal may not make a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The route's account is not one the credential reaches: answered as if it did not
    /// exist, so ids do not leak.
    #[error("account not found")]
    NotVisible,
    #[error("this route needs the `{0}` scope")]
    MissingScope(Scope),
    /// A route over no one account (creating accounts, managing keys) needs a credential
    /// that is not limited to some accounts.
    #[error("this route needs a credential that is not limited to some accounts")]
    Limited,
}

impl Principal {
    /// When the credential itself expires, if it does: what it mints may not outlive it.
    pub fn expires_at(&self) -> Option<Timestamp> {
        match self {
            Self::Admin => None,
            Self::Key { expires_at, .. } => *expires_at,
            Self::Account { expires_at, .. } => Some(*expires_at),
        }
    }

    /// Whether the principal reaches `account` at all.
    pub fn reaches(&self, account: &AccountId) -> bool {
        match self {
            Self::Admin => true,
            Self::Key { accounts, .. } => accounts.as_ref().is_none_or(|a| a.contains(account)),
            Self::Account { account_id, .. } => account_id == account,
        }
    }

    /// Whether the principal is limited to some accounts.
    pub fn is_limited(&self) -> bool {
        match self {
            Self::Admin => false,
            Self::Key { accounts, .. } => accounts.is_some(),
            Self::Account { .. } => true,
        }
    }

    pub fn has_scope(&self, scope: Scope) -> bool {
        match self {
            Self::Admin => true,
            Self::Key { scopes, .. } => scopes.contains(&Scope::Admin) || scopes.contains(&scope),
            Self::Account { read_only, .. } => {
                scope.of_account_tokens() && (!read_only || scope.reads_only())
            }
        }
    }

    /// May the principal call a route that needs `scope` (`None`: any credential), under
    /// `account` (`None`: a route over no one account)? The account is checked first, so
    /// another account's routes answer 404 whatever the scope.
    pub fn authorize(
        &self,
        scope: Option<Scope>,
        account: Option<&AccountId>,
    ) -> Result<(), Denied> {
        if let Some(account) = account {
            if !self.reaches(account) {
                return Err(Denied::NotVisible);
            }
        }
        let Some(scope) = scope else { return Ok(()) };
        if !self.has_scope(scope) {
            return Err(Denied::MissingScope(scope));
        }
        if account.is_none() && self.is_limited() {
            return Err(Denied::Limited);
        }
        Ok(())
    }

    /// How audit trails name the caller: `admin`, `key:<key id>` or `token:<token id>`.
    pub fn actor(&self) -> String {
        match self {
            Self::Admin => "admin".to_owned(),
            Self::Key { key_id, .. } => format!("key:{key_id}"),
            Self::Account { token_id, .. } => format!("token:{token_id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(id: &str) -> AccountId {
        AccountId::parse(id).unwrap()
    }

    fn key(scopes: &[Scope], accounts: Option<&[&str]>) -> Principal {
        Principal::Key {
            key_id: ApiKeyId::generate(),
            scopes: scopes.to_vec(),
            accounts: accounts.map(|a| a.iter().map(|id| account(id)).collect()),
            expires_at: None,
        }
    }

    #[test]
    fn scopes_survive_their_names() {
        for scope in Scope::ALL {
            assert_eq!(Scope::parse(scope.as_str()), Some(scope));
        }
        assert_eq!(Scope::parse("events"), None);
        let parsed = parse_scopes(&["events:publish".into(), "events:publish".into()]).unwrap();
        assert_eq!(parsed, vec![Scope::EventsPublish]);
        assert_eq!(parse_scopes(&[]).unwrap_err().field, "scopes");
        assert_eq!(parse_scopes(&["root".into()]).unwrap_err().field, "scopes");
    }

    #[test]
    fn the_account_is_checked_before_the_scope() {
        let acme = account("acme");
        let other = account("other");
        let publisher = key(&[Scope::EventsPublish], Some(&["acme"]));
        assert_eq!(
            publisher.authorize(Some(Scope::EventsPublish), Some(&acme)),
            Ok(())
        );
        assert_eq!(
            publisher.authorize(Some(Scope::EndpointsRead), Some(&acme)),
            Err(Denied::MissingScope(Scope::EndpointsRead))
        );
        assert_eq!(
            publisher.authorize(Some(Scope::EndpointsRead), Some(&other)),
            Err(Denied::NotVisible)
        );
        assert_eq!(publisher.authorize(None, None), Ok(()));
    }

    #[test]
    fn routes_over_no_account_need_an_unlimited_credential() {
        let limited = key(&[Scope::AccountsWrite], Some(&["acme"]));
        assert_eq!(
            limited.authorize(Some(Scope::AccountsWrite), None),
            Err(Denied::Limited)
        );
        let unlimited = key(&[Scope::AccountsWrite], None);
        assert_eq!(
            unlimited.authorize(Some(Scope::AccountsWrite), None),
            Ok(())
        );
        let admin_key = key(&[Scope::Admin], None);
        assert_eq!(
            admin_key.authorize(Some(Scope::TokensWrite), Some(&account("x"))),
            Ok(())
        );
        let token = Principal::Account {
            account_id: account("acme"),
            token_id: "tok_1".into(),
            expires_at: crate::clock::from_millis(0),
            read_only: false,
        };
        assert_eq!(
            token.authorize(Some(Scope::TokensWrite), Some(&account("acme"))),
            Err(Denied::MissingScope(Scope::TokensWrite))
        );
        assert_eq!(
            token.authorize(Some(Scope::DeliveriesReplay), Some(&account("acme"))),
            Ok(())
        );
        // Publishing and erasing are the platform's, not a customer's.
        for scope in [Scope::EventsPublish, Scope::EventsErase] {
            assert_eq!(
                token.authorize(Some(scope), Some(&account("acme"))),
                Err(Denied::MissingScope(scope))
            );
        }
        assert_eq!(
            Scope::of_account_token(false).collect::<Vec<_>>(),
            [
                Scope::AccountsRead,
                Scope::EndpointsRead,
                Scope::EndpointsWrite,
                Scope::DeliveriesRead,
                Scope::DeliveriesReplay
            ]
        );
        let reader = Principal::Account {
            account_id: account("acme"),
            token_id: "tok_2".into(),
            expires_at: crate::clock::from_millis(0),
            read_only: true,
        };
        for scope in [
            Scope::EndpointsRead,
            Scope::DeliveriesRead,
            Scope::AccountsRead,
        ] {
            assert_eq!(
                reader.authorize(Some(scope), Some(&account("acme"))),
                Ok(())
            );
        }
        for scope in [
            Scope::EndpointsWrite,
            Scope::DeliveriesReplay,
            Scope::EventsPublish,
            Scope::EventsErase,
        ] {
            assert_eq!(
                reader.authorize(Some(scope), Some(&account("acme"))),
                Err(Denied::MissingScope(scope))
            );
        }
        assert_eq!(
            Scope::of_account_token(true).collect::<Vec<_>>(),
            [
                Scope::AccountsRead,
                Scope::EndpointsRead,
                Scope::DeliveriesRead
            ]
        );
        assert_eq!(Principal::Admin.authorize(Some(Scope::Admin), None), Ok(()));
    }

    #[test]
    fn key_ids_are_only_what_generate_makes() {
        let id = ApiKeyId::generate();
        assert_eq!(ApiKeyId::parse(id.as_str()), Some(id));
        for bad in [
            "",
            "key_",
            "key_XYZ",
            "tok_0123456789abcdef0123456789abcdef",
            "key_0123456789abcdef0123456789abcdeF",
        ] {
            assert_eq!(ApiKeyId::parse(bad), None, "{bad}");
        }
    }
}
