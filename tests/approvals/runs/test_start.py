"""Starting a run the console runs: start_run writes a sealed request and one task, and the
worker's start runs the agent to a pause, a completion or a failure, exactly once."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from agents import Agent
from agents.testing import ModelStep, ScriptedModel
from django.utils import timezone
from django_tasks_db.models import DBTaskResult
from release_agent import agent as release_agent

from approvals.decisions.decide import decide
from approvals.execution import registry
from approvals.execution.ledger import idempotency_key
from approvals.execution.state import (
    ContextNotSerializableError,
    SecretInContextError,
    open_state,
)
from approvals.models import (
    AuditEvent,
    IdempotencyRecord,
    LedgerStatus,
    Role,
    Run,
    RunStatus,
    Ticket,
    TicketStatus,
)
from approvals.runs.reaper import reap
from approvals.runs.resume import resume
from approvals.runs.start import NotAMemberError, StartError, start, start_run
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = "release-pkg"
START_TASK = "approvals.execution.queue.start_run_task"
PRODUCTION = "Deploy 2026.07.25 to production"
STAGING = "Deploy 2026.07.25 to staging"


@pytest.fixture(autouse=True)
def deploys(tmp_path, monkeypatch) -> Path:
    """Where the example agent appends one line per real deploy."""
    path = tmp_path / "deploys.log"
    monkeypatch.setenv("RELEASE_AGENT_EFFECT_LOG", str(path))
    monkeypatch.setitem(release_agent.MODEL_CALLS, "count", 0)
    return path


def effects(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def actions(run: Run) -> list[str]:
    return list(
        AuditEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("action", flat=True)
    )


def start_tasks() -> int:
    return DBTaskResult.objects.filter(task_path=START_TASK).count()


def started(prompt: str, **kwargs) -> Run:
    tenant = kwargs.pop("tenant", None) or TenantFactory()
    kwargs.setdefault("requested_by", member(tenant, Role.VIEWER))
    return start_run(tenant=tenant, agent_key=AGENT, agent_version="1", input=prompt, **kwargs)


def failing_agent() -> Agent:
    return Agent(
        name="failing", model=ScriptedModel([ModelStep.raise_error(RuntimeError("model down"))])
    )


def leaking_agent() -> Agent:
    error = RuntimeError("model down; api_key=sk-abcdefghijklmnop1234")
    return Agent(name="leaking", model=ScriptedModel([ModelStep.raise_error(error)]))


# --- start_run ----------------------------------------------------------------------------------


def test_start_creates_a_starting_run_with_its_request_sealed_audit_and_one_task():
    run = started(PRODUCTION, context={"ticket": "CHG-4711"}, title="Friday release")

    run.refresh_from_db()
    assert (run.status, run.executor, run.state_generation) == (RunStatus.STARTING, "console", 0)
    assert (run.agent_key, run.agent_version, run.title) == (AGENT, "1", "Friday release")
    assert (run.lease_owner, run.attempts) == ("", 0)
    ciphertext = bytes(run.state_ciphertext)
    assert len(ciphertext) > 0
    assert b"2026.07.25" not in ciphertext
    assert b"CHG-4711" not in ciphertext
    assert actions(run) == ["run.started"]
    assert start_tasks() == 1
    assert Ticket.objects.count() == 0
    assert release_agent.MODEL_CALLS["count"] == 0


def test_start_takes_its_title_from_the_input_when_none_is_given():
    run = started(STAGING)

    assert run.title == STAGING


def test_start_refuses_a_context_holding_a_secret_and_writes_nothing():
    with pytest.raises(SecretInContextError) as refused:
        started(PRODUCTION, context={"api_key": "sk-abcdefghijklmnopqrstuvwx"})

    assert refused.value.status == 400
    assert "context.api_key" in refused.value.sentence()
    assert "sk-abcdefghijklmnopqrstuvwx" not in refused.value.sentence()
    assert (Run.objects.count(), start_tasks()) == (0, 0)


def test_start_refuses_a_context_that_cannot_be_stored():
    with pytest.raises(ContextNotSerializableError):
        started(PRODUCTION, context={"client": object()})

    assert (Run.objects.count(), start_tasks()) == (0, 0)


def test_start_of_an_unknown_agent_is_a_400_saying_so():
    tenant = TenantFactory()
    with pytest.raises(registry.UnknownAgentError) as refused:
        start_run(
            tenant=tenant, agent_key="payroll", agent_version="1", input="hi", requested_by=None
        )

    assert refused.value.status == 400
    assert refused.value.sentence() == (
        "Agent 'payroll' is not registered (neither in APPROVALS_AGENTS nor by an "
        "approvals.agents entry point)."
    )
    assert (Run.objects.count(), start_tasks()) == (0, 0)


def test_start_of_an_unknown_version_names_the_deployed_ones():
    tenant = TenantFactory()
    with pytest.raises(registry.UnknownAgentError) as refused:
        start_run(tenant=tenant, agent_key=AGENT, agent_version="9", input="hi", requested_by=None)

    assert refused.value.sentence() == (
        "Agent 'release-pkg' version '9' is not deployed (deployed: 1)."
    )


@pytest.mark.parametrize(
    ("value", "sentence"),
    [
        ("   ", "The input is empty: send a prompt or a list of input items."),
        ([], "The input must be a prompt (text) or a non-empty list of input items."),
        (["text"], "The input must be a prompt (text) or a non-empty list of input items."),
        (42, "The input must be a prompt (text) or a non-empty list of input items."),
    ],
)
def test_start_refuses_an_input_the_sdk_cannot_take(value, sentence):
    with pytest.raises(StartError) as refused:
        started(value)

    assert (refused.value.status, refused.value.sentence()) == (400, sentence)
    assert Run.objects.count() == 0


def test_start_refuses_a_requester_who_is_not_a_member():
    tenant = TenantFactory(slug="acme")
    outsider = member(TenantFactory(), Role.ADMIN, username="mallory")

    with pytest.raises(NotAMemberError) as refused:
        started(PRODUCTION, tenant=tenant, requested_by=outsider)

    assert refused.value.sentence() == "Mallory is not a member of acme, so cannot start its runs."
    assert Run.objects.count() == 0


# --- the worker ---------------------------------------------------------------------------------


def test_the_worker_pauses_a_production_deploy_with_its_ticket_and_no_effect(deploys):
    run = started(PRODUCTION)

    outcome = start(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    ticket = Ticket.objects.get(run=run)
    assert outcome.status == RunStatus.PAUSED
    assert (run.status, run.state_generation, run.lease_owner) == (RunStatus.PAUSED, 1, "")
    assert (ticket.tool_name, ticket.status, ticket.generation) == (
        "deploy_release",
        TicketStatus.PENDING,
        1,
    )
    assert json.loads(ticket.arguments_json) == {
        "release": "2026.07.25",
        "environment": "production",
    }
    assert ticket.requested_by == run.requested_by
    assert release_agent.MODEL_CALLS["count"] == 1
    assert effects(deploys) == []
    assert IdempotencyRecord.objects.count() == 0
    assert actions(run) == ["run.started", "run.starting", "run.paused", "ticket.created"]


def test_a_staging_deploy_completes_with_one_effect_and_no_ticket(deploys):
    run = started(STAGING)

    outcome = start(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.COMPLETED
    assert run.status == RunStatus.COMPLETED
    assert run.final_output == "Release 2026.07.25: Release 2026.07.25 is live on staging."
    assert Ticket.objects.filter(run=run).count() == 0
    assert [e["environment"] for e in effects(deploys)] == ["staging"]
    assert list(IdempotencyRecord.objects.values_list("status", "resource")) == [
        (LedgerStatus.DONE, "2026.07.25@staging")
    ]
    assert release_agent.MODEL_CALLS["count"] == 2
    assert actions(run) == ["run.started", "run.starting", "effect.done", "run.completed"]


def test_a_production_deploy_approved_runs_exactly_once(deploys):
    tenant = TenantFactory()
    run = started(PRODUCTION, tenant=tenant)
    start(run_id=run.pk, worker_id="w1")
    ticket = Ticket.objects.get(run=run)

    decide(ticket, user=member(tenant, Role.APPROVER), approve=True)
    first = resume(run_id=run.pk, worker_id="w2")
    second = resume(run_id=run.pk, worker_id="w3")

    run.refresh_from_db()
    assert first.status == RunStatus.COMPLETED
    assert second.reason == "not claimed: another delivery has it"
    assert run.final_output == "Release 2026.07.25: Release 2026.07.25 is live on production."
    assert [e["environment"] for e in effects(deploys)] == ["production"]
    assert IdempotencyRecord.objects.filter(status=LedgerStatus.DONE).count() == 1
    assert release_agent.MODEL_CALLS["count"] == 2


def test_a_second_delivery_of_the_start_task_does_nothing(deploys):
    run = started(PRODUCTION)
    start(run_id=run.pk, worker_id="w1")
    run.refresh_from_db()
    before = (run.status, run.attempts, release_agent.MODEL_CALLS["count"], len(actions(run)))

    outcome = start(run_id=run.pk, worker_id="w2")

    run.refresh_from_db()
    assert outcome.reason == "not claimed: another delivery has it"
    assert (run.status, run.attempts, release_agent.MODEL_CALLS["count"], len(actions(run))) == (
        before
    )
    assert before[:2] == (RunStatus.PAUSED, 1)
    assert Ticket.objects.filter(run=run).count() == 1


def test_a_start_under_a_live_lease_is_not_claimed_by_a_second_worker():
    run = started(PRODUCTION)
    Run.objects.filter(pk=run.pk).update(
        lease_owner="w1", lease_expires_at=timezone.now() + timedelta(minutes=5), attempts=1
    )

    outcome = start(run_id=run.pk, worker_id="w2")

    run.refresh_from_db()
    assert outcome.reason == "not claimed: another delivery has it"
    assert (run.status, run.lease_owner, run.attempts) == (RunStatus.STARTING, "w1", 1)
    assert release_agent.MODEL_CALLS["count"] == 0


@pytest.mark.parametrize(
    ("factory", "reason"),
    [("failing_agent", "RuntimeError: model down"), ("leaking_agent", "[redacted]")],
)
def test_an_agent_that_raises_fails_the_run_with_a_safe_reason(settings, factory, reason):
    settings.APPROVALS_AGENTS = {
        **settings.APPROVALS_AGENTS,
        "failing": {"1": f"tests.approvals.runs.test_start.{factory}"},
    }
    tenant = TenantFactory()
    run = start_run(
        tenant=tenant, agent_key="failing", agent_version="1", input="go", requested_by=None
    )

    outcome = start(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.FAILED
    assert (run.status, run.status_reason) == (RunStatus.FAILED, reason)
    assert run.finished_at is not None
    assert actions(run) == ["run.started", "run.starting", "run.failed"]


def test_a_start_whose_agent_was_undeployed_since_fails_without_running(settings):
    run = started(PRODUCTION)
    Run.objects.filter(pk=run.pk).update(agent_version="2")

    outcome = start(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert outcome.status == RunStatus.FAILED
    assert run.status_reason == (
        "Agent 'release-pkg' version '2' is not deployed (deployed: 1). Nothing was run"
    )
    assert release_agent.MODEL_CALLS["count"] == 0


def test_a_start_request_copied_to_another_run_does_not_open():
    one, other = started(PRODUCTION), started(STAGING)
    Run.objects.filter(pk=other.pk).update(
        state_key_id=one.state_key_id,
        state_nonce=one.state_nonce,
        state_ciphertext=one.state_ciphertext,
    )

    outcome = start(run_id=other.pk, worker_id="w1")

    assert outcome.status == RunStatus.FAILED
    assert outcome.reason.startswith("the start request was refused: ")
    assert release_agent.MODEL_CALLS["count"] == 0


def test_a_start_past_its_attempts_fails(settings):
    settings.APPROVALS_MAX_ATTEMPTS = 2
    run = started(PRODUCTION)
    Run.objects.filter(pk=run.pk).update(attempts=2)

    outcome = start(run_id=run.pk, worker_id="w1")

    assert outcome.status == RunStatus.FAILED
    assert outcome.reason == "started 2 times without finishing; look at the worker logs"
    assert release_agent.MODEL_CALLS["count"] == 0


# --- the reaper ---------------------------------------------------------------------------------


def test_the_reaper_gives_a_lapsed_start_its_task_again_and_it_starts_once_more(deploys):
    run = started(STAGING)
    Run.objects.filter(pk=run.pk).update(
        lease_owner="w1", lease_expires_at=timezone.now() - timedelta(seconds=1), attempts=1
    )

    report = reap()

    run.refresh_from_db()
    assert report.requeued == [run.pk]
    assert (run.status, run.lease_owner, run.lease_expires_at) == (RunStatus.STARTING, "", None)
    assert start_tasks() == 2
    assert actions(run) == ["run.started", "run.requeued"]
    outcome = start(run_id=run.pk, worker_id="w2")
    run.refresh_from_db()
    assert (outcome.status, run.attempts) == (RunStatus.COMPLETED, 2)
    assert len(effects(deploys)) == 1


def test_the_reaper_leaves_a_start_under_a_live_lease():
    run = started(STAGING)
    Run.objects.filter(pk=run.pk).update(
        lease_owner="w1", lease_expires_at=timezone.now() + timedelta(minutes=5), attempts=1
    )

    report = reap()

    run.refresh_from_db()
    assert (report.requeued, report.reenqueued) == ([], [])
    assert (run.status, run.lease_owner) == (RunStatus.STARTING, "w1")
    assert start_tasks() == 1


def test_the_reaper_enqueues_again_a_start_nobody_claimed_for_a_lease(settings):
    run = started(STAGING)
    Run.objects.filter(pk=run.pk).update(
        updated_at=timezone.now() - timedelta(seconds=settings.APPROVALS_LEASE_SECONDS + 1)
    )

    report = reap()

    assert report.reenqueued == [run.pk]
    assert start_tasks() == 2
    assert Run.objects.get(pk=run.pk).status == RunStatus.STARTING


def test_an_effect_a_dead_start_left_unconfirmed_parks_the_restart(deploys):
    run = started(STAGING)
    # As if attempt 1 had died between claiming the deploy and confirming it.
    key = idempotency_key(
        tenant_id=run.tenant_id,
        approval=f"run:{run.pk}",
        operation="deploy_release",
        resource="2026.07.25@staging",
    )
    IdempotencyRecord.objects.create(
        tenant_id=run.tenant_id,
        key=key,
        run=run,
        operation="deploy_release",
        resource="2026.07.25@staging",
        status=LedgerStatus.CLAIMED,
        claimed_by="w1#1",
    )

    outcome = start(run_id=run.pk, worker_id="w2")

    run.refresh_from_db()
    assert (outcome.status, run.status) == (RunStatus.NEEDS_ATTENTION, RunStatus.NEEDS_ATTENTION)
    assert "deploy_release on 2026.07.25@staging was started by attempt w1#1" in run.status_reason
    assert effects(deploys) == []


def test_the_worker_runs_the_agent_with_the_starts_context_and_the_pause_keeps_it():
    run = started(PRODUCTION, context={"ticket": "CHG-4711"})

    start(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED
    assert open_state(run)["context"]["context"] == {"ticket": "CHG-4711"}
