"""The one support module of the tests: factories, builders and waits they share."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import factory
from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from allauth.mfa.recovery_codes.internal.auth import RecoveryCodes
from allauth.mfa.totp.internal.auth import (
    TOTP,
    format_hotp_value,
    generate_totp_secret,
    hotp_value,
)
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api import tokens
from approvals.audit import chain, guard
from approvals.execution import registry
from approvals.live import hints
from approvals.models import AuditEvent, Membership, Role, Run, Tenant, Ticket
from approvals.runs.pause import pause_run
from approvals.runs.remote import submit_paused
from config.asgi import application
from devtools import demo

PASSWORD = "test-pass-123"


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"tenant{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password(PASSWORD)


def member(tenant: Tenant, role: str = Role.APPROVER, username: str | None = None):
    user = UserFactory(**({"username": username} if username else {}))
    Membership.objects.update_or_create(user=user, tenant=tenant, defaults={"role": role})
    return user


def run_agent(agent_key: str, prompt: str, *, context=None, session=None, agent=None):
    """Run a registered agent in-process until it finishes or pauses."""
    agent = agent or registry.get_spec(agent_key, "1").build()
    return asyncio.run(
        Runner.run(agent, prompt, context=context if context is not None else {}, session=session)
    )


def paused_run(
    tenant: Tenant,
    *,
    agent_key: str = "release",
    prompt: str = "Deploy release 2026.07.24 to production",
    requested_by=None,
    context=None,
    session=None,
) -> Run:
    result = run_agent(agent_key, prompt, context=context, session=session)
    return pause_run(
        result,
        tenant=tenant,
        agent_key=agent_key,
        agent_version="1",
        requested_by=requested_by,
        session=session,
    )


def calling_agent(arguments: str | dict, *, tool: str = "deploy_release") -> Agent:
    """The release agent's tools, with a model that makes one call with exactly these arguments
    (a string is sent as the model wrote it) and then says it is done."""
    return Agent(
        name="release",
        model=ScriptedModel(
            [[function_call(tool, arguments, call_id="call_1")], [assistant_message("done")]]
        ),
        tools=[demo.deploy_release, demo.publish_invoice],
    )


def paused_call(tenant: Tenant, arguments: str | dict, *, requested_by=None) -> Run:
    """A release run paused on one call with exactly these arguments."""
    result = run_agent("release", "Deploy", agent=calling_agent(arguments))
    return pause_run(
        result, tenant=tenant, agent_key="release", agent_version="1", requested_by=requested_by
    )


def caller_run(tenant: Tenant, arguments: str | dict | None = None, *, requested_by=None) -> Run:
    """A run its caller holds (executor caller): a release run paused on one call, its state
    handed over as a caller's process would."""
    arguments = arguments or {"release": "2026.07.24", "environment": "production"}
    result = run_agent("release", "Deploy", agent=calling_agent(arguments))
    return submit_paused(
        tenant=tenant,
        agent_key="release",
        agent_version="1",
        state_json=result.to_state().to_json(),
        requested_by=requested_by,
    ).run


def two_call_agent() -> Agent:
    """The release agent's tools, with a model that asks for both deployments in one turn."""
    calls = [
        function_call(
            "deploy_release",
            {"release": "2026.07.24", "environment": environment},
            call_id=f"call_deploy_2026.07.24_{environment}",
        )
        for environment in ("staging", "production")
    ]
    return Agent(
        name="release",
        model=ScriptedModel([calls, [assistant_message("done")]]),
        tools=[demo.deploy_release],
    )


def pending_ticket(tenant: Tenant, *, requested_by=None, prompt: str | None = None) -> Ticket:
    """The one pending ticket of a freshly paused release run of the tenant."""
    run = paused_run(tenant, requested_by=requested_by, **({"prompt": prompt} if prompt else {}))
    return Ticket.objects.get(run=run)


