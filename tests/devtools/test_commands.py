"""devtools' management commands: seed_demo in-process, webhook_receiver as a process."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

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
from devtools.processes import free_port
from notifications import signing
from sessions_admin.models import StoredSession
from tests.support import TenantFactory, member

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
    from devtools.management.commands import seed_demo
    from devtools.management.commands.seed_demo import _seed_webhook
    from notifications.models import WebhookEndpoint

    monkeypatch.setattr(seed_demo, "DEMO_WEBHOOK_URL", "http://127.0.0.1:8025/")
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
    secret = "whsec_devtools-test"
    process = manage_process("webhook_receiver", "--port", str(port), "--secret", secret)
    _wait_listening(port, process)
    body = json.dumps({"id": 1, "event": "ticket.created"}).encode()

    signed = _post(port, body, signing.headers(secret, body))
    forged = _post(port, body, signing.headers("whsec_someone-else", body))
    process.terminate()
    out, _ = process.communicate(timeout=30)

    assert (signed, forged) == (204, 401)
    lines = [line for line in out.splitlines() if line.startswith("[webhook ")]
    assert len(lines) == 2
    assert "verified ?" in lines[0]
    assert "REFUSED /: signature does not match" in lines[1]
