//! The api function: the same axum router as `hooklane serve`, served through API Gateway.

pub use hooklane::aws::handlers::api_router;

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use hooklane::{domain::AccountId, testing::emulated_shape};

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

    #[tokio::test]
    async fn without_a_configured_token_one_is_generated_and_kept() {
        let (settings, shape) = emulated_shape().await;
        let first = hooklane::aws::shape::admin_token(&shape, &settings)
            .await
            .unwrap();
        let second = hooklane::aws::shape::admin_token(&shape, &settings)
            .await
            .unwrap();
        assert!(first.starts_with("hl_admin_"));
        assert_eq!(first, second);
    }
}
