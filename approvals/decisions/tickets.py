"""Opening tickets: one per interruption of a paused run, offered at once to the automatic deciders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approvals import transitions
from approvals.audit import chain
from approvals.core import statements
from approvals.core.canonical import arguments_digest, canonical_arguments
from approvals.decisions import automatic, calls, decide
from approvals.execution import registry
from approvals.live import hints
from approvals.models import Run, Ticket, TicketStatus
from approvals.policies import scopes


@dataclass(frozen=True)
class PendingCall:
    """One tool call waiting for approval, as its ticket reads it.

    Built from an SDK interruption (a ToolApprovalItem: PendingCall.of) when the console holds
    the run, or from the interruptions of a state's JSON when its caller does
    (runs.remote), so both open tickets the same way.
    """

    name: str
    qualified_name: str
    arguments: str | None
    call_id: str
    agent_name: str

    @classmethod
    def of(cls, item: Any) -> PendingCall:
        """The call of an SDK interruption (anything with ToolApprovalItem's attributes)."""
        if isinstance(item, PendingCall):
            return item
        return cls(
            name=item.name or "",
            qualified_name=item.qualified_name or "",
            arguments=item.arguments,
            call_id=item.call_id or "",
            agent_name=getattr(item.agent, "name", "") or "",
        )


def open_tickets(run: Run, interruptions, *, requested_by, now, resumed: bool) -> list[Ticket]:
    """One ticket per interruption (SDK interruptions or PendingCalls), in the caller's
    transaction (which holds the run's row).

    A malformed call (decisions.calls) is rejected at once with the reasons for the model, and
    audited as ticket.malformed; the others go to the automatic deciders. When nothing of the
    run is left pending, the run is queued (or, for a caller's run, waits for its caller:
    execution.queue). Side effects: the tickets, audit events
    ticket.created (and ticket.malformed), live hints after commit, and what the automatic
    deciders write.
    """
    pending = [PendingCall.of(interruption) for interruption in interruptions]
    names = [call.qualified_name or call.name for call in pending]
    # One query for every call's policy, one statement for every ticket.
    policies = scopes.resolve_many(run.tenant_id, run.agent_key, names)
    new = []
    for call, tool_name in zip(pending, names, strict=True):
        policy = policies[tool_name]
        new.append(
            Ticket(
                run=run,
                tenant_id=run.tenant_id,
                generation=run.state_generation,
                agent_name=call.agent_name,
                tool_name=tool_name,
                tool_call_id=call.call_id,
                arguments_json=canonical_arguments(call.arguments),
                arguments_digest=arguments_digest(call.arguments),
                requested_by=requested_by,
                created_at=now,
                expires_at=now + scopes.time_to_live(policy),
                policy=None if policy.is_builtin else policy,
            )
        )
    tickets = statements.bulk_create("tickets.open_tickets", new)
    malformed: dict[int, list[str]] = {}
    for call, ticket in zip(pending, tickets, strict=True):
        schema = registry.tool_schema(run.agent_key, run.agent_version, ticket.tool_name)
        reasons = calls.malformed_reasons(call.arguments, schema)
        if reasons:
            malformed[ticket.pk] = reasons
    for ticket in tickets:
        chain.append_for_ticket(
            ticket,
            action="ticket.created",
            actor=requested_by,
            outcome="pending",
            detail={
                "expires_at": ticket.expires_at.isoformat(),
                "call_id": ticket.tool_call_id,
                **({"policy": ticket.policy.version} if ticket.policy_id else {}),
            },
        )
        hints.notify_on_commit(run.tenant_id, "ticket.created", ticket=ticket.pk, run=run.pk)
    for ticket in tickets:
        if ticket.pk in malformed:
            _reject_malformed(ticket, malformed[ticket.pk], now=now)
    # Only a resumed run can meet a pre-authorisation: one belongs to a ticket of its run.
    automatic.decide_automatically(
        run,
        [t for t in tickets if t.pk not in malformed],
        now=now,
        preauthorised=resumed,
        queue_anyway=bool(malformed),
    )
    return tickets


def _reject_malformed(ticket: Ticket, reasons: list[str], *, now) -> None:
    message = calls.malformed_message(ticket.tool_name, reasons)[: decide.MAX_MESSAGE_CHARS]
    transitions.move_tickets(
        Ticket.objects.filter(pk=ticket.pk),
        to=TicketStatus.REJECTED,
        decided_at=now,
        decision_message=message,
        decision_source="malformed",
        decision_reason="; ".join(reasons)[:1000],
    )
    ticket.refresh_from_db()
    chain.append_for_ticket(
        ticket,
        action="ticket.malformed",
        actor_name="console",
        outcome=TicketStatus.REJECTED,
        detail={"reasons": reasons},
    )
    hints.notify_on_commit(
        ticket.tenant_id,
        "ticket.decided",
        ticket=ticket.pk,
        run=ticket.run_id,
        status=TicketStatus.REJECTED,
    )
