"""The decide view: a form, one call to decide(), and a clear 4xx for each refusal."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from approvals.decisions.decide import decide
from approvals.models import AuditEvent, Role, Run, RunStatus, Ticket, TicketStatus
from tests.support import TenantFactory, caller_run, member, pending_ticket

pytestmark = pytest.mark.django_db


def decide_url(ticket: Ticket) -> str:
    return reverse("approvals:decide", args=[ticket.pk])


def run_url(ticket: Ticket) -> str:
    return reverse("approvals:run", args=[ticket.run_id])


class Unchanged:
    """What a refused decision must leave as it was."""

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self.audit = AuditEvent.objects.count()
        self.run_status = Run.objects.get(pk=ticket.run_id).status

    def check(self, status: str = TicketStatus.PENDING) -> None:
        ticket = Ticket.objects.get(pk=self.ticket.pk)
        assert ticket.status == status
        assert AuditEvent.objects.count() == self.audit
        assert Run.objects.get(pk=self.ticket.run_id).status == self.run_status


@pytest.fixture
def setup():
    tenant = TenantFactory()
    requester = member(tenant, Role.VIEWER, username="requester")
    approver = member(tenant, Role.APPROVER, username="approver")
    return tenant, pending_ticket(tenant, requested_by=requester), approver


def test_decide_approve_redirects_to_the_run_and_records_it(client, setup):
    _, ticket, approver = setup
    client.force_login(approver)

    response = client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})

    assert response.status_code == 302
    assert response["Location"] == run_url(ticket)
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.APPROVED
    assert ticket.decided_by == approver
    assert ticket.decision_message == "Ship it."
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.QUEUED
    assert AuditEvent.objects.filter(ticket_id=ticket.pk, action="ticket.approved").count() == 1


def test_decide_approve_shows_a_message_on_the_run_page(client, setup):
    _, ticket, approver = setup
    client.force_login(approver)

    response = client.post(decide_url(ticket), {"decision": "approve"}, follow=True)

    assert (
        f"Ticket #{ticket.pk} approved. The run continues in the worker."
        in response.content.decode()
    )


def test_decide_approve_of_a_callers_run_says_its_caller_resumes_it(client):
    tenant = TenantFactory()
    ticket = Ticket.objects.get(run=caller_run(tenant, requested_by=member(tenant, Role.VIEWER)))
    client.force_login(member(tenant, Role.APPROVER))

    response = client.post(decide_url(ticket), {"decision": "approve"}, follow=True)

    assert f"Ticket #{ticket.pk} approved. Its caller resumes the run." in response.content.decode()
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.AWAITING_CALLER


def test_decide_reject_stores_the_message(client, setup):
    _, ticket, approver = setup
    client.force_login(approver)

    response = client.post(
        decide_url(ticket), {"decision": "reject", "message": "Denied by the release manager."}
    )

    assert response.status_code == 302
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.REJECTED
    assert ticket.decision_message == "Denied by the release manager."


def test_decide_always_is_stored_with_an_approval(client, setup):
    _, ticket, approver = setup
    client.force_login(approver)

    client.post(decide_url(ticket), {"decision": "approve", "always": "on"})

    ticket.refresh_from_db()
    assert (ticket.status, ticket.always) == (TicketStatus.APPROVED, True)


def test_decide_htmx_post_answers_with_hx_redirect(client, setup):
    _, ticket, approver = setup
    client.force_login(approver)

    response = client.post(
        decide_url(ticket), {"decision": "approve"}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 200
    assert response["HX-Redirect"] == run_url(ticket)
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


def test_decide_get_is_refused(client, setup):
    _, ticket, approver = setup
    client.force_login(approver)

    response = client.get(decide_url(ticket))

    assert response.status_code == 405
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


def test_decide_by_another_tenants_user_is_404(client, setup):
    _, ticket, _ = setup
    unchanged = Unchanged(ticket)
    client.force_login(member(TenantFactory(), Role.ADMIN))

    response = client.post(decide_url(ticket), {"decision": "approve"})

    assert response.status_code == 404
    unchanged.check()


def test_decide_forged_id_is_404(client, setup):
    _, _, approver = setup
    client.force_login(approver)

    response = client.post(reverse("approvals:decide", args=[999999]), {"decision": "reject"})

    assert response.status_code == 404


def test_decide_by_viewer_is_403_with_the_reason(client, setup):
    tenant, ticket, _ = setup
    unchanged = Unchanged(ticket)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.post(decide_url(ticket), {"decision": "reject"})

    assert response.status_code == 403
    assert "The viewer role cannot decide tickets." in response.content.decode()
    unchanged.check()


def test_decide_by_auditor_is_403(client, setup):
    tenant, ticket, _ = setup
    unchanged = Unchanged(ticket)
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.post(decide_url(ticket), {"decision": "approve"})

    assert response.status_code == 403
    assert "The auditor role cannot decide tickets." in response.content.decode()
    unchanged.check()


def test_decide_requester_approving_own_ticket_is_403(client):
    tenant = TenantFactory()
    requester = member(tenant, Role.APPROVER)
    ticket = pending_ticket(tenant, requested_by=requester)
    unchanged = Unchanged(ticket)
    client.force_login(requester)

    response = client.post(decide_url(ticket), {"decision": "approve"})

    assert response.status_code == 403
    assert "You requested this call, so someone else must approve it." in (
        response.content.decode()
    )
    unchanged.check()


def test_decide_requester_may_reject_own_ticket(client):
    tenant = TenantFactory()
    requester = member(tenant, Role.APPROVER)
    ticket = pending_ticket(tenant, requested_by=requester)
    client.force_login(requester)

    response = client.post(decide_url(ticket), {"decision": "reject"})

    assert response.status_code == 302
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.REJECTED


def test_decide_second_decision_is_409_naming_the_first(client, setup):
    tenant, ticket, approver = setup
    decide(ticket, user=approver, approve=True)
    unchanged = Unchanged(ticket)
    client.force_login(member(tenant, Role.ADMIN))

    response = client.post(decide_url(ticket), {"decision": "reject"})

    assert response.status_code == 409
    decided_at = Ticket.objects.get(pk=ticket.pk).decided_at
    assert (
        f"Already approved by approver at {decided_at:%Y-%m-%d %H:%M:%S} UTC."
        in response.content.decode()
    )
    unchanged.check(TicketStatus.APPROVED)


def test_decide_expired_ticket_is_409(client, setup):
    _, ticket, approver = setup
    Ticket.objects.filter(pk=ticket.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    unchanged = Unchanged(ticket)
    client.force_login(approver)

    response = client.post(decide_url(ticket), {"decision": "approve"})

    assert response.status_code == 409
    assert "the agent must ask again" in response.content.decode()
    unchanged.check()


def test_decide_on_a_ticket_whose_run_moved_on_is_409(client, setup):
    _, ticket, approver = setup
    # The worker ended the run and withdrew its pending tickets.
    Ticket.objects.filter(pk=ticket.pk).update(status=TicketStatus.SUPERSEDED)
    Run.objects.filter(pk=ticket.run_id).update(status=RunStatus.FAILED)
    unchanged = Unchanged(ticket)
    client.force_login(approver)

    response = client.post(decide_url(ticket), {"decision": "reject"})

    assert response.status_code == 409
    assert "This ticket was withdrawn because its run ended." in response.content.decode()
    unchanged.check(TicketStatus.SUPERSEDED)


def test_decide_message_over_2000_characters_is_400(client, setup):
    _, ticket, approver = setup
    unchanged = Unchanged(ticket)
    client.force_login(approver)

    response = client.post(decide_url(ticket), {"decision": "reject", "message": "x" * 2001})

    assert response.status_code == 400
    assert "Ensure this value has at most 2000 characters (it has 2001)." in (
        response.content.decode()
    )
    unchanged.check()


def test_decide_always_with_reject_is_400(client, setup):
    _, ticket, approver = setup
    unchanged = Unchanged(ticket)
    client.force_login(approver)

    response = client.post(decide_url(ticket), {"decision": "reject", "always": "on"})

    assert response.status_code == 400
    assert escape("'Always approve' goes with an approval, not a rejection.") in (
        response.content.decode()
    )
    unchanged.check()


@pytest.mark.parametrize("decision", ["", "maybe"])
def test_decide_unknown_decision_is_400(client, setup, decision):
    _, ticket, approver = setup
    unchanged = Unchanged(ticket)
    client.force_login(approver)

    response = client.post(decide_url(ticket), {"decision": decision})

    assert response.status_code == 400
    assert 'id="decision-problem"' in response.content.decode()
    unchanged.check()


def test_decide_without_csrf_token_is_403(setup):
    _, ticket, approver = setup
    unchanged = Unchanged(ticket)
    client = Client(enforce_csrf_checks=True)
    client.force_login(approver)

    response = client.post(decide_url(ticket), {"decision": "approve"})

    assert response.status_code == 403
    unchanged.check()


def test_decide_with_csrf_token_from_the_page_succeeds(setup):
    _, ticket, approver = setup
    client = Client(enforce_csrf_checks=True)
    client.force_login(approver)
    page = client.get(reverse("approvals:ticket", args=[ticket.pk]))
    token = page.context["csrf_token"]

    response = client.post(
        decide_url(ticket), {"decision": "approve", "csrfmiddlewaretoken": token}
    )

    assert response.status_code == 302
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


def test_decide_digest_mismatch_at_post_time_is_409_and_nothing_decided(client, setup):
    _, ticket, approver = setup
    Ticket.objects.filter(pk=ticket.pk).update(arguments_digest="f" * 64)
    unchanged = Unchanged(ticket)
    client.force_login(approver)

    response = client.post(decide_url(ticket), {"decision": "approve"})

    assert response.status_code == 409
    assert (
        "Not approved: the arguments in the stored state differ from those recorded on the ticket."
        in response.content.decode()
    )
    unchanged.check()


def test_decide_htmx_refusal_returns_the_decision_partial(client, setup):
    tenant, ticket, _ = setup
    client.force_login(member(tenant, Role.VIEWER))

    response = client.post(
        decide_url(ticket), {"decision": "reject"}, headers={"HX-Request": "true"}
    )

    body = response.content.decode().strip()
    assert response.status_code == 403
    assert body.startswith('<section class="card decision" id="decision"')
    assert "<html" not in body


# What one approval that completes its run reads and writes, after commit included, in a
# test's transaction (its commit is a savepoint's release; on PostgreSQL the task's insert
# NOTIFYs a worker, with no statement of its own): the session and the user; the user's memberships and the ticket with its run
# (the digest gate opens its state), read once for the view and decide(); under the run's lock
# the ticket with its policy, the valid votes, the vote, the compare-and-set and the run queued
# if no other ticket of its state is pending (on PostgreSQL one statement, which takes the
# tenant's audit-head lock too, which the test's own transaction already holds here; on SQLite
# two), its resume task;
# then the decision's and the run's audit events with the chain head, in one statement as the
# transaction ends (audit.chain.atomic).
# Nothing after commit: the worker fans notifications out. Pinned so that a duplicate read
# cannot creep back in: change a number only with the query that was added or cut.
APPROVE_QUERIES = {"postgresql": 13, "sqlite": 19}


def test_decide_approve_takes_a_fixed_number_of_queries(
    client, setup, django_capture_on_commit_callbacks
):
    _, ticket, approver = setup
    client.force_login(approver)

    with (
        CaptureQueriesContext(connection) as captured,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = client.post(decide_url(ticket), {"decision": "approve"})

    assert response.status_code == 302
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED
    assert len(captured) == APPROVE_QUERIES[connection.vendor], "\n".join(
        q["sql"][:120] for q in captured
    )
