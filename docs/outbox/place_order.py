"""Places an order and publishes its `order.placed` webhook in one DynamoDB transaction:
the Hooklane transactional outbox from Python (boto3). See docs/OUTBOX.md."""

import json
import random
import sys
import time

import boto3


def outbox_event(account_id, event_id, event_type, data):
    """The Hooklane events-table item (contract version 1) for one event."""
    return {
        "account_id": {"S": account_id},
        "id": {"S": event_id},
        "type": {"S": event_type},
        "created_at": {"N": str(time.time_ns() // 1_000_000)},  # milliseconds
        # Compact, UTF-8 as it is (not \u escapes), and no NaN (not JSON: fan-out refuses it).
        "data": {"S": json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)},
        "unfanned_shard": {"S": str(random.randrange(4))},
    }


def place_order(dynamodb, orders_table, events_table, account_id, order_id, total):
    """Returns "placed", "already placed" (a retry of a committed call) or "refused"."""
    event = outbox_event(
        account_id,
        f"{order_id}.placed",  # from the business key: a retry carries the same id
        "order.placed",
        {"order": order_id, "total": total},
    )
    try:
        dynamodb.transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": orders_table,
                        "Item": {"id": {"S": order_id}, "total": {"N": str(total)}},
                        "ConditionExpression": "attribute_not_exists(id)",
                    }
                },
                {
                    "Put": {
                        "TableName": events_table,
                        "Item": event,
                        "ConditionExpression": "attribute_not_exists(id)",
                    }
                },
            ]
        )
        return "placed"
    except dynamodb.exceptions.TransactionCanceledException as error:
        codes = [r.get("Code") for r in error.response.get("CancellationReasons", [])]
        if codes[:2] == ["ConditionalCheckFailed", "ConditionalCheckFailed"]:
            return "already placed"  # the order and its event exist: an earlier try committed
        if codes[:1] == ["ConditionalCheckFailed"]:
            return "refused"  # the order exists, and nothing was written
        raise  # anything else (the event there without its order, a conflict): not done


if __name__ == "__main__":
    # python3 place_order.py ORDERS_TABLE EVENTS_TABLE ACCOUNT ORDER_ID TOTAL
    orders, events, account, order, total = sys.argv[1:6]
    client = boto3.client("dynamodb")
    print(place_order(client, orders, events, account, order, int(total)))
