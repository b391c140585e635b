"""The README's "Plug in your agent" runs as written, so it cannot rot.

Its marked blocks (`<!-- readme-test: NAME -->` before the fence) are run for real: the
operator's commands in bash against the test database, then each Python block as a plain script
in a temporary folder, in another process, with a clean environment and Django made
unimportable, against a live console (web server and worker) in other processes. A person's
approval is given over the API by a token bound to the approver, who is not the requester.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
from approvals_client import ApprovalsClient
from django.conf import settings

from approvals.models import (
    AuditEvent,
    IdempotencyRecord,
    Membership,
    Run,
    RunStatus,
    Tenant,
    Ticket,
    TicketStatus,
)
from devtools.processes import Processes, start_web
from tests.conftest import subprocess_env
from tests.support import (
    TenantFactory,
    UserFactory,
    api_token,
    clean_env,
    pending_ticket_of,
    readme_block,
    readme_blocks,
    run_operator_block,
    start_script_without_django,
)

OPERATOR_SAYS = [
    "tenant shipping (Shipping) created",
    "rita created and added to shipping as approver",
    "release-pipeline created and added to shipping as viewer",
]
TOKEN = re.compile(r"apc_[a-z0-9]{8}_[A-Za-z0-9_-]{43}")
RELEASE_AGENT_MISSING = (
    "the console runs the agent only with the start of runs (approvals.runs.start) and the "
    "example agent package installed: pip install -e ./examples/release-agent"
)


@pytest.fixture
def console(tmp_path):
    """The console's web server and worker against the test database: its URL. The example
    agent's worker records each real deployment in tmp_path/release-effects.log."""
    logs = tmp_path / "logs"
    env = subprocess_env(RELEASE_AGENT_EFFECT_LOG=str(tmp_path / "release-effects.log"))
    procs = Processes(logs)
    try:
        url, _ = start_web(procs, env, log=logs / "server.log")
        procs.start("worker", "worker", "--interval", "0.2", env=env, log=logs / "worker.log")
        yield url
    finally:
        # Killed and reaped before the test database is flushed.
        procs.stop_all(kill=True)


def operator_sets_up_the_team() -> str:
    """The operator's block, run as written: the team's rows, and the token it printed."""
    lines = run_operator_block(subprocess_env())
    assert lines[:-1] == OPERATOR_SAYS
    assert TOKEN.fullmatch(lines[-1])
    shipping = Tenant.objects.get(slug="shipping")
    assert dict(
        Membership.objects.filter(tenant=shipping).values_list("user__username", "role")
    ) == {
        "rita": "approver",
        "release-pipeline": "viewer",
    }
    return lines[-1]


def rita_approves(url: str, ticket: Ticket) -> None:
    """Rita decides over the API, as she would in the browser: a token that acts as her."""
    rita = Membership.objects.get(tenant__slug="shipping", user__username="rita").user
    _, secret = api_token(ticket.tenant, "tickets:read", "tickets:decide", user=rita)
    with ApprovalsClient(url, secret) as client:
        decided = client.decide(ticket.pk, "approve", arguments_digest=ticket.arguments_digest)
    assert decided.status == "approved"


def run_url(run: Run) -> str:
    return f"{settings.APPROVALS_PUBLIC_URL.rstrip('/')}/runs/{run.pk}/"


def test_readme_marks_each_runnable_block_once():
    assert [(name, language) for name, language, _ in readme_blocks()] == [
        ("operator", "sh"),
        ("caller", "python"),
        ("console", "python"),
        ("in-process", "python"),
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_readme_caller_runs_the_agent(console, tmp_path):
    token = operator_sets_up_the_team()
    folder = tmp_path / "my-service"
    folder.mkdir()
    script = folder / "deploy.py"
    script.write_text(readme_block("caller") + "\n", encoding="utf-8")

    process = start_script_without_django(
        script, clean_env(folder, APPROVALS_URL=console, APPROVALS_TOKEN=token)
    )
    try:
        ticket = pending_ticket_of("shipping", process)
        assert (folder / "deployments.log").exists() is False
        rita_approves(console, ticket)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode == 0, err
    run = Run.objects.get(pk=ticket.run_id)
    assert out.splitlines() == [
        f"waiting for a decision on {run_url(run)}",
        "completed: Release 2026.07.25 is live on production.",
    ]
    assert (run.status, run.executor, run.agent_key, run.final_output) == (
        RunStatus.COMPLETED,
        "caller",
        "pipeline-release",
        "Release 2026.07.25 is live on production.",
    )
    assert run.requested_by.username == "release-pipeline"
    ticket.refresh_from_db()
    assert (ticket.status, ticket.decided_by.username, ticket.tool_name) == (
        TicketStatus.APPROVED,
        "rita",
        "deploy_release",
    )
    # Exactly one effect, in the caller's own folder; none in the console's ledger.
    assert (folder / "deployments.log").read_text() == "2026.07.25 production\n"
    assert IdempotencyRecord.objects.filter(run=run).count() == 0
    assert AuditEvent.objects.filter(run=run, action="run.completed").count() == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    importlib.util.find_spec("release_agent") is None
    or importlib.util.find_spec("approvals.runs.start") is None,
    reason=RELEASE_AGENT_MISSING,
)
def test_readme_console_runs_the_agent(console, tmp_path):
    token = operator_sets_up_the_team()
    folder = tmp_path / "pipeline"
    folder.mkdir()
    script = folder / "start.py"
    script.write_text(readme_block("console") + "\n", encoding="utf-8")

    process = start_script_without_django(
        script, clean_env(folder, APPROVALS_URL=console, APPROVALS_TOKEN=token)
    )
    try:
        ticket = pending_ticket_of("shipping", process)
        assert IdempotencyRecord.objects.filter(run_id=ticket.run_id).count() == 0
        rita_approves(console, ticket)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode == 0, err
    run = Run.objects.get(pk=ticket.run_id)
    assert (run.status, run.executor, run.agent_key, run.agent_version) == (
        RunStatus.COMPLETED,
        "console",
        "release-pkg",
        "1",
    )
    assert run.final_output
    assert out.splitlines() == [
        f"waiting for a decision on {run_url(run)}",
        f"completed: {run.final_output}",
    ]
    ticket.refresh_from_db()
    assert (ticket.status, ticket.tool_name, json.loads(ticket.arguments_json)["environment"]) == (
        TicketStatus.APPROVED,
        "deploy_release",
        "production",
    )
    # Exactly one effect, through the console's ledger.
    effects = (tmp_path / "release-effects.log").read_text().splitlines()
    assert [json.loads(line)["environment"] for line in effects] == ["production"]
    assert list(IdempotencyRecord.objects.filter(run=run).values_list("operation", "status")) == [
        ("deploy_release", "done")
    ]


@pytest.mark.django_db
def test_readme_in_process_pause_runs_in_the_consoles_process(capsys):
    acme = TenantFactory(slug="acme")
    requester = UserFactory(username="acme-requester")
    Membership.objects.create(tenant=acme, user=requester, role="viewer")

    exec(compile(readme_block("in-process"), "README.md", "exec"), {})

    run = Run.objects.get()
    assert (run.tenant, run.status, run.requested_by, run.agent_key) == (
        acme,
        RunStatus.PAUSED,
        requester,
        "release",
    )
    assert list(run.tickets.values_list("tool_name", "status")) == [("deploy_release", "pending")]
    assert capsys.readouterr().out == f"run {run.pk} waits for approval: 1 ticket(s)\n"
