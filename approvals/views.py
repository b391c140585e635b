"""The console's pages: queue, ticket, run, audit history. Typed function views that validate
with a form, call one service, and render or redirect."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.db.models import Q, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, trigger_client_event
from django_htmx.middleware import HtmxDetails

from approvals import policies, preauth, registry, services, team
from approvals.audit import verify_chain
from approvals.core import crypto, presenters
from approvals.core.pagination import BadCursor, after_descending
from approvals.forms import (
    ARG_PREFIX,
    AuditFilterForm,
    BatchDecisionForm,
    ClaimForm,
    CommentForm,
    DecisionForm,
    EditArgumentsForm,
    QueueFilterForm,
    ResolveForm,
    TenantSwitchForm,
)
from approvals.models import (
    AuditEvent,
    Membership,
    PreAuthorization,
    Role,
    Run,
    RunStatus,
    Tenant,
    Ticket,
    TicketStatus,
)

QUEUE_PAGE = 25
AUDIT_PAGE = 50
HISTORY_ROLES = {Role.AUDITOR, Role.ADMIN}


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


# --- who may see what ---------------------------------------------------------------------


def _memberships(request: HttpRequest) -> dict[int, Membership]:
    cached = getattr(request, "_console_memberships", None)
    if cached is None:
        cached = {
            m.tenant_id: m
            for m in Membership.objects.filter(user=request.user).select_related("tenant")
        }
        request._console_memberships = cached
    return cached


def _get_ticket_for_user(request: HttpRequest, pk: int) -> tuple[Ticket, Membership]:
    memberships = _memberships(request)
    ticket = (
        Ticket.objects.select_related("run", "tenant", "requested_by", "decided_by")
        .filter(pk=pk, tenant_id__in=memberships.keys())
        .first()
    )
    if ticket is None:
        raise Http404("No such ticket.")
    return ticket, memberships[ticket.tenant_id]


def _get_run_for_user(request: HttpRequest, pk: int) -> tuple[Run, Membership]:
    memberships = _memberships(request)
    run = (
        Run.objects.select_related("tenant", "requested_by")
        .filter(pk=pk, tenant_id__in=memberships.keys())
        .first()
    )
    if run is None:
        raise Http404("No such run.")
    return run, memberships[run.tenant_id]


def _active_tenant(request: HttpRequest) -> str:
    slug = request.session.get("console_tenant", "")
    slugs = {m.tenant.slug for m in _memberships(request).values()}
    return slug if slug in slugs else ""


def _open_state(run: Run) -> tuple[dict | None, str]:
    try:
        return services.open_state(run), ""
    except crypto.CryptoError as error:
        return None, str(error)
    except ValueError:
        return None, "the stored state is not valid JSON"


# --- the queue ----------------------------------------------------------------------------


@login_required
@require_GET
def queue(request: HtmxHttpRequest) -> HttpResponse:
    memberships = _memberships(request)
    slugs = sorted(m.tenant.slug for m in memberships.values())
    data = request.GET.copy()
    if "tenant" not in data:
        data["tenant"] = _active_tenant(request)
    form = QueueFilterForm(data, tenant_slugs=slugs)
    status = 200
    page = None
    if form.is_valid():
        filters = form.cleaned_data
        tickets = Ticket.objects.filter(
            tenant_id__in=memberships.keys(), status=TicketStatus.PENDING
        ).select_related("run", "tenant", "requested_by", "claimed_by")
        if filters["tenant"]:
            tickets = tickets.filter(tenant__slug=filters["tenant"])
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
    context = {
        "form": form,
        "page": page,
        "rows": [_queue_row(t, memberships) for t in page.rows] if page else [],
        "may_batch": any(m.can_decide for m in memberships.values()),
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
        "next_query": _with(request, after=page.next_cursor) if page and page.next_cursor else "",
        "now": timezone.now(),
    }
    template = "approvals/queue.html"
    if request.htmx and request.htmx.target == "queue-rows":
        template += "#rows"
    return render(request, template, context, status=status)


def _queue_row(ticket: Ticket, memberships: dict[int, Membership]) -> dict:
    return {
        "ticket": ticket,
        "summary": presenters.summary(ticket.arguments_json),
        "claimant": ticket.active_claimant,
        "may_select": memberships[ticket.tenant_id].can_decide,
    }


def _with(request: HttpRequest, **changes: str) -> str:
    query = request.GET.copy()
    for key, value in changes.items():
        query[key] = value
    return query.urlencode()


# --- a ticket -----------------------------------------------------------------------------


def _ticket_context(request: HttpRequest, ticket: Ticket, membership: Membership) -> dict:
    run = ticket.run
    state_json, problem = _open_state(run)
    current = ticket.generation == run.state_generation
    check = (
        presenters.check_digest(ticket, state_json, problem)
        if current and ticket.is_pending
        else None
    )
    previous = (
        Ticket.objects.filter(
            tenant_id=ticket.tenant_id, tool_name=ticket.tool_name, status=TicketStatus.APPROVED
        )
        .exclude(pk=ticket.pk)
        .select_related("decided_by")
        .order_by("-decided_at", "-pk")
        .first()
    )
    changes = (
        presenters.diff(json.loads(previous.arguments_json), json.loads(ticket.arguments_json))
        if previous
        else None
    )
    expired = ticket.is_expired
    policy = policies.policy_of(ticket)
    votes = list(ticket.votes.select_related("user", "policy"))
    my_vote = next((v for v in votes if v.is_valid and v.user_id == request.user.pk), None)
    policy_refusal = (
        policies.refusal_for(request.user, ticket, policy)
        if membership.can_decide and ticket.is_pending
        else ""
    )
    may_decide = membership.can_decide and ticket.is_pending and not expired and not policy_refusal
    # Edit and approve: the pre-authorisation this ticket made (edited_into) or used (edited_from).
    edits = {
        "into" if p.original_ticket_id == ticket.pk else "from": p
        for p in PreAuthorization.objects.filter(
            Q(original_ticket=ticket) | Q(used_by=ticket)
        ).select_related("created_by", "original_ticket")
    }
    edit = edits.get("into") or edits.get("from")
    return {
        "policy": policy,
        "progress": policies.progress(ticket, policy, votes),
        "my_vote": my_vote,
        "policy_refusal": policy_refusal,
        "invalidations": _invalidations(votes),
        "ticket": ticket,
        "run": run,
        "membership": membership,
        "arguments": presenters.arguments_rows_from_json(ticket.arguments_json),
        "transcript": presenters.transcript(state_json) if state_json else [],
        "state_problem": problem,
        "check": check,
        "previous": previous,
        "changes": changes,
        "expired": expired,
        # Rejecting stays possible when the digest fails; only approving needs a verified call.
        "may_decide": may_decide,
        "may_approve": may_decide
        and (check is not None and check.ok)
        and not ticket.is_requested_by(request.user)
        and my_vote is None,
        "is_requester": ticket.is_requested_by(request.user),
        "may_edit": may_decide and not ticket.is_requested_by(request.user),
        "edited_into": edits.get("into"),
        "edited_from": edits.get("from"),
        "edit_changes": _edit_changes(edit) if edit else None,
        "edit_expired": edit is not None and edit.expires_at <= timezone.now(),
        "may_always": policies.allows_always(policy),
        "form": DecisionForm(),
        **_team_context(ticket, membership),
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


def _team_context(ticket: Ticket, membership: Membership) -> dict:
    """What the claim and discussion panels need; they re-read it alone on a live hint."""
    return {
        "ticket": ticket,
        "membership": membership,
        "claimant": ticket.active_claimant,
        "may_claim": membership.can_decide and ticket.is_pending and not ticket.is_expired,
        "comments": team.comments(ticket),
        "may_comment": team.may_comment(membership),
        "comment_form": CommentForm(),
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
    ticket, membership = _get_ticket_for_user(request, pk)
    template = "approvals/ticket.html"
    if request.htmx and request.htmx.target in TEAM_PARTIALS:
        # Cheap re-reads: no state to decrypt for who is on it or what was said.
        context = _team_context(ticket, membership)
        return render(request, f"{template}#{request.htmx.target}", context)
    if request.htmx and request.htmx.target == "decision":
        template += "#decision"
    return render(request, template, _ticket_context(request, ticket, membership))


@login_required
@require_POST
def ticket_claim(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    ticket, membership = _get_ticket_for_user(request, pk)
    form = ClaimForm(request.POST)
    problem, status = "", 200
    if not form.is_valid():
        problem, status = "Choose to claim, take over or release.", 400
    else:
        action = form.cleaned_data["action"]
        try:
            if action == "release":
                team.release(ticket, user=request.user)
            else:
                team.claim(ticket, user=request.user, take_over=action == "take_over")
        except services.TicketNotFoundError:
            raise Http404("No such ticket.") from None
        except services.NotAllowedError as error:
            problem, status = _sentence(error), 403
        except team.ClaimConflictError as error:
            problem, status = str(error), 409
        except team.NotClaimableError as error:
            problem, status = _sentence(error), 409
    if not request.htmx:
        if problem:
            messages.error(request, problem)
        return redirect("approvals:ticket", pk=ticket.pk)
    ticket.refresh_from_db()
    context = {**_team_context(ticket, membership), "claim_problem": problem}
    return render(request, "approvals/ticket.html#claim", context, status=status)


@login_required
@require_POST
def ticket_comment(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    ticket, membership = _get_ticket_for_user(request, pk)
    form = CommentForm(request.POST)
    status = 400
    if form.is_valid():
        try:
            team.comment(ticket, user=request.user, text=form.cleaned_data["text"])
        except services.TicketNotFoundError:
            raise Http404("No such ticket.") from None
        except services.NotAllowedError as error:
            form.add_error(None, _sentence(error))
            status = 403
        except team.CommentError as error:
            form.add_error("text", _sentence(error))
        else:
            status = 200
    if status == 200 and not request.htmx:
        return redirect(reverse("approvals:ticket", args=[ticket.pk]) + "#comments")
    if request.htmx:
        context = _team_context(ticket, membership)
        template = "approvals/ticket.html#comments"
    else:
        context = _ticket_context(request, ticket, membership)
        template = "approvals/ticket.html"
    if status != 200:
        context["comment_form"] = form
    return render(request, template, context, status=status)


@login_required
@require_POST
def batch_decide(request: HtmxHttpRequest) -> HttpResponse:
    form = BatchDecisionForm(request.POST)
    outcomes: list[team.BatchOutcome] = []
    problem, status = "", 200
    if not form.is_valid():
        problem, status = " ".join(m for errors in form.errors.values() for m in errors), 400
    else:
        try:
            outcomes = team.decide_batch(
                form.cleaned_data["ticket"],
                user=request.user,
                approve=form.cleaned_data["decision"] == "approve",
                message=form.cleaned_data["message"],
            )
        except team.BatchError as error:
            problem, status = _sentence(error), 400
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


@login_required
@require_POST
def ticket_decide(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    ticket, membership = _get_ticket_for_user(request, pk)
    form = DecisionForm(request.POST)
    problem, status = "", 200
    if not form.is_valid():
        problem, status = " ".join(m for errors in form.errors.values() for m in errors), 400
    else:
        approve = form.cleaned_data["decision"] == "approve"
        if approve and ticket.is_pending:
            # The digest is checked when shown and again now: what is approved is what will run.
            state_json, state_problem = _open_state(ticket.run)
            check = presenters.check_digest(ticket, state_json, state_problem)
            if not check.ok:
                problem, status = f"Not approved: {check.problem}.", 409
        if not problem:
            try:
                services.decide(
                    ticket,
                    user=request.user,
                    approve=approve,
                    message=form.cleaned_data["message"],
                    always=form.cleaned_data["always"],
                )
            except services.TicketNotFoundError:
                raise Http404("No such ticket.") from None
            except (services.NotAllowedError, services.SelfApprovalError) as error:
                problem, status = _sentence(error), 403
            except services.AlreadyVotedError as error:
                problem, status = _sentence(error), 409
            except services.AlreadyDecidedError as error:
                problem, status = str(error), 409
            except services.TicketExpiredError as error:
                problem, status = _sentence(error), 409
            except services.InvalidDecisionError as error:
                problem, status = _sentence(error), 400
    if status == 200 and Ticket.objects.filter(pk=ticket.pk, status=TicketStatus.PENDING).exists():
        # A vote that does not complete the quorum: the ticket waits for the others.
        ticket.refresh_from_db()
        progress = policies.progress(
            ticket, policies.policy_of(ticket), list(ticket.votes.select_related("user"))
        )
        messages.success(request, f"Your approval is recorded: {progress.describe()}.")
        url = reverse("approvals:ticket", args=[ticket.pk])
        return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
    if status == 200:
        verb = "approved" if form.cleaned_data["decision"] == "approve" else "rejected"
        messages.success(request, f"Ticket #{ticket.pk} {verb}. The run continues in the worker.")
        url = reverse("approvals:run", args=[ticket.run_id])
        return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
    ticket.refresh_from_db()
    context = _ticket_context(request, ticket, membership)
    context["problem"] = problem
    context["form"] = form
    template = "approvals/ticket.html#decision" if request.htmx else "approvals/ticket.html"
    return render(request, template, context, status=status)


def _edit_refusal(request: HttpRequest, ticket: Ticket, membership: Membership) -> str:
    """Why this user cannot edit this ticket now, or "" when they can."""
    if not membership.can_decide:
        return f"Your role ({membership.get_role_display().lower()}) cannot decide tickets."
    if ticket.is_requested_by(request.user):
        return "You requested this call, so someone else must approve it, edited or not."
    if ticket.status == TicketStatus.PENDING and ticket.is_expired:
        return f"This ticket expired at {ticket.expires_at:%Y-%m-%d %H:%M} UTC."
    if ticket.status != TicketStatus.PENDING:
        who = ticket.decided_by.get_username() if ticket.decided_by else ""
        return f"This ticket is already {ticket.get_status_display().lower()}" + (
            f" by {who}." if who else "."
        )
    return ""


@login_required
@require_http_methods(["GET", "POST"])
def ticket_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """Edit and approve: the arguments in a form checked against the tool's JSON schema."""
    ticket, membership = _get_ticket_for_user(request, pk)
    context: dict = {"ticket": ticket, "run": ticket.run, "membership": membership}
    refusal = _edit_refusal(request, ticket, membership)
    if refusal:
        forbidden = not membership.can_decide or ticket.is_requested_by(request.user)
        context["refusal"] = refusal
        return render(request, "approvals/edit.html", context, status=403 if forbidden else 409)
    tool = preauth.tool_for(ticket.run, ticket.tool_name)
    if tool is None:
        context["refusal"] = (
            f"The tool {ticket.tool_name} is not in agent {ticket.run.agent_key} "
            f"v{ticket.run.agent_version} as deployed here, so edited arguments cannot be "
            "checked. Approve or reject the call as it is."
        )
        return render(request, "approvals/edit.html", context, status=409)
    original = json.loads(ticket.arguments_json)
    form = EditArgumentsForm(
        request.POST if request.method == "POST" else None,
        schema=tool.params_json_schema,
        original=original if isinstance(original, dict) else {},
    )
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid() and form.arguments is not None:
            try:
                services.edit_and_approve(
                    ticket,
                    user=request.user,
                    arguments=form.arguments,
                    message=form.cleaned_data["message"],
                )
            except services.TicketNotFoundError:
                raise Http404("No such ticket.") from None
            except (services.NotAllowedError, services.SelfApprovalError) as error:
                context["problem"], status = _sentence(error), 403
            except (services.AlreadyDecidedError, services.TicketExpiredError) as error:
                context["problem"], status = _sentence(error), 409
            except services.InvalidArgumentsError as error:
                for problem in error.problems:
                    field = ARG_PREFIX + str(problem.argument)
                    form.add_error(field if field in form.fields else None, problem.message)
            except services.InvalidDecisionError as error:
                context["problem"] = _sentence(error)
            else:
                messages.success(
                    request,
                    f"Ticket #{ticket.pk} rejected with your corrected arguments, which are "
                    "pre-authorised: when the agent calls again with exactly those, the call "
                    "runs without asking again.",
                )
                return redirect("approvals:run", pk=ticket.run_id)
        if form.arguments is not None:
            context["changes"] = presenters.diff(original, form.arguments)
    context.update(
        {
            "form": form,
            "tool": tool,
            "arguments": presenters.arguments_rows_from_json(ticket.arguments_json),
        }
    )
    return render(request, "approvals/edit.html", context, status=status)


