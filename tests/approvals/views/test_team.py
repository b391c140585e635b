"""The console's team views: claim and release, the discussion, and batch decisions."""

from __future__ import annotations

import pytest
from django.urls import reverse

from approvals.decisions import claims, comments
from approvals.decisions.decide import decide
from approvals.models import AuditEvent, Role, Tenant, Ticket, TicketStatus
from tests.support import TenantFactory, member, paused_run, pending_ticket

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


@pytest.fixture
def tenant():
    return TenantFactory(slug="acme")


@pytest.fixture
def ticket(tenant):
    return pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER, username="requester"))


def claim_url(ticket: Ticket) -> str:
    return reverse("approvals:claim", args=[ticket.pk])


def comment_url(ticket: Ticket) -> str:
    return reverse("approvals:comment", args=[ticket.pk])


def page(client, ticket: Ticket, **kwargs):
    return client.get(reverse("approvals:ticket", args=[ticket.pk]), **kwargs)


# --- claims -----------------------------------------------------------------------------------


def test_claim_via_htmx_answers_the_claim_panel(client, tenant, ticket):
    alice = member(tenant, Role.APPROVER, username="alice")
    client.force_login(alice)

    response = client.post(claim_url(ticket), {"action": "claim"}, headers=HTMX)

    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section class="card claim" id="claim"')
    assert "<strong>You are on it</strong>" in body
    assert 'name="action" value="release"' in body
    assert Ticket.objects.get(pk=ticket.pk).claimed_by == alice


def test_claim_without_htmx_redirects_to_the_ticket(client, tenant, ticket):
    client.force_login(member(tenant, Role.APPROVER, username="alice"))

    response = client.post(claim_url(ticket), {"action": "claim"})

    assert response.status_code == 302
    assert response["Location"] == reverse("approvals:ticket", args=[ticket.pk])


def test_claim_shown_to_others_on_the_ticket_and_the_queue(client, tenant, ticket):
    claims.claim(ticket, user=member(tenant, Role.APPROVER, username="alice"))
    client.force_login(member(tenant, Role.APPROVER, username="bob"))

    ticket_page = page(client, ticket).content.decode()
    panel = page(client, ticket, headers={**HTMX, "HX-Target": "claim"}).content.decode()
    queue = client.get(reverse("approvals:queue")).content.decode()

    assert "<strong>alice is on it</strong>" in ticket_page
    assert 'name="action" value="take_over"' in ticket_page
    assert panel.lstrip().startswith('<section class="card claim" id="claim"')
    assert "<strong>alice is on it</strong>" in panel
    assert f'<span class="claim-badge" id="claim-badge-{ticket.pk}">alice is on it</span>' in queue


def test_claim_conflict_answers_409_with_who_and_since(client, tenant, ticket):
    claims.claim(ticket, user=member(tenant, Role.APPROVER, username="alice"))
    client.force_login(member(tenant, Role.APPROVER, username="bob"))

    response = client.post(claim_url(ticket), {"action": "claim"}, headers=HTMX)

    assert response.status_code == 409
    ticket.refresh_from_db()
    assert (
        f'id="claim-problem">Claimed by alice since {ticket.claimed_at:%Y-%m-%d %H:%M:%S} UTC.<'
        in response.content.decode()
    )
    assert ticket.claimed_by.username == "alice"


def test_claim_take_over_and_release(client, tenant, ticket):
    claims.claim(ticket, user=member(tenant, Role.APPROVER, username="alice"))
    bob = member(tenant, Role.APPROVER, username="bob")
    client.force_login(bob)

    taken = client.post(claim_url(ticket), {"action": "take_over"}, headers=HTMX)
    owner = Ticket.objects.get(pk=ticket.pk).claimed_by
    released = client.post(claim_url(ticket), {"action": "release"}, headers=HTMX)

    assert (taken.status_code, owner, released.status_code) == (200, bob, 200)
    assert Ticket.objects.get(pk=ticket.pk).claimed_by is None
    assert "Nobody has said they are on it." in released.content.decode()


def test_claim_by_a_viewer_is_403_and_shows_no_claim_button(client, tenant, ticket):
    client.force_login(member(tenant, Role.VIEWER, username="vera"))

    response = client.post(claim_url(ticket), {"action": "claim"}, headers=HTMX)

    assert response.status_code == 403
    assert 'id="claim-form"' not in page(client, ticket).content.decode()
    assert Ticket.objects.get(pk=ticket.pk).claimed_by is None


def test_claim_with_a_bad_action_is_400(client, tenant, ticket):
    client.force_login(member(tenant, Role.APPROVER))

    response = client.post(claim_url(ticket), {"action": "steal"}, headers=HTMX)

    assert response.status_code == 400
    assert Ticket.objects.get(pk=ticket.pk).claimed_by is None


def test_claim_of_another_tenants_ticket_is_404(client, ticket):
    client.force_login(member(TenantFactory(slug="other"), Role.ADMIN))

    responses = [
        client.post(claim_url(ticket), {"action": "claim"}).status_code,
        client.post(comment_url(ticket), {"text": "hi"}).status_code,
    ]

    assert responses == [404, 404]
    assert Ticket.objects.get(pk=ticket.pk).claimed_by is None


