"""Writes to the Hooklane events table from Python for tests/e2e/outbox.rs: the CLI's JSON form
of docs/outbox/, items that break the contract, and the rejected-items listing of
docs/OUTBOX.md. Prints JSON. Needs boto3 (the test venv) and the AWS_* variables."""

import json
import sys
import time

import boto3

client = boto3.client("dynamodb")


def cli_json(path, orders_table, events_table):
    """What `aws dynamodb transact-write-items --transact-items file://PATH` sends, with the
    example's table names replaced by the test's and its fixed `created_at` by the current
    time, as the page tells readers to (an event goes to the endpoints that existed then)."""
    with open(path) as f:
        items = json.load(f)
    names = {"orders": orders_table, "hooklane-events": events_table}
    for item in items:
        for action in item.values():
            action["TableName"] = names[action["TableName"]]
            created = action["Item"].get("created_at")
            if created is not None:
                assert created == {"N": "1767225600000"}, created
                created["N"] = str(time.time_ns() // 1_000_000)
    try:
        client.transact_write_items(TransactItems=items)
        return {"outcome": "written"}
    except client.exceptions.TransactionCanceledException as error:
        codes = [r.get("Code") for r in error.response.get("CancellationReasons", [])]
        return {"outcome": "canceled", "codes": codes}


def event(account, event_id, **changes):
    item = {
        "account_id": {"S": account},
        "id": {"S": event_id},
        "type": {"S": "order.placed"},
        "created_at": {"N": str(time.time_ns() // 1_000_000)},
        "data": {"S": json.dumps({"order": event_id})},
        "unfanned_shard": {"S": "0"},
    }
    for name, value in changes.items():
        if value is None:
            del item[name]
        else:
            item[name] = value
    return item


def malformed(events_table, account):
    """One item of each kind the contract refuses, each in its own transaction."""
    seconds = str(int(time.time()))
    kinds = {
        "missing field": event(account, "bad_missing.1", type=None),
        "wrong type": event(account, "bad_type.1", data={"M": {"order": {"S": "x"}}}),
        "created_at a string": event(account, "bad_created.1", created_at={"S": "2026-01-01"}),
        "created_at in seconds": event(account, "bad_seconds.1", created_at={"N": seconds}),
        "oversize payload": event(
            account, "bad_size.1", data={"S": json.dumps({"blob": "x" * 300_000})}
        ),
        "unknown account": event("no-such-account", "bad_account.1"),
    }
    written = {}
    for kind, item in kinds.items():
        put = {"TableName": events_table, "Item": item,
               "ConditionExpression": "attribute_not_exists(id)"}
        try:
            client.transact_write_items(TransactItems=[{"Put": put}])
            written[kind] = {"id": item["id"]["S"], "account": item["account_id"]["S"],
                             "written": True}
        except Exception as error:  # AWS refuses some at the write: that is an outcome too
            written[kind] = {"id": item["id"]["S"], "account": item["account_id"]["S"],
                             "written": False, "error": str(error)}
    return written


def rejected(events_table):
    """docs/OUTBOX.md's listing: `aws dynamodb scan` with this filter and projection."""
    found = []
    pages = client.get_paginator("scan").paginate(
        TableName=events_table,
        FilterExpression="attribute_exists(rejected)",
        ProjectionExpression="account_id, id, rejected",
    )
    for page in pages:
        for item in page["Items"]:
            found.append({k: v["S"] for k, v in item.items()})
    return found


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    result = {"cli-json": cli_json, "malformed": malformed, "rejected": rejected}[command](*args)
    print(json.dumps(result))
