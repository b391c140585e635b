"""The queue's history tabs: decided tickets of the user's tenants, and the tickets the user
voted on or decided ("my decisions"), with their part and the final outcome; and the search."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.db.models import Exists, OuterRef, Prefetch, Q, QuerySet
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from approvals import search
from approvals.core import presenters
from approvals.core.pagination import BadCursor, Page, after_descending
from approvals.execution import registry
from approvals.forms.lists import (
    DECIDED_STATUSES,
    DecidedFilterForm,
    MyDecisionsFilterForm,
    SearchForm,
)
from approvals.models import Ticket, TicketStatus, TicketVote
from approvals.policies import quorum, scopes
from approvals.views import access, keys, lists
from approvals.views.access import HtmxHttpRequest

HISTORY_PAGE = 25


def _filtered_tickets(tickets: QuerySet[Ticket], filters: dict) -> QuerySet[Ticket]:
    if filters["tenant"]:
        tickets = tickets.filter(tenant__slug=filters["tenant"])
    if filters["status"]:
        tickets = tickets.filter(status=filters["status"])
    if filters["tool"]:
        tickets = tickets.filter(tool_name=filters["tool"])
    if filters["agent"]:
        tickets = tickets.filter(run__agent_key=filters["agent"])
    if filters["requester"]:
        tickets = tickets.filter(requested_by__username=filters["requester"])
    if filters.get("decider"):
        tickets = tickets.filter(decided_by__username=filters["decider"])
    tickets = lists.in_days(tickets, "decided_at", filters)
    return search.tickets_matching(tickets, query=search.parse(filters["q"]))


def _page(form, tickets: QuerySet[Ticket]) -> Page | None:
    try:
        return after_descending(
            tickets,
            ("created_at", "id"),
            form.cleaned_data["after"] or None,
            (datetime, int),
            HISTORY_PAGE,
        )
    except BadCursor as error:
        form.add_error("after", str(error))
        return None


def _render(request: HtmxHttpRequest, template: str, context: dict) -> HttpResponse:
    page = context["page"]
    context |= {
        "tools": registry.tool_names(),
        "filtered": lists.filtered(context["form"]),
        "next_query": lists.next_query(request, page),
        "keys": keys.queue_keys(has_rows=bool(context["rows"]), may_batch=False),
        **lists.choices(request),
    }
    if request.htmx and request.htmx.target == "history-rows":
        template += "#rows"
    return render(request, template, context, status=200 if page else 400)


@login_required
@require_GET
def decided(request: HtmxHttpRequest) -> HttpResponse:
    """Decided tickets of the user's tenants (approved, rejected, expired, superseded)."""
    memberships = access.memberships(request)
    form = lists.filter_form(request, DecidedFilterForm)
    page = None
    if form.is_valid():
        tickets = Ticket.objects.filter(
            tenant_id__in=memberships.keys(), status__in=DECIDED_STATUSES
        ).select_related("run", "tenant", "decided_by", "requested_by")
        page = _page(form, _filtered_tickets(tickets, form.cleaned_data))
    rows = [
        {"ticket": t, "summary": presenters.summary(t.arguments_json)}
        for t in (page.rows if page else [])
    ]
    context = {
        "form": form,
        "page": page,
        "rows": rows,
        "statuses": [(s.value, s.label) for s in DECIDED_STATUSES],
    }
    return _render(request, "approvals/decided.html", context)


def _my_part(ticket: Ticket, user_id: int) -> dict:
    """What the user did on the ticket: their vote (valid or withdrawn) or their decision."""
    votes = [v for v in ticket.votes.all() if v.user_id == user_id]
    vote = next((v for v in votes if v.is_valid), votes[-1] if votes else None)
    decided_it = ticket.decided_by_id == user_id
    if hasattr(ticket, "preauthorization") and decided_it:
        return {"kind": "edited", "text": "You edited the call and approved your version"}
    if vote is not None and vote.is_valid:
        last = decided_it and ticket.status == TicketStatus.APPROVED
        text = "You approved" + (", and your approval completed the quorum" if last else "")
        return {"kind": "approved", "text": text, "at": vote.created_at}
    if vote is not None:
        reason = vote.invalidated_reason or "it no longer counted"
        return {"kind": "withdrawn", "text": f"You approved; the approval was set aside: {reason}"}
    if decided_it and ticket.status == TicketStatus.REJECTED:
        return {"kind": "rejected", "text": "You rejected", "at": ticket.decided_at}
    return {"kind": ticket.status, "text": f"You decided: {ticket.get_status_display().lower()}"}


@login_required
@require_GET
def my_decisions(request: HtmxHttpRequest) -> HttpResponse:
    """The tickets the user voted on or decided, in their tenants, with their part and the
    final outcome of the ticket and of its run."""
    memberships = access.memberships(request)
    user = request.user
    form = lists.filter_form(request, MyDecisionsFilterForm)
    page = None
    if form.is_valid():
        voted = TicketVote.objects.filter(ticket_id=OuterRef("pk"), user=user)
        tickets = (
            Ticket.objects.filter(tenant_id__in=memberships.keys())
            .filter(Q(decided_by=user) | Exists(voted))
            .select_related("run", "tenant", "decided_by", "policy", "preauthorization")
            # One query for every row's votes: the user's own part and a pending quorum.
            .prefetch_related(Prefetch("votes", queryset=TicketVote.objects.select_related("user")))
        )
        page = _page(form, _filtered_tickets(tickets, form.cleaned_data))
    rows = []
    for ticket in page.rows if page else []:
        votes = list(ticket.votes.all())
        rows.append(
            {
                "ticket": ticket,
                "summary": presenters.summary(ticket.arguments_json),
                "mine": _my_part(ticket, user.pk),
                "progress": quorum.progress(ticket, scopes.policy_of(ticket), votes)
                if ticket.is_pending
                else None,
            }
        )
    context = {
        "form": form,
        "page": page,
        "rows": rows,
        "decides": any(m.can_decide for m in memberships.values()),
        "statuses": [(s.value, s.label) for s in (TicketStatus.PENDING, *DECIDED_STATUSES)],
    }
    return _render(request, "approvals/my_decisions.html", context)


@login_required
@require_GET
def search_page(request: HtmxHttpRequest) -> HttpResponse:
    """Tickets and runs of the user's tenants that the words find (the header's search box)."""
    form = SearchForm(request.GET)
    results = None
    if form.is_valid():
        results = search.search(
            tenant_ids=access.memberships(request).keys(), text=form.cleaned_data["q"]
        )
    rows = [
        {"ticket": t, "summary": presenters.summary(t.arguments_json)}
        for t in (results.tickets if results else [])
    ]
    context = {"form": form, "results": results, "ticket_rows": rows}
    return render(request, "approvals/search.html", context, status=200 if results else 400)
