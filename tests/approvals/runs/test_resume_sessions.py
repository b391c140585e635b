"""A resumed run continues the conversation session it paused with (guarantee 9)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import pytest
from agents import Runner
from agents.extensions.memory import RedisSession
from agents.memory import SQLiteSession

from approvals.decisions.decide import decide
from approvals.execution import registry
from approvals.models import RunStatus, Ticket
from approvals.runs.pause import pause_run
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_TEST_URL = "redis://127.0.0.1:6379/15"


class CountingSQLiteSession(SQLiteSession):
    """Counts the SDK's writes, so a test can tell a resume from a fresh run."""

    writes = 0

    async def add_items(self, items):
        type(self).writes += 1
        await super().add_items(items)


def _items(session) -> list:
    return asyncio.run(session.get_items())


def _paused_run_in_redis(tenant, session_id: str, prefix: str):
    """Run the release agent on a RedisSession, closed in the loop that used it, then pause."""

    async def first_turn():
        session = RedisSession.from_url(session_id, url=REDIS_TEST_URL, key_prefix=prefix)
        try:
            agent = registry.get_spec("release", "1").build()
            return session, await Runner.run(
                agent, "Deploy release 2026.07.24 to production", context={}, session=session
            )
        finally:
            # from_url made the client, so the test owns it and closes it even if the run raised.
            await session.close()

    session, result = asyncio.run(first_turn())
    return pause_run(result, tenant=tenant, agent_key="release", agent_version="1", session=session)


def _approve_and_resume(run):
    tenant = run.tenant
    approver = member(tenant, "approver")
    decide(Ticket.objects.get(run=run), user=approver, approve=True)
    return resume(run_id=run.pk, worker_id="test-worker")


def test_resume_writes_to_the_session_it_paused_with(tmp_path):
    tenant = TenantFactory(slug="acme")
    path = tmp_path / "sessions.sqlite3"
    CountingSQLiteSession.writes = 0
    session = CountingSQLiteSession("conv-1", path)
    run = paused_run(tenant, session=session)
    writes_at_pause = CountingSQLiteSession.writes
    items_at_pause = len(_items(session))
    session.close()

    outcome = _approve_and_resume(run)

    assert outcome.status == RunStatus.COMPLETED
    assert (run.session_backend, run.session_id) == ("sqlite", "conv-1")
    reopened = SQLiteSession("conv-1", path)
    try:
        items = _items(reopened)
        assert len(items) > items_at_pause
        assert items[-1]["content"][0]["text"] == run.__class__.objects.get(pk=run.pk).final_output
        # Another session id is another history, not lost data.
        assert _items(SQLiteSession("conv-2", path)) == []
    finally:
        reopened.close()
    assert writes_at_pause >= 1
    assert len(demo.read_effects()) == 1


def test_resume_continues_a_redis_session_read_back_by_another_process(settings):
    settings.REDIS_URL = REDIS_TEST_URL
    prefix = f"test-approvals:{uuid.uuid4().hex}"
    tenant = TenantFactory(slug="acme")

    run = _paused_run_in_redis(tenant, "conv-r", prefix)
    assert (run.session_backend, run.session_location) == ("redis", prefix)

    outcome = _approve_and_resume(run)
    assert outcome.status == RunStatus.COMPLETED

    reader = subprocess.run(
        [
            sys.executable,
            "-c",
            "import asyncio,sys\n"
            "from agents.extensions.memory import RedisSession\n"
            "async def main():\n"
            f"    s = RedisSession.from_url('conv-r', url='{REDIS_TEST_URL}', key_prefix='{prefix}')\n"
            "    try:\n"
            "        items = await s.get_items()\n"
            "        print(len(items), items[-1]['content'][0]['text'])\n"
            "    finally:\n"
            "        await s.close()\n"
            "asyncio.run(main())\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reader.returncode == 0, reader.stderr
    count, text = reader.stdout.strip().split(" ", 1)
    assert int(count) >= 4
    assert text == "Release 2026.07.24: Release 2026.07.24 is live on production."
    assert len(demo.read_effects()) == 1

    async def cleanup():
        s = RedisSession.from_url("conv-r", url=REDIS_TEST_URL, key_prefix=prefix)
        try:
            await s.clear_session()
        finally:
            await s.close()

    asyncio.run(cleanup())


def test_resume_with_an_unreachable_session_waits_instead_of_starting_empty(settings):
    settings.REDIS_URL = REDIS_TEST_URL
    prefix = f"test-approvals:{uuid.uuid4().hex}"
    tenant = TenantFactory(slug="acme")
    run = _paused_run_in_redis(tenant, "conv-x", prefix)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    outcome = _approve_and_resume(run)

    run.refresh_from_db()
    assert outcome.status == RunStatus.QUEUED
    assert run.status == RunStatus.QUEUED
    assert "cannot be read" in run.status_reason
    assert "Connect call failed" in run.status_reason
    # The history could not be read, so nothing ran as if it were empty.
    assert demo.read_effects() == []

    settings.REDIS_URL = REDIS_TEST_URL
    retried = resume(run_id=run.pk, worker_id="test-worker")

    assert retried.status == RunStatus.COMPLETED
    assert len(demo.read_effects()) == 1