def test_claim_and_comment_refuse_get(client, tenant, ticket):
    client.force_login(member(tenant, Role.ADMIN))

    assert client.get(claim_url(ticket)).status_code == 405
    assert client.get(comment_url(ticket)).status_code == 405
    assert client.get(reverse("approvals:batch")).status_code == 405


def test_claim_keyboard_key_is_on_the_claim_button(client, tenant, ticket):
    client.force_login(member(tenant, Role.APPROVER))

    body = page(client, ticket).content.decode()

    assert '<button type="submit" class="button" data-key="c">I\'m on it</button>' in body


# --- comments ---------------------------------------------------------------------------------


def test_comment_via_htmx_answers_the_discussion_with_the_comment(client, tenant, ticket):
    client.force_login(member(tenant, Role.APPROVER, username="alice"))

    response = client.post(comment_url(ticket), {"text": "Staging is green."}, headers=HTMX)

    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section class="card comments" id="comments"')
    event = AuditEvent.objects.get(action="ticket.commented")
    assert (event.actor_name, event.ticket_id, event.detail) == (
        "alice",
        ticket.pk,
        {"text": "Staging is green."},
    )
    assert f'<li class="comment" id="comment-{event.pk}"><span class="who">alice</span>' in body
    assert "Staging is green.</div>" in body
    # The form comes back empty, ready for the next comment.
    assert '<textarea name="text" id="id_comment" rows="3" maxlength="2000"></textarea>' in body


def test_comment_without_htmx_redirects_to_the_discussion(client, tenant, ticket):
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.post(comment_url(ticket), {"text": "noted"})

    assert response.status_code == 302
    assert response["Location"] == reverse("approvals:ticket", args=[ticket.pk]) + "#comments"


def test_comments_shown_in_time_order_to_a_viewer_who_cannot_write(client, tenant, ticket):
    comments.comment(ticket, user=member(tenant, Role.APPROVER, username="alice"), text="first")
    comments.comment(ticket, user=member(tenant, Role.AUDITOR, username="carol"), text="second")
    client.force_login(member(tenant, Role.VIEWER, username="vera"))

    body = page(client, ticket).content.decode()
    listed = page(client, ticket, headers={**HTMX, "HX-Target": "comment-list"})

    assert body.index("first</div>") < body.index("second</div>")
    assert 'id="comment-form"' not in body
    assert "Your role (viewer) reads the discussion but does not take part." in body
    assert listed.content.decode().lstrip().startswith('<ol class="comment-list" id="comment-list"')
    assert "second</div>" in listed.content.decode()


def test_comment_by_a_viewer_is_403_and_stores_nothing(client, tenant, ticket):
    client.force_login(member(tenant, Role.VIEWER, username="vera"))

    response = client.post(comment_url(ticket), {"text": "let me in"}, headers=HTMX)

    assert response.status_code == 403
    assert "The viewer role can read comments, not write." in response.content.decode()
    assert not AuditEvent.objects.filter(action="ticket.commented").exists()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "Write something first."),
        ("   ", "Write something first."),
        ("x" * (comments.MAX_COMMENT_CHARS + 1), "Ensure this value has at most 2000 characters"),
    ],
)
@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
def test_comment_empty_or_too_long_is_a_form_error(client, tenant, ticket, text, error, htmx):
    client.force_login(member(tenant, Role.APPROVER))

    response = client.post(comment_url(ticket), {"text": text}, headers=HTMX if htmx else {})

    assert response.status_code == 400
    assert 'id="comment-problem">' + error in response.content.decode()
    assert not AuditEvent.objects.filter(action="ticket.commented").exists()


def test_comment_appears_in_the_audit_history_and_its_export(client, tenant, ticket):
    comments.comment(
        ticket, user=member(tenant, Role.APPROVER, username="alice"), text="Looks fine"
    )
    client.force_login(member(tenant, Role.AUDITOR))

    history = client.get(reverse("approvals:audit"), {"action": "ticket.commented"})
    export = client.get(reverse("approvals:audit-export", args=["jsonl"]))
    lines = b"".join(export.streaming_content).decode()

    assert history.status_code == 200
    assert (
        f"<strong>alice</strong> commented on <strong>ticket #{ticket.pk}</strong>: "
        "“<strong>Looks fine</strong>”."
    ) in history.content.decode()
    assert '"action": "ticket.commented"' in lines
    assert '"detail": {"text": "Looks fine"}' in lines


# --- batch decisions --------------------------------------------------------------------------


def releases(tenant, count: int, requested_by) -> list[Ticket]:
    return [
        pending_ticket(
            tenant, requested_by=requested_by, prompt=f"Deploy release 2026.07.{n:02d} to staging"
        )
        for n in range(1, count + 1)
    ]


