"""An audit event about one ticket carries the ticket's tenant, run, tool and digest."""

from __future__ import annotations

import pytest
from django.db import transaction

from approvals.audit import chain
from approvals.models import AuditEvent, Ticket
from tests.support import TenantFactory, paused_run

pytestmark = pytest.mark.django_db


def test_append_for_ticket_records_the_ticket_and_what_it_is_given_only():
    tenant = TenantFactory()
    ticket = Ticket.objects.get(run=paused_run(tenant))

    with transaction.atomic():
        event = chain.append_for_ticket(ticket, action="ticket.created", actor_name="worker w1")

    stored = AuditEvent.objects.filter(pk=event.pk).values(
        "tenant_id", "run_id", "ticket_id", "tool_name", "arguments_digest", "actor_name"
    )
    assert stored.get() == {
        "tenant_id": tenant.pk,
        "run_id": ticket.run_id,
        "ticket_id": ticket.pk,
        "tool_name": "deploy_release",
        "arguments_digest": ticket.arguments_digest,
        "actor_name": "worker w1",
    }
    assert AuditEvent.objects.get(pk=event.pk).outcome == ""
