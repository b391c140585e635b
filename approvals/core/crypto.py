"""Encryption at rest: AES-256-GCM with associated data and key ids for rotation.

With signatures.py (the audit chain's links and checkpoint signatures), the only module that
imports `cryptography`. A sealed blob is (key id, nonce, ciphertext);
the associated data names what the blob belongs to, so a blob moved to another row or tenant
fails to open.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

NONCE_BYTES = 12
# A decompression bomb inside a forged-but-authentic blob is impossible (GCM authenticates
# first); this bound only protects us from our own bugs.
MAX_PLAINTEXT_BYTES = 64 * 1024 * 1024
# zlib's fastest level: a state's JSON repeats itself so much that level 1 already shrinks it to
# about 5 % at 100 turns (level 6, zlib's default, to 4.9 %), at a third of the time (0.4 ms
# against 1.26 ms for 278 KB), which every pause pays. Any level opens the same way.
COMPRESSION_LEVEL = 1


class CryptoError(Exception):
    """A sealed blob could not be opened; nothing in it may be used."""


class UnknownKeyError(CryptoError):
    pass


class TamperedError(CryptoError):
    pass


@dataclass(frozen=True)
class Sealed:
    key_id: str
    nonce: bytes
    ciphertext: bytes


def _keyring() -> dict[str, bytes]:
    return dict(settings.APPROVALS_ENCRYPTION_KEYS)


def primary_key_id() -> str:
    return settings.APPROVALS_ENCRYPTION_KEYS[0][0]


def associated_data(*, purpose: str, key_id: str, **binding: object) -> bytes:
    parts = [purpose, f"key={key_id}"] + [f"{k}={binding[k]}" for k in sorted(binding)]
    return "|".join(parts).encode()


def seal(plaintext: bytes, *, purpose: str, **binding: object) -> Sealed:
    """Compress then encrypt under the primary key, bound to purpose and binding."""
    key_id = primary_key_id()
    key = _keyring()[key_id]
    nonce = os.urandom(NONCE_BYTES)
    aad = associated_data(purpose=purpose, key_id=key_id, **binding)
    ciphertext = AESGCM(key).encrypt(nonce, zlib.compress(plaintext, COMPRESSION_LEVEL), aad)
    return Sealed(key_id=key_id, nonce=nonce, ciphertext=ciphertext)


def open_sealed(sealed: Sealed, *, purpose: str, **binding: object) -> bytes:
    key = _keyring().get(sealed.key_id)
    if key is None:
        raise UnknownKeyError(f"key {sealed.key_id!r} is not in the key ring")
    aad = associated_data(purpose=purpose, key_id=sealed.key_id, **binding)
    try:
        compressed = AESGCM(key).decrypt(bytes(sealed.nonce), bytes(sealed.ciphertext), aad)
    except (InvalidTag, ValueError):
        raise TamperedError("the stored state failed its integrity check") from None
    decompressor = zlib.decompressobj()
    plaintext = decompressor.decompress(compressed, MAX_PLAINTEXT_BYTES)
    if decompressor.unconsumed_tail:
        raise TamperedError("the stored state is larger than allowed")
    return plaintext
