"""What an attempt leaves when it ends, for each way it can end: retried later, refused, in
doubt, failed, paused again or lost; each outcome, the run's row, its event and its hint, by
the lease's own functions on a run a worker holds."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from approvals.decisions.decide import decide
from approvals.execution import ledger
from approvals.execution.state import PauseError
from approvals.models import AuditEvent, Role, Run, RunStatus, Ticket, TicketStatus
from approvals.runs import checks, lease
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

IN_DOUBT = "deploy_release on production ran in attempt w1 but its confirmation could not be stored"


def held_run(status: str = RunStatus.RESUMING) -> Run:
    """A decided run worker w1 holds (attempt 1) under a live lease."""
    tenant = TenantFactory()
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))
    decide(Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER), approve=True)
    Run.objects.filter(pk=run.pk).update(
        status=status,
        lease_owner="w1",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
        attempts=1,
    )
    return Run.objects.get(pk=run.pk)


def scope_of(run: Run, *, in_doubt: str = "", effects=(7, 8)) -> ledger.ResumeScope:
    scope = ledger.ResumeScope(
        tenant_id=run.tenant_id, run_id=run.pk, attempt="w1", tickets_by_call_id={}
    )
    scope.in_doubt = in_doubt
    scope.effects.extend(effects)
    return scope


@pytest.fixture
def hints(monkeypatch) -> list[tuple[int, str, dict]]:
    sent: list[tuple[int, str, dict]] = []
    monkeypatch.setattr(
        lease.hints,
        "notify_on_commit",
        lambda tenant_id, kind, **data: sent.append((tenant_id, kind, data)),
    )
    return sent


def last_event(run: Run) -> tuple:
    event = AuditEvent.objects.filter(run_id=run.pk).order_by("-seq").first()
    return (event.action, event.actor_name, event.outcome, event.detail)


def row(run: Run) -> tuple:
    run = Run.objects.get(pk=run.pk)
    return (run.status, run.status_reason, run.lease_owner, run.lease_expires_at)


# --- stopped: the attempt raised --------------------------------------------------------------


@pytest.mark.parametrize(
    ("holding", "back"),
    [(RunStatus.RESUMING, RunStatus.QUEUED), (RunStatus.STARTING, RunStatus.STARTING)],
)
def test_an_unreachable_dependency_gives_the_run_back_to_try_again(hints, holding, back):
    run = held_run(holding)
    touched = Run.objects.get(pk=run.pk).updated_at
    hints.clear()

    outcome = lease.stopped(run, scope_of(run), checks.Unavailable("the session store is down"))

    reason = "the session store is down; will try again"
    assert outcome == lease.WorkOutcome(run.pk, back, reason, [7, 8])
    assert row(run) == (back, reason, "", None)
    assert Run.objects.get(pk=run.pk).updated_at > touched
    assert last_event(run) == ("run.retry_later", "worker w1", back, {"reason": reason})
    assert hints == [(run.tenant_id, "run.changed", {"run": run.pk, "status": back})]


def test_a_run_another_worker_took_over_is_not_given_back():
    run = held_run()
    Run.objects.filter(pk=run.pk).update(lease_owner="w2", attempts=2)
    events = AuditEvent.objects.count()

    assert lease.release(run, reason="try again") is False
    assert lease.release(Run.objects.get(pk=run.pk), reason="try again") is True
    assert AuditEvent.objects.count() == events + 1


def test_a_refusal_parks_the_run_with_its_reason_and_the_attempts_effects(hints):
    run = held_run()

    outcome = lease.stopped(run, scope_of(run), checks.Refusal("the state was tampered with"))

    assert outcome == lease.WorkOutcome(
        run.pk, RunStatus.NEEDS_ATTENTION, "the state was tampered with", [7, 8]
    )
    assert row(run) == (RunStatus.NEEDS_ATTENTION, "the state was tampered with", "", None)
    assert last_event(run)[0] == "run.refused"


def test_an_error_after_an_effect_in_doubt_parks_the_run_in_doubt(hints):
    run = held_run()

    outcome = lease.stopped(run, scope_of(run, in_doubt=IN_DOUBT), RuntimeError("tool failed"))

    assert outcome == lease.WorkOutcome(run.pk, RunStatus.NEEDS_ATTENTION, IN_DOUBT, [7, 8])
    assert row(run) == (RunStatus.NEEDS_ATTENTION, IN_DOUBT, "", None)
    assert last_event(run) == (
        "run.in_doubt",
        "worker w1",
        RunStatus.NEEDS_ATTENTION,
        {"reason": IN_DOUBT},
    )


def test_any_other_error_fails_the_run_and_is_logged_with_its_traceback(hints, caplog):
    run = held_run()
    error = ValueError("the model said nothing")

    with caplog.at_level(logging.ERROR, logger=lease.logger.name):
        outcome = lease.stopped(run, scope_of(run), error)

    reason = "ValueError: the model said nothing"
    assert outcome == lease.WorkOutcome(run.pk, RunStatus.FAILED, reason, [7, 8])
    assert row(run) == (RunStatus.FAILED, reason, "", None)
    assert last_event(run) == ("run.failed", "worker w1", RunStatus.FAILED, {"reason": reason})
    (logged,) = [r for r in caplog.records if r.name == lease.logger.name]
    assert logged.getMessage() == f"run {run.pk} failed"
    assert logged.exc_info[1] is error


def test_a_failure_reason_is_cut_to_1000_characters():
    assert lease.safe_reason(ValueError("x" * 2000)) == ("ValueError: " + "x" * 2000)[:1000]


# --- settled: the agent finished or paused again ----------------------------------------------


def test_an_attempt_that_finished_with_an_effect_in_doubt_parks_the_run_in_doubt(hints):
    run = held_run()
    result = SimpleNamespace(interruptions=[], final_output="done")
    hints.clear()

    outcome = lease.settled(run, scope_of(run, in_doubt=IN_DOUBT), result, store_pause=pytest.fail)

    assert outcome == lease.WorkOutcome(run.pk, RunStatus.NEEDS_ATTENTION, IN_DOUBT, [7, 8])
    assert row(run) == (RunStatus.NEEDS_ATTENTION, IN_DOUBT, "", None)
    assert last_event(run) == (
        "run.in_doubt",
        "worker w1",
        RunStatus.NEEDS_ATTENTION,
        {"reason": IN_DOUBT},
    )
    assert hints == [
        (run.tenant_id, "run.changed", {"run": run.pk, "status": RunStatus.NEEDS_ATTENTION})
    ]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (PauseError("the new pause could not be stored"), "the new pause could not be stored"),
        (IntegrityError("duplicate ticket"), "IntegrityError: duplicate ticket"),
    ],
)
def test_a_pause_that_cannot_be_stored_fails_the_run_saying_why(hints, error, reason):
    run = held_run()
    result = SimpleNamespace(interruptions=["a call"], final_output=None)

    def store_pause(locked):
        raise error

    outcome = lease.settled(run, scope_of(run), result, store_pause=store_pause)

    assert outcome == lease.WorkOutcome(run.pk, RunStatus.FAILED, reason, [7, 8])
    assert row(run) == (RunStatus.FAILED, reason, "", None)


# --- not claimed, and the lease's renewal -----------------------------------------------------


def test_a_run_nobody_can_find_is_not_claimed_as_missing():
    assert lease.not_claimed(10**9) == lease.WorkOutcome(
        10**9, "missing", "not claimed: another delivery has it"
    )


@pytest.mark.django_db(transaction=True)
def test_renewing_the_lease_moves_its_end_a_lease_ahead_only_while_the_attempt_holds_it():
    run = held_run()
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now())
    before = timezone.now()

    assert lease._extend_lease(run) is True

    until = Run.objects.get(pk=run.pk).lease_expires_at
    ahead = timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    assert before + ahead <= until <= timezone.now() + ahead
    Run.objects.filter(pk=run.pk).update(lease_owner="w2", attempts=2)
    assert lease._extend_lease(run) is False
    assert Run.objects.get(pk=run.pk).lease_expires_at == until


# --- the claim, and what an attempt still holds -----------------------------------------------


def test_a_claim_takes_the_run_with_a_lease_its_event_and_its_hint(hints):
    run = held_run()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED, lease_owner="", attempts=0)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=None)
    hints.clear()
    before = timezone.now()

    claimed = lease.claim(run.pk, "w9", lease.RESUME)

    stored = Run.objects.get(pk=run.pk)
    ahead = timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    assert (stored.status, stored.lease_owner, stored.attempts) == (RunStatus.RESUMING, "w9", 1)
    assert before + ahead <= stored.lease_expires_at <= timezone.now() + ahead
    assert before <= stored.updated_at <= timezone.now()
    assert (claimed.pk, claimed.lease_owner, claimed.attempts) == (run.pk, "w9", 1)
    assert last_event(run) == ("run.resuming", "worker w9", RunStatus.RESUMING, {"attempt": 1})
    assert hints == [(run.tenant_id, "run.changed", {"run": run.pk, "status": RunStatus.RESUMING})]


def test_an_attempt_writes_only_its_own_run():
    run, other = held_run(), held_run()

    assert lease.finish(run, status=RunStatus.COMPLETED, action="run.completed") is True

    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    assert row(other) == (
        RunStatus.RESUMING,
        "",
        "w1",
        Run.objects.get(pk=other.pk).lease_expires_at,
    )


def test_an_earlier_attempt_of_the_same_worker_no_longer_holds_the_run():
    run = held_run()
    # The reaper took the run back and the same worker claimed it again: attempt 2.
    Run.objects.filter(pk=run.pk).update(attempts=2)
    events = AuditEvent.objects.count()

    assert lease.finish(run, status=RunStatus.COMPLETED, action="run.completed") is False

    assert Run.objects.get(pk=run.pk).status == RunStatus.RESUMING
    assert AuditEvent.objects.count() == events


def test_a_finished_run_supersedes_its_pending_tickets_and_an_outcome_without_reason_says_none():
    run = held_run()
    Ticket.objects.filter(run=run).update(status=TicketStatus.PENDING)

    assert lease.finish(run, status=RunStatus.COMPLETED, action="run.completed") is True

    assert set(Ticket.objects.filter(run=run).values_list("status", flat=True)) == {
        TicketStatus.SUPERSEDED
    }
    assert last_event(run) == ("run.completed", "worker w1", RunStatus.COMPLETED, {})


@pytest.mark.parametrize(
    ("output", "stored"),
    [
        ("Release 2026.07.24 is live.", "Release 2026.07.24 is live."),
        ({"release": "2026.07.24", "live": True}, '{"release": "2026.07.24", "live": true}'),
        ({"at": datetime(2026, 7, 24, 9, 30, tzinfo=UTC)}, '{"at": "2026-07-24 09:30:00+00:00"}'),
    ],
    ids=["text", "json", "json-of-a-date"],
)
def test_a_finished_attempt_completes_the_run_with_its_final_output(hints, output, stored):
    run = held_run()
    result = SimpleNamespace(interruptions=[], final_output=output)

    outcome = lease.settled(run, scope_of(run), result, store_pause=pytest.fail)

    assert outcome == lease.WorkOutcome(run.pk, RunStatus.COMPLETED, "", [7, 8])
    assert Run.objects.get(pk=run.pk).final_output == stored
    assert last_event(run)[:3] == ("run.completed", "worker w1", RunStatus.COMPLETED)


def test_an_attempt_that_finished_after_losing_the_lease_stores_nothing_and_says_so(caplog):
    run = held_run()
    Run.objects.filter(pk=run.pk).update(lease_owner="w2", attempts=2)
    result = SimpleNamespace(interruptions=[], final_output="done")

    with caplog.at_level(logging.WARNING, logger=lease.logger.name):
        outcome = lease.settled(run, scope_of(run), result, store_pause=pytest.fail)

    assert outcome == lease.WorkOutcome(
        run.pk, "lease_lost", "another worker owns the run now", [7, 8]
    )
    assert Run.objects.get(pk=run.pk).final_output == ""
    (logged,) = [r for r in caplog.records if r.name == lease.logger.name]
    assert logged.getMessage() == (
        f"run {run.pk}: outcome not stored, the lease had passed to another worker"
    )
