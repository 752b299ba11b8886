-- The outbox table `hooklane relay` publishes from (PostgreSQL 11 or later), and the trigger
-- that wakes the relay when new rows commit. See docs/OUTBOX.md.
CREATE TABLE hooklane_outbox (
  id         text PRIMARY KEY,  -- the event id: 1-128 of A-Z a-z 0-9 _ - . :
  account_id text NOT NULL,     -- a Hooklane account
  type       text NOT NULL,     -- like order.placed
  data       jsonb NOT NULL,    -- the webhook's `data`
  created_at timestamptz NOT NULL DEFAULT now(),
  sent_at    timestamptz,       -- set by the relay once Hooklane has the event
  error      text               -- set by the relay if Hooklane refuses the row for good
);
CREATE INDEX hooklane_outbox_unsent ON hooklane_outbox (created_at, id)
  WHERE sent_at IS NULL AND error IS NULL;

CREATE FUNCTION hooklane_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('hooklane_outbox', '');  -- delivered at COMMIT, never on ROLLBACK
  RETURN NULL;
END $$;
CREATE TRIGGER hooklane_outbox_notify AFTER INSERT ON hooklane_outbox
  FOR EACH STATEMENT EXECUTE FUNCTION hooklane_outbox_notify();
