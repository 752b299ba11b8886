"""moto_server with DynamoDB's atomicity, streams that survive a cancelled transaction, and
DynamoDB's refusal of a reversed BETWEEN or of a starting key outside the query's range.

DynamoDB applies each request to an item atomically: a conditional write's check and its
write cannot interleave with another request's. moto's threaded server lets them (a
condition is evaluated, another thread writes, then the first writes too), which shows up as
an endpoint's slot cap exceeded under load. One lock around every DynamoDB request restores
the guarantee the code relies on. Other services stay concurrent (SQS long polls).

A cancelled TransactWriteItems (a condition failed) makes moto put back a copy of each table
it touched, stream shard included: a reader's shard iterator keeps reading the old shard and
never sees a later write (AWS streams go on). The rollback here keeps each table's shard,
without the records of the writes it undid; stream reads take the same lock, so none sees
those records in between.

A Query whose key condition is `BETWEEN :low AND :high` with `:low` above `:high` is
refused by DynamoDB (ValidationException: "The BETWEEN operator requires upper bound to be
greater than or equal to lower bound"); moto answers it with no items. Refused here too, so
a test of code that can build such a window fails as it would on AWS. So is a Query whose
`ExclusiveStartKey` does not meet its key condition (another partition, or a sort key outside
the range: "The provided starting key is outside query boundaries based on provided
condition"): moto starts from it all the same.

A table over its write capacity refuses the write with ProvisionedThroughputExceededException,
and a write whose condition fails still uses its capacity unit; moto has no capacity. Here the
delivery log of a stack whose name begins with `throttled` (`throttled…-delivery-log`) takes
at most `THROTTLED_WRITES_PER_SECOND` item writes in any second, as a table of that many
write units with no burst left would, and refuses the rest (before looking at their condition).
Two tables take no write at all, as tables whose capacity another workload uses up for
longer than a caller waits: the attempts table of a stack whose name begins with `saturated`
(`saturated…-attempts`), and the delivery log of one whose name begins with `jammed`
(`jammed…-delivery-log`). Other tables, and other stacks, are never throttled.

DynamoDB applies a TransactWriteItems once per `ClientRequestToken` for ten minutes after it
completed: a try sent again with the same token (the SDK's, after a read timeout) is answered
as the first was, not applied again, so a `attribute_not_exists` of its own does not refuse
it; the same token with other parameters is refused (IdempotentParameterMismatchException).
moto ignores the token. Here a transaction that went through is remembered by its token for
that window (a cancelled one wrote nothing and is judged again). Not modelled: DynamoDB's
TransactionInProgressException for a try that arrives while the first still runs (the SDK
tries that again as it does a throttled request; here requests run one at a time, so a try
meets its token either unseen or completed).

On a stack whose name begins with `late`, the answer to the first try of each PutItem,
UpdateItem or TransactWriteItems is held back `LATE_ANSWER_SECONDS` after the write is
applied, longer than the SDK waits for it, as an answer lost on the way would be; the SDK's
next try of the same request is answered at once.

Usage: python moto_server_atomic.py [moto_server options]
"""

import json
import re
import sys
import threading
import time
from collections import deque
from decimal import Decimal

from moto import server
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX, DynamodbException, MockValidationException
from moto.dynamodb.responses import DynamoHandler
from moto.dynamodbstreams.responses import DynamoDBStreamsHandler

_DYNAMODB = threading.Lock()
_call_action = DynamoHandler.call_action


def _one_at_a_time(self):
    with _DYNAMODB:
        answer = _call_action(self)
    # Outside the lock: the emulator goes on serving others while this answer is late.
    if getattr(self, "_late_answer", False):
        time.sleep(LATE_ANSWER_SECONDS)
    return answer


DynamoHandler.call_action = _one_at_a_time
_call_streams_action = DynamoDBStreamsHandler.call_action


def _streams_one_at_a_time(self):
    with _DYNAMODB:
        return _call_streams_action(self)


