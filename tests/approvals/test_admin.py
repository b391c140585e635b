"""The Django admin shows the console's rows but never changes them: tickets, runs, ledger
records, votes, pre-authorisations, audit events and memberships change only through the
capabilities (compare-and-set, checks, audit, signing a removed member out), so the admin may
not add, edit or delete them."""

from __future__ import annotations

import pytest
from django.db import models
from django.urls import reverse
from django.utils import timezone

from approvals.models import (
    AuditEvent,
    IdempotencyRecord,
    Membership,
    PreAuthorization,
    Role,
    Run,
    RunStatus,
    Ticket,
    TicketStatus,
    TicketVote,
)
from tests.support import TenantFactory, UserFactory, member, paused_run

pytestmark = pytest.mark.django_db

MODELS = [Ticket, Run, IdempotencyRecord, TicketVote, PreAuthorization, AuditEvent, Membership]


@pytest.fixture
def superuser():
    return UserFactory(username="root", is_staff=True, is_superuser=True)


@pytest.fixture
def rows() -> dict[type[models.Model], models.Model]:
    """One row of each model, none held by another row (so only the admin could refuse)."""
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER)
    requester = member(tenant, Role.VIEWER)
    pending = Ticket.objects.get(run=paused_run(tenant, requested_by=requester))
    run = paused_run(tenant, requested_by=requester)
    ticket = Ticket.objects.get(run=run)
    bare_run = Run.objects.create(
        tenant=tenant,
        agent_key="release",
        agent_version="1",
        schema_version="1.0",
        state_key_id="",
        state_nonce=b"",
        state_ciphertext=b"",
    )
    return {
        Ticket: pending,
        Run: bare_run,
        IdempotencyRecord: IdempotencyRecord.objects.create(
            tenant=tenant,
            key="k" * 64,
            run=run,
            operation="deploy",
            resource="production",
            status="claimed",
            claimed_by="worker-1",
        ),
        TicketVote: TicketVote.objects.create(ticket=ticket, user=approver),
        PreAuthorization: PreAuthorization.objects.create(
            tenant=tenant,
            run=run,
            tool_name=ticket.tool_name,
            arguments_json="{}",
            arguments_digest="0" * 64,
            original_ticket=ticket,
            created_by=approver,
            expires_at=timezone.now(),
        ),
        AuditEvent: AuditEvent.objects.filter(run_id=run.pk).latest("seq"),
        Membership: Membership.objects.get(tenant=tenant, user=approver),
    }


def admin_url(model: type[models.Model], view: str, *args) -> str:
    return reverse(f"admin:approvals_{model._meta.model_name}_{view}", args=args)


ids = [m.__name__ for m in MODELS]


@pytest.mark.parametrize("model", MODELS, ids=ids)
def test_the_admin_refuses_to_delete_a_row(client, superuser, rows, model):
    row = rows[model]
    client.force_login(superuser)

    response = client.post(admin_url(model, "delete", row.pk), {"post": "yes"})

    assert response.status_code == 403
    assert model.objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize("model", MODELS, ids=ids)
def test_the_admin_has_no_bulk_delete(client, superuser, rows, model):
    row = rows[model]
    client.force_login(superuser)

    listed = client.get(admin_url(model, "changelist"))
    client.post(
        admin_url(model, "changelist"),
        {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"},
    )

    assert listed.status_code == 200
    form = listed.context["action_form"]
    assert form is None or "delete_selected" not in dict(form.fields["action"].choices)
    assert model.objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize("model", MODELS, ids=ids)
def test_the_admin_refuses_to_add_or_edit_a_row(client, superuser, rows, model):
    row = rows[model]
    before = list(model.objects.order_by("pk").values())
    client.force_login(superuser)

    added = client.post(admin_url(model, "add"), {})
    changed = client.post(admin_url(model, "change", row.pk), {})
    shown = client.get(admin_url(model, "change", row.pk))

    assert added.status_code == changed.status_code == 403
    assert shown.status_code == 200  # still readable
    assert list(model.objects.order_by("pk").values()) == before


def test_a_pending_ticket_is_still_pending_after_the_admin_refused_to_delete_it(
    client, superuser, rows
):
    ticket = rows[Ticket]
    client.force_login(superuser)

    client.post(admin_url(Ticket, "delete", ticket.pk), {"post": "yes"})

    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.PAUSED
