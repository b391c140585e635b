"""Webhook signatures in the Standard Webhooks format, made with the `standardwebhooks` library.

Headers: `webhook-id` (the message's id, the same on every retry: receivers deduplicate on it),
`webhook-timestamp` (unix seconds) and `webhook-signature` (`v1,<base64>`: HMAC-SHA256 of
"<id>.<timestamp>.<body>" under the secret's key). The secret is `whsec_<base64>` of 32 random
bytes, so a receiver in any language verifies with an off-the-shelf library and refuses a
timestamp more than five minutes away (a replayed request).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from datetime import UTC, datetime

from standardwebhooks import Webhook

SECRET_PREFIX = "whsec_"
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
_URLSAFE_TO_STANDARD = str.maketrans("-_", "+/")


def new_secret() -> str:
    """A new endpoint's signing secret: whsec_ and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def standard_secret(secret: str) -> str:
    """The secret in the standard form (whsec_ + standard base64).

    Endpoints created before the console signed the standard way kept secrets written in
    base64's URL-safe alphabet (- and _ for + and /). The key is the same bytes either way, so
    such a secret keeps working: it is read in either alphabet and written in the standard one.
    Raises ValueError when the secret is not base64 at all.
    """
    body = secret.removeprefix(SECRET_PREFIX).strip()
    try:
        key = base64.b64decode(
            body.translate(_URLSAFE_TO_STANDARD) + "=" * (-len(body) % 4), validate=True
        )
    except binascii.Error as error:
        raise ValueError(f"the webhook secret is not base64: {error}") from None
    if not key:
        raise ValueError("the webhook secret is empty")
    return SECRET_PREFIX + base64.b64encode(key).decode()


def headers(
    secret: str, body: bytes, *, message_id: str, timestamp: datetime | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers for one attempt of a message."""
    sent = (timestamp or datetime.now(UTC)).astimezone(UTC)
    signature = Webhook(standard_secret(secret)).sign(message_id, sent, body.decode())
    return {
        ID_HEADER: message_id,
        TIMESTAMP_HEADER: str(int(sent.timestamp())),
        SIGNATURE_HEADER: signature,
    }
