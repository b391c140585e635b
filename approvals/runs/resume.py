"""Resuming: the worker claims a queued run with a lease (runs.lease, the claim a start uses too),
checks it, runs the agent with the decisions applied, and stores the outcome.
"""

from __future__ import annotations

from typing import Any

from agents import RunState

from approvals.core import crypto
from approvals.core.canonical import arguments_digest
from approvals.decisions.tickets import PendingCall
from approvals.execution import ledger, queue, registry, state
from approvals.models import (
    Run,
    Ticket,
    TicketStatus,
)
from approvals.runs import checks, lease
from approvals.runs.pause import store_next_pause

# The names the rest of the console and its tests know the resume's outcome by.
ResumeOutcome = lease.WorkOutcome
worker_identity = lease.worker_identity


async def _resume_async(run: Run, tickets: list[Ticket], state_json: dict) -> Any:
    spec = registry.get_spec(run.agent_key, run.agent_version)
    agent = spec.build()
    try:
        run_state = await RunState.from_json(
            agent,
            state_json,
            context_deserializer=spec.context_deserializer,
            # A context only a deserializer rebuilds whole (a serializer left parts of it out) is
            # refused when the deployed agent has none, never run with what was left of it.
            strict_context=True,
        )
    except Exception as error:
        raise checks.Refusal(
            f"{checks.REGENERATE}: the stored state cannot be loaded by this code ({error})"
        ) from None

    by_call_id = {t.tool_call_id: t for t in tickets}
    interruptions = run_state.get_interruptions()
    seen = set()
    for item in interruptions:
        ticket = by_call_id.get(item.call_id or "")
        if ticket is None:
            raise checks.Refusal(f"the state asks about call {item.call_id!r}, which has no ticket")
        seen.add(ticket.tool_call_id)
        available = {getattr(tool, "name", None) for tool in getattr(item.agent, "tools", [])}
        if item.name not in available:
            raise checks.Refusal(
                f"{checks.REGENERATE}: tool {item.name!r} is not available to agent "
                f"{getattr(item.agent, 'name', '?')!r} in this version; nothing was run"
            )
        if ticket.tool_name not in {item.name, item.qualified_name}:
            raise checks.Refusal(
                f"ticket {ticket.pk} was shown as a call of {ticket.tool_name}, but the stored "
                f"state calls {item.qualified_name or item.name}; nothing was run"
            )
        if arguments_digest(item.arguments) != ticket.arguments_digest:
            raise checks.Refusal(
                f"the arguments of ticket {ticket.pk} ({ticket.tool_name}) differ from those that "
                "were shown and decided; nothing was run"
            )
        if ticket.status == TicketStatus.APPROVED:
            run_state.approve(item, always_approve=ticket.always)
        else:
            run_state.reject(item, rejection_message=ticket.decision_message or None)
    missing = set(by_call_id) - seen
    if missing:
        raise checks.Refusal(f"tickets for calls {sorted(missing)} are not in the stored state")

    return await lease.run_agent(run, agent, run_state)


def _store_new_pause(run: Run, result, spec: registry.AgentSpec) -> None:
    _, payload = state.serialize_state(
        result.to_state(),
        context=result.context_wrapper.context,
        context_serializer=spec.context_serializer,
    )
    store_next_pause(
        run,
        payload=payload,
        calls=[PendingCall.of(item) for item in result.interruptions],
        actor_name=f"worker {run.lease_owner}",
    )


def resume(*, run_id: int, worker_id: str | None = None) -> ResumeOutcome:
    """Resume a queued run whose tickets are all decided, at most once at a time.

    Side effects: claims the run with a lease (a second delivery or worker finds it claimed and
    does nothing); checks expiry, approvers' permissions, the agent version and SDK schema,
    decrypts, re-checks every argument digest; runs the agent with the decisions applied and the
    original session (side-effecting tools go through the ledger); stores the outcome:
    completed, paused again with new tickets, failed, needs_attention or expired; audit events
    and live hints for each step.
    """
    worker_id = worker_id or worker_identity()
    run = lease.claim(run_id, worker_id, lease.RESUME)
    if run is None:
        return lease.not_claimed(run_id)
    tickets, votes_of = checks.decided_tickets(run)
    scope = ledger.ResumeScope(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        attempt=f"{worker_id}#{run.attempts}",
        tickets_by_call_id={t.tool_call_id: t.pk for t in tickets},
    )
    outcome = _attempt(run, tickets, votes_of, scope)
    outcome.decisions = queue.decision_words(tickets)
    return outcome


def _attempt(
    run: Run, tickets: list[Ticket], votes_of: dict, scope: ledger.ResumeScope
) -> ResumeOutcome:
    try:
        checks.check_before_resume(run, tickets, votes_of)
        try:
            state_json = state.open_state(run)
        except crypto.CryptoError as error:
            raise checks.Refusal(
                f"the stored state was refused: {error}; nothing was run"
            ) from None
        if str(state_json.get("$schemaVersion")) != run.schema_version:
            raise checks.Refusal("the stored state does not match its run record; nothing was run")
        spec = registry.get_spec(run.agent_key, run.agent_version)
        with ledger.resume_scope(scope):
            result = lease.run_async(_resume_async(run, tickets, state_json))
    except Exception as error:
        return lease.stopped(run, scope, error)
    return lease.settled(
        run, scope, result, store_pause=lambda locked: _store_new_pause(locked, result, spec)
    )
