"""The ledger's other answers: outside a resume it refuses, a key claimed and never confirmed is
in doubt (with a reason a person can act on, and the whole resume stops), a failing effect is
recorded as failed."""

from __future__ import annotations

import hashlib

import pytest
from django.db import DatabaseError, transaction

from approvals.audit import chain as audit_chain
from approvals.execution import ledger
from approvals.models import AuditEvent, IdempotencyRecord, LedgerStatus, Ticket
from tests.support import TenantFactory, paused_run

pytestmark = pytest.mark.django_db


def scope_of(run, *, attempt: str = "w1") -> ledger.ResumeScope:
    tickets = {t.tool_call_id: t.pk for t in Ticket.objects.filter(run=run)}
    return ledger.ResumeScope(
        tenant_id=run.tenant_id, run_id=run.pk, attempt=attempt, tickets_by_call_id=tickets
    )


def only_call_id(run) -> str:
    return Ticket.objects.get(run=run).tool_call_id


def test_perform_outside_a_resume_is_refused_and_nothing_runs():
    calls = []

    with pytest.raises(ledger.LedgerError) as raised:
        ledger.perform(
            "call_1", operation="deploy_release", resource="production", effect=calls.append
        )

    assert str(raised.value) == "deploy_release may only run inside an approved console resume"
    assert calls == []
    assert IdempotencyRecord.objects.count() == 0


def test_a_key_claimed_and_never_confirmed_is_in_doubt_and_stops_the_resume():
    run = paused_run(TenantFactory())
    call_id = only_call_id(run)
    ran = []
    claimed = IdempotencyRecord.objects.create(
        tenant_id=run.tenant_id,
        key=ledger.idempotency_key(
            tenant_id=run.tenant_id,
            approval=f"ticket:{Ticket.objects.get(run=run).pk}",
            operation="deploy_release",
            resource="production",
        ),
        run_id=run.pk,
        operation="deploy_release",
        resource="production",
        status=LedgerStatus.CLAIMED,
        claimed_by="w1",
    )
    scope = scope_of(run, attempt="w2")

    with ledger.resume_scope(scope), pytest.raises(ledger.EffectInDoubt) as raised:
        ledger.perform(
            call_id,
            operation="deploy_release",
            resource="production",
            effect=lambda: ran.append("x"),
        )

    reason = (
        f"deploy_release on production was started by attempt w1 at "
        f"{claimed.claimed_at:%Y-%m-%d %H:%M:%S} UTC and never confirmed (claimed); check "
        "whether it happened before deciding what to do"
    )
    assert str(raised.value) == reason
    assert scope.in_doubt == reason
    assert ran == []
    # Once in doubt, the resume runs nothing else, and says why.
    with ledger.resume_scope(scope), pytest.raises(ledger.EffectInDoubt) as again:
        ledger.perform(
            call_id, operation="deploy_release", resource="staging", effect=lambda: "staging"
        )
    assert str(again.value) == reason
    assert IdempotencyRecord.objects.filter(run=run).count() == 1


def test_in_doubt_keeps_the_first_reason():
    run = paused_run(TenantFactory())
    scope = scope_of(run)

    first = ledger._in_doubt(scope, "first reason")
    second = ledger._in_doubt(scope, "second reason")

    assert (str(first), str(second), scope.in_doubt) == (
        "first reason",
        "second reason",
        "first reason",
    )


def test_a_failing_effect_is_recorded_failed_and_raised():
    run = paused_run(TenantFactory())
    scope = scope_of(run)

    def effect() -> str:
        raise ValueError("the registry said no")

    with ledger.resume_scope(scope), pytest.raises(ValueError, match="the registry said no"):
        ledger.perform(
            only_call_id(run), operation="deploy_release", resource="production", effect=effect
        )

    record = IdempotencyRecord.objects.get(run=run)
    assert (record.status, record.error) == (
        LedgerStatus.FAILED,
        "ValueError: the registry said no",
    )
    assert record.completed_at is not None
    assert scope.effects == []
    assert not AuditEvent.objects.filter(action="effect.done").exists()


def test_a_done_effect_is_recorded_with_its_result_and_audited():
    run = paused_run(TenantFactory())
    ticket = Ticket.objects.get(run=run)
    scope = scope_of(run, attempt="w7")

    with ledger.resume_scope(scope):
        result = ledger.perform(
            ticket.tool_call_id,
            operation="deploy_release",
            resource="production",
            effect=lambda: 42,
        )

    record = IdempotencyRecord.objects.get(run=run)
    assert result == "42"
    assert (record.status, record.result, record.ticket_id, record.claimed_by) == (
        LedgerStatus.DONE,
        "42",
        ticket.pk,
        "w7",
    )
    assert (record.operation, record.resource, record.tenant_id) == (
        "deploy_release",
        "production",
        run.tenant_id,
    )
    assert record.completed_at is not None
    assert scope.effects == [record.pk]
    event = AuditEvent.objects.get(action="effect.done")
    assert (event.run_id, event.ticket_id, event.actor_name, event.tool_name, event.outcome) == (
        run.pk,
        ticket.pk,
        "worker w7",
        "deploy_release",
        LedgerStatus.DONE,
    )
    assert event.detail == {"resource": "production"}


def test_a_call_without_a_ticket_is_keyed_by_its_run():
    run = paused_run(TenantFactory())

    with ledger.resume_scope(scope_of(run)):
        ledger.perform(None, operation="deploy_release", resource="production", effect=lambda: "")

    record = IdempotencyRecord.objects.get(run=run)
    assert record.ticket_id is None
    assert record.key == ledger.idempotency_key(
        tenant_id=run.tenant_id,
        approval=f"run:{run.pk}",
        operation="deploy_release",
        resource="production",
    )


