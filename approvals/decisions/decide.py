"""Deciding a ticket: where a person's approval or rejection is checked and recorded."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from approvals import members, transitions
from approvals.audit import chain, changes
from approvals.core import statements
from approvals.decisions import calls, digest, factors, stepup
from approvals.decisions.errors import (
    AlreadyDecidedError,
    AlreadyVotedError,
    FlaggedCallError,
    InvalidDecisionError,
    NotAllowedError,
    SelfApprovalError,
    TicketExpiredError,
    TicketNotFoundError,
)
from approvals.execution import queue
from approvals.live import hints
from approvals.models import (
    ApprovalPolicy,
    Membership,
    Run,
    Ticket,
    TicketStatus,
    TicketVote,
)
from approvals.policies import quorum, scopes

MAX_MESSAGE_CHARS = 2000


def checked_message(message: str) -> str:
    message = (message or "").strip()
    if len(message) > MAX_MESSAGE_CHARS:
        raise InvalidDecisionError(
            f"the message is {len(message)} characters; at most {MAX_MESSAGE_CHARS}"
        )
    return message


def ticket_membership(user, ticket: Ticket, *, known: Membership | None = None) -> Membership:
    """The user's membership of the ticket's tenant; TicketNotFoundError for anyone outside it.

    known: the membership the caller read in this request, taken when it is the user's in the
    ticket's tenant (members.membership_for), so it is not read twice."""
    membership = members.membership_for(user, ticket.tenant_id, known=known)
    if membership is None:
        raise TicketNotFoundError("no such ticket")
    return membership


def check_decider(
    ticket: Ticket, user, *, approve: bool, membership: Membership | None = None
) -> Membership:
    """The user may decide this ticket so; raises a DecisionError otherwise.

    membership: the one the caller already read in this request (see ticket_membership)."""
    membership = ticket_membership(user, ticket, known=membership)
    if not membership.can_decide:
        raise NotAllowedError(f"the {membership.role} role cannot decide tickets")
    # The membership's tenant is the ticket's, read with it.
    factors.check_second_factor(membership, tenant=membership.tenant, user=user)
    if approve and ticket.is_requested_by(user):
        raise SelfApprovalError("you requested this call, so someone else must approve it")
    return membership


def compare_and_set(
    ticket: Ticket,
    *,
    status: str,
    user,
    now,
    message: str = "",
    always: bool = False,
    run: Run | None = None,
) -> str | None:
    """Decide a pending, unexpired ticket, or raise why it cannot be decided any more.

    run: the ticket's run, locked by the caller. When this was the last pending ticket of its
    state, the run moves on in the same statement (execution.queue's rule and status); the
    caller then owes queue.decided(). Returns the status the run moved to, or None.
    """
    values = {
        "ticket": ticket.pk,
        "user": user.pk,
        "now": now,
        "message": message,
    }
    run_to = queue.decided_status(run) if run is not None else None
    if run_to is None:
        # The decision's audit event follows in this transaction.
        won = transitions.move_tickets(
            _deciding(values),
            to=status,
            write=changes.update_queryset_holding_head,
            **_decision(values, always=always),
        )
    else:
        won, moved = _decide_with_run(values, run, status=status, run_to=run_to, always=always)
        # Another ticket of its state still pending: the run stays where it is.
        run_to = run_to if moved else None
    if won:
        return run_to
    refuse_unless_pending(Ticket.objects.select_related("decided_by").get(pk=ticket.pk), now)
    raise TicketExpiredError("this ticket could not be decided; reload it")


def _deciding(values) -> QuerySet[Ticket]:
    """The ticket a decision moves, while it has not expired."""
    return Ticket.objects.filter(pk=values["ticket"], expires_at__gt=values["now"])


def _decision(values, *, always: bool) -> dict[str, Any]:
    """What a decision writes on its ticket, beside the status."""
    return {
        "decided_by_id": values["user"],
        "decided_at": values["now"],
        "decision_message": values["message"],
        "always": always,
        # A decision ends whoever was "on it".
        "claimed_by": None,
        "claimed_at": None,
    }


def _decide_with_run(
    values: dict[str, Any], run: Run, *, status: str, run_to: str, always: bool
) -> tuple[int, int]:
    """compare_and_set()'s move of the ticket and, when nothing else of its state is pending, of
    its run (transitions.decide_ticket, with the chain head's lock): how many of each moved.
    On PostgreSQL its one statement is written once per shape (core.statements); every decision
    sends it with its own ticket, run, person, time and message."""

    def build(values, write=changes.pair_statement):
        return transitions.decide_ticket(
            _deciding(values),
            to=status,
            runs=queue.decided_runs(
                Run(pk=values["run"], state_generation=values["generation"]),
                deciding=values["ticket"],
            ),
            run_to=run_to,
            run_fields={"updated_at": values["now"]},
            write=write,
            **_decision(values, always=always),
        )

    values = {**values, "run": run.pk, "generation": run.state_generation}
    if connection.vendor != "postgresql":
        return build(values, write=changes.update_pair_holding_head)
    key = ("decide.compare_and_set", status, run_to, always)
    return changes.send_pair_holding_head(*statements.statement(key, build, values))


