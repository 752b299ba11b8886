BEGIN;
INSERT INTO orders (id, total) VALUES ('ord_1001', 42);
INSERT INTO hooklane_outbox (id, account_id, type, data)
  VALUES ('ord_1001.placed', 'acme', 'order.placed', '{"order": "ord_1001", "total": 42}');
COMMIT;
