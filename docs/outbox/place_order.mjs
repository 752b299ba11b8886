// Places an order and publishes its `order.placed` webhook in one DynamoDB transaction:
// the Hooklane transactional outbox from Node.js (AWS SDK for JavaScript v3). See docs/OUTBOX.md.

import { pathToFileURL } from "node:url";

import {
  DynamoDBClient,
  TransactWriteItemsCommand,
  TransactionCanceledException,
} from "@aws-sdk/client-dynamodb";

/** The Hooklane events-table item (contract version 1) for one event. */
export function outboxEvent(accountId, eventId, type, data) {
  return {
    account_id: { S: accountId },
    id: { S: eventId },
    type: { S: type },
    created_at: { N: String(Date.now()) }, // milliseconds
    data: { S: JSON.stringify(data) },
    unfanned_shard: { S: String(Math.floor(Math.random() * 4)) },
  };
}

/** Resolves to "placed", "already placed" (a retry of a committed call) or "refused". */
export async function placeOrder(client, ordersTable, eventsTable, accountId, orderId, total) {
  const event = outboxEvent(
    accountId,
    `${orderId}.placed`, // from the business key: a retry carries the same id
    "order.placed",
    { order: orderId, total },
  );
  try {
    await client.send(
      new TransactWriteItemsCommand({
        TransactItems: [
          {
            Put: {
              TableName: ordersTable,
              Item: { id: { S: orderId }, total: { N: String(total) } },
              ConditionExpression: "attribute_not_exists(id)",
            },
          },
          {
            Put: {
              TableName: eventsTable,
              Item: event,
              ConditionExpression: "attribute_not_exists(id)",
            },
          },
        ],
      }),
    );
    return "placed";
  } catch (error) {
    if (!(error instanceof TransactionCanceledException)) throw error;
    const codes = (error.CancellationReasons ?? []).map((reason) => reason.Code);
    const failed = codes.map((code) => code === "ConditionalCheckFailed");
    if (failed[0] && failed[1]) return "already placed"; // the order and its event exist: an earlier try committed
    if (failed[0]) return "refused"; // the order exists; nothing written
    throw error; // anything else (the event there without its order, a conflict): not done
  }
}

// node place_order.mjs ORDERS_TABLE EVENTS_TABLE ACCOUNT ORDER_ID TOTAL
if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [orders, events, account, order, total] = process.argv.slice(2);
  console.log(await placeOrder(new DynamoDBClient({}), orders, events, account, order, Number(total)));
}
