"""Hostile users: helpers shared by the security tests.

`routes()` walks the URL resolver so that a new URL is swept without anyone listing it, and
`fill()` turns a route's kwargs into values from a table keyed by kwarg name; a kwarg the table
does not know is reported, never skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from typing import Any
from urllib.parse import quote

from django.urls import URLPattern, URLResolver, get_resolver

# Routes the sweeps leave alone: Django's own admin and static files, and the HTTP API, which
# takes a bearer token and no cookie (so no CSRF) and whose tenant scoping, scopes and 401/404
# answers are swept per operation in tests/api.
SKIPPED_PREFIXES = ("admin/", "static/", "api/")
_CONVERTER = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>\w+)>")


@dataclass(frozen=True)
class Route:
    route: str
    name: str
    callback: Callable
    kwargs: tuple[str, ...]
    is_regex: bool

    def __str__(self) -> str:
        return f"/{self.route} ({self.name or 'unnamed'})"


def routes(resolver: URLResolver | None = None) -> list[Route]:
    """Every URL pattern of the project, with its full route and kwarg names."""
    found: list[Route] = []
    _walk(resolver or get_resolver(), "", "", False, found)
    return [r for r in found if not r.route.startswith(SKIPPED_PREFIXES)]


def _walk(resolver: URLResolver, prefix: str, namespace: str, regex: bool, found: list) -> None:
    for entry in resolver.url_patterns:
        piece = str(entry.pattern)
        is_regex = regex or not hasattr(entry.pattern, "converters")
        if isinstance(entry, URLResolver):
            if (prefix + piece).startswith(SKIPPED_PREFIXES):
                continue
            inner = ":".join(n for n in (namespace, entry.namespace or "") if n)
            _walk(entry, prefix + piece, inner, is_regex, found)
        elif isinstance(entry, URLPattern):
            route = prefix + piece
            names = tuple(m["name"] for m in _CONVERTER.finditer(route))
            if is_regex:
                names = tuple(re.compile(route).groupindex)
            full_name = ":".join(n for n in (namespace, entry.name or "") if n)
            found.append(Route(route, full_name, entry.callback, names, is_regex))


@dataclass(frozen=True)
class Kwarg:
    """How to fill one kwarg: `values(side, route)` gives the candidates (None: cannot fill),
    `scoped` says whether the kwarg names an object of one tenant."""

    values: Callable[[Any, Route], list[str] | None]
    scoped: bool


def by_first_segment(**getters: Callable[[Any], object]) -> Callable[[Any, Route], list | None]:
    """A kwarg whose meaning depends on the route, e.g. pk under tickets/ or under runs/."""

    def values(side: Any, route: Route) -> list[str] | None:
        segment = route.route.split("/", 1)[0]
        getter = getters.get(segment)
        return None if getter is None else [str(getter(side))]

    return values


def constant(*values: str) -> Callable[[Any, Route], list[str]]:
    return lambda side, route: list(values)


def from_side(attribute: str) -> Callable[[Any, Route], list[str]]:
    def values(side: Any, route: Route) -> list[str]:
        value = getattr(side, attribute)
        return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]

    return values


class UnfillableRoute(Exception):
    pass


def fill(route: Route, table: dict[str, Kwarg], side: Any) -> list[str]:
    """Every URL of the route with its kwargs taken from the table for one tenant's objects."""
    if route.is_regex:
        raise UnfillableRoute(
            f"{route} is a regex route; the security sweeps only fill path() routes. "
            "Use path() with converters, or teach tests/security how to fill it."
        )
    choices: list[list[str]] = []
    for name in route.kwargs:
        kwarg = table.get(name)
        candidates = kwarg.values(side, route) if kwarg else None
        if not candidates:
            raise UnfillableRoute(
                f"{route} takes the kwarg {name!r}, which the security sweep cannot fill. Add "
                f"{name!r} to KWARGS in tests/security/test_url_sweep.py (for this route's first "
                "segment, if the kwarg means different objects on different routes), giving "
                "the object of another tenant that the route must refuse with 404."
            )
        choices.append(candidates)
    urls = []
    for combination in product(*choices):
        values = {k: quote(v, safe="/") for k, v in zip(route.kwargs, combination, strict=True)}
        urls.append("/" + _CONVERTER.sub(lambda m, values=values: values[m["name"]], route.route))
    return urls


def is_scoped(route: Route, table: dict[str, Kwarg]) -> bool:
    return any(table[name].scoped for name in route.kwargs if name in table)
