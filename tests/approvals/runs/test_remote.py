"""A run its caller holds: submit the pause, decide, fetch signed decisions, report the outcome."""

from __future__ import annotations

import asyncio
import copy
import json
from datetime import timedelta

import pytest
from agents import Agent, Runner, RunState, function_tool
from agents.run_state import CURRENT_SCHEMA_VERSION
from agents.testing import ScriptedModel, assistant_message, function_call
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.core import signatures
from approvals.core.canonical import arguments_digest
from approvals.decisions.decide import decide
from approvals.execution import registry
from approvals.execution.state import SecretInContextError, open_state
from approvals.models import (
    AuditEvent,
    Role,
    Run,
    RunExecutor,
    RunStatus,
    Ticket,
    TicketStatus,
)
from approvals.policies.versions import save_policy
from approvals.runs import reaper, remote
from approvals.runs.pause import pause_run
from approvals.runs.resume import resume
from tests.support import TenantFactory, calling_agent, member, run_agent, two_call_agent

pytestmark = pytest.mark.django_db

STAGING = {"release": "2026.07.24", "environment": "staging"}
PRODUCTION = {"release": "2026.07.24", "environment": "production"}
VIA = {"via": "api", "token_prefix": "abcd1234"}

# --- the caller's own agent: not registered in the console ---------------------------------------

ran: list[dict] = []


@pytest.fixture(autouse=True)
def _forget_calls():
    ran.clear()


async def _production_only(_ctx, arguments: dict, _call_id: str) -> bool:
    # The SDK asks per call: only a production deployment waits for a person.
    return arguments.get("environment") == "production"


@function_tool(needs_approval=_production_only, failure_error_function=None)
def ship(release: str, environment: str) -> str:
    """Ship a release to an environment."""
    ran.append({"release": release, "environment": environment})
    return f"{release} shipped to {environment}"


def external_agent(*turns) -> Agent:
    return Agent(name="shipper", model=ScriptedModel(list(turns)), tools=[ship])


def ship_call(arguments: dict, call_id: str):
    return function_call("ship", arguments, call_id=call_id)


def caller_state(agent: Agent, prompt: str = "Ship 2026.07.24") -> dict:
    """Run the agent in this process until it pauses, as a caller does, and hand over its state."""
    result = asyncio.run(Runner.run(agent, prompt, context={}))
    assert result.interruptions, "the agent did not pause"
    return result.to_state().to_json()


def resume_as_caller(agent: Agent, state_json: dict, decisions: list[dict]):
    """What a caller does with the decisions it fetched: check each, apply it, run on."""
    keys = signatures.decision_public_keys()
    state = asyncio.run(RunState.from_json(agent, state_json))
    by_call = {}
    for signed in decisions:
        payload = signatures.verify_decision(signed, keys)
        by_call[payload["call_id"]] = payload
    for item in state.get_interruptions():
        payload = by_call[item.call_id]
        assert payload["arguments_digest"] == arguments_digest(item.arguments)
        if payload["decision"] == "approve":
            state.approve(item)
        else:
            state.reject(item, rejection_message=payload["message"] or None)
    return asyncio.run(Runner.run(agent, state))


def submit(tenant, state_json, **kwargs) -> Run:
    kwargs.setdefault("agent_key", "shipper")
    kwargs.setdefault("agent_version", "3")
    return remote.submit_paused(tenant=tenant, state_json=state_json, **kwargs).run


def actions(run: Run) -> list[str]:
    return list(
        AuditEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("action", flat=True)
    )


def counts() -> tuple[int, int, int]:
    return Run.objects.count(), Ticket.objects.count(), AuditEvent.objects.count()


def resume_tasks() -> int:
    return DBTaskResult.objects.filter(
        task_path="approvals.execution.queue.resume_run_task"
    ).count()


