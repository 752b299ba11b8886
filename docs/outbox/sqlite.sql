-- The outbox table `hooklane relay` publishes from, in SQLite. See docs/OUTBOX.md.
CREATE TABLE hooklane_outbox (
  id         TEXT PRIMARY KEY,  -- the event id: 1-128 of A-Z a-z 0-9 _ - . :
  account_id TEXT NOT NULL,     -- a Hooklane account
  type       TEXT NOT NULL,     -- like order.placed
  data       TEXT NOT NULL,     -- the webhook's `data`, as JSON text
  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  sent_at    TEXT,              -- set by the relay once Hooklane has the event
  error      TEXT               -- set by the relay if Hooklane refuses the row for good
);
CREATE INDEX hooklane_outbox_unsent ON hooklane_outbox (created_at, id)
  WHERE sent_at IS NULL AND error IS NULL;
