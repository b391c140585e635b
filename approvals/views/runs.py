"""A run: its timeline, live, and an admin's resolution when an effect is in doubt."""

from __future__ import annotations

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
from approvals.forms.decisions import ResolveForm
from approvals.models import (
    AuditEvent,
    PreAuthorization,
    Run,
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
    edited = set(
        PreAuthorization.objects.filter(run=run).values_list("original_ticket_id", flat=True)
    )
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
        "doubtful": resolution.in_doubt_effects(run)
        if run.status == RunStatus.NEEDS_ATTENTION
        else [],
        "resolve_form": ResolveForm(),
        "live": run.status in {RunStatus.QUEUED, RunStatus.RESUMING, RunStatus.PAUSED},
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
