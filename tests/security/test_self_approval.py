"""Nobody approves their own request: not on the page, not by a forged POST, not from the
command line, not through the service, not through Django's admin, even as approver or admin."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from approvals.decisions.decide import decide
from approvals.decisions.errors import SelfApprovalError
from approvals.models import AuditEvent, Role, Run, RunStatus, Ticket, TicketStatus
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

DECIDING_ROLES = [Role.APPROVER, Role.ADMIN]
SELF_APPROVAL = "you requested this call, so someone else must approve it"
# The page, the command and any other entry point show it as one sentence.
SELF_APPROVAL_SENTENCE = "You requested this call, so someone else must approve it."
APPROVE_BUTTON = 'name="decision" value="approve"'


def own_ticket(role: str) -> tuple[Ticket, object]:
    tenant = TenantFactory()
    requester = member(tenant, role, username=f"requester-{role}")
    ticket = Ticket.objects.get(run=paused_run(tenant, requested_by=requester))
    return ticket, requester


def assert_still_pending(ticket: Ticket) -> None:
    current = Ticket.objects.get(pk=ticket.pk)
    assert (current.status, current.decided_by_id) == (TicketStatus.PENDING, None)
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.PAUSED
    assert not AuditEvent.objects.filter(ticket_id=ticket.pk, action="ticket.approved").exists()


@pytest.mark.parametrize("role", DECIDING_ROLES)
def test_self_approval_page_offers_no_approve_button_to_the_requester(client, role):
    ticket, requester = own_ticket(role)
    client.force_login(requester)

    page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()

    assert APPROVE_BUTTON not in page
    assert 'name="decision" value="reject"' in page
    assert "You requested this call, so someone else must approve it." in page


@pytest.mark.parametrize("role", DECIDING_ROLES)
def test_self_approval_page_offers_the_button_to_another_decider(client, role):
    """The control: the same page shows the button to a colleague with the same role."""
    ticket, _ = own_ticket(role)
    client.force_login(member(ticket.tenant, role, username="colleague"))

    page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()

    assert page.count(APPROVE_BUTTON) == 1


@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
@pytest.mark.parametrize("always", [False, True], ids=["once", "always"])
@pytest.mark.parametrize("role", DECIDING_ROLES)
def test_self_approval_forged_post_is_403(client, role, always, htmx):
    ticket, requester = own_ticket(role)
    client.force_login(requester)
    data = {"decision": "approve", "message": "Mine.", **({"always": "on"} if always else {})}

    response = client.post(
        reverse("approvals:decide", args=[ticket.pk]),
        data,
        headers={"HX-Request": "true"} if htmx else {},
    )

    assert response.status_code == 403
    assert "You requested this call, so someone else must approve it." in (
        response.content.decode()
    )
    assert_still_pending(ticket)


@pytest.mark.parametrize("role", DECIDING_ROLES)
def test_self_approval_decide_command_refuses(role):
    ticket, requester = own_ticket(role)

    with pytest.raises(CommandError) as refused:
        call_command("decide", str(ticket.pk), "--approve", "--user", requester.username)

    assert str(refused.value) == SELF_APPROVAL_SENTENCE
    assert_still_pending(ticket)


@pytest.mark.parametrize("role", DECIDING_ROLES)
def test_self_approval_decide_command_refuses_always_too(role):
    ticket, requester = own_ticket(role)

    with pytest.raises(CommandError) as refused:
        call_command(
            "decide", str(ticket.pk), "--approve", "--always", "--user", requester.username
        )

    assert str(refused.value) == SELF_APPROVAL_SENTENCE
    assert_still_pending(ticket)


@pytest.mark.parametrize("always", [False, True], ids=["once", "always"])
@pytest.mark.parametrize("role", DECIDING_ROLES)
def test_self_approval_service_refuses(role, always):
    ticket, requester = own_ticket(role)

    with pytest.raises(SelfApprovalError) as refused:
        decide(ticket, user=requester, approve=True, always=always)

    assert str(refused.value) == SELF_APPROVAL
    assert_still_pending(ticket)


@pytest.mark.parametrize("role", DECIDING_ROLES)
def test_self_approval_requester_may_still_reject(role):
    ticket, requester = own_ticket(role)

    decide(ticket, user=requester, approve=False, message="Changed my mind.")

    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.REJECTED


@pytest.mark.django_db(transaction=True)
def test_self_approval_written_around_the_service_is_refused_by_the_worker():
    """Defence in depth: an approval by the requester that reached the row anyway never runs."""
    ticket, requester = own_ticket(Role.ADMIN)
    Ticket.objects.filter(pk=ticket.pk).update(
        status=TicketStatus.APPROVED, decided_by=requester, decided_at=ticket.created_at
    )
    Run.objects.filter(pk=ticket.run_id).update(status=RunStatus.QUEUED)

    outcome = resume(run_id=ticket.run_id)

    assert outcome.status == RunStatus.NEEDS_ATTENTION
    assert outcome.reason == (
        f"Regenerate the approval: ticket {ticket.pk} was approved by its requester"
    )
    assert demo.read_effects() == []


def test_self_approval_through_django_admin_is_refused(client):
    """Staff who requested a call must not approve it, or name someone else as approver, by
    editing the ticket in /admin/: decisions go through decide only."""
    ticket, requester = own_ticket(Role.ADMIN)
    colleague = member(ticket.tenant, Role.APPROVER, username="colleague")
    requester.is_staff = requester.is_superuser = True
    requester.save(update_fields=["is_staff", "is_superuser"])
    client.force_login(requester)
    url = reverse("admin:approvals_ticket_change", args=[ticket.pk])
    form = client.get(url).context["adminform"].form
    data = {
        name: value
        for name, value in form.initial.items()
        if name in form.fields and value is not None
    }
    expires = ticket.expires_at
    data.update(
        {
            "status": TicketStatus.APPROVED,
            "decided_by": str(colleague.pk),
            "decided_at_0": f"{expires:%Y-%m-%d}",
            "decided_at_1": "00:00:00",
            "expires_at_0": f"{expires:%Y-%m-%d}",
            "expires_at_1": f"{expires:%H:%M:%S}",
            "decision_message": "",
        }
    )

    client.post(url, data)

    assert_still_pending(ticket)
