"""The audit chain's HMAC links and the Ed25519 signatures of its checkpoints."""

from __future__ import annotations

import ast
import base64
import hashlib
import hmac
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from approvals.core import signatures

ROOT = Path(__file__).resolve().parents[3]
K1 = b"1" * 32
K2 = b"2" * 32
SIGNING = b"s" * 32
OTHER_SIGNING = b"o" * 32
MESSAGE = b'0000\n{"seq":1}'


DECISION_1 = b"d" * 32
DECISION_2 = b"e" * 32
PAYLOAD = {
    "v": 1,
    "tenant": "acme",
    "run": 42,
    "generation": 1,
    "ticket": 17,
    "call_id": "call_1",
    "tool_name": "deploy_release",
    "arguments_digest": "0" * 64,
    "decision": "approve",
    "message": "",
    "approvers": ["alice", "bob"],
    "decided_at": "2026-12-01T10:00:00Z",
}


@pytest.fixture(autouse=True)
def _keys(settings):
    settings.APPROVALS_AUDIT_KEYS = [("a2", K2), ("a1", K1)]
    settings.APPROVALS_AUDIT_SIGNING_KEY = SIGNING
    settings.APPROVALS_DECISION_SIGNING_KEYS = [("d1", DECISION_1)]


# --- links --------------------------------------------------------------------------------------


def test_audit_key_id_is_the_first_of_the_ring():
    assert signatures.audit_key_id() == "a2"


def test_link_is_hmac_sha256_under_the_named_key():
    assert signatures.link("a1", MESSAGE) == hmac.new(K1, MESSAGE, "sha256").hexdigest()
    assert signatures.link("a2", MESSAGE) == hmac.new(K2, MESSAGE, "sha256").hexdigest()


def test_link_with_a_key_missing_from_the_ring_is_refused():
    with pytest.raises(signatures.UnknownAuditKeyError) as excinfo:
        signatures.link("a0", MESSAGE)

    assert str(excinfo.value) == "key 'a0' is not in APPROVALS_AUDIT_KEYS"


def test_plain_link_is_sha256():
    assert signatures.plain_link(MESSAGE) == hashlib.sha256(MESSAGE).hexdigest()


# --- signatures ---------------------------------------------------------------------------------


def test_sign_then_verify_with_the_public_key():
    signature = signatures.sign(MESSAGE)

    signatures.verify(signatures.public_key(), signature, MESSAGE)
    assert len(base64.b64decode(signatures.public_key())) == 32


def test_verify_another_message_is_refused():
    signature = signatures.sign(MESSAGE)

    with pytest.raises(signatures.BadSignatureError) as excinfo:
        signatures.verify(signatures.public_key(), signature, MESSAGE + b" ")

    assert str(excinfo.value) == "the signature does not verify"


def test_verify_with_another_keys_public_key_is_refused(settings):
    signature = signatures.sign(MESSAGE)
    settings.APPROVALS_AUDIT_SIGNING_KEY = OTHER_SIGNING
    other_public = signatures.public_key()

    with pytest.raises(signatures.BadSignatureError):
        signatures.verify(other_public, signature, MESSAGE)


@pytest.mark.parametrize(
    ("public", "signature", "message"),
    [
        ("not base64!", "AAAA", "the public key is not base64"),
        (base64.b64encode(b"k" * 16).decode(), "AAAA", "the public key is not a raw Ed25519"),
        (None, "not base64!", "the signature is not base64"),
        (None, base64.b64encode(b"x" * 64).decode(), "the signature does not verify"),
    ],
    ids=["public-key-not-base64", "public-key-short", "signature-not-base64", "signature-wrong"],
)
def test_verify_malformed_input_is_a_bad_signature(public, signature, message):
    with pytest.raises(signatures.BadSignatureError) as excinfo:
        signatures.verify(public or signatures.public_key(), signature, MESSAGE)

    assert str(excinfo.value).startswith(message)


# --- decision signatures ------------------------------------------------------------------------


