"""Expiry actions are enforced by `manage.py worker` on time, without anyone opening a page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApproverGroup, AuditEvent, Role, Run, RunStatus, Ticket, TicketStatus
from approvals.policies.versions import save_policy
from devtools import demo
from tests.conftest import subprocess_env
from tests.support import TenantFactory, member, paused_run, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_worker_rejects_an_expired_ticket_on_time_and_the_run_completes(manage_process):
    tenant = TenantFactory(slug="acme")
    admin = member(tenant, Role.ADMIN, username="boss")
    save_policy(tenant=tenant, user=admin, tool_name="deploy_release", on_expiry="reject")
    requester = member(tenant, Role.VIEWER, username="req")
    warm_up = Ticket.objects.get(run=paused_run(tenant, requested_by=requester))
    run = paused_run(tenant, requested_by=requester)
    ticket = Ticket.objects.get(run=run)
    Ticket.objects.filter(pk=warm_up.pk).update(expires_at=timezone.now())

    manage_process("worker", env=subprocess_env(APPROVALS_REAPER_INTERVAL_SECONDS="1"))
    # The worker is up and its reaper running once the warm-up ticket is rejected; only then
    # does the measured ticket's expiry start, so a slow process start cannot count as late.
    wait_until(
        lambda: Ticket.objects.filter(pk=warm_up.pk, status=TicketStatus.REJECTED).exists(),
        timeout=40,
        what="the worker's reaper to start",
    )
    Ticket.objects.filter(pk=ticket.pk).update(expires_at=timezone.now() + timedelta(seconds=2))
    wait_until(
        lambda: Run.objects.filter(pk=run.pk, status=RunStatus.COMPLETED).exists(),
        timeout=40,
        what="the worker to reject the expired ticket and finish the run",
    )

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.REJECTED
    assert ticket.decision_source == "expiry"
    # On time: the reaper acted within a few of its 1 s passes of the expiry.
    assert ticket.decided_at - ticket.expires_at < timedelta(seconds=5)
    rejected = AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.rejected")
    assert rejected.actor_name == "reaper"
    assert rejected.detail["by"] == "expiry"
    assert demo.read_effects() == []
    assert Run.objects.get(pk=warm_up.run_id).status == RunStatus.COMPLETED


def test_worker_escalates_an_expired_ticket(manage_process):
    tenant = TenantFactory(slug="acme")
    admin = member(tenant, Role.ADMIN, username="boss")
    leads, _ = ApproverGroup.objects.get_or_create(tenant=tenant, name="on-call leads")
    leads.members.add(member(tenant, Role.APPROVER, username="carol"))
    save_policy(
        tenant=tenant,
        user=admin,
        tool_name="deploy_release",
        on_expiry="escalate",
        escalation_group="on-call leads",
        escalation_seconds=3600,
    )
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, username="req"))
    ticket = Ticket.objects.get(run=run)
    Ticket.objects.filter(pk=ticket.pk).update(expires_at=timezone.now() + timedelta(seconds=1))

    manage_process("worker", env=subprocess_env(APPROVALS_REAPER_INTERVAL_SECONDS="1"))
    wait_until(
        lambda: Ticket.objects.filter(pk=ticket.pk, escalated_at__isnull=False).exists(),
        timeout=40,
        what="the worker to escalate the expired ticket",
    )

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING
    assert ticket.expires_at > timezone.now() + timedelta(minutes=55)
    assert AuditEvent.objects.filter(ticket_id=ticket.pk, action="ticket.escalated").count() == 1
