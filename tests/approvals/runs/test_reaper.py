"""The reaper, by what it leaves behind: a requeued run's task, audit event and hint; a queued
run that waited past a lease gets its task again; a caller's run is never taken back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.decisions.decide import decide
from approvals.models import AuditEvent, Role, Run, RunExecutor, RunStatus, Ticket
from approvals.runs import reaper
from tests.support import TenantFactory, caller_run, member, paused_run

pytestmark = pytest.mark.django_db

TASK_PATH = "approvals.execution.queue.resume_run_task"


def resume_tasks(run: Run) -> int:
    return sum(
        1
        for task in DBTaskResult.objects.filter(task_path=TASK_PATH)
        if task.args_kwargs["args"] == [run.pk]
    )


@pytest.fixture
def hints(monkeypatch) -> list[tuple[int, str, dict]]:
    sent: list[tuple[int, str, dict]] = []
    monkeypatch.setattr(
        reaper.hints,
        "notify_on_commit",
        lambda tenant_id, kind, **data: sent.append((tenant_id, kind, data)),
    )
    return sent


def queued_run() -> Run:
    """A decided run, queued with its resume task."""
    tenant = TenantFactory()
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))
    decide(Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER), approve=True)
    return Run.objects.get(pk=run.pk)


def dead_workers_run(*, now, executor: str = RunExecutor.CONSOLE) -> Run:
    run = queued_run()
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RESUMING,
        lease_owner="w1",
        lease_expires_at=now - timedelta(seconds=1),
        attempts=1,
        executor=executor,
    )
    return Run.objects.get(pk=run.pk)


def test_reap_requeues_a_dead_workers_run_with_a_task_an_event_and_a_hint(hints):
    now = timezone.now()
    run = dead_workers_run(now=now)
    tasks_before = resume_tasks(run)
    hints.clear()

    report = reaper.reap(now=now)

    run.refresh_from_db()
    assert report.requeued == [run.pk]
    assert (run.status, run.lease_owner, run.lease_expires_at, run.updated_at) == (
        RunStatus.QUEUED,
        "",
        None,
        now,
    )
    assert resume_tasks(run) == tasks_before + 1
    event = AuditEvent.objects.get(run_id=run.pk, action="run.requeued")
    assert (event.tenant_id, event.actor_name, event.outcome, event.detail) == (
        run.tenant_id,
        "reaper",
        RunStatus.QUEUED,
        {"reason": "worker w1 stopped renewing its lease"},
    )
    assert hints == [(run.tenant_id, "run.changed", {"run": run.pk, "status": RunStatus.QUEUED})]


def test_reap_leaves_a_callers_run_alone_whatever_its_lease(hints):
    now = timezone.now()
    tenant = TenantFactory()
    run = caller_run(tenant, requested_by=member(tenant, Role.VIEWER))
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RESUMING, lease_owner="w1", lease_expires_at=now - timedelta(hours=1)
    )

    report = reaper.reap(now=now)

    assert report.requeued == []
    assert Run.objects.get(pk=run.pk).status == RunStatus.RESUMING
    assert not AuditEvent.objects.filter(run_id=run.pk, action="run.requeued").exists()


def test_reap_gives_a_queued_run_that_waited_past_a_lease_its_task_again():
    now = timezone.now()
    lease = timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    waited = queued_run()
    fresh = queued_run()
    Run.objects.filter(pk=waited.pk).update(updated_at=now - lease - timedelta(seconds=1))
    Run.objects.filter(pk=fresh.pk).update(updated_at=now - lease + timedelta(seconds=1))
    before = {run.pk: resume_tasks(run) for run in (waited, fresh)}

    report = reaper.reap(now=now)

    assert report.reenqueued == [waited.pk]
    assert report.requeued == []
    assert resume_tasks(waited) == before[waited.pk] + 1
    assert resume_tasks(fresh) == before[fresh.pk]
    assert Run.objects.get(pk=waited.pk).updated_at == now
    assert Run.objects.get(pk=waited.pk).status == RunStatus.QUEUED


def test_reap_does_not_give_a_callers_queued_run_a_task():
    now = timezone.now()
    run = queued_run()
    Run.objects.filter(pk=run.pk).update(
        executor=RunExecutor.CALLER, updated_at=now - timedelta(days=1)
    )
    before = resume_tasks(run)

    report = reaper.reap(now=now)

    assert report.reenqueued == []
    assert resume_tasks(run) == before


def test_reap_with_nothing_to_do_reports_nothing():
    report = reaper.reap()

    assert report == reaper.ReapReport()
