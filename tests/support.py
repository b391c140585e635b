"""The one support module of the tests: factories, builders and waits they share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import factory
from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.test import Client

from approvals.execution import registry
from approvals.models import Membership, Role, Run, Tenant, Ticket
from approvals.runs.pause import pause_run
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


def socket(*headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    """A websocket to the console's live channel, through the whole ASGI application."""
    return WebsocketCommunicator(application, SOCKET_PATH, headers=list(headers))


# --- settings read in a child process -----------------------------------------------------------

# Variables the settings read; a test that starts a process with its own values leaves the
# parent's out, so nothing leaks into the child.
SETTINGS_VARIABLES = (
    "APPROVALS_ENV",
    "DATABASE_URL",
    "DJANGO_SECRET_KEY",
    "APPROVALS_ENCRYPTION_KEYS",
    "APPROVALS_AUDIT_KEYS",
    "APPROVALS_AUDIT_SIGNING_KEY",
    "DJANGO_ALLOWED_HOSTS",
    "DJANGO_DEBUG",
    "NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS",
    "REDIS_URL",
)
