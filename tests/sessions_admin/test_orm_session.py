"""DjangoSession: the SDK's Session protocol on the ORM, across turns, processes and wrappers."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading

import pytest
from agents import Agent, Runner
from agents.extensions.memory import EncryptedSession
from agents.testing import ModelStep, ScriptedModel, assistant_message
from django.db.backends.signals import connection_created

from approvals.decisions.decide import decide
from approvals.models import RunStatus, Ticket
from approvals.runs.resume import resume
from devtools import demo
from sessions_admin.models import StoredItem, StoredSession
from sessions_admin.orm_session import DjangoSession
from tests.conftest import manage
from tests.support import TenantFactory, member, paused_run

# DjangoSession reads and writes in a worker thread with its own connection: data is committed.
pytestmark = pytest.mark.django_db(transaction=True)

TICKET_PROMPT = "Ticket number T-781"


class CountingDjangoSession(DjangoSession):
    """Counts add_items calls, so a test can tell how often the SDK wrote to the session."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writes = 0

    async def add_items(self, items):
        self.writes += 1
        await super().add_items(items)


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _texts(items: list) -> list[str]:
    """The text of each item: a user's content or an assistant's output text."""
    texts = []
    for item in items:
        content = item.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.append(" ".join(part.get("text", "") for part in content))
        else:
            texts.append("")
    return texts


def _seen(call_input) -> list[str]:
    if isinstance(call_input, str):
        return [call_input]
    return _texts([item for item in call_input if isinstance(item, dict)])


def test_django_session_add_then_get_returns_items_in_order():
    tenant = TenantFactory(slug="acme")
    session = DjangoSession("conv-1", tenant=tenant)

    asyncio.run(session.add_items([_user("one"), _user("two")]))
    asyncio.run(session.add_items([_user("three")]))

    assert asyncio.run(session.get_items()) == [_user("one"), _user("two"), _user("three")]
    stored = StoredSession.objects.get(tenant=tenant, session_id="conv-1")
    assert StoredItem.objects.filter(session=stored).count() == 3


def test_django_session_get_with_limit_returns_the_latest_in_order():
    session = DjangoSession("conv-1", tenant=TenantFactory(slug="acme"))
    asyncio.run(session.add_items([_user("one"), _user("two"), _user("three")]))

    assert asyncio.run(session.get_items(limit=2)) == [_user("two"), _user("three")]
    assert asyncio.run(session.get_items(limit=0)) == []


def test_django_session_unknown_id_is_empty_and_writes_nothing():
    session = DjangoSession("never-written", tenant=TenantFactory(slug="acme"))

    assert asyncio.run(session.get_items()) == []
    assert asyncio.run(session.pop_item()) is None
    assert StoredSession.objects.count() == 0


def test_django_session_pop_removes_the_last_item_only():
    session = DjangoSession("conv-1", tenant=TenantFactory(slug="acme"))
    asyncio.run(session.add_items([_user("one"), _user("two")]))

    popped = asyncio.run(session.pop_item())

    assert popped == _user("two")
    assert asyncio.run(session.get_items()) == [_user("one")]


def test_django_session_clear_removes_the_session_and_leaves_others():
    tenant = TenantFactory(slug="acme")
    session = DjangoSession("conv-1", tenant=tenant)
    other = DjangoSession("conv-2", tenant=tenant)
    asyncio.run(session.add_items([_user("one")]))
    asyncio.run(other.add_items([_user("kept")]))

    asyncio.run(session.clear_session())

    assert asyncio.run(session.get_items()) == []
    assert list(StoredSession.objects.values_list("session_id", flat=True)) == ["conv-2"]
    assert asyncio.run(other.get_items()) == [_user("kept")]


def test_django_session_same_id_in_another_tenant_is_another_history():
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    asyncio.run(DjangoSession("conv-1", tenant=acme).add_items([_user("acme only")]))

    # The tenant may be given by slug too, as the console's opener does.
    assert asyncio.run(DjangoSession("conv-1", tenant="globex").get_items()) == []
    assert asyncio.run(DjangoSession("conv-1", tenant="acme").get_items()) == [_user("acme only")]
    assert globex.agent_sessions.count() == 0