@pytest.fixture
def people():
    tenant = TenantFactory(slug="acme")
    return {
        "tenant": tenant,
        "requester": member(tenant, Role.VIEWER, username="req"),
        "alice": member(tenant, Role.APPROVER, username="alice"),
        "bob": member(tenant, Role.APPROVER, username="bob"),
        "admin": member(tenant, Role.ADMIN, username="boss"),
    }


def decided_caller_run(people, *, approve: bool = True, message: str = "") -> Run:
    """A caller's run paused on one production deployment, decided by alice."""
    state = caller_state(
        external_agent([ship_call(PRODUCTION, "call_1")], [assistant_message("ok")])
    )
    run = submit(people["tenant"], state, requested_by=people["requester"])
    decide(Ticket.objects.get(run=run), user=people["alice"], approve=approve, message=message)
    run.refresh_from_db()
    return run


# --- submitting a pause ---------------------------------------------------------------------------


def test_submit_paused_registered_agent_opens_the_tickets_pause_run_opens(people):
    tenant = people["tenant"]
    state = run_agent("release", "Deploy both", agent=two_call_agent()).to_state().to_json()

    run = submit(
        tenant,
        state,
        agent_key="release",
        agent_version="1",
        requested_by=people["requester"],
        session_id="conv-42",
        via=VIA,
    )

    assert (run.executor, run.status, run.state_generation) == (
        RunExecutor.CALLER,
        RunStatus.PAUSED,
        1,
    )
    assert (run.agent_key, run.agent_version, run.schema_version) == (
        "release",
        "1",
        CURRENT_SCHEMA_VERSION,
    )
    assert (run.title, run.requested_by, run.session_backend, run.session_id) == (
        "Deploy both",
        people["requester"],
        "caller",
        "conv-42",
    )
    tickets = list(Ticket.objects.filter(run=run).order_by("pk"))
    assert [(t.tool_name, t.tool_call_id, t.agent_name, t.status) for t in tickets] == [
        ("deploy_release", "call_deploy_2026.07.24_staging", "release", TicketStatus.PENDING),
        ("deploy_release", "call_deploy_2026.07.24_production", "release", TicketStatus.PENDING),
    ]
    assert [t.arguments_digest for t in tickets] == [
        arguments_digest(json.dumps(STAGING)),
        arguments_digest(json.dumps(PRODUCTION)),
    ]
    assert actions(run) == ["run.paused", "ticket.created", "ticket.created"]
    paused = AuditEvent.objects.get(run_id=run.pk, action="run.paused")
    assert paused.detail == {
        "agent": "release",
        "version": "1",
        "schema": CURRENT_SCHEMA_VERSION,
        "tickets": 2,
        "session": "caller",
        "executor": "caller",
        "via": "api",
        "token_prefix": "abcd1234",
    }
    assert (paused.actor_name, paused.outcome) == ("req", "paused")
    # Sealed as pause_run seals: the state opens to exactly what the caller sent.
    assert open_state(run) == state
    assert bytes(run.state_ciphertext).find(b"2026.07.24") == -1


def test_submit_paused_loads_states_with_one_agent_a_process_keeps(people, monkeypatch):
    built: list[str] = []
    build = registry.AgentSpec.build
    monkeypatch.setattr(
        registry.AgentSpec, "build", lambda spec: built.append(spec.key) or build(spec)
    )
    registry.forget()
    states = [
        run_agent("release", f"Deploy {n}", agent=calling_agent(PRODUCTION)).to_state().to_json()
        for n in range(3)
    ]

    first = submit(people["tenant"], states[0], agent_key="release", agent_version="1")
    after_one = len(built)
    others = [
        submit(people["tenant"], state, agent_key="release", agent_version="1")
        for state in states[1:]
    ]

    assert [Ticket.objects.filter(run=run).count() for run in [first, *others]] == [1, 1, 1]
    # Loading a state reads the agent and never runs it: the first state built it (and the
    # agent the tool's schema is read from), the next ones build nothing.
    assert built and set(built) == {"release"}
    assert len(built) == after_one
    registry.forget()