def _unpadded_urlsafe(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_sign_decision_is_ed25519_over_the_canonical_json_with_the_first_key():
    signed = signatures.sign_decision(PAYLOAD)

    assert (signed["payload"], signed["key_id"]) == (PAYLOAD, "d1")
    assert "=" not in signed["signature"]
    # Checked with the library directly, over the bytes API.md tells callers to rebuild.
    message = json.dumps(PAYLOAD, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )
    public = Ed25519PrivateKey.from_private_bytes(DECISION_1).public_key()
    public.verify(base64.urlsafe_b64decode(signed["signature"] + "=="), message)


def test_decision_public_keys_publish_every_key_of_the_ring_first_current(settings):
    settings.APPROVALS_DECISION_SIGNING_KEYS = [("d2", DECISION_2), ("d1", DECISION_1)]

    keys = signatures.decision_public_keys()

    raw = [
        Ed25519PrivateKey.from_private_bytes(k)
        .public_key()
        .public_bytes(Encoding.Raw, PublicFormat.Raw)
        for k in (DECISION_2, DECISION_1)
    ]
    assert keys == [
        {
            "id": "d2",
            "algorithm": "Ed25519",
            "public_key": _unpadded_urlsafe(raw[0]),
            "current": True,
        },
        {
            "id": "d1",
            "algorithm": "Ed25519",
            "public_key": _unpadded_urlsafe(raw[1]),
            "current": False,
        },
    ]


def test_verify_decision_returns_the_payload_it_checked():
    signed = signatures.sign_decision(PAYLOAD)

    assert signatures.verify_decision(signed, signatures.decision_public_keys()) == PAYLOAD


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("decision", "reject"),
        ("arguments_digest", "1" * 64),
        ("approvers", ["alice"]),
        ("run", 43),
        ("generation", 2),
        ("message", " "),
        ("tenant", "globex"),
    ],
)
def test_verify_decision_refuses_any_change_of_the_payload(field, value):
    signed = signatures.sign_decision(PAYLOAD)
    signed["payload"] = {**PAYLOAD, field: value}

    with pytest.raises(signatures.BadSignatureError) as excinfo:
        signatures.verify_decision(signed, signatures.decision_public_keys())

    assert str(excinfo.value) == "the signature does not verify"


def test_decision_key_rotation_a_new_key_signs_and_the_old_ones_signatures_still_verify(settings):
    before = signatures.sign_decision(PAYLOAD)
    settings.APPROVALS_DECISION_SIGNING_KEYS = [("d2", DECISION_2), ("d1", DECISION_1)]

    after = signatures.sign_decision(PAYLOAD)
    published = signatures.decision_public_keys()

    assert (before["key_id"], after["key_id"]) == ("d1", "d2")
    assert signatures.verify_decision(before, published) == PAYLOAD
    assert signatures.verify_decision(after, published) == PAYLOAD
    # Once d1 leaves the ring, what it signed no longer verifies against what is published.
    settings.APPROVALS_DECISION_SIGNING_KEYS = [("d2", DECISION_2)]
    with pytest.raises(signatures.BadSignatureError) as excinfo:
        signatures.verify_decision(before, signatures.decision_public_keys())
    assert str(excinfo.value) == "the decision names key 'd1', not published"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key_id": "d9"}, "the decision names key 'd9', not published"),
        ({"signature": "not base64!"}, "the signature is not URL-safe base64"),
        ({"signature": _unpadded_urlsafe(b"x" * 64)}, "the signature does not verify"),
        ({"payload": "text"}, "the signed decision has no payload object"),
    ],
    ids=["unknown-key", "signature-not-base64", "signature-wrong", "payload-not-object"],
)
def test_verify_decision_malformed_input_is_a_bad_signature(change, message):
    signed = {**signatures.sign_decision(PAYLOAD), **change}

    with pytest.raises(signatures.BadSignatureError) as excinfo:
        signatures.verify_decision(signed, signatures.decision_public_keys())

    assert str(excinfo.value) == message


# --- the rule: two modules hold the cryptography ------------------------------------------------


def test_only_crypto_and_signatures_import_cryptography():
    importers = set()
    for app in ("approvals", "notifications", "sessions_admin", "config", "devtools"):
        for path in sorted((ROOT / app).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                if any(name.split(".")[0] == "cryptography" for name in names):
                    importers.add(str(path.relative_to(ROOT)))

    assert importers == {"approvals/core/crypto.py", "approvals/core/signatures.py"}
