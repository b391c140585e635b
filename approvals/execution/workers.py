"""The workers' heartbeats, and the task rows a stopped worker left RUNNING.

django-tasks-db has no lease: a worker killed mid-task leaves the task's row RUNNING for ever.
The work itself is not lost (a run's lease lapses and the reaper queues it again; a delivery
the notifications' housekeeping finds overdue gets a new task), only the row is. So each worker
records its ids on every reaper pass (beat), and the reaper settles the RUNNING rows of the
workers nobody has seen for STALE_LEASES lease lengths (settle_abandoned_tasks).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import OperationalError, connections
from django.utils import timezone
from django_tasks_db.compat import TaskResultStatus
from django_tasks_db.models import DBTaskResult, get_date_max
from django_tasks_db.utils import exclusive_transaction, is_locked_database_exception

from approvals.core import statements
from approvals.execution import queue
from approvals.models import Run, Tenant, WorkerHeartbeat

# A worker not seen for this many lease lengths (or reaper intervals, if longer) has stopped.
STALE_LEASES = 3
# Heartbeats of workers gone this long are forgotten (their rows were settled long before).
FORGET_AFTER = timedelta(days=1)


def claim_next(*, backend_name: str, queue_names: list[str], worker_id: str) -> DBTaskResult | None:
    """Take the next ready task of these queues for this worker, or None when there is none.

    The task a worker would have taken in django-tasks-db's own loop (the highest priority,
    then the earliest run_after and enqueued_at; none that another worker has locked), marked
    RUNNING with worker_id appended to its worker_ids. On PostgreSQL one statement (an
    UPDATE of the row a SKIP LOCKED subquery picks, RETURNING it) instead of a transaction
    that selects, locks and saves: two workers never take the same task. Elsewhere, the
    library's own select, lock and claim; a locked SQLite database gives None.
    """
    using = DBTaskResult.objects.db
    conn = connections[using]
    if conn.vendor != "postgresql":
        tasks = DBTaskResult.objects.ready().filter(
            backend_name=backend_name, queue_name__in=queue_names
        )
        with exclusive_transaction(tasks.db):
            try:
                task_result = tasks.get_locked()
                if task_result is not None:
                    task_result.claim(worker_id)
            except OperationalError as error:
                if not is_locked_database_exception(error):
                    raise
                task_result = None
        return task_result
    quote = conn.ops.quote_name
    table = quote(DBTaskResult._meta.db_table)
    returning = statements.returning(DBTaskResult, using=using)
    now = timezone.now()
    # A task of a run (its first argument the run's id): the run's tenant and attempts, and
    # the tenant's audit head, as this statement's snapshot has them, read with the claim
    # (RunHint).
    run_of_task = (
        "CASE WHEN task_path = ANY(%s) AND jsonb_typeof(args_kwargs -> 'args' -> 0) = 'number' "
        "THEN (args_kwargs -> 'args' ->> 0)::bigint END"
    )
    hint = (
        "(SELECT json_build_array(run.id, run.tenant_id, run.attempts, tenant.audit_seq, "
        f"tenant.audit_head) FROM {quote(Run._meta.db_table)} AS run "
        f"JOIN {quote(Tenant._meta.db_table)} AS tenant ON tenant.id = run.tenant_id "
        f"WHERE run.id = {run_of_task})"
    )
    sql = (
        f"UPDATE {table} SET status = %s, started_at = %s, worker_ids = worker_ids || %s::jsonb "
        f"WHERE id = (SELECT id FROM {table} WHERE status = %s AND backend_name = %s "
        "AND queue_name = ANY(%s) AND (run_after = %s OR run_after <= %s) "
        "ORDER BY priority DESC, run_after ASC, enqueued_at ASC "
        f"LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING {returning}, {hint}"
    )
    params = [
        TaskResultStatus.RUNNING,
        now,
        json.dumps([worker_id]),
        TaskResultStatus.READY,
        backend_name,
        list(queue_names),
        get_date_max(),
        now,
        [queue.resume_run_task.module_path, queue.start_run_task.module_path],
    ]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    task_result = statements.row_object(DBTaskResult, row[:-1], using=using)
    hint = row[-1]
    task_result.run_hint = (
        RunHint(*hint[:3], head=(int(hint[3]), hint[4])) if hint is not None else None
    )
    return task_result


@dataclass(frozen=True)
class RunHint:
    """A run task's run as the claim of the task read it: its tenant and attempts, and the
    tenant's audit head, so that the run's own claim (runs.lease) can link its audit event
    beforehand and go as one statement. Only a guess: the run's claim checks each."""

    run_id: int
    tenant_id: int
    attempts: int
    # (seq, hash); None: not read.
    head: tuple[int, str] | None = None


