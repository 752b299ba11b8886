use serde::Serialize;

use super::ids::DeliveryId;
use crate::clock::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Scheduled,
    Manual,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Manual => "manual",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "scheduled" => Some(Self::Scheduled),
            "manual" => Some(Self::Manual),
            _ => None,
        }
    }
}

/// One HTTP try of a delivery, as the delivery log shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    pub delivery_id: DeliveryId,
    pub number: u32,
    pub trigger: Trigger,
    pub started_at: Timestamp,
    pub latency_ms: u64,
    pub status_code: Option<u16>,
    /// The response headers kept ([`KeptResponse`]).
    pub response_headers: Vec<(String, String)>,
    /// The response body, decoded lossily as UTF-8 and cut to the configured cap in bytes
    /// ([`KeptResponse`]).
    pub response_body: String,
    pub response_body_truncated: bool,
    pub error: Option<String>,
}

/// The most of a response body an attempt keeps: this many bytes of its text.
pub const MAX_RESPONSE_BODY_BYTES: usize = 64 * 1024;
/// The most response headers an attempt keeps.
pub const MAX_RESPONSE_HEADERS: usize = 64;
/// The most of a kept header's name, in bytes.
pub const MAX_RESPONSE_HEADER_NAME_BYTES: usize = 128;
/// The most of a kept header's value, in bytes.
pub const MAX_RESPONSE_HEADER_VALUE_BYTES: usize = 1024;
/// The most bytes of names and values the kept headers hold together.
pub const MAX_RESPONSE_HEADERS_BYTES: usize = 16 * 1024;

/// What an attempt keeps of the answer it got, bounded in bytes whatever the receiver sent,
/// so that an attempt always fits one stored row (a DynamoDB item holds 400 KB).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeptResponse {
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub body_truncated: bool,
}

impl KeptResponse {
    /// Keeps of `headers` those that fit, in order, each name and value cut at its cap, and
    /// of `body` (what was read of it; `body_truncated` when more was sent) its lossy UTF-8
    /// text up to `max_body` bytes, at most [`MAX_RESPONSE_BODY_BYTES`]. Each invalid byte
    /// decodes to U+FFFD, 3 bytes, so the text is cut after decoding, and marked truncated.
    pub fn of(
        headers: &[(String, String)],
        body: &[u8],
        body_truncated: bool,
        max_body: usize,
    ) -> Self {
        let max_body = max_body.min(MAX_RESPONSE_BODY_BYTES);
        let read = &body[..body.len().min(max_body)];
        let mut text = String::from_utf8_lossy(read).into_owned();
        let cut = floor_char_boundary(&text, max_body);
        let body_truncated = body_truncated || read.len() < body.len() || cut < text.len();
        text.truncate(cut);
        let mut kept = Vec::new();
        let mut total = 0;
        for (name, value) in headers.iter().take(MAX_RESPONSE_HEADERS) {
            let name = cut_to(name, MAX_RESPONSE_HEADER_NAME_BYTES);
            let value = cut_to(value, MAX_RESPONSE_HEADER_VALUE_BYTES);
            total += name.len() + value.len();
            if total > MAX_RESPONSE_HEADERS_BYTES {
                break;
            }
            kept.push((name.to_owned(), value.to_owned()));
        }
        Self {
            headers: kept,
            body: text,
            body_truncated,
        }
    }
}

/// `text` up to `max` bytes, cut where a character starts.
pub fn cut_to(text: &str, max: usize) -> &str {
    &text[..floor_char_boundary(text, max)]
}

/// The largest index up to `max` at which `text` can be cut (`str::floor_char_boundary`,
/// which this crate's minimum Rust does not have yet).
fn floor_char_boundary(text: &str, max: usize) -> usize {
    if max >= text.len() {
        return text.len();
    }
    // A UTF-8 character is at most 4 bytes, so a boundary is at most 3 bytes back; index 0
    // always is one.
    (0..=max)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinary_answer_is_kept_as_it_came() {
        let headers = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("x-request-id".to_owned(), "abc-123".to_owned()),
        ];
        let kept = KeptResponse::of(&headers, br#"{"ok":true}"#, false, 64 * 1024);
        assert_eq!(
            kept,
            KeptResponse {
                headers,
                body: r#"{"ok":true}"#.to_owned(),
                body_truncated: false,
            }
        );
        // Text in UTF-8 up to the cap is kept whole, and a body cut by the reader stays marked.
        let body = "é".repeat(100);
        let kept = KeptResponse::of(&[], body.as_bytes(), true, 200);
        assert_eq!(
            (kept.body.as_str(), kept.body_truncated),
            (body.as_str(), true)
        );
    }

    #[test]
    fn text_is_cut_in_bytes_where_a_character_starts() {
        // 7 invalid bytes decode to 21 bytes of text: cut to 9, whole characters only.
        let kept = KeptResponse::of(&[], &[0xFF; 7], false, 10);
        assert_eq!(kept.body, "\u{FFFD}".repeat(3));
        assert!(kept.body_truncated);
        // More than the cap was handed on: the rest is dropped and the cut marked.
        let kept = KeptResponse::of(&[], b"abcdef", false, 4);
        assert_eq!((kept.body.as_str(), kept.body_truncated), ("abcd", true));
        // The cap never exceeds the most an attempt keeps.
        let kept = KeptResponse::of(&[], &vec![b'a'; 100_000], false, usize::MAX);
        assert_eq!(kept.body.len(), MAX_RESPONSE_BODY_BYTES);

        let long = ("x".repeat(200), "€".repeat(400));
        let kept = KeptResponse::of(&[long], b"", false, 0);
        let (name, value) = &kept.headers[0];
        assert_eq!(name.len(), MAX_RESPONSE_HEADER_NAME_BYTES);
        // 1024 bytes hold 341 three-byte characters.
        assert_eq!(value, &"€".repeat(341));
    }

    #[test]
    fn headers_are_kept_in_order_while_they_fit() {
        let header = |i: usize| (format!("x-{i:03}"), "v".repeat(1000));
        let headers: Vec<_> = (0..100).map(header).collect();
        let kept = KeptResponse::of(&headers, b"", false, 0);
        // Each takes 1005 bytes: 16 fit in 16 KiB.
        assert_eq!(kept.headers, headers[..16]);
        let small: Vec<_> = (0..100)
            .map(|i| (format!("x-{i:03}"), "v".into()))
            .collect();
        let kept = KeptResponse::of(&small, b"", false, 0);
        assert_eq!(kept.headers, small[..MAX_RESPONSE_HEADERS]);
    }
}
