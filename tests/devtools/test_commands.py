"""devtools' management commands: seed_demo in-process, webhook_receiver as a process."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import time
from io import StringIO
from pathlib import Path

import pytest
from agents.memory import SQLiteSession
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from approvals.decisions.decide import decide
from approvals.models import (
    ApproverGroup,
    AuditEvent,
    Membership,
    Run,
    RunStatus,
    Tenant,
    Ticket,
    TicketStatus,
)
from approvals.runs.resume import resume
from devtools.processes import free_port
from notifications import signing
from sessions_admin.models import StoredSession
from tests.support import TenantFactory, audit_guard_lifted, member

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    # seed_demo makes fifteen users: the default hasher would dominate the test's time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def session_dir(tmp_path, settings):
    """seed_demo writes SQLite sessions; keep them out of the shared var/ directory."""
    settings.APPROVALS_SQLITE_SESSION_DIR = tmp_path / "sessions"
    # Redis sessions are seeded only with REDIS_URL; these counts are for the other stores.
    settings.REDIS_URL = ""
    return settings.APPROVALS_SQLITE_SESSION_DIR


def _counts() -> dict[str, int]:
    return {
        "tenants": Tenant.objects.count(),
        "users": get_user_model().objects.count(),
        "memberships": Membership.objects.count(),
        "paused runs": Run.objects.filter(status=RunStatus.PAUSED).count(),
        "pending tickets": Ticket.objects.filter(status=TicketStatus.PENDING).count(),
        "audit events": AuditEvent.objects.count(),
    }


# --- seed_demo ------------------------------------------------------------------------------


def test_seed_demo_webhook_is_left_out_where_private_targets_are_refused(settings, monkeypatch):
    from devtools.management.commands.seed_demo import _seed_webhook
    from notifications.models import WebhookEndpoint

    monkeypatch.delenv("WEBHOOK_PORT", raising=False)
    settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS = False
    tenant = TenantFactory(slug="acme")

    outcome = _seed_webhook(tenant, member(tenant, "admin", username="acme-admin"))

    assert outcome == ("127.0.0.1 is a loopback address; webhooks may only go to public addresses.")
    assert WebhookEndpoint.objects.count() == 0


# The ORM sessions it seeds are written from a worker thread, so the data must be committed.
@pytest.mark.django_db(transaction=True)
def test_seed_demo_creates_tenants_users_and_paused_runs(session_dir):
    out = StringIO()

    call_command("seed_demo", stdout=out)

    counts = _counts()
    # 7 users per tenant plus the superuser; each run: run.paused + ticket.created; per
    # tenant two group.changed and one policy.changed; webhook.created for acme's demo webhook.
    assert counts == {
        "tenants": 2,
        "users": 15,
        "memberships": 14,
        "paused runs": 4,
        "pending tickets": 4,
        "audit events": 15,
    }
    assert sorted(
        ApproverGroup.objects.filter(tenant__slug="acme").values_list("name", flat=True)
    ) == ["release managers", "security reviewers"]
    assert set(Ticket.objects.values_list("policy__version", flat=True)) == {1}
    assert out.getvalue().splitlines()[0] == "demo data ready (4 new paused runs, 16 new sessions)"
    # Four ORM sessions and four SQLite sessions per tenant, no Redis without REDIS_URL.
    assert StoredSession.objects.count() == 8
    assert sorted(Tenant.objects.values_list("slug", flat=True)) == ["acme", "globex"]


# The ORM sessions it seeds are written from a worker thread, so the data must be committed.
@pytest.mark.django_db(transaction=True)
def test_seed_demo_twice_changes_nothing_the_second_time(session_dir):
    call_command("seed_demo", stdout=StringIO())
    first = _counts()
    out = StringIO()

    call_command("seed_demo", stdout=out)

    assert _counts() == first
    assert out.getvalue().splitlines()[0] == "demo data ready (0 new paused runs, 0 new sessions)"


# The ORM sessions it seeds are written from a worker thread, so the data must be committed.
@pytest.mark.django_db(transaction=True)
def test_seed_demo_requester_is_the_run_requester(session_dir):
    call_command("seed_demo", stdout=StringIO())

    requesters = set(Run.objects.values_list("tenant__slug", "requested_by__username"))
    assert requesters == {("acme", "acme-requester"), ("globex", "globex-requester")}


# A resume and the ORM sessions run in other threads, so the data must be committed.
@pytest.mark.django_db(transaction=True)
def test_seed_demo_on_a_fresh_database_after_a_demo_run_finished_in_another(session_dir):
    """var/sessions outlives the database (rm db.sqlite3, another DATABASE_URL): the finished
    conversation of an approved demo run must not be resumed by the next database's seed."""
    call_command("seed_demo", stdout=StringIO())
    run = Run.objects.get(title="Deploy release 2026.07.24 to production")
    decide(
        Ticket.objects.get(run=run), user=User.objects.get(username="acme-approver"), approve=True
    )
    assert resume(run_id=run.pk, worker_id="test").status == RunStatus.COMPLETED
    finished = SQLiteSession(run.session_id, Path(run.session_location))
    before = asyncio.run(finished.get_items())
    with audit_guard_lifted():
        call_command("flush", interactive=False)  # a fresh database; var/ as it was
    assert not Run.objects.exists()
    out = StringIO()

    call_command("seed_demo", stdout=out)

    # The ORM sessions are new; the SQLite ones are still in var/.
    assert out.getvalue().splitlines()[0] == "demo data ready (4 new paused runs, 8 new sessions)"
    again = Run.objects.get(title="Deploy release 2026.07.24 to production")
    assert (again.status, again.tickets.get().status) == (RunStatus.PAUSED, TicketStatus.PENDING)
    assert again.session_id != run.session_id
    # The other database's session is left exactly as it was.
    assert asyncio.run(finished.get_items()) == before
    finished.close()


