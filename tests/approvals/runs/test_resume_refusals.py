"""A resume refuses, word for word, what the stored state and the deployed code disagree on:
the refusal is what a person reads on the run's page, so its sentence is the contract."""

from __future__ import annotations

import pytest
from agents import Agent, tool_namespace
from agents.testing import ScriptedModel, function_call

from approvals.decisions.decide import decide
from approvals.models import Role, Run, RunStatus, Ticket
from approvals.runs.resume import resume
from devtools import demo
from tests.approvals.runs.test_resume import assert_refused, decided_run
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db(transaction=True)

HERE = "tests.approvals.runs.test_resume_refusals"


def build_release_agent_without_its_tool() -> Agent:
    """Version 1 of the release agent as a later deployment would wrongly rebuild it."""
    return Agent(name="release", model=demo.build_release_agent().model, tools=[])


def build_release_agent_in_a_namespace() -> Agent:
    """The release agent with its tool in the namespace "ops", called there by the model."""
    call = {"release": "2026.12.04", "environment": "production"}
    return Agent(
        name="release",
        model=ScriptedModel(
            [[function_call("deploy_release", call, call_id="c1", namespace="ops")]]
        ),
        tools=tool_namespace(name="ops", description="Operations", tools=[demo.deploy_release]),
    )


def build_agent_of_another_name() -> Agent:
    return Agent(name="invoice", model=demo.build_release_agent().model, tools=[])


def _deploy(settings, factory: str) -> None:
    """Version 1 of the release agent built by another factory, its context kept as it was."""
    release = {**settings.APPROVALS_AGENTS["release"]["1"], "factory": f"{HERE}.{factory}"}
    settings.APPROVALS_AGENTS = {**settings.APPROVALS_AGENTS, "release": {"1": release}}


def test_a_tool_the_deployed_agent_no_longer_has_is_refused_naming_the_tool_and_agent(settings):
    run, _, _ = decided_run()
    _deploy(settings, "build_release_agent_without_its_tool")

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason="Regenerate the approval: tool 'deploy_release' is not available to agent "
        "'release' in this version; nothing was run",
    )
    assert (
        run.status_reason
        == outcome.reason
        == (
            "Regenerate the approval: tool 'deploy_release' is not available to agent 'release' in "
            "this version; nothing was run"
        )
    )


def _assert_cannot_be_loaded(outcome, run: Run) -> None:
    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason="Regenerate the approval: the stored state cannot be loaded by this code (",
    )


def test_a_state_the_deployed_code_cannot_load_is_refused_with_the_sdks_reason(settings):
    run, _, _ = decided_run()
    _deploy(settings, "build_agent_of_another_name")

    outcome = resume(run_id=run.pk, worker_id="w1")

    _assert_cannot_be_loaded(outcome, run)
    assert run.status_reason.startswith(
        "Regenerate the approval: the stored state cannot be loaded by this code ("
    )
    assert run.status_reason.endswith(")")


def test_a_context_its_serializer_cut_is_refused_by_a_deployment_without_the_deserializer(settings):
    """The serializer left the deploy token out; only the deserializer puts it back. A version
    deployed without one must not run the deploy with what was left of the context."""
    tenant = TenantFactory()
    run = paused_run(
        tenant,
        context={"team": "ops", "deploy_token": "dt-3f9a"},
        requested_by=member(tenant, Role.VIEWER),
    )
    decide(Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER), approve=True)
    release = settings.APPROVALS_AGENTS["release"]["1"]
    settings.APPROVALS_AGENTS = {
        **settings.APPROVALS_AGENTS,
        "release": {"1": {k: v for k, v in release.items() if k != "context_deserializer"}},
    }

    outcome = resume(run_id=run.pk, worker_id="w1")

    _assert_cannot_be_loaded(outcome, run)
    assert "provide context_deserializer" in run.status_reason


def test_a_call_in_the_state_without_its_ticket_is_refused_naming_the_call():
    run, ticket, _ = decided_run()
    call_id = ticket.tool_call_id
    Ticket.objects.filter(pk=ticket.pk).update(tool_call_id="call_elsewhere")

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason=f"the state asks about call {call_id!r}, which has no ticket",
    )
    assert run.status_reason == f"the state asks about call {call_id!r}, which has no ticket"


def test_a_changed_tool_name_is_refused_naming_both_tools():
    run, ticket, _ = decided_run()
    Ticket.objects.filter(pk=ticket.pk).update(tool_name="publish_invoice")

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert outcome.reason == (
        f"ticket {ticket.pk} was shown as a call of publish_invoice, but the stored state calls "
        "deploy_release; nothing was run"
    )


def test_a_changed_tool_name_of_a_namespaced_call_names_the_call_with_its_namespace(settings):
    _deploy(settings, "build_release_agent_in_a_namespace")
    tenant = TenantFactory()
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))
    ticket = Ticket.objects.get(run=run)
    assert ticket.tool_name == "ops.deploy_release"
    decide(ticket, user=member(tenant, Role.APPROVER), approve=True)
    Ticket.objects.filter(pk=ticket.pk).update(tool_name="ops.publish_invoice")

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert outcome.reason == (
        f"ticket {ticket.pk} was shown as a call of ops.publish_invoice, but the stored state "
        "calls ops.deploy_release; nothing was run"
    )


def test_changed_arguments_are_refused_in_a_whole_sentence():
    run, ticket, _ = decided_run()
    Ticket.objects.filter(pk=ticket.pk).update(arguments_digest="0" * 64)

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert outcome.reason == (
        f"the arguments of ticket {ticket.pk} (deploy_release) differ from those that were shown "
        "and decided; nothing was run"
    )


def test_a_decided_ticket_whose_call_is_not_in_the_state_is_refused_naming_the_call():
    run, ticket, _ = decided_run()
    # A second decided ticket of the same pause, for a call the stored state never made.
    extra = Ticket.objects.get(pk=ticket.pk)
    extra.pk, extra.tool_call_id = None, "call_never_made"
    extra.save(force_insert=True)

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason="tickets for calls ['call_never_made'] are not in the stored state",
    )
    assert run.status_reason == "tickets for calls ['call_never_made'] are not in the stored state"


def test_a_run_record_naming_another_loadable_schema_than_its_state_is_refused():
    run, _, _ = decided_run()
    # A schema this SDK loads, but not the one the sealed state was written in.
    Run.objects.filter(pk=run.pk).update(schema_version="1.0")

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert_refused(
        outcome,
        run,
        status=RunStatus.NEEDS_ATTENTION,
        reason="the stored state does not match its run record; nothing was run",
    )
    assert run.status_reason == "the stored state does not match its run record; nothing was run"


def test_a_resume_says_which_decisions_it_ran_with():
    run, _, approver = decided_run()

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert outcome.status == RunStatus.COMPLETED
    assert outcome.decisions == [f"deploy_release approved by {approver.get_username()}"]
