//! The store contract for the event-type catalog: created once, read, listed by name,
//! rewritten, deleted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::TimeDelta;
use hooklane::{
    domain::{EventType, EventTypeDef},
    store::{Store, StoreError},
};
use serde_json::json;

use crate::fixtures::t0;

fn def(name: &str) -> EventTypeDef {
    EventTypeDef {
        name: EventType::parse(name).unwrap(),
        description: format!("{name} happened"),
        schema: None,
        example: None,
        deprecated: false,
        created_at: t0(),
        updated_at: t0(),
    }
}

pub async fn the_event_type_catalog_is_kept_by_name(store: &dyn Store) {
    assert_eq!(store.list_event_types().await.unwrap(), []);
    let paid = EventTypeDef {
        schema: Some(json!({"type": "object", "required": ["amount"]})),
        example: Some(json!({"amount": 1200, "lines": [{"sku": "a"}]})),
        ..def("invoice.paid")
    };
    store.create_event_type(&paid).await.unwrap();
    store
        .create_event_type(&def("account.created"))
        .await
        .unwrap();
    assert!(
        matches!(
            store.create_event_type(&def("invoice.paid")).await,
            Err(StoreError::Conflict { .. })
        ),
        "a second type of the same name"
    );
    assert_eq!(
        store.get_event_type(&paid.name).await.unwrap(),
        Some(paid.clone())
    );
    let none = EventType::parse("invoice.none").unwrap();
    assert_eq!(store.get_event_type(&none).await.unwrap(), None);
    // The list may come from an index that lags (DynamoDB): it is read once it has both.
    let mut listed = Vec::new();
    for _ in 0..50 {
        listed = store.list_event_types().await.unwrap();
        if listed.len() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let names: Vec<&str> = listed.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["account.created", "invoice.paid"], "by name");
    assert_eq!(listed[1], paid);

    let changed = EventTypeDef {
        description: "Paid in full".into(),
        schema: None,
        deprecated: true,
        created_at: t0() + TimeDelta::days(9),
        updated_at: t0() + TimeDelta::hours(1),
        ..paid.clone()
    };
    store.update_event_type(&changed).await.unwrap();
    let stored = store.get_event_type(&paid.name).await.unwrap().unwrap();
    assert_eq!(
        stored,
        EventTypeDef {
            created_at: t0(),
            ..changed
        },
        "its creation time stays"
    );
    assert!(matches!(
        store.update_event_type(&def("invoice.none")).await,
        Err(StoreError::NotFound(_))
    ));

    assert!(store.delete_event_type(&paid.name).await.unwrap());
    assert!(
        !store.delete_event_type(&paid.name).await.unwrap(),
        "already gone"
    );
    assert_eq!(store.get_event_type(&paid.name).await.unwrap(), None);
    store.create_event_type(&paid).await.unwrap();
    assert_eq!(
        store.get_event_type(&paid.name).await.unwrap(),
        Some(paid),
        "made again"
    );
}