def test_django_session_closes_the_connections_its_worker_threads_open():
    session = DjangoSession("conv-1", tenant=TenantFactory(slug="acme"))
    opened = []

    def record(sender, connection, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            opened.append(connection)

    connection_created.connect(record)
    try:
        asyncio.run(session.add_items([_user("one")]))
        assert asyncio.run(session.get_items()) == [_user("one")]
    finally:
        connection_created.disconnect(record)

    # Each call runs in a worker thread with a connection of its own; none may be left open.
    assert len(opened) >= 1
    assert [c.connection is None for c in opened] == [True] * len(opened)


def test_django_session_two_runner_turns_second_sees_the_first():
    tenant = TenantFactory(slug="acme")
    session = CountingDjangoSession("support-1", tenant=tenant)

    def first(call):
        assert _seen(call.input) == [TICKET_PROMPT]
        return [assistant_message("Noted ticket T-781.", item_id="msg-1")]

    def second(call):
        seen = _seen(call.input)
        ticket = next((t for t in seen if "T-781" in t), None)
        return [assistant_message(f"Your ticket is {'T-781' if ticket else 'unknown'}.")]

    model = ScriptedModel([ModelStep.respond(first), ModelStep.respond(second)])
    agent = Agent(name="support", instructions="Remember tickets.", model=model)

    first_result = asyncio.run(Runner.run(agent, TICKET_PROMPT, session=session))
    writes_after_first = session.writes
    second_result = asyncio.run(Runner.run(agent, "Which ticket was it?", session=session))

    assert first_result.final_output == "Noted ticket T-781."
    assert second_result.final_output == "Your ticket is T-781."
    # Model calls, session writes and history are separate facts.
    assert len(model.calls) == 2
    model.assert_complete()
    assert _seen(model.calls[1].input) == [
        TICKET_PROMPT,
        "Noted ticket T-781.",
        "Which ticket was it?",
    ]
    # The SDK writes each turn's input, then its output.
    assert (writes_after_first, session.writes) == (2, 4)
    assert _texts(asyncio.run(session.get_items())) == [
        TICKET_PROMPT,
        "Noted ticket T-781.",
        "Which ticket was it?",
        "Your ticket is T-781.",
    ]


def test_django_session_another_process_reads_what_this_one_wrote():
    tenant = TenantFactory(slug="acme")
    asyncio.run(
        DjangoSession("shared-1", tenant=tenant).add_items([_user(TICKET_PROMPT), _user("two")])
    )
    code = (
        "import asyncio, json\n"
        "from sessions_admin.orm_session import DjangoSession\n"
        "items = asyncio.run(DjangoSession('shared-1', tenant='acme').get_items())\n"
        "other = asyncio.run(DjangoSession('shared-2', tenant='acme').get_items())\n"
        "print(json.dumps({'items': items, 'other': other}))\n"
    )

    process = manage("shell", "-c", code)
    out, err = process.communicate(timeout=60)

    assert process.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {
        "items": [_user(TICKET_PROMPT), _user("two")],
        "other": [],
    }


def test_django_session_reads_what_another_process_wrote():
    tenant = TenantFactory(slug="acme")
    code = (
        "import asyncio\n"
        "from sessions_admin.orm_session import DjangoSession\n"
        "asyncio.run(DjangoSession('from-b', tenant='acme')"
        ".add_items([{'role': 'user', 'content': 'written by B'}]))\n"
    )

    process = manage("shell", "-c", code)
    _, err = process.communicate(timeout=60)

    assert process.returncode == 0, err
    session = DjangoSession("from-b", tenant=tenant)
    assert asyncio.run(session.get_items()) == [_user("written by B")]


def test_encrypted_session_over_django_session_stores_no_plaintext():
    tenant = TenantFactory(slug="acme")
    key = secrets.token_urlsafe(32)
    inner = DjangoSession("enc-1", tenant=tenant)
    session = EncryptedSession(session_id="enc-1", underlying_session=inner, encryption_key=key)

    asyncio.run(session.add_items([_user(TICKET_PROMPT)]))

    assert asyncio.run(session.get_items()) == [_user(TICKET_PROMPT)]
    raw = list(StoredItem.objects.values_list("data", flat=True))
    assert len(raw) == 1
    assert raw[0]["__enc__"] == 1
    assert "T-781" not in json.dumps(raw)
    # The wrong key reads no history rather than garbage.
    wrong = EncryptedSession(
        session_id="enc-1",
        underlying_session=DjangoSession("enc-1", tenant=tenant),
        encryption_key=secrets.token_urlsafe(32),
    )
    assert asyncio.run(wrong.get_items()) == []


def test_encrypted_django_session_through_two_runner_turns():
    tenant = TenantFactory(slug="acme")
    key = secrets.token_urlsafe(32)

    def second(call):
        return [assistant_message("T-781" if "T-781" in " ".join(_seen(call.input)) else "none")]

    model = ScriptedModel(
        [ModelStep(output=[assistant_message("Noted.")]), ModelStep.respond(second)]
    )
    agent = Agent(name="support", model=model)

    def session():
        inner = DjangoSession("enc-run", tenant=tenant)
        return EncryptedSession(session_id="enc-run", underlying_session=inner, encryption_key=key)

    asyncio.run(Runner.run(agent, TICKET_PROMPT, session=session()))
    result = asyncio.run(Runner.run(agent, "Which ticket?", session=session()))

    assert result.final_output == "T-781"
    assert len(model.calls) == 2
    assert StoredItem.objects.count() == 4
    assert "T-781" not in json.dumps(list(StoredItem.objects.values_list("data", flat=True)))


def test_paused_run_with_a_django_session_resumes_with_it(settings):
    assert settings.APPROVALS_SESSION_OPENERS["django"] == (
        "sessions_admin.orm_session.open_for_console"
    )
    tenant = TenantFactory(slug="acme")
    session = CountingDjangoSession("release-1", tenant=tenant)
    run = paused_run(tenant, session=session)
    items_at_pause = asyncio.run(session.get_items())
    assert (run.session_backend, run.session_id, run.session_location) == (
        "django",
        "release-1",
        "acme",
    )
    assert session.writes >= 1
    assert demo.read_effects() == []

    decide(Ticket.objects.get(run=run), user=member(tenant, "approver"), approve=True)
    outcome = resume(run_id=run.pk, worker_id="test-worker")

    run.refresh_from_db()
    assert outcome.status == RunStatus.COMPLETED
    items = asyncio.run(DjangoSession("release-1", tenant=tenant).get_items())
    assert items[: len(items_at_pause)] == items_at_pause
    assert len(items) > len(items_at_pause)
    assert _texts(items[-1:]) == [run.final_output]
    assert [i.get("type") for i in items if i.get("type", "").startswith("function_call")] == [
        "function_call",
        "function_call_output",
    ]
    assert len(demo.read_effects("deploy_release")) == 1
    # The resume wrote to that session, not to a new one.
    assert StoredSession.objects.count() == 1


def test_paused_run_with_a_cleared_django_session_still_resumes_from_its_state():
    tenant = TenantFactory(slug="acme")
    session = DjangoSession("release-2", tenant=tenant)
    run = paused_run(tenant, session=session)
    asyncio.run(session.clear_session())

    decide(Ticket.objects.get(run=run), user=member(tenant, "approver"), approve=True)
    outcome = resume(run_id=run.pk, worker_id="test-worker")

    # An empty ORM session is readable, so the resume goes ahead; the state carries the call.
    assert outcome.status == RunStatus.COMPLETED
    assert len(demo.read_effects("deploy_release")) == 1
