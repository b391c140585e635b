"""Search across the tickets and runs of a user's tenants: a number, a run's title, a tool, an
argument value.

One reading of what a person typed, used by the runs list, the decided tickets, "my decisions"
and the header's search box, so the same words find the same rows everywhere. Matching is
icontains (SQLite and PostgreSQL alike) on rows already narrowed to the user's tenants, and
every caller reads a bounded page of them, newest first, on the tenant indexes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Exists, OuterRef, Q, QuerySet

from approvals.models import Run, Ticket

# Longer text is cut: nobody types more to find a ticket, and the scan stays cheap.
MAX_TEXT = 100
RESULTS = 20

_NUMBER = re.compile(r"^#?\s*(\d{1,12})$")


@dataclass(frozen=True)
class Query:
    """What was typed, read once: a number ("#12" or "12"), free text, or both."""

    text: str
    number: int | None
    # "#12" asks for the number only; "12" may also be part of a title or an argument.
    number_only: bool

    def __bool__(self) -> bool:
        return bool(self.text)

    @property
    def in_arguments(self) -> str:
        """The text as it appears inside canonical JSON (quotes and backslashes escaped)."""
        return json.dumps(self.text, ensure_ascii=False)[1:-1]


def parse(text: str) -> Query:
    """Read what a person typed into a search box. Never raises: anything is a query."""
    text = " ".join((text or "").split())[:MAX_TEXT]
    found = _NUMBER.match(text)
    if found:
        return Query(text=found.group(1), number=int(found.group(1)), number_only=text[0] == "#")
    return Query(text=text, number=None, number_only=False)


def _ticket_text(query: Query) -> Q:
    return (
        Q(tool_name__icontains=query.text)
        | Q(arguments_json__icontains=query.in_arguments)
        | Q(run__title__icontains=query.text)
    )


def tickets_matching(tickets: QuerySet[Ticket], *, query: Query) -> QuerySet[Ticket]:
    """The tickets of this queryset that the query finds: the ticket of that number, or a tool
    name, run title or canonical argument text that contains the words. No query: all of them.

    Side effects: none (the queryset is only narrowed). Raises: nothing.
    """
    if not query:
        return tickets
    by_number = Q(pk=query.number) if query.number is not None else Q(pk__in=[])
    if query.number_only:
        return tickets.filter(by_number)
    return tickets.filter(by_number | _ticket_text(query))


def runs_matching(runs: QuerySet[Run], *, query: Query) -> QuerySet[Run]:
    """The runs of this queryset that the query finds: the run of that number, a title that
    contains the words, or a call of the run whose tool or arguments do. No query: all of them.

    Side effects: none (the queryset is only narrowed). Raises: nothing.
    """
    if not query:
        return runs
    by_number = Q(pk=query.number) if query.number is not None else Q(pk__in=[])
    if query.number_only:
        return runs.filter(by_number)
    calls = Ticket.objects.filter(run_id=OuterRef("pk")).filter(
        Q(tool_name__icontains=query.text) | Q(arguments_json__icontains=query.in_arguments)
    )
    return runs.filter(by_number | Q(title__icontains=query.text) | Exists(calls))


@dataclass(frozen=True)
class Results:
    query: Query
    tickets: list[Ticket]
    runs: list[Run]
    # More rows matched than are shown: the person should narrow the search.
    more_tickets: bool
    more_runs: bool


def search(*, tenant_ids: Iterable[int], text: str, limit: int = RESULTS) -> Results:
    """Tickets and runs of these tenants that the text finds, newest first, at most limit of
    each. Reads: two queries (none for an empty text). No side effects. Raises: nothing.
    """
    query = parse(text)
    tenant_ids = list(tenant_ids)
    if not query or not tenant_ids:
        return Results(query, [], [], more_tickets=False, more_runs=False)
    tickets = list(
        tickets_matching(
            Ticket.objects.filter(tenant_id__in=tenant_ids).select_related(
                "run", "tenant", "decided_by"
            ),
            query=query,
        ).order_by("-created_at", "-id")[: limit + 1]
    )
    runs = list(
        runs_matching(
            Run.objects.filter(tenant_id__in=tenant_ids).select_related("tenant", "requested_by"),
            query=query,
        ).order_by("-created_at", "-id")[: limit + 1]
    )
    return Results(
        query,
        tickets[:limit],
        runs[:limit],
        more_tickets=len(tickets) > limit,
        more_runs=len(runs) > limit,
    )
