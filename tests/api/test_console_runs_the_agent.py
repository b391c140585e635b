"""The console runs the agent, end to end across processes: a live console web process and a
worker, the installed example package's agent (entry point release-pkg) started over the API,
paused on its production deploy, approved over the API by someone who is not the requester, and
completed with its output and exactly one effect."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import httpx
import pytest

from approvals.models import IdempotencyRecord, LedgerStatus, Role, Run, RunStatus
from devtools.processes import Processes, start_web
from tests.conftest import subprocess_env
from tests.support import TenantFactory, api_token, bearer, member, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def console(request, tmp_path):
    """A web process and a worker against the test database; killed and reaped at the end."""
    deploys = tmp_path / "deploys.log"
    env = subprocess_env(RELEASE_AGENT_EFFECT_LOG=str(deploys), LOG_LEVEL="INFO")
    procs = Processes(ROOT / "test-artifacts" / "logs")
    name = request.node.name
    try:
        url, _ = start_web(procs, env, log=procs.log_dir / f"{name}-web.log")
        procs.start(
            "worker",
            "worker",
            "--interval",
            "0.2",
            env=env,
            log=procs.log_dir / f"{name}-worker.log",
        )
        yield url, deploys, procs
    finally:
        procs.stop_all(kill=True)


def test_a_run_started_over_the_api_pauses_is_approved_and_completes_once(console):
    url, deploys, procs = console
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, Role.VIEWER, username="rita")
    approver = member(tenant, Role.APPROVER, username="alice")
    _, starter = api_token(tenant, "runs:write", "runs:read", user=requester)
    _, decider = api_token(tenant, "tickets:read", "tickets:decide", "runs:read", user=approver)
    http = httpx.Client(base_url=url, timeout=60)

    def run_status(run_path: str, secret: str) -> dict:
        answer = http.get(run_path, params={"wait": 5}, headers=bearer(secret))
        assert answer.status_code == 200, answer.text
        return answer.json()

    try:
        started = http.post(
            "/api/v1/runs",
            json={
                "agent": "release-pkg",
                "version": "1",
                "input": "Deploy 2026.07.25 to production",
            },
            headers=bearer(starter),
        )
        assert started.status_code == 202, started.text
        run_path = urllib.parse.urlsplit(started.headers["Location"]).path
        assert run_path == f"/api/v1/runs/{started.json()['id']}"
        assert started.json()["status"] == "starting"

        paused = wait_until(
            lambda: (body := run_status(run_path, starter))["status"] == "paused" and body,
            timeout=60,
            what="the started run to pause",
        )
        [ticket] = paused["tickets"]
        assert (ticket["tool_name"], ticket["arguments"]) == (
            "deploy_release",
            {"release": "2026.07.25", "environment": "production"},
        )
        assert not deploys.exists()

        decided = http.post(
            f"/api/v1/tickets/{ticket['id']}/decision",
            json={"decision": "approve", "arguments_digest": ticket["arguments_digest"]},
            headers=bearer(decider),
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["decided_by"] == "alice"

        done = wait_until(
            lambda: (body := run_status(run_path, decider))["status"] == "completed" and body,
            timeout=60,
            what="the approved run to complete",
        )
    except BaseException:
        for proc in procs.started:
            print(proc.tail())
        raise
    finally:
        http.close()

    assert done["final_output"] == "Release 2026.07.25: Release 2026.07.25 is live on production."
    assert [json.loads(line)["environment"] for line in deploys.read_text().splitlines()] == [
        "production"
    ]
    run = Run.objects.get()
    assert (run.status, run.requested_by, run.state_generation) == (
        RunStatus.COMPLETED,
        requester,
        1,
    )
    assert IdempotencyRecord.objects.filter(run=run, status=LedgerStatus.DONE).count() == 1