def _run_locked(values) -> QuerySet[Run]:
    """The run of a ticket being decided, locked (decide()'s read, written once per process)."""
    return (
        Run.objects.select_for_update()
        .only("tenant_id", "status", "state_generation", "executor")
        .filter(pk=values["run"])
    )


def _current(values) -> QuerySet[Ticket]:
    """The ticket being decided as it is under its run's lock, with its policy and decider."""
    return Ticket.objects.select_related("policy", "decided_by").filter(pk=values["ticket"])


def decide(
    ticket: Ticket,
    *,
    user,
    approve: bool,
    message: str = "",
    always: bool = False,
    flags_seen: bool = False,
    shown_digest: str | None = None,
    via: dict[str, str] | None = None,
    factor_at: datetime | None = None,
    factor_type: str = "",
    membership: Membership | None = None,
) -> Ticket:
    """Approve or reject a pending ticket under its policy.

    A rejection by anyone who may decide, or the approval that meets the policy's quorum and
    group rules, is one compare-and-set from pending. An approval that does not yet meet them
    is recorded as a vote and the ticket stays pending.
    Side effects, in one transaction: a TicketVote for each approval; the ticket's decision
    when it is final; audit event ticket.vote, ticket.approved (detail: every voter) or
    ticket.rejected; when it was the run's last pending ticket, the run becomes queued and the
    resume task is enqueued (the queue is in the same database, so both commit or neither);
    after commit, live hints, sent together (hints.batched). Raises TicketNotFoundError (not
    the user's tenant), NotAllowedError, SelfApprovalError, DigestMismatchError (the stored
    call is not the one the ticket shows), AlreadyVotedError, TicketExpiredError,
    AlreadyDecidedError or InvalidDecisionError, having written nothing. FlaggedCallError: a flagged call is approved
    only by a person who was shown its flags (flags_seen, from the ticket page).
    shown_digest: a caller that did not see the ticket's page (the API) names the call by the
    digest it was shown; another digest is a DigestMismatchError, for a rejection too.
    via: facts of the channel the decision came through (the API: via=api and the token's
    prefix), recorded in the detail of the decision's audit event.
    factor_at, factor_type: when and how the person last proved a second factor in this
    session (None from a batch or the API). An approval the policy marks for step-up
    (decisions.stepup) raises StepUpRequiredError without a factor that recent; with one, the
    decision's audit event names it (detail step_up) and auth.step_up is recorded beside it.
    membership: the user's membership the caller already read in this request (the page); used
    only when it is the user's in the ticket's tenant, else read again.
    Returns the ticket as decided: a final decision is applied to the given object in memory
    (the values the compare-and-set wrote over the row read under the lock; its run the row
    locked, as queued), a vote re-reads it.
    """
    message = checked_message(message)
    if always and not approve:
        raise InvalidDecisionError("'always' goes with an approval, not a rejection")
    check_decider(ticket, user, approve=approve, membership=membership)
    if shown_digest is not None:
        digest.require_shown(ticket, shown_digest)
    if approve and ticket.is_pending:
        # The digest is checked when shown and again now: what is approved is what will run.
        digest.require_verified(ticket)
        if not flags_seen and calls.is_flagged(ticket):
            raise FlaggedCallError(
                "this call holds invisible characters or look-alike letters; approve it from "
                "its own ticket page, where they are shown"
            )
    # The hints of the decision (the ticket's, the run's) leave together once it commits.
    # Its audit events are written together as the transaction ends (chain.atomic).
    with hints.batched(), chain.atomic():
        # The run's lock orders decisions on one run, so exactly one of them sees "all decided".
        # Only what is read here: the row also holds the state blob, which need not travel.
        run = statements.get("decide.run_lock", _run_locked, {"run": ticket.run_id})
        now = timezone.now()
        # Read under the lock: a policy change or an escalation may have moved the ticket.
        current = statements.get("decide.current", _current, {"ticket": ticket.pk})
        refuse_unless_pending(current, now)
        policy = scopes.policy_of(current)
        refusal = quorum.refusal_for(user, current, policy)
        if refusal:
            raise NotAllowedError(refusal)
        if always and not quorum.allows_always(policy):
            raise InvalidDecisionError(
                "'always' is not offered under this ticket's policy: it asks for more than one "
                "person or rejects some arguments, so each later call needs its own approval"
            )
        step_up: dict[str, str] = {}
        if approve:
            # Under the lock, with the policy in force now: a policy saved meanwhile counts.
            minutes = stepup.require_fresh_factor(current, policy, factor_at=factor_at, now=now)
            if minutes is not None and factor_at is not None:
                step_up = {"type": factor_type or "mfa", "at": factor_at.isoformat()}
                record_step_up(ticket, user=user, factor_type=step_up["type"])
            progress = vote(current, policy, user=user, now=now)
            if not progress.met:
                chain.append_for_ticket(
                    ticket,
                    action="ticket.vote",
                    actor=user,
                    outcome="pending",
                    detail={
                        "progress": progress.describe(),
                        "policy": policy.version,
                        **(via or {}),
                        **({"step_up": step_up} if step_up else {}),
                    },
                )
                hints.notify_on_commit(
                    ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=run.pk
                )
                ticket.refresh_from_db()
                return ticket
        status = TicketStatus.APPROVED if approve else TicketStatus.REJECTED
        run_to = compare_and_set(
            ticket, status=status, user=user, now=now, message=message, always=always, run=run
        )
        detail: dict[str, Any] = {"always": always, "message": message} if message or always else {}
        if approve and (progress.count > 1 or policy.group_rules):
            detail["voters"] = progress.voters
            detail["policy"] = policy.version
        detail.update(via or {})
        if step_up:
            detail["step_up"] = step_up
        chain.append_for_ticket(
            ticket,
            action="ticket.approved" if approve else "ticket.rejected",
            actor=user,
            outcome=status,
            detail=detail,
        )
        hints.notify_on_commit(
            ticket.tenant_id, "ticket.decided", ticket=ticket.pk, run=run.pk, status=status
        )
        if run_to is not None:
            # The last pending ticket of its state: the run moved with the decision.
            queue.decided(run, to=run_to, actor=user)
    # What the rows hold now, without reading them again: the ticket as read under the lock,
    # then what the compare-and-set wrote; its run as locked, then queued (the rest of the run
    # row is read when asked for).
    _apply_decision(
        ticket, current, run, status=status, user=user, now=now, message=message, always=always
    )
    return ticket


