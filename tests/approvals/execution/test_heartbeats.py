"""Workers' heartbeats, and the reaper settling the task rows a stopped worker left RUNNING."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_tasks_db.compat import TaskResultStatus
from django_tasks_db.models import DBTaskResult

from approvals.execution import workers
from approvals.execution.queue import resume_run_task
from approvals.models import WorkerHeartbeat

pytestmark = pytest.mark.django_db


def running(worker_id: str, *, started: timedelta) -> DBTaskResult:
    """A resume task row claimed by worker_id, started this long ago."""
    row = DBTaskResult.objects.get(pk=resume_run_task.enqueue(1).id)
    row.claim(worker_id)
    DBTaskResult.objects.filter(pk=row.pk).update(started_at=timezone.now() - started)
    return DBTaskResult.objects.get(pk=row.pk)


def status(row: DBTaskResult) -> str:
    return DBTaskResult.objects.get(pk=row.pk).status


def test_beat_records_and_refreshes_each_worker_id():
    then = timezone.now() - timedelta(minutes=5)
    workers.beat(["w1", "w1/notifications-1"], now=then)
    workers.beat(["w1", "w1/notifications-1"])

    seen = dict(WorkerHeartbeat.objects.values_list("worker_id", "last_seen"))
    assert sorted(seen) == ["w1", "w1/notifications-1"]
    assert all(last > then for last in seen.values())


def test_settle_marks_failed_the_running_row_of_a_worker_not_seen_for_a_few_leases(settings):
    settings.APPROVALS_LEASE_SECONDS = 60
    old = timezone.now() - timedelta(seconds=3 * 60 + 1)
    workers.beat(["dead"], now=old)
    row = running("dead", started=timedelta(minutes=10))

    assert workers.settle_abandoned_tasks() == [str(row.pk)]

    settled = DBTaskResult.objects.get(pk=row.pk)
    assert settled.status == TaskResultStatus.FAILED
    assert settled.finished_at is not None
    assert settled.exception_class_path == "approvals.execution.workers.WorkerStopped"
    assert settled.traceback.startswith(f"worker dead stopped (last seen {old:%Y-%m-%d %H:%M:%S}")
    assert workers.settle_abandoned_tasks() == []


def test_settle_leaves_a_live_workers_long_running_row_alone(settings):
    settings.APPROVALS_LEASE_SECONDS = 60
    workers.beat(["alive"])
    # Seen within the window: alive, however long its task has been running.
    workers.beat(["recent"], now=timezone.now() - timedelta(seconds=3 * 60 - 5))
    alive = running("alive", started=timedelta(hours=2))
    recent = running("recent", started=timedelta(hours=2))

    assert workers.settle_abandoned_tasks() == []
    assert status(alive) == status(recent) == TaskResultStatus.RUNNING


def test_settle_a_row_of_a_worker_never_seen_waits_as_long_from_its_start(settings):
    settings.APPROVALS_LEASE_SECONDS = 60
    fresh = running("starting", started=timedelta(seconds=30))
    old = running("pre-heartbeat-version", started=timedelta(minutes=4))

    assert workers.settle_abandoned_tasks() == [str(old.pk)]
    assert status(fresh) == TaskResultStatus.RUNNING
    assert DBTaskResult.objects.get(pk=old.pk).traceback.startswith(
        "worker pre-heartbeat-version stopped (never seen)"
    )


def test_settle_never_touches_a_row_that_is_not_running(settings):
    workers.beat(["dead"], now=timezone.now() - timedelta(days=2))
    row = running("dead", started=timedelta(days=2))
    DBTaskResult.objects.filter(pk=row.pk).update(status=TaskResultStatus.SUCCESSFUL)
    queued = DBTaskResult.objects.get(pk=resume_run_task.enqueue(2).id)

    assert workers.settle_abandoned_tasks() == []
    assert status(row) == TaskResultStatus.SUCCESSFUL
    assert status(queued) == TaskResultStatus.READY
    # A heartbeat gone a day is forgotten.
    assert not WorkerHeartbeat.objects.filter(worker_id="dead").exists()


def test_stale_after_is_a_few_leases_or_reaper_intervals(settings):
    settings.APPROVALS_LEASE_SECONDS = 3
    settings.APPROVALS_REAPER_INTERVAL_SECONDS = 5
    assert workers.stale_after() == timedelta(seconds=15)
