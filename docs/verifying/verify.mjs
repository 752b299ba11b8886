// Verify a Hooklane webhook (Standard Webhooks signatures), Node.js built-ins only.
import { createHmac, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const TOLERANCE_SECONDS = 5 * 60;

// Returns if one of `secrets` signed exactly these raw `body` bytes (a Buffer); throws otherwise.
export function verifyWebhook(body, msgId, timestamp, signature, secrets) {
  if (!msgId || !timestamp || !signature) {
    throw new Error("missing webhook-id, webhook-timestamp or webhook-signature header");
  }
  if (!Buffer.isBuffer(body)) {
    throw new Error("pass the raw body as a Buffer, not a string or parsed JSON");
  }
  if (!/^[0-9]+$/.test(timestamp)) {
    throw new Error("webhook-timestamp is not a number");
  }
  if (Math.abs(Date.now() / 1000 - Number(timestamp)) > TOLERANCE_SECONDS) {
    throw new Error("webhook-timestamp is more than 5 minutes away from now (replayed?)");
  }

  const signed = Buffer.concat([Buffer.from(`${msgId}.${timestamp}.`), body]);
  // Two secrets during a rotation: the old one and the new one.
  const expected = secrets.map((secret) =>
    createHmac("sha256", Buffer.from(secret.replace(/^whsec_/, ""), "base64")).update(signed).digest(),
  );
  // "v1,<base64> v1,<base64>": one signature per secret during a rotation.
  for (const entry of signature.split(" ")) {
    const [version, encoded] = entry.split(",");
    if (version !== "v1" || !encoded) continue;
    const received = Buffer.from(encoded, "base64");
    if (expected.some((mac) => mac.length === received.length && timingSafeEqual(mac, received))) {
      return;
    }
  }
  throw new Error("no signature matches: wrong secret, or the body is not the raw bytes received");
}

// node verify.mjs BODY_FILE WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE SECRET [SECRET...]
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [bodyFile, msgId, timestamp, signature, ...secrets] = process.argv.slice(2);
  try {
    verifyWebhook(readFileSync(bodyFile), msgId, timestamp, signature, secrets);
  } catch (error) {
    console.log(`invalid: ${error.message}`);
    process.exit(1);
  }
  console.log("valid");
}
