//! An event's answers (publish, read, erase) stay within what the AWS function may return
//! (6 MB, the body JSON-escaped within it), however many endpoints the event goes to.

use std::sync::Arc;

use hooklane::store::Store;
use hooklane_testkit::fixtures::{create_account_and_endpoints, endpoint, t0};
use serde_json::{json, Value};

use crate::admin_api::{router, send};

/// What the API lists of one event's deliveries at most (`EventView`'s bound).
const SHOWN: usize = 1_000;

/// What the API keeps an answer under, JSON-escaped: Lambda's limit on a synchronous
/// answer is 6 MB, and the rest of the function's response needs room too.
const ANSWER_BYTES: usize = 5_000_000;

fn router_and_store() -> (axum::Router, Arc<dyn Store>) {
    let app = hooklane_testkit::app::api_only_app();
    let store = Arc::clone(&app.store);
    (router(app), store)
}

/// An account with `count` endpoints, each subscribed to every type.
async fn account_with(store: &dyn Store, account: &str, count: usize) {
    let endpoints: Vec<_> = (0..count)
        .map(|i| endpoint(account, &format!("ep_{i:05}"), t0()))
        .collect();
    create_account_and_endpoints(store, account, &endpoints).await;
}

/// An event sent to more endpoints than an answer lists (18,000: listed whole, the answer
/// would be over 6 MB JSON-escaped): publish (first and again), read and erase each answer
/// the first deliveries, flagged partial, within the AWS limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_to_more_endpoints_than_listed_is_answered_partial_and_small() {
    let (router, store) = router_and_store();
    // Enough that every delivery listed would make the answer over 6 MB, as on AWS.
    let endpoints = 18_000;
    account_with(store.as_ref(), "wide", endpoints).await;
    // Quotes are doubled by each escape: the payload weighs in the answer as it may.
    let pad = "\"".repeat(100_000);
    let publish = json!({"id": "evt_wide", "type": "invoice.paid", "data": {"pad": pad}});
    let batch = json!({"events": [publish.clone()]});
    let path = "/v1/accounts/wide/events/evt_wide";
    let (mut erased, mut again) = (Value::Null, Value::Null);
    for (call, method, uri, body, status, total) in [
        (
            "publish",
            "POST",
            "/v1/accounts/wide/events",
            Some(publish.clone()),
            202,
            Some(endpoints),
        ),
        // A retry reads only the deliveries it lists, as a read does.
        (
            "publish again",
            "POST",
            "/v1/accounts/wide/events",
            Some(publish),
            200,
            None,
        ),
        ("get", "GET", path, None, 200, None),
        // An erasure lists its first deliveries after it, as a read does.
        ("erase", "DELETE", path, None, 200, None),
    ] {
        let (got, text, answer) = send(&router, method, uri, body).await;
        assert_eq!(got, status, "{call}: {}", &text[..text.len().min(300)]);
        let escaped = serde_json::to_string(&text).unwrap().len();
        assert!(
            escaped <= ANSWER_BYTES,
            "{call}: {escaped} bytes JSON-escaped"
        );
        let listed = answer["deliveries"].as_array().expect("deliveries");
        assert!(
            listed.len() <= SHOWN,
            "{call}: {} deliveries listed, more than {SHOWN}",
            listed.len()
        );
        assert_eq!(listed.len(), SHOWN, "{call}: the first ones are listed");
        assert_eq!(
            answer["deliveries_partial"], true,
            "{call}: flagged partial"
        );
        assert_eq!(
            answer["deliveries_total"].as_u64(),
            total.map(|t| t as u64),
            "{call}: the total, where the answer knows it"
        );
        if call == "publish again" {
            again = answer.clone();
        }
        erased = answer;
    }
    // A read and an erasure list the first deliveries by endpoint id, and the cursor they
    // give goes on through the event's delivery list, which holds the others once each.
    let (_, _, read) = send(&router, "GET", path, None).await;
    assert!(read["erased_at"].is_string());
    let endpoints_of = |list: &Value| -> Vec<String> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|d| d["endpoint_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let all: Vec<String> = (0..endpoints).map(|i| format!("ep_{i:05}")).collect();
    assert_eq!(endpoints_of(&read["deliveries"]), all[..SHOWN], "a read");
    assert_eq!(
        endpoints_of(&erased["deliveries"]),
        all[..SHOWN],
        "an erasure"
    );
    assert_eq!(endpoints_of(&again["deliveries"]), all[..SHOWN], "a retry");
    let mut cursor = read["deliveries_next_cursor"].as_str().map(str::to_owned);
    assert_eq!(erased["deliveries_next_cursor"].as_str(), cursor.as_deref());
    assert_eq!(again["deliveries_next_cursor"].as_str(), cursor.as_deref());
    // In a batch, an event published before lists its first deliveries the same way.
    let (status, text, answer) = send(
        &router,
        "POST",
        "/v1/accounts/wide/events/batch",
        Some(batch),
    )
    .await;
    assert_eq!(status, 202, "{}", &text[..text.len().min(300)]);
    let item = &answer["results"][0]["event"];
    assert_eq!(
        endpoints_of(&item["deliveries"]),
        all[..SHOWN],
        "a batch retry"
    );
    assert_eq!(item["deliveries_next_cursor"].as_str(), cursor.as_deref());
    let mut listed = endpoints_of(&read["deliveries"]);
    let mut pages = 0;
    while let Some(after) = cursor {
        let uri = format!("{path}/deliveries?limit=500&cursor={after}");
        let (status, text, page) = send(&router, "GET", &uri, None).await;
        assert_eq!(status, 200, "{text}");
        listed.extend(endpoints_of(&page["data"]));
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        pages += 1;
    }
    assert_eq!(pages, (endpoints - SHOWN).div_ceil(500));
    assert_eq!(listed, all, "every delivery once, in endpoint-id order");
}

