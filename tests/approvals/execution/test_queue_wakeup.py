"""On PostgreSQL a decision wakes a listening worker through NOTIFY instead of its next poll."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection, transaction

from approvals.decisions.decide import decide
from approvals.execution import queue
from approvals.execution.queue import WAKE_CHANNEL
from approvals.models import Run, RunStatus, Ticket
from devtools import demo
from notifications.deliveries import deliver_webhook_task
from tests.support import TenantFactory, member, paused_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

POLL_SECONDS = 60


def _wait_for(predicate, deadline_seconds: float) -> bool:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_worker_is_woken_by_the_decision_not_by_its_poll(manage_process):
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; on SQLite the worker polls")
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    worker = manage_process("worker", "--interval", str(POLL_SECONDS))
    # The worker is listening once its first (empty) poll is behind it.
    assert _wait_for(lambda: worker.poll() is None and _listening(), 30), "worker never listened"

    decide(Ticket.objects.get(run=run), user=member(tenant, "approver"), approve=True)

    # Far sooner than the poll interval: only the notification can have woken it.
    assert _wait_for(
        lambda: Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED, POLL_SECONDS / 4
    )
    assert len(demo.read_effects("deploy_release")) == 1


def _listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = %s",
            [f"LISTEN {WAKE_CHANNEL}"],
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.parametrize(
    ("enqueue", "channel"),
    [
        (lambda: queue.resume_run_task.enqueue(1), queue.WAKE_CHANNEL),
        (lambda: queue.start_run_task.enqueue(1), queue.WAKE_CHANNEL),
        (lambda: deliver_webhook_task.enqueue(1), queue.SIDE_WAKE_CHANNEL),
    ],
)
def test_a_tasks_insert_wakes_its_queues_workers_when_it_commits(enqueue, channel):
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; on SQLite the worker polls")
    listener = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    try:
        for name in (queue.WAKE_CHANNEL, queue.SIDE_WAKE_CHANNEL):
            listener.execute(f"LISTEN {name}")
        with transaction.atomic():
            enqueue()
            # Not before the commit: a rolled-back enqueue wakes nobody.
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []

        heard = [n.channel for n in listener.notifies(timeout=5, stop_after=1)]
    finally:
        listener.close()

    assert heard == [channel]


def test_a_rolled_back_enqueue_wakes_no_worker():
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; on SQLite the worker polls")
    listener = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    try:
        listener.execute(f"LISTEN {queue.WAKE_CHANNEL}")
        with pytest.raises(RuntimeError), transaction.atomic():
            queue.resume_run_task.enqueue(1)
            raise RuntimeError("the decision failed")

        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
    finally:
        listener.close()
