//! The tables as `infra/template.yaml` defines them.

use super::*;

/// Creates the tables as `infra/template.yaml` defines them (for tests and local development;
/// CloudFormation creates them in production). Tables that already exist are reused.
pub async fn create_tables(client: &Client, tables: &TableNames) -> StoreResult<()> {
    if TableNames::with_prefix(tables.prefix()) != *tables {
        return Err(StoreError::Backend(format!(
            "the template names its tables after the stack; {tables:?} are not"
        )));
    }
    crate::aws::stack::create_tables(client, tables.prefix())
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))
}
