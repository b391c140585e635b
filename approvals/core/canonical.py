"""Canonical JSON and SHA-256 digests of tool arguments.

The digest is taken when a ticket is created and again in the worker before the call runs, so
both sides must canonicalise exactly alike: this module is the only place that does.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


# The key under which arguments that are not one JSON object with unique keys are kept verbatim.
UNPARSED = "__unparsed__"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_arguments(raw: str | None) -> Any:
    """The model's argument string as a value.

    Text that is not JSON, or JSON with a repeated key (which parsers resolve differently, so
    what is shown could differ from what runs), is kept verbatim under "__unparsed__".
    """
    if raw is None or raw == "":
        return {}
    try:
        return json.loads(raw, object_pairs_hook=_refuse_duplicates)
    except (ValueError, RecursionError):
        # RecursionError: nested deeper than the parser goes; kept as text, never run as parsed.
        return {UNPARSED: raw}


def canonical_arguments(raw: str | None) -> str:
    return canonical_json(parse_arguments(raw))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def arguments_digest(raw: str | None) -> str:
    return sha256_hex(canonical_arguments(raw))
