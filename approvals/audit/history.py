"""The audit history as people read it: filtered, exported (itself audited) and verified.

The history page, its export and any later API read the same events through these functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta

from django.core.cache import cache
from django.db import transaction
from django.db.models import QuerySet

from approvals.audit.chain import ChainReport, append, verify_chain
from approvals.models import AuditEvent, Tenant


def filtered_events(tenants: dict[int, Tenant], filters: dict) -> QuerySet[AuditEvent]:
    """The events of these tenants that match the history's filters (a cleaned AuditFilterForm)."""
    events = AuditEvent.objects.filter(tenant_id__in=tenants.keys()).select_related("tenant")
    if filters.get("tenant"):
        events = events.filter(tenant__slug=filters["tenant"])
    if filters.get("actor"):
        events = events.filter(actor_name=filters["actor"])
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


def _chain_key(tenant: Tenant) -> str:
    return f"audit-chain:{tenant.pk}:{tenant.audit_seq}:{tenant.audit_head}"


def chain_status(tenant: Tenant, *, compute: bool) -> ChainReport | None:
    """The tenant's chain report: cached per chain head, computed now only when asked to."""
    report = cache.get(_chain_key(tenant))
    if report is None and compute:
        report = verify_chain(tenant)
        cache.set(_chain_key(tenant), report, 300)
    return report


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