/// An event with few deliveries is answered as it always was: every delivery, and no
/// field more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_to_few_endpoints_is_answered_whole_as_before() {
    let (router, store) = router_and_store();
    account_with(store.as_ref(), "small", 3).await;
    let publish = json!({"id": "evt_small", "type": "invoice.paid", "data": {"n": 1}});
    let path = "/v1/accounts/small/events/evt_small";
    let keys = |answer: &Value| -> Vec<String> {
        let mut keys: Vec<String> = answer.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    let before = ["created_at", "data", "deliveries", "id", "type"];
    for (call, method, uri, body, status) in [
        (
            "publish",
            "POST",
            "/v1/accounts/small/events",
            Some(publish.clone()),
            202,
        ),
        (
            "publish again",
            "POST",
            "/v1/accounts/small/events",
            Some(publish),
            200,
        ),
        ("get", "GET", path, None, 200),
        ("erase", "DELETE", path, None, 200),
    ] {
        let (got, text, answer) = send(&router, method, uri, body).await;
        assert_eq!(got, status, "{call}: {text}");
        assert_eq!(
            answer["deliveries"].as_array().map(Vec::len),
            Some(3),
            "{call}"
        );
        let mut expected: Vec<&str> = before.to_vec();
        if call == "erase" {
            expected.push("erased_at");
            expected.sort();
        }
        assert_eq!(keys(&answer), expected, "{call}: {answer}");
        for delivery in answer["deliveries"].as_array().unwrap() {
            let mut fields: Vec<&str> = delivery
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            fields.sort();
            assert_eq!(
                fields,
                [
                    "attempts",
                    "created_at",
                    "endpoint_id",
                    "event_id",
                    "event_type",
                    "id",
                    "last_error",
                    "last_status",
                    "next_try_at",
                    "status",
                    "updated_at"
                ],
                "{call}"
            );
        }
    }
}

