"""The claim with the run's tenant and attempts as the decision that queued it left them (the
resume task's): its audit event written by the claim's own statement while they hold, and the
claim made as without them when they do not. The event is the same either way."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_tasks_db.models import DBTaskResult

from approvals.audit import chain
from approvals.decisions.decide import decide
from approvals.execution import queue
from approvals.models import AuditEvent, Role, Run, RunStatus, Ticket
from approvals.runs import lease
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db(transaction=True)


def decided_run(tenant=None) -> Run:
    tenant = tenant or TenantFactory()
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, "req"))
    decide(Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER, "ann"), approve=True)
    return Run.objects.get(pk=run.pk)


def claim_sent(run: Run, expect) -> tuple[Run | None, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        claimed = lease.claim(run.pk, "w9", lease.RESUME, expect=expect)
    sent = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"] not in ("BEGIN", "COMMIT") and not q["sql"].startswith("SAVEPOINT")
    ]
    return claimed, sent


def resuming_events(run: Run) -> list[tuple]:
    return list(
        AuditEvent.objects.filter(run_id=run.pk, action="run.resuming").values_list(
            "tenant_id", "actor_name", "outcome", "detail"
        )
    )


def test_the_decision_queues_the_resume_with_the_runs_tenant_and_attempts():
    run = decided_run()

    (task,) = DBTaskResult.objects.filter(task_path__endswith="resume_run_task")
    assert task.args_kwargs == {
        "args": [run.pk],
        "kwargs": {"tenant_id": run.tenant_id, "attempts": 0},
    }


def test_a_claim_as_expected_writes_its_event_with_it():
    run = decided_run()

    claimed, sent = claim_sent(run, (run.tenant_id, run.attempts))

    assert claimed is not None and (claimed.status, claimed.attempts) == (RunStatus.RESUMING, 1)
    assert resuming_events(run) == [(run.tenant_id, "worker w9", "resuming", {"attempt": 1})]
    # The decision in this process saw the tenant's head: the claim and its event are one
    # statement on PostgreSQL; elsewhere the claim reads the run and appends, as without.
    if connection.vendor == "postgresql":
        assert len(sent) == 1, sent
    assert chain.verify_chain(run.tenant).ok


@pytest.mark.parametrize("stale", ["attempts", "tenant"])
def test_a_claim_whose_expectation_no_longer_holds_is_made_as_without_it(stale):
    run = decided_run()
    other = TenantFactory()
    # A lapsed attempt moved the attempts on since the decision; or a wrong tenant was given.
    Run.objects.filter(pk=run.pk).update(attempts=3)
    expect = (run.tenant_id, 0) if stale == "attempts" else (other.pk, 3)

    claimed, sent = claim_sent(run, expect)

    assert claimed is not None and claimed.attempts == 4
    # The event names the run's own tenant and its real attempt, never what was expected.
    assert resuming_events(run) == [(run.tenant_id, "worker w9", "resuming", {"attempt": 4})]
    assert not AuditEvent.objects.filter(tenant_id=other.pk).exists()
    if connection.vendor == "postgresql":
        # The expected claim changed nothing; then the claim and its event, as without.
        assert len(sent) == 3, sent
    assert chain.verify_chain(run.tenant).ok


def test_a_claim_as_expected_of_a_run_another_worker_holds_takes_nothing():
    run = decided_run()
    assert lease.claim(run.pk, "w1", lease.RESUME, expect=(run.tenant_id, 0)) is not None

    claimed, _ = claim_sent(run, (run.tenant_id, 0))

    assert claimed is None
    assert resuming_events(run) == [(run.tenant_id, "worker w1", "resuming", {"attempt": 1})]


def test_the_task_resumes_a_run_with_or_without_its_expectation():
    queued = [decided_run(), decided_run()]

    assert queue.resume_run_task.call(queued[0].pk) == RunStatus.COMPLETED
    assert (
        queue.resume_run_task.call(queued[1].pk, tenant_id=queued[1].tenant_id, attempts=0)
        == RunStatus.COMPLETED
    )
    assert len(demo.read_effects()) == 2
    for run in queued:
        assert [e[3] for e in resuming_events(run)] == [{"attempt": 1}]


def test_a_resume_as_its_task_queued_it_completes_once():
    run = decided_run()

    outcome = resume(run_id=run.pk, worker_id="w9", expect=(run.tenant_id, run.attempts))
    again = resume(run_id=run.pk, worker_id="w8", expect=(run.tenant_id, run.attempts))

    assert outcome.status == RunStatus.COMPLETED
    assert again.reason == "not claimed: another delivery has it"
    assert [e["environment"] for e in demo.read_effects()] == ["production"]
