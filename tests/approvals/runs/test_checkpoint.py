"""A checkpoint write is atomic: a worker killed while storing a new pause leaves the previous
checkpoint readable, and the next worker stores the new one without repeating any effect (S5)."""

from __future__ import annotations

import pytest

from approvals.decisions.decide import decide
from approvals.execution.state import open_state
from approvals.models import Run, RunStatus, Ticket, TicketStatus
from approvals.runs.reaper import reap
from approvals.runs.resume import resume
from devtools import demo
from tests.conftest import subprocess_env
from tests.support import TenantFactory, member, paused_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_kill_while_storing_a_new_pause_keeps_the_previous_checkpoint(manage_process, settings):
    tenant = TenantFactory(slug="acme")
    approver = member(tenant, "approver")
    run = paused_run(tenant, prompt="Deploy release 2026.07.24 to staging and production")
    first = Ticket.objects.get(run=run)
    assert first.tool_call_id == "call_deploy_2026.07.24_staging"
    # Approved once, not "always": production must pause the run a second time.
    decide(first, user=approver, approve=True)

    worker = manage_process(
        "db_worker",
        "--batch",
        "--no-reload",
        env=subprocess_env(APPROVALS_FAULT="while_storing_pause"),
    )
    worker.communicate(timeout=120)

    assert worker.returncode == -9
    run.refresh_from_db()
    assert run.status == RunStatus.RESUMING
    assert run.state_generation == 1
    # The old checkpoint still opens and still holds the staging call.
    assert open_state(run)["$schemaVersion"] == run.schema_version
    assert Ticket.objects.filter(run=run).count() == 1
    assert len(demo.read_effects("deploy_release")) == 1

    Run.objects.filter(pk=run.pk).update(lease_expires_at=run.lease_expires_at.replace(year=2000))
    report = reap()
    assert report.requeued == [run.pk]

    outcome = resume(run_id=run.pk, worker_id="second-worker")

    assert outcome.status == RunStatus.PAUSED
    run.refresh_from_db()
    assert run.state_generation == 2
    pending = Ticket.objects.get(run=run, status=TicketStatus.PENDING)
    assert pending.tool_call_id == "call_deploy_2026.07.24_production"
    # The staging deployment was confirmed in the ledger, so the retry did not repeat it.
    assert [e["environment"] for e in demo.read_effects("deploy_release")] == ["staging"]
