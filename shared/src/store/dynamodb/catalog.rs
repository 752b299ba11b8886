//! The event-type catalog: one control-table item per type (`pk = eventtype#<name>`), the
//! schema and example as JSON text, listed through the sparse `listed` index.

use super::items::*;
use super::*;
use crate::domain::EventTypeDef;

const EVENT_TYPES: &str = "eventtypes";

fn type_pk(name: &EventType) -> String {
    format!("eventtype#{}", name.as_str())
}

fn item_of(def: &EventTypeDef) -> Item {
    let mut item = Item::from([
        ("pk".to_owned(), s(type_pk(&def.name))),
        ("list".to_owned(), s(EVENT_TYPES)),
        ("list_key".to_owned(), s(def.name.as_str())),
        ("name".to_owned(), s(def.name.as_str())),
        ("description".to_owned(), s(&def.description)),
        (
            "deprecated".to_owned(),
            AttributeValue::Bool(def.deprecated),
        ),
        ("created_at".to_owned(), n(to_millis(def.created_at))),
        ("updated_at".to_owned(), n(to_millis(def.updated_at))),
    ]);
    for (name, value) in [("schema", &def.schema), ("example", &def.example)] {
        if let Some(value) = value {
            item.insert(name.to_owned(), s(value.to_string()));
        }
    }
    item
}

fn json(item: &Item, name: &str) -> StoreResult<Option<serde_json::Value>> {
    opt_s(item, name)
        .map(|text| serde_json::from_str(&text).map_err(|_| corrupt(name)))
        .transpose()
}

fn def_of(item: &Item) -> StoreResult<EventTypeDef> {
    Ok(EventTypeDef {
        name: EventType::from_trusted(get_s(item, "name")?),
        description: get_s(item, "description")?,
        schema: json(item, "schema")?,
        example: json(item, "example")?,
        deprecated: matches!(item.get("deprecated"), Some(AttributeValue::Bool(true))),
        created_at: from_millis(get_n(item, "created_at")?),
        updated_at: from_millis(get_n(item, "updated_at")?),
    })
}

impl DynamoStore {
    pub(super) async fn create_event_type(&self, def: &EventTypeDef) -> StoreResult<()> {
        let put = self
            .client
            .put_item()
            .table_name(&self.tables.control)
            .condition_expression("attribute_not_exists(pk)");
        match put_once(put, with_put_token(item_of(def))).await? {
            Some(_) => Ok(()),
            None => Err(StoreError::Conflict {
                entity: "event type",
                id: def.name.as_str().to_owned(),
            }),
        }
    }

    pub(super) async fn update_event_type(&self, def: &EventTypeDef) -> StoreResult<()> {
        // The whole item again, as long as it exists; its creation time stays.
        let mut item = item_of(def);
        item.remove("created_at");
        let stored = self
            .get(&self.tables.control, key1("pk", &type_pk(&def.name)))
            .await?;
        let Some(stored) = stored else {
            return Err(StoreError::NotFound("event type"));
        };
        item.insert(
            "created_at".to_owned(),
            n(get_n::<i64>(&stored, "created_at")?),
        );
        let result = self
            .client
            .put_item()
            .table_name(&self.tables.control)
            .set_item(Some(item))
            .condition_expression("attribute_exists(pk)")
            .send()
            .await;
        match written(result)? {
            Some(_) => Ok(()),
            None => Err(StoreError::NotFound("event type")),
        }
    }

    pub(super) async fn get_event_type(
        &self,
        name: &EventType,
    ) -> StoreResult<Option<EventTypeDef>> {
        self.get(&self.tables.control, key1("pk", &type_pk(name)))
            .await?
            .map(|item| def_of(&item))
            .transpose()
    }

    /// Through a global secondary index, so eventually consistent: a type added a moment ago
    /// may be missing for a moment (publishing reads the item itself).
    pub(super) async fn list_event_types(&self) -> StoreResult<Vec<EventTypeDef>> {
        let items = self.listed(EVENT_TYPES, false).await?;
        items.iter().map(def_of).collect()
    }

    pub(super) async fn delete_event_type(&self, name: &EventType) -> StoreResult<bool> {
        let out = self
            .client
            .delete_item()
            .table_name(&self.tables.control)
            .set_key(Some(key1("pk", &type_pk(name))))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(sdk)?;
        Ok(out.attributes.is_some_and(|a| !a.is_empty()))
    }
}