_hints = threading.local()


@contextmanager
def hinted(hint: RunHint | None) -> Iterator[None]:
    """While the task of `hint` runs on this thread, run_hint() gives it."""
    _hints.hint = hint
    try:
        yield
    finally:
        _hints.hint = None


def run_hint(run_id: int) -> RunHint | None:
    """The hint of the task running on this thread, when it is of this run."""
    hint = getattr(_hints, "hint", None)
    return hint if hint is not None and hint.run_id == run_id else None


def keep_if_usable(conn) -> None:
    """After a task, whose next claim follows at once: the thread keeps its connection (no
    borrow from the pool, and no check of it, a round trip) unless the task left it in a
    transaction or broke it. close_old_connections()' checks, without the age that returns a
    pooled connection (CONN_MAX_AGE 0) after every use; a worker hands it back while idle.

    Side effects: a connection left in a transaction or unusable after an error is closed (to
    the pool, which discards a broken one); one that had an error but answers is kept."""
    if conn.connection is None:
        return
    if conn.in_atomic_block or conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"]:
        conn.close()
    elif conn.errors_occurred:
        if conn.is_usable():
            conn.errors_occurred = False
        else:
            conn.close()


def stale_after() -> timedelta:
    """How long a worker may go unseen before its RUNNING task rows are settled."""
    return STALE_LEASES * timedelta(
        seconds=max(settings.APPROVALS_LEASE_SECONDS, settings.APPROVALS_REAPER_INTERVAL_SECONDS)
    )


def beat(worker_ids: Iterable[str], *, now: datetime | None = None) -> None:
    """Record that these workers (the pools of one process) are alive.

    Side effects: one WorkerHeartbeat row per id, its last_seen set to now (created when new).
    """
    now = now or timezone.now()
    rows = [WorkerHeartbeat(worker_id=worker_id, last_seen=now) for worker_id in worker_ids]
    WorkerHeartbeat.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["worker_id"], update_fields=["last_seen"]
    )


def settle_abandoned_tasks(*, now: datetime | None = None) -> list[str]:
    """Mark FAILED the RUNNING task rows whose worker stopped, and say which.

    A row's worker is the last id in its worker_ids. It has stopped when its heartbeat is
    older than stale_after(), or when it never had one and the row started longer ago than
    that (a worker killed before its first beat, or one of a version without heartbeats).
    A live worker's rows, however long they run, are left alone.

    Side effects: each such row FAILED (compare-and-set on RUNNING and its started_at, so a row
    claimed again meanwhile is left alone) with finished_at now and an exception text naming
    the worker; heartbeats not seen for FORGET_AFTER are deleted. Returns the settled row ids.
    """
    now = now or timezone.now()
    cutoff = now - stale_after()
    seen = dict(WorkerHeartbeat.objects.values_list("worker_id", "last_seen"))
    settled = []
    running = DBTaskResult.objects.filter(status=TaskResultStatus.RUNNING).only(
        "id", "worker_ids", "started_at", "task_path"
    )
    for row in running:
        worker_id = row.worker_ids[-1] if row.worker_ids else ""
        last_seen = seen.get(worker_id)
        if (last_seen or row.started_at or now) >= cutoff:
            continue
        when = f"last seen {last_seen:%Y-%m-%d %H:%M:%S} UTC" if last_seen else "never seen"
        moved = DBTaskResult.objects.filter(
            pk=row.pk, status=TaskResultStatus.RUNNING, started_at=row.started_at
        ).update(
            status=TaskResultStatus.FAILED,
            finished_at=now,
            return_value=None,
            exception_class_path="approvals.execution.workers.WorkerStopped",
            traceback=(
                f"worker {worker_id or '(unknown)'} stopped ({when}) while running this task; "
                "the reaper settled it. The work is recovered on its own: a run's lease lapses "
                "and the run is queued again, a delivery's housekeeping gives it a new task."
            ),
        )
        if moved:
            settled.append(str(row.pk))
    WorkerHeartbeat.objects.filter(last_seen__lt=now - FORGET_AFTER).delete()
    return settled
