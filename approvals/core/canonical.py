"""Canonical JSON and SHA-256 digests of tool arguments.

The digest is taken when a ticket is created and again in the worker before the call runs, so
both sides must canonicalise exactly alike: this module is the only place that does.
"""

from __future__ import annotations

import hashlib
import json
import re
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


class NestedTooDeeplyError(ValueError):
    """JSON with more levels of lists and objects than the caller allows."""


def nesting_depth(value: Any, *, stop_after: int) -> int:
    """Levels of lists and objects in value (a scalar is 0, [] is 1, [[]] is 2), counted
    without recursion; counting stops once it passes stop_after, so a value nested without
    bound (or one that contains itself) costs no more than stop_after levels."""
    deepest = 0
    seen: dict[int, int] = {}
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            children = current.values()
        elif isinstance(current, list | tuple):
            children = current
        else:
            continue
        if seen.get(id(current), 0) >= depth:
            continue
        seen[id(current)] = depth
        deepest = max(deepest, depth)
        if deepest > stop_after:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


# A JSON string (skipped whole, so brackets inside it do not count) or one bracket.
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def loads_within(text: str, *, max_depth: int) -> Any:
    """json.loads of text, refusing more than max_depth levels of lists and objects before
    parsing (the parser recurses once per level). Raises NestedTooDeeplyError or ValueError."""
    depth = 0
    for token in _STRING_OR_BRACKET.finditer(text):
        mark = token.group()
        if mark in "[{":
            depth += 1
            if depth > max_depth:
                raise NestedTooDeeplyError(f"more than {max_depth} levels of lists and objects")
        elif mark in "]}":
            depth -= 1
    return json.loads(text)


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


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_unique(text: str | bytes) -> Any:
    """json.loads that refuses what parsers read differently: a repeated key (ValueError naming
    it) and NaN or Infinity (which JSON does not have)."""
    try:
        return json.loads(
            text, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant
        )
    except _DuplicateKey as error:
        raise ValueError(f"the key {str(error)!r} appears twice in one object") from None


def canonical_arguments(raw: str | None) -> str:
    return canonical_json(parse_arguments(raw))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def arguments_digest(raw: str | None) -> str:
    return sha256_hex(canonical_arguments(raw))
