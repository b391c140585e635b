"""Keyset pagination: the next page starts after the last row seen, never at an OFFSET."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet


class BadCursor(ValueError):
    pass


def encode(values: list[Any]) -> str:
    raw = json.dumps([v.isoformat() if isinstance(v, datetime) else v for v in values])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode(cursor: str, kinds: tuple[type, ...]) -> list[Any]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        values = json.loads(raw)
        if not isinstance(values, list) or len(values) != len(kinds):
            raise ValueError
        return [
            _aware(v) if kind is datetime else kind(v)
            for v, kind in zip(values, kinds, strict=True)
        ]
    except (ValueError, TypeError, OverflowError):
        raise BadCursor(
            "that page link is broken or out of date; start again from the first page"
        ) from None


def _aware(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError("a cursor time must carry its timezone")
    # Raises OverflowError for times at the edges of the range, which no real row has.
    return value.astimezone(UTC)


@dataclass
class Page:
    rows: list
    next_cursor: str | None


def after_descending(
    queryset: QuerySet,
    fields: tuple[str, ...],
    cursor: str | None,
    kinds: tuple[type, ...],
    size: int,
) -> Page:
    """Rows ordered by fields descending, starting after cursor; one extra row tells if more exist."""
    if cursor:
        values = decode(cursor, kinds)
        # (a, b) < (x, y)  <=>  a < x  or  (a = x and b < y)
        condition = Q()
        for index in range(len(fields)):
            clause = Q(**{f"{fields[index]}__lt": values[index]})
            for prior in range(index):
                clause &= Q(**{fields[prior]: values[prior]})
            condition |= clause
        queryset = queryset.filter(condition)
    rows = list(queryset.order_by(*[f"-{f}" for f in fields])[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    next_cursor = encode([getattr(rows[-1], f) for f in fields]) if more and rows else None
    return Page(rows, next_cursor)
