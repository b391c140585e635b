"""Expiry actions: what a policy does with a ticket nobody decided in time."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction

from approvals import transitions
from approvals.audit import chain
from approvals.decisions import decide
from approvals.execution import queue
from approvals.live import hints
from approvals.models import (
    ApprovalPolicy,
    ExpiryAction,
    Run,
    RunStatus,
    Ticket,
    TicketStatus,
)
from approvals.policies import scopes

EXPIRY_MESSAGE = (
    "Nobody approved this {tool} call before its approval expired at {when} UTC, so it was "
    "rejected and did not run. Do not retry it without asking the user."
)


def reject_on_expiry(ticket: Ticket, policy: ApprovalPolicy, *, now) -> None:
    """The policy's expiry action "reject": the model is told, and the run can go on."""
    message = (policy.expiry_message or "").strip() or EXPIRY_MESSAGE.format(
        tool=ticket.tool_name, when=f"{ticket.expires_at:%Y-%m-%d %H:%M:%S}"
    )
    transitions.move_tickets(
        Ticket.objects.filter(pk=ticket.pk),
        to=TicketStatus.REJECTED,
        decided_at=now,
        decision_message=message[: decide.MAX_MESSAGE_CHARS],
        decision_source="expiry",
        decision_reason=f"not decided by {ticket.expires_at:%Y-%m-%d %H:%M:%S} UTC",
    )
    chain.append_for_ticket(
        ticket,
        action="ticket.rejected",
        actor_name="reaper",
        outcome=TicketStatus.REJECTED,
        detail={
            "by": "expiry",
            "message": message[: decide.MAX_MESSAGE_CHARS],
            "policy": policy.version,
        },
    )
    hints.notify_on_commit(
        ticket.tenant_id,
        "ticket.decided",
        ticket=ticket.pk,
        run=ticket.run_id,
        status=TicketStatus.REJECTED,
    )


def escalate(ticket: Ticket, policy: ApprovalPolicy, *, now) -> None:
    """The policy's expiry action "escalate": the escalation group decides, with a new window."""
    expires_at = now + scopes.escalation_window(policy)
    Ticket.objects.filter(pk=ticket.pk, status=TicketStatus.PENDING).update(
        # Another group decides now: whoever was "on it" is not any more.
        escalated_at=now,
        expires_at=expires_at,
        claimed_by=None,
        claimed_at=None,
    )
    chain.append_for_ticket(
        ticket,
        action="ticket.escalated",
        actor_name="reaper",
        outcome=TicketStatus.PENDING,
        detail={
            "group": policy.escalation_group,
            "expires_at": expires_at.isoformat(),
            "policy": policy.version,
        },
    )
    hints.notify_on_commit(ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=ticket.run_id)


@dataclass
class ExpiryReport:
    escalated: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    run_expired: bool = False
    run_queued: bool = False
    # A caller's run is not queued: once decided, it waits for its caller.
    run_awaiting_caller: bool = False


def expire_run_tickets(run_id: int, *, now) -> ExpiryReport:
    """Apply the expiry action of each of the run's pending tickets past their expiry.

    "expire": the ticket expires and its paused run expires with it (its other pending tickets
    are superseded); "reject": reject_on_expiry(); "escalate": escalate(), and a second lapse
    (or nowhere to escalate to) rejects. When nothing of the run is left pending, the run is
    queued (a caller's run waits for its caller instead: execution.queue), as for a decision. Side effects, in one transaction under the run's lock: the tickets' and run's
    statuses, audit events ticket.expired / run.expired and those of the actions, a resume task
    when queued; after commit, live hints.
    """
    report = ExpiryReport()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        expiring = list(
            Ticket.objects.filter(
                run=run, status=TicketStatus.PENDING, expires_at__lte=now
            ).select_related("policy")
        )
        if not expiring:
            return report
        to_expire = []
        for ticket in expiring:
            policy = scopes.policy_of(ticket)
            action = policy.on_expiry
            if action == ExpiryAction.ESCALATE and (
                ticket.escalated_at or not policy.escalation_group
            ):
                # A second lapse (or nowhere to escalate to) ends in a rejection.
                action = ExpiryAction.REJECT
            if action == ExpiryAction.ESCALATE:
                escalate(ticket, policy, now=now)
                report.escalated.append(ticket.pk)
            elif action == ExpiryAction.REJECT:
                reject_on_expiry(ticket, policy, now=now)
                report.rejected.append(ticket.pk)
            else:
                to_expire.append(ticket)
        if to_expire:
            transitions.move_tickets(
                Ticket.objects.filter(pk__in=[t.pk for t in to_expire]), to=TicketStatus.EXPIRED
            )
        for ticket in to_expire:
            chain.append_for_ticket(
                ticket,
                action="ticket.expired",
                actor_name="reaper",
                outcome=TicketStatus.EXPIRED,
            )
        if to_expire and run.status == RunStatus.PAUSED:
            transitions.move_runs(
                Run.objects.filter(pk=run.pk),
                to=RunStatus.EXPIRED,
                status_reason="a ticket expired before anyone decided it",
                updated_at=now,
                finished_at=now,
            )
            transitions.supersede_pending(run)
            chain.append(
                tenant_id=run.tenant_id,
                action="run.expired",
                actor_name="reaper",
                run_id=run.pk,
                outcome=RunStatus.EXPIRED,
            )
            report.run_expired = True
        elif queue.queue_if_decided(run, now=now, actor_name="reaper"):
            report.run_queued = run.status == RunStatus.QUEUED
            report.run_awaiting_caller = run.status == RunStatus.AWAITING_CALLER
        hints.notify_on_commit(
            run.tenant_id,
            "run.changed",
            run=run.pk,
            status=RunStatus.EXPIRED if report.run_expired else run.status,
        )
    return report
