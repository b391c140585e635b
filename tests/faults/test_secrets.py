"""Secrets planted in a run's context (guarantee 4), end to end through a real worker.

1. A secret by key name (api_key) or by value shape (an OpenAI-style key under an innocent
   name) is refused when the run pauses: SecretInContextError naming the path, never the value,
   and nothing written.
2. With a context_serializer that leaves them out, the run pauses, is approved, resumed by a
   `manage.py db_worker` process (whose deploy token comes from its environment, as the
   release agent's context_deserializer does it), pauses again for production, is approved and
   completes. None of the planted values, nor the worker's token, is then in: a dump of the
   whole test database (pg_dump on PostgreSQL, sqlite3 iterdump on SQLite), any decrypted
   state, the audit log, the worker's output (logging at DEBUG), or any page
   (ticket, run, audit history, CSV and JSON Lines export).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess

import pytest
from django.db import connection
from django.test import Client

from approvals.audit import chain as audit
from approvals.decisions.decide import decide
from approvals.execution.state import SecretInContextError, open_state
from approvals.models import AuditEvent, Run, RunStatus, Ticket, TicketStatus
from approvals.runs.pause import pause_run
from devtools import demo
from tests.conftest import database_url, subprocess_env
from tests.support import TenantFactory, member, run_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow]

RELEASE = "2026.07.24"
PROMPT = f"Deploy release {RELEASE} to staging and production"


def _planted() -> dict[str, str]:
    return {
        "by_name": f"planted-name-{secrets.token_hex(12)}",
        "by_shape": f"sk-proj-{secrets.token_hex(16)}",
        "deploy_token": f"planted-deploy-{secrets.token_hex(12)}",
        "worker_env": f"planted-env-{secrets.token_hex(12)}",
    }


def _drop_planted(context: dict) -> dict:
    return {k: v for k, v in context.items() if k not in {"api_key", "change_ref", "deploy_token"}}


def _database_dump() -> str:
    if connection.vendor == "postgresql":
        done = subprocess.run(
            ["pg_dump", "--no-owner", "--dbname", database_url()],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PGPASSWORD": connection.settings_dict["PASSWORD"] or "", "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout
    with sqlite3.connect(connection.settings_dict["NAME"]) as db:
        return "\n".join(db.iterdump())


def _leaks(text: str, planted: dict[str, str]) -> list[str]:
    """Which planted values appear in text, as they are or hex-encoded (bytea in a dump)."""
    found = []
    for label, value in planted.items():
        if value in text or value.encode().hex() in text:
            found.append(label)
    return found


def test_secret_in_context_is_refused_at_pause_by_key_name_and_by_value_shape():
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, "viewer", username="dev-rita")
    planted = _planted()
    cases = {
        "context.api_key (key name)": {"team": "payments", "api_key": planted["by_name"]},
        "context.change_ref (looks like a OpenAI-style key)": {
            "team": "payments",
            "change_ref": planted["by_shape"],
        },
    }
    for path, context in cases.items():
        result = run_agent("release", PROMPT, context=context)
        with pytest.raises(SecretInContextError) as refused:
            pause_run(
                result,
                tenant=tenant,
                agent_key="release",
                agent_version="1",
                requested_by=requester,
            )
        assert path in str(refused.value)
        assert _leaks(str(refused.value), planted) == []
    assert Run.objects.count() == 0
    assert Ticket.objects.count() == 0
    assert AuditEvent.objects.count() == 0
    assert demo.read_effects() == []


def test_secrets_left_out_by_the_serializer_reach_no_dump_state_audit_log_or_page(manage_process):
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, "viewer", username="dev-rita")
    approver = member(tenant, "approver", username="rm-alice")
    admin = member(tenant, "admin", username="ad-min")
    planted = _planted()
    context = {
        "team": "payments",
        "api_key": planted["by_name"],
        "change_ref": planted["by_shape"],
        "deploy_token": planted["deploy_token"],
    }
    run = pause_run(
        run_agent("release", PROMPT, context=context),
        tenant=tenant,
        agent_key="release",
        agent_version="1",
        requested_by=requester,
        context_serializer=_drop_planted,
    )
    worker_env = subprocess_env(RELEASE_DEPLOY_TOKEN=planted["worker_env"], LOG_LEVEL="DEBUG")
    logs = []
    for environment in ("staging", "production"):
        ticket = Ticket.objects.get(run=run, status=TicketStatus.PENDING)
        assert json.loads(ticket.arguments_json)["environment"] == environment
        decide(ticket, user=approver, approve=True)
        worker = manage_process("db_worker", "--batch", "--no-startup-delay", env=worker_env)
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        logs.append(out + err)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, (run.status, run.status_reason)
    effects = demo.read_effects("deploy_release")
    assert [(e["environment"], e["authenticated"]) for e in effects] == [
        ("staging", True),
        ("production", True),
    ], "the worker's token must reach the tool at resume (from its environment)"

    # The stored state, decrypted: the context kept what the serializer kept, nothing else.
    state = open_state(run)
    assert state["context"]["context"] == {"team": "payments"}
    assert _leaks(json.dumps(state), planted) == []
    dump = _database_dump()
    assert "approvals_auditevent" in dump
    assert _leaks(dump, planted) == []
    events = list(AuditEvent.objects.values())
    assert len(events) > 10
    assert _leaks(json.dumps(events, default=str), planted) == []
    assert audit.verify_chain(tenant).ok
    worker_output = "\n".join(logs)
    assert " DEBUG " in worker_output  # the workers really logged at DEBUG
    assert _leaks(worker_output, planted) == []

    browser = Client()
    browser.force_login(admin)
    pages = [f"/tickets/{t.pk}/" for t in Ticket.objects.filter(run=run)] + [
        f"/runs/{run.pk}/",
        "/audit/",
        "/audit/export.csv",
        "/audit/export.jsonl",
    ]
    for path in pages:
        response = browser.get(path)
        assert response.status_code == 200, path
        body = (
            b"".join(response.streaming_content) if response.streaming else response.content
        ).decode()
        assert _leaks(body, planted) == [], path
    print(
        f"\n[faults] secrets: 2 refusals at pause; after 2 resumes, 0 of {len(planted)} planted "
        f"values in a {len(dump) // 1024} KiB dump, {len(events)} audit events, "
        f"{len(worker_output) // 1024} KiB of worker output, {len(pages)} pages"
    )
