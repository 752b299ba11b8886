//! The event-type catalog: the operator describes the types the platform publishes; a type
//! with a schema has its events' `data` checked when they are published through the API.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use super::{audit, ServiceError, ServiceResult};
use crate::{
    domain::{
        catalog::{self, MAX_EVENT_TYPES},
        json_schema::Schema,
        AuditAction, AuditTarget, Caller, EventType, EventTypeDef, InvalidField, TargetKind,
    },
    App,
};

#[derive(Debug, Clone, Default)]
pub struct NewEventType {
    pub name: String,
    pub description: Option<String>,
    pub schema: Option<Value>,
    pub example: Option<Value>,
    pub deprecated: Option<bool>,
}

/// What a PATCH changes: absent fields stay, `Some(None)` clears the schema or example.
#[derive(Debug, Clone, Default)]
pub struct EventTypeChanges {
    pub description: Option<String>,
    pub schema: Option<Option<Value>>,
    pub example: Option<Option<Value>>,
    pub deprecated: Option<bool>,
}

/// A schema compiled, or refused naming the keyword at fault.
fn compiled(schema: &Value) -> Result<Schema, InvalidField> {
    // `true` and `false` are schemas too, but as a type's schema they say nothing useful.
    if !schema.is_object() {
        return Err(InvalidField::new("schema", "must be a JSON Schema object"));
    }
    catalog::bounded("schema", schema)?;
    Schema::compile(schema).map_err(|e| InvalidField::new("schema", e.to_string()))
}

/// The schema and example of an entry agree: the example is what a customer copies.
fn checked(def: &EventTypeDef) -> Result<(), InvalidField> {
    let schema = def.schema.as_ref().map(compiled).transpose()?;
    if let Some(example) = &def.example {
        catalog::bounded("example", example)?;
        if let Some(schema) = &schema {
            schema.validate(example).map_err(|e| {
                InvalidField::new("example", format!("does not match the schema: {e}"))
            })?;
        }
    }
    Ok(())
}

fn target(name: &EventType) -> AuditTarget {
    AuditTarget::new(TargetKind::EventType, name.as_str())
}

pub async fn create(
    app: &App,
    input: NewEventType,
    caller: &Caller,
) -> ServiceResult<EventTypeDef> {
    let name = catalog::parse_name(&input.name)?;
    let now = app.clock.now();
    let def = EventTypeDef {
        name,
        description: catalog::parse_description(input.description.as_deref().unwrap_or(""))?,
        schema: input.schema,
        example: input.example,
        deprecated: input.deprecated.unwrap_or(false),
        created_at: now,
        updated_at: now,
    };
    checked(&def)?;
    if app.store.list_event_types().await?.len() >= MAX_EVENT_TYPES {
        return Err(InvalidField::new(
            "name",
            format!("the catalog holds at most {MAX_EVENT_TYPES} types"),
        )
        .into());
    }
    app.store.create_event_type(&def).await?;
    let details = audit::details(json!({
        "schema": def.schema.is_some(),
        "deprecated": def.deprecated,
    }));
    audit::record(
        app,
        caller,
        None,
        AuditAction::EventTypeCreated,
        target(&def.name),
        details,
    )
    .await?;
    Ok(def)
}

pub async fn get(app: &App, name: &str) -> ServiceResult<EventTypeDef> {
    let name = EventType::parse(name).map_err(|_| ServiceError::NotFound("event type"))?;
    app.store
        .get_event_type(&name)
        .await?
        .ok_or(ServiceError::NotFound("event type"))
}

pub async fn list(app: &App) -> ServiceResult<Vec<EventTypeDef>> {
    Ok(app.store.list_event_types().await?)
}

