"""S1: serialise a paused run and resume it later (publishing test invoice INV-781).

The SDK flow is driven in-process; pause_run gives the run and ticket ids the ledger needs,
and ledger.resume_scope lets the tool's side effect through exactly as a console worker would.
"""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest
from agents import Agent, Runner, RunState
from agents.exceptions import UserError
from agents.memory import SQLiteSession
from agents.run_state import CURRENT_SCHEMA_VERSION
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from approvals.decisions.decide import decide
from approvals.execution import ledger
from approvals.execution.state import SecretInContextError, open_state
from approvals.models import AuditEvent, Run, RunStatus, Ticket, TicketStatus
from approvals.runs.pause import pause_run
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, run_agent

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Publish test invoice INV-781"
SECRET = "sk-" + "S1secretS1secretS1secret"
INTERRUPTION = ("publish_invoice", "call_publish_INV-781", '{"invoice_id":"INV-781"}')


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # Users are made by the factory with a password; the default PBKDF2 costs ~1 s per user.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def model_calls(monkeypatch) -> dict[str, int]:
    monkeypatch.setitem(demo.MODEL_CALLS, "invoice", 0)
    return demo.MODEL_CALLS


def described(interruptions) -> list[tuple[str, str, str]]:
    return [(item.name, item.call_id, item.arguments) for item in interruptions]


def store(result, tenant, **kwargs) -> tuple[Run, Ticket]:
    run = pause_run(result, tenant=tenant, agent_key="invoice", agent_version="1", **kwargs)
    return run, Ticket.objects.get(run=run)


def console_scope(run: Run, *tickets: Ticket) -> ledger.ResumeScope:
    return ledger.ResumeScope(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        attempt="s1#1",
        tickets_by_call_id={t.tool_call_id: t.pk for t in tickets},
    )


class CountingSession(SQLiteSession):
    """A file SQLiteSession that counts its writes across every instance the test opens."""

    writes: list[int] = []

    async def add_items(self, items) -> None:
        type(self).writes.append(len(items))
        await super().add_items(items)


# --- serialise, restore, approve, resume ---------------------------------------------------------


def test_s1_paused_state_serialises_to_a_non_empty_string(model_calls):
    result = run_agent("invoice", PROMPT, context={"customer": "acme"})

    payload = result.to_state().to_string()

    assert isinstance(payload, str)
    assert len(payload) > 0
    assert json.loads(payload)["$schemaVersion"] == CURRENT_SCHEMA_VERSION
    assert described(result.interruptions) == [INTERRUPTION]
    assert model_calls["invoice"] == 1
    assert demo.read_effects() == []


def test_s1_restored_state_keeps_the_interruption():
    result = run_agent("invoice", PROMPT)
    payload = result.to_state().to_string()

    # from_string is a coroutine in this SDK (the tutorials call it synchronously).
    assert inspect.iscoroutinefunction(RunState.from_string)
    state = asyncio.run(RunState.from_string(demo.build_invoice_agent(), payload))

    assert described(state.get_interruptions()) == [INTERRUPTION]
    assert demo.read_effects() == []


def test_s1_approved_restored_state_runs_the_tool_once(tmp_path, monkeypatch, model_calls):
    monkeypatch.setattr(CountingSession, "writes", [])
    tenant = TenantFactory()
    session = CountingSession("conv-inv-781", tmp_path / "sessions.db")
    try:
        result = run_agent("invoice", PROMPT, session=session)
        run, ticket = store(result, tenant, requested_by=member(tenant, "viewer"), session=session)
        payload = result.to_state().to_string()
        items_at_pause = len(asyncio.run(session.get_items()))
        assert CountingSession.writes == [1, 1]

        # A fresh top-level agent, as a worker in another process would build it.
        agent = demo.build_invoice_agent()
        state = asyncio.run(RunState.from_string(agent, payload))
        state.approve(state.get_interruptions()[0])
        with ledger.resume_scope(console_scope(run, ticket)) as scope:
            resumed = asyncio.run(Runner.run(agent, state, session=session))
        items_after = len(asyncio.run(session.get_items()))
    finally:
        session.close()

    assert resumed.interruptions == []
    assert resumed.final_output == "Invoice INV-781: Invoice INV-781 was published."
    assert [(e["op"], e["invoice_id"]) for e in demo.read_effects()] == [
        ("publish_invoice", "INV-781")
    ]
    assert len(scope.effects) == 1
    assert model_calls["invoice"] == 2
    # Pause: prompt and function call. Resume: the tool's output, then the final message.
    assert (items_at_pause, items_after) == (2, 4)
    assert CountingSession.writes == [1, 1, 1, 1]


def test_s1_approved_state_outside_a_console_resume_runs_nothing():
    result = run_agent("invoice", PROMPT)
    agent = demo.build_invoice_agent()
    state = asyncio.run(RunState.from_string(agent, result.to_state().to_string()))
    state.approve(state.get_interruptions()[0])

    with pytest.raises(UserError, match="Error running tool publish_invoice") as raised:
        asyncio.run(Runner.run(agent, state))

    assert type(raised.value.__cause__) is ledger.LedgerError
    assert str(raised.value.__cause__) == (
        "publish_invoice may only run inside an approved console resume"
    )
    assert demo.read_effects() == []


