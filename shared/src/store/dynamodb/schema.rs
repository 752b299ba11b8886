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

/// The tables' keys and indexes as the request meter needs them, read from the template.
pub fn table_layouts(tables: &TableNames) -> Vec<crate::aws::meter::TableLayout> {
    use crate::aws::meter::{IndexLayout, Projected, TableLayout};
    let name = tables.prefix();
    let definitions = crate::aws::stack::Stack::new(name, "", "", &[])
        .and_then(|stack| crate::aws::stack::TableDefinition::all(&stack))
        .unwrap_or_default();
    let keys = |key: &[(String, String)]| key.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>();
    definitions
        .into_iter()
        .map(|table| TableLayout {
            label: table
                .name
                .strip_prefix(&format!("{name}-"))
                .unwrap_or(&table.name)
                .to_owned(),
            key: keys(&table.key),
            indexes: table
                .indexes
                .iter()
                .map(|index| IndexLayout {
                    name: index.name.clone(),
                    hash: index.key[0].0.clone(),
                    range: index.key.get(1).map(|(r, _)| r.clone()),
                    projected: match index.projection.as_str() {
                        "KEYS_ONLY" => Projected::KeysOnly,
                        "INCLUDE" => Projected::Include(index.non_key_attributes.clone()),
                        _ => Projected::All,
                    },
                })
                .collect(),
            name: table.name,
        })
        .collect()
}
