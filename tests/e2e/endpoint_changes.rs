//! Changes to one endpoint made at the same moment, in both shapes: every change answered
//! 200 is in the endpoint afterwards. None is written over by another made from an older
//! read; one that keeps being overtaken is answered 409.

use hooklane_testkit::farm::Farm;
use reqwest::Method;
use serde_json::json;

use crate::support::{Scratch, Server};

/// Header patches sent at once, with one secret rotation among them.
const PATCHES: usize = 6;

async fn no_change_to_an_endpoint_is_lost(server: &Server) {
    let farm = Farm::start().await.expect("farm");
    server.create_account("acme").await;
    let (id, _) = server
        .create_endpoint("acme", &farm.url("changed"), json!({}))
        .await;
    let path = format!("/v1/accounts/acme/endpoints/{id}");
    let (mut updated, mut rotations) = (0, 0);
    for round in 0..3 {
        let patches = (0..PATCHES).map(|i| {
            let body = json!({"headers": {format!("X-Change-{round}-{i}"): format!("v{i}")}});
            server.request(Method::PATCH, &path, Some(body))
        });
        let rotate = format!("{path}/secret/rotate");
        let rotation = server.post(&rotate, json!({"grace_period_seconds": 0}));
        let (answers, (rotated_status, rotated)) =
            tokio::join!(futures_util::future::join_all(patches), rotation);
        let (status, stored) = server.get(&path).await;
        assert_eq!(status, 200, "{stored}");
        let mut applied = 0;
        for (i, (status, body)) in answers.iter().enumerate() {
            let name = format!("x-change-{round}-{i}");
            match status {
                200 => {
                    applied += 1;
                    assert_eq!(
                        stored["headers"][&name]["value"],
                        json!(format!("v{i}")),
                        "round {round}: PATCH {i} was answered 200 and is lost: {stored}"
                    );
                }
                409 => assert!(
                    body["error"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("try again")),
                    "{body}"
                ),
                other => panic!("round {round}: PATCH {i} answered {other}: {body}"),
            }
        }
        assert!(applied > 0, "round {round}: no PATCH applied: {answers:?}");
        updated += applied;
        match rotated_status {
            200 => {
                rotations += 1;
                assert_eq!(
                    stored["secret"], rotated["secret"],
                    "round {round}: the rotation was answered 200 and its secret is lost"
                );
            }
            409 => {}
            other => panic!("round {round}: the rotation answered {other}: {rotated}"),
        }
    }
    // The audit log has one entry per change answered 200, and none for the others.
    let (status, audit) = server.get("/v1/accounts/acme/audit?limit=100").await;
    assert_eq!(status, 200, "{audit}");
    let count = |action: &str| {
        audit["data"].as_array().map_or(0, |entries| {
            entries
                .iter()
                .filter(|e| e["action"] == action && e["target"]["id"] == id.as_str())
                .count()
        })
    };
    assert_eq!(
        (count("endpoint.updated"), count("endpoint.secret_rotated")),
        (updated, rotations),
        "{audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_concurrent_endpoint_changes() {
    let scratch = Scratch::new("endpoint-changes");
    let server = Server::start(&scratch, &[]).await;
    no_change_to_an_endpoint_is_lost(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_concurrent_endpoint_changes() {
    let scratch = Scratch::new("aws-endpoint-changes");
    let prefix = crate::aws_pipeline::unique("epchanges");
    let server = Server::start_aws(&scratch, &["--provision", &prefix], &[]).await;
    no_change_to_an_endpoint_is_lost(&server).await;
    crate::iam::assert_allowed(&server);
}