def _apply_decision(
    ticket: Ticket,
    current: Ticket,
    run: Run,
    *,
    status: str,
    user,
    now,
    message: str,
    always: bool,
) -> None:
    for field in Ticket._meta.concrete_fields:
        if not field.is_relation:
            setattr(ticket, field.attname, getattr(current, field.attname))
    ticket.run = run
    ticket.policy = current.policy
    ticket.claimed_by = None
    # The values compare_and_set wrote.
    ticket.status = status
    ticket.decided_by = user
    ticket.decided_at = now
    ticket.decision_message = message
    ticket.always = always
    ticket.claimed_at = None


def record_step_up(ticket: Ticket, *, user, factor_type: str) -> None:
    """The second factor an approval was given with, in the ticket's tenant (its own event, so
    the sign-in history shows every factor proven and what for)."""
    chain.append(
        tenant_id=ticket.tenant_id,
        action="auth.step_up",
        actor=user,
        ticket_id=ticket.pk,
        outcome="confirmed",
        detail={"type": factor_type, "purpose": f"to approve ticket #{ticket.pk}"},
    )


def refuse_unless_pending(current: Ticket, now) -> None:
    if current.status == TicketStatus.PENDING and current.expires_at > now:
        return
    if current.status in (TicketStatus.PENDING, TicketStatus.EXPIRED):
        raise TicketExpiredError(
            f"this ticket expired at {current.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
            "the agent must ask again"
        )
    if current.status == TicketStatus.SUPERSEDED:
        raise TicketExpiredError("this ticket was withdrawn because its run ended")
    raise AlreadyDecidedError(current)


def _valid_votes(values) -> QuerySet[TicketVote]:
    return TicketVote.objects.filter(
        ticket_id=values["ticket"], invalidated_at__isnull=True
    ).select_related("user")


def vote(ticket: Ticket, policy: ApprovalPolicy, *, user, now) -> quorum.Progress:
    """Record the user's approval as a vote and return where the quorum stands."""
    votes = statements.objects("decide.votes", _valid_votes, {"ticket": ticket.pk})
    mine = next((v for v in votes if v.user_id == user.pk), None)
    if mine is not None:
        progress = quorum.progress(ticket, policy, votes)
        raise AlreadyVotedError(
            f"you already approved this ticket at {mine.created_at:%Y-%m-%d %H:%M:%S} UTC; "
            f"it needs another person ({progress.describe()})"
        )
    vote = TicketVote.objects.create(
        ticket=ticket,
        user=user,
        policy=None if policy.is_builtin else policy,
        created_at=now,
        groups=quorum.voter_groups(user, ticket, policy),
    )
    return quorum.progress(ticket, policy, [*votes, vote])


def progress_of(ticket: Ticket) -> quorum.Progress:
    """Where the ticket's approvals stand against its policy, as the page and the batch show it."""
    return quorum.progress(
        ticket, scopes.policy_of(ticket), list(ticket.votes.select_related("user"))
    )
