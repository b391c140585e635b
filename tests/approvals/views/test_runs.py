"""The run page and its resolve form: the timeline, the outcome, and what a person settles."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django_tasks_db.models import DBTaskResult

from approvals.decisions.decide import decide
from approvals.execution.ledger import idempotency_key
from approvals.models import (
    AuditEvent,
    IdempotencyRecord,
    LedgerStatus,
    Role,
    Run,
    RunStatus,
    Ticket,
)
from approvals.runs.resume import resume
from approvals.runs.start import start_run
from tests.support import TenantFactory, caller_run, member, paused_run

pytestmark = pytest.mark.django_db

TASK_PATH = "approvals.execution.queue.resume_run_task"


def run_url(run: Run) -> str:
    return reverse("approvals:run", args=[run.pk])


def resolve_url(run: Run) -> str:
    return reverse("approvals:resolve", args=[run.pk])


def resume_tasks(run: Run) -> int:
    return sum(
        1
        for task in DBTaskResult.objects.filter(task_path=TASK_PATH)
        if task.args_kwargs["args"] == [run.pk]
    )


def attention_run(tenant) -> tuple[Run, IdempotencyRecord]:
    """A run whose approved effect was claimed by a worker that never confirmed it."""
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=member(tenant, Role.APPROVER), approve=True)
    record = IdempotencyRecord.objects.create(
        tenant=tenant,
        key=idempotency_key(
            tenant_id=tenant.pk,
            approval=f"ticket:{ticket.pk}",
            operation="deploy_release",
            resource="2026.07.24@production",
        ),
        run=run,
        ticket=ticket,
        operation="deploy_release",
        resource="2026.07.24@production",
        status=LedgerStatus.CLAIMED,
        claimed_by="dead-worker#1",
    )
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.NEEDS_ATTENTION, status_reason="deploy_release was never confirmed"
    )
    run.refresh_from_db()
    return run, record


def test_run_timeline_labels_each_step(client):
    tenant = TenantFactory()
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))
    decide(Ticket.objects.get(run=run), user=member(tenant), approve=True)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(run_url(run))

    assert response.status_code == 200
    assert [item["label"] for item in response.context["timeline"]] == [
        "Paused for approval",
        "Approval requested",
        "Approved",
        "Queued for the worker",
    ]
    body = response.content.decode()
    assert "<strong>Approval requested</strong>" in body
    assert 'data-status="queued"' in body


def test_run_paused_links_its_pending_ticket(client):
    tenant = TenantFactory()
    run = paused_run(tenant)
    ticket = Ticket.objects.get(run=run)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(run_url(run))

    assert f"Ticket #{ticket.pk}: deploy_release</a>" in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_run_shows_the_final_output_after_a_resume(client):
    tenant = TenantFactory()
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))
    decide(Ticket.objects.get(run=run), user=member(tenant), approve=True)
    resume(run_id=run.pk, worker_id="w1")
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(run_url(run))

    body = response.content.decode()
    assert (
        '<p class="final-output" id="final-output">'
        "Release 2026.07.24: Release 2026.07.24 is live on production.</p>"
    ) in body
    assert [item["label"] for item in response.context["timeline"]][-3:] == [
        "Worker resuming",
        "Effect done",
        "Completed",
    ]


def test_run_of_another_tenant_is_404(client):
    run = paused_run(TenantFactory())
    client.force_login(member(TenantFactory(), Role.ADMIN))

    response = client.get(run_url(run))

    assert response.status_code == 404


def test_run_post_is_refused(client):
    tenant = TenantFactory()
    run = paused_run(tenant)
    client.force_login(member(tenant, Role.ADMIN))

    response = client.post(run_url(run))

    assert response.status_code == 405


def test_run_needing_attention_shows_the_resolve_form_to_an_admin(client):
    tenant = TenantFactory()
    run, _ = attention_run(tenant)
    client.force_login(member(tenant, Role.ADMIN))

    response = client.get(run_url(run))

    body = response.content.decode()
    assert 'class="resolve-form"' in body
    assert 'value="happened"' in body
    assert 'value="retry"' in body
    assert "<code>2026.07.24@production</code>" in body


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER, Role.AUDITOR])
def test_run_needing_attention_hides_the_resolve_form_from_others(client, role):
    tenant = TenantFactory()
    run, _ = attention_run(tenant)
    client.force_login(member(tenant, role))

    response = client.get(run_url(run))

    body = response.content.decode()
    assert 'class="resolve-form"' not in body
    assert f"An admin of {tenant.name} can record what happened" in body


# --- a run its caller holds ------------------------------------------------------------------


def test_run_of_a_caller_waiting_for_a_decision_says_its_caller_resumes_it(client):
    tenant = TenantFactory()
    run = caller_run(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    body = client.get(run_url(run)).content.decode()

    assert '<span id="run-executor">resumed by its caller</span>' in body
    assert "the program that runs this agent resumes it in its own process" in body


def test_run_of_a_caller_decided_waits_for_the_caller_not_a_worker(client):
    tenant = TenantFactory()
    run = caller_run(tenant, requested_by=member(tenant, Role.VIEWER))
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=member(tenant, username="alice"), approve=True)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(run_url(run))

    body = response.content.decode()
    assert 'data-status="awaiting_caller"' in body
    assert "<h2>Waiting for the caller to resume</h2>" in body
    assert (
        f'<a href="/tickets/{ticket.pk}/">Ticket #{ticket.pk}: deploy_release</a> · '
        '<span class="badge status-approved">Approved</span> by alice'
    ) in body
    assert "worker" not in body.split('id="timeline"')[0].lower()
    assert [item["label"] for item in response.context["timeline"]][-1] == (
        "Decided: waiting for the caller"
    )
    assert resume_tasks(run) == 0


def test_run_of_a_caller_needing_attention_offers_no_resolution(client):
    tenant = TenantFactory()
    run = caller_run(tenant)
    # No move leads a caller's run here; a hand in the database could.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.NEEDS_ATTENTION, status_reason="?")
    client.force_login(member(tenant, Role.ADMIN))

    body = client.get(run_url(run)).content.decode()
    response = client.post(resolve_url(run), {"resolution": "abandon"}, follow=True)

    assert 'class="resolve-form"' not in body
    assert "Its caller runs this agent, so only its caller can settle it." in body
    assert "Its caller runs this agent, so only its caller can settle it." in (
        response.content.decode()
    )
    assert Run.objects.get(pk=run.pk).status == RunStatus.NEEDS_ATTENTION
    assert not AuditEvent.objects.filter(run_id=run.pk, action="run.resolved").exists()


# --- resolve ---------------------------------------------------------------------------------


def resolved_event(run: Run) -> AuditEvent:
    return AuditEvent.objects.get(run_id=run.pk, action="run.resolved")


def test_resolve_happened_records_the_effect_and_queues_the_run(client):
    tenant = TenantFactory()
    run, record = attention_run(tenant)
    admin = member(tenant, Role.ADMIN, username="boss")
    client.force_login(admin)
    tasks = resume_tasks(run)

    response = client.post(resolve_url(run), {"resolution": "happened", "note": "Saw it live."})

    assert response.status_code == 302
    assert response["Location"] == run_url(run)
    record.refresh_from_db()
    assert record.status == LedgerStatus.DONE
    assert record.result == "Confirmed as done by boss. Saw it live."
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert resume_tasks(run) == tasks + 1
    event = resolved_event(run)
    assert (event.actor_id, event.outcome) == (admin.pk, RunStatus.QUEUED)
    assert event.detail == {
        "resolution": "happened",
        "effects": ["deploy_release 2026.07.24@production"],
        "note": "Saw it live.",
    }


def test_resolve_retry_releases_the_claim_and_queues_the_run(client):
    tenant = TenantFactory()
    run, record = attention_run(tenant)
    client.force_login(member(tenant, Role.ADMIN))
    tasks = resume_tasks(run)

    client.post(resolve_url(run), {"resolution": "retry"})

    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert resume_tasks(run) == tasks + 1
    assert resolved_event(run).detail["resolution"] == "retry"


def test_resolve_abandon_fails_the_run(client):
    tenant = TenantFactory()
    run, record = attention_run(tenant)
    client.force_login(member(tenant, Role.ADMIN, username="boss"))
    tasks = resume_tasks(run)

    response = client.post(resolve_url(run), {"resolution": "abandon"}, follow=True)

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.status_reason == "Stopped by boss."
    assert IdempotencyRecord.objects.get(pk=record.pk).status == LedgerStatus.CLAIMED
    assert resume_tasks(run) == tasks
    assert resolved_event(run).outcome == RunStatus.FAILED
    body = response.content.decode()
    assert "Resolution recorded." in body
    assert '<p id="failure-reason">Stopped by boss.</p>' in body


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER, Role.AUDITOR])
def test_resolve_by_non_admin_shows_a_message_and_changes_nothing(client, role):
    tenant = TenantFactory()
    run, record = attention_run(tenant)
    client.force_login(member(tenant, role))

    response = client.post(resolve_url(run), {"resolution": "happened"}, follow=True)

    assert response.redirect_chain == [(run_url(run), 302)]
    assert "Only an admin of this tenant can resolve a run." in response.content.decode()
    assert Run.objects.get(pk=run.pk).status == RunStatus.NEEDS_ATTENTION
    assert IdempotencyRecord.objects.get(pk=record.pk).status == LedgerStatus.CLAIMED
    assert not AuditEvent.objects.filter(action="run.resolved").exists()


def test_resolve_of_a_run_not_needing_attention_shows_a_message(client):
    tenant = TenantFactory()
    run = paused_run(tenant)
    client.force_login(member(tenant, Role.ADMIN))

    response = client.post(resolve_url(run), {"resolution": "abandon"}, follow=True)

    assert "The run is paused, not waiting for a person." in response.content.decode()
    assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED


def test_resolve_unknown_resolution_is_400(client):
    tenant = TenantFactory()
    run, _ = attention_run(tenant)
    client.force_login(member(tenant, Role.ADMIN))

    response = client.post(resolve_url(run), {"resolution": "pretend"})

    assert response.status_code == 400
    assert response.content.decode() == "Choose what happened to the effect."
    assert Run.objects.get(pk=run.pk).status == RunStatus.NEEDS_ATTENTION


def test_resolve_get_is_refused(client):
    tenant = TenantFactory()
    run, _ = attention_run(tenant)
    client.force_login(member(tenant, Role.ADMIN))

    response = client.get(resolve_url(run))

    assert response.status_code == 405


def test_resolve_by_another_tenants_admin_is_404(client):
    run, record = attention_run(TenantFactory())
    client.force_login(member(TenantFactory(), Role.ADMIN))

    response = client.post(resolve_url(run), {"resolution": "happened"})

    assert response.status_code == 404
    assert Run.objects.get(pk=run.pk).status == RunStatus.NEEDS_ATTENTION
    assert IdempotencyRecord.objects.get(pk=record.pk).status == LedgerStatus.CLAIMED


# --- a run the console runs ---------------------------------------------------------------------

START_TASK_PATH = "approvals.execution.queue.start_run_task"


def started_run(tenant) -> Run:
    return start_run(
        tenant=tenant,
        agent_key="release-pkg",
        agent_version="1",
        input="Deploy 2026.07.25 to staging",
        requested_by=None,
    )


def test_run_starting_says_a_worker_runs_the_agent_and_stays_live(client):
    tenant = TenantFactory()
    run = started_run(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(run_url(run))

    assert response.status_code == 200
    assert response.context["live"] is True
    assert [step["label"] for step in response.context["timeline"]] == [
        "Started: waiting for a worker"
    ]
    assert "Starting: a worker runs the agent" in response.content.decode()


def test_resolve_retry_of_a_start_in_doubt_starts_it_again(client):
    tenant = TenantFactory()
    run = started_run(tenant)
    record = IdempotencyRecord.objects.create(
        tenant=tenant,
        key=idempotency_key(
            tenant_id=tenant.pk,
            approval=f"run:{run.pk}",
            operation="deploy_release",
            resource="2026.07.25@staging",
        ),
        run=run,
        operation="deploy_release",
        resource="2026.07.25@staging",
        status=LedgerStatus.CLAIMED,
        claimed_by="w1#1",
    )
    Run.objects.filter(pk=run.pk).update(status=RunStatus.NEEDS_ATTENTION, attempts=1)
    client.force_login(member(tenant, Role.ADMIN))

    client.post(resolve_url(run), {"resolution": "retry"})

    run.refresh_from_db()
    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()
    assert (run.status, run.attempts, run.state_generation) == (RunStatus.STARTING, 0, 0)
    assert DBTaskResult.objects.filter(task_path=START_TASK_PATH).count() == 2
    assert resume_tasks(run) == 0
