"""S3: OpenAIConversationsSession against a local fake of the Conversations API.

The fake is a stdlib HTTP server on 127.0.0.1 in a thread: the tests never reach the internet
and need no key. It answers what the SDK session and the console's store call: create a
conversation, list items (cursor pages in either order), add items, delete an item, delete
the conversation; unknown conversations answer 404 like the real API.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import openai
import pytest
from agents import Agent, Runner
from agents.memory import OpenAIConversationsSession
from agents.testing import ModelStep, ScriptedModel, assistant_message

from approvals.decisions.decide import decide
from approvals.execution import registry
from approvals.execution import sessions as agent_sessions
from approvals.models import RunStatus, Ticket
from approvals.runs.pause import pause_run
from approvals.runs.resume import resume
from devtools import demo
from sessions_admin.models import ConversationRecord
from sessions_admin.stores import (
    ConversationsStore,
    Filters,
    SessionMissing,
    StoreUnavailable,
)
from tests.support import TenantFactory, member

TICKET_PROMPT = "Ticket number T-781"
PAGE = 3  # small pages, so that reading a history follows the cursor


# --- the fake API -------------------------------------------------------------------------------


@dataclass
class FakeConversations:
    url: str = ""
    conversations: dict[str, list[dict]] = field(default_factory=dict)
    requests: Counter = field(default_factory=Counter)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):04d}"

    def stored(self, item: dict) -> dict:
        """An input item as the API stores and returns it: with its own id and a status."""
        item = dict(item)
        kind = item.get("type") or ("message" if "role" in item else "")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                content = [{"type": part, "text": content}]
            item.update(type="message", content=content, id=self.new_id("msg"))
        else:
            item["id"] = self.new_id("item")
        item.setdefault("status", "completed")
        return item


def _handler(fake: FakeConversations):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _missing(self, what: str) -> None:
            self._send(
                404,
                {
                    "error": {
                        "message": f"{what} not found",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "not_found",
                    }
                },
            )

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def _route(self, method: str) -> None:
            parts = urlsplit(self.path)
            segments = parts.path.strip("/").split("/")
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            auth = self.headers.get("Authorization") or ""
            if segments[:2] != ["v1", "conversations"] or not auth.startswith("Bearer "):
                self._send(401, {"error": {"message": "bad path or key", "type": "auth"}})
                return
            rest = segments[2:]
            with fake.lock:
                if method == "POST" and not rest:
                    fake.requests["create"] += 1
                    conversation_id = fake.new_id("conv")
                    fake.conversations[conversation_id] = [
                        fake.stored(i) for i in self._body().get("items") or []
                    ]
                    self._send(
                        200,
                        {
                            "id": conversation_id,
                            "object": "conversation",
                            "created_at": int(time.time()),
                            "metadata": {},
                        },
                    )
                    return
                conversation_id = rest[0] if rest else ""
                items = fake.conversations.get(conversation_id)
                if items is None:
                    fake.requests[f"{method} missing"] += 1
                    self._missing(f"Conversation {conversation_id}")
                    return
                if method == "DELETE" and len(rest) == 1:
                    fake.requests["delete"] += 1
                    del fake.conversations[conversation_id]
                    self._send(
                        200,
                        {"id": conversation_id, "object": "conversation.deleted", "deleted": True},
                    )
                elif method == "GET" and rest[1:] == ["items"]:
                    fake.requests["list"] += 1
                    ordered = items if query.get("order") == "asc" else items[::-1]
                    if "after" in query:
                        ids = [i["id"] for i in ordered]
                        ordered = ordered[ids.index(query["after"]) + 1 :]
                    page = ordered[: int(query.get("limit", PAGE))]
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": page,
                            "first_id": page[0]["id"] if page else "",
                            "last_id": page[-1]["id"] if page else "",
                            "has_more": len(ordered) > len(page),
                        },
                    )
                elif method == "POST" and rest[1:] == ["items"]:
                    fake.requests["add"] += 1
                    added = [fake.stored(i) for i in self._body()["items"]]
                    items.extend(added)
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": added,
                            "first_id": added[0]["id"],
                            "last_id": added[-1]["id"],
                            "has_more": False,
                        },
                    )
                elif method == "DELETE" and len(rest) == 3 and rest[1] == "items":
                    fake.requests["delete item"] += 1
                    kept = [i for i in items if i["id"] != rest[2]]
                    if len(kept) == len(items):
                        self._missing(f"Item {rest[2]}")
                        return
                    items[:] = kept
                    self._send(
                        200,
                        {
                            "id": conversation_id,
                            "object": "conversation",
                            "created_at": 0,
                            "metadata": {},
                        },
                    )
                else:
                    self._send(405, {"error": {"message": "not in the fake", "type": "fake"}})

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self._route("DELETE")

    return Handler


@pytest.fixture
def fake_api():
    fake = FakeConversations()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def console_api(fake_api, settings):
    """The console's own client (approvals.execution.sessions.openai_client) talks to the fake.

    OPENAI_API_KEY stays empty: with a key the demo agents would use a real model.
    """
    settings.APPROVALS_OPENAI_BASE_URL = fake_api.url
    return fake_api


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _client(url: str, **options) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="test", **options)


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _texts(items: list) -> list[str]:
    texts = []
    for item in items:
        content = item.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.append(" ".join(part.get("text", "") for part in content))
    return texts


def _seen(call_input) -> str:
    if isinstance(call_input, str):
        return call_input
    return " ".join(_texts([i for i in call_input if isinstance(i, dict)]))


def _run(work, url: str, **options):
    """Run work(client) in one loop with a client it owns, closed even when work raised."""
    clients: list[openai.AsyncOpenAI] = []

    async def go():
        client = _client(url, **options)
        clients.append(client)
        try:
            return await work(client)
        finally:
            await client.close()

    try:
        return asyncio.run(go())
    finally:
        assert all(c.is_closed() for c in clients)


# --- the SDK session --------------------------------------------------------------------------


def test_session_without_id_has_no_session_id_before_first_access(fake_api):
    async def work(client):
        session = OpenAIConversationsSession(openai_client=client)
        with pytest.raises(ValueError, match="Session ID not yet available"):
            _ = session.session_id
        return fake_api.requests.copy()

    before = _run(work, fake_api.url)

    # Nothing is created until the session is used.
    assert before == Counter()
    assert fake_api.conversations == {}


def test_session_without_id_creates_one_conversation_at_first_access(fake_api):
    async def work(client):
        session = OpenAIConversationsSession(openai_client=client)
        first = await session.get_items()
        second = await session.get_items()
        return session.session_id, first, second

    conversation_id, first, second = _run(work, fake_api.url)

    assert (first, second) == ([], [])
    assert list(fake_api.conversations) == [conversation_id]
    assert fake_api.requests == Counter({"create": 1, "list": 2})


def test_session_add_get_limit_and_pop_follow_the_remote_history(fake_api):
    async def work(client):
        session = OpenAIConversationsSession(openai_client=client)
        await session.add_items([_user(str(n)) for n in range(1, 8)])
        everything = await session.get_items()
        latest = await session.get_items(limit=2)
        popped = await session.pop_item()
        after_pop = await session.get_items()
        return session.session_id, everything, latest, popped, after_pop

    conversation_id, everything, latest, popped, after_pop = _run(work, fake_api.url)

    # Seven items over three-item pages: the whole history, in order, not the first page.
    assert _texts(everything) == ["1", "2", "3", "4", "5", "6", "7"]
    assert _texts(latest) == ["6", "7"]
    assert _texts([popped]) == ["7"]
    assert _texts(after_pop) == ["1", "2", "3", "4", "5", "6"]
    assert _texts(fake_api.conversations[conversation_id]) == _texts(after_pop)
    assert (fake_api.requests["add"], fake_api.requests["delete item"]) == (1, 1)


def test_second_turn_with_the_conversation_id_sees_the_first(fake_api):
    def first(call):
        assert _seen(call.input) == TICKET_PROMPT
        return [assistant_message("Noted ticket T-781.")]

    def second(call):
        found = "T-781" if "T-781" in _seen(call.input) else "unknown"
        return [assistant_message(f"Your ticket is {found}.")]

    model = ScriptedModel([ModelStep.respond(first), ModelStep.respond(second)])
    agent = Agent(name="support", model=model)

    async def first_turn(client):
        session = OpenAIConversationsSession(openai_client=client)
        result = await Runner.run(agent, TICKET_PROMPT, session=session)
        return session.session_id, result.final_output

    conversation_id, first_output = _run(first_turn, fake_api.url)
    writes_after_first = fake_api.requests["add"]

    async def second_turn(client):
        # A new session object, in a new loop with a new client: only the id is shared.
        session = OpenAIConversationsSession(conversation_id=conversation_id, openai_client=client)
        result = await Runner.run(agent, "Which ticket was it?", session=session)
        return result.final_output, await session.get_items()

    second_output, history = _run(second_turn, fake_api.url)

    assert first_output == "Noted ticket T-781."
    assert second_output == "Your ticket is T-781."
    assert len(model.calls) == 2
    model.assert_complete()
    assert fake_api.requests["create"] == 1
    # The SDK writes each turn's input, then its output: two item requests a turn.
    assert (writes_after_first, fake_api.requests["add"]) == (2, 4)
    assert _texts(history) == [
        TICKET_PROMPT,
        "Noted ticket T-781.",
        "Which ticket was it?",
        "Your ticket is T-781.",
    ]
    assert list(fake_api.conversations) == [conversation_id]


def test_second_session_without_id_does_not_see_the_first_history(fake_api):
    async def work(client):
        one = OpenAIConversationsSession(openai_client=client)
        await one.add_items([_user(TICKET_PROMPT)])
        two = OpenAIConversationsSession(openai_client=client)
        return one.session_id, await two.get_items(), two.session_id, await one.get_items()

    one_id, two_items, two_id, one_items = _run(work, fake_api.url)

    assert two_items == []
    assert one_id != two_id
    assert _texts(one_items) == [TICKET_PROMPT]
    assert fake_api.requests["create"] == 2


def test_different_conversation_ids_are_different_histories(fake_api):
    async def work(client):
        one = OpenAIConversationsSession(openai_client=client)
        two = OpenAIConversationsSession(openai_client=client)
        await one.add_items([_user("for one")])
        await two.add_items([_user("for two")])
        again = OpenAIConversationsSession(conversation_id=one.session_id, openai_client=client)
        return await again.get_items(), await two.get_items()

    one_items, two_items = _run(work, fake_api.url)

    assert _texts(one_items) == ["for one"]
    assert _texts(two_items) == ["for two"]


def test_clear_session_deletes_the_remote_conversation_and_the_local_id(fake_api):
    async def work(client):
        session = OpenAIConversationsSession(openai_client=client)
        await session.add_items([_user(TICKET_PROMPT)])
        conversation_id = session.session_id
        await session.clear_session()
        with pytest.raises(ValueError):
            _ = session.session_id
        stale = OpenAIConversationsSession(conversation_id=conversation_id, openai_client=client)
        with pytest.raises(openai.NotFoundError):
            await stale.get_items()
        # Used again, the cleared session starts a new, empty conversation.
        fresh = await session.get_items()
        return conversation_id, session.session_id, fresh

    old_id, new_id, fresh = _run(work, fake_api.url)

    assert fake_api.requests["delete"] == 1
    assert old_id not in fake_api.conversations
    assert new_id != old_id
    assert fresh == []
    assert list(fake_api.conversations) == [new_id]


def test_clear_session_without_a_conversation_calls_nothing(fake_api):
    async def work(client):
        await OpenAIConversationsSession(openai_client=client).clear_session()

    _run(work, fake_api.url)

    assert fake_api.requests == Counter()


def test_unreachable_api_is_an_error_not_an_empty_history():
    url = f"http://127.0.0.1:{_closed_port()}/v1"

    async def work(client):
        session = OpenAIConversationsSession(conversation_id="conv_0001", openai_client=client)
        with pytest.raises(openai.APIConnectionError):
            await session.get_items()
        with pytest.raises(openai.APIConnectionError):
            await session.add_items([_user("lost?")])
        return session.session_id

    # The id is kept: the conversation is still there, only unreachable right now.
    assert _run(work, url, max_retries=0) == "conv_0001"


def test_unknown_conversation_id_is_an_error_not_an_empty_history(fake_api):
    async def work(client):
        session = OpenAIConversationsSession(conversation_id="conv_nope", openai_client=client)
        with pytest.raises(openai.NotFoundError):
            await session.get_items()

    _run(work, fake_api.url)

    assert fake_api.requests == Counter({"GET missing": 1})


# --- the console's store ------------------------------------------------------------------------


def _conversation_with(fake: FakeConversations, *items: dict) -> str:
    conversation_id = fake.new_id("conv")
    fake.conversations[conversation_id] = [fake.stored(i) for i in items]
    return conversation_id


@pytest.mark.django_db
def test_store_lists_recorded_conversations_of_the_tenants_without_calling_the_api(
    console_api,
):
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    ConversationRecord.objects.create(tenant=acme, conversation_id="conv_a1")
    ConversationRecord.objects.create(tenant=acme, conversation_id="test_a2")
    ConversationRecord.objects.create(tenant=globex, conversation_id="conv_g1")

    everything = ConversationsStore().list(Filters(tenants=[acme]))
    prefixed = ConversationsStore().list(Filters(prefix="test_", tenants=[acme, globex]))

    assert [(i.tenant.slug, i.session_id, i.items) for i in everything] == [
        ("acme", "conv_a1", None),
        ("acme", "test_a2", None),
    ]
    assert [i.key for i in prefixed] == ["openai_conversations:acme:test_a2"]
    assert console_api.requests == Counter()


@pytest.mark.django_db
def test_store_items_reads_the_remote_history(console_api):
    acme = TenantFactory(slug="acme")
    conversation_id = _conversation_with(
        console_api, _user(TICKET_PROMPT), {"role": "assistant", "content": "Noted."}
    )
    ConversationRecord.objects.create(tenant=acme, conversation_id=conversation_id)

    items = ConversationsStore().items(acme, conversation_id)

    assert _texts(items) == [TICKET_PROMPT, "Noted."]
    assert console_api.requests == Counter({"list": 1})


@pytest.mark.django_db
def test_store_items_of_another_tenants_conversation_is_missing(console_api):
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    conversation_id = _conversation_with(console_api, _user("globex secret"))
    ConversationRecord.objects.create(tenant=globex, conversation_id=conversation_id)

    with pytest.raises(SessionMissing):
        ConversationsStore().items(acme, conversation_id)
    with pytest.raises(SessionMissing):
        ConversationsStore().clear(acme, conversation_id)

    assert console_api.requests == Counter()
    assert conversation_id in console_api.conversations


@pytest.mark.django_db
def test_store_clear_deletes_the_remote_conversation_and_its_record(console_api):
    acme = TenantFactory(slug="acme")
    conversation_id = _conversation_with(console_api, _user("one"), _user("two"))
    kept_id = _conversation_with(console_api, _user("kept"))
    ConversationRecord.objects.create(tenant=acme, conversation_id=conversation_id)
    ConversationRecord.objects.create(tenant=acme, conversation_id=kept_id)

    count = ConversationsStore().clear(acme, conversation_id)

    assert count == 2
    assert list(console_api.conversations) == [kept_id]
    assert list(ConversationRecord.objects.values_list("conversation_id", flat=True)) == [kept_id]
    assert console_api.requests["delete"] == 1


@pytest.mark.django_db
def test_store_with_an_unreachable_api_raises_store_unavailable(settings):
    settings.APPROVALS_OPENAI_BASE_URL = f"http://127.0.0.1:{_closed_port()}/v1"
    acme = TenantFactory(slug="acme")
    ConversationRecord.objects.create(tenant=acme, conversation_id="conv_0001")

    with pytest.raises(StoreUnavailable, match="^OpenAI Conversations: Connection error"):
        ConversationsStore().items(acme, "conv_0001")
    with pytest.raises(StoreUnavailable):
        ConversationsStore().clear(acme, "conv_0001")

    # Nothing was cleared: the record stays until the API confirms the delete.
    assert ConversationRecord.objects.filter(conversation_id="conv_0001").exists()


@pytest.mark.django_db
def test_store_without_key_or_base_url_raises_store_unavailable(settings):
    settings.APPROVALS_OPENAI_BASE_URL = ""
    acme = TenantFactory(slug="acme")
    ConversationRecord.objects.create(tenant=acme, conversation_id="conv_0001")

    with pytest.raises(StoreUnavailable, match="OPENAI_API_KEY is not set"):
        ConversationsStore().items(acme, "conv_0001")


@pytest.mark.django_db
def test_store_closes_the_clients_it_opens(console_api, monkeypatch):
    acme = TenantFactory(slug="acme")
    conversation_id = _conversation_with(console_api, _user("one"))
    ConversationRecord.objects.create(tenant=acme, conversation_id=conversation_id)
    opened: list[openai.AsyncOpenAI] = []
    original = agent_sessions.openai_client

    def recording_client():
        client = original()
        opened.append(client)
        return client

    monkeypatch.setattr(agent_sessions, "openai_client", recording_client)

    ConversationsStore().items(acme, conversation_id)
    ConversationsStore().clear(acme, conversation_id)

    # One client to read, one to count and delete.
    assert len(opened) == 2
    # Each client's connection pool belongs to a loop that asyncio.run has closed.
    assert [c.is_closed() for c in opened] == [True, True]


# --- a paused run records its conversation ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_paused_with_a_conversations_session_records_it_for_its_tenant(console_api):
    acme = TenantFactory(slug="acme")
    TenantFactory(slug="globex")
    agent = registry.get_spec("release", "1").build()
    calls_before = demo.MODEL_CALLS["release"]

    async def first_turn(client):
        session = OpenAIConversationsSession(openai_client=client)
        result = await Runner.run(
            agent, "Deploy release 2026.07.24 to production", context={}, session=session
        )
        return session, result

    session, result = _run(first_turn, console_api.url)
    run = pause_run(result, tenant=acme, agent_key="release", agent_version="1", session=session)

    conversation_id = session.session_id
    assert (run.session_backend, run.session_id, run.session_location) == (
        "openai_conversations",
        conversation_id,
        "",
    )
    record = ConversationRecord.objects.get()
    assert (record.tenant.slug, record.conversation_id) == ("acme", conversation_id)
    assert len(result.interruptions) == 1
    assert demo.MODEL_CALLS["release"] - calls_before == 1
    assert demo.read_effects() == []
    assert _texts(console_api.conversations[conversation_id])[:1] == [
        "Deploy release 2026.07.24 to production"
    ]

    # Resumed by a worker, the run continues that conversation through the console's client.
    decide(Ticket.objects.get(run=run), user=member(acme, "approver"), approve=True)
    outcome = resume(run_id=run.pk, worker_id="test-worker")

    run.refresh_from_db()
    assert outcome.status == RunStatus.COMPLETED
    assert len(demo.read_effects("deploy_release")) == 1
    history = console_api.conversations[conversation_id]
    assert _texts(history[-1:]) == [run.final_output]
    assert [i["type"] for i in history].count("function_call_output") == 1
    assert console_api.requests["create"] == 1
    assert ConversationRecord.objects.count() == 1


def test_reopened_conversations_session_closes_its_client(console_api, monkeypatch):
    conversation_id = _conversation_with(console_api, _user(TICKET_PROMPT))
    opened: list[openai.AsyncOpenAI] = []
    original = agent_sessions.openai_client

    def recording_client():
        client = original()
        opened.append(client)
        return client

    monkeypatch.setattr(agent_sessions, "openai_client", recording_client)

    async def resume_like_a_worker():
        ref = agent_sessions.SessionRef("openai_conversations", conversation_id)
        async with agent_sessions.reopen(ref) as session:
            return await session.get_items()

    items = asyncio.run(resume_like_a_worker())

    assert _texts(items) == [TICKET_PROMPT]
    assert len(opened) == 1
    # reopen() made the client, so it must close it, as it does for Redis and SQLite.
    assert opened[0].is_closed()


@pytest.mark.django_db
def test_run_with_a_conversations_session_not_yet_created_cannot_be_paused(console_api):
    acme = TenantFactory(slug="acme")

    async def never_used(client):
        return OpenAIConversationsSession(openai_client=client)

    session = _run(never_used, console_api.url)

    with pytest.raises(agent_sessions.UnsupportedSessionError, match="run at least one turn"):
        agent_sessions.describe(session)
    assert ConversationRecord.objects.filter(tenant=acme).count() == 0
