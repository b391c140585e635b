"""Opening tickets: one per interruption of a paused run, offered at once to the automatic deciders."""

from __future__ import annotations

from approvals.audit import chain
from approvals.core.canonical import arguments_digest, canonical_arguments
from approvals.decisions import automatic
from approvals.live import hints
from approvals.models import (
    Run,
    Ticket,
)
from approvals.policies import scopes


def open_tickets(run: Run, interruptions, *, requested_by, now, resumed: bool) -> list[Ticket]:
    tickets = []
    for item in interruptions:
        raw = item.arguments
        tool_name = item.qualified_name or item.name or ""
        policy = scopes.resolve(run.tenant_id, run.agent_key, tool_name)
        tickets.append(
            Ticket.objects.create(
                run=run,
                tenant_id=run.tenant_id,
                generation=run.state_generation,
                agent_name=getattr(item.agent, "name", "") or "",
                tool_name=tool_name,
                tool_call_id=item.call_id or "",
                arguments_json=canonical_arguments(raw),
                arguments_digest=arguments_digest(raw),
                requested_by=requested_by,
                created_at=now,
                expires_at=now + scopes.time_to_live(policy),
                policy=None if policy.is_builtin else policy,
            )
        )
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
    # Only a resumed run can meet a pre-authorisation: one belongs to a ticket of its run.
    automatic.decide_automatically(run, tickets, now=now, preauthorised=resumed)
    return tickets