def _sentence(error: Exception) -> str:
    text = str(error)
    return (text[:1].upper() + text[1:]).rstrip(".") + "."


# --- a run --------------------------------------------------------------------------------

ACTION_LABELS = {
    "run.paused": "Paused for approval",
    "ticket.created": "Approval requested",
    "ticket.approved": "Approved",
    "ticket.rejected": "Rejected",
    "ticket.edited": "Edited: rejected with corrected arguments",
    "ticket.preauthorised": "Approved: pre-authorised edit",
    "ticket.expired": "Ticket expired",
    "ticket.vote": "Approval counted towards the quorum",
    "ticket.votes_invalidated": "Approvals invalidated by a policy change",
    "ticket.escalated": "Escalated",
    "ticket.auto_approved": "Approved automatically by rule",
    "ticket.auto_rejected": "Rejected automatically by rule",
    "policy.changed": "Policy changed",
    "policy.removed": "Policy removed",
    "group.changed": "Approver group changed",
    "group.deleted": "Approver group deleted",
    "run.queued": "Queued for the worker",
    "run.resuming": "Worker resuming",
    "effect.done": "Effect done",
    "run.completed": "Completed",
    "run.failed": "Failed",
    "run.refused": "Refused by the worker",
    "run.in_doubt": "Effect in doubt",
    "run.expired": "Expired",
    "run.requeued": "Re-queued after a worker stopped",
    "run.retry_later": "Waiting to retry",
    "run.resolved": "Resolved by a person",
    "keys.rotated": "Keys rotated",
    "auth.sign_in_failed": "Sign-in failed",
    "auth.locked_out": "Sign-in locked out",
    "audit.exported": "History exported",
    "session.cleared": "Session cleared",
    "ticket.claimed": "Claimed",
    "ticket.released": "Claim released",
    "ticket.commented": "Comment",
    "webhook.created": "Webhook created",
    "webhook.changed": "Webhook changed",
    "webhook.deleted": "Webhook deleted",
    "webhook.delivered": "Webhook delivered",
    "webhook.failed": "Webhook delivery failed",
    "webhook.retried": "Webhook delivery retried",
    "webhook.pinged": "Webhook test event sent",
    "email.failed": "Notification email failed",
    "email.retried": "Notification email retried",
}


