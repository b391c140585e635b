"""The audit history as people read it: filtered, exported (itself audited) and verified.

The history page, its export and any later API read the same events through these functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.core.cache import cache
from django.db import transaction
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast

from approvals.audit.chain import ChainReport, append, verify_chain
from approvals.audit.sentences import describe
from approvals.core.pagination import decode, encode
from approvals.models import AuditEvent, Tenant

# A search (part of an actor's name, or words of the detail) reads at most this many events per
# page, newest first, and then offers to search further back: a word that matches nothing never
# scans the whole log.
SEARCH_WINDOW = 5000


def filtered_events(
    tenants: dict[int, Tenant], filters: dict, *, search: bool = True
) -> QuerySet[AuditEvent]:
    """The events of these tenants that match the history's filters (a cleaned AuditFilterForm).

    The actor matches any part of the name, in any case; the text ("q") any part of the
    detail, the actor or the tool. search=False leaves those two out (history_page() bounds
    them for a page); the export reads every event they match, streamed."""
    events = AuditEvent.objects.filter(tenant_id__in=tenants.keys()).select_related("tenant")
    if filters.get("tenant"):
        events = events.filter(tenant__slug=filters["tenant"])
    if search:
        events = searched(events, filters)
    if filters.get("action"):
        events = events.filter(action=filters["action"])
    if filters.get("tool"):
        events = events.filter(tool_name=filters["tool"])
    if filters.get("outcome"):
        events = events.filter(outcome=filters["outcome"])
    if filters.get("since"):
        events = events.filter(created_at__gte=datetime.combine(filters["since"], time.min, UTC))
    if filters.get("until") and filters["until"] < date.max:
        # "until" is inclusive: everything before the start of the next day.
        end = datetime.combine(filters["until"] + timedelta(days=1), time.min, UTC)
        events = events.filter(created_at__lt=end)
    return events


def is_search(filters: dict) -> bool:
    """Whether the filters hold a search (part of an actor's name, or text)."""
    return bool(filters.get("actor") or filters.get("q"))


def searched(events: QuerySet[AuditEvent], filters: dict) -> QuerySet[AuditEvent]:
    """The events whose actor holds the actor filter and whose detail, actor or tool holds the
    text, in any case."""
    if filters.get("actor"):
        events = events.filter(actor_name__icontains=filters["actor"])
    if filters.get("q"):
        text = filters["q"]
        events = events.annotate(detail_text=Cast("detail", TextField())).filter(
            Q(detail_text__icontains=text)
            | Q(actor_name__icontains=text)
            | Q(tool_name__icontains=text)
        )
    return events


@dataclass
class HistoryPage:
    rows: list[AuditEvent]
    next_cursor: str | None
    # A search that stopped at its window: when the oldest event it read was written (the next
    # page goes on from there); None when it read everything it could match.
    searched_back_to: datetime | None = None


def history_page(
    *, tenants: dict[int, Tenant], filters: dict, cursor: str | None, size: int
) -> HistoryPage:
    """One page of the history, newest first, after the keyset cursor.

    Without a search: the filtered events, size + 1 read (one query). With one: the newest
    SEARCH_WINDOW events of the other filters after the cursor bound the search (one query to
    find the window's end, one for the page); a page that ends before the window does says how
    far back it read and continues from there. Raises BadCursor for a broken cursor.
    """
    events = filtered_events(tenants, filters, search=False)
    if cursor:
        (before,) = decode(cursor, (int,))
        events = events.filter(id__lt=before)
    events = events.order_by("-id")
    floor = None
    if is_search(filters):
        edge = list(events.values_list("id", "created_at")[SEARCH_WINDOW - 1 : SEARCH_WINDOW])
        if edge:
            floor = edge[0]
            events = events.filter(id__gte=floor[0])
        events = searched(events, filters)
    rows = list(events[: size + 1])
    if len(rows) > size:
        return HistoryPage(rows[:size], encode([rows[size - 1].id]))
    if floor is not None:
        return HistoryPage(rows, encode([floor[0]]), searched_back_to=floor[1])
    return HistoryPage(rows, None)


def _chain_key(tenant: Tenant) -> str:
    return f"audit-chain:{tenant.pk}:{tenant.audit_seq}:{tenant.audit_head}"


def chain_statuses(
    tenants: Iterable[Tenant], *, compute_up_to: int | None
) -> list[ChainReport | None]:
    """Each tenant's chain report, in the order given: the cached ones read in one round trip
    to the cache, and one not cached computed now (and cached, per chain head) when its chain
    has at most compute_up_to events (None: whatever its length), else None."""
    tenants = list(tenants)
    keys = [_chain_key(t) for t in tenants]
    cached = cache.get_many(keys)
    reports = []
    for tenant, key in zip(tenants, keys, strict=True):
        report = cached.get(key)
        if report is None and (compute_up_to is None or tenant.audit_seq <= compute_up_to):
            report = verify_chain(tenant)
            cache.set(key, report, 300)
        reports.append(report)
    return reports


EXPORT_FIELDS = [
    "tenant",
    "seq",
    "created_at",
    "actor",
    "action",
    "run",
    "ticket",
    "tool",
    "arguments_digest",
    "outcome",
    "detail",
    "hash",
    "sentence",
]


def export_rows(events: QuerySet[AuditEvent]) -> Iterator[dict]:
    for event in events.order_by("id").iterator(chunk_size=2000):
        yield {
            "tenant": event.tenant.slug,
            "seq": event.seq,
            "created_at": event.created_at.isoformat(),
            "actor": event.actor_name,
            "action": event.action,
            "run": event.run_id,
            "ticket": event.ticket_id,
            "tool": event.tool_name,
            "arguments_digest": event.arguments_digest,
            "outcome": event.outcome,
            "detail": event.detail,
            "hash": event.hash,
            "sentence": describe(event).text,
        }


# A spreadsheet opening the CSV runs a cell that starts with one of these as a formula.
FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(cell: object) -> object:
    """A CSV cell a spreadsheet shows as text: one starting like a formula gets a leading
    single quote (the usual defence); any other cell is unchanged."""
    if isinstance(cell, str) and cell.startswith(FORMULA_LEADS):
        return "'" + cell
    return cell


def csv_rows(events: QuerySet[AuditEvent]) -> Iterator[list]:
    """The export as CSV rows, the header first: the detail as JSON, and every text cell made
    spreadsheet_safe(). The JSON Lines export (export_rows) keeps the values exact."""
    yield list(EXPORT_FIELDS)
    for row in export_rows(events):
        row["detail"] = json.dumps(row["detail"], sort_keys=True)
        yield [spreadsheet_safe(row[field]) for field in EXPORT_FIELDS]


def record_export(*, user, tenant_ids: list[int], fmt: str, filters: dict) -> None:
    """An export of the audit history is itself audited, once per tenant it covers.

    Side effects: one audit.exported event per tenant, each in its own transaction.
    """
    for tenant_id in tenant_ids:
        with transaction.atomic():
            append(
                tenant_id=tenant_id,
                action="audit.exported",
                actor=user,
                outcome="exported",
                detail={"format": fmt, "filters": {k: str(v) for k, v in filters.items() if v}},
            )
