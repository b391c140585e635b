"""A ticket: the exact call, its digest check, the diff, the conversation so far, and the decision."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import (
    HttpRequest,
    HttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from approvals.core import presenters
from approvals.core.errors import DomainError
from approvals.decisions import baseline, calls, comments, decide, digest, factors, stepup
from approvals.decisions.errors import StepUpRequiredError
from approvals.execution import registry
from approvals.forms.decisions import CommentForm, DecisionForm
from approvals.models import (
    Membership,
    PreAuthorization,
    RunExecutor,
    Ticket,
)
from approvals.policies import quorum, scopes
from approvals.views import access, errors, freshness, keys
from approvals.views import stepup as step_up
from approvals.views.access import HtmxHttpRequest


def _resume_blocker(ticket: Ticket) -> str:
    """Why approving the pending ticket would run nothing here; "" when it would run."""
    if not ticket.is_pending:
        return ""
    return registry.resume_blocker(ticket.run)


def ticket_context(request: HttpRequest, ticket: Ticket, membership: Membership) -> dict:
    run = ticket.run
    state_json, problem = digest.read_state(run)
    current = ticket.generation == run.state_generation
    check = (
        digest.check_digest(ticket, state_json, problem) if current and ticket.is_pending else None
    )
    # What is shown is what the digest covers: the call as the stored state holds it, when
    # the ticket is pending and its state was read; otherwise the ticket's copy, whose own
    # digest is checked (an integrity error is shown and nothing is approvable).
    shown_json = check.arguments_json if check is not None and check.arguments_json else None
    copy_intact = digest.copy_is_intact(ticket)
    call = calls.read(shown_json or ticket.arguments_json)
    compared = baseline.baseline_for(ticket=ticket, arguments=call.value)
    expired = ticket.is_expired
    policy = scopes.policy_of(ticket)
    votes = list(ticket.votes.select_related("user", "policy"))
    my_vote = next((v for v in votes if v.is_valid and v.user_id == request.user.pk), None)
    policy_refusal = (
        quorum.refusal_for(request.user, ticket, policy)
        if membership.can_decide and ticket.is_pending
        else ""
    )
    # The tenant asks its deciders for two-factor: a link to set it up, not buttons that fail.
    needs_two_factor = ticket.is_pending and factors.lacks_second_factor(
        membership, tenant=ticket.tenant, user=request.user
    )
    may_decide = (
        membership.can_decide
        and ticket.is_pending
        and not expired
        and not policy_refusal
        and not needs_two_factor
    )
    # Edit and approve: the pre-authorisation this ticket made (edited_into) or used (edited_from).
    edits = {
        "into" if p.original_ticket_id == ticket.pk else "from": p
        for p in PreAuthorization.objects.filter(
            Q(original_ticket=ticket) | Q(used_by=ticket)
        ).select_related("created_by", "original_ticket")
    }
    edit = edits.get("into") or edits.get("from")
    # A run this console cannot resume runs nothing whatever is approved: say so, offer reject.
    blocker = _resume_blocker(ticket)
    may_approve = (
        may_decide
        and (check is not None and check.ok)
        and copy_intact
        and not ticket.is_requested_by(request.user)
        and my_vote is None
        and not blocker
    )
    team = team_context(ticket, membership)
    progress = quorum.progress(ticket, policy, votes)
    return {
        "policy": policy,
        "progress": progress,
        "head_progress": progress if ticket.is_pending else None,
        "resume_blocker": blocker,
        "my_vote": my_vote,
        "policy_refusal": policy_refusal,
        "needs_two_factor": needs_two_factor,
        "invalidations": _invalidations(votes),
        "ticket": ticket,
        "run": run,
        "membership": membership,
        "arguments": presenters.argument_rows(call.value),
        "flags": call.flags,
        "copy_intact": copy_intact,
        "transcript": presenters.transcript(state_json) if state_json else [],
        "state_problem": problem,
        "check": check,
        "baseline": compared,
        "previous": compared.ticket if compared else None,
        "changes": compared.changes if compared else None,
        "target_names": baseline.target_arguments(
            agent_key=run.agent_key,
            agent_version=run.agent_version,
            tool_name=ticket.tool_name,
            arguments=call.value,
        ),
        "expired": expired,
        # Rejecting stays possible when the digest fails; only approving needs a verified call.
        "may_decide": may_decide,
        "may_approve": may_approve,
        "is_requester": ticket.is_requested_by(request.user),
        "may_edit": may_decide and not ticket.is_requested_by(request.user) and not blocker,
        "edited_into": edits.get("into"),
        "edited_from": edits.get("from"),
        "edit_changes": _edit_changes(edit) if edit else None,
        "edit_expired": edit is not None and edit.expires_at <= timezone.now(),
        "may_always": quorum.allows_always(policy),
        "form": DecisionForm(),
        "decision_keys": keys.decision_keys(may_approve=may_approve, may_reject=may_decide),
        "step_up_summary": stepup.describe_for(ticket, policy),
        **step_up.notice(request, ticket, policy, membership),
        **team,
    }


def _invalidations(votes: list) -> list[str]:
    """One sentence per policy change that invalidated approvals on this ticket."""
    grouped: dict[tuple, list] = {}
    for vote in votes:
        if not vote.is_valid:
            version = vote.policy.version if vote.policy_id else 0
            grouped.setdefault((version, vote.invalidated_reason), []).append(vote)
    sentences = []
    for (version, reason), lost in grouped.items():
        noun = "approval" if len(lost) == 1 else "approvals"
        names = ", ".join(v.user.get_username() for v in lost)
        label = f"policy v{version}" if version else "the built-in default policy"
        sentences.append(f"{len(lost)} {noun} ({names}) given under {label} were {reason}.")
    return sentences


def team_context(ticket: Ticket, membership: Membership) -> dict:
    """What the claim and discussion panels need; they re-read it alone on a live hint."""
    claimant = ticket.active_claimant
    may_claim = membership.can_decide and ticket.is_pending and not ticket.is_expired
    return {
        "ticket": ticket,
        "membership": membership,
        "claimant": claimant,
        "may_claim": may_claim,
        # `c` works when the button is "I'm on it" or "Release"; taking over asks by click.
        "claim_keys": keys.claim_keys(
            may_claim=may_claim,
            mine=claimant is not None and claimant.pk == membership.user_id,
            free=claimant is None,
        ),
        "comments": comments.comments(ticket),
        "may_comment": comments.may_comment(membership),
        "comment_form": CommentForm(),
    }


def head_context(ticket: Ticket, membership: Membership) -> dict:
    """What the page head needs (status, quorum, whether the run can resume); it re-reads
    alone on a live hint, even while someone writes a decision below it."""
    policy = scopes.policy_of(ticket)
    return {
        "ticket": ticket,
        "run": ticket.run,
        "membership": membership,
        "head_progress": quorum.progress(ticket, policy, list(ticket.votes.select_related("user")))
        if ticket.is_pending
        else None,
        "resume_blocker": _resume_blocker(ticket),
    }


# Live regions of the ticket page that re-read without the rest of the page.
TEAM_PARTIALS = {"claim", "comment-list"}


def _edit_changes(pre: PreAuthorization) -> list[presenters.Change]:
    return presenters.diff(
        json.loads(pre.original_ticket.arguments_json), json.loads(pre.arguments_json)
    )


@login_required
@require_GET
def ticket_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    ticket, membership = access.get_ticket_for_user(request, pk)
    template = "approvals/ticket.html"
    if request.htmx and request.htmx.target in TEAM_PARTIALS:
        # Cheap re-reads: no state to decrypt for who is on it or what was said.
        context = team_context(ticket, membership)
        return render(request, f"{template}#{request.htmx.target}", context)
    if request.htmx and request.htmx.target == "ticket-head":
        return render(request, f"{template}#head", head_context(ticket, membership))
    if request.htmx and request.htmx.target == "decision":
        template += "#decision"
    return render(request, template, ticket_context(request, ticket, membership))


@login_required
@require_POST
def ticket_decide(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    # The run only: decide() opens its state; a refusal's page reads the rest.
    ticket, membership = access.get_ticket_for_user(request, pk, related=("run",))
    form = DecisionForm(request.POST)
    problem, status = "", 200
    if not form.is_valid():
        problem, status = " ".join(m for errors in form.errors.values() for m in errors), 400
    else:
        factor = freshness.last_factor(request)
        try:
            # Every rule is the service's: roles, self-approval, the digest gate, the quorum,
            # the second factor a risky approval needs.
            ticket = decide.decide(
                ticket,
                user=request.user,
                approve=form.cleaned_data["decision"] == "approve",
                message=form.cleaned_data["message"],
                always=form.cleaned_data["always"],
                flags_seen=form.cleaned_data["flags_seen"],
                factor_at=factor.at if factor else None,
                factor_type=factor.type if factor else "",
                membership=membership,
            )
        except StepUpRequiredError as error:
            asked = step_up.ask_for_factor(request, ticket, form.cleaned_data, error)
            if asked is not None:
                return asked
            problem, status = (
                "Approving this needs a second factor, and you have none yet: set one up, "
                "then approve again. Your message is kept below.",
                error.status,
            )
        except DomainError as error:
            problem, status = errors.explain(error)
    if status == 200 and ticket.is_pending:
        # A vote that does not complete the quorum: the ticket waits for the others.
        progress = decide.progress_of(ticket)
        messages.success(request, f"Your approval is recorded: {progress.describe()}.")
        url = reverse("approvals:ticket", args=[ticket.pk])
        return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
    if status == 200:
        verb = "approved" if form.cleaned_data["decision"] == "approve" else "rejected"
        where = (
            "Its caller resumes the run."
            if ticket.run.executor == RunExecutor.CALLER
            else "The run continues in the worker."
        )
        messages.success(request, f"Ticket #{ticket.pk} {verb}. {where}")
        url = reverse("approvals:run", args=[ticket.run_id])
        return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
    ticket.refresh_from_db()
    context = ticket_context(request, ticket, membership)
    context["problem"] = problem
    context["form"] = form
    template = "approvals/ticket.html#decision" if request.htmx else "approvals/ticket.html"
    return render(request, template, context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def ticket_step_up(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Complete the approval held for a second factor (views.stepup): GET shows it with one
    button, POST decides it. A GET never decides (as on every page of the console), and the
    person sees what they approve after the pause; the button has the focus, so Enter is
    enough."""
    ticket, membership = access.get_ticket_for_user(request, pk)
    ticket_url = reverse("approvals:ticket", args=[ticket.pk])
    record = step_up.held(request, ticket)
    if record is None:
        messages.error(
            request,
            "No approval of this ticket is waiting for a second factor (it was completed, or "
            "its time passed): approve it again from this page.",
        )
        return redirect(ticket_url)
    factor = freshness.last_factor(request)
    again = freshness.reauthenticate_url(request.user, step_up.completion_url(ticket))
    if again is None:
        # Their second factor was removed meanwhile: the ticket page says what to do.
        step_up.release(request, ticket)
        return redirect(ticket_url)
    if factor is None or not stepup.is_fresh(factor.at, record["minutes"], now=timezone.now()):
        messages.info(
            request, f"Confirm a second factor to complete your approval of ticket #{ticket.pk}."
        )
        return redirect(again)
    if request.method == "GET":
        context = {"ticket": ticket, "record": record, "factor": factor, "membership": membership}
        return render(request, "approvals/step_up.html", context)
    # Single use: whatever happens next, this record approves nothing again.
    step_up.release(request, ticket)
    try:
        ticket = decide.decide(
            ticket,
            user=request.user,
            approve=True,
            message=record["message"],
            always=record["always"],
            flags_seen=record["flags_seen"],
            shown_digest=record["digest"],
            factor_at=factor.at,
            factor_type=factor.type,
            membership=membership,
        )
    except StepUpRequiredError as error:
        # The window closed between the page and the click, or the policy changed: ask again.
        step_up.hold(request, ticket, record, minutes=error.minutes)
        return redirect(again)
    except DomainError as error:
        # Expired, decided, the call changed: the ticket page says why, the message kept.
        problem, status = errors.explain(error)
        ticket.refresh_from_db()
        context = ticket_context(request, ticket, membership)
        context["problem"] = problem
        context["form"] = DecisionForm({"decision": "approve", "message": record["message"]})
        return render(request, "approvals/ticket.html", context, status=status)
    if ticket.is_pending:
        progress = decide.progress_of(ticket)
        messages.success(request, f"Your approval is recorded: {progress.describe()}.")
    else:
        messages.success(
            request,
            f"Ticket #{ticket.pk} approved with your second factor. "
            + (
                "Its caller resumes the run."
                if ticket.run.executor == RunExecutor.CALLER
                else "The run continues in the worker."
            ),
        )
    return redirect(ticket_url)
