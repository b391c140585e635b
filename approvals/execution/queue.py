"""The resume queue: a run whose tickets are all decided is queued, and its resume task enqueued in
the same transaction.

The task's work is the resume (approvals.runs.resume), which sits above this module: a resumed
run that pauses again opens tickets, and their automatic decisions queue it here. So the resume
is handed to this module when the app is ready (ApprovalsConfig.ready calls serve()), and the
imports point one way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from django.db import connection
from django_tasks import task

from approvals import transitions
from approvals.audit import chain
from approvals.live import hints
from approvals.models import (
    Run,
    RunExecutor,
    RunStatus,
    Ticket,
    TicketStatus,
)

WAKE_CHANNEL = "approvals_resume"
# The statuses a resume leaves when it did its work; anything else is logged as a warning.
_RESUMED = frozenset({RunStatus.COMPLETED, RunStatus.PAUSED})

logger = logging.getLogger("approvals.worker")


class Resumed(Protocol):
    """What a resume tells of a run: its status afterwards, and why when it did not go on."""

    run_id: int
    status: str
    reason: str
    effects: list[int]


_resumers: list[Callable[..., Resumed]] = []


def serve(resume: Callable[..., Resumed]) -> None:
    """Set the function resume_run_task runs (resume(run_id=N) -> what became of the run)."""
    _resumers[:] = [resume]


@task()
def resume_run_task(run_id: int) -> str:
    """The worker's task for a queued run: a primitive id in, the resume does the rest.

    Side effects: the resume's; one log line that says what became of the run (the queue's
    own line only says the task ran, SUCCESSFUL even for a run that failed). Returns the run's
    status. Raises RuntimeError when no resume is served.
    """
    if not _resumers:
        raise RuntimeError("no resume is served: the approvals app is not ready")
    generation = Run.objects.filter(pk=run_id).values_list("state_generation", flat=True).first()
    resumed = _resumers[0](run_id=run_id)
    _log_resumed(resumed, generation)
    return resumed.status


def _log_resumed(resumed: Resumed, generation: int | None) -> None:
    """One line: the run, the decisions it was resumed with, its status and why, its effects."""
    decisions = [
        f"{tool} {status}" + (f" by {by}" if by else "")
        for tool, status, by in Ticket.objects.filter(run_id=resumed.run_id, generation=generation)
        .order_by("pk")
        .values_list("tool_name", "status", "decided_by__username")
    ]
    line = (
        f"run {resumed.run_id}: {resumed.status}"
        + (f" ({'; '.join(decisions)})" if decisions else "")
        + (f": {resumed.reason}" if resumed.reason else "")
        + (f"; effects {', '.join(map(str, resumed.effects))}" if resumed.effects else "")
    )
    logger.log(logging.INFO if resumed.status in _RESUMED else logging.WARNING, line)


def enqueue_resume(run_id: int) -> None:
    """Queue the run's resume in the caller's transaction, and wake a worker when it commits.

    The task row lives in the same database, so it commits or rolls back with the decision.
    On PostgreSQL a NOTIFY (also transactional: delivered only on commit) wakes a listening
    worker at once; a lost notification costs one poll interval, as the worker still polls.
    """
    resume_run_task.enqueue(run_id)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {WAKE_CHANNEL}")


def queue_if_decided(run: Run, *, now, actor=None, actor_name: str = "") -> bool:
    """When no ticket of the run's current state is pending, queue the run and its resume; a
    caller's run (executor caller) instead waits for its caller, with no task: its caller
    fetches the signed decisions and resumes the agent in its own process (runs.remote).

    Runs inside the caller's transaction, which holds the run's lock. Side effects: the run's
    status; audit event run.queued (with a resume task) or run.awaiting_caller (a webhook
    run.decided); a live hint after commit. Returns whether the run moved.
    """
    still_pending = Ticket.objects.filter(
        run=run, generation=run.state_generation, status=TicketStatus.PENDING
    ).exists()
    if still_pending or run.status != RunStatus.PAUSED:
        return False
    if run.executor == RunExecutor.CALLER:
        transitions.move_runs(
            Run.objects.filter(pk=run.pk, status=RunStatus.PAUSED),
            to=RunStatus.AWAITING_CALLER,
            updated_at=now,
        )
        run.status = RunStatus.AWAITING_CALLER
        chain.append(
            tenant_id=run.tenant_id,
            action="run.awaiting_caller",
            actor=actor,
            actor_name=actor_name,
            run_id=run.pk,
            outcome=RunStatus.AWAITING_CALLER,
            detail={"generation": run.state_generation},
        )
        hints.notify_on_commit(
            run.tenant_id, "run.changed", run=run.pk, status=RunStatus.AWAITING_CALLER
        )
        return True
    transitions.move_runs(Run.objects.filter(pk=run.pk), to=RunStatus.QUEUED, updated_at=now)
    run.status = RunStatus.QUEUED
    enqueue_resume(run.pk)
    chain.append(
        tenant_id=run.tenant_id,
        action="run.queued",
        actor=actor,
        actor_name=actor_name,
        run_id=run.pk,
        outcome=RunStatus.QUEUED,
    )
    hints.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=RunStatus.QUEUED)
    return True
