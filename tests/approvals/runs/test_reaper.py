"""The reaper, by what it leaves behind: a requeued run's task, audit event and hint; a queued
run that waited past a lease gets its task again; a caller's run is never taken back."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.decisions.decide import decide
from approvals.models import (
    ApproverGroup,
    AuditEvent,
    Role,
    Run,
    RunExecutor,
    RunStatus,
    Ticket,
)
from approvals.policies.versions import save_policy
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


# --- several runs, lapsed starts, and what a live worker does meanwhile -----------------------

START_TASK_PATH = "approvals.execution.queue.start_run_task"


def start_tasks(run: Run) -> int:
    return sum(
        1
        for task in DBTaskResult.objects.filter(task_path=START_TASK_PATH)
        if task.args_kwargs["args"] == [run.pk]
    )


def lapsed_start(*, now) -> Run:
    """A run a worker was starting when it stopped renewing its lease."""
    run = queued_run()
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.STARTING,
        lease_owner="w1",
        lease_expires_at=now - timedelta(seconds=1),
        attempts=1,
    )
    return Run.objects.get(pk=run.pk)


def stale(run: Run, *, now, **fields) -> None:
    """The run was last touched more than a lease ago."""
    lease = timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    Run.objects.filter(pk=run.pk).update(updated_at=now - lease - timedelta(seconds=1), **fields)


@pytest.fixture
def meanwhile(monkeypatch):
    """Runs a change just before the reaper's next transaction, after it listed what it will look
    at: what a live worker may do between the reaper's read and its write."""
    pending: list = []
    atomic = reaper.transaction.atomic

    def before_the_write(*args, **kwargs):
        while pending:
            pending.pop(0)()
        return atomic(*args, **kwargs)

    monkeypatch.setattr(reaper, "transaction", SimpleNamespace(atomic=before_the_write))
    return pending.append


@pytest.fixture
def first_move(monkeypatch):
    """Runs a change to the run the reaper is about to move first, just before it moves it;
    returns the ids of the runs changed so."""
    changes: list = []
    raced: list[int] = []
    move_runs = reaper.transitions.move_runs

    def racing(runs, **fields):
        if changes:
            run_id = runs.values_list("pk", flat=True).first()
            changes.pop(0)(run_id)
            raced.append(run_id)
        return move_runs(runs, **fields)

    monkeypatch.setattr(reaper.transitions, "move_runs", racing)
    return changes, raced


def renew(run_id: int) -> None:
    Run.objects.filter(pk=run_id).update(lease_expires_at=timezone.now() + timedelta(minutes=5))


def finish(run_id: int) -> None:
    Run.objects.filter(pk=run_id).update(status=RunStatus.COMPLETED)


def test_reap_requeues_every_dead_workers_run_each_with_its_own_task_and_event():
    now = timezone.now()
    runs = [dead_workers_run(now=now), dead_workers_run(now=now)]
    before = {run.pk: resume_tasks(run) for run in runs}

    report = reaper.reap(now=now)

    assert sorted(report.requeued) == sorted(run.pk for run in runs)
    for run in runs:
        assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
        assert resume_tasks(run) == before[run.pk] + 1
        assert AuditEvent.objects.filter(run_id=run.pk, action="run.requeued").count() == 1


@pytest.mark.parametrize(
    ("change", "left_as"), [(renew, RunStatus.RESUMING), (finish, RunStatus.COMPLETED)]
)
def test_reap_leaves_a_run_its_worker_renewed_or_finished_meanwhile_and_goes_on(
    first_move, change, left_as
):
    now = timezone.now()
    runs = {run.pk: run for run in (dead_workers_run(now=now), dead_workers_run(now=now))}
    before = {pk: resume_tasks(run) for pk, run in runs.items()}
    changes, raced = first_move
    changes.append(change)

    report = reaper.reap(now=now)

    (kept,) = raced
    (other,) = set(runs) - {kept}
    assert report.requeued == [other]
    assert Run.objects.get(pk=kept).status == left_as
    assert resume_tasks(runs[kept]) == before[kept]
    assert not AuditEvent.objects.filter(run_id=kept, action="run.requeued").exists()
    assert Run.objects.get(pk=other).status == RunStatus.QUEUED
    assert resume_tasks(runs[other]) == before[other] + 1


def test_reap_gives_a_lapsed_start_its_start_task_an_event_and_a_hint(hints):
    now = timezone.now()
    run = lapsed_start(now=now)
    hints.clear()

    report = reaper.reap(now=now)

    run.refresh_from_db()
    assert report.requeued == [run.pk]
    assert (run.status, run.lease_owner, run.lease_expires_at, run.updated_at) == (
        RunStatus.STARTING,
        "",
        None,
        now,
    )
    assert start_tasks(run) == 1
    event = AuditEvent.objects.get(run_id=run.pk, action="run.requeued")
    assert (event.tenant_id, event.actor_name, event.outcome, event.detail) == (
        run.tenant_id,
        "reaper",
        RunStatus.STARTING,
        {
            "reason": "worker w1 stopped renewing its lease while starting the run; "
            "it starts again from its input"
        },
    )
    assert hints == [(run.tenant_id, "run.changed", {"run": run.pk, "status": RunStatus.STARTING})]


