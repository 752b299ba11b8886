use super::{ServiceError, ServiceResult};
use crate::{
    domain::{account, Account, AccountId, EmailAddress},
    App,
};

#[derive(Debug, Clone, Default)]
pub struct NewAccount {
    pub id: Option<String>,
    pub name: String,
    pub owner_email: String,
}

pub async fn create(app: &App, input: NewAccount) -> ServiceResult<Account> {
    let id = match input.id.as_deref() {
        Some(raw) => AccountId::parse(raw)?,
        None => AccountId::generate(),
    };
    let account = Account {
        id,
        name: account::parse_name(&input.name)?,
        owner_email: EmailAddress::parse(&input.owner_email)?,
        created_at: app.clock.now(),
    };
    app.store.create_account(&account).await?;
    Ok(account)
}

pub async fn get(app: &App, id: &AccountId) -> ServiceResult<Account> {
    app.store
        .get_account(id)
        .await?
        .ok_or(ServiceError::NotFound("account"))
}
