"""Factories and small builders shared by the tests."""

from __future__ import annotations

import asyncio

import factory
from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from django.contrib.auth import get_user_model

from approvals.execution import registry
from approvals.models import Membership, Role, Run, Tenant
from approvals.runs.pause import pause_run
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