def test_submit_paused_unregistered_agent_is_checked_by_structure_only(people):
    state = caller_state(
        external_agent([ship_call(PRODUCTION, "call_prod")], [assistant_message("ok")])
    )

    # As JSON text, the way a caller may hand it over.
    run = submit(people["tenant"], json.dumps(state), title="  Ship   to production ")

    ticket = Ticket.objects.get(run=run)
    assert (ticket.tool_name, ticket.tool_call_id, ticket.agent_name) == (
        "ship",
        "call_prod",
        "shipper",
    )
    assert ticket.arguments_digest == arguments_digest(json.dumps(PRODUCTION))
    assert (run.title, run.session_backend, run.requested_by) == ("Ship to production", "", None)
    assert actions(run) == ["run.paused", "ticket.created"]
    assert AuditEvent.objects.get(run_id=run.pk, action="run.paused").actor_name == "system"


def test_submit_paused_tool_approval_by_arguments_only_the_paused_call_gets_a_ticket(people):
    agent = external_agent(
        [ship_call(STAGING, "call_staging"), ship_call(PRODUCTION, "call_production")],
        [assistant_message("both done")],
    )
    state = caller_state(agent)

    run = submit(people["tenant"], state)

    # Staging needed nobody: the SDK ran it before pausing on production alone.
    assert ran == [STAGING]
    assert list(Ticket.objects.filter(run=run).values_list("tool_call_id", "status")) == [
        ("call_production", TicketStatus.PENDING)
    ]


def test_submit_paused_a_malformed_call_is_rejected_at_once_and_the_run_awaits_its_caller(people):
    state = (
        run_agent("release", "Deploy", agent=calling_agent({"release": "2026.07.24"}))
        .to_state()
        .to_json()
    )

    run = submit(people["tenant"], state, agent_key="release", agent_version="1")

    ticket = Ticket.objects.get(run=run)
    assert (ticket.status, ticket.decision_source) == (TicketStatus.REJECTED, "malformed")
    assert run.status == RunStatus.AWAITING_CALLER
    assert actions(run) == [
        "run.paused",
        "ticket.created",
        "ticket.malformed",
        "run.awaiting_caller",
    ]
    assert resume_tasks() == 0


def _drop_interruption_type(state):
    state["current_step"]["data"]["interruptions"][0]["type"] = "tool_call_item"


def _other_arguments(state):
    state["current_step"]["data"]["interruptions"][0]["raw_item"]["arguments"] = json.dumps(STAGING)


