"""resume, in-process: decisions applied once, and every state the code cannot honour refused."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from agents.memory import SQLiteSession
from django.utils import timezone

from approvals.decisions.decide import decide
from approvals.execution import sessions as agent_sessions
from approvals.execution.ledger import idempotency_key
from approvals.execution.state import open_state
from approvals.models import (
    AuditEvent,
    IdempotencyRecord,
    LedgerStatus,
    Membership,
    Role,
    Run,
    RunStatus,
    Ticket,
    TicketStatus,
    TicketVote,
)
from approvals.runs.pause import pause_run
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_run, run_agent, two_call_agent

pytestmark = pytest.mark.django_db(transaction=True)

TWO_ENVIRONMENTS = "Deploy release 2026.07.24 to staging and production"
DENIED = "Deployment was denied by the release manager."


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # Users are made by the factory with a password; the default PBKDF2 costs ~1 s per user.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def model_calls(monkeypatch) -> dict[str, int]:
    monkeypatch.setitem(demo.MODEL_CALLS, "release", 0)
    monkeypatch.setitem(demo.MODEL_CALLS, "invoice", 0)
    return demo.MODEL_CALLS


def actions(run: Run) -> list[str]:
    return list(
        AuditEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("action", flat=True)
    )


def decided_run(
    *, approve: bool = True, prompt: str = "Deploy release 2026.07.24 to production", **decision
):
    """A run paused by a viewer and decided by an approver: queued, ready to resume."""
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER)
    run = paused_run(tenant, prompt=prompt, requested_by=member(tenant, Role.VIEWER))
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=approver, approve=approve, **decision)
    return run, Ticket.objects.get(pk=ticket.pk), approver


def assert_refused(outcome, run: Run, *, status: str, reason: str) -> None:
    run.refresh_from_db()
    assert outcome.status == status
    assert run.status == status
    assert reason in run.status_reason
    assert outcome.reason == run.status_reason
    assert outcome.effects == []
    assert demo.read_effects() == []
    assert IdempotencyRecord.objects.count() == 0
    assert actions(run)[-2:] == ["run.resuming", "run.refused"]
    assert run.lease_owner == ""
    assert run.final_output == ""


# --- the decision is applied once ---------------------------------------------------------------


def test_resume_approved_runs_the_tool_once_and_completes(model_calls):
    run, ticket, _ = decided_run()

    outcome = resume(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.COMPLETED
    assert run.status == RunStatus.COMPLETED
    assert run.final_output == "Release 2026.07.24: Release 2026.07.24 is live on production."
    effects = demo.read_effects()
    assert [(e["op"], e["release"], e["environment"]) for e in effects] == [
        ("deploy_release", "2026.07.24", "production")
    ]
    record = IdempotencyRecord.objects.get(run=run)
    assert (record.status, record.ticket_id, record.claimed_by) == ("done", ticket.pk, "w1#1")
    assert outcome.effects == [record.pk]
    assert model_calls["release"] == 2
    assert run.attempts == 1
    assert actions(run)[-3:] == ["run.resuming", "effect.done", "run.completed"]
    assert AuditEvent.objects.get(action="effect.done").ticket_id == ticket.pk


def test_resume_puts_the_deploy_token_back_from_the_environment(monkeypatch):
    monkeypatch.setenv("RELEASE_DEPLOY_TOKEN", "token-from-the-worker-environment")
    tenant = TenantFactory()
    run = paused_run(
        tenant,
        requested_by=member(tenant, Role.VIEWER),
        context={"deploy_token": "token-from-the-requester", "team": "ops"},
    )
    assert open_state(run)["context"]["context"] == {"team": "ops"}
    decide(Ticket.objects.get(run=run), user=member(tenant), approve=True)

    assert resume(run_id=run.pk).status == RunStatus.COMPLETED

    assert [e["authenticated"] for e in demo.read_effects()] == [True]


def test_resume_rejected_never_runs_the_tool_and_the_model_gets_the_message(model_calls):
    run, _, _ = decided_run(approve=False, message=DENIED)

    outcome = resume(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.COMPLETED
    assert run.status == RunStatus.COMPLETED
    assert demo.read_effects() == []
    assert IdempotencyRecord.objects.count() == 0
    # The scripted model echoes the tool output it received: the rejection message.
    assert run.final_output == f"Release 2026.07.24: {DENIED}"
    assert model_calls["release"] == 2


def test_resume_second_delivery_does_nothing(model_calls):
    run, _, _ = decided_run()
    first = resume(run_id=run.pk, worker_id="w1")

    second = resume(run_id=run.pk, worker_id="w2")

    assert first.status == RunStatus.COMPLETED
    assert second.status == RunStatus.COMPLETED
    assert second.reason == "not claimed: another delivery has it"
    assert second.effects == []
    assert len(demo.read_effects("deploy_release")) == 1
    assert model_calls["release"] == 2
    assert Run.objects.get(pk=run.pk).attempts == 1
    assert actions(run).count("run.resuming") == 1


def test_resume_of_a_paused_run_with_pending_ticket_is_not_claimed():
    tenant = TenantFactory()
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert (outcome.status, outcome.reason) == (
        RunStatus.PAUSED,
        "not claimed: another delivery has it",
    )
    assert Ticket.objects.get(run=run).status == TicketStatus.PENDING
    assert demo.read_effects() == []


# --- always-approve and a second pause -------------------------------------------------------------


def test_resume_always_approve_runs_both_environments_without_a_second_ticket(model_calls):
    run, staging, _ = decided_run(prompt=TWO_ENVIRONMENTS, always=True)
    assert staging.tool_call_id == "call_deploy_2026.07.24_staging"

    outcome = resume(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.COMPLETED
    assert [e["environment"] for e in demo.read_effects("deploy_release")] == [
        "staging",
        "production",
    ]
    assert Ticket.objects.filter(run=run).count() == 1
    # The sticky call has no ticket of its own: its ledger key is scoped to the run.
    records = IdempotencyRecord.objects.filter(run=run).order_by("pk")
    assert [(r.resource, r.ticket_id) for r in records] == [
        ("2026.07.24@staging", staging.pk),
        ("2026.07.24@production", None),
    ]
    assert run.final_output == (
        "Release 2026.07.24: Release 2026.07.24 is live on staging. "
        "Release 2026.07.24 is live on production."
    )
    assert model_calls["release"] == 3


def test_resume_without_always_pauses_again_for_production(model_calls):
    run, staging, approver = decided_run(prompt=TWO_ENVIRONMENTS)

    outcome = resume(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.PAUSED
    assert run.status == RunStatus.PAUSED
    assert run.state_generation == 2
    assert [e["environment"] for e in demo.read_effects()] == ["staging"]
    pending = Ticket.objects.get(run=run, status=TicketStatus.PENDING)
    assert (pending.generation, pending.tool_call_id) == (2, "call_deploy_2026.07.24_production")
    assert pending.arguments_json == '{"environment":"production","release":"2026.07.24"}'
    assert Ticket.objects.get(pk=staging.pk).status == TicketStatus.APPROVED
    assert model_calls["release"] == 2
    assert actions(run)[-4:] == ["run.resuming", "effect.done", "run.paused", "ticket.created"]
    paused_by = AuditEvent.objects.filter(run=run, action="run.paused").latest("seq").actor_name
    assert paused_by == "worker w1"

    decide(pending, user=approver, approve=True)
    final = resume(run_id=run.pk, worker_id="w2")

    run.refresh_from_db()
    assert final.status == RunStatus.COMPLETED
    assert [e["environment"] for e in demo.read_effects()] == ["staging", "production"]
    assert IdempotencyRecord.objects.filter(run=run).count() == 2
    assert Ticket.objects.filter(run=run).count() == 2
    assert model_calls["release"] == 3
    assert run.final_output.endswith("Release 2026.07.24 is live on production.")


def test_resume_second_pause_rejected_runs_only_the_first_effect():
    run, _, approver = decided_run(prompt=TWO_ENVIRONMENTS)
    resume(run_id=run.pk, worker_id="w1")
    pending = Ticket.objects.get(run=run, status=TicketStatus.PENDING)

    decide(pending, user=approver, approve=False, message=DENIED)
    outcome = resume(run_id=run.pk, worker_id="w2")

    assert outcome.status == RunStatus.COMPLETED
    assert [e["environment"] for e in demo.read_effects()] == ["staging"]
    assert Run.objects.get(pk=run.pk).final_output == (
        f"Release 2026.07.24: Release 2026.07.24 is live on staging. {DENIED}"
    )


def test_resume_two_tickets_in_one_pause_approved_and_rejected():
    tenant = TenantFactory()
    approver = member(tenant)
    result = run_agent("release", TWO_ENVIRONMENTS, agent=two_call_agent())
    run = pause_run(
        result,
        tenant=tenant,
        agent_key="release",
        agent_version="1",
        requested_by=member(tenant, Role.VIEWER),
    )
    staging, production = Ticket.objects.filter(run=run).order_by("pk")
    decide(staging, user=approver, approve=True)
    decide(production, user=approver, approve=False, message=DENIED)

    # The worker builds the registered agent, whose model reads the conversation it is given.
    outcome = resume(run_id=run.pk, worker_id="w1")

    assert outcome.status == RunStatus.COMPLETED
    assert [e["environment"] for e in demo.read_effects()] == ["staging"]
    assert Run.objects.get(pk=run.pk).final_output == (
        f"Release 2026.07.24: Release 2026.07.24 is live on staging. {DENIED}"
    )


# --- states the worker refuses ------------------------------------------------------------------------


def test_resume_with_tampered_ciphertext_is_refused():
    run, _, _ = decided_run()
    ciphertext = bytes(Run.objects.get(pk=run.pk).state_ciphertext)
    flipped = ciphertext[:20] + bytes([ciphertext[20] ^ 0x01]) + ciphertext[21:]
    Run.objects.filter(pk=run.pk).update(state_ciphertext=flipped)

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason="the stored state was refused: the stored state failed its integrity check",
    )


def test_resume_with_blob_swapped_from_another_run_is_refused():
    run, _, _ = decided_run()
    other = paused_run(run.tenant)
    Run.objects.filter(pk=run.pk).update(
        state_key_id=other.state_key_id,
        state_nonce=bytes(other.state_nonce),
        state_ciphertext=bytes(other.state_ciphertext),
    )

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome, run, status=RunStatus.NEEDS_ATTENTION, reason="failed its integrity check"
    )


def test_resume_with_an_older_generations_blob_copied_over_the_run_is_refused():
    """A replay of an older checkpoint: the generation-1 blob over a generation-2 run. The seal
    binds the generation, so the blob does not open and nothing runs."""
    run, _, approver = decided_run(prompt=TWO_ENVIRONMENTS)
    first = Run.objects.get(pk=run.pk)
    resume(run_id=run.pk, worker_id="w1")
    decide(Ticket.objects.get(run=run, status=TicketStatus.PENDING), user=approver, approve=True)
    Run.objects.filter(pk=run.pk).update(
        state_key_id=first.state_key_id,
        state_nonce=bytes(first.state_nonce),
        state_ciphertext=bytes(first.state_ciphertext),
    )
    assert Run.objects.get(pk=run.pk).state_generation == 2

    outcome = resume(run_id=run.pk, worker_id="w2")

    run.refresh_from_db()
    assert outcome.status == run.status == RunStatus.NEEDS_ATTENTION
    assert "failed its integrity check" in run.status_reason
    assert outcome.effects == []
    assert [e["environment"] for e in demo.read_effects()] == ["staging"]
    assert IdempotencyRecord.objects.filter(run=run).count() == 1
    assert actions(run)[-2:] == ["run.resuming", "run.refused"]


def test_resume_with_unknown_key_id_is_refused():
    run, _, _ = decided_run()
    Run.objects.filter(pk=run.pk).update(state_key_id="retired-key")

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason="key 'retired-key' is not in the key ring",
    )


def test_resume_with_agent_version_no_longer_deployed_is_refused(settings):
    run, _, _ = decided_run()
    settings.APPROVALS_AGENTS = {
        **settings.APPROVALS_AGENTS,
        "release": {"2": "devtools.demo.build_release_agent"},
    }

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason="Regenerate the approval: agent 'release' version '1' is not deployed",
    )


def test_resume_with_unsupported_schema_version_is_refused():
    run, _, _ = decided_run()
    Run.objects.filter(pk=run.pk).update(schema_version="0.9")

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason="Regenerate the approval: the state was written in SDK schema '0.9'",
    )


def test_resume_with_changed_argument_digest_is_refused():
    run, ticket, _ = decided_run()
    Ticket.objects.filter(pk=ticket.pk).update(arguments_digest="0" * 64)

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason=f"the arguments of ticket {ticket.pk} (deploy_release) differ from those",
    )


def test_resume_with_a_changed_tool_name_is_refused():
    """The ticket was shown as one tool's call; the state must call that tool."""
    run, ticket, _ = decided_run()
    Ticket.objects.filter(pk=ticket.pk).update(tool_name="publish_invoice")

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason=f"ticket {ticket.pk} was shown as a call of publish_invoice, but the stored state",
    )
    assert demo.read_effects() == []