def test_batch_approve_reports_each_ticket(client, tenant):
    requester = member(tenant, Role.VIEWER, username="requester")
    tickets = releases(tenant, 4, requester)
    decide(tickets[1], user=member(tenant, Role.APPROVER, username="bob"), approve=False)
    client.force_login(member(tenant, Role.APPROVER, username="alice"))

    response = client.post(
        reverse("approvals:batch"),
        {"ticket": [t.pk for t in tickets], "decision": "approve"},
        headers=HTMX,
    )

    assert response.status_code == 200
    body = response.content.decode()
    assert '<h2 id="batch-summary">3 of 4 approved</h2>' in body
    assert f'id="batch-ticket-{tickets[1].pk}"' in body
    assert "Already rejected by bob at " in body
    assert response["HX-Trigger"] == '{"console:changed": {}}'
    assert Ticket.objects.filter(status=TicketStatus.APPROVED).count() == 3


def test_batch_without_htmx_renders_the_result_page(client, tenant):
    tickets = releases(tenant, 2, member(tenant, Role.VIEWER, username="requester"))
    client.force_login(member(tenant, Role.ADMIN))

    response = client.post(
        reverse("approvals:batch"),
        {"ticket": [t.pk for t in tickets], "decision": "reject", "message": "freeze"},
    )

    assert response.status_code == 200
    assert "<title>Batch decision · Approval console</title>" in response.content.decode()
    assert set(Ticket.objects.values_list("status", "decision_message")) == {
        (TicketStatus.REJECTED, "freeze")
    }


def test_batch_mixing_tools_is_400_with_nothing_written(client, tenant):
    requester = member(tenant, Role.VIEWER, username="requester")
    release = pending_ticket(tenant, requested_by=requester)
    invoice = Ticket.objects.get(
        run=paused_run(
            tenant, agent_key="invoice", prompt="Publish invoice INV-1001", requested_by=requester
        )
    )
    seq = Tenant.objects.get(pk=tenant.pk).audit_seq
    client.force_login(member(tenant, Role.ADMIN))

    response = client.post(
        reverse("approvals:batch"),
        {"ticket": [release.pk, invoice.pk], "decision": "approve"},
        headers=HTMX,
    )

    assert response.status_code == 400
    assert (
        'id="batch-problem">A batch holds tickets of one tool; this one mixes deploy_release '
        "and publish_invoice.<" in response.content.decode()
    )
    assert Tenant.objects.get(pk=tenant.pk).audit_seq == seq
    assert Ticket.objects.filter(status=TicketStatus.PENDING).count() == 2


@pytest.mark.parametrize(
    ("tickets", "error"),
    [
        ([], "Select at least one ticket."),
        (["abc"], "&#x27;abc&#x27; is not a ticket number."),
        ([str(n) for n in range(1, 102)], "A batch holds at most 100 tickets; 101 were selected."),
    ],
)
def test_batch_bad_selection_is_a_400_form_error(client, tenant, tickets, error):
    client.force_login(member(tenant, Role.ADMIN))

    response = client.post(
        reverse("approvals:batch"), {"ticket": tickets, "decision": "approve"}, headers=HTMX
    )

    assert response.status_code == 400
    assert f'id="batch-problem">{error}<' in response.content.decode()


def test_batch_naming_another_tenants_ticket_is_400_and_leaks_nothing(client, tenant):
    other = TenantFactory(slug="bravo-corp", name="Bravo Confidential")
    theirs = pending_ticket(other, requested_by=member(other, Role.VIEWER, username="bravo-req"))
    client.force_login(member(tenant, Role.ADMIN))

    response = client.post(
        reverse("approvals:batch"), {"ticket": [theirs.pk], "decision": "reject"}, headers=HTMX
    )

    body = response.content.decode()
    assert response.status_code == 400
    assert f"No such ticket: #{theirs.pk}." in body
    assert "bravo" not in body.lower()
    assert Ticket.objects.get(pk=theirs.pk).status == TicketStatus.PENDING


def test_queue_rows_have_checkboxes_for_deciders_only(client, tenant, ticket):
    client.force_login(member(tenant, Role.APPROVER))
    as_approver = client.get(reverse("approvals:queue")).content.decode()
    client.force_login(member(tenant, Role.VIEWER, username="vera"))
    as_viewer = client.get(reverse("approvals:queue")).content.decode()

    checkbox = (
        f'<input type="checkbox" name="ticket" value="{ticket.pk}" form="batch-form" '
        'data-tool="deploy_release"'
    )
    assert checkbox in as_approver
    assert 'id="batch-form"' in as_approver
    assert checkbox not in as_viewer
    assert 'id="batch-form"' not in as_viewer


def test_queue_with_claims_stays_at_the_same_number_of_queries(
    client, tenant, django_assert_max_num_queries
):
    requester = member(tenant, Role.VIEWER, username="requester")
    alice = member(tenant, Role.APPROVER, username="alice")
    for ticket in releases(tenant, 3, requester):
        claims.claim(ticket, user=alice)
    client.force_login(member(tenant, Role.APPROVER))
    client.get(reverse("approvals:queue"))

    with django_assert_max_num_queries(12):
        response = client.get(reverse("approvals:queue"))

    assert response.content.decode().count("alice is on it") == 3
