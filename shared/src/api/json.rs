//! A JSON body extractor whose errors name the offending field.

use axum::{
    body::Bytes,
    extract::{FromRequest, Request},
    http::{
        header::{CONTENT_LENGTH, CONTENT_TYPE},
        StatusCode,
    },
};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use super::error::ApiError;

pub struct JsonBody<T>(pub T);

/// The most bytes a request's body may have, set per request by [`limit_body`].
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// The 413 answer, naming the limit.
pub fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the request body is larger than the limit of {limit} bytes"),
    )
}

/// Sets the request's [`BodyLimit`] (a batch publish's, a single event's, or every other
/// route's) and refuses a request whose `Content-Length` is over it without keeping a byte
/// of the body (what is on its way is read and dropped first: see [`drain`]). A body without
/// a length (chunked) is cut off by [`JsonBody`] at the first byte past the limit.
pub async fn limit_body(
    axum::extract::State(state): axum::extract::State<super::ApiState>,
    mut request: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let config = &state.app.config;
    let path = request.uri().path();
    let limit = if path.ends_with("/events/batch") {
        config.batch_body_limit()
    } else if request.method() == axum::http::Method::POST
        && (path.ends_with("/events") || path.ends_with("/test"))
    {
        // A publish, or an endpoint's test event: event data, which may come escaped.
        config.body_limit()
    } else {
        config.other_body_limit()
    };
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(length) = declared.filter(|length| *length > limit as u64) {
        if length <= DRAIN_BYTES {
            drain(request.into_body()).await;
        }
        return closing(axum::response::IntoResponse::into_response(too_large(
            limit,
        )));
    }
    request.extensions_mut().insert(BodyLimit(limit));
    let response = next.run(request).await;
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        closing(response)
    } else {
        response
    }
}

/// The most of a refused body [`drain`] reads, and for how long.
const DRAIN_BYTES: u64 = 16 * 1024 * 1024;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads and drops a refused request's body, [`DRAIN_BYTES`] and [`DRAIN_TIME`] at most. A
/// server that answers and closes while the client is still sending resets the connection
/// (the unread bytes make the kernel send RST), and clients such as Python's requests and
/// reqwest then report a reset instead of the 413 and its JSON. Nothing is kept, and a body
/// declared larger is not read: its client gets the reset.
async fn drain(body: axum::body::Body) {
    use futures_util::StreamExt;
    let mut data = body.into_data_stream();
    let mut read = 0u64;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(bytes)) = data.next().await {
            read += bytes.len() as u64;
            if read > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
}

/// Marks a 413 `Connection: close`. The rest of its body may still be on the way, so the
/// connection cannot carry another request: without the header a client puts it back in
/// its pool, and its next request there meets the server closing it.
fn closing(mut response: axum::response::Response) -> axum::response::Response {
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                let mime = v
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                mime == "application/json"
                    || (mime.starts_with("application/") && mime.ends_with("+json"))
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send a JSON body with `Content-Type: application/json`",
            ));
        }
        let bytes = read_limited(request, state).await?;
        parse_object(&bytes).map(JsonBody)
    }
}

/// A body read whole within the request's [`BodyLimit`], for a route that parses it itself
/// (an optional body).
pub struct LimitedBytes(pub Bytes);

impl<S> FromRequest<S> for LimitedBytes
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        read_limited(request, state).await.map(LimitedBytes)
    }
}

/// The request's body, read chunk by chunk and stopped at the first byte past its
/// [`BodyLimit`] (a body without a `Content-Length` is not refused before it is read).
async fn read_limited<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes, ApiError> {
    match request.extensions().get::<BodyLimit>().copied() {
        Some(BodyLimit(limit)) => Limited::new(request.into_body(), limit)
            .collect()
            .await
            .map(|body| body.to_bytes())
            .map_err(|error| {
                if error.is::<LengthLimitError>() {
                    too_large(limit)
                } else {
                    ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", error.to_string())
                }
            }),
        None => Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_body",
                    rejection.body_text(),
                )
            }),
    }
}

/// Parses a body that must be a JSON object. serde would also fill a struct from an array
/// (`[]` gives every optional field `None`), which no route documents or means.
pub fn parse_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", e.to_string()))?;
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "the body must be a JSON object",
        ));
    }
    parse(bytes)
}

/// Parses JSON, reporting the path of the field that did not fit.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.inner();
        let message = inner.to_string();
        let field = field_from_message(&message)
            .map(|name| join(&path, name))
            .unwrap_or(path);
        let code = if inner.is_syntax() || inner.is_eof() {
            "malformed_json"
        } else {
            "invalid_field"
        };
        let mut api = ApiError::new(StatusCode::BAD_REQUEST, code, message);
        if code == "invalid_field" && field != "." {
            api = api.with_field(field);
        }
        api
    })
}

/// serde names a missing or unknown field only in its message: "missing field `url`".
fn field_from_message(message: &str) -> Option<&str> {
    let rest = message
        .strip_prefix("missing field `")
        .or_else(|| message.strip_prefix("unknown field `"))?;
    rest.split('`').next()
}