def _remove_membership(approver) -> None:
    Membership.objects.filter(user=approver).delete()


def _downgrade_to_viewer(approver) -> None:
    Membership.objects.filter(user=approver).update(role=Role.VIEWER)


def _deactivate(approver) -> None:
    # The vote's own reading of the voter's membership must still see the account.
    type(approver).objects.filter(pk=approver.pk).update(is_active=False)


def _invalidate_vote_and_remove_membership(approver) -> None:
    # Not among the voters: the approver's membership is read on its own.
    TicketVote.objects.filter(user=approver).update(invalidated_at=timezone.now())
    _remove_membership(approver)


@pytest.mark.parametrize(
    "change",
    [_remove_membership, _downgrade_to_viewer, _deactivate, _invalidate_vote_and_remove_membership],
)
def test_resume_after_the_approver_may_no_longer_approve_is_refused(change):
    run, ticket, approver = decided_run()
    change(approver)

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason=f"{approver.username}, who approved ticket {ticket.pk}, may no longer approve",
    )
    assert demo.read_effects() == []


def test_resume_with_an_approver_who_has_no_standing_vote_reads_their_membership():
    # An approver whose vote no longer counts is not among the voters: their membership is
    # read on its own, and it still stands.
    run, _, approver = decided_run()
    TicketVote.objects.filter(user=approver).update(invalidated_at=timezone.now())

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert outcome.status == RunStatus.COMPLETED
    assert len(demo.read_effects()) == 1


