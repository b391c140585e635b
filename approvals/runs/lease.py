"""The worker's hold on a run: one lease claim, heartbeat, outcome and release for both kinds of
work the console's worker does on a run, starting it (runs.start) and resuming it (runs.resume).

A claim is one conditional UPDATE (transitions.move_runs) that sets the lease owner, its expiry
and attempts + 1, so a second delivery of the task, or a second worker, finds the run claimed
and does nothing; a lease that lapsed (its worker died) may be claimed again. Every later write
of the attempt is conditional on still owning the run (`owned`): an attempt whose lease passed
to another worker stores nothing.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from agents import Runner
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from approvals import transitions
from approvals.audit import alone, chain, changes
from approvals.core import statements
from approvals.core.redaction import redact
from approvals.execution import ledger, workers
from approvals.execution.sessions import SessionRef, reopen
from approvals.execution.state import PauseError
from approvals.live import hints
from approvals.models import Run, RunExecutor, RunStatus
from approvals.runs import checks

logger = logging.getLogger(__name__)


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Work:
    """One kind of work on a run: the rows it may claim, the status it holds them in, where a
    release gives them back, and its audit action."""

    name: str
    waiting: str
    holding: str
    action: str


# A queued run is resumed; a lapsed resume is claimed again.
RESUME = Work("resume", waiting=RunStatus.QUEUED, holding=RunStatus.RESUMING, action="run.resuming")
# A starting run without a lease is started; a lapsed start is claimed again. It stays starting
# while held: the lease owner says whether a worker has it.
START = Work("start", waiting=RunStatus.STARTING, holding=RunStatus.STARTING, action="run.starting")


@dataclass
class WorkOutcome:
    run_id: int
    status: str
    reason: str = ""
    effects: list[int] = field(default_factory=list)
    # The decisions the attempt ran with, as the worker's log line says them (None: not known).
    decisions: list[str] | None = None


def claim(run_id: int, worker_id: str, work: Work) -> Run | None:
    """Take the run for this worker, or None when it is not waiting for this work (another
    delivery has it, it moved on, or it is a caller's run).

    Side effects, committed together: the lease (owner, expiry, attempts + 1) and the work's
    audit event with the attempt; a live hint after commit. On PostgreSQL, when the task's claim
    read the run's tenant and attempts (workers.RunHint) and this process has seen that
    tenant's audit head, one statement committed alone (_claim_alone); else a transaction of
    two. The lease's statements are written once per process and kind of work
    (core.statements).
    """
    now = timezone.now()
    values = {
        "run": run_id,
        "worker": worker_id,
        "now": now,
        "until": now + timedelta(seconds=settings.APPROVALS_LEASE_SECONDS),
    }
    run = None
    if connection.vendor == "postgresql":
        run = _claim_alone(values, work, workers.run_hint(run_id))
    if run is None:
        run = _claim_in_transaction(values, work)
    if run is None:
        return None
    hints.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=work.holding)
    return run


def _claim_event(values: dict[str, Any], work: Work, tenant_id: int, attempt: int) -> dict:
    """The claim's audit event's fields: the work's action, by this worker, with the attempt."""
    return {
        "tenant_id": tenant_id,
        "action": work.action,
        "actor_name": f"worker {values['worker']}",
        "run_id": values["run"],
        "outcome": work.holding,
        "detail": {"attempt": attempt},
    }


def _claim_in_transaction(values: dict[str, Any], work: Work) -> Run | None:
    """The claim and its event in a transaction: the claim's UPDATE also locks the tenant's
    head (changes.update_holding_head), and the event, linked to it, is one more statement."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            sql, params = statements.statement(
                ("lease.claim", work.name), lambda v: _claiming(v, work), values
            )
        else:
            sql, params = _claiming(values, work)
        run = transitions.moved_run(
            sql, params, to=work.holding, write=changes.update_holding_head, using=connection.alias
        )
        if run is not None:
            chain.append(**_claim_event(values, work, run.tenant_id, run.attempts))
    return run


def _claim_alone(values: dict[str, Any], work: Work, hint: workers.RunHint | None) -> Run | None:
    """The claim and its event in one statement committed alone (alone.update_alone), the
    event linked beforehand, when the hint is right: the run's tenant, and its attempts (the
    claim's UPDATE also requires them, so the attempt the event records is the one it takes).
    None when it was not sent or changed nothing: a wrong hint, a run not waiting for this
    work, a head missed twice; the transaction then claims it, or says why not."""
    if hint is None:
        return None
    rows = alone.update_alone(
        *statements.statement(
            ("lease.claim", work.name, "alone"),
            lambda v: _claiming(v, work, hint=v),
            {**values, "tenant": hint.tenant_id, "attempts": hint.attempts},
        ),
        returning=statements.returning(Run, using=connection.alias),
        events=[chain.new_event(**_claim_event(values, work, hint.tenant_id, hint.attempts + 1))],
        using=connection.alias,
        # Read with the task's claim a moment ago: fresher than this process's last sighting,
        # which another worker's appends since would have made a miss.
        guess=hint.head,
    )
    if not rows:
        return None
    (row,) = rows
    return statements.row_object(Run, row, using=connection.alias)


def _claiming(values: dict[str, Any], work: Work, *, hint=None) -> tuple[str, tuple]:
    """The claim's UPDATE of the run: waiting for this work, or held with a lapsed lease.
    hint: values with the "tenant" and "attempts" _claim_alone guesses: also only a run of that
    tenant with those attempts so far, while the tenant's audit head is as guessed
    (alone.update_alone's)."""
    waiting = Q(status=work.waiting)
    if work.waiting == work.holding:
        waiting &= Q(lease_owner="")
    runs = Run.objects.filter(pk=values["run"], executor=RunExecutor.CONSOLE).filter(
        waiting | Q(status=work.holding, lease_expires_at__lt=values["now"])
    )
    if hint is not None:
        runs = runs.filter(
            changes.HEAD_AS_GUESSED, tenant_id=hint["tenant"], attempts=hint["attempts"]
        )
    return transitions.move_run_statement(
        # A caller's run is resumed by its caller, never by a worker.
        runs,
        to=work.holding,
        lease_owner=values["worker"],
        lease_expires_at=values["until"],
        attempts=F("attempts") + 1,
        updated_at=values["now"],
    )


def not_claimed(run_id: int) -> WorkOutcome:
    current = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
    return WorkOutcome(run_id, current or "missing", "not claimed: another delivery has it")


def owned(run: Run):
    """The run's row as long as this attempt still holds it."""
    return _held(run.pk, run.status, run.lease_owner, run.attempts)


def _held(pk: int, status: str, owner: str, attempts: int):
    return Run.objects.filter(pk=pk, status=status, lease_owner=owner, attempts=attempts)


def _extend_lease(run: Run) -> bool:
    until = timezone.now() + timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    try:
        return bool(owned(run).update(lease_expires_at=until))
    finally:
        connection.close()


class _Loops(threading.local):
    loop: asyncio.AbstractEventLoop | None = None
    # The process that made the loop: a forked child inherits the loop and its executor's
    # bookkeeping but none of its threads, so work handed to them would never run.
    pid: int = 0


_loops = _Loops()
# Threads for the agents' synchronous tools and the lease heartbeat, kept for the process.
TOOL_THREADS = 8


def run_async(coro: Any) -> Any:
    """Run a coroutine to its end on this thread's own long-lived event loop.

    asyncio.run() would make a new loop and a new pool of tool threads for every resume, and
    join them at its end. Here the loop and its default executor live as long as the thread
    (the worker's), so a resume only pays for its own work. As asyncio.run() does, tasks the
    coroutine left running are cancelled and waited for before this returns, so nothing of one
    run outlives it. Raises what the coroutine raises; RuntimeError inside a running loop. A
    process forked after the loop was made makes its own (the parent's is left alone: closing
    it would wait for threads the child does not have).
    """
    loop = _loops.loop
    if loop is None or loop.is_closed() or _loops.pid != os.getpid():
        loop = asyncio.new_event_loop()
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=TOOL_THREADS, thread_name_prefix="agent-tools")
        )
        _loops.loop, _loops.pid = loop, os.getpid()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)
    finally:
        left = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        asyncio.set_event_loop(None)


