"""Resuming: the worker claims a queued run with a lease, checks it, runs the agent with the decisions
applied, and stores the outcome.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from agents import Runner, RunState
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from approvals import transitions
from approvals.audit import chain
from approvals.core import crypto
from approvals.core.canonical import arguments_digest
from approvals.core.redaction import redact
from approvals.decisions.tickets import PendingCall
from approvals.execution import ledger, registry, state
from approvals.execution.sessions import SessionRef, reopen
from approvals.execution.state import PauseError
from approvals.live import hints
from approvals.models import (
    Run,
    RunExecutor,
    RunStatus,
    Ticket,
    TicketStatus,
)
from approvals.runs import checks
from approvals.runs.pause import store_next_pause

logger = logging.getLogger(__name__)


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class ResumeOutcome:
    run_id: int
    status: str
    reason: str = ""
    effects: list[int] = field(default_factory=list)


def _claim(run_id: int, worker_id: str) -> Run | None:
    now = timezone.now()
    lease = timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    with transaction.atomic():
        claimed = transitions.move_runs(
            # A caller's run is resumed by its caller, never by a worker.
            Run.objects.filter(pk=run_id, executor=RunExecutor.CONSOLE).filter(
                Q(status=RunStatus.QUEUED) | Q(status=RunStatus.RESUMING, lease_expires_at__lt=now)
            ),
            to=RunStatus.RESUMING,
            lease_owner=worker_id,
            lease_expires_at=now + lease,
            attempts=F("attempts") + 1,
            updated_at=now,
        )
        if not claimed:
            return None
        run = Run.objects.select_related("tenant").get(pk=run_id)
        chain.append(
            tenant_id=run.tenant_id,
            action="run.resuming",
            actor_name=f"worker {worker_id}",
            run_id=run.pk,
            outcome=RunStatus.RESUMING,
            detail={"attempt": run.attempts},
        )
    hints.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=RunStatus.RESUMING)
    return run


def _owned(run: Run):
    return Run.objects.filter(
        pk=run.pk, status=RunStatus.RESUMING, lease_owner=run.lease_owner, attempts=run.attempts
    )


def _extend_lease(run: Run) -> bool:
    until = timezone.now() + timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    try:
        return bool(_owned(run).update(lease_expires_at=until))
    finally:
        connection.close()


async def _resume_async(run: Run, tickets: list[Ticket], state_json: dict) -> Any:
    spec = registry.get_spec(run.agent_key, run.agent_version)
    agent = spec.build()
    try:
        run_state = await RunState.from_json(
            agent,
            state_json,
            context_deserializer=spec.context_deserializer,
            strict_context=spec.context_deserializer is not None,
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

    stop = asyncio.Event()

    async def heartbeat() -> None:
        interval = max(settings.APPROVALS_LEASE_SECONDS / 3, 0.5)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval)
            except TimeoutError:
                if not await sync_to_async(_extend_lease, thread_sensitive=False)(run):
                    logger.warning("run %s: lease lost while resuming", run.pk)
                    return

    beat = asyncio.create_task(heartbeat())
    try:
        async with reopen(
            SessionRef(run.session_backend, run.session_id, run.session_location)
        ) as session:
            if session is not None:
                # Read before anything runs: an unreachable history must stop the resume
                # before an approved tool executes, not after.
                try:
                    await session.get_items(limit=1)
                except Exception as error:
                    raise checks.Unavailable(
                        f"the conversation session ({run.session_backend}) cannot be read: "
                        f"{_safe_reason(error)}"
                    ) from None
            return await Runner.run(agent, run_state, session=session)
    finally:
        stop.set()
        await beat


def _finish(
    run: Run, *, status: str, reason: str = "", final_output: str = "", action: str
) -> bool:
    """Store a terminal outcome if this attempt still owns the run."""
    now = timezone.now()
    with transaction.atomic():
        stored = transitions.move_runs(
            _owned(run),
            to=status,
            status_reason=reason,
            final_output=final_output,
            lease_owner="",
            lease_expires_at=None,
            updated_at=now,
            finished_at=now,
        )
        if not stored:
            return False
        transitions.supersede_pending(run)
        chain.append(
            tenant_id=run.tenant_id,
            action=action,
            actor_name=f"worker {run.lease_owner}",
            run_id=run.pk,
            outcome=status,
            detail={"reason": reason} if reason else {},
        )
        hints.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=status)
    return True


def _release(run: Run, *, reason: str) -> bool:
    """Give the run back to the queue untouched; the reaper re-enqueues it after a lease."""
    with transaction.atomic():
        released = transitions.move_runs(
            _owned(run),
            to=RunStatus.QUEUED,
            status_reason=reason,
            lease_owner="",
            lease_expires_at=None,
            updated_at=timezone.now(),
        )
        if released:
            chain.append(
                tenant_id=run.tenant_id,
                action="run.retry_later",
                actor_name=f"worker {run.lease_owner}",
                run_id=run.pk,
                outcome=RunStatus.QUEUED,
                detail={"reason": reason},
            )
            hints.notify_on_commit(
                run.tenant_id, "run.changed", run=run.pk, status=RunStatus.QUEUED
            )
    return bool(released)


def _store_new_pause(run: Run, result, spec: registry.AgentSpec) -> bool:
    _, payload = state.serialize_state(
        result.to_state(),
        context=result.context_wrapper.context,
        context_serializer=spec.context_serializer,
    )
    with transaction.atomic():
        locked = _owned(run).select_for_update().first()
        if locked is None:
            return False
        store_next_pause(
            locked,
            payload=payload,
            calls=[PendingCall.of(item) for item in result.interruptions],
            actor_name=f"worker {run.lease_owner}",
        )
    return True


def _safe_reason(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return str(redact(text))[:1000]


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
    run = _claim(run_id, worker_id)
    if run is None:
        current = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
        return ResumeOutcome(run_id, current or "missing", "not claimed: another delivery has it")
    tickets = list(
        Ticket.objects.filter(run=run, generation=run.state_generation)
        .select_related("decided_by", "requested_by")
        .order_by("pk")
    )
    scope = ledger.ResumeScope(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        attempt=f"{worker_id}#{run.attempts}",
        tickets_by_call_id={t.tool_call_id: t.pk for t in tickets},
    )
    try:
        checks.check_before_resume(run, tickets)
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
            result = asyncio.run(_resume_async(run, tickets, state_json))
    except checks.Unavailable as unavailable:
        reason = f"{unavailable}; will try again"
        _release(run, reason=reason)
        return ResumeOutcome(run.pk, RunStatus.QUEUED, reason, scope.effects)
    except checks.Refusal as refusal:
        _finish(run, status=refusal.status, reason=refusal.reason, action="run.refused")
        return ResumeOutcome(run.pk, refusal.status, refusal.reason, scope.effects)
    except Exception as error:
        if scope.in_doubt:
            _finish(
                run, status=RunStatus.NEEDS_ATTENTION, reason=scope.in_doubt, action="run.in_doubt"
            )
            return ResumeOutcome(run.pk, RunStatus.NEEDS_ATTENTION, scope.in_doubt, scope.effects)
        logger.exception("run %s failed while resuming", run.pk)
        reason = _safe_reason(error)
        _finish(run, status=RunStatus.FAILED, reason=reason, action="run.failed")
        return ResumeOutcome(run.pk, RunStatus.FAILED, reason, scope.effects)
    if scope.in_doubt:
        # The SDK may have turned the ledger's error into a tool message; the run still stops.
        _finish(run, status=RunStatus.NEEDS_ATTENTION, reason=scope.in_doubt, action="run.in_doubt")
        return ResumeOutcome(run.pk, RunStatus.NEEDS_ATTENTION, scope.in_doubt, scope.effects)
    if result.interruptions:
        try:
            stored = _store_new_pause(run, result, spec)
        except (PauseError, IntegrityError) as error:
            reason = _safe_reason(error) if isinstance(error, IntegrityError) else str(error)
            _finish(run, status=RunStatus.FAILED, reason=reason, action="run.failed")
            return ResumeOutcome(run.pk, RunStatus.FAILED, reason, scope.effects)
        status = RunStatus.PAUSED
    else:
        output = result.final_output
        text = output if isinstance(output, str) else json.dumps(output, default=str)
        stored = _finish(run, status=RunStatus.COMPLETED, final_output=text, action="run.completed")
        status = RunStatus.COMPLETED
    if not stored:
        logger.warning("run %s: outcome not stored, the lease had passed to another worker", run.pk)
        return ResumeOutcome(run.pk, "lease_lost", "another worker owns the run now", scope.effects)
    return ResumeOutcome(run.pk, status, "", scope.effects)


def resume_by_id(run_id: int) -> str:
    """resume() as the queue's task runs it: the run's id in, its status out."""
    return resume(run_id=run_id).status
