"""Webhook signatures: HMAC-SHA256 over "<timestamp>.<body>", the scheme Stripe uses.

Headers: X-Approvals-Timestamp: <unix seconds>, X-Approvals-Signature: v1=<hex>. A receiver
recomputes the HMAC with its copy of the secret, compares in constant time, and refuses a
timestamp older than its tolerance so that a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import time

TIMESTAMP_HEADER = "X-Approvals-Timestamp"
SIGNATURE_HEADER = "X-Approvals-Signature"
TOLERANCE_SECONDS = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    message = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def headers(secret: str, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: f"v1={signature(secret, timestamp, body)}",
    }


class BadSignature(Exception):
    pass


def verify(
    secret: str,
    body: bytes,
    timestamp_header: str | None,
    signature_header: str | None,
    *,
    now: float | None = None,
    tolerance: int = TOLERANCE_SECONDS,
) -> None:
    """What a receiver does; raises BadSignature with the reason. Used by webhook_receiver."""
    try:
        timestamp = int(timestamp_header or "")
    except ValueError:
        raise BadSignature("missing or malformed timestamp") from None
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance:
        raise BadSignature("timestamp outside the tolerance (replayed or clock skew)")
    expected = signature(secret, timestamp, body)
    # The header may carry several v1= values while a secret is being rotated.
    candidates = [
        part.strip()[3:]
        for part in (signature_header or "").split(",")
        if part.strip()[:3] == "v1="
    ]
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise BadSignature("signature does not match")