# --- sticky decisions ----------------------------------------------------------------------------


def _two_invoice_responder(call) -> list:
    answered = {
        item["call_id"]
        for item in call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }
    for invoice in ("INV-781", "INV-782"):
        call_id = f"call_publish_{invoice}"
        if call_id not in answered:
            return [function_call("publish_invoice", {"invoice_id": invoice}, call_id=call_id)]
    return [assistant_message("Both invoices were published.")]


def two_invoice_agent() -> Agent:
    """The invoice tool, called twice in one run: once per invoice, one per turn."""
    return Agent(
        name="invoice",
        model=ScriptedModel([ModelStep.respond(_two_invoice_responder) for _ in range(5)]),
        tools=[demo.publish_invoice],
    )


def approve_first_and_round_trip(*, always: bool) -> tuple[RunState, Run, Ticket, dict]:
    tenant = TenantFactory()
    result = run_agent(
        "invoice", "Publish test invoices INV-781 and INV-782", agent=two_invoice_agent()
    )
    run, ticket = store(result, tenant)
    state = result.to_state()
    state.approve(state.get_interruptions()[0], always_approve=always)
    # Serialise and restore twice, each time with a freshly built top-level agent.
    for _ in range(2):
        state_json = state.to_json()
        state = asyncio.run(RunState.from_json(two_invoice_agent(), state_json))
    return state, run, ticket, state_json


def test_s1_always_approve_survives_serialisation_and_does_not_pause_again():
    state, run, ticket, state_json = approve_first_and_round_trip(always=True)

    assert [
        (a["tool_key"], a["decision"]["approved"])
        for a in state_json["context"]["function_tool_approvals"]
    ] == [("publish_invoice", True)]
    with ledger.resume_scope(console_scope(run, ticket)):
        resumed = asyncio.run(Runner.run(two_invoice_agent(), state))

    assert resumed.interruptions == []
    assert resumed.final_output == "Both invoices were published."
    assert [e["invoice_id"] for e in demo.read_effects()] == ["INV-781", "INV-782"]


def test_s1_without_always_the_second_call_pauses():
    state, run, ticket, state_json = approve_first_and_round_trip(always=False)

    with ledger.resume_scope(console_scope(run, ticket)):
        resumed = asyncio.run(Runner.run(two_invoice_agent(), state))

    assert described(resumed.interruptions) == [
        ("publish_invoice", "call_publish_INV-782", '{"invoice_id":"INV-782"}')
    ]
    assert [e["invoice_id"] for e in demo.read_effects()] == ["INV-781"]


# --- negative: the original prompt again is a new run ----------------------------------------------


def test_s1_running_the_prompt_again_is_a_new_run_and_keeps_the_stored_ticket(model_calls):
    tenant = TenantFactory()
    run, ticket = store(run_agent("invoice", PROMPT), tenant)

    again = run_agent("invoice", PROMPT)

    assert described(again.interruptions) == [INTERRUPTION]
    context = again.to_state().to_json()["context"]
    # No decision travels with the new run: the SDK leaves an empty list out.
    assert (context["approvals"], context.get("function_tool_approvals", [])) == ({}, [])
    assert demo.read_effects() == []
    assert model_calls["invoice"] == 2
    assert Run.objects.count() == 1
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED


def test_s1_running_the_prompt_again_does_not_consume_an_approval():
    tenant = TenantFactory()
    run, ticket = store(run_agent("invoice", PROMPT), tenant, requested_by=member(tenant, "viewer"))
    decide(ticket, user=member(tenant), approve=True)

    again = run_agent("invoice", PROMPT)

    assert described(again.interruptions) == [INTERRUPTION]
    assert demo.read_effects() == []
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    # The stored decision is still there for the stored run, and used once.
    assert resume(run_id=run.pk, worker_id="w1").status == RunStatus.COMPLETED
    assert [e["invoice_id"] for e in demo.read_effects()] == ["INV-781"]


# --- the payload is sensitive ----------------------------------------------------------------------


def test_s1_secret_in_the_app_context_does_not_reach_storage():
    tenant = TenantFactory()
    result = run_agent("invoice", PROMPT, context={"customer": "acme", "api_key": SECRET})
    # The SDK's payload carries the context as it is.
    assert SECRET in result.to_state().to_string()

    with pytest.raises(SecretInContextError, match=r"context\.api_key \(key name\)"):
        store(result, tenant)

    assert Run.objects.count() == 0
    assert Ticket.objects.count() == 0
    assert AuditEvent.objects.count() == 0


def test_s1_secret_left_out_by_a_serializer_is_not_stored():
    tenant = TenantFactory()
    result = run_agent("invoice", PROMPT, context={"customer": "acme", "api_key": SECRET})

    run, _ = store(
        result,
        tenant,
        context_serializer=lambda context: {k: v for k, v in context.items() if k != "api_key"},
    )

    run.refresh_from_db()
    state = open_state(run)
    assert state["context"]["context"] == {"customer": "acme"}
    assert SECRET not in json.dumps(state)
    assert SECRET.encode() not in bytes(run.state_ciphertext)
    assert SECRET not in json.dumps(list(AuditEvent.objects.values()), default=str)