def test_resume_after_rejecter_downgraded_still_runs_the_rejection():
    # Only an approval needs a current approver: a rejection executes nothing.
    run, _, approver = decided_run(approve=False, message=DENIED)
    Membership.objects.filter(user=approver).update(role=Role.VIEWER)

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert outcome.status == RunStatus.COMPLETED
    assert demo.read_effects() == []


def test_resume_past_expiry_and_grace_is_expired(settings):
    run, ticket, _ = decided_run()
    now = timezone.now()
    grace = timedelta(seconds=settings.APPROVALS_RESUME_GRACE_SECONDS)
    Ticket.objects.filter(pk=ticket.pk).update(
        decided_at=now - grace - timedelta(minutes=10),
        expires_at=now - grace - timedelta(seconds=1),
    )

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.EXPIRED,
        reason=f"Regenerate the approval: ticket {ticket.pk} expired at",
    )
    assert "before the run could resume" in outcome.reason


def test_resume_past_expiry_within_grace_completes(settings):
    run, ticket, _ = decided_run()
    now = timezone.now()
    grace = timedelta(seconds=settings.APPROVALS_RESUME_GRACE_SECONDS)
    Ticket.objects.filter(pk=ticket.pk).update(
        decided_at=now - grace, expires_at=now - grace + timedelta(seconds=60)
    )

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert outcome.status == RunStatus.COMPLETED
    assert len(demo.read_effects()) == 1