def stored_run(
    tenant: Tenant,
    *,
    title: str = "",
    agent_key: str = "release",
    status: str = "paused",
    requested_by=None,
    created_at=None,
    **fields,
) -> Run:
    """A run row without a real state, for pages that list runs and never open the blob."""
    return Run.objects.create(
        tenant=tenant,
        title=title,
        agent_key=agent_key,
        agent_version="1",
        schema_version="1.0",
        status=status,
        requested_by=requested_by,
        created_at=created_at or timezone.now(),
        state_key_id="",
        state_nonce=b"",
        state_ciphertext=b"",
        **fields,
    )


def stored_ticket(
    tenant: Tenant,
    *,
    run: Run | None = None,
    tool: str = "deploy_release",
    arguments: str = '{"environment":"production","release":"2026.07.24"}',
    status: str = "pending",
    created_at=None,
    **fields,
) -> Ticket:
    """A ticket row (of a stored_run unless given one) without a real state behind it."""
    run = run or stored_run(tenant, requested_by=fields.get("requested_by"))
    now = timezone.now()
    return Ticket.objects.create(
        run=run,
        tenant=tenant,
        generation=1,
        agent_name=run.agent_key,
        tool_name=tool,
        tool_call_id=f"call_{run.pk}_{Ticket.objects.filter(run=run).count()}",
        arguments_json=arguments,
        arguments_digest="0" * 64,
        created_at=created_at or now,
        expires_at=now + timedelta(days=1),
        status=status,
        **fields,
    )


def queries_for(client: Client, url: str) -> int:
    """How many queries one GET of the page takes (it must answer 200)."""
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def wait_until(predicate: Callable[[], object], *, timeout: float, what: str, every: float = 0.1):
    """Poll predicate (which reads observable state) until it is truthy and return its value,
    or fail at the deadline saying what was awaited. Never the assertion itself."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


# --- the live channel ---------------------------------------------------------------------------

SOCKET_PATH = "/ws/console/"
ORIGIN = (b"origin", b"http://testserver")


def session_cookie(user) -> tuple[bytes, bytes]:
    """The Cookie header of a signed-in session of the user, for a websocket."""
    client = Client()
    client.force_login(user)
    name = django_settings.SESSION_COOKIE_NAME
    return (b"cookie", f"{name}={client.cookies[name].value}".encode())


CHROME_ON_LINUX = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36"
)


# allauth limits sign-ins per address (APPROVALS_SIGN_IN_RATE, in the cache that outlives a
# test): each client signs in from an address of its own unless the test names one.
_client_addresses = itertools.count(1)


def signed_in(user, *, user_agent: str = CHROME_ON_LINUX, ip: str | None = None) -> Client:
    """A client signed in through the real sign-in form, so allauth records its UserSession."""
    if ip is None:
        n = next(_client_addresses)
        ip = f"10.{n // 62500 % 250}.{n // 250 % 250}.{n % 250 + 1}"
    client = Client(HTTP_USER_AGENT=user_agent, REMOTE_ADDR=ip)
    response = client.post("/login/", {"login": user.get_username(), "password": PASSWORD})
    assert response.status_code == 302, response.content.decode()[:500]
    return client


def cookie_of(client: Client) -> tuple[bytes, bytes]:
    """The Cookie header of the client's session, for a websocket."""
    name = django_settings.SESSION_COOKIE_NAME
    return (b"cookie", f"{name}={client.cookies[name].value}".encode())