def safe_reason(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return str(redact(text))[:1000]


async def run_agent(run: Run, agent: Any, run_input: Any, *, context: Any = None) -> Any:
    """Runner.run(agent, run_input) with the run's own session, renewing the lease while it runs.

    run_input is a prompt or input items (a start) or a RunState with the decisions applied (a
    resume). Raises checks.Unavailable when the session cannot be read: nothing ran then.
    """
    stop = asyncio.Event()

    async def heartbeat() -> None:
        interval = max(settings.APPROVALS_LEASE_SECONDS / 3, 0.5)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval)
            except TimeoutError:
                if not await sync_to_async(_extend_lease, thread_sensitive=False)(run):
                    logger.warning("run %s: lease lost while the agent ran", run.pk)
                    return

    beat = asyncio.create_task(heartbeat())
    try:
        async with reopen(
            SessionRef(run.session_backend, run.session_id, run.session_location)
        ) as session:
            if session is not None:
                # Read before anything runs: an unreachable history must stop the run before a
                # tool executes, not after.
                try:
                    await session.get_items(limit=1)
                except Exception as error:
                    raise checks.Unavailable(
                        f"the conversation session ({run.session_backend}) cannot be read: "
                        f"{safe_reason(error)}"
                    ) from None
            return await Runner.run(agent, run_input, context=context, session=session)
    finally:
        stop.set()
        await beat