def test_resume_of_ticket_decided_after_its_expiry_is_expired():
    run, ticket, _ = decided_run()
    Ticket.objects.filter(pk=ticket.pk).update(expires_at=ticket.decided_at - timedelta(seconds=1))

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.EXPIRED,
        reason=f"ticket {ticket.pk} was decided after it expired",
    )


# --- the idempotency ledger -------------------------------------------------------------------------


def ledger_record(run: Run, ticket: Ticket, **fields) -> IdempotencyRecord:
    key = idempotency_key(
        tenant_id=run.tenant_id,
        approval=f"ticket:{ticket.pk}",
        operation="deploy_release",
        resource="2026.07.24@production",
    )
    return IdempotencyRecord.objects.create(
        tenant_id=run.tenant_id,
        key=key,
        run=run,
        ticket=ticket,
        operation="deploy_release",
        resource="2026.07.24@production",
        claimed_by="dead-worker#1",
        **fields,
    )


def test_resume_with_effect_in_doubt_waits_for_a_person():
    run, ticket, _ = decided_run()
    ledger_record(run, ticket, status=LedgerStatus.CLAIMED)

    outcome = resume(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.NEEDS_ATTENTION
    assert run.status == RunStatus.NEEDS_ATTENTION
    assert "started by attempt dead-worker#1" in run.status_reason
    assert "never confirmed (claimed)" in run.status_reason
    assert demo.read_effects() == []
    assert IdempotencyRecord.objects.get().status == LedgerStatus.CLAIMED
    assert actions(run)[-2:] == ["run.resuming", "run.in_doubt"]


def test_resume_with_effect_already_done_returns_the_stored_result():
    run, ticket, _ = decided_run()
    stored = "Release 2026.07.24 is live on production (recorded by an earlier attempt)."
    ledger_record(run, ticket, status=LedgerStatus.DONE, result=stored)

    outcome = resume(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.COMPLETED
    assert outcome.effects == []
    assert demo.read_effects() == []
    assert run.final_output == f"Release 2026.07.24: {stored}"
    assert IdempotencyRecord.objects.count() == 1
    assert actions(run)[-2:] == ["run.resuming", "run.completed"]


# --- the same session --------------------------------------------------------------------------------


class CountingSession(SQLiteSession):
    """A file SQLiteSession that counts its writes, across every instance the test opens."""

    writes: list[int] = []

    async def add_items(self, items) -> None:
        type(self).writes.append(len(items))
        await super().add_items(items)


def test_resume_writes_to_the_same_session(tmp_path, monkeypatch):
    monkeypatch.setattr(CountingSession, "writes", [])
    # The worker reopens the run's session through this name; count its writes too.
    monkeypatch.setattr(agent_sessions, "SQLiteSession", CountingSession)
    tenant = TenantFactory()
    session = CountingSession("conv-781", tmp_path / "sessions.db")
    try:
        run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER), session=session)
        items_at_pause = asyncio.run(session.get_items())
    finally:
        session.close()
    # The user's prompt, then the model's function call, each its own write.
    assert CountingSession.writes == [1, 1]
    assert [item.get("type", item.get("role")) for item in items_at_pause] == [
        "user",
        "function_call",
    ]
    decide(Ticket.objects.get(run=run), user=member(tenant), approve=True)

    assert resume(run_id=run.pk, worker_id="w1").status == RunStatus.COMPLETED

    reader = SQLiteSession("conv-781", tmp_path / "sessions.db")
    try:
        items_after = asyncio.run(reader.get_items())
    finally:
        reader.close()
    # Resume adds the tool's output, then the model's final message.
    assert CountingSession.writes == [1, 1, 1, 1]
    assert [item.get("type", item.get("role")) for item in items_after] == [
        "user",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert len(items_after) > len(items_at_pause)
    assert items_after[:2] == items_at_pause
    assert len(demo.read_effects()) == 1


def test_resume_pausing_again_leaves_the_restored_deploy_token_out(monkeypatch):
    # The deserializer puts the token back at resume; the second pause must strip it again.
    token = "sk-" + "WorkerTokenWorkerToken01"
    monkeypatch.setenv("RELEASE_DEPLOY_TOKEN", token)
    run, _, _ = decided_run(prompt=TWO_ENVIRONMENTS)

    outcome = resume(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.PAUSED
    state = open_state(run)
    assert state["context"]["context"] == {}
    assert token not in json.dumps(state)
    assert token not in json.dumps(list(AuditEvent.objects.values()), default=str)
    assert [e["authenticated"] for e in demo.read_effects()] == [True]