def test_reap_leaves_a_start_its_worker_renewed_meanwhile_and_goes_on(first_move):
    now = timezone.now()
    runs = {run.pk: run for run in (lapsed_start(now=now), lapsed_start(now=now))}
    changes, raced = first_move
    changes.append(renew)

    report = reaper.reap(now=now)

    (kept,) = raced
    (other,) = set(runs) - {kept}
    assert report.requeued == [other]
    assert Run.objects.get(pk=kept).lease_owner == "w1"
    assert start_tasks(runs[kept]) == 0
    assert start_tasks(runs[other]) == 1


def test_reap_gives_every_waiting_queued_run_and_unclaimed_start_a_task_of_its_own():
    now = timezone.now()
    queued = [queued_run(), queued_run()]
    starts = [queued_run(), queued_run()]
    for run in queued:
        stale(run, now=now)
    for run in starts:
        stale(run, now=now, status=RunStatus.STARTING)
    before = {run.pk: resume_tasks(run) for run in queued}

    report = reaper.reap(now=now)

    assert sorted(report.reenqueued) == sorted(run.pk for run in queued + starts)
    for run in queued:
        assert resume_tasks(run) == before[run.pk] + 1
    for run in starts:
        assert start_tasks(run) == 1
        assert Run.objects.get(pk=run.pk).updated_at == now


def claimed() -> dict:
    """What a worker's claim writes."""
    return {
        "status": RunStatus.RESUMING,
        "lease_owner": "w2",
        "lease_expires_at": timezone.now() + timedelta(minutes=5),
    }


def given_its_task() -> dict:
    """What another reaper's pass writes when it gives the run its task again."""
    return {"updated_at": timezone.now()}


@pytest.mark.parametrize("meanwhile_change", [claimed, given_its_task])
def test_reap_gives_no_task_to_a_waiting_run_claimed_or_given_one_meanwhile(
    meanwhile, meanwhile_change
):
    now = timezone.now()
    run = queued_run()
    stale(run, now=now)
    before = resume_tasks(run)
    meanwhile(lambda: Run.objects.filter(pk=run.pk).update(**meanwhile_change()))

    report = reaper.reap(now=now)

    assert report.reenqueued == []
    assert resume_tasks(run) == before


def test_reap_gives_no_task_to_an_unclaimed_start_given_one_meanwhile(meanwhile):
    now = timezone.now()
    run = queued_run()
    stale(run, now=now, status=RunStatus.STARTING)
    meanwhile(lambda: Run.objects.filter(pk=run.pk).update(updated_at=timezone.now()))

    report = reaper.reap(now=now)

    assert report.reenqueued == []
    assert start_tasks(run) == 0


def test_reap_does_no_work_for_runs_and_tickets_that_did_not_lapse(django_assert_num_queries):
    now = timezone.now()
    with django_assert_num_queries(5):
        assert reaper.reap(now=now) == reaper.ReapReport()
    live = timedelta(minutes=5)
    # A finished run its worker's lease still names, long ago.
    done = queued_run()
    stale(done, now=now, status=RunStatus.COMPLETED, lease_owner="w1")
    Run.objects.filter(pk=done.pk).update(lease_expires_at=now - live)
    # Runs under live leases, last touched long ago (heartbeats renew the lease only).
    held = [queued_run(), queued_run()]
    for run, status in zip(held, [RunStatus.RESUMING, RunStatus.STARTING], strict=True):
        stale(run, now=now, status=status, lease_owner="w1", lease_expires_at=now + live)
    # A waiting run's ticket that is not due yet, and a decided ticket past its expiry.
    tenant = TenantFactory()
    waiting = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))
    Ticket.objects.filter(run=waiting).update(expires_at=now + live)
    stale(waiting, now=now)
    # A run queued just now.
    queued_run()
    Ticket.objects.filter(run=done).update(expires_at=now - live)
    everything = list(Run.objects.order_by("pk").values_list("pk", "status", "updated_at"))
    tasks = DBTaskResult.objects.count()

    with django_assert_num_queries(5):
        assert reaper.reap(now=now) == reaper.ReapReport()

    assert list(Run.objects.order_by("pk").values_list("pk", "status", "updated_at")) == everything
    assert DBTaskResult.objects.count() == tasks


def test_reap_reports_every_ticket_it_rejected_or_escalated_and_every_run_it_queued():
    now = timezone.now()
    lapsed = timedelta(seconds=1)
    runs = {}
    for on_expiry in ("reject", "escalate"):
        tenant = TenantFactory()
        admin = member(tenant, Role.ADMIN)
        ApproverGroup.objects.create(tenant=tenant, name="on-call")
        save_policy(
            tenant=tenant,
            user=admin,
            agent_key="",
            tool_name="deploy_release",
            on_expiry=on_expiry,
            escalation_group="on-call",
        )
        requester = member(tenant, Role.VIEWER)
        runs[on_expiry] = [paused_run(tenant, requested_by=requester) for _ in range(2)]
    Ticket.objects.update(expires_at=now - lapsed)
    tickets = {
        on_expiry: sorted(Ticket.objects.filter(run__in=those).values_list("pk", flat=True))
        for on_expiry, those in runs.items()
    }

    report = reaper.reap(now=now)

    assert sorted(report.rejected) == tickets["reject"]
    assert sorted(report.escalated) == tickets["escalate"]
    assert sorted(report.queued) == sorted(run.pk for run in runs["reject"])
    assert report.expired_runs == report.awaiting_caller == []
