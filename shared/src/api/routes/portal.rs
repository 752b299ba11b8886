//! Portal links: a link to an account's page, carrying an expiring account token in its
//! fragment, which browsers never send to a server (not in a request line, not in a log).

use axum::http::{header, HeaderMap, Uri};
use serde::Serialize;

use super::*;
use crate::service::tokens;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePortalLink {
    /// Lifetime of the link (default 3600, at most 7 days); it ends no later than the key that
    /// makes it.
    #[serde(default, deserialize_with = "whole::option")]
    #[schema(minimum = 1, maximum = 604800, example = 3600)]
    ttl_seconds: Option<u64>,
    /// The page shows the account's endpoints and deliveries and changes nothing.
    #[serde(default)]
    read_only: bool,
}

#[derive(Serialize, ToSchema)]
pub struct PortalLinkView {
    /// The page's address with the token in its fragment: `…/ui#token=hl_acct_…`.
    pub url: String,
    /// Revokes the link: `DELETE /v1/accounts/{account}/tokens/{token_id}`.
    pub token_id: String,
    pub account_id: String,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "crate::clock::as_text")]
    pub expires_at: crate::clock::Timestamp,
    pub read_only: bool,
}

#[utoipa::path(
    post,
    path = "/v1/accounts/{account}/portal",
    security(("bearer" = ["admin"])),
    tag = "access",
    summary = "Makes a link to the account's page, for the platform to embed or mail to its customer.",
    params(AccountPath),
    request_body = CreatePortalLink,
    responses((status = 201, description = "A link that signs its holder in to this account's page until it expires or is revoked", body = PortalLinkView), ReadErrors, BodyErrors),
)]
pub async fn create_portal_link(
    State(state): State<ApiState>,
    Scoped(account): Scoped,
    caller: Caller,
    uri: Uri,
    headers: HeaderMap,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<CreatePortalLink>,
) -> ApiResult<Response> {
    let base = match &state.app.config.public_url {
        Some(url) => url.clone(),
        None => request_base(&uri, &headers)?,
    };
    let ttl = body
        .ttl_seconds
        .map_or(tokens::PORTAL_DEFAULT_TTL, Duration::from_secs);
    let minted = tokens::portal_link(
        &state.app,
        state.access.token_key(),
        &account,
        (ttl, principal.expires_at(), body.read_only),
        &caller,
    )
    .await?;
    let view = PortalLinkView {
        url: page_link(&base, &minted.token),
        token_id: minted.token_id,
        account_id: minted.account_id.as_str().to_owned(),
        expires_at: minted.expires_at,
        read_only: minted.read_only,
    };
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// The address the request was made to (`HOOKLANE_PUBLIC_URL` overrides it): the host it
/// named, and the scheme the transport in front reports, or plain http for `serve`.
fn request_base(uri: &Uri, headers: &HeaderMap) -> ApiResult<url::Url> {
    let host = uri.authority().map(|a| a.as_str().to_owned()).or_else(|| {
        headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
    });
    let scheme = uri
        .scheme_str()
        .or_else(|| {
            headers
                .get("x-forwarded-proto")
                .and_then(|h| h.to_str().ok())
        })
        .filter(|s| matches!(*s, "http" | "https"))
        .unwrap_or("http");
    host.filter(|h| {
        h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
    })
    .and_then(|host| url::Url::parse(&format!("{scheme}://{host}/")).ok())
    .ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "no_public_url",
            "the request names no usable Host; set HOOKLANE_PUBLIC_URL to the address people reach Hooklane at",
        )
    })
}

/// `base`'s `ui` page with the token in the fragment.
fn page_link(base: &url::Url, token: &str) -> String {
    let mut base = base.clone();
    if !base.path().ends_with('/') {
        let path = format!("{}/", base.path());
        base.set_path(&path);
    }
    let mut page = base.join("ui").unwrap_or(base);
    page.set_fragment(Some(&format!("token={token}")));
    page.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_is_the_page_under_the_base_with_the_token_in_the_fragment() {
        for (base, link) in [
            (
                "https://hooks.example.com",
                "https://hooks.example.com/ui#token=hl_acct_a.b",
            ),
            (
                "https://x.example/base",
                "https://x.example/base/ui#token=hl_acct_a.b",
            ),
            (
                "http://127.0.0.1:8080/base/",
                "http://127.0.0.1:8080/base/ui#token=hl_acct_a.b",
            ),
        ] {
            assert_eq!(
                page_link(&url::Url::parse(base).unwrap(), "hl_acct_a.b"),
                link
            );
        }
    }

    #[test]
    fn the_request_names_the_base_unless_its_host_is_unusable() {
        let mut headers = HeaderMap::new();
        let path: Uri = "/v1/accounts/a/portal".parse().unwrap();
        assert!(request_base(&path, &headers).is_err(), "no Host");
        headers.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(
            request_base(&path, &headers).unwrap().as_str(),
            "http://127.0.0.1:8080/"
        );
        headers.insert("x-forwarded-proto", "https".parse().unwrap());
        assert_eq!(
            request_base(&path, &headers).unwrap().as_str(),
            "https://127.0.0.1:8080/"
        );
        headers.insert(header::HOST, "evil.example/x?y".parse().unwrap());
        assert!(request_base(&path, &headers).is_err());
        let absolute: Uri = "https://api.example.com/v1/accounts/a/portal"
            .parse()
            .unwrap();
        assert_eq!(
            request_base(&absolute, &HeaderMap::new()).unwrap().as_str(),
            "https://api.example.com/"
        );
    }
}
