"""Proof of origin: the HMAC-SHA256 that links each event of the audit chain, the Ed25519
signatures of the chain's checkpoints, and the Ed25519 signatures of the decisions a caller
fetches for a run it resumes in its own process.

With crypto.py (encryption at rest), the only module that imports `cryptography`. The keys
come from the environment, never the database: APPROVALS_AUDIT_KEYS is a ring (the first links
new events, every one verifies: a retired key stays as long as the events it linked must
verify), APPROVALS_AUDIT_SIGNING_KEY the raw Ed25519 private key that signs checkpoints,
APPROVALS_DECISION_SIGNING_KEYS a ring of raw Ed25519 private keys (the first signs decisions,
every one is published so that a caller can verify across a rotation).
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

from approvals.core.canonical import canonical_json


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


def _private_key(raw: bytes | None = None) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(
        settings.APPROVALS_AUDIT_SIGNING_KEY if raw is None else raw
    )


def _public_bytes(private: Ed25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def public_key() -> str:
    """The base64 raw public key of APPROVALS_AUDIT_SIGNING_KEY."""
    return encode(_public_bytes(_private_key()))


def sign(message: bytes) -> str:
    """The base64 Ed25519 signature of message with APPROVALS_AUDIT_SIGNING_KEY."""
    return encode(_private_key().sign(message))


def verify(public: str, signature: str, message: bytes) -> None:
    """Check a base64 signature of message against a base64 raw public key.

    Raises BadSignatureError when the key or the signature is malformed or does not verify.
    """
    _verify_raw(decode(public, "public key"), decode(signature, "signature"), message)


def _verify_raw(key_bytes: bytes, signature: bytes, message: bytes) -> None:
    if len(key_bytes) != 32:
        raise BadSignatureError("the public key is not a raw Ed25519 key (32 bytes)")
    try:
        Ed25519PublicKey.from_public_bytes(key_bytes).verify(signature, message)
    except InvalidSignature:
        raise BadSignatureError("the signature does not verify") from None


# --- decision signatures ------------------------------------------------------------------------

DECISION_ALGORITHM = "Ed25519"


def encode_url(raw: bytes) -> str:
    """URL-safe base64 without padding: how decision signatures and their keys travel."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_url(text: str, what: str) -> bytes:
    """URL-safe base64 (padding optional) as bytes; raises BadSignatureError naming what."""
    try:
        if not isinstance(text, str) or not text.isascii():
            raise ValueError(what)
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise BadSignatureError(f"the {what} is not URL-safe base64") from None


def decision_message(payload: dict) -> bytes:
    """The bytes a decision signature covers: the canonical JSON of its payload, UTF-8."""
    return canonical_json(payload).encode()


def sign_decision(payload: dict) -> dict:
    """The payload signed with the first key of APPROVALS_DECISION_SIGNING_KEYS.

    Returns {"payload", "key_id", "signature"}: the signature is Ed25519 over
    decision_message(payload), in URL-safe base64 without padding.
    """
    key_id, raw = settings.APPROVALS_DECISION_SIGNING_KEYS[0]
    signature = _private_key(raw).sign(decision_message(payload))
    return {"payload": payload, "key_id": key_id, "signature": encode_url(signature)}


def decision_public_keys() -> list[dict]:
    """Every decision key's public half, as GET /api/v1/keys publishes them: {id, algorithm,
    public_key (URL-safe base64 of the raw 32 bytes), current (the key that signs now)}."""
    return [
        {
            "id": key_id,
            "algorithm": DECISION_ALGORITHM,
            "public_key": encode_url(_public_bytes(_private_key(raw))),
            "current": index == 0,
        }
        for index, (key_id, raw) in enumerate(settings.APPROVALS_DECISION_SIGNING_KEYS)
    ]


def verify_decision(signed: dict, public_keys: list[dict]) -> dict:
    """Check a signed decision against published keys, as a caller does; returns its payload.

    Raises BadSignatureError when the decision is not shaped as sign_decision() makes it, names
    a key that is not among public_keys, or its signature does not verify.
    """
    if not isinstance(signed, dict) or not isinstance(signed.get("payload"), dict):
        raise BadSignatureError("the signed decision has no payload object")
    key = next((k for k in public_keys if k.get("id") == signed.get("key_id")), None)
    if key is None:
        raise BadSignatureError(f"the decision names key {signed.get('key_id')!r}, not published")
    if key.get("algorithm") != DECISION_ALGORITHM:
        raise BadSignatureError(f"key {key.get('id')!r} is not an {DECISION_ALGORITHM} key")
    _verify_raw(
        decode_url(key.get("public_key"), "public key"),
        decode_url(signed.get("signature"), "signature"),
        decision_message(signed["payload"]),
    )
    return signed["payload"]