def _timeline(run: Run) -> list[dict]:
    events = AuditEvent.objects.filter(tenant_id=run.tenant_id, run_id=run.pk).order_by("seq")
    return [
        {
            "event": event,
            "label": ACTION_LABELS.get(event.action, event.action),
            "tone": event.action.split(".")[-1],
        }
        for event in events
    ]


@login_required
@require_GET
def run_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    run, membership = _get_run_for_user(request, pk)
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
        "doubtful": services.in_doubt_effects(run)
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
    run, membership = _get_run_for_user(request, pk)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("Choose what happened to the effect.")
    try:
        services.resolve(
            run,
            user=request.user,
            resolution=form.cleaned_data["resolution"],
            note=form.cleaned_data["note"],
        )
    except services.ResolutionError as error:
        messages.error(request, _sentence(error))
        return redirect("approvals:run", pk=run.pk)
    messages.success(request, "Resolution recorded.")
    return redirect("approvals:run", pk=run.pk)


# --- audit history ------------------------------------------------------------------------


def _history_tenants(request: HttpRequest) -> dict[int, Tenant]:
    return {
        tenant_id: m.tenant
        for tenant_id, m in _memberships(request).items()
        if m.role in HISTORY_ROLES
    }


def _filtered_events(tenants: dict[int, Tenant], filters: dict) -> QuerySet[AuditEvent]:
    events = AuditEvent.objects.filter(tenant_id__in=tenants.keys()).select_related("tenant")
    if filters.get("tenant"):
        events = events.filter(tenant__slug=filters["tenant"])
    if filters.get("actor"):
        events = events.filter(actor_name=filters["actor"])
    if filters.get("action"):
        events = events.filter(action=filters["action"])
    if filters.get("tool"):
        events = events.filter(tool_name=filters["tool"])
    if filters.get("outcome"):
        events = events.filter(outcome=filters["outcome"])
    if filters.get("since"):
        events = events.filter(created_at__gte=datetime.combine(filters["since"], time.min, UTC))
    if filters.get("until") and filters["until"] < date.max:
        # "until" is inclusive: everything before the start of the next day.
        end = datetime.combine(filters["until"] + timedelta(days=1), time.min, UTC)
        events = events.filter(created_at__lt=end)
    return events


