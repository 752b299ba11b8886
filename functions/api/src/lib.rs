//! The api function: the same axum router as `hooklane serve`, served through API Gateway.

pub use hooklane::aws::handlers::api_router;
use hooklane::{api::ClientAddress, telemetry::emf::EmfPublisher};
use lambda_http::request::RequestContext;

/// Hands the router API Gateway's source IP as the client's address, which the audit log
/// records of each change (the router serves no TCP peer of its own here).
pub fn with_source_ip(router: axum::Router) -> axum::Router {
    router.layer(axum::middleware::from_fn(
        |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
            if let Some(ip) = source_ip(&request) {
                request.extensions_mut().insert(ClientAddress(ip));
            }
            next.run(request).await
        },
    ))
}

fn source_ip(request: &axum::extract::Request) -> Option<std::net::IpAddr> {
    match request.extensions().get::<RequestContext>()? {
        RequestContext::ApiGatewayV2(context) => context.http.source_ip.as_deref()?.parse().ok(),
        #[allow(unreachable_patterns)] // other kinds of request, when their features are on
        _ => None,
    }
}

/// Publishes the metrics of each request before its response leaves the function.
pub fn flushing_metrics(router: axum::Router, metrics: EmfPublisher) -> axum::Router {
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let metrics = metrics.clone();
            async move { metrics.flushed(next.run(request)).await }
        },
    ))
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use hooklane::{aws::admin_token::AdminTokenError, domain::AccountId};
    use hooklane_testkit::testing::emulated_shape;

    use super::*;

    async fn call(router: &axum::Router, fixture: &str) -> (u16, serde_json::Value) {
        let request = lambda_http::request::from_str(fixture).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    #[tokio::test]
    async fn api_gateway_v2_requests_reach_the_router() {
        let (mut settings, shape) = emulated_shape().await;
        settings.admin_token = Some("hl_admin_fixture".into());
        let router = api_router(&shape, &settings).await.unwrap();
        let (status, _) = call(&router, include_str!("../fixtures/http-api-health.json")).await;
        assert_eq!(status, 200);
        let create = include_str!("../fixtures/http-api-create-account.json")
            .replace("{{ADMIN_TOKEN}}", "hl_admin_fixture");
        let (status, body) = call(&router, &create).await;
        assert_eq!(status, 201, "{body}");
        let stored = shape
            .app
            .store
            .get_account(&AccountId::parse("acme").unwrap())
            .await
            .unwrap();
        assert_eq!(stored.map(|a| a.name), Some("Acme".to_owned()));
        let wrong = create.replace("hl_admin_fixture", "hl_admin_guess");
        assert_eq!(call(&router, &wrong).await.0, 401);
    }

    /// The create-account fixture turned into another JSON request of the same client.
    fn request(method: &str, path: &str, token: &str, body: &serde_json::Value) -> String {
        let mut request: serde_json::Value =
            serde_json::from_str(include_str!("../fixtures/http-api-create-account.json")).unwrap();
        let body = body.to_string();
        request["rawPath"] = path.into();
        request["requestContext"]["http"]["path"] = path.into();
        request["requestContext"]["http"]["method"] = method.into();
        request["headers"]["authorization"] = format!("Bearer {token}").into();
        request["headers"]["content-length"] = body.len().to_string().into();
        request["body"] = body.into();
        request.to_string()
    }

    /// Bad input through API Gateway gets the router's 400 naming the field, and nothing is
    /// written: an object nested in the body is read from an object only, not an array.
    #[tokio::test]
    async fn a_nested_object_given_as_an_array_is_refused_through_api_gateway() {
        let (mut settings, shape) = emulated_shape().await;
        settings.admin_token = Some("hl_admin_fixture".into());
        let router = api_router(&shape, &settings).await.unwrap();
        let body = serde_json::json!({
            "id": "arrayed", "name": "Arrayed", "owner_email": "ops@acme.example",
            "publish_rate_limit": [5],
        });
        let create = request("POST", "/v1/accounts", "hl_admin_fixture", &body);
        let (status, error) = call(&router, &create).await;
        assert_eq!(status, 400, "{error}");
        assert_eq!(error["error"]["code"], "invalid_field", "{error}");
        assert_eq!(error["error"]["field"], "publish_rate_limit", "{error}");
        let stored = shape
            .app
            .store
            .get_account(&AccountId::parse("arrayed").unwrap())
            .await
            .unwrap();
        assert!(stored.is_none(), "nothing is written: {stored:?}");
    }

    /// The audit log records API Gateway's source IP of the fixture as the client's address.
    #[tokio::test]
    async fn a_change_is_audited_with_api_gateways_source_ip() {
        let (mut settings, shape) = emulated_shape().await;
        settings.admin_token = Some("hl_admin_fixture".into());
        let router = with_source_ip(api_router(&shape, &settings).await.unwrap());
        let create = include_str!("../fixtures/http-api-create-account.json")
            .replace("{{ADMIN_TOKEN}}", "hl_admin_fixture");
        assert_eq!(call(&router, &create).await.0, 201);
        let mut list: serde_json::Value = serde_json::from_str(&request(
            "GET",
            "/v1/accounts/acme/audit",
            "hl_admin_fixture",
            &serde_json::json!({}),
        ))
        .unwrap();
        list["body"] = serde_json::Value::Null;
        list["headers"]["content-length"] = "0".into();
        let (status, log) = call(&router, &list.to_string()).await;
        assert_eq!(status, 200, "{log}");
        let entry = &log["data"][0];
        assert_eq!(entry["action"], "account.created", "{log}");
        assert_eq!(entry["actor"]["type"], "admin", "{log}");
        assert_eq!(entry["address"], "203.0.113.10", "{log}");
    }

    #[tokio::test]
    async fn a_publish_request_leaves_its_counts_in_the_emf_log() {
        let (metrics, log, _recorder) =
            hooklane_testkit::testing::capture_lambda_metrics("hooklane-test");
        let (mut settings, shape) = emulated_shape().await;
        settings.admin_token = Some("hl_admin_fixture".into());
        let router = flushing_metrics(api_router(&shape, &settings).await.unwrap(), metrics);
        let admin = "hl_admin_fixture";
        let create = request(
            "POST",
            "/v1/accounts",
            admin,
            &serde_json::json!({"id": "acme", "name": "Acme", "owner_email": "ops@acme.example"}),
        );
        assert_eq!(call(&router, &create).await.0, 201);
        for host in ["one", "two"] {
            let (status, body) = call(
                &router,
                &request(
                    "POST",
                    "/v1/accounts/acme/endpoints",
                    admin,
                    &serde_json::json!({"url": format!("https://{host}.example.com/hooks")}),
                ),
            )
            .await;
            assert_eq!(status, 201, "{body}");
        }
        assert!(log.documents().is_empty(), "nothing counted yet");
        let publish = request(
            "POST",
            "/v1/accounts/acme/events",
            admin,
            &serde_json::json!({"id": "evt_1", "type": "invoice.paid", "data": {"amount": 42}}),
        );
        let (status, body) = call(&router, &publish).await;
        assert!(status == 201 || status == 202, "{status} {body}");
        // Written by the time the response left the router.
        assert_eq!(
            log.value(
                "hooklane_events_published_total",
                &[("Stack", "hooklane-test")]
            ),
            Some(serde_json::json!(1))
        );
        // The API writes the event alone: the stream's fan-out creates the two deliveries
        // (and counts them).
        assert_eq!(
            body["deliveries"].as_array().map(Vec::len),
            Some(2),
            "{body}"
        );
        assert_eq!(
            log.value(
                "hooklane_deliveries_created_total",
                &[("Stack", "hooklane-test")]
            ),
            None
        );
        let stored = shape
            .app
            .store
            .get_event(
                &AccountId::parse("acme").unwrap(),
                &hooklane::domain::EventId::parse("evt_1").unwrap(),
            )
            .await
            .unwrap()
            .expect("the event is stored");
        assert!(shape
            .app
            .store
            .deliveries_of_event(&stored)
            .await
            .unwrap()
            .is_empty());
        // The same id again creates and counts nothing.
        let written = log.documents().len();
        call(&router, &publish).await;
        assert_eq!(log.documents().len(), written);
    }

    #[tokio::test]
    async fn the_admin_token_is_read_from_an_ssm_secure_string() {
        let (mut settings, shape) = emulated_shape().await;
        let parameter = format!("/{}/admin-token", settings.tables.control);
        let ssm = hooklane::aws::aws_sdk_ssm::Client::new(&hooklane::aws::load_sdk_config().await);
        ssm.put_parameter()
            .name(&parameter)
            .value("hl_admin_from_ssm")
            .r#type(hooklane::aws::aws_sdk_ssm::types::ParameterType::SecureString)
            .send()
            .await
            .unwrap();
        settings.admin_token_parameter = Some(parameter.clone());
        settings.in_lambda = true;
        let router = api_router(&shape, &settings).await.unwrap();
        let create = include_str!("../fixtures/http-api-create-account.json");
        let (status, body) = call(
            &router,
            &create.replace("{{ADMIN_TOKEN}}", "hl_admin_from_ssm"),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        for other in ["hl_admin_guess", "kms:alias/aws/ssm:hl_admin_from_ssm"] {
            let (status, _) = call(&router, &create.replace("{{ADMIN_TOKEN}}", other)).await;
            assert_eq!(status, 401, "{other} must be refused");
        }
        // Nothing generated on the side.
        assert_eq!(
            shape.app.store.get_setting("admin_token").await.unwrap(),
            None
        );

        // A missing parameter stops the cold start instead of falling back.
        settings.admin_token_parameter = Some(format!("{parameter}-missing"));
        let error = api_router(&shape, &settings).await.err().unwrap();
        assert!(
            matches!(error, AdminTokenError::Parameter { .. }),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_deployed_function_never_generates_a_token() {
        let (mut settings, shape) = emulated_shape().await;
        settings.in_lambda = true;
        let error = api_router(&shape, &settings).await.err().unwrap();
        assert!(matches!(error, AdminTokenError::NotConfigured), "{error}");
        assert_eq!(
            shape.app.store.get_setting("admin_token").await.unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn locally_without_a_configured_token_one_is_generated_and_kept() {
        let (settings, shape) = emulated_shape().await;
        let first = hooklane::aws::admin_token::admin_token(&shape, &settings)
            .await
            .unwrap();
        let second = hooklane::aws::admin_token::admin_token(&shape, &settings)
            .await
            .unwrap();
        assert!(first.starts_with("hl_admin_"));
        assert_eq!(first, second);
    }
}
