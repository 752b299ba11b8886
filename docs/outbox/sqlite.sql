-- The outbox table `hooklane relay` publishes from, in SQLite. See docs/OUTBOX.md.
CREATE TABLE hooklane_outbox (
  -- NOT NULL and the text checks: SQLite takes a NULL key and stores any type in any
  -- column, and a row the relay cannot read as text would stop it at that row. json_valid:
  -- data that is not JSON (Python's NaN) fails the transaction, not the webhook later.
  id         TEXT NOT NULL PRIMARY KEY CHECK (typeof(id) = 'text'),  -- the event id: 1-128 of A-Z a-z 0-9 _ - . :
  account_id TEXT NOT NULL CHECK (typeof(account_id) = 'text'),     -- a Hooklane account
  type       TEXT NOT NULL CHECK (typeof(type) = 'text'),           -- like order.placed
  data       TEXT NOT NULL CHECK (typeof(data) = 'text' AND json_valid(data)),  -- the webhook's `data`, as JSON text
  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  sent_at    TEXT,              -- set by the relay once Hooklane has the event
  error      TEXT               -- set by the relay if Hooklane refuses the row for good
);
CREATE INDEX hooklane_outbox_unsent ON hooklane_outbox (created_at, id)
  WHERE sent_at IS NULL AND error IS NULL;
