"""The audit history: filters, keyset pages, chain verification, CSV and JSON Lines export."""

from __future__ import annotations

import csv
import json

from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from approvals.audit import actions, history, sentences
from approvals.core.pagination import BadCursor
from approvals.forms.filters import AuditFilterForm
from approvals.views import access
from approvals.views.access import HtmxHttpRequest

AUDIT_PAGE = 50


CHAIN_INLINE_EVENTS = 5000


@login_required
@require_GET
def audit_chains(request: HttpRequest) -> HttpResponse:
    """The chain badges alone, for the page to load after it has shown the history."""
    tenants = access.history_tenants(request)
    if not tenants:
        raise Http404("No such page.")
    chains = _chains(tenants, compute_up_to=None)
    return render(
        request, "approvals/audit.html#chains", {"chains": chains, "chains_pending": False}
    )


def _chains(tenants: dict, *, compute_up_to: int | None) -> list[dict]:
    ordered = sorted(tenants.values(), key=lambda t: t.slug)
    reports = history.chain_statuses(ordered, compute_up_to=compute_up_to)
    return [{"tenant": t, "report": r} for t, r in zip(ordered, reports, strict=True)]


@login_required
@require_GET
def audit_history(request: HtmxHttpRequest) -> HttpResponse:
    tenants = access.history_tenants(request)
    if not tenants:
        return render(
            request,
            "approvals/forbidden.html",
            {"reason": "Only auditors and admins read the audit history."},
            status=403,
        )
    form = AuditFilterForm(request.GET, tenant_slugs=sorted(t.slug for t in tenants.values()))
    # Small chains are verified inline; long ones load after the page (or come from cache).
    chains = _chains(tenants, compute_up_to=CHAIN_INLINE_EVENTS)
    page = None
    if form.is_valid():
        try:
            page = history.history_page(
                tenants=tenants,
                filters=form.cleaned_data,
                cursor=form.cleaned_data["after"] or None,
                size=AUDIT_PAGE,
            )
        except BadCursor as error:
            form.add_error("after", str(error))
    context = {
        "form": form,
        "page": page,
        "tenants": sorted(tenants.values(), key=lambda t: t.slug),
        "chains": chains,
        "chains_pending": any(c["report"] is None for c in chains),
        "entries": [(e, sentences.describe(e)) for e in page.rows] if page else [],
        "action_groups": actions.grouped(),
        "outcomes": actions.OUTCOMES,
        "next_query": access.with_query(request, after=page.next_cursor)
        if page and page.next_cursor
        else "",
        "export_query": access.with_query(request, after=""),
    }
    template = "approvals/audit.html"
    if request.htmx and request.htmx.target == "audit-rows":
        template += "#rows"
    return render(request, template, context, status=200 if page else 400)


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
@require_GET
def audit_export(request: HttpRequest, fmt: str) -> HttpResponse:
    if fmt not in {"csv", "jsonl"}:
        raise Http404("Exports are CSV or JSON Lines.")
    tenants = access.history_tenants(request)
    if not tenants:
        return render(
            request,
            "approvals/forbidden.html",
            {"reason": "Only auditors and admins export the audit history."},
            status=403,
        )
    form = AuditFilterForm(request.GET, tenant_slugs=sorted(t.slug for t in tenants.values()))
    if not form.is_valid():
        return HttpResponseBadRequest(
            "The filters are not valid: " + "; ".join(m for e in form.errors.values() for m in e)
        )
    events = history.filtered_events(tenants, form.cleaned_data)
    scope = [
        t
        for t in tenants
        if not form.cleaned_data["tenant"] or tenants[t].slug == form.cleaned_data["tenant"]
    ]
    history.record_export(user=request.user, tenant_ids=scope, fmt=fmt, filters=form.cleaned_data)
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    if fmt == "csv":
        writer = csv.writer(_Echo())

        response = StreamingHttpResponse(
            (writer.writerow(row) for row in history.csv_rows(events)),
            content_type="text/csv; charset=utf-8",
        )
    else:
        response = StreamingHttpResponse(
            (json.dumps(row, sort_keys=True) + "\n" for row in history.export_rows(events)),
            content_type="application/x-ndjson",
        )
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.{fmt}"'
    return response
