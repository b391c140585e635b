"""The run queue: a run whose tickets are all decided is queued, and its resume task enqueued in
the same transaction; a run started over the API or a command gets its start task the same way.

The tasks' work is the resume (approvals.runs.resume) and the start (approvals.runs.start),
which sit above this module: a resumed run that pauses again opens tickets, and their automatic
decisions queue it here. So both are handed to this module when the app is ready
(ApprovalsConfig.ready calls serve()), and the imports point one way.
"""

from __future__ import annotations

from collections.abc import Callable

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

_served: dict[str, Callable[[int], str]] = {}


def serve(*, resume: Callable[[int], str], start: Callable[[int], str]) -> None:
    """Set the functions the tasks run (run id in, the run's status out): the resume
    (runs.resume) and the start of a run the console runs (runs.start)."""
    _served.clear()
    _served.update(resume=resume, start=start)


def _work(name: str) -> Callable[[int], str]:
    if name not in _served:
        raise RuntimeError(f"no {name} is served: the approvals app is not ready")
    return _served[name]


@task()
def resume_run_task(run_id: int) -> str:
    """The worker's task for a queued run: a primitive id in, the resume does the rest."""
    return _work("resume")(run_id)


@task()
def start_run_task(run_id: int) -> str:
    """The worker's task for a starting run: a primitive id in, the start does the rest."""
    return _work("start")(run_id)


def _wake() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {WAKE_CHANNEL}")


def enqueue_resume(run_id: int) -> None:
    """Queue the run's resume in the caller's transaction, and wake a worker when it commits.

    The task row lives in the same database, so it commits or rolls back with the decision.
    On PostgreSQL a NOTIFY (also transactional: delivered only on commit) wakes a listening
    worker at once; a lost notification costs one poll interval, as the worker still polls.
    """
    resume_run_task.enqueue(run_id)
    _wake()


def enqueue_start(run_id: int) -> None:
    """Queue the start of a run the console runs, in the caller's transaction, exactly as
    enqueue_resume does (same database, NOTIFY on commit on PostgreSQL)."""
    start_run_task.enqueue(run_id)
    _wake()


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
