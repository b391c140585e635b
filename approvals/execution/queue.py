"""The run queue: a run whose tickets are all decided is queued, and its resume task enqueued in
the same transaction; a run started over the API or a command gets its start task the same way.

The tasks' work is the resume (approvals.runs.resume) and the start (approvals.runs.start),
which sit above this module: a resumed run that pauses again opens tickets, and their automatic
decisions queue it here. So both are handed to this module when the app is ready
(ApprovalsConfig.ready calls serve()), and the imports point one way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from django.db.models import Exists, OuterRef, QuerySet
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

# The channel a task's insert on the default queue NOTIFYs on PostgreSQL (a trigger: migration
# 0013, which writes these names out), and the resume pool LISTENs on.
WAKE_CHANNEL = "approvals_resume"
# The worker's second pool (manage.py worker): its queue, for the tasks that must never hold up
# a resume (the notifications' webhook and email deliveries), and the channel its tasks'
# inserts NOTIFY on.
SIDE_QUEUE = "notifications"
SIDE_WAKE_CHANNEL = "approvals_notifications"
# The statuses a resume leaves when it did its work; anything else is logged as a warning.
_RESUMED = frozenset({RunStatus.COMPLETED, RunStatus.PAUSED})

logger = logging.getLogger("approvals.worker")


class Resumed(Protocol):
    """What a resume or a start tells of a run: its status afterwards, and why when it did not
    go on."""

    run_id: int
    status: str
    reason: str
    effects: list[int]


_served: dict[str, Callable[..., Resumed]] = {}


def serve(*, resume: Callable[..., Resumed], start: Callable[..., Resumed]) -> None:
    """Set the functions the tasks run (work(run_id=N) -> what became of the run): the resume
    (runs.resume) and the start of a run the console runs (runs.start)."""
    _served.clear()
    _served.update(resume=resume, start=start)


def _work(name: str, run_id: int) -> str:
    """Run the served work on the run and log one line saying what became of it (the queue's
    own line only says the task ran, SUCCESSFUL even for a run that failed)."""
    if name not in _served:
        raise RuntimeError(f"no {name} is served: the approvals app is not ready")
    outcome = _served[name](run_id=run_id)
    _log_resumed(outcome)
    return outcome.status


@task()
def resume_run_task(run_id: int) -> str:
    """The worker's task for a queued run: a primitive id in, the resume does the rest.

    Side effects: the resume's; one log line that says what became of the run. Returns the
    run's status. Raises RuntimeError when no resume is served.
    """
    return _work("resume", run_id)


@task()
def start_run_task(run_id: int) -> str:
    """The worker's task for a starting run: a primitive id in, the start does the rest (and
    the same log line)."""
    return _work("start", run_id)


def decision_words(tickets) -> list[str]:
    """The decisions a resume ran with, as its log line says them: "tool status by user"."""
    return [
        _decision(t.tool_name, t.status, t.decided_by.get_username() if t.decided_by else "")
        for t in tickets
    ]


def _decision(tool: str, status: str, by: str | None) -> str:
    return f"{tool} {status}" + (f" by {by}" if by else "")


def _log_resumed(resumed: Resumed) -> None:
    """One line: the run, the decisions it was resumed with, its status and why, its effects.

    A resume that claimed the run says which decisions it ran with; otherwise (a second
    delivery, a start) they are read from the run's current tickets.
    """
    decisions = getattr(resumed, "decisions", None)
    if decisions is None:
        decisions = [
            _decision(tool, status, by)
            for tool, status, by in Ticket.objects.filter(
                run_id=resumed.run_id,
                generation=Run.objects.filter(pk=resumed.run_id).values("state_generation")[:1],
            )
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
    """Queue the run's resume in the caller's transaction; a worker wakes when it commits.

    The task row lives in the same database, so it commits or rolls back with the decision.
    On PostgreSQL the row's insert sends a NOTIFY on WAKE_CHANNEL (a trigger, migration 0013;
    transactional: delivered only on commit), which wakes a listening worker at once; a lost
    notification costs one poll interval, as the worker still polls.
    """
    resume_run_task.enqueue(run_id)


def enqueue_start(run_id: int) -> None:
    """Queue the start of a run the console runs, in the caller's transaction, exactly as
    enqueue_resume does (same database, NOTIFY on commit on PostgreSQL)."""
    start_run_task.enqueue(run_id)


def decided_status(run: Run) -> str | None:
    """Where the run goes once none of its tickets is pending: queued for a worker, or
    awaiting its caller (a caller's run, executor caller); None unless it is paused."""
    if run.status != RunStatus.PAUSED:
        return None
    return RunStatus.AWAITING_CALLER if run.executor == RunExecutor.CALLER else RunStatus.QUEUED


def decided_runs(run: Run, *, deciding: int | None = None) -> QuerySet[Run]:
    """The run, while it is paused and no ticket of its current state is pending: the rule of
    queue_if_decided(). deciding: a ticket being decided in the same statement, which that
    statement still reads as pending (transitions.decide_ticket)."""
    pending = Ticket.objects.filter(
        run_id=OuterRef("pk"),
        generation=run.state_generation,
        status=TicketStatus.PENDING,
    )
    if deciding is not None:
        pending = pending.exclude(pk=deciding)
    return Run.objects.filter(pk=run.pk, status=RunStatus.PAUSED).exclude(Exists(pending))


def queue_if_decided(run: Run, *, now, actor=None, actor_name: str = "") -> bool:
    """When no ticket of the run's current state is pending, queue the run and its resume; a
    caller's run (executor caller) instead waits for its caller, with no task: its caller
    fetches the signed decisions and resumes the agent in its own process (runs.remote).

    Runs inside the caller's transaction, which holds the run's lock. Side effects: the run's
    status; then decided()'s. Returns whether the run moved.
    """
    to = decided_status(run)
    # One statement: the run moves only while no ticket of its current state is pending.
    if to is None or not transitions.move_runs(decided_runs(run), to=to, updated_at=now):
        return False
    decided(run, to=to, actor=actor, actor_name=actor_name)
    return True


def decided(run: Run, *, to: str, actor=None, actor_name: str = "") -> None:
    """What follows a run's move to `to` (decided_status()), in the transaction that moved it:
    run.status; a caller's run gets audit event run.awaiting_caller (a webhook run.decided),
    any other its resume task and audit event run.queued; a live hint after commit."""
    run.status = to
    caller = to == RunStatus.AWAITING_CALLER
    if not caller:
        enqueue_resume(run.pk)
    chain.append(
        tenant_id=run.tenant_id,
        action="run.awaiting_caller" if caller else "run.queued",
        actor=actor,
        actor_name=actor_name,
        run_id=run.pk,
        outcome=to,
        detail={"generation": run.state_generation} if caller else None,
    )
    hints.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=to)
