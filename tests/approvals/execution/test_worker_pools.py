"""The worker's two pools: the resume pool's loop, and when the notifications pool's pass is
followed at once by the next and when the next waits as an idle pass does."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction

from approvals.audit import chain as audit
from approvals.execution import queue
from approvals.management.commands import worker
from approvals.models import Role
from notifications.deliveries import deliver_webhook_task
from notifications.models import FanOutCursor
from tests.notifications.conftest import caught_up, make_endpoint
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db


def _pool() -> worker.NotificationsPool:
    return worker.NotificationsPool(
        worker_id="w/notifications-1", interval=0.25, stop=threading.Event(), listen=False
    )


def _escalations(tenant, count: int) -> None:
    for _ in range(count):
        with transaction.atomic():
            audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")


@pytest.fixture
def tenant():
    tenant = TenantFactory(slug="acme")
    # An endpoint that wants nothing these tests send: the fan-out makes no task.
    make_endpoint(tenant, member(tenant, Role.ADMIN), events=["run.failed"])
    caught_up(tenant)
    return tenant


def test_a_pass_that_fanned_out_a_few_events_is_followed_by_a_wait(tenant):
    _escalations(tenant, 3)

    assert _pool().step() is False

    # The events were fanned out all the same: the cursor is past them.
    tenant.refresh_from_db()
    assert FanOutCursor.objects.get(tenant=tenant).seq == tenant.audit_seq


def test_a_pass_with_nothing_to_do_is_followed_by_a_wait(tenant):
    assert _pool().step() is False


def test_a_pass_that_ran_a_task_is_followed_by_the_next_at_once(tenant, monkeypatch):
    ran = []
    # The task is claimed from the notifications queue; what it would do is not this test's.
    monkeypatch.setattr(
        worker.db_worker.Worker, "run_task", lambda self, task_result: ran.append(task_result)
    )
    deliver_webhook_task.enqueue(12345)

    assert _pool().step() is True
    assert [task_result.args_kwargs["args"] for task_result in ran] == [[12345]]


def test_a_pass_that_found_a_backlog_is_followed_by_the_next_at_once(tenant, monkeypatch):
    monkeypatch.setattr(worker, "FAN_OUT_BACKLOG", 4)
    _escalations(tenant, 4)

    assert _pool().step() is True


def test_the_pool_waits_only_after_a_pass_that_was_not_busy(monkeypatch):
    pool = _pool()
    passes = iter([True, False, True, True, False])
    waits = []

    def step():
        busy = next(passes, None)
        if busy is None:
            pool.stop.set()
            return True
        return busy

    monkeypatch.setattr(pool, "step", step)
    monkeypatch.setattr(pool, "wait", lambda: waits.append(True))

    pool.run()

    assert len(waits) == 2


# --- the resume pool ------------------------------------------------------------------------


def _resume_pool(**kwargs) -> worker.ResumePool:
    return worker.ResumePool(
        listener=None,
        queue_names=["default"],
        interval=0.01,
        batch=False,
        backend_name="default",
        startup_delay=False,
        worker_id="w",
        excluded_queue_names=[],
        **kwargs,
    )


# The pool closes old connections as it loops, which a test's own transaction does not allow.
@pytest.mark.django_db(transaction=True)
def test_the_resume_pool_runs_each_ready_task_once_and_waits_only_when_there_is_none(
    monkeypatch,
):
    for run_id in (1, 2):
        queue.resume_run_task.enqueue(run_id)
    pool = _resume_pool(max_tasks=3)
    ran, waits = [], []

    def run_task(task_result):
        ran.append(task_result)
        pool._run_tasks += 1  # as the library's run_task counts

    def wait():
        waits.append(len(ran))
        # A third task arrives after the first idle poll.
        queue.resume_run_task.enqueue(3)

    monkeypatch.setattr(pool, "run_task", run_task)
    monkeypatch.setattr(pool, "wait", wait)

    pool.run()

    assert [task_result.args_kwargs["args"] for task_result in ran] == [[1], [2], [3]]
    assert waits == [2]


@pytest.mark.django_db(transaction=True)
def test_the_resume_pool_stops_without_waiting_when_told_to_during_a_task(monkeypatch):
    queue.resume_run_task.enqueue(1)
    pool = _resume_pool(max_tasks=None)
    waits = []

    def run_task(task_result):
        pool.running = False  # a SIGTERM arrived while the task ran

    monkeypatch.setattr(pool, "run_task", run_task)
    monkeypatch.setattr(pool, "wait", lambda: waits.append(True))

    pool.run()

    assert waits == []


@pytest.mark.django_db(transaction=True)
def test_the_resume_pool_claims_as_it_runs_a_task_so_a_sigterm_waits_for_the_claim(monkeypatch):
    pool = _resume_pool(max_tasks=None)
    seen = []

    def claim_next(**kwargs):
        seen.append(pool.running_task)
        # A SIGTERM now: the library's handler exits at once only when no task is running.
        pool.running = False
        return None

    monkeypatch.setattr(worker.workers, "claim_next", claim_next)

    pool.run()

    assert seen == [True]
    assert pool.running_task is False
