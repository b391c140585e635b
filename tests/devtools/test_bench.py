"""The bench's API phase at tiny sizes, against a live server in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.db import transaction

from approvals.audit import chain as audit
from approvals.models import Role, Run, RunExecutor, RunStatus
from devtools.bench import api_submit, cpu, report, stats
from devtools.management.commands.bench import _events_behind
from tests.notifications.conftest import caught_up
from tests.support import TenantFactory, member


@pytest.fixture
def bench_world(transactional_db, settings):
    settings.APPROVALS_API_RATE_PER_MINUTE = 1000
    tenant = TenantFactory(slug="bench")
    return tenant, member(tenant, Role.VIEWER, username="bench-dev")


def test_bench_api_phase_submits_distinct_states_and_reports_them(bench_world, live_server):
    tenant, requester = bench_world
    releases = [f"2026.04.04-api{n:05d}" for n in range(7)]
    results = api_submit.paused_results(releases)
    bodies = [api_submit.submit_body(r) for r in results[:5]]
    secret = api_submit.bench_token(tenant, requester)

    one, statuses = api_submit.submit_one_at_a_time([live_server.url], secret, bodies[:2])
    many = api_submit.submit_concurrently([live_server.url], secret, bodies[2:], clients=2)
    paused = api_submit.pause_run_seconds(tenant, requester, results[5:])

    assert (len(one), dict(statuses)) == (2, {201: 2})
    assert (many["requests"], many["statuses"], many["clients"]) == (3, {"201": 3}, 2)
    assert len(paused) == 2
    callers = Run.objects.filter(tenant=tenant, executor=RunExecutor.CALLER)
    assert sorted(callers.values_list("status", flat=True)) == [RunStatus.PAUSED] * 5
    # Each request handed over its own state: five runs, five releases.
    released = {json.loads(r.tickets.get().arguments_json)["release"] for r in callers}
    assert released == set(releases[:5])
    figures = {
        "api_submit_ms": stats.summary_ms(one),
        "api_pause_run_ms": stats.summary_ms(paused),
        "api_submit_per_s": many["per_s"],
        "api_submit_vs_pause_run_ratio": 1.0,
        "api_submit_detail": {"concurrent": many},
    }
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in report.table(figures).splitlines()
    ]
    assert [row[0] for row in rows] == [
        "measure",
        rows[1][0],
        "API: POST /runs/paused, one at a time (ms)",
        "pause_run in-process, same states (ms)",
        "API submit / pause_run (p50)",
        "API submits/s, 2 clients, 1 web",
    ]
    assert rows[5][1] == str(many["per_s"])


@pytest.mark.django_db
def test_the_backlog_part_counts_the_events_not_yet_fanned_out_over_every_tenant():
    def escalations(tenant, count):
        for _ in range(count):
            with transaction.atomic():
                audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")

    seen, unseen = TenantFactory(slug="seen"), TenantFactory(slug="unseen")
    escalations(seen, 2)
    caught_up(seen)
    escalations(seen, 3)
    # A tenant the fan-out has never looked at is behind by its whole chain.
    escalations(unseen, 4)

    assert _events_behind() == 3 + 4


@pytest.mark.skipif(not cpu.available(), reason="reads /proc (Linux)")
def test_the_cpu_split_counts_a_busy_process_as_a_worker():
    # A child that spins for 0.4 s of its own CPU when told, says how much CPU it has taken in
    # all, and stays until told to go (so that the split's second look finds it).
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time, sys\n"
            "sys.stdin.readline()\n"
            "t = time.process_time()\n"
            "while time.process_time() - t < 0.4: pass\n"
            "print(time.process_time(), flush=True)\n"
            "sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        cpu.wait_idle([child.pid], timeout=10)
        before = cpu.process_seconds(child.pid)

        def work() -> int:
            child.stdin.write("go\n")
            child.stdin.flush()
            work.took = float(child.stdout.readline())
            return 4

        result = cpu.split(work, [child.pid])
    finally:
        child.communicate("bye\n", timeout=30)

    assert result["resumes"] == 4 and result["cores"] >= 1
    # Its CPU in the window, shared among 4 resumes, is in the workers' column, none elsewhere.
    spun_ms = (work.took - before) * 1000 / 4
    assert 0.4 * 1000 / 4 * 0.9 <= result["workers_ms"] <= spun_ms + 25
    # The host's busy time (per core) and a process's CPU are each counted in clock ticks, read
    # a moment apart: the process's may be up to a tick a core ahead (seen: 100.0 against 102.5
    # ms a resume), and the rest is then 0, never less.
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK") * result["cores"] / result["resumes"]
    assert result["host_busy_ms"] >= result["workers_ms"] - tick_ms
    assert result["other_ms"] == pytest.approx(
        max(result["host_busy_ms"] - result["workers_ms"] - result["postgres_ms"], 0.0), abs=0.02
    )
    assert 0 < result["busy_share"] <= 1
    ceiling = result["cores"] * 1000 / result["host_busy_ms"]
    assert result["ceiling_per_s"] == pytest.approx(ceiling, abs=0.2)
    with pytest.raises(ValueError, match="no resume"):
        cpu.split(lambda: 0, [child.pid])