def test_idempotency_key_known_answer():
    """The key's formula is pinned: a change would make every stored effect run again."""
    key = ledger.idempotency_key(
        tenant_id=7, approval="ticket:12", operation="deploy_release", resource="production"
    )

    assert (
        key
        == hashlib.sha256(
            b'["approvals.ledger.v1",7,"ticket:12","deploy_release","production"]'
        ).hexdigest()
    )


def test_the_key_is_claimed_before_the_effect_runs_with_its_resource_cut_to_the_field():
    run = paused_run(TenantFactory())
    resource = "r" * 600
    seen = []

    def effect() -> str:
        record = IdempotencyRecord.objects.get(run=run)
        seen.append((record.status, record.resource, record.claimed_by))
        return "done"

    with ledger.resume_scope(scope_of(run, attempt="w3")):
        ledger.perform(
            only_call_id(run), operation="deploy_release", resource=resource, effect=effect
        )

    assert seen == [(LedgerStatus.CLAIMED, "r" * 500, "w3")]


def test_a_failing_effects_error_is_kept_to_2000_characters():
    run = paused_run(TenantFactory())

    def effect() -> str:
        raise ValueError("x" * 3000)

    with ledger.resume_scope(scope_of(run)), pytest.raises(ValueError):
        ledger.perform(only_call_id(run), operation="deploy_release", resource="p", effect=effect)

    assert IdempotencyRecord.objects.get(run=run).error == ("ValueError: " + "x" * 3000)[:2000]


def test_an_effect_whose_confirmation_cannot_be_stored_is_in_doubt_and_stops_the_resume(
    monkeypatch,
):
    run = paused_run(TenantFactory())
    ticket = Ticket.objects.get(run=run)
    scope = scope_of(run, attempt="w3")
    ran = []

    def refuse(queryset, *, events=(), **values):
        # The record is confirmed, then writing its audit event fails.
        with transaction.atomic():
            queryset.update(**values)
            raise DatabaseError("disk full")

    monkeypatch.setattr(ledger.alone, "update_queryset_with_events", refuse)
    reason = (
        "deploy_release on production ran in attempt w3 but its confirmation could not be "
        "stored (DatabaseError); check whether it happened"
    )

    with ledger.resume_scope(scope), pytest.raises(ledger.EffectInDoubt) as raised:
        ledger.perform(
            ticket.tool_call_id,
            operation="deploy_release",
            resource="production",
            effect=lambda: ran.append(1),
        )

    assert str(raised.value) == reason
    assert isinstance(raised.value.__cause__, DatabaseError)
    assert scope.in_doubt == reason
    assert ran == [1]
    assert scope.effects == []
    # The confirmation rolled back with the audit event: the claim is all that is left.
    assert IdempotencyRecord.objects.get(run=run).status == LedgerStatus.CLAIMED


def test_the_fault_points_are_after_the_claim_and_after_the_effect(monkeypatch):
    run = paused_run(TenantFactory())
    ticket = Ticket.objects.get(run=run)
    seen = []
    monkeypatch.setattr(
        ledger.faults,
        "point",
        lambda name: seen.append((name, IdempotencyRecord.objects.get(run=run).status)),
    )

    with ledger.resume_scope(scope_of(run)):
        ledger.perform(
            ticket.tool_call_id,
            operation="deploy_release",
            resource="production",
            effect=lambda: seen.append(("effect", None)) or "ok",
        )

    assert seen == [
        ("after_claim", LedgerStatus.CLAIMED),
        ("effect", None),
        ("after_effect", LedgerStatus.CLAIMED),
    ]


def test_the_done_events_resource_is_cut_to_200_characters():
    run = paused_run(TenantFactory())
    ticket = Ticket.objects.get(run=run)
    resource = "r" * 300

    with ledger.resume_scope(scope_of(run)):
        ledger.perform(
            ticket.tool_call_id, operation="deploy_release", resource=resource, effect=str
        )

    assert AuditEvent.objects.get(action="effect.done").detail == {"resource": "r" * 200}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("seen", ["head seen", "no head seen"])
def test_a_confirmation_whose_event_cannot_be_written_leaves_the_claim_alone(monkeypatch, seen):
    """Outside any transaction, as in a resume's tool thread: the confirmation and its event are
    one statement on PostgreSQL (or one transaction), so an event that cannot be written takes
    the confirmation with it."""
    run = paused_run(TenantFactory())
    ticket = Ticket.objects.get(run=run)
    scope = scope_of(run, attempt="w4")
    if seen == "no head seen":
        monkeypatch.setattr(audit_chain, "_seen", {})
    events_before = AuditEvent.objects.filter(run=run).count()
    new_event = audit_chain.new_event

    def unwritable(**fields):
        event = new_event(**fields)
        event.action = None  # the column refuses NULL: the event's INSERT fails
        return event

    monkeypatch.setattr(ledger.audit, "new_event", unwritable)
    ran = []

    with ledger.resume_scope(scope), pytest.raises(ledger.EffectInDoubt):
        ledger.perform(
            ticket.tool_call_id,
            operation="deploy_release",
            resource="production",
            effect=lambda: ran.append(1),
        )

    assert ran == [1]
    assert scope.effects == []
    assert IdempotencyRecord.objects.get(run=run).status == LedgerStatus.CLAIMED
    assert AuditEvent.objects.filter(run=run).count() == events_before
    assert audit_chain.verify_chain(run.tenant).ok