def socket(*headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    """A websocket to the console's live channel, through the whole ASGI application."""
    return WebsocketCommunicator(application, SOCKET_PATH, headers=list(headers))


async def hints_settled() -> None:
    """Wait until the live hints handed to a loop so far were sent (or their failures logged): a
    view's hints go to the loop that lent it its thread, and a test's loop ends with the test."""
    assert await sync_to_async(hints._sender.wait_sent, thread_sensitive=False)()


async def decision_hints(communicator) -> dict[str, str]:
    """The two hints of one decision, by kind: the hints of one commit go out together and may
    arrive in either order (hints.batched)."""
    heard = [await communicator.receive_from(timeout=5) for _ in range(2)]
    by_kind = {re.search(r'data-kind="([^"]+)"', hint).group(1): hint for hint in heard}
    assert sorted(by_kind) == ["run.changed", "ticket.decided"], heard
    return by_kind


# --- settings read in a child process -----------------------------------------------------------

# Variables the settings read; a test that starts a process with its own values leaves the
# parent's out, so nothing leaks into the child.
SETTINGS_VARIABLES = (
    "APPROVALS_ENV",
    "DATABASE_URL",
    "DATABASE_PREPARED_STATEMENTS",
    "DJANGO_SECRET_KEY",
    "APPROVALS_ENCRYPTION_KEYS",
    "APPROVALS_AUDIT_KEYS",
    "APPROVALS_AUDIT_SIGNING_KEY",
    "APPROVALS_DECISION_SIGNING_KEYS",
    "DJANGO_ALLOWED_HOSTS",
    "DJANGO_DEBUG",
    "NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS",
    "REDIS_URL",
    # The links' address: set, or derived from where bin/run-dev serves.
    "APPROVALS_PUBLIC_URL",
    "HOST",
    "PORT",
)


# --- the audit chain as an attacker with write access to the database changes it ---------------


@contextmanager
def audit_guard_lifted():
    """The audit table's append-only triggers dropped for the block, as a database superuser
    could; put back after it."""
    guard.remove(connection)
    try:
        yield
    finally:
        guard.install(connection)


def relink_audit_tail(tenant: Tenant, seq: int, link) -> None:
    """Recompute the hash of every event from #seq on with link(prev_hash, payload), as an
    attacker with write access would, and move the tenant's head to the last one."""
    with audit_guard_lifted():
        previous = AuditEvent.objects.filter(tenant=tenant, seq=seq - 1).first()
        prev = previous.hash if previous else chain.GENESIS
        for event in AuditEvent.objects.filter(tenant=tenant, seq__gte=seq).order_by("seq"):
            event.prev_hash = prev
            event.hash = link(prev, chain._event_payload(event))
            AuditEvent.objects.filter(pk=event.pk).update(
                prev_hash=event.prev_hash, hash=event.hash
            )
            prev = event.hash
        Tenant.objects.filter(pk=tenant.pk).update(audit_head=prev)


def plain_sha256_link(prev: str, payload: str) -> str:
    return hashlib.sha256(f"{prev}\n{payload}".encode()).hexdigest()


def hmac_link(key: bytes):
    return lambda prev, payload: hmac.new(key, f"{prev}\n{payload}".encode(), "sha256").hexdigest()


def append_unkeyed(tenant: Tenant, outcome: str = "legacy") -> AuditEvent:
    """An event as append() wrote it before the chain had a key: no key id, plain SHA-256."""
    with transaction.atomic():
        row = Tenant.objects.select_for_update().get(pk=tenant.pk)
        event = AuditEvent(
            tenant=row,
            seq=row.audit_seq + 1,
            created_at=timezone.now(),
            actor_name="system",
            action="run.paused",
            outcome=outcome,
            detail={},
            prev_hash=row.audit_head or chain.GENESIS,
        )
        event.hash = plain_sha256_link(event.prev_hash, chain._event_payload(event))
        event.save(force_insert=True)
        Tenant.objects.filter(pk=row.pk).update(audit_seq=event.seq, audit_head=event.hash)
    return event


def audit_events(tenant: Tenant, length: int) -> list[AuditEvent]:
    """A chain of `length` events for the tenant, each appended in its own transaction."""
    events = []
    for n in range(length):
        with transaction.atomic():
            events.append(chain.append(tenant_id=tenant.pk, action="run.paused", outcome=f"{n}"))
    return events


# --- the HTTP API -------------------------------------------------------------------------------


def api_token(tenant: Tenant, *scopes: str, user=None, days: int = 90):
    """An API token of the tenant with these scopes (all when none are named): (row, token)."""
    issued = tokens.issue(
        tenant=tenant, name="test", scopes=list(scopes or tokens.SCOPES), user=user, days=days
    )
    return issued.token, issued.secret


def bearer(secret: str) -> dict[str, str]:
    """The headers of an API request with this token."""
    return {"Authorization": f"Bearer {secret}"}


# --- the README's code blocks, run as a reader runs them ---------------------------------------

README = Path(django_settings.BASE_DIR) / "README.md"
# A block the tests run is marked by an HTML comment on the line before its fence.
README_BLOCK = re.compile(r"<!-- readme-test: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.DOTALL)
# Run a script with Django made unimportable, so it proves it needs none: isolated mode (no
# PYTHON* variables, no user site, not the current folder on the path), and a finder that
# refuses any import of django.
WITHOUT_DJANGO = """
import runpy, sys

class NoDjango:
    def find_spec(self, name, path=None, target=None):
        if name == "django" or name.startswith("django."):
            raise ImportError(f"{name}: this script must not need Django")

sys.meta_path.insert(0, NoDjango())
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def readme_blocks() -> list[tuple[str, str, str]]:
    """The README's marked blocks, in order: (name, language, code)."""
    return README_BLOCK.findall(README.read_text(encoding="utf-8"))


def readme_block(name: str) -> str:
    [code] = [code for marked, _, code in readme_blocks() if marked == name]
    return code


def run_operator_block(env: dict[str, str]) -> list[str]:
    """The README's operator commands, typed into bash in the checkout (with this Python for
    .venv/bin/python) against the database env names; the lines they print, then the token
    they exported."""
    script = readme_block("operator").replace(".venv/bin/python", shlex.quote(sys.executable))
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script + '\nprintf "%s\\n" "$APPROVALS_TOKEN"\n'],
        cwd=django_settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def clean_env(home: Path, **variables: str) -> dict[str, str]:
    """A reader's shell: a PATH, a home, their variables; no Django settings, no database, no
    keys. Tracing stays off so nothing tries to reach the internet."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
        "PYTHONUNBUFFERED": "1",
        **variables,
    }


def start_script_without_django(script: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start a plain Python script in its own folder, in another process, where importing
    Django fails."""
    return subprocess.Popen(
        [sys.executable, "-I", "-c", WITHOUT_DJANGO, str(script)],
        cwd=script.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def pending_ticket_of(tenant_slug: str, process: subprocess.Popen, *, timeout: float = 60):
    """The first pending ticket of the tenant, once the script has submitted its pause; fails at
    once, with the script's output, when the script ended first."""

    def submitted():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the script ended with {process.returncode}:\n{out}\n{err}")
        return Ticket.objects.filter(tenant__slug=tenant_slug, status="pending").first()

    return wait_until(submitted, timeout=timeout, what=f"a pending ticket of {tenant_slug}")


# --- two-factor -----------------------------------------------------------------------------


def totp_code(secret: str, *, at: float | None = None) -> str:
    """The six digits an authenticator app shows for this base32 secret now (RFC 6238, 30 s
    steps), computed with allauth's own HOTP so the test agrees with the server."""
    return format_hotp_value(hotp_value(secret, int(time.time() if at is None else at) // 30))


def forget_used_totp_codes() -> None:
    """allauth refuses a TOTP code used once in its 30 s window (a marker in the cache): a test
    that signs in twice within one window forgets the markers between the two."""
    cache.clear()


def give_totp(user) -> tuple[str, list[str]]:
    """Turn on an authenticator app and recovery codes for the user, as enrolling through the
    pages would (without its audit events): (the TOTP secret, the recovery codes)."""
    secret = generate_totp_secret()
    TOTP.activate(user, secret)
    codes = RecoveryCodes.activate(user).generate_codes()
    return secret, codes