CHAIN_INLINE_EVENTS = 5000


def _chain_key(tenant: Tenant) -> str:
    return f"audit-chain:{tenant.pk}:{tenant.audit_seq}:{tenant.audit_head}"


def _chain_status(tenant: Tenant, *, compute: bool) -> dict:
    """The tenant's chain report: cached per chain head, computed now only when asked to."""
    report = cache.get(_chain_key(tenant))
    if report is None and compute:
        report = verify_chain(tenant)
        cache.set(_chain_key(tenant), report, 300)
    return {"tenant": tenant, "report": report}


@login_required
@require_GET
def audit_chains(request: HttpRequest) -> HttpResponse:
    """The chain badges alone, for the page to load after it has shown the history."""
    tenants = _history_tenants(request)
    if not tenants:
        raise Http404("No such page.")
    chains = [
        _chain_status(t, compute=True) for t in sorted(tenants.values(), key=lambda t: t.slug)
    ]
    return render(
        request, "approvals/audit.html#chains", {"chains": chains, "chains_pending": False}
    )


@login_required
@require_GET
def audit_history(request: HtmxHttpRequest) -> HttpResponse:
    tenants = _history_tenants(request)
    if not tenants:
        return render(
            request,
            "approvals/forbidden.html",
            {"reason": "Only auditors and admins read the audit history."},
            status=403,
        )
    form = AuditFilterForm(request.GET, tenant_slugs=sorted(t.slug for t in tenants.values()))
    chains = [
        _chain_status(t, compute=t.audit_seq <= CHAIN_INLINE_EVENTS)
        for t in sorted(tenants.values(), key=lambda t: t.slug)
    ]
    page = None
    if form.is_valid():
        try:
            page = after_descending(
                _filtered_events(tenants, form.cleaned_data),
                ("id",),
                form.cleaned_data["after"] or None,
                (int,),
                AUDIT_PAGE,
            )
        except BadCursor as error:
            form.add_error("after", str(error))
    context = {
        "form": form,
        "page": page,
        "tenants": sorted(tenants.values(), key=lambda t: t.slug),
        # Small chains are verified inline; long ones load after the page (or come from cache).
        "chains": chains,
        "chains_pending": any(c["report"] is None for c in chains),
        "actions": sorted(ACTION_LABELS),
        "outcomes": AuditFilterForm.OUTCOMES,
        "next_query": _with(request, after=page.next_cursor) if page and page.next_cursor else "",
        "export_query": _with(request, after=""),
        "labels": ACTION_LABELS,
    }
    template = "approvals/audit.html"
    if request.htmx and request.htmx.target == "audit-rows":
        template += "#rows"
    return render(request, template, context, status=200 if page else 400)