def _twice(state):
    items = state["current_step"]["data"]["interruptions"]
    items.append(copy.deepcopy(items[0]))


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        (lambda s: "{", "The state is not JSON: Expecting property name enclosed in double quotes"),
        (lambda s: '{"a": 1, "a": 2}', "The state is not JSON: the key 'a' appears twice"),
        (lambda s: [s], "The state must be a JSON object: send RunState.to_json() as it is."),
        (lambda s: s.pop("$schemaVersion") and s, "The state has no $schemaVersion"),
        (
            lambda s: s.update({"$schemaVersion": "0.9"}) or s,
            "The state was written in SDK schema '0.9', which this SDK",
        ),
        (
            lambda s: s["current_step"].update({"type": "next_step_run_again"}) or s,
            "The state is not paused for approval: its current_step is not next_step_interruption.",
        ),
        (
            lambda s: s["current_step"]["data"].update({"interruptions": []}) or s,
            "The state is paused but has no tool_approval_item to decide.",
        ),
        (
            lambda s: _drop_interruption_type(s) or s,
            "Interruption 1 is not a tool_approval_item.",
        ),
        (
            lambda s: s["current_step"]["data"]["interruptions"][0].pop("raw_item") and s,
            "Interruption 1 has no raw_item object.",
        ),
        (
            lambda s: (
                s["current_step"]["data"]["interruptions"][0]["raw_item"].update(
                    {"call_id": "", "id": None}
                )
                or s
            ),
            "Interruption 1 (ship) has no call_id.",
        ),
        (
            lambda s: _twice(s) or s,
            "Two interruptions share the call_id 'call_1'.",
        ),
        (
            lambda s: _other_arguments(s) or s,
            "Interruption 1 (call 'call_1') has other arguments than its generated item.",
        ),
        (
            lambda s: s.update({"generated_items": []}) or s,
            "Interruption 1 (call 'call_1') is not among the state's generated_items.",
        ),
    ],
    ids=[
        "not-json",
        "repeated-key",
        "not-an-object",
        "no-schema",
        "unsupported-schema",
        "not-interrupted",
        "no-interruptions",
        "not-an-approval",
        "no-raw-item",
        "no-call-id",
        "call-id-twice",
        "arguments-differ-from-the-digest-gate",
        "not-in-generated-items",
    ],
)
def test_submit_paused_malformed_state_is_refused_writing_nothing(people, change, sentence):
    state = caller_state(external_agent([ship_call(PRODUCTION, "call_1")], [assistant_message("")]))
    before = counts()

    with pytest.raises(remote.InvalidStateError) as raised:
        submit(people["tenant"], change(state))

    assert raised.value.status == 400
    assert raised.value.sentence().startswith(sentence)
    assert counts() == before == (0, 0, 0)


def test_submit_paused_secret_in_the_context_is_refused_writing_nothing(people):
    state = caller_state(external_agent([ship_call(PRODUCTION, "call_1")], [assistant_message("")]))
    state["context"]["context"] = {"db": {"password": "hunter2hunter2"}}

    with pytest.raises(SecretInContextError) as raised:
        submit(people["tenant"], state)

    assert raised.value.status == 400
    assert "context.db.password (key name)" in raised.value.sentence()
    assert "hunter2hunter2" not in raised.value.sentence()
    assert counts() == (0, 0, 0)


def test_submit_paused_registered_agent_that_cannot_load_the_state_is_refused(people):
    # A state of the caller's own agent, handed over under the release agent's name: the
    # release agent has no agent called "shipper", so the SDK cannot restore its interruption.
    state = caller_state(external_agent([ship_call(PRODUCTION, "call_1")], [assistant_message("")]))

    with pytest.raises(remote.InvalidStateError) as raised:
        submit(people["tenant"], state, agent_key="release", agent_version="1")

    assert raised.value.sentence().startswith("Agent 'release' version '1' ")
    assert counts() == (0, 0, 0)


# --- decided: the caller's turn -------------------------------------------------------------------


def test_decided_caller_run_awaits_its_caller_and_enqueues_no_task(people):
    run = decided_caller_run(people)

    assert run.status == RunStatus.AWAITING_CALLER
    assert resume_tasks() == 0
    assert actions(run) == [
        "run.paused",
        "ticket.created",
        "ticket.approved",
        "run.awaiting_caller",
    ]
    waiting = AuditEvent.objects.get(run_id=run.pk, action="run.awaiting_caller")
    assert (waiting.actor_name, waiting.outcome, waiting.detail) == (
        "alice",
        RunStatus.AWAITING_CALLER,
        {"generation": 1},
    )