def finish(run: Run, *, status: str, reason: str = "", final_output: str = "", action: str) -> bool:
    """Store a terminal outcome if this attempt still owns the run."""
    values = {
        "run": run.pk,
        "owner": run.lease_owner,
        "attempts": run.attempts,
        "reason": reason,
        "output": final_output,
        "now": timezone.now(),
    }
    # Written with the end it records, and only if the run ended.
    ended = chain.new_event(
        tenant_id=run.tenant_id,
        action=action,
        actor_name=f"worker {run.lease_owner}",
        run_id=run.pk,
        outcome=status,
        detail={"reason": reason} if reason else {},
    )
    # The run, its tickets still pending, then the tenant's audit head (the order a decision
    # locks them in) and the event, committed together: on PostgreSQL one statement of its own
    # when the head is where this process last saw it (else a transaction of two), written once
    # per process and shape.
    if connection.vendor == "postgresql":
        sql, params = statements.statement(
            ("lease.finish", run.status, status),
            lambda v: _ending(
                v, run.status, status, write=functools.partial(changes.pair_statement, guarded=True)
            ),
            values,
        )
        stored, _ = alone.send_pair_with_events(sql, params, events=[ended])
    else:
        with transaction.atomic():
            stored, _ = _ending(
                values,
                run.status,
                status,
                write=functools.partial(changes.update_pair_holding_head, events=[ended]),
            )
    if not stored:
        return False
    hints.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=status)
    return True


def _ending(values: dict[str, Any], holding: str, status: str, *, write) -> Any:
    """finish()'s end of the run (transitions.end_run_pair) as `write` takes it."""
    return transitions.end_run_pair(
        Run(pk=values["run"]),
        _held(values["run"], holding, values["owner"], values["attempts"]),
        to=status,
        write=write,
        status_reason=values["reason"],
        final_output=values["output"],
        lease_owner="",
        lease_expires_at=None,
        updated_at=values["now"],
        finished_at=values["now"],
    )


def release(run: Run, *, reason: str) -> bool:
    """Give the run back untouched: a resume to queued, a start to starting without a lease;
    the reaper gives it its task again after a lease."""
    back = RunStatus.QUEUED if run.status == RunStatus.RESUMING else RunStatus.STARTING
    with transaction.atomic():
        released = transitions.move_runs(
            owned(run),
            to=back,
            write=changes.update_queryset_holding_head,
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
                outcome=back,
                detail={"reason": reason},
            )
            hints.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=back)
    return bool(released)


def stopped(run: Run, scope: ledger.ResumeScope, error: Exception) -> WorkOutcome:
    """The outcome of an attempt that raised before the agent finished: retry later (something
    was unreachable), refused (a check), in doubt (an effect's outcome is unknown) or failed."""
    if isinstance(error, checks.Unavailable):
        reason = f"{error}; will try again"
        back = RunStatus.QUEUED if run.status == RunStatus.RESUMING else RunStatus.STARTING
        release(run, reason=reason)
        return WorkOutcome(run.pk, back, reason, scope.effects)
    if isinstance(error, checks.Refusal):
        finish(run, status=error.status, reason=error.reason, action="run.refused")
        return WorkOutcome(run.pk, error.status, error.reason, scope.effects)
    if scope.in_doubt:
        finish(run, status=RunStatus.NEEDS_ATTENTION, reason=scope.in_doubt, action="run.in_doubt")
        return WorkOutcome(run.pk, RunStatus.NEEDS_ATTENTION, scope.in_doubt, scope.effects)
    logger.error("run %s failed", run.pk, exc_info=error)
    reason = safe_reason(error)
    finish(run, status=RunStatus.FAILED, reason=reason, action="run.failed")
    return WorkOutcome(run.pk, RunStatus.FAILED, reason, scope.effects)


def settled(run: Run, scope: ledger.ResumeScope, result: Any, *, store_pause) -> WorkOutcome:
    """Store what the agent did: paused again (store_pause(locked_run) in a transaction that
    holds the owned row locked), completed with its final output, or in doubt."""
    if scope.in_doubt:
        # The SDK may have turned the ledger's error into a tool message; the run still stops.
        finish(run, status=RunStatus.NEEDS_ATTENTION, reason=scope.in_doubt, action="run.in_doubt")
        return WorkOutcome(run.pk, RunStatus.NEEDS_ATTENTION, scope.in_doubt, scope.effects)
    if result.interruptions:
        try:
            with chain.atomic():
                locked = owned(run).select_for_update().first()
                stored = locked is not None
                if stored:
                    store_pause(locked)
        except (PauseError, IntegrityError) as error:
            reason = safe_reason(error) if isinstance(error, IntegrityError) else str(error)
            finish(run, status=RunStatus.FAILED, reason=reason, action="run.failed")
            return WorkOutcome(run.pk, RunStatus.FAILED, reason, scope.effects)
        status = RunStatus.PAUSED
    else:
        output = result.final_output
        text = output if isinstance(output, str) else json.dumps(output, default=str)
        stored = finish(run, status=RunStatus.COMPLETED, final_output=text, action="run.completed")
        status = RunStatus.COMPLETED
    if not stored:
        logger.warning("run %s: outcome not stored, the lease had passed to another worker", run.pk)
        return WorkOutcome(run.pk, "lease_lost", "another worker owns the run now", scope.effects)
    return WorkOutcome(run.pk, status, "", scope.effects)