pub async fn update(
    app: &App,
    name: &str,
    changes: EventTypeChanges,
    caller: &Caller,
) -> ServiceResult<EventTypeDef> {
    let mut def = get(app, name).await?;
    let mut changed = Vec::new();
    if let Some(description) = changes.description {
        def.description = catalog::parse_description(&description)?;
        changed.push("description");
    }
    if let Some(schema) = changes.schema {
        def.schema = schema;
        changed.push("schema");
    }
    if let Some(example) = changes.example {
        def.example = example;
        changed.push("example");
    }
    if let Some(deprecated) = changes.deprecated {
        def.deprecated = deprecated;
        changed.push("deprecated");
    }
    checked(&def)?;
    def.updated_at = app.clock.now();
    app.store.update_event_type(&def).await?;
    let details = audit::details(json!({ "changed": changed }));
    audit::record(
        app,
        caller,
        None,
        AuditAction::EventTypeUpdated,
        target(&def.name),
        details,
    )
    .await?;
    Ok(def)
}

pub async fn delete(app: &App, name: &str, caller: &Caller) -> ServiceResult<()> {
    let name = EventType::parse(name).map_err(|_| ServiceError::NotFound("event type"))?;
    if !app.store.delete_event_type(&name).await? {
        return Err(ServiceError::NotFound("event type"));
    }
    let details = audit::details(json!({}));
    audit::record(
        app,
        caller,
        None,
        AuditAction::EventTypeDeleted,
        target(&name),
        details,
    )
    .await
}

/// What publishing knows of one type: whether the catalog has it, and its schema.
type Known = Option<Option<Arc<Schema>>>;

/// The catalog as publishing reads it: each type looked up once per `ttl` (a change made
/// through another instance is seen within it), its schema compiled once.
pub struct Catalog {
    strict: bool,
    ttl: Duration,
    seen: Mutex<HashMap<EventType, (Instant, Known)>>,
}

/// Types looked up before the cache starts over: bounds it when events carry many types.
const REMEMBERED_TYPES: usize = 4096;

impl Catalog {
    pub fn new(strict: bool, ttl: Duration) -> Self {
        Self {
            strict,
            ttl,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets what was read of `name` (this instance just changed it).
    pub fn forget(&self, name: &str) {
        if let Ok(name) = EventType::parse(name) {
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&name);
        }
    }

    async fn known(&self, app: &App, name: &EventType) -> ServiceResult<Known> {
        if let Some((at, known)) = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
        {
            if at.elapsed() < self.ttl {
                return Ok(known.clone());
            }
        }
        // A schema that no longer compiles (stored before a rule changed) checks nothing
        // rather than refusing every event of its type.
        let known = app.store.get_event_type(name).await?.map(|def| {
            def.schema
                .as_ref()
                .and_then(|schema| Schema::compile(schema).ok())
                .map(Arc::new)
        });
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= REMEMBERED_TYPES {
            seen.clear();
        }
        seen.insert(name.clone(), (Instant::now(), known.clone()));
        Ok(known)
    }

    /// An event about to be published through the API: refused (naming `data.<path>`, or
    /// `type`) when its type has a schema its data does not match, or, strict, when the
    /// catalog does not have its type. A malformed type is left to publishing to refuse.
    pub async fn check(&self, app: &App, event_type: &str, data: &Value) -> ServiceResult<()> {
        let Ok(name) = EventType::parse(event_type) else {
            return Ok(());
        };
        match self.known(app, &name).await? {
            None if self.strict => Err(InvalidField::new(
                "type",
                format!(
                    "`{name}` is not in the event-type catalog (POST /v1/event-types adds it; \
                     HOOKLANE_STRICT_EVENT_TYPES is on)",
                    name = name.as_str()
                ),
            )
            .into()),
            Some(Some(schema)) => schema.validate(data).map_err(|e| {
                let at = e.path.strip_prefix('$').unwrap_or(&e.path);
                let field = format!("data{at}");
                let message = format!("{} (schema of `{}`)", e.message, name.as_str());
                InvalidField::new(field, message).into()
            }),
            _ => Ok(()),
        }
    }
}