def test_signed_decisions_verify_with_the_published_keys(people):
    run = decided_caller_run(people)
    ticket = Ticket.objects.get(run=run)

    decisions = remote.signed_decisions(run)

    assert len(decisions) == 1
    payload = signatures.verify_decision(decisions[0], signatures.decision_public_keys())
    assert payload == {
        "v": 1,
        "tenant": "acme",
        "run": run.pk,
        "generation": 1,
        "ticket": ticket.pk,
        "call_id": "call_1",
        "tool_name": "ship",
        "arguments_digest": arguments_digest(json.dumps(PRODUCTION)),
        "decision": "approve",
        "message": "",
        "approvers": ["alice"],
        "decided_at": ticket.decided_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    assert decisions[0]["key_id"] == signatures.decision_public_keys()[0]["id"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("decision", "reject"), ("arguments_digest", "0" * 64), ("run", 0), ("approvers", [])],
)
def test_signed_decisions_fail_to_verify_after_any_payload_change(people, field, value):
    signed = remote.signed_decisions(decided_caller_run(people))[0]
    signed["payload"][field] = value

    with pytest.raises(signatures.BadSignatureError):
        signatures.verify_decision(signed, signatures.decision_public_keys())


def test_signed_decisions_name_every_approver_of_a_quorum(people):
    save_policy(tenant=people["tenant"], user=people["admin"], required_approvals=2)
    state = caller_state(external_agent([ship_call(PRODUCTION, "call_1")], [assistant_message("")]))
    run = submit(people["tenant"], state)
    ticket = Ticket.objects.get(run=run)

    decide(ticket, user=people["alice"], approve=True)
    run.refresh_from_db()
    assert (run.status, remote.signed_decisions(run)) == (RunStatus.PAUSED, [])
    decide(ticket, user=people["bob"], approve=True)
    run.refresh_from_db()

    assert run.status == RunStatus.AWAITING_CALLER
    assert remote.signed_decisions(run)[0]["payload"]["approvers"] == ["alice", "bob"]


def test_signed_decisions_of_a_rejection_carry_its_message(people):
    run = decided_caller_run(people, approve=False, message="Not on a Friday.")

    payload = remote.signed_decisions(run)[0]["payload"]

    assert (payload["decision"], payload["message"], payload["approvers"]) == (
        "reject",
        "Not on a Friday.",
        ["alice"],
    )


def test_signed_decisions_none_for_a_console_run(people):
    run = _console(people)

    assert remote.signed_decisions(run) == []


def test_signed_decisions_after_a_key_rotation_verify_with_either_key(people, settings):
    run = decided_caller_run(people)
    before = remote.signed_decisions(run)[0]
    settings.APPROVALS_DECISION_SIGNING_KEYS = [
        ("next", b"n" * 32),
        *settings.APPROVALS_DECISION_SIGNING_KEYS,
    ]

    after = remote.signed_decisions(run)[0]
    published = signatures.decision_public_keys()

    assert after["key_id"] == "next"
    assert signatures.verify_decision(before, published) == before["payload"]
    assert signatures.verify_decision(after, published) == after["payload"]


# --- expiry and the reaper ------------------------------------------------------------------------


def test_expiry_that_expires_ends_a_caller_run_as_a_console_run(people):
    state = caller_state(external_agent([ship_call(PRODUCTION, "call_1")], [assistant_message("")]))
    run = submit(people["tenant"], state)

    report = reaper.reap(now=timezone.now() + timedelta(days=30))

    run.refresh_from_db()
    assert (run.status, report.expired_runs) == (RunStatus.EXPIRED, [run.pk])
    assert Ticket.objects.get(run=run).status == TicketStatus.EXPIRED
    assert resume_tasks() == 0


def test_expiry_that_rejects_hands_a_caller_run_back_to_its_caller(people):
    save_policy(tenant=people["tenant"], user=people["admin"], tool_name="ship", on_expiry="reject")
    state = caller_state(external_agent([ship_call(PRODUCTION, "call_1")], [assistant_message("")]))
    run = submit(people["tenant"], state)

    report = reaper.reap(now=timezone.now() + timedelta(days=30))

    run.refresh_from_db()
    assert run.status == RunStatus.AWAITING_CALLER
    assert (report.awaiting_caller, report.queued) == ([run.pk], [])
    assert resume_tasks() == 0
    payload = remote.signed_decisions(run)[0]["payload"]
    assert (payload["decision"], payload["approvers"]) == ("reject", [])
    assert payload["message"].startswith("Nobody approved this ship call before its approval")