DynamoDBStreamsHandler.call_action = _streams_one_at_a_time

_transact_write_items = DynamoDBBackend.transact_write_items


def _transact_keeping_streams(self, transact_items):
    shards = {}
    for item in transact_items:
        _, action = next(iter(item.items()))
        name = action.get("TableName")
        table = self.tables.get(name) if name else None
        if table is not None and table.stream_shard is not None:
            shards[name] = (table.stream_shard, len(table.stream_shard.items))
    try:
        return _transact_write_items(self, transact_items)
    except Exception:
        for name, (shard, records) in shards.items():
            del shard.items[records:]
            restored = self.tables.get(name)
            if restored is not None and restored.stream_shard is not shard:
                restored.stream_shard = shard
                shard.table = restored
        raise


DynamoDBBackend.transact_write_items = _transact_keeping_streams

_BETWEEN = re.compile(r"BETWEEN\s+(:\w+)\s+AND\s+(:\w+)", re.IGNORECASE)
_query = DynamoHandler.query


def _bound(value):
    if "N" in value:
        return Decimal(value["N"])
    if "S" in value:
        return value["S"]
    return None


def _query_refusing_reversed_between(self):
    values = self.body.get("ExpressionAttributeValues", {})
    for low, high in _BETWEEN.findall(self.body.get("KeyConditionExpression") or ""):
        low_value, high_value = values.get(low, {}), values.get(high, {})
        lower, upper = _bound(low_value), _bound(high_value)
        if lower is not None and type(lower) is type(upper) and lower > upper:
            raise MockValidationException(
                "Invalid KeyConditionExpression: The BETWEEN operator requires upper bound to be "
                f"greater than or equal to lower bound; lower bound operand: AttributeValue: "
                f"{low_value}, upper bound operand: AttributeValue: {high_value}"
            )
    return _query(self)


DynamoHandler.query = _query_refusing_reversed_between

