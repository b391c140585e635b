"""Working on tickets as a team: claims, the discussion, and batch decisions from the queue."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import (
    HttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import trigger_client_event

from approvals.core.errors import DomainError
from approvals.decisions import batch, claims, comments
from approvals.forms.decisions import BatchDecisionForm, ClaimForm, CommentForm
from approvals.views import access, errors
from approvals.views import tickets as tickets_view
from approvals.views.access import HtmxHttpRequest


@login_required
@require_POST
def ticket_claim(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    ticket, membership = access.get_ticket_for_user(request, pk)
    form = ClaimForm(request.POST)
    problem, status = "", 200
    if not form.is_valid():
        problem, status = "Choose to claim, take over or release.", 400
    else:
        action = form.cleaned_data["action"]
        try:
            if action == "release":
                claims.release(ticket, user=request.user)
            else:
                claims.claim(ticket, user=request.user, take_over=action == "take_over")
        except DomainError as error:
            problem, status = errors.explain(error)
    if not request.htmx:
        if problem:
            messages.error(request, problem)
        return redirect("approvals:ticket", pk=ticket.pk)
    ticket.refresh_from_db()
    context = {**tickets_view.team_context(ticket, membership), "claim_problem": problem}
    return render(request, "approvals/ticket.html#claim", context, status=status)


@login_required
@require_POST
def ticket_comment(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    ticket, membership = access.get_ticket_for_user(request, pk)
    form = CommentForm(request.POST)
    status = 400
    if form.is_valid():
        try:
            comments.comment(ticket, user=request.user, text=form.cleaned_data["text"])
        except comments.CommentError as error:
            form.add_error("text", error.sentence())
        except DomainError as error:
            message, status = errors.explain(error)
            form.add_error(None, message)
        else:
            status = 200
    if status == 200 and not request.htmx:
        return redirect(reverse("approvals:ticket", args=[ticket.pk]) + "#comments")
    if request.htmx:
        context = tickets_view.team_context(ticket, membership)
        template = "approvals/ticket.html#comments"
    else:
        context = tickets_view.ticket_context(request, ticket, membership)
        template = "approvals/ticket.html"
    if status != 200:
        context["comment_form"] = form
    return render(request, template, context, status=status)


@login_required
@require_POST
def batch_decide(request: HtmxHttpRequest) -> HttpResponse:
    form = BatchDecisionForm(request.POST)
    outcomes: list[batch.BatchOutcome] = []
    problem, status = "", 200
    if not form.is_valid():
        problem, status = " ".join(m for errors in form.errors.values() for m in errors), 400
    else:
        try:
            outcomes = batch.decide_batch(
                form.cleaned_data["ticket"],
                user=request.user,
                approve=form.cleaned_data["decision"] == "approve",
                message=form.cleaned_data["message"],
            )
        except DomainError as error:
            problem, status = errors.explain(error)
    approve = form.is_valid() and form.cleaned_data["decision"] == "approve"
    context = {
        "outcomes": outcomes,
        "done": sum(1 for o in outcomes if o.done),
        "verb": "approved" if approve else "rejected",
        "problem": problem,
    }
    template = "approvals/batch.html#result" if request.htmx else "approvals/batch.html"
    response = render(request, template, context, status=status)
    if outcomes:
        # The queue's rows re-read at once instead of waiting for the live hint.
        trigger_client_event(response, "console:changed")
    return response
