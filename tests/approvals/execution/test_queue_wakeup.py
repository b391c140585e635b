"""On PostgreSQL a decision wakes a listening worker through NOTIFY instead of its next poll."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from approvals.decisions.decide import decide
from approvals.execution.queue import WAKE_CHANNEL
from approvals.models import Run, RunStatus, Ticket
from devtools import demo
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
