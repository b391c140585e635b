"""Runs: the list of every run of the user's tenants, and a run's page: its timeline, live,
its outcome, and an admin's resolution when an effect is in doubt."""

from __future__ import annotations

import json
from datetime import datetime

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Exists, OuterRef
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
)
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals import search
from approvals.audit import actions
from approvals.core.pagination import BadCursor, after_descending
from approvals.decisions import preauth
from approvals.execution import registry
from approvals.forms.decisions import ResolveForm
from approvals.forms.lists import RunFilterForm
from approvals.models import (
    AuditEvent,
    PreAuthorization,
    Run,
    RunExecutor,
    RunStatus,
    Ticket,
    TicketStatus,
)
from approvals.runs import resolution
from approvals.views import access, keys, lists
from approvals.views.access import HtmxHttpRequest

RUNS_PAGE = 25


@login_required
@require_GET
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    """Every run of the user's tenants, newest first: filtered, searched, keyset-paged, live."""
    memberships = access.memberships(request)
    form = lists.filter_form(request, RunFilterForm)
    page = None
    if form.is_valid():
        filters = form.cleaned_data
        runs = Run.objects.filter(tenant_id__in=memberships.keys()).select_related(
            "tenant", "requested_by"
        )
        if filters["tenant"]:
            runs = runs.filter(tenant__slug=filters["tenant"])
        if filters["status"]:
            runs = runs.filter(status=filters["status"])
        if filters["agent"]:
            runs = runs.filter(agent_key=filters["agent"])
        if filters["tool"]:
            runs = runs.filter(
                Exists(Ticket.objects.filter(run_id=OuterRef("pk"), tool_name=filters["tool"]))
            )
        if filters["requester"]:
            runs = runs.filter(requested_by__username=filters["requester"])
        runs = lists.in_days(runs, "created_at", filters)
        runs = search.runs_matching(runs, query=search.parse(filters["q"]))
        try:
            page = after_descending(
                runs, ("created_at", "id"), filters["after"] or None, (datetime, int), RUNS_PAGE
            )
        except BadCursor as error:
            form.add_error("after", str(error))
    context = {
        "form": form,
        "page": page,
        "runs": page.rows if page else [],
        "statuses": RunStatus.choices,
        "tools": registry.tool_names(),
        "filtered": lists.filtered(form),
        "next_query": lists.next_query(request, page),
        "keys": keys.queue_keys(has_rows=bool(page and page.rows), may_batch=False),
        **lists.choices(request),
    }
    template = "approvals/runs.html"
    if request.htmx and request.htmx.target == "runs-rows":
        template += "#rows"
    return render(request, template, context, status=200 if page else 400)


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
    # An edit may have renamed the run to what runs; the first one recorded what was asked.
    retitles = [
        event.detail["title"]
        for event in AuditEvent.objects.filter(
            run_id=run.pk, action="ticket.edited", ticket_id__in=edited
        ).order_by("seq")
        if isinstance(event.detail.get("title"), dict)
    ]
    context = {
        "requested_title": retitles[0].get("before", "") if retitles else "",
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
        # The title names what runs; what was approved instead of the request is said beside it.
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
