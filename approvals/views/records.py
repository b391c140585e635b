"""A ticket's decision record, for auditors and admins: the page and its JSON and CSV exports."""

from __future__ import annotations

import csv
import io
import json

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from approvals.decisions import record
from approvals.views import access

# Another tenant's ticket is 404 (access); a member of its tenant without the history role is
# refused with this.
REFUSAL = "Only auditors and admins read a ticket's decision record."


@login_required
@require_GET
def ticket_record(request: HttpRequest, pk: int) -> HttpResponse:
    ticket, membership = access.get_ticket_for_user(request, pk)
    if not membership.can_read_history:
        return render(request, "approvals/forbidden.html", {"reason": REFUSAL}, status=403)
    return render(
        request,
        "approvals/record.html",
        {
            "ticket": ticket,
            "run": ticket.run,
            "membership": membership,
            "record": record.decision_record(ticket=ticket),
            "views_note": record.VIEWS_NOT_RECORDED,
        },
    )


@login_required
@require_GET
def ticket_record_export(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    if fmt not in record.FORMATS:
        raise Http404("Decision records export as JSON or CSV.")
    ticket, membership = access.get_ticket_for_user(request, pk)
    if not membership.can_read_history:
        return render(request, "approvals/forbidden.html", {"reason": REFUSAL}, status=403)
    found = record.decision_record(ticket=ticket)
    record.record_export(ticket=ticket, user=request.user, fmt=fmt)
    if fmt == "json":
        body = json.dumps(record.as_data(found), indent=2, sort_keys=True, ensure_ascii=False)
        response = HttpResponse(body + "\n", content_type="application/json")
    else:
        out = io.StringIO()
        csv.writer(out).writerows(record.csv_rows(found))
        response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="ticket-{ticket.pk}-record.{fmt}"'
    return response
