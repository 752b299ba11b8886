//! The customer page (endpoints, their health, the delivery log): static files compiled into
//! the binary. The page holds no data; it asks the API with the token the user enters.
//! Everything it loads and asks is relative to its own address, so that it works mounted
//! under a base path (a proxy that strips `/base`, or one that does not, as an API Gateway
//! API mapping, with the public URL naming it: see `api::router`) as at the root.

use std::sync::LazyLock;

use axum::{
    http::{header, HeaderValue, Uri},
    response::{IntoResponse, Response},
};

const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// The page as served at `…/ui/`, whose relative `app.js` and `app.css` are its neighbours.
const INDEX: &str = include_str!("ui/index.html");

/// The page as served at `…/ui` (the address a portal link names): there a relative name
/// resolves beside `ui`, so its files are named `ui/app.js` and `ui/app.css`. Not a `<base>`
/// element: the CSP refuses one (`base-uri 'none'`), and it would be the same for both.
static INDEX_NO_SLASH: LazyLock<String> = LazyLock::new(|| {
    INDEX
        .replace("href=\"app.css\"", "href=\"ui/app.css\"")
        .replace("src=\"app.js\"", "src=\"ui/app.js\"")
});

/// Only our own files, no inline code, no framing: a token typed into this page stays here.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // A page that opened this one cannot reach it afterwards (navigate it to a `#token=` of
    // its choosing). It can still open a new tab on such a link: the header names the
    // account the page is signed in to.
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    response
}

pub async fn index(uri: Uri) -> Response {
    let page = if uri.path().ends_with('/') {
        INDEX
    } else {
        INDEX_NO_SLASH.as_str()
    };
    asset("text/html; charset=utf-8", page)
}

pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_page_keeps_its_token_to_itself() {
        let page = index(Uri::from_static("/ui")).await;
        let headers = page.headers();
        for (name, value) in [
            ("content-security-policy", CSP),
            ("referrer-policy", "no-referrer"),
            ("x-content-type-options", "nosniff"),
            ("cross-origin-opener-policy", "same-origin"),
        ] {
            assert_eq!(
                headers.get(name).and_then(|v| v.to_str().ok()),
                Some(value),
                "{name}"
            );
        }
    }

    #[test]
    fn each_address_of_the_page_names_its_files_relative_to_itself() {
        for (page, prefix) in [(INDEX, ""), (INDEX_NO_SLASH.as_str(), "ui/")] {
            for file in ["app.css", "app.js"] {
                assert!(
                    page.contains(&format!("=\"{prefix}{file}\"")),
                    "{file} as {prefix}{file}"
                );
            }
            assert!(!page.contains("\"/ui/"), "a path from the host's root");
        }
    }
}
