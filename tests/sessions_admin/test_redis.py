"""S4: RedisSession shared by workers, and the console's RedisStore, against a real Redis.

Every test uses database 14 and its own key prefix, and deletes its keys afterwards.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
import redis
import redis.asyncio as aioredis
from agents import Agent, Runner
from agents.extensions.memory import RedisSession
from agents.testing import ModelStep, ScriptedModel, assistant_message
from django.utils import timezone

from sessions_admin.stores import (
    Filters,
    RedisStore,
    SessionMissing,
    StoreUnavailable,
    list_sessions,
    redis_prefix,
)
from tests.support import TenantFactory

REDIS_TEST_URL = "redis://127.0.0.1:6379/14"
UNREACHABLE_URL = "redis://127.0.0.1:1/0"
TICKET_PROMPT = "Ticket number T-781"


@pytest.fixture
def prefix():
    """A key prefix of this test's own; every key under it is deleted afterwards."""
    value = f"test-sessions-f:{uuid.uuid4().hex}"
    yield value
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        keys = list(client.scan_iter(match=f"{value}*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def console_redis(settings, prefix):
    settings.REDIS_URL = REDIS_TEST_URL
    settings.APPROVALS_REDIS_SESSION_PREFIX = prefix
    return prefix


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


def _connections_named(name: str) -> int:
    """How many connections the server has for this client name, counted from outside."""
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        return sum(1 for c in client.client_list() if c.get("name") == name)
    finally:
        client.close()


def _owned(session_id: str, prefix: str, name: str = "", url: str = REDIS_TEST_URL):
    kwargs = {"client_name": name} if name else {}
    return RedisSession.from_url(session_id, url=url, key_prefix=prefix, redis_kwargs=kwargs)


def _write(prefix: str, session_id: str, items: list[dict]) -> None:
    async def go():
        session = _owned(session_id, prefix)
        try:
            await session.add_items(items)
        finally:
            await session.close()

    asyncio.run(go())


# --- ownership and closing --------------------------------------------------------------------


def test_from_url_session_owns_its_client_and_close_releases_it(prefix):
    name = f"owned-{uuid.uuid4().hex[:12]}"

    async def go():
        session = _owned("conv-1", prefix, name)
        try:
            await session.add_items([_user("one")])
            assert _connections_named(name) == 1
            return session, await session.get_items()
        finally:
            await session.close()

    session, items = asyncio.run(go())

    assert _texts(items) == ["one"]
    assert _connections_named(name) == 0

    async def after_close():
        with pytest.raises(RuntimeError, match="RedisSession is closed"):
            await session.get_items()
        with pytest.raises(RuntimeError, match="RedisSession is closed"):
            await session.add_items([_user("two")])
        with pytest.raises(RuntimeError, match="RedisSession is closed"):
            await session.clear_session()

    asyncio.run(after_close())
    # Closing did not touch the data: a new session reads it.
    assert _texts(asyncio.run(_read(prefix, "conv-1"))) == ["one"]


async def _read(prefix: str, session_id: str) -> list:
    session = _owned(session_id, prefix)
    try:
        return await session.get_items()
    finally:
        await session.close()


def test_from_url_session_is_closed_even_when_the_body_raised(prefix):
    name = f"raised-{uuid.uuid4().hex[:12]}"
    opened: list[RedisSession] = []

    async def go():
        session = _owned("conv-1", prefix, name)
        opened.append(session)
        try:
            await session.add_items([_user("one")])
            raise LookupError("the body failed after a write")
        finally:
            await session.close()

    with pytest.raises(LookupError):
        asyncio.run(go())

    assert _connections_named(name) == 0

    async def after():
        with pytest.raises(RuntimeError):
            await opened[0].get_items()

    asyncio.run(after())


def test_repeated_and_concurrent_close_are_safe(prefix):
    name = f"closes-{uuid.uuid4().hex[:12]}"

    async def go():
        session = _owned("conv-1", prefix, name)
        try:
            await session.add_items([_user("one")])
            results = await asyncio.gather(*(session.close() for _ in range(5)))
            await session.close()
        finally:
            await session.close()
        with pytest.raises(RuntimeError):
            await session.get_items()
        return results

    assert asyncio.run(go()) == [None] * 5
    assert _connections_named(name) == 0


def test_session_with_an_external_client_leaves_that_client_open(prefix):
    name = f"external-{uuid.uuid4().hex[:12]}"

    async def go():
        client = aioredis.from_url(REDIS_TEST_URL, client_name=name)
        try:
            session = RedisSession("conv-1", redis_client=client, key_prefix=prefix)
            await session.add_items([_user("one")])
            await session.close()
            await session.close()
            # The application owns the client: it still works, and so does the session.
            assert await client.ping() is True
            assert _connections_named(name) == 1
            return await session.get_items()
        finally:
            await client.aclose()

    assert _texts(asyncio.run(go())) == ["one"]
    assert _connections_named(name) == 0


# --- history --------------------------------------------------------------------------------


def test_worker_b_in_another_process_reads_what_worker_a_wrote(prefix):
    def first(call):
        return [assistant_message("Noted ticket T-781.")]

    model = ScriptedModel([ModelStep.respond(first)])
    agent = Agent(name="support", model=model)

    async def worker_a():
        session = _owned("support-1", prefix)
        try:
            return await Runner.run(agent, TICKET_PROMPT, session=session)
        finally:
            await session.close()

    result = asyncio.run(worker_a())
    assert result.final_output == "Noted ticket T-781."
    assert len(model.calls) == 1

    worker_b = subprocess.run(
        [
            sys.executable,
            "-c",
            "import asyncio, json, sys\n"
            "from agents.extensions.memory import RedisSession\n"
            "url, prefix = sys.argv[1], sys.argv[2]\n"
            "async def main():\n"
            "    mine = RedisSession.from_url('support-1', url=url, key_prefix=prefix)\n"
            "    other = RedisSession.from_url('support-2', url=url, key_prefix=prefix)\n"
            "    try:\n"
            "        items = await mine.get_items()\n"
            "        await mine.add_items([{'role': 'user', 'content': 'from worker B'}])\n"
            "        print(json.dumps({'items': items, 'other': await other.get_items()}))\n"
            "    finally:\n"
            "        await mine.close()\n"
            "        await other.close()\n"
            "asyncio.run(main())\n",
            REDIS_TEST_URL,
            prefix,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert worker_b.returncode == 0, worker_b.stderr
    seen = json.loads(worker_b.stdout.strip().splitlines()[-1])
    assert _texts(seen["items"]) == [TICKET_PROMPT, "Noted ticket T-781."]
    assert seen["other"] == []
    # And A sees what B appended.
    assert _texts(asyncio.run(_read(prefix, "support-1"))) == [
        TICKET_PROMPT,
        "Noted ticket T-781.",
        "from worker B",
    ]


def test_second_turn_on_redis_sees_the_first(prefix):
    def second(call):
        seen = " ".join(_texts([i for i in call.input if isinstance(i, dict)]))
        return [assistant_message("T-781" if "T-781" in seen else "unknown")]

    model = ScriptedModel(
        [ModelStep(output=[assistant_message("Noted.")]), ModelStep.respond(second)]
    )
    agent = Agent(name="support", model=model)

    async def turn(prompt: str):
        # Each turn opens and closes its own session, as separate workers would.
        session = _owned("support-1", prefix)
        try:
            return (await Runner.run(agent, prompt, session=session)).final_output
        finally:
            await session.close()

    assert asyncio.run(turn(TICKET_PROMPT)) == "Noted."
    assert asyncio.run(turn("Which ticket?")) == "T-781"
    assert len(model.calls) == 2
    assert len(asyncio.run(_read(prefix, "support-1"))) == 4


def test_different_session_ids_never_share_history(prefix):
    _write(prefix, "conv-1", [_user("for one")])
    _write(prefix, "conv-2", [_user("for two")])

    assert _texts(asyncio.run(_read(prefix, "conv-1"))) == ["for one"]
    assert _texts(asyncio.run(_read(prefix, "conv-2"))) == ["for two"]
    # An id never written is an empty history, and that is not a failure.
    assert asyncio.run(_read(prefix, "conv-3")) == []


def test_clear_session_removes_only_that_session(prefix):
    _write(prefix, "conv-1", [_user("gone")])
    _write(prefix, "conv-2", [_user("kept")])

    async def go():
        session = _owned("conv-1", prefix)
        try:
            await session.clear_session()
        finally:
            await session.close()

    asyncio.run(go())

    assert asyncio.run(_read(prefix, "conv-1")) == []
    assert _texts(asyncio.run(_read(prefix, "conv-2"))) == ["kept"]
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        assert sorted(k.decode() for k in client.scan_iter(match=f"{prefix}:conv-1*")) == []
    finally:
        client.close()


def test_connection_error_is_an_error_not_an_empty_history():
    async def go():
        session = RedisSession.from_url(
            "conv-1",
            url=UNREACHABLE_URL,
            key_prefix="unreachable",
            redis_kwargs={"socket_connect_timeout": 2},
        )
        try:
            with pytest.raises(redis.exceptions.ConnectionError):
                await session.get_items()
            with pytest.raises(redis.exceptions.ConnectionError):
                await session.add_items([_user("lost?")])
            # ping reports it without raising; get_items above never answered [].
            assert await session.ping() is False
        finally:
            await session.close()
        with pytest.raises(RuntimeError):
            await session.get_items()

    asyncio.run(go())


# --- the console's RedisStore -----------------------------------------------------------------


@pytest.mark.django_db
def test_store_lists_sessions_under_each_tenants_prefix(console_redis):
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    _write(redis_prefix(acme), "support-1", [_user("a"), _user("b")])
    _write(redis_prefix(acme), "test-1", [_user("c")])
    _write(redis_prefix(globex), "support-9", [_user("d")])
    # A key of another application under the same Redis, outside the prefix: never listed.
    _write(f"{console_redis}-other:acme", "support-x", [_user("e")])

    infos = RedisStore().list(Filters(tenants=[acme, globex]))
    only_acme = RedisStore().list(Filters(tenants=[acme]))

    assert [(i.tenant.slug, i.session_id, i.items) for i in infos] == [
        ("acme", "support-1", 2),
        ("acme", "test-1", 1),
        ("globex", "support-9", 1),
    ]
    assert all(i.first_activity is not None and i.last_activity is not None for i in infos)
    assert [i.key for i in only_acme] == ["redis:acme:support-1", "redis:acme:test-1"]


@pytest.mark.django_db
def test_store_list_by_prefix_takes_glob_characters_literally(console_redis):
    acme = TenantFactory(slug="acme")
    _write(redis_prefix(acme), "test-1", [_user("a")])
    _write(redis_prefix(acme), "test*x", [_user("b")])
    _write(redis_prefix(acme), "prod-1", [_user("c")])

    by_prefix = RedisStore().list(Filters(prefix="test-", tenants=[acme]))
    by_star = RedisStore().list(Filters(prefix="test*", tenants=[acme]))

    assert [i.session_id for i in by_prefix] == ["test-1"]
    assert [i.session_id for i in by_star] == ["test*x"]


@pytest.mark.django_db
def test_store_list_older_than_uses_the_sessions_last_write(console_redis):
    acme = TenantFactory(slug="acme")
    _write(redis_prefix(acme), "old-1", [_user("a")])
    _write(redis_prefix(acme), "new-1", [_user("b")])
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        ten_days_ago = str(int(time.time()) - 10 * 86400)
        client.hset(f"{redis_prefix(acme)}:old-1", "updated_at", ten_days_ago)
    finally:
        client.close()
    cutoff = timezone.now() - timedelta(days=7)

    infos = RedisStore().list(Filters(older_than=cutoff, tenants=[acme]))

    assert [i.session_id for i in infos] == ["old-1"]


@pytest.mark.django_db
def test_store_items_and_clear(console_redis):
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    _write(redis_prefix(acme), "support-1", [_user("a"), _user("b")])
    _write(redis_prefix(acme), "support-2", [_user("kept")])

    assert _texts(RedisStore().items(acme, "support-1")) == ["a", "b"]
    with pytest.raises(SessionMissing):
        RedisStore().items(globex, "support-1")
    with pytest.raises(SessionMissing):
        RedisStore().clear(globex, "support-1")

    assert RedisStore().clear(acme, "support-1") == 2

    assert [i.session_id for i in RedisStore().list(Filters(tenants=[acme]))] == ["support-2"]
    with pytest.raises(SessionMissing):
        RedisStore().items(acme, "support-1")
    assert asyncio.run(_read(redis_prefix(acme), "support-1")) == []
    assert _texts(asyncio.run(_read(redis_prefix(acme), "support-2"))) == ["kept"]


@pytest.mark.django_db
def test_unreachable_redis_is_store_unavailable_not_an_empty_list(settings, console_redis):
    acme = TenantFactory(slug="acme")
    _write(redis_prefix(acme), "support-1", [_user("a")])
    settings.REDIS_URL = UNREACHABLE_URL

    with pytest.raises(StoreUnavailable, match=r"^Redis at redis://127\.0\.0\.1:1: "):
        RedisStore().list(Filters(tenants=[acme]))
    with pytest.raises(StoreUnavailable):
        RedisStore().items(acme, "support-1")
    with pytest.raises(StoreUnavailable):
        RedisStore().clear(acme, "support-1")

    listing = list_sessions(Filters(tenants=[acme]), [RedisStore()])
    assert listing.sessions == []
    assert list(listing.errors) == ["redis"]
    assert "Connect call failed" in listing.errors["redis"]
    # Nothing was cleared while Redis was away.
    settings.REDIS_URL = REDIS_TEST_URL
    assert _texts(RedisStore().items(acme, "support-1")) == ["a"]


@pytest.mark.django_db
def test_unreachable_redis_reason_never_shows_the_password(settings, console_redis):
    acme = TenantFactory(slug="acme")
    settings.REDIS_URL = "redis://user:hunter2-secret@127.0.0.1:1/0"

    listing = list_sessions(Filters(tenants=[acme]), [RedisStore()])

    assert listing.errors["redis"].startswith("Redis at redis://127.0.0.1:1: ")
    assert "hunter2" not in listing.errors["redis"]
