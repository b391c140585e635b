"""The lease's heartbeat while the agent runs: renewed before it lapses, on a thread of its own
(never queued behind the agent's thread-sensitive work), and a lease another worker took is
noticed and said once."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from asgiref.sync import sync_to_async
from django.db import connection
from django.utils import timezone

from approvals.models import Run
from approvals.runs import lease
from tests.approvals.runs.test_outcomes import held_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # The only tests that see the heartbeat: under the mutation run they go first for it.
    pytest.mark.guards("approvals.runs.lease.run_agent"),
]

# A lease of 3 s is renewed every second: a renewal has 2 s to spare before the lease lapses.
LEASE_SECONDS = 3
# How long a tool watches the run's row at the most: far beyond what the code needs (a renewal
# or a lost lease shows within a second).
WATCH_SECONDS = 8


@pytest.fixture(autouse=True)
def _short_lease(settings):
    settings.APPROVALS_LEASE_SECONDS = LEASE_SECONDS


def _watching_agent(watch) -> Agent:
    @function_tool
    async def watch_the_lease() -> str:
        """Watch the run's lease while the agent works."""
        # Thread-sensitive, as Django's own sync work from async code is: it holds that thread.
        return await sync_to_async(watch, thread_sensitive=True)()

    return Agent(
        name="release",
        model=ScriptedModel(
            [
                [function_call("watch_the_lease", {}, call_id="call_watch")],
                [assistant_message("ok")],
            ]
        ),
        tools=[watch_the_lease],
    )


def _run_agent(run: Run, watch) -> None:
    lease.run_async(lease.run_agent(run, _watching_agent(watch), "watch the lease"))


def test_the_heartbeat_renews_the_lease_before_it_lapses_while_the_agent_works():
    run = held_run()
    first = timezone.now() + timedelta(seconds=LEASE_SECONDS)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=first)
    run.refresh_from_db()
    seen: dict[str, object] = {"renewals": 0, "lapsed": False}

    def watch() -> str:
        try:
            expiry, deadline = first, time.monotonic() + WATCH_SECONDS
            while seen["renewals"] < 2 and time.monotonic() < deadline:
                current = Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk)
                if current != expiry:
                    seen["renewals"], expiry = seen["renewals"] + 1, current
                elif timezone.now() > expiry:
                    seen["lapsed"] = True
                    break
                time.sleep(0.05)
            return "watched"
        finally:
            connection.close()

    _run_agent(run, watch)

    assert seen == {"renewals": 2, "lapsed": False}
    assert Run.objects.get(pk=run.pk).lease_expires_at > first


def test_a_lease_another_worker_took_is_noticed_and_said_and_never_renewed(caplog):
    caplog.set_level(logging.WARNING, logger=lease.logger.name)
    run = held_run()
    Run.objects.filter(pk=run.pk).update(
        lease_expires_at=timezone.now() + timedelta(seconds=LEASE_SECONDS)
    )
    run.refresh_from_db()
    taken_until = timezone.now() + timedelta(minutes=5)
    said = f"run {run.pk}: lease lost while the agent ran"

    def watch() -> str:
        try:
            # Another worker claims the run (its lapse, as the reaper would see it, aside).
            Run.objects.filter(pk=run.pk).update(
                lease_owner="w2", attempts=2, lease_expires_at=taken_until
            )
            deadline = time.monotonic() + WATCH_SECONDS
            while time.monotonic() < deadline and not any(
                r.getMessage() == said for r in caplog.records
            ):
                time.sleep(0.05)
            return "watched"
        finally:
            connection.close()

    _run_agent(run, watch)

    warnings = [r for r in caplog.records if r.name == lease.logger.name]
    assert [(r.levelno, r.getMessage()) for r in warnings] == [(logging.WARNING, said)]
    assert Run.objects.filter(pk=run.pk).values_list("lease_owner", "lease_expires_at").get() == (
        "w2",
        taken_until,
    )
