"""Recognise secrets by key name or value shape, so they never reach storage or the audit log."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

_SECRET_WORDS = frozenset(
    {
        "token",
        "password",
        "passwd",
        "passphrase",
        "secret",
        "apikey",
        "authorization",
        "credential",
        "cookie",
        "bearer",
        "pwd",
    }
)
_SECRET_PAIRS = frozenset(
    {
        ("api", "key"),
        ("private", "key"),
        ("access", "key"),
        ("secret", "key"),
        ("session", "key"),
        ("signing", "key"),
        ("client", "secret"),
        ("auth", "header"),
    }
)
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

_VALUE_SHAPES = [
    ("OpenAI-style key", re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("Stripe key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    (
        "JSON web token",
        re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ),
    ("bearer credential", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{16,}")),
    ("password in a URL", re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
]
_PRIVATE_KEY_BLOCK = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL
)


# Names that describe a secret rather than hold one (token_count, password_policy, max_tokens).
_DESCRIBING_WORDS = frozenset(
    {
        "count",
        "usage",
        "limit",
        "max",
        "min",
        "total",
        "budget",
        "len",
        "length",
        "num",
        "type",
        "kind",
        "ttl",
        "expiry",
        "expires",
        "expiration",
        "policy",
        "hint",
        "input",
        "output",
        "reasoning",
        "cached",
        # An API token's prefix names the token in lists and the audit log; it is no secret.
        "prefix",
    }
)


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def is_secret_key(name: str) -> bool:
    words = [_singular(w.lower()) for w in _SPLIT.split(name) if w]
    if any(word in _DESCRIBING_WORDS for word in words):
        return False
    if any(word in _SECRET_WORDS for word in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False))


def secret_shape(value: str) -> str | None:
    """The kind of secret the string looks like, or None."""
    for label, pattern in _VALUE_SHAPES:
        if pattern.search(value):
            return label
    return None


def mask_secrets(text: str) -> str:
    """Text with each secret-looking part replaced, the rest kept (for free text people write)."""
    # A pasted private key goes whole, not just its first line.
    text = _PRIVATE_KEY_BLOCK.sub("[redacted]", text)
    for _, pattern in _VALUE_SHAPES:
        text = pattern.sub("[redacted]", text)
    return text


def find_secrets(value: Any, path: str = "context") -> Iterator[str]:
    """Paths (never values) of everything in value that looks like a secret."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            child = f"{path}.{key}"
            if isinstance(key, str) and is_secret_key(key) and item not in (None, "", [], {}):
                yield f"{child} (key name)"
            else:
                yield from find_secrets(item, child)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from find_secrets(item, f"{path}[{index}]")
    elif isinstance(value, str):
        label = secret_shape(value)
        if label:
            yield f"{path} (looks like a {label})"


def redact(value: Any) -> Any:
    """A copy of value with secret-looking keys and values replaced."""
    if isinstance(value, Mapping):
        return {
            k: "[redacted]" if isinstance(k, str) and is_secret_key(k) else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str) and secret_shape(value):
        return "[redacted]"
    return value