def test_reaper_never_requeues_or_resumes_a_caller_run(people):
    waiting = decided_caller_run(people)
    # Rows as a bug or a hand in the database could leave them: a lapsed lease, a stale queue.
    long_ago = timezone.now() - timedelta(days=1)
    Run.objects.filter(pk=waiting.pk).update(updated_at=long_ago)
    stuck = decided_caller_run(people)
    Run.objects.filter(pk=stuck.pk).update(
        status=RunStatus.RESUMING, lease_owner="gone:1", lease_expires_at=long_ago
    )
    queued = decided_caller_run(people)
    Run.objects.filter(pk=queued.pk).update(status=RunStatus.QUEUED, updated_at=long_ago)
    events = AuditEvent.objects.count()

    report = reaper.reap()
    outcome = resume(run_id=queued.pk, worker_id="w:1")

    assert (report.requeued, report.reenqueued, report.queued) == ([], [], [])
    assert outcome.reason == "not claimed: another delivery has it"
    assert list(
        Run.objects.filter(pk__in=[waiting.pk, stuck.pk, queued.pk])
        .order_by("pk")
        .values_list("status", flat=True)
    ) == [RunStatus.AWAITING_CALLER, RunStatus.RESUMING, RunStatus.QUEUED]
    assert resume_tasks() == 0
    assert AuditEvent.objects.count() == events
    assert ran == []


# --- the caller reports ---------------------------------------------------------------------------


def test_report_completed_stores_the_output_and_closes_the_run(people):
    run = decided_caller_run(people)

    done = remote.report_outcome(run, status="completed", output="Shipped.", via=VIA)

    assert (done.status, done.final_output, done.status_reason) == (
        RunStatus.COMPLETED,
        "Shipped.",
        "",
    )
    assert done.finished_at is not None
    completed = AuditEvent.objects.get(run_id=run.pk, action="run.completed")
    assert (completed.actor_name, completed.outcome, completed.detail) == (
        "caller",
        RunStatus.COMPLETED,
        VIA,
    )
    # The decisions it acted on stay readable.
    assert len(remote.signed_decisions(done)) == 1


def test_report_paused_again_seals_the_next_generation_with_new_tickets(people):
    agent = external_agent(
        [ship_call(PRODUCTION, "call_1")],
        [ship_call({"release": "2026.07.25", "environment": "production"}, "call_2")],
        [assistant_message("both shipped")],
    )
    state = caller_state(agent)
    run = submit(people["tenant"], state, requested_by=people["requester"])
    first = Ticket.objects.get(run=run)
    decide(first, user=people["alice"], approve=True)
    run.refresh_from_db()

    result = resume_as_caller(agent, state, remote.signed_decisions(run))
    assert ran == [PRODUCTION]
    next_state = result.to_state().to_json()
    again = remote.report_outcome(
        run, status="paused", state_json=next_state, actor=people["bob"], via=VIA
    )

    assert (again.status, again.state_generation) == (RunStatus.PAUSED, 2)
    assert open_state(again) == next_state
    tickets = list(Ticket.objects.filter(run=run).order_by("pk"))
    assert [(t.generation, t.tool_call_id, t.status) for t in tickets] == [
        (1, "call_1", TicketStatus.APPROVED),
        (2, "call_2", TicketStatus.PENDING),
    ]
    assert tickets[1].requested_by == people["requester"]
    paused = AuditEvent.objects.filter(run_id=run.pk, action="run.paused").order_by("seq").last()
    assert (paused.actor_name, paused.detail) == ("bob", {"tickets": 1, "generation": 2, **VIA})
    assert remote.signed_decisions(again) == []

    # The second round goes the same way, and the caller finishes.
    decide(tickets[1], user=people["alice"], approve=True)
    again.refresh_from_db()
    assert again.status == RunStatus.AWAITING_CALLER
    decisions = remote.signed_decisions(again)
    assert [d["payload"]["generation"] for d in decisions] == [2]
    final = resume_as_caller(agent, next_state, decisions)
    done = remote.report_outcome(again, status="completed", output=str(final.final_output))

    assert (done.status, done.final_output) == (RunStatus.COMPLETED, "both shipped")
    assert ran == [PRODUCTION, {"release": "2026.07.25", "environment": "production"}]
    assert resume_tasks() == 0


