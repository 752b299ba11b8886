//! The event-type catalog in SQLite: one row per type, schema and example as JSON text.

use super::rows::*;
use super::*;
use crate::domain::EventTypeDef;

const COLUMNS: &str = "name, description, schema, example, deprecated, created_at, updated_at";

fn json_column(value: Option<String>, column: &str) -> rusqlite::Result<Option<serde_json::Value>> {
    value
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|e| {
            rusqlite::Error::InvalidColumnType(
                0,
                format!("{column}: {e}"),
                rusqlite::types::Type::Text,
            )
        })
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<EventTypeDef> {
    Ok(EventTypeDef {
        name: EventType::from_trusted(row.get(0)?),
        description: row.get(1)?,
        schema: json_column(row.get(2)?, "schema")?,
        example: json_column(row.get(3)?, "example")?,
        deprecated: row.get(4)?,
        created_at: from_millis(row.get(5)?),
        updated_at: from_millis(row.get(6)?),
    })
}

fn text(value: &Option<serde_json::Value>) -> Option<String> {
    value.as_ref().map(|v| v.to_string())
}

/// The row's values, in [`COLUMNS`] order.
fn values(def: &EventTypeDef) -> impl rusqlite::Params + '_ {
    (
        def.name.as_str(),
        def.description.as_str(),
        text(&def.schema),
        text(&def.example),
        def.deprecated,
        to_millis(def.created_at),
        to_millis(def.updated_at),
    )
}

impl SqliteStore {
    pub(super) async fn create_event_type(&self, def: &EventTypeDef) -> StoreResult<()> {
        let def = def.clone();
        self.run(move |conn| {
            conn.execute(
                &format!("INSERT INTO event_types ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                values(&def),
            )
            .map_err(|e| {
                if is_unique_violation(&e) {
                    StoreError::Conflict {
                        entity: "event type",
                        id: def.name.as_str().to_owned(),
                    }
                } else {
                    backend(e)
                }
            })?;
            Ok(())
        })
        .await
    }

    pub(super) async fn update_event_type(&self, def: &EventTypeDef) -> StoreResult<()> {
        let def = def.clone();
        self.run(move |conn| {
            let changed = conn
                .execute(
                    // The same values as an insert; `created_at` (?6) stays as it was.
                    "UPDATE event_types SET description = ?2, schema = ?3, example = ?4, deprecated = ?5, \
                     updated_at = ?7 WHERE name = ?1",
                    values(&def),
                )
                .map_err(backend)?;
            if changed == 0 {
                return Err(StoreError::NotFound("event type"));
            }
            Ok(())
        })
        .await
    }

    pub(super) async fn get_event_type(
        &self,
        name: &EventType,
    ) -> StoreResult<Option<EventTypeDef>> {
        let name = name.clone();
        self.read(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM event_types WHERE name = ?1"
            ))
            .and_then(|mut s| s.query_row(params![name.as_str()], from_row).optional())
            .map_err(backend)
        })
        .await
    }

    pub(super) async fn list_event_types(&self) -> StoreResult<Vec<EventTypeDef>> {
        self.read(move |conn| {
            conn.prepare_cached(&format!("SELECT {COLUMNS} FROM event_types ORDER BY name"))
                .and_then(|mut s| s.query_map([], from_row)?.collect())
                .map_err(backend)
        })
        .await
    }

    pub(super) async fn delete_event_type(&self, name: &EventType) -> StoreResult<bool> {
        let name = name.clone();
        self.run(move |conn| {
            conn.execute(
                "DELETE FROM event_types WHERE name = ?1",
                params![name.as_str()],
            )
            .map(|n| n > 0)
            .map_err(backend)
        })
        .await
    }
}
