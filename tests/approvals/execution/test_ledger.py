"""The ledger's key: one effect per approval, operation and resource, no fewer.

Each part of the key is held by a test that fails without it: two resources of one approval,
and two runs of the same prompt (a new run is not a resume), each get their own effect.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.execution import ledger
from approvals.models import IdempotencyRecord, LedgerStatus, Ticket
from tests.support import TenantFactory, paused_run

pytestmark = pytest.mark.django_db


class Effects:
    """An effect that counts its runs and returns which one it was."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, name: str):
        def effect() -> str:
            self.calls.append(name)
            return f"{name} #{len(self.calls)}"

        return effect


def scope_of(run, *, attempt: str = "w1") -> ledger.ResumeScope:
    tickets = {t.tool_call_id: t.pk for t in Ticket.objects.filter(run=run)}
    return ledger.ResumeScope(
        tenant_id=run.tenant_id, run_id=run.pk, attempt=attempt, tickets_by_call_id=tickets
    )


def only_call_id(run) -> str:
    return Ticket.objects.get(run=run).tool_call_id


def test_two_resources_of_one_approval_give_two_effects():
    run = paused_run(TenantFactory())
    call_id = only_call_id(run)
    effects = Effects()

    with ledger.resume_scope(scope_of(run)):
        first = ledger.perform(
            call_id, operation="deploy_release", resource="staging", effect=effects("staging")
        )
        second = ledger.perform(
            call_id,
            operation="deploy_release",
            resource="production",
            effect=effects("production"),
        )

    assert effects.calls == ["staging", "production"]
    assert (first, second) == ("staging #1", "production #2")
    records = IdempotencyRecord.objects.filter(run=run).order_by("pk")
    assert [(r.resource, r.status) for r in records] == [
        ("staging", LedgerStatus.DONE),
        ("production", LedgerStatus.DONE),
    ]
    assert records[0].key != records[1].key


def test_the_same_resource_of_one_approval_runs_once_and_returns_the_stored_result():
    """The control of the test above: the key does dedupe what it must."""
    run = paused_run(TenantFactory())
    call_id = only_call_id(run)
    effects = Effects()

    with ledger.resume_scope(scope_of(run)):
        first = ledger.perform(
            call_id, operation="deploy_release", resource="production", effect=effects("a")
        )
    with ledger.resume_scope(scope_of(run, attempt="w2")):
        again = ledger.perform(
            call_id, operation="deploy_release", resource="production", effect=effects("b")
        )

    assert effects.calls == ["a"]
    assert again == first == "a #1"
    assert IdempotencyRecord.objects.filter(run=run).count() == 1


def test_two_runs_of_the_same_prompt_each_get_their_own_effect():
    """Running the prompt again is a new run, not a resume: its approval is its own, so the
    ledger must not hand it the first run's stored result."""
    tenant = TenantFactory()
    first_run = paused_run(tenant)
    second_run = paused_run(tenant)
    effects = Effects()

    results = []
    for run in (first_run, second_run):
        with ledger.resume_scope(scope_of(run)):
            results.append(
                ledger.perform(
                    only_call_id(run),
                    operation="publish_invoice",
                    resource="INV-781",
                    effect=effects(f"run {run.pk}"),
                )
            )

    assert effects.calls == [f"run {first_run.pk}", f"run {second_run.pk}"]
    assert results == [f"run {first_run.pk} #1", f"run {second_run.pk} #2"]
    assert IdempotencyRecord.objects.filter(resource="INV-781").count() == 2


def test_two_runs_approved_without_a_ticket_each_get_their_own_effect():
    """A call approved by a sticky "always" decision has no ticket: the run is its approval."""
    tenant = TenantFactory()
    runs = [paused_run(tenant), paused_run(tenant)]
    effects = Effects()

    for run in runs:
        with ledger.resume_scope(scope_of(run)):
            ledger.perform(
                "call-without-ticket",
                operation="deploy_release",
                resource="production",
                effect=effects(f"run {run.pk}"),
            )

    assert effects.calls == [f"run {runs[0].pk}", f"run {runs[1].pk}"]
    assert sorted(
        IdempotencyRecord.objects.filter(ticket__isnull=True).values_list("run_id", flat=True)
    ) == sorted(r.pk for r in runs)


def test_the_claim_is_one_insert_made_before_the_effect_with_every_field_a_save_wrote():
    run = paused_run(TenantFactory())
    call_id = only_call_id(run)
    ticket = Ticket.objects.get(run=run)
    seen: list[tuple] = []

    def effect() -> str:
        # Read on this connection: inside the test's transaction, the claim is in a savepoint
        # released before the effect. That a worker's claim is committed before its effect
        # (autocommit in the tool's thread) is held by the worker tests that kill it there
        # (tests/approvals/runs/test_workers.py, APPROVALS_FAULT=after_claim).
        record = IdempotencyRecord.objects.get(run=run)
        seen.append(
            (
                record.tenant_id,
                record.ticket_id,
                record.operation,
                record.resource,
                record.status,
                record.claimed_by,
                before <= record.claimed_at <= timezone.now(),
                record.completed_at,
                record.result,
                record.error,
            )
        )
        return "done"

    before = timezone.now()

    with (
        CaptureQueriesContext(connection) as captured,
        ledger.resume_scope(scope_of(run, attempt="w1#1")),
    ):
        ledger.perform(call_id, operation="deploy_release", resource="x" * 600, effect=effect)

    inserts = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].startswith('INSERT INTO "approvals_idempotencyrecord"')
    ]
    assert len(inserts) == 1, inserts
    assert seen == [
        (
            run.tenant_id,
            ticket.pk,
            "deploy_release",
            "x" * 500,
            LedgerStatus.CLAIMED,
            "w1#1",
            True,
            None,
            "",
            "",
        )
    ]
    record = IdempotencyRecord.objects.get(run=run)
    assert (record.status, record.result) == (LedgerStatus.DONE, "done")
    assert record.key == ledger.idempotency_key(
        tenant_id=run.tenant_id,
        approval=f"ticket:{ticket.pk}",
        operation="deploy_release",
        resource="x" * 600,
    )