def test_report_failed_from_awaiting_caller_keeps_the_reason(people):
    run = decided_caller_run(people)

    failed = remote.report_outcome(run, status="failed", error="  the deploy host\nis down ")

    assert (failed.status, failed.status_reason) == (RunStatus.FAILED, "the deploy host is down")
    event = AuditEvent.objects.get(run_id=run.pk, action="run.failed")
    assert (event.outcome, event.detail) == (
        RunStatus.FAILED,
        {"reason": "the deploy host is down"},
    )


def test_report_failed_from_paused_supersedes_the_pending_tickets(people):
    state = caller_state(external_agent([ship_call(PRODUCTION, "call_1")], [assistant_message("")]))
    run = submit(people["tenant"], state)

    failed = remote.report_outcome(run, status="failed", actor=people["requester"])

    assert (failed.status, failed.status_reason) == (
        RunStatus.FAILED,
        "its caller reported a failure",
    )
    assert Ticket.objects.get(run=run).status == TicketStatus.SUPERSEDED
    assert AuditEvent.objects.get(run_id=run.pk, action="run.failed").actor_name == "req"
    assert remote.signed_decisions(failed) == []


def _paused(people) -> Run:
    state = caller_state(external_agent([ship_call(PRODUCTION, "call_1")], [assistant_message("")]))
    return submit(people["tenant"], state)


def _completed(people) -> Run:
    return remote.report_outcome(decided_caller_run(people), status="completed", output="x")


def _console(people) -> Run:
    result = run_agent("release", "Deploy", agent=calling_agent(PRODUCTION))
    return pause_run(result, tenant=people["tenant"], agent_key="release", agent_version="1")


@pytest.mark.parametrize(
    ("make", "outcome", "sentence"),
    [
        (
            _paused,
            {"status": "completed", "output": "x"},
            "still waits for decisions, so it cannot be completed yet; a caller that gives up "
            "reports it failed.",
        ),
        (
            _completed,
            {"status": "failed"},
            "already ended (completed); nothing more can be reported.",
        ),
        (
            _console,
            {"status": "failed"},
            "is resumed by the console's worker, not by its caller.",
        ),
    ],
    ids=["completed-while-paused", "after-the-end", "console-run"],
)
def test_report_outcome_from_the_wrong_state_is_409_writing_nothing(
    people, make, outcome, sentence
):
    run = make(people)
    before = (counts(), run.status)

    with pytest.raises(remote.OutcomeConflictError) as raised:
        remote.report_outcome(run, **outcome)

    run.refresh_from_db()
    assert raised.value.status == 409
    assert raised.value.sentence() == f"Run {run.pk} {sentence}"
    assert (counts(), run.status) == before


def test_report_outcome_unknown_status_or_bad_state_is_400_writing_nothing(people):
    run = decided_caller_run(people)
    before = counts()

    with pytest.raises(remote.InvalidOutcomeError) as unknown:
        remote.report_outcome(run, status="done")
    with pytest.raises(remote.InvalidStateError) as bad_state:
        remote.report_outcome(run, status="paused", state_json={"$schemaVersion": "1.0"})

    run.refresh_from_db()
    assert (unknown.value.status, unknown.value.sentence()) == (
        400,
        "The status must be completed, paused or failed, not 'done'.",
    )
    assert bad_state.value.status == 400
    assert (counts(), run.status, run.state_generation) == (before, RunStatus.AWAITING_CALLER, 1)
