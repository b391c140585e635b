"""The queue: pending tool calls of the user's tenants, filtered, keyset-paged, live."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import (
    HttpResponse,
)
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from approvals.core import presenters
from approvals.core.pagination import BadCursor, after_descending
from approvals.decisions import calls, digest, factors
from approvals.execution import registry
from approvals.forms.filters import QueueFilterForm
from approvals.models import (
    Membership,
    Ticket,
    TicketStatus,
    TicketVote,
)
from approvals.policies import quorum, scopes
from approvals.views import access, keys
from approvals.views.access import HtmxHttpRequest

QUEUE_PAGE = 25


@login_required
@require_GET
def queue(request: HtmxHttpRequest) -> HttpResponse:
    memberships = access.memberships(request)
    slugs = sorted(m.tenant.slug for m in memberships.values())
    data = request.GET.copy()
    if "tenant" not in data:
        data["tenant"] = access.active_tenant(request)
    form = QueueFilterForm(data, tenant_slugs=slugs)
    status = 200
    page = None
    if form.is_valid():
        filters = form.cleaned_data
        # Joined: the run and the requester. Not joined: the tenant (the membership has it),
        # the policy and the claimant (few, read after: none when no row has one). PostgreSQL
        # took 2 to 4 ms to plan the six-table join, ten times its run and more than the
        # query's two reads after it.
        tickets = Ticket.objects.filter(
            tenant_id__in=memberships.keys(), status=TicketStatus.PENDING
        ).select_related("run", "requested_by")
        # Quorum progress per row: one query for every row's votes, whatever the page holds.
        tickets = tickets.prefetch_related(
            Prefetch("votes", queryset=TicketVote.objects.select_related("user")),
            "policy",
            "claimed_by",
        )
        if filters["tenant"]:
            tickets = tickets.filter(
                tenant_id__in=[
                    m.tenant_id for m in memberships.values() if m.tenant.slug == filters["tenant"]
                ]
            )
        if filters["agent"]:
            tickets = tickets.filter(run__agent_key=filters["agent"])
        if filters["tool"]:
            tickets = tickets.filter(tool_name=filters["tool"])
        if filters["requester"]:
            tickets = tickets.filter(requested_by__username=filters["requester"])
        try:
            page = after_descending(
                tickets, ("created_at", "id"), filters["after"] or None, (datetime, int), QUEUE_PAGE
            )
        except BadCursor as error:
            form.add_error("after", str(error))
    if page is None:
        status = 400
    # Filter choices come from configuration and memberships, never from scanning tickets.
    rows = [_queue_row(t, memberships) for t in page.rows] if page else []
    # Tenants whose deciders need two-factor the user lacks: named, with a link to set it up.
    two_factor_tenants = [
        m.tenant.name
        for m in memberships.values()
        if factors.lacks_second_factor(m, tenant=m.tenant, user=request.user)
    ]
    deciding = [m for m in memberships.values() if m.can_decide]
    may_batch = len(deciding) > len(two_factor_tenants)
    context = {
        "form": form,
        "page": page,
        "rows": rows,
        "may_batch": may_batch,
        "two_factor_tenants": sorted(two_factor_tenants),
        "keys": keys.queue_keys(has_rows=bool(rows), may_batch=may_batch),
        "tenants": slugs,
        "tools": registry.tool_names(),
        "agents": sorted(settings.APPROVALS_AGENTS),
        "requesters": sorted(
            set(
                Membership.objects.filter(tenant_id__in=memberships.keys()).values_list(
                    "user__username", flat=True
                )
            )
        ),
        "next_query": access.with_query(request, after=page.next_cursor)
        if page and page.next_cursor
        else "",
        "now": timezone.now(),
    }
    template = "approvals/queue.html"
    if request.htmx and request.htmx.target == "queue-rows":
        template += "#rows"
    return render(request, template, context, status=status)


def _queue_row(ticket: Ticket, memberships: dict[int, Membership]) -> dict:
    # The tenant is not joined to the ticket: the person's membership has it.
    ticket.tenant = memberships[ticket.tenant_id].tenant
    # The line shows the ticket's copy, so the copy must still have its digest; a flagged call
    # is approved only on its own page, where its flags are shown: neither goes in a batch.
    intact = digest.copy_is_intact(ticket)
    flags = calls.read(ticket.arguments_json).flags
    # Nothing approved on a run this console cannot resume would run: it is flagged, and
    # decided on its own page, where the reason is shown.
    blocker = registry.resume_blocker(ticket.run)
    return {
        "ticket": ticket,
        "summary": presenters.summary(ticket.arguments_json),
        "claimant": ticket.active_claimant,
        "intact": intact,
        "flags": flags,
        "resume_blocker": blocker,
        "progress": quorum.progress(ticket, scopes.policy_of(ticket), list(ticket.votes.all())),
        "may_select": memberships[ticket.tenant_id].can_decide
        and intact
        and not flags
        and not blocker,
    }
