"""The lease: a run a live worker is resuming is neither claimed by a second worker nor
requeued by the reaper; once the lease has expired, both may take it back.

Deterministic on both databases: the lease is set on the row, the clock is the test's.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.decisions.decide import decide
from approvals.models import AuditEvent, IdempotencyRecord, Role, Run, RunStatus, Ticket
from approvals.runs.reaper import reap
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db(transaction=True)


def resuming_run(*, lease_left: timedelta) -> Run:
    """A decided run that worker w1 claimed (attempt 1), its lease ending lease_left from now."""
    tenant = TenantFactory()
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))
    decide(Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER), approve=True)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RESUMING,
        lease_owner="w1",
        lease_expires_at=timezone.now() + lease_left,
        attempts=1,
    )
    return Run.objects.get(pk=run.pk)


def events(run: Run, action: str) -> int:
    return AuditEvent.objects.filter(run_id=run.pk, action=action).count()


def test_a_second_worker_does_not_claim_a_run_under_a_live_lease():
    run = resuming_run(lease_left=timedelta(minutes=5))
    resuming_before = events(run, "run.resuming")

    outcome = resume(run_id=run.pk, worker_id="w2")

    run.refresh_from_db()
    assert outcome.reason == "not claimed: another delivery has it"
    assert (run.status, run.lease_owner, run.attempts) == (RunStatus.RESUMING, "w1", 1)
    assert events(run, "run.resuming") == resuming_before
    assert demo.read_effects() == []
    assert IdempotencyRecord.objects.count() == 0


def test_a_second_worker_claims_a_run_whose_lease_expired():
    """The control: the same run, its lease a second past, is taken over (attempt 2)."""
    run = resuming_run(lease_left=timedelta(seconds=-1))

    outcome = resume(run_id=run.pk, worker_id="w2")

    run.refresh_from_db()
    assert outcome.status == RunStatus.COMPLETED
    assert run.attempts == 2
    assert [e["environment"] for e in demo.read_effects()] == ["production"]


def test_the_reaper_leaves_a_run_under_a_live_lease():
    run = resuming_run(lease_left=timedelta(minutes=5))

    report = reap()

    run.refresh_from_db()
    assert report.requeued == []
    assert (run.status, run.lease_owner, run.attempts) == (RunStatus.RESUMING, "w1", 1)
    assert events(run, "run.requeued") == 0


def test_the_reaper_requeues_a_run_whose_lease_expired():
    run = resuming_run(lease_left=timedelta(seconds=-1))

    report = reap()

    run.refresh_from_db()
    assert report.requeued == [run.pk]
    assert (run.status, run.lease_owner) == (RunStatus.QUEUED, "")
    assert events(run, "run.requeued") == 1
