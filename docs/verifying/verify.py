"""Verify a Hooklane webhook (Standard Webhooks signatures), Python standard library only."""
import base64
import hashlib
import hmac
import time

TOLERANCE_SECONDS = 5 * 60


class InvalidWebhook(Exception):
    pass


def verify_webhook(body: bytes, msg_id: str, timestamp: str, signature: str, secrets: list[str]) -> None:
    """Returns if one of `secrets` signed exactly these raw `body` bytes; raises InvalidWebhook otherwise."""
    if not msg_id or not timestamp or not signature:
        raise InvalidWebhook("missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        sent_at = int(timestamp)
    except ValueError:
        raise InvalidWebhook("webhook-timestamp is not a number") from None
    if abs(time.time() - sent_at) > TOLERANCE_SECONDS:
        raise InvalidWebhook("webhook-timestamp is more than 5 minutes away from now (replayed?)")

    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = [
        hmac.new(base64.b64decode(secret.removeprefix("whsec_")), signed, hashlib.sha256).digest()
        for secret in secrets  # two secrets during a rotation: the old one and the new one
    ]
    for entry in signature.split():  # "v1,<base64> v1,<base64>": one per secret during a rotation
        version, _, encoded = entry.partition(",")
        if version != "v1":
            continue
        try:
            received = base64.b64decode(encoded, validate=True)
        except ValueError:
            continue
        if any(hmac.compare_digest(mac, received) for mac in expected):
            return
    raise InvalidWebhook("no signature matches: wrong secret, or the body is not the raw bytes received")


if __name__ == "__main__":
    # python3 verify.py BODY_FILE WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE SECRET [SECRET...]
    import sys

    body_file, msg_id, timestamp, signature, *secrets = sys.argv[1:]
    with open(body_file, "rb") as f:
        raw_body = f.read()
    try:
        verify_webhook(raw_body, msg_id, timestamp, signature, secrets)
    except InvalidWebhook as error:
        print(f"invalid: {error}")
        sys.exit(1)
    print("valid")
