"""manage.py start_run: the same start_run as the API; a run id and its page, or one line why not."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django_tasks_db.models import DBTaskResult

from approvals.models import AuditEvent, Role, Run, RunStatus
from tests.conftest import manage
from tests.support import TenantFactory, member


@pytest.fixture
def acme(db):
    tenant = TenantFactory(slug="acme")
    member(tenant, Role.VIEWER, username="vic")
    return tenant


def start_run(*args: str) -> str:
    out = StringIO()
    call_command("start_run", *args, stdout=out)
    return out.getvalue()


def test_start_run_prints_the_run_and_its_page(acme, settings):
    settings.APPROVALS_PUBLIC_URL = "https://console.example.com/approvals"

    out = start_run(
        "--tenant",
        "acme",
        "--agent",
        "release-pkg",
        "--version",
        "1",
        "--input",
        "Deploy 2026.07.25 to production",
        "--user",
        "vic",
        "--session",
        "pipeline-42",
        "--context",
        '{"change": "CHG-1"}',
        "--title",
        "Friday",
    )

    run = Run.objects.get()
    assert out == (f"run {run.pk} starting: https://console.example.com/approvals/runs/{run.pk}/\n")
    assert (run.status, run.requested_by.username, run.title) == (
        RunStatus.STARTING,
        "vic",
        "Friday",
    )
    assert (run.session_backend, run.session_id, run.session_location) == (
        "django",
        "pipeline-42",
        "acme",
    )
    assert AuditEvent.objects.get(run_id=run.pk).detail["via"] == "command"
    assert DBTaskResult.objects.get().task_path == "approvals.execution.queue.start_run_task"


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"--tenant": "nope"}, "no tenant 'nope'"),
        ({"--user": "nobody"}, "no user named 'nobody'"),
        (
            {"--agent": "payroll"},
            "Agent 'payroll' is not registered (neither in APPROVALS_AGENTS nor by an "
            "approvals.agents entry point).",
        ),
        (
            {"--version": "7"},
            "Agent 'release-pkg' version '7' is not deployed (deployed: 1).",
        ),
        (
            {"--context": "{nope"},
            "--context is not JSON: Expecting property name enclosed in "
            "double quotes: line 1 column 2 (char 1)",
        ),
        ({"--context": "[1]"}, "--context must be a JSON object"),
        ({"--input": "  "}, "The input is empty: send a prompt or a list of input items."),
    ],
)
def test_start_run_refuses_bad_input_in_one_line(acme, change, line):
    options = {
        "--tenant": "acme",
        "--agent": "release-pkg",
        "--version": "1",
        "--input": "Deploy 2026.07.25 to staging",
        "--user": "vic",
        **change,
    }

    with pytest.raises(CommandError) as refused:
        start_run(*[part for pair in options.items() for part in pair])

    assert str(refused.value) == line
    assert Run.objects.count() == 0
    assert DBTaskResult.objects.count() == 0


def test_start_run_refuses_a_context_with_a_secret_without_echoing_it(acme):
    with pytest.raises(CommandError) as refused:
        start_run(
            "--tenant",
            "acme",
            "--agent",
            "release-pkg",
            "--version",
            "1",
            "--input",
            "hi",
            "--context",
            '{"password": "hunter2-hunter2"}',
        )

    assert str(refused.value) == (
        "The run's context holds what looks like a secret, which must never be stored: "
        "context.password (key name). Leave it out with a context_serializer and re-inject it "
        "in the context_deserializer from the environment."
    )
    assert "hunter2" not in str(refused.value)


@pytest.mark.django_db(transaction=True)
def test_start_run_exits_non_zero_with_one_line_from_the_shell():
    TenantFactory(slug="acme")

    process = manage(
        "start_run", "--tenant", "acme", "--agent", "payroll", "--version", "1", "--input", "hi"
    )
    out, err = process.communicate(timeout=120)

    assert process.returncode == 1
    assert out == ""
    assert err.splitlines() == [
        "CommandError: Agent 'payroll' is not registered (neither in APPROVALS_AGENTS nor by an "
        "approvals.agents entry point)."
    ]
