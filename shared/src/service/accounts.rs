use super::{audit, ServiceError, ServiceResult};
use crate::{
    domain::{
        account, rate::PublishRate, Account, AccountId, AuditAction, AuditTarget, Caller,
        EmailAddress, TargetKind,
    },
    store::AuditedChange,
    App,
};

#[derive(Debug, Clone, Default)]
pub struct NewAccount {
    pub id: Option<String>,
    pub name: String,
    pub owner_email: String,
    pub publish_rate_limit: Option<PublishRate>,
}

/// A change to an account; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct AccountChange {
    pub name: Option<String>,
    pub owner_email: Option<String>,
    /// `Some(None)` removes the account's own limit (the default applies again).
    pub publish_rate_limit: Option<Option<PublishRate>>,
}

pub async fn update(
    app: &App,
    id: &AccountId,
    change: AccountChange,
    caller: &Caller,
) -> ServiceResult<Account> {
    let mut account = get(app, id).await?;
    let changed: Vec<&str> = [
        ("name", change.name.is_some()),
        ("owner_email", change.owner_email.is_some()),
        ("publish_rate_limit", change.publish_rate_limit.is_some()),
    ]
    .into_iter()
    .filter_map(|(field, given)| given.then_some(field))
    .collect();
    if let Some(name) = change.name {
        account.name = account::parse_name(&name)?;
    }
    if let Some(email) = change.owner_email {
        account.owner_email = EmailAddress::parse(&email)?;
    }
    if let Some(limit) = change.publish_rate_limit {
        account.publish_rate_limit = limit;
    }
    let entry = audit::entry(
        app,
        caller,
        Some(&account.id),
        AuditAction::AccountUpdated,
        AuditTarget::new(TargetKind::Account, &account.id),
        serde_json::json!({ "changed": changed }),
    );
    audit::change(app, AuditedChange::UpdateAccount(account.clone()), &[entry]).await?;
    Ok(account)
}

pub async fn create(app: &App, input: NewAccount, caller: &Caller) -> ServiceResult<Account> {
    let id = match input.id.as_deref() {
        Some(raw) => AccountId::parse(raw)?,
        None => AccountId::generate(),
    };
    let account = Account {
        id,
        name: account::parse_name(&input.name)?,
        owner_email: EmailAddress::parse(&input.owner_email)?,
        created_at: app.clock.now(),
        publish_rate_limit: input.publish_rate_limit,
    };
    let entry = audit::entry(
        app,
        caller,
        Some(&account.id),
        AuditAction::AccountCreated,
        AuditTarget::new(TargetKind::Account, &account.id),
        serde_json::json!({ "name": account.name }),
    );
    audit::change(app, AuditedChange::CreateAccount(account.clone()), &[entry]).await?;
    Ok(account)
}

pub async fn get(app: &App, id: &AccountId) -> ServiceResult<Account> {
    app.store
        .get_account(id)
        .await?
        .ok_or(ServiceError::NotFound("account"))
}
