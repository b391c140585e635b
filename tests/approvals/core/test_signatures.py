"""The audit chain's HMAC links and the Ed25519 signatures of its checkpoints."""

from __future__ import annotations

import ast
import base64
import hashlib
import hmac
from pathlib import Path

import pytest

from approvals.core import signatures

ROOT = Path(__file__).resolve().parents[3]
K1 = b"1" * 32
K2 = b"2" * 32
SIGNING = b"s" * 32
OTHER_SIGNING = b"o" * 32
MESSAGE = b'0000\n{"seq":1}'


@pytest.fixture(autouse=True)
def _keys(settings):
    settings.APPROVALS_AUDIT_KEYS = [("a2", K2), ("a1", K1)]
    settings.APPROVALS_AUDIT_SIGNING_KEY = SIGNING


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