fn join(path: &str, name: &str) -> String {
    if path == name || path.ends_with(&format!(".{name}")) {
        path.to_owned()
    } else if path.is_empty() || path == "." {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// Whole numbers in request bodies. JSON Schema's `integer` admits `3.0`, so clients and
/// generators may send it; a fraction or a negative number is refused.
pub mod whole {
    use serde::{de::Error, Deserialize, Deserializer};

    fn convert<T: TryFrom<u64>, E: Error>(number: &serde_json::Number) -> Result<T, E> {
        let value = match number.as_u64() {
            Some(value) => Some(value),
            None => number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64),
        };
        value
            .and_then(|v| T::try_from(v).ok())
            .ok_or_else(|| E::custom(format!("expected a whole number in range, got {number}")))
    }

    pub fn required<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
        convert(&serde_json::Number::deserialize(d)?)
    }

    pub fn option<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
        Option::<serde_json::Number>::deserialize(d)?
            .map(|n| convert(&n))
            .transpose()
    }

    /// For PATCH fields where `null` clears the value: absent is `None`, `null` is `Some(None)`.
    pub fn double_option<'de, D: Deserializer<'de>, T: TryFrom<u64>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        option(d).map(Some)
    }
}

/// Objects nested in request bodies. serde fills a struct from a JSON array as well as from
/// an object (`"publish_rate_limit": [5]` read as `{"per_second": 5}`), which no route
/// documents or means; [`parse_object`] refuses an array for the body itself, and these
/// refuse one for a field.
pub mod object {
    use std::{fmt, marker::PhantomData};

    use serde::{
        de::{value::MapAccessDeserializer, MapAccess, Visitor},
        Deserialize, Deserializer,
    };

    /// A `T` read only from a JSON object.
    pub struct Object<T>(pub T);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct OnlyAnObject<T>(PhantomData<T>);
            impl<'de, T: Deserialize<'de>> Visitor<'de> for OnlyAnObject<T> {
                type Value = T;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                    T::deserialize(MapAccessDeserializer::new(map))
                }
            }
            d.deserialize_map(OnlyAnObject(PhantomData)).map(Object)
        }
    }

    pub fn option<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        Ok(Option::<Object<T>>::deserialize(d)?.map(|Object(t)| t))
    }

    /// For PATCH fields where `null` clears the value: absent is `None`, `null` is `Some(None)`.
    pub fn double_option<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        option(d).map(Some)
    }

    pub fn list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
        Ok(Vec::<Object<T>>::deserialize(d)?
            .into_iter()
            .map(|Object(t)| t)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Input {
        url: String,
        #[serde(default, deserialize_with = "whole::option")]
        max_in_flight: Option<u32>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        #[serde(default, deserialize_with = "object::option")]
        one: Option<Input>,
        #[serde(deserialize_with = "object::list")]
        many: Vec<Input>,
        #[serde(default, deserialize_with = "object::double_option")]
        patch: Option<Option<Input>>,
    }

    #[test]
    fn errors_name_the_field() {
        let missing = parse::<Input>(br#"{}"#).unwrap_err();
        assert_eq!(missing.field.as_deref(), Some("url"));
        let wrong_type = parse::<Input>(br#"{"url": 5}"#).unwrap_err();
        assert_eq!(wrong_type.field.as_deref(), Some("url"));
        let unknown = parse::<Input>(br#"{"url": "x", "nope": 1}"#).unwrap_err();
        assert_eq!(unknown.field.as_deref(), Some("nope"));
        let negative = parse::<Input>(br#"{"url": "x", "max_in_flight": -1}"#).unwrap_err();
        assert_eq!(negative.field.as_deref(), Some("max_in_flight"));
        let fraction = parse::<Input>(br#"{"url": "x", "max_in_flight": 2.5}"#).unwrap_err();
        assert_eq!(fraction.field.as_deref(), Some("max_in_flight"));
        let whole = parse::<Input>(br#"{"url": "x", "max_in_flight": 3.0}"#).unwrap();
        assert_eq!(whole.max_in_flight, Some(3));
        let array = parse_object::<Input>(br#" ["x"]"#).unwrap_err();
        assert_eq!(
            (array.status, array.code),
            (StatusCode::BAD_REQUEST, "invalid_body")
        );
        let garbage = parse_object::<Input>(b"nope").unwrap_err();
        assert_eq!(garbage.code, "malformed_json");
        assert!(parse_object::<Input>(br#" {"url": "x"}"#).is_ok());
        let nested = parse::<Outer>(br#"{"one": {"url": "x"}, "many": [{"url": "y"}]}"#).unwrap();
        assert_eq!(
            (
                nested.one.map(|i| i.url),
                nested.many.len(),
                nested.patch.is_none()
            ),
            (Some("x".to_owned()), 1, true)
        );
        let cleared = parse::<Outer>(br#"{"many": [], "patch": null}"#).unwrap();
        assert!(matches!(cleared.patch, Some(None)), "null clears");
        for (body, field) in [
            (&br#"{"one": ["x"], "many": []}"#[..], "one"),
            (br#"{"many": [{"url": "y"}, ["z"]]}"#, "many[1]"),
            (br#"{"many": [], "patch": ["x"]}"#, "patch"),
            (br#"{"many": [{"url": "y", "nope": 1}]}"#, "many[0].nope"),
            (br#"{"one": {}, "many": []}"#, "one.url"),
        ] {
            let refused = parse::<Outer>(body).unwrap_err();
            assert_eq!(
                (refused.code, refused.field.as_deref()),
                ("invalid_field", Some(field)),
                "{}: {}",
                String::from_utf8_lossy(body),
                refused.message
            );
        }
        let malformed = parse::<Input>(br#"{"url": "#).unwrap_err();
        assert_eq!(malformed.code, "malformed_json");
        assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    }
}
