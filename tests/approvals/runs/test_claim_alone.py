"""A run's claim as one statement committed alone: the task's claim reads the run's tenant and
attempts (workers.RunHint), and the run's claim, with its audit event linked beforehand, needs
no transaction. A wrong hint, or none, claims in a transaction as before."""

from __future__ import annotations

import pytest
from django.db import connection
from django_tasks_db.models import DBTaskResult

from approvals.audit import alone
from approvals.audit import chain as audit
from approvals.decisions.decide import decide
from approvals.execution import queue, workers
from approvals.models import AuditEvent, Role, Run, RunStatus, Tenant, Ticket
from approvals.runs import lease
from devtools.bench import queries
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES_ONLY = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the claim's hint and its one statement"
)


def _queued(tenant) -> Run:
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, "req"))
    decide(Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER, "ann"), approve=True)
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.QUEUED
    return run


def _claimed(run: Run, hint: workers.RunHint | None):
    """lease.claim of the run with this hint: (the run claimed or None, counts)."""
    with queries.counting() as counts, workers.hinted(hint):
        claimed = lease.claim(run.pk, "w", lease.RESUME)
    return claimed, counts


def _attempts_recorded(run: Run) -> list:
    return [
        event.detail["attempt"]
        for event in AuditEvent.objects.filter(run_id=run.pk, action="run.resuming").order_by("seq")
    ]


def _claim_task():
    return workers.claim_next(backend_name="default", queue_names=["default"], worker_id="w")


@POSTGRES_ONLY
def test_the_claim_of_a_run_s_task_reads_the_run_s_tenant_and_attempts():
    tenant = TenantFactory(slug="acme")
    run = _queued(tenant)
    Run.objects.filter(pk=run.pk).update(attempts=3)

    task_result = _claim_task()

    assert task_result.args_kwargs["args"] == [run.pk]
    head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)
    assert task_result.run_hint == workers.RunHint(run.pk, tenant.pk, 3, head=head)


@POSTGRES_ONLY
@pytest.mark.parametrize("args", [[], ["12"], [None], [{"run": 1}]])
def test_a_task_whose_first_argument_is_no_run_id_has_no_hint(args):
    queue.resume_run_task.enqueue(*args)

    task_result = _claim_task()

    assert task_result.args_kwargs["args"] == args
    assert task_result.run_hint is None


@POSTGRES_ONLY
def test_a_task_of_another_kind_has_no_hint_even_with_a_run_s_id():
    tenant = TenantFactory(slug="acme")
    run = _queued(tenant)
    # The run's resume task, made a task of another path with the same arguments.
    DBTaskResult.objects.filter(args_kwargs__args=[run.pk]).update(
        task_path="approvals.execution.queue.decision_words"
    )

    task_result = _claim_task()

    assert task_result.args_kwargs["args"] == [run.pk]
    assert task_result.run_hint is None


@POSTGRES_ONLY
def test_a_claim_with_the_run_s_hint_is_one_statement_and_no_transaction():
    tenant = TenantFactory(slug="acme")
    run = _queued(tenant)

    claimed, counts = _claimed(run, workers.RunHint(run.pk, tenant.pk, run.attempts))

    assert claimed.status == RunStatus.RESUMING
    assert (claimed.lease_owner, claimed.attempts) == ("w", run.attempts + 1)
    assert (counts["main"], counts["commits"]) == (1, 0), counts.log
    assert _attempts_recorded(run) == [run.attempts + 1]
    assert audit.verify_chain(tenant).ok
    assert Run.objects.get(pk=run.pk).status == RunStatus.RESUMING


@POSTGRES_ONLY
def test_a_claim_links_its_event_to_the_head_its_hint_read_not_to_an_older_sighting():
    tenant = TenantFactory(slug="acme")
    run = _queued(tenant)
    head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)
    # As if another worker had appended since this process last wrote to the chain.
    audit._saw(tenant.pk, 1, "f" * 64)

    claimed, counts = _claimed(run, workers.RunHint(run.pk, tenant.pk, run.attempts, head=head))

    assert claimed.attempts == run.attempts + 1
    # No miss: the hint's head was the head.
    assert (counts["main"], counts["commits"]) == (1, 0), counts.log
    assert audit.verify_chain(tenant).ok


@POSTGRES_ONLY
@pytest.mark.parametrize("wrong", ["attempts", "tenant"])
def test_a_claim_with_a_wrong_hint_changes_nothing_alone_and_claims_in_a_transaction(wrong):
    tenant = TenantFactory(slug="acme")
    other = TenantFactory(slug="other")
    _queued(other)  # the other tenant's head is seen too
    run = _queued(tenant)
    hint = workers.RunHint(
        run.pk,
        other.pk if wrong == "tenant" else tenant.pk,
        run.attempts + 5 if wrong == "attempts" else run.attempts,
    )
    guards = []
    missed = alone._missed

    def spied(error):
        guards.append(error)
        return missed(error)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(alone, "_missed", spied)
        claimed, counts = _claimed(run, hint)

    assert claimed.attempts == run.attempts + 1
    # The statement alone changed nothing and failed nothing; then the transaction's two.
    assert guards == []
    assert (counts["main"], counts["commits"]) == (3, 1), counts.log
    # One event, with the attempt the claim took, in the run's tenant's chain.
    assert _attempts_recorded(run) == [run.attempts + 1]
    assert AuditEvent.objects.get(run_id=run.pk, action="run.resuming").tenant_id == tenant.pk
    assert audit.verify_chain(tenant).ok
    assert audit.verify_chain(other).ok


def test_a_claim_without_a_hint_is_a_transaction_of_the_claim_and_its_event():
    tenant = TenantFactory(slug="acme")
    run = _queued(tenant)

    claimed, counts = _claimed(run, None)

    assert claimed.attempts == run.attempts + 1
    assert counts["commits"] == 1
    if connection.vendor == "postgresql":
        assert counts["main"] == 2, counts.log
    assert _attempts_recorded(run) == [run.attempts + 1]
    assert audit.verify_chain(tenant).ok


@pytest.mark.parametrize("hinted", [False, True])
def test_a_run_claimed_already_is_not_claimed_again_with_or_without_a_hint(hinted):
    tenant = TenantFactory(slug="acme")
    run = _queued(tenant)
    first, _ = _claimed(run, None)

    again, _ = _claimed(
        first, workers.RunHint(run.pk, tenant.pk, first.attempts) if hinted else None
    )

    assert again is None
    assert _attempts_recorded(run) == [first.attempts]
    assert Run.objects.get(pk=run.pk).lease_owner == "w"
    assert audit.verify_chain(tenant).ok


@POSTGRES_ONLY
def test_a_hint_of_another_run_is_not_used():
    tenant = TenantFactory(slug="acme")
    run = _queued(tenant)

    claimed, counts = _claimed(run, workers.RunHint(run.pk + 1, tenant.pk, run.attempts))

    assert claimed.attempts == run.attempts + 1
    assert (counts["main"], counts["commits"]) == (2, 1), counts.log
