"""Proof of origin for the audit log: the HMAC-SHA256 that links each event of the chain, and
the Ed25519 signatures of the chain's checkpoints.

With crypto.py (encryption at rest), the only module that imports `cryptography`. The keys
come from the environment, never the database: APPROVALS_AUDIT_KEYS is a ring (the first links
new events, every one verifies: a retired key stays as long as the events it linked must
verify), APPROVALS_AUDIT_SIGNING_KEY the raw Ed25519 private key that signs checkpoints.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.conf import settings


class UnknownAuditKeyError(LookupError):
    """An event names a link key that is not in APPROVALS_AUDIT_KEYS."""


class BadSignatureError(ValueError):
    """A signature does not verify with the public key given, or is not one."""


# --- the chain's links --------------------------------------------------------------------------


def audit_key_id() -> str:
    """The id of the key that links new events: the first of APPROVALS_AUDIT_KEYS."""
    return settings.APPROVALS_AUDIT_KEYS[0][0]


def link(key_id: str, message: bytes) -> str:
    """HMAC-SHA256 of message under the audit key key_id, in hex.

    Raises UnknownAuditKeyError when the ring has no such key.
    """
    key = dict(settings.APPROVALS_AUDIT_KEYS).get(key_id)
    if key is None:
        raise UnknownAuditKeyError(f"key {key_id!r} is not in APPROVALS_AUDIT_KEYS")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def plain_link(message: bytes) -> str:
    """SHA-256 of message in hex: how events were linked before the chain had a key."""
    return hashlib.sha256(message).hexdigest()


# --- checkpoint signatures ----------------------------------------------------------------------


def encode(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def decode(text: str, what: str) -> bytes:
    """Base64 text as bytes; raises BadSignatureError naming what it should have been."""
    try:
        return base64.b64decode(text.encode(), validate=True)
    except (binascii.Error, ValueError, AttributeError):
        raise BadSignatureError(f"the {what} is not base64") from None


def _private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(settings.APPROVALS_AUDIT_SIGNING_KEY)


def public_key() -> str:
    """The base64 raw public key of APPROVALS_AUDIT_SIGNING_KEY."""
    raw = _private_key().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return encode(raw)


def sign(message: bytes) -> str:
    """The base64 Ed25519 signature of message with APPROVALS_AUDIT_SIGNING_KEY."""
    return encode(_private_key().sign(message))


def verify(public: str, signature: str, message: bytes) -> None:
    """Check a base64 signature of message against a base64 raw public key.

    Raises BadSignatureError when the key or the signature is malformed or does not verify.
    """
    key_bytes = decode(public, "public key")
    if len(key_bytes) != 32:
        raise BadSignatureError("the public key is not a raw Ed25519 key (32 bytes)")
    try:
        Ed25519PublicKey.from_public_bytes(key_bytes).verify(
            decode(signature, "signature"), message
        )
    except InvalidSignature:
        raise BadSignatureError("the signature does not verify") from None
