"""A worker takes the next task in one statement (workers.claim_next): the task django-tasks-db's
own loop would take, once, and never one another worker holds."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone
from django_tasks_db.compat import DEFAULT_TASK_BACKEND_ALIAS, TaskResultStatus
from django_tasks_db.models import DBTaskResult

from approvals.execution import queue, workers
from notifications.deliveries import deliver_webhook_task

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES_ONLY = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SKIP LOCKED in one statement"
)


def _claim(worker_id: str = "w1", queue_names=("default",)):
    return workers.claim_next(
        backend_name=DEFAULT_TASK_BACKEND_ALIAS, queue_names=list(queue_names), worker_id=worker_id
    )


def _enqueue(run_id: int, **using) -> str:
    task = queue.resume_run_task.using(**using) if using else queue.resume_run_task
    return str(task.enqueue(run_id).id)


def test_claim_takes_the_highest_priority_then_the_oldest_task():
    first = _enqueue(1)
    later = _enqueue(2)
    urgent = _enqueue(3, priority=10)

    assert [str(_claim().pk) for _ in range(3)] == [urgent, first, later]
    assert _claim() is None


def test_claim_marks_the_task_running_under_the_worker():
    task_id = _enqueue(7)
    before = timezone.now()

    claimed = _claim("worker-a")

    assert str(claimed.pk) == task_id
    assert claimed.args_kwargs == {"args": [7], "kwargs": {}}
    stored = DBTaskResult.objects.get(pk=task_id)
    assert stored.status == TaskResultStatus.RUNNING
    assert stored.worker_ids == ["worker-a"]
    assert stored.started_at >= before
    assert (claimed.status, claimed.worker_ids) == (TaskResultStatus.RUNNING, ["worker-a"])


def test_claim_of_a_task_claimed_before_appends_the_worker():
    task_id = _enqueue(7)
    DBTaskResult.objects.filter(pk=task_id).update(worker_ids=["dead-worker"])

    _claim("worker-b")

    assert DBTaskResult.objects.get(pk=task_id).worker_ids == ["dead-worker", "worker-b"]


def test_claim_leaves_other_queues_future_and_finished_tasks_alone():
    deliver_webhook_task.enqueue(1)
    _enqueue(2, run_after=timezone.now() + timedelta(hours=1))
    done = _enqueue(3)
    DBTaskResult.objects.filter(pk=done).update(status=TaskResultStatus.SUCCESSFUL)

    assert _claim() is None
    assert DBTaskResult.objects.filter(status=TaskResultStatus.RUNNING).count() == 0
    # Its own queue's worker takes the delivery.
    assert _claim(queue_names=[queue.SIDE_QUEUE]).task_path.endswith("deliver_webhook_task")


def test_claim_takes_a_task_whose_time_has_come():
    task_id = _enqueue(2, run_after=timezone.now() - timedelta(seconds=1))

    assert str(_claim().pk) == task_id


@POSTGRES_ONLY
def test_claim_passes_by_a_task_another_worker_holds_locked():
    held = _enqueue(1)
    free = _enqueue(2)
    other = psycopg.connect(**connection.get_connection_params())
    try:
        other.execute(
            "SELECT id FROM django_tasks_database_dbtaskresult WHERE id = %s FOR UPDATE", [held]
        )

        assert str(_claim().pk) == free
    finally:
        other.close()
    assert DBTaskResult.objects.get(pk=held).status == TaskResultStatus.READY


@POSTGRES_ONLY
def test_claims_by_workers_at_once_take_each_task_once():
    ids = {_enqueue(n) for n in range(40)}
    taken: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    start = threading.Barrier(len(taken))

    def worker(name: str) -> None:
        try:
            start.wait()
            while (task := _claim(name)) is not None:
                taken[name].append(str(task.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(name,)) for name in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    everything = [task_id for got in taken.values() for task_id in got]
    assert sorted(everything) == sorted(ids)
    assert DBTaskResult.objects.filter(status=TaskResultStatus.RUNNING).count() == len(ids)