/// A DynamoDB store on the emulator whose client counts its calls; with the client and the
/// table names, to write items directly.
#[cfg(feature = "aws")]
async fn metered_dynamo_store() -> (
    hooklane::store::dynamodb::DynamoStore,
    hooklane::aws::aws_sdk_dynamodb::Client,
    hooklane::store::dynamodb::TableNames,
    hooklane_testkit::meter::Meter,
) {
    use hooklane_testkit::{
        meter::{table_layouts, Meter},
        testing::{emulator_store_on, fresh_table_names, require_emulator},
    };
    require_emulator();
    let tables = fresh_table_names();
    let meter = Meter::new(table_layouts(&tables));
    let client = hooklane_testkit::faults::dynamodb_client_with(meter.interceptor()).await;
    let store = emulator_store_on(client.clone(), &tables).await;
    (store, client, tables, meter)
}

/// Calls of `operation` (`DynamoDB.Query`) in a meter's reading.
#[cfg(feature = "aws")]
fn calls(reading: &hooklane_testkit::meter::Reading, operation: &str) -> u64 {
    reading
        .operations
        .get(operation)
        .map_or(0, |usage| usage.calls)
}

/// On DynamoDB an event's deliveries are found by key, one candidate per endpoint: a read
/// of its first deliveries stops at the batch of candidates that holds them, where a read
/// of them all reads every candidate (each a read unit, found or not).
#[cfg(feature = "aws")]
#[tokio::test]
async fn dynamodb_reads_no_more_of_an_events_deliveries_than_it_shows() {
    use hooklane_testkit::fixtures::{delivery, event};
    let (store, _, _, meter) = metered_dynamo_store().await;
    let endpoints: Vec<_> = (0..250)
        .map(|i| endpoint("wide", &format!("ep_{i:03}"), t0()))
        .collect();
    create_account_and_endpoints(&store, "wide", &endpoints).await;
    let ev = event("wide", "evt_wide", t0());
    let sent: Vec<_> = endpoints.iter().map(|e| delivery(&ev, e, t0())).collect();
    store.publish(&ev, &sent).await.unwrap();

    let reads = |reading: &hooklane_testkit::meter::Reading| {
        (
            calls(reading, "DynamoDB.Query"),
            calls(reading, "DynamoDB.BatchGetItem"),
        )
    };
    let before = meter.reading();
    let first = store
        .event_deliveries(&ev, &hooklane::store::PageAfter::first(50))
        .await
        .unwrap();
    let shown = meter.reading().since(&before);
    assert_eq!((first.deliveries.len(), first.more()), (50, true));
    let before = meter.reading();
    let page = store
        .event_deliveries(&ev, &hooklane::store::PageAfter::first(500))
        .await
        .unwrap();
    let paged = meter.reading().since(&before);
    assert_eq!((page.deliveries.len(), page.more()), (250, false));
    let before = meter.reading();
    assert_eq!(store.deliveries_of_event(&ev).await.unwrap().len(), 250);
    let all = meter.reading().since(&before);
    // Endpoints are listed 100 at a time, each hundred read before the next is listed.
    assert_eq!(
        reads(&shown),
        (1, 1),
        "the first 50: one query, one batch read"
    );
    assert_eq!(reads(&paged), (3, 3), "a page of all 250");
    assert_eq!(calls(&all, "DynamoDB.BatchGetItem"), 3, "all 250");
}

