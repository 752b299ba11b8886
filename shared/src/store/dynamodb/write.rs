//! One conditional write to one item, sent alone (`PutItem`, `UpdateItem`) or as an item of
//! a `TransactWriteItems`: an audited change and its audit entries are written in one
//! transaction, from the same description of the change as the change written alone.

use aws_sdk_dynamodb::types::{Put, TransactWriteItem, Update};

use super::items::*;
use super::*;

enum WriteKind {
    Put(Item),
    Update { key: Item, expression: String },
}

pub(super) struct Write {
    table: String,
    kind: WriteKind,
    condition: Option<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Write {
    pub(super) fn put(table: &str, item: Item) -> Self {
        Self::new(table, WriteKind::Put(item))
    }

    pub(super) fn update(table: &str, key: Item, expression: &str) -> Self {
        let expression = expression.to_owned();
        Self::new(table, WriteKind::Update { key, expression })
    }

    fn new(table: &str, kind: WriteKind) -> Self {
        Self {
            table: table.to_owned(),
            kind,
            condition: None,
            names: HashMap::new(),
            values: HashMap::new(),
        }
    }

    pub(super) fn condition(mut self, condition: &str) -> Self {
        self.condition = Some(condition.to_owned());
        self
    }

    pub(super) fn name(mut self, placeholder: &str, name: &str) -> Self {
        self.names.insert(placeholder.to_owned(), name.to_owned());
        self
    }

    pub(super) fn value(mut self, placeholder: &str, value: AttributeValue) -> Self {
        self.values.insert(placeholder.to_owned(), value);
        self
    }

    /// Sends it alone: `None` when its condition did not hold.
    pub(super) async fn send(self, client: &Client) -> StoreResult<Option<()>> {
        let Self {
            table,
            kind,
            condition,
            names,
            values,
        } = self;
        let (names, values) = (optional(names), optional(values));
        let sent = match kind {
            WriteKind::Put(item) => written(
                client
                    .put_item()
                    .table_name(table)
                    .set_item(Some(item))
                    .set_condition_expression(condition)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .send()
                    .await,
            )?
            .map(|_| ()),
            WriteKind::Update { key, expression } => written(
                client
                    .update_item()
                    .table_name(table)
                    .set_key(Some(key))
                    .update_expression(expression)
                    .set_condition_expression(condition)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .send()
                    .await,
            )?
            .map(|_| ()),
        };
        Ok(sent)
    }

    pub(super) fn transact_item(self) -> StoreResult<TransactWriteItem> {
        let Self {
            table,
            kind,
            condition,
            names,
            values,
        } = self;
        let (names, values) = (optional(names), optional(values));
        let invalid = |e: aws_sdk_dynamodb::error::BuildError| StoreError::Backend(e.to_string());
        let item = match kind {
            WriteKind::Put(item) => TransactWriteItem::builder().put(
                Put::builder()
                    .table_name(table)
                    .set_item(Some(item))
                    .set_condition_expression(condition)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .build()
                    .map_err(invalid)?,
            ),
            WriteKind::Update { key, expression } => TransactWriteItem::builder().update(
                Update::builder()
                    .table_name(table)
                    .set_key(Some(key))
                    .update_expression(expression)
                    .set_condition_expression(condition)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .build()
                    .map_err(invalid)?,
            ),
        };
        Ok(item.build())
    }
}

/// DynamoDB refuses an empty map of names or values: absent instead.
fn optional<V>(map: HashMap<String, V>) -> Option<HashMap<String, V>> {
    (!map.is_empty()).then_some(map)
}
