"""Step-up on the ticket page: an approval held until the person proves a second factor, then
completed from what they typed (the completion view is tickets.ticket_step_up).

The approval waits in the session (PENDING_KEY, one per ticket, single use, gone when the
policy's window has passed).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django_htmx.http import HttpResponseClientRedirect

from approvals.decisions import stepup
from approvals.decisions.errors import StepUpRequiredError
from approvals.models import Membership, Ticket
from approvals.views import freshness
from approvals.views.access import HtmxHttpRequest

# request.session[PENDING_KEY] = {"<ticket id>": {"message", "always", "flags_seen", "digest",
# "minutes", "created", "expires"}}: times are unix seconds.
PENDING_KEY = "approvals_step_up"


def hold(request: HttpRequest, ticket: Ticket, data: dict, *, minutes: int) -> None:
    """Keep the approval the person sent, to complete once they prove a second factor."""
    now = timezone.now().timestamp()
    # Those past their window approve nothing any more: they leave the session.
    pending = {
        pk: record
        for pk, record in (request.session.get(PENDING_KEY) or {}).items()
        if record.get("expires", 0) > now
    }
    pending[str(ticket.pk)] = {
        "message": data["message"],
        "always": bool(data["always"]),
        "flags_seen": bool(data["flags_seen"]),
        # The call the page showed: completing approves that call or nothing.
        "digest": ticket.arguments_digest,
        "minutes": minutes,
        "created": now,
        "expires": now + minutes * 60,
    }
    request.session[PENDING_KEY] = pending


def held(request: HttpRequest, ticket: Ticket) -> dict | None:
    """The approval waiting for this ticket, or None (never held, used, or past its window)."""
    record = (request.session.get(PENDING_KEY) or {}).get(str(ticket.pk))
    if record is None:
        return None
    if record.get("expires", 0) <= timezone.now().timestamp():
        release(request, ticket)
        return None
    return record


def release(request: HttpRequest, ticket: Ticket) -> None:
    pending = dict(request.session.get(PENDING_KEY) or {})
    if pending.pop(str(ticket.pk), None) is not None:
        request.session[PENDING_KEY] = pending


def completion_url(ticket: Ticket) -> str:
    return reverse("approvals:step-up", args=[ticket.pk])


def ask_for_factor(
    request: HtmxHttpRequest, ticket: Ticket, data: dict, error: StepUpRequiredError
) -> HttpResponse | None:
    """Hold the approval and send the person to prove a second factor; None when they have
    none to prove (the page then says how to set one up)."""
    url = freshness.reauthenticate_url(request.user, completion_url(ticket))
    if url is None:
        return None
    hold(request, ticket, data, minutes=error.minutes)
    messages.info(
        request,
        f"Ticket #{ticket.pk} needs a second factor confirmed within {error.minutes} "
        f"minute{'s' if error.minutes != 1 else ''}: confirm it, and your approval completes "
        "with your message.",
    )
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


def notice(request: HttpRequest, ticket: Ticket, policy, membership: Membership) -> dict:
    """What the ticket page says before an approval that needs a second factor."""
    minutes = stepup.needs_step_up(ticket, policy) if ticket.is_pending else None
    if minutes is None or not membership.can_decide:
        return {"step_up_minutes": None}
    factor = freshness.last_factor(request)
    now = timezone.now()
    fresh = factor is not None and stepup.is_fresh(factor.at, minutes, now=now)
    return {
        "step_up_minutes": minutes,
        "step_up_ago": int((now - factor.at).total_seconds() // 60) if fresh and factor else None,
        "step_up_has_factor": bool(freshness.factor_types(request.user)),
        "step_up_setup_url": reverse(freshness.SET_UP_URL_NAME),
    }