_KEY_BETWEEN = re.compile(r"(#?\w+)\s+BETWEEN\s+(:\w+)\s+AND\s+(:\w+)", re.IGNORECASE)
_KEY_COMPARE = re.compile(r"(#?\w+)\s*(<=|>=|=|<|>)\s*(:\w+)")
_KEY_PREFIX = re.compile(r"begins_with\s*\(\s*(#?\w+)\s*,\s*(:\w+)\s*\)", re.IGNORECASE)
_COMPARE = {
    "=": lambda a, b: a == b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _start_key_conditions(body):
    """(attribute, test) for each condition of the key condition expression."""
    names = body.get("ExpressionAttributeNames", {})
    values = body.get("ExpressionAttributeValues", {})
    condition = body.get("KeyConditionExpression") or ""

    def name(token):
        return names.get(token, token)

    def bound(token):
        return _bound(values.get(token, {}))

    for attribute, low, high in _KEY_BETWEEN.findall(condition):
        lower, upper = bound(low), bound(high)
        yield name(attribute), lambda v, lower=lower, upper=upper: lower <= v <= upper
    for attribute, prefix in _KEY_PREFIX.findall(condition):
        start = bound(prefix)
        yield name(attribute), lambda v, start=start: v.startswith(start)
    rest = _KEY_PREFIX.sub(" ", _KEY_BETWEEN.sub(" ", condition))
    for attribute, operator, operand in _KEY_COMPARE.findall(rest):
        operand_value = bound(operand)
        yield name(attribute), lambda v, op=_COMPARE[operator], b=operand_value: op(v, b)


def _query_refusing_a_start_key_outside(self):
    start = self.body.get("ExclusiveStartKey")
    if start:
        for attribute, holds in _start_key_conditions(self.body):
            value = _bound(start.get(attribute, {}))
            if value is None:
                continue
            try:
                inside = holds(value)
            except Exception:  # a bound of another type, or one not modelled: not judged here
                continue
            if not inside:
                raise MockValidationException(
                    "The provided starting key is outside query boundaries based on provided "
                    f"condition ({attribute}: {start.get(attribute)})"
                )
    return _query_refusing_reversed_between(self)


DynamoHandler.query = _query_refusing_a_start_key_outside

IDEMPOTENCY_WINDOW_SECONDS = 600
LATE_ANSWER_SECONDS = 2.0
_completed = {}  # token -> (when it completed, its request without the token, its answer)
_transact_items_handler = DynamoHandler.transact_write_items


class IdempotentParameterMismatch(DynamodbException):
    error_type = ERROR_TYPE_PREFIX + "IdempotentParameterMismatchException"

    def __init__(self):
        super().__init__(
            self.error_type,
            message="The request uses the same client token as a previous, but non-identical "
            "request. Do not reuse a client token with different requests, unless the requests "
            "are identical.",
        )


def _transact_once_per_token(self):
    """Called under the DynamoDB lock."""
    token = self.body.get("ClientRequestToken")
    if not token:
        return _transact_items_handler(self)
    request = {name: value for name, value in self.body.items() if name != "ClientRequestToken"}
    now = time.monotonic()
    # Tokens are kept in the order they completed: the expired ones are at the front.
    while _completed:
        oldest = next(iter(_completed))
        if now - _completed[oldest][0] < IDEMPOTENCY_WINDOW_SECONDS:
            break
        del _completed[oldest]
    if token in _completed:
        _, first, answer = _completed[token]
        if first != request:
            raise IdempotentParameterMismatch()
        return answer
    answer = _transact_items_handler(self)
    _completed[token] = (now, request, answer)
    return answer


_answered_late = set()


def _late_first_answer(write, tables_of):
    """Holds back the answer to a `late…` table's write the first time its request is seen."""

    def late(self):
        if any(table.startswith("late") for table in tables_of(self.body)):
            request = json.dumps(self.body, sort_keys=True, default=str)
            if request not in _answered_late:
                _answered_late.add(request)
                self._late_answer = True
        return write(self)

    return late


DynamoHandler.transact_write_items = _late_first_answer(
    _transact_once_per_token,
    lambda body: [next(iter(item.values())).get("TableName") or "" for item in body["TransactItems"]],
)

THROTTLED_WRITES_PER_SECOND = 20
_THROTTLED_TABLE = re.compile(r"^throttled.*-delivery-log$")
_SATURATED_TABLE = re.compile(r"^(saturated.*-attempts|jammed.*-delivery-log)$")
_writes = {}


class ProvisionedThroughputExceeded(DynamodbException):
    error_type = ERROR_TYPE_PREFIX + "ProvisionedThroughputExceededException"

    def __init__(self, table):
        super().__init__(
            self.error_type,
            message="The level of configured provisioned throughput for the table was exceeded. "
            f"Consider increasing your provisioning level with the UpdateTable API ({table})",
        )


def _within_capacity(handler):
    """Called under the DynamoDB lock: counts the write, or refuses it past the capacity."""
    table = handler.body.get("TableName") or ""
    if _SATURATED_TABLE.match(table):
        raise ProvisionedThroughputExceeded(table)
    if not _THROTTLED_TABLE.match(table):
        return
    now = time.monotonic()
    recent = _writes.setdefault(table, deque())
    while recent and now - recent[0] >= 1.0:
        recent.popleft()
    if len(recent) >= THROTTLED_WRITES_PER_SECOND:
        raise ProvisionedThroughputExceeded(table)
    recent.append(now)


def _capacity_checked(write):
    def checked(self):
        _within_capacity(self)
        return write(self)

    return checked


for _write in ("put_item", "update_item", "delete_item"):
    setattr(DynamoHandler, _write, _capacity_checked(getattr(DynamoHandler, _write)))
for _write in ("put_item", "update_item"):
    setattr(
        DynamoHandler,
        _write,
        _late_first_answer(getattr(DynamoHandler, _write), lambda body: [body.get("TableName") or ""]),
    )

if __name__ == "__main__":
    server.main(sys.argv[1:])