/// A publish of an id published before (a client retrying after a timeout, an outbox relay
/// after a restart) is answered with the first of the event's deliveries it finds, the way a
/// read is: on DynamoDB, where each of the account's endpoints is a candidate to read, a
/// retry of an event sent to the 2 of 10,000 endpoints subscribed to its type looks at a few
/// pages of candidates, not at every one of them. Having found none there, it lists those
/// the fan-out gives the event (which may not have run yet): the same 2.
#[cfg(feature = "aws")]
#[tokio::test]
async fn a_retry_reads_a_few_pages_of_an_events_deliveries_not_all() {
    use hooklane::{
        aws::aws_sdk_dynamodb::types::AttributeValue,
        domain::AccountId,
        service::publish::{publish, NewEvent},
        store::PublishOutcome,
        PublishMode,
    };
    use hooklane_testkit::{
        fixtures::{app_on, delivery, event},
        testing::{put_items, test_secrets},
    };
    const ENDPOINTS: usize = 10_000;
    let (store, client, tables, meter) = metered_dynamo_store().await;
    // Each page looks at as few candidates as it may: the answer's 1,000 and one.
    let store: Arc<dyn Store> = Arc::new(store.with_list_examine_budget(4));
    let all: Vec<_> = (0..ENDPOINTS)
        .map(|i| endpoint("vast", &format!("ep_{i:05}"), t0()))
        .collect();
    let far = [&all[9_990], &all[9_995]];
    create_account_and_endpoints(store.as_ref(), "vast", far).await;
    // The others are written 25 to a request (one by one, 10,000 take the emulator minutes):
    // copies of a stored endpoint's item, each with its own id and its secret sealed to it.
    let template = client
        .get_item()
        .table_name(&tables.endpoints)
        .key("account_id", AttributeValue::S("vast".into()))
        .key("id", AttributeValue::S(far[0].id.as_str().into()))
        .send()
        .await
        .unwrap()
        .item
        .expect("the stored endpoint");
    let cipher = test_secrets(None);
    let copies = all.iter().filter(|e| !far.contains(e)).map(|e| {
        let mut item = template.clone();
        let sealed = cipher
            .seal(&e.secret.expose(), &e.account_id, &e.id)
            .unwrap();
        item.insert("id".into(), AttributeValue::S(e.id.as_str().into()));
        item.insert("secret".into(), AttributeValue::S(sealed));
        let other = vec![AttributeValue::S("order.shipped".into())];
        item.insert("event_types".into(), AttributeValue::L(other));
        item
    });
    put_items(&client, &tables.endpoints, copies).await;
    let account = AccountId::parse("vast").unwrap();
    assert_eq!(
        store.list_endpoints(&account).await.unwrap().len(),
        ENDPOINTS
    );
    let ev = event("vast", "evt_far", t0());
    let sent = far.map(|e| delivery(&ev, e, t0()));
    assert_eq!(
        store.publish(&ev, &sent).await.unwrap(),
        PublishOutcome::Created
    );
    let mut app = app_on(
        Arc::clone(&store),
        Arc::new(hooklane::clock::ManualClock::new(t0())),
    );
    app.publish = PublishMode::ThroughStream;
    let retry = NewEvent {
        id: Some(ev.id.as_str().to_owned()),
        event_type: ev.event_type.as_str().to_owned(),
        data: ev.data(),
    };
    let before = meter.reading();
    let again = publish(&app, &account, retry).await.unwrap();
    let read = meter.reading().since(&before);
    assert!(!again.created);
    // Four pages of 1,001 candidates, read 100 at a time, where all 10,000 took 100.
    let batch_reads = calls(&read, "DynamoDB.BatchGetItem");
    assert!(
        batch_reads <= 44,
        "{batch_reads} batch reads for a retry's answer"
    );
    // None found in those pages: the answer lists the fan-out's, all of them.
    let to: Vec<_> = again.deliveries.iter().map(|d| &d.endpoint_id).collect();
    assert_eq!(to, far.map(|e| &e.id));
    assert_eq!(again.next, None);
}

