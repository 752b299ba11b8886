//! Page cursors of the delivery log and the audit log: the time and id of the last delivery
//! (or entry) a page returned (or examined), opaque to clients. Both stores and the API read
//! them here. An event's delivery list, in endpoint-id order, has cursors of its own kind,
//! which no other list takes (nor it theirs).

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};

#[derive(serde::Serialize, serde::Deserialize)]
struct Cursor {
    c: i64,
    i: String,
}

/// The cursor after the delivery created at `created_millis` with id `id`.
pub fn encode(created_millis: i64, id: &str) -> String {
    let cursor = Cursor {
        c: created_millis,
        i: id.to_owned(),
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&cursor).unwrap_or_default())
}

/// Decodes a cursor from a previous page; `None` when it was not one of ours, or is one of
/// an event's delivery list.
pub fn decode(raw: &str) -> Option<(i64, String)> {
    decode_any(raw).filter(|(c, _)| *c != EVENT_PAGE)
}

/// Where an event's delivery list is marked: no time, attempt number or position is negative.
const EVENT_PAGE: i64 = -1;

/// The cursor of an event's delivery list after the delivery to `endpoint`.
pub fn encode_event_page(endpoint: &str) -> String {
    encode(EVENT_PAGE, endpoint)
}

/// The endpoint id an event's delivery list goes on after; `None` for any other cursor.
pub fn decode_event_page(raw: &str) -> Option<String> {
    decode_any(raw)
        .filter(|(c, _)| *c == EVENT_PAGE)
        .map(|(_, endpoint)| endpoint)
}

fn decode_any(raw: &str) -> Option<(i64, String)> {
    let bytes = URL_SAFE_NO_PAD.decode(raw).ok()?;
    let cursor: Cursor = serde_json::from_slice(&bytes).ok()?;
    Some((cursor.c, cursor.i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_decodes_to_what_it_was_made_of_and_a_foreign_one_to_nothing() {
        let raw = encode(1_700_000_000_123, "d_1");
        assert_eq!(decode(&raw), Some((1_700_000_000_123, "d_1".to_owned())));
        assert_eq!(decode("not-a-cursor"), None);
        assert_eq!(decode(&URL_SAFE_NO_PAD.encode(b"{\"c\":1}")), None);
    }

    #[test]
    fn an_event_page_cursor_is_taken_by_its_list_alone() {
        let page = encode_event_page("ep_a");
        assert_eq!(decode_event_page(&page), Some("ep_a".to_owned()));
        assert_eq!(decode(&page), None, "another list takes it");
        let log = encode(1_700_000_000_123, "dlv_x");
        assert_eq!(
            decode_event_page(&log),
            None,
            "the event list takes another's"
        );
        assert_eq!(decode_event_page(&encode(0, "ep_a")), None);
    }
}
