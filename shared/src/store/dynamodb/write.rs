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

    fn into_parts(self) -> (String, WriteKind, Expressions) {
        let expressions = Expressions {
            condition: self.condition,
            names: optional(self.names),
            values: optional(self.values),
        };
        (self.table, self.kind, expressions)
    }

    /// Sends it alone: `None` when its condition did not hold.
    pub(super) async fn send(self, client: &Client) -> StoreResult<Option<()>> {
        let (table, kind, expressions) = self.into_parts();
        let sent = match kind {
            WriteKind::Put(item) => {
                let put = client.put_item().table_name(table);
                if expressions.condition.is_some() {
                    put_once(put.set_expressions(expressions), with_put_token(item)).await?
                } else {
                    written(
                        put.set_item(Some(item))
                            .set_expressions(expressions)
                            .send()
                            .await,
                    )?
                    .map(|_| ())
                }
            }
            WriteKind::Update { key, expression } => written(
                client
                    .update_item()
                    .table_name(table)
                    .set_key(Some(key))
                    .update_expression(expression)
                    .set_expressions(expressions)
                    .send()
                    .await,
            )?
            .map(|_| ()),
        };
        Ok(sent)
    }

    pub(super) fn transact_item(self) -> StoreResult<TransactWriteItem> {
        let (table, kind, expressions) = self.into_parts();
        let invalid = |e: aws_sdk_dynamodb::error::BuildError| StoreError::Backend(e.to_string());
        let item = match kind {
            WriteKind::Put(item) => TransactWriteItem::builder().put(
                Put::builder()
                    .table_name(table)
                    .set_item(Some(item))
                    .set_expressions(expressions)
                    .build()
                    .map_err(invalid)?,
            ),
            WriteKind::Update { key, expression } => TransactWriteItem::builder().update(
                Update::builder()
                    .table_name(table)
                    .set_key(Some(key))
                    .update_expression(expression)
                    .set_expressions(expressions)
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

/// A write's condition and placeholders, as the SDK's builders take them.
struct Expressions {
    condition: Option<String>,
    names: Option<HashMap<String, String>>,
    values: Option<HashMap<String, AttributeValue>>,
}

/// [`Expressions`] on any of the SDK's four write builders, whose methods share their names
/// but no trait.
trait SetExpressions: Sized {
    fn set_expressions(self, expressions: Expressions) -> Self;
}

macro_rules! set_expressions {
    ($($builder:ty),*) => {$(
        impl SetExpressions for $builder {
            fn set_expressions(self, e: Expressions) -> Self {
                self.set_condition_expression(e.condition)
                    .set_expression_attribute_names(e.names)
                    .set_expression_attribute_values(e.values)
            }
        }
    )*};
}

set_expressions!(
    aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder,
    aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
    aws_sdk_dynamodb::types::builders::PutBuilder,
    aws_sdk_dynamodb::types::builders::UpdateBuilder
);