EXPORT_FIELDS = [
    "tenant",
    "seq",
    "created_at",
    "actor",
    "action",
    "run",
    "ticket",
    "tool",
    "arguments_digest",
    "outcome",
    "detail",
    "hash",
]


def _export_rows(events: QuerySet[AuditEvent]) -> Iterator[dict]:
    for event in events.order_by("id").iterator(chunk_size=2000):
        yield {
            "tenant": event.tenant.slug,
            "seq": event.seq,
            "created_at": event.created_at.isoformat(),
            "actor": event.actor_name,
            "action": event.action,
            "run": event.run_id,
            "ticket": event.ticket_id,
            "tool": event.tool_name,
            "arguments_digest": event.arguments_digest,
            "outcome": event.outcome,
            "detail": event.detail,
            "hash": event.hash,
        }


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
@require_GET
def audit_export(request: HttpRequest, fmt: str) -> HttpResponse:
    if fmt not in {"csv", "jsonl"}:
        raise Http404("Exports are CSV or JSON Lines.")
    tenants = _history_tenants(request)
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
    events = _filtered_events(tenants, form.cleaned_data)
    scope = [
        t
        for t in tenants
        if not form.cleaned_data["tenant"] or tenants[t].slug == form.cleaned_data["tenant"]
    ]
    services.record_export(user=request.user, tenant_ids=scope, fmt=fmt, filters=form.cleaned_data)
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    if fmt == "csv":
        writer = csv.writer(_Echo())

        def lines() -> Iterator[str]:
            yield writer.writerow(EXPORT_FIELDS)
            for row in _export_rows(events):
                row["detail"] = json.dumps(row["detail"], sort_keys=True)
                yield writer.writerow([row[f] for f in EXPORT_FIELDS])

        response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    else:
        response = StreamingHttpResponse(
            (json.dumps(row, sort_keys=True) + "\n" for row in _export_rows(events)),
            content_type="application/x-ndjson",
        )
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.{fmt}"'
    return response


# --- tenant switcher ----------------------------------------------------------------------


@login_required
@require_POST
def switch_tenant(request: HttpRequest) -> HttpResponse:
    form = TenantSwitchForm(request.POST)
    slugs = {m.tenant.slug for m in _memberships(request).values()}
    if not form.is_valid() or (
        form.cleaned_data["tenant"] and form.cleaned_data["tenant"] not in slugs
    ):
        return HttpResponseBadRequest("You are not a member of that tenant.")
    request.session["console_tenant"] = form.cleaned_data["tenant"]
    target = form.cleaned_data["next"] or reverse("approvals:queue")
    # Only a path on this site; redirect() would also try a bare word as a view name.
    if not target.startswith("/") or not url_has_allowed_host_and_scheme(
        target, {request.get_host()}, request.is_secure()
    ):
        target = reverse("approvals:queue")
    return HttpResponseRedirect(target)
