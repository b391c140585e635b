"""The headless flow end to end, in one process: pause, decide, resume."""

from __future__ import annotations

import pytest

from approvals.decisions.decide import decide
from approvals.models import AuditEvent, IdempotencyRecord, Run, RunStatus, Ticket, TicketStatus
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_pause_run_approve_then_resume_runs_the_tool_once(effect_log):
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, "viewer")
    approver = member(tenant, "approver")
    demo.MODEL_CALLS["release"] = 0

    run = paused_run(tenant, requested_by=requester)

    assert demo.read_effects() == []
    ticket = Ticket.objects.get(run=run)
    assert ticket.tool_name == "deploy_release"
    assert ticket.status == TicketStatus.PENDING
    assert demo.MODEL_CALLS["release"] == 1

    decide(ticket, user=approver, approve=True)
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED

    outcome = resume(run_id=run.pk, worker_id="w1")

    assert outcome.status == RunStatus.COMPLETED
    assert len(demo.read_effects("deploy_release")) == 1
    assert IdempotencyRecord.objects.filter(run=run, status="done").count() == 1
    assert demo.MODEL_CALLS["release"] == 2
    run.refresh_from_db()
    assert run.final_output == "Release 2026.07.24: Release 2026.07.24 is live on production."
    assert list(
        AuditEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("action", flat=True)
    ) == [
        "run.paused",
        "ticket.created",
        "ticket.approved",
        "run.queued",
        "run.resuming",
        "effect.done",
        "run.completed",
    ]