/// The event's delivery list names what it cannot read: a cursor that is not one it gave, a
/// limit out of range, a parameter it does not take; an event that does not exist is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_delivery_list_names_what_it_cannot_read() {
    let (router, store) = router_and_store();
    account_with(store.as_ref(), "small", 3).await;
    let publish = json!({"id": "evt_small", "type": "invoice.paid", "data": {}});
    let (status, text, _) = send(&router, "POST", "/v1/accounts/small/events", Some(publish)).await;
    assert_eq!(status, 202, "{text}");
    let list = "/v1/accounts/small/events/evt_small/deliveries";
    let (status, text, page) = send(&router, "GET", &format!("{list}?limit=2"), None).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(page["data"].as_array().map(Vec::len), Some(2));
    let next = page["next_cursor"]
        .as_str()
        .expect("a next cursor")
        .to_owned();
    let (_, _, rest) = send(&router, "GET", &format!("{list}?cursor={next}"), None).await;
    assert_eq!(rest["data"][0]["endpoint_id"], "ep_00002");
    assert!(rest.get("next_cursor").is_none_or(Value::is_null), "{rest}");
    // Each list takes its own cursors only: the delivery log's would restart this one.
    let (_, _, log) = send(
        &router,
        "GET",
        "/v1/accounts/small/deliveries?limit=1",
        None,
    )
    .await;
    let log_cursor = log["next_cursor"]
        .as_str()
        .expect("a log cursor")
        .to_owned();
    let (status, text, answer) = send(
        &router,
        "GET",
        &format!("/v1/accounts/small/deliveries?cursor={next}"),
        None,
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (400, &json!("cursor")),
        "{text}"
    );
    for (query, field) in [
        (format!("cursor={log_cursor}"), "cursor"),
        ("cursor=not-a-cursor".to_owned(), "cursor"),
        ("limit=0".to_owned(), "limit"),
        ("limit=501".to_owned(), "limit"),
        ("status=failed".to_owned(), "status"),
    ] {
        let (status, text, answer) = send(&router, "GET", &format!("{list}?{query}"), None).await;
        assert_eq!(status, 400, "{query}: {text}");
        assert_eq!(answer["error"]["field"], field, "{query}: {text}");
    }
    let (status, text, _) = send(
        &router,
        "GET",
        "/v1/accounts/small/events/evt_none/deliveries",
        None,
    )
    .await;
    assert_eq!(status, 404, "{text}");
}

/// A batch queues what it created before it reads anything for its answer: when the read of
/// an earlier event's deliveries fails (here, the deliveries table refuses batch reads), the
/// batch is answered with the error, and the new event's delivery is already in the queue.
#[cfg(feature = "aws")]
#[tokio::test]
async fn a_batch_whose_answer_cannot_be_read_has_queued_what_it_created() {
    use hooklane::{
        domain::AccountId,
        queue::embedded::EmbeddedQueue,
        service::{
            fan_out::delivery_id_for,
            publish::{publish, publish_batch, NewEvent},
        },
    };
    use hooklane_testkit::{
        faults::{dynamodb_client_with, RefuseBatchReads},
        fixtures::app_on,
        testing::{emulator_store_on, fresh_table_names, require_emulator},
    };
    require_emulator();
    let tables = fresh_table_names();
    let refuse = RefuseBatchReads::of(&tables.deliveries);
    let client = dynamodb_client_with(refuse.clone()).await;
    let store: Arc<dyn Store> = Arc::new(emulator_store_on(client, &tables).await);
    let ep = endpoint("acme", "ep_1", t0());
    create_account_and_endpoints(store.as_ref(), "acme", [&ep]).await;
    let queue = Arc::new(EmbeddedQueue::new());
    let mut app = app_on(
        Arc::clone(&store),
        Arc::new(hooklane::clock::ManualClock::new(t0())),
    );
    app.queue = queue.clone();
    let account = AccountId::parse("acme").unwrap();
    let new = |id: &str| NewEvent {
        id: Some(id.to_owned()),
        event_type: "invoice.paid".to_owned(),
        data: json!({"id": id}),
    };
    let first = publish(&app, &account, new("evt_1")).await.unwrap();
    assert!(first.created);
    refuse.refuse(true);
    let batch = publish_batch(&app, &account, vec![new("evt_2"), new("evt_1")]).await;
    assert!(
        batch.is_err(),
        "the retry's answer could not be read: {batch:?}"
    );
    refuse.refuse(false);
    let second = store
        .get_event(
            &account,
            &hooklane::domain::EventId::parse("evt_2").unwrap(),
        )
        .await
        .unwrap()
        .expect("the batch's new event is written");
    assert!(
        queue.is_known(&delivery_id_for(&second, &ep.id)),
        "its delivery is queued, not left for the sweeper"
    );
}
