"""A run: its timeline, live, and an admin's resolution when an effect is in doubt."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
)
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals.audit import actions
from approvals.decisions import preauth
from approvals.forms.decisions import ResolveForm
from approvals.models import (
    AuditEvent,
    PreAuthorization,
    Run,
    RunExecutor,
    RunStatus,
    TicketStatus,
)
from approvals.runs import resolution
from approvals.views import access
from approvals.views.access import HtmxHttpRequest


def _timeline(run: Run) -> list[dict]:
    events = AuditEvent.objects.filter(tenant_id=run.tenant_id, run_id=run.pk).order_by("seq")
    return [
        {
            "event": event,
            "label": actions.label(event.action),
            "tone": event.action.split(".")[-1],
        }
        for event in events
    ]


@login_required
@require_GET
def run_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    run, membership = access.get_run_for_user(request, pk)
    tickets = list(run.tickets.select_related("decided_by").order_by("pk"))
    pres = list(
        PreAuthorization.objects.filter(run=run)
        .select_related("created_by", "original_ticket")
        .order_by("pk")
    )
    edited = {pre.original_ticket_id for pre in pres}
    context = {
        "run": run,
        "membership": membership,
        "timeline": _timeline(run),
        "tickets": tickets,
        # An edited call was rejected only to be made again with the approver's arguments.
        "rejected": [
            t for t in tickets if t.status == TicketStatus.REJECTED and t.pk not in edited
        ],
        "edited": [t for t in tickets if t.pk in edited],
        # What the caller of a decided run acts on: the current generation's decisions.
        "decided_now": [
            t
            for t in tickets
            if t.generation == run.state_generation
            and t.status in (TicketStatus.APPROVED, TicketStatus.REJECTED)
        ],
        # The title is the prompt as requested; what was approved instead is said beside it.
        "edits": [
            {
                "pre": pre,
                "changes": preauth.changes(
                    json.loads(pre.original_ticket.arguments_json), json.loads(pre.arguments_json)
                ),
            }
            for pre in pres
        ],
        "doubtful": resolution.in_doubt_effects(run)
        if run.status == RunStatus.NEEDS_ATTENTION
        else [],
        "resolve_form": ResolveForm(),
        # A caller's run is resumed by its caller's process, never by the console's worker.
        "caller": run.executor == RunExecutor.CALLER,
        "live": run.status
        in {
            RunStatus.STARTING,
            RunStatus.QUEUED,
            RunStatus.RESUMING,
            RunStatus.PAUSED,
            RunStatus.AWAITING_CALLER,
        },
    }
    template = "approvals/run.html"
    if request.htmx and request.htmx.target == "run-live":
        template += "#live"
    return render(request, template, context)


@login_required
@require_POST
def run_resolve(request: HttpRequest, pk: int) -> HttpResponse:
    run, membership = access.get_run_for_user(request, pk)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("Choose what happened to the effect.")
    try:
        resolution.resolve(
            run,
            user=request.user,
            resolution=form.cleaned_data["resolution"],
            note=form.cleaned_data["note"],
        )
    except resolution.ResolutionError as error:
        messages.error(request, error.sentence())
        return redirect("approvals:run", pk=run.pk)
    messages.success(request, "Resolution recorded.")
    return redirect("approvals:run", pk=run.pk)
