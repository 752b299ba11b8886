"""moto_server with DynamoDB's atomicity.

DynamoDB applies each request to an item atomically: a conditional write's check and its
write cannot interleave with another request's. moto's threaded server lets them (a
condition is evaluated, another thread writes, then the first writes too), which shows up as
an endpoint's slot cap exceeded under load. One lock around every DynamoDB request restores
the guarantee the code relies on. Other services stay concurrent (SQS long polls).

Usage: python moto_server_atomic.py [moto_server options]
"""

import sys
import threading

from moto import server
from moto.dynamodb.responses import DynamoHandler

_DYNAMODB = threading.Lock()
_call_action = DynamoHandler.call_action


def _one_at_a_time(self):
    with _DYNAMODB:
        return _call_action(self)


DynamoHandler.call_action = _one_at_a_time

if __name__ == "__main__":
    server.main(sys.argv[1:])