def test_seed_demo_webhook_follows_webhook_port(session_dir, monkeypatch):
    from devtools.management.commands.seed_demo import _seed_webhook
    from notifications.models import WebhookEndpoint

    tenant = TenantFactory(slug="acme")
    admin = member(tenant, "admin", username="acme-admin")
    monkeypatch.setenv("WEBHOOK_PORT", "8175")
    first = _seed_webhook(tenant, admin)
    monkeypatch.setenv("WEBHOOK_PORT", "8176")

    moved = _seed_webhook(tenant, admin)

    assert first.url == "http://127.0.0.1:8175/"
    assert (moved.pk, moved.url) == (first.pk, "http://127.0.0.1:8176/")
    assert list(WebhookEndpoint.objects.values_list("url", flat=True)) == [moved.url]
    assert AuditEvent.objects.filter(action="webhook.changed").count() == 1
    assert _seed_webhook(tenant, admin).pk == first.pk


# --- webhook_receiver -------------------------------------------------------------------------


def _post(port: int, body: bytes, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", "/", body=body, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def _wait_listening(port: int, process, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.1)
    raise AssertionError(f"webhook_receiver did not listen on 127.0.0.1:{port}")


def test_webhook_receiver_command_answers_204_to_a_signed_delivery_and_401_otherwise(
    manage_process,
):
    """What bin/run-dev starts: the command exists and checks signatures with --secret."""
    port = free_port()
    secret = signing.new_secret()
    process = manage_process("webhook_receiver", "--port", str(port), "--secret", secret)
    _wait_listening(port, process)
    body = json.dumps({"id": "acme:1", "event": "ticket.created"}).encode()

    signed = _post(port, body, signing.headers(secret, body, message_id="acme:1"))
    tampered = _post(
        port, body.replace(b"created", b"decided"), signing.headers(secret, body, message_id="a:1")
    )
    forged = _post(port, body, signing.headers(signing.new_secret(), body, message_id="acme:1"))
    process.terminate()
    out, _ = process.communicate(timeout=30)

    assert (signed, tampered, forged) == (204, 401, 401)
    lines = [line for line in out.splitlines() if line.startswith("[webhook ")]
    assert len(lines) == 3
    assert "verified ticket.created" in lines[0]
    assert "REFUSED /: No matching signature found" in lines[1]
    assert "REFUSED /: No matching signature found" in lines[2]


def test_webhook_receiver_command_refuses_a_secret_that_is_not_base64_with_one_line():
    out, err = StringIO(), StringIO()

    with pytest.raises(CommandError, match=r"^--secret: the webhook secret is not base64"):
        call_command(
            "webhook_receiver", "--port", "9", "--secret", "whsec_x", stdout=out, stderr=err
        )
