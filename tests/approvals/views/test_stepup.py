"""Step-up on the ticket page: a risky approval is held, the second factor is asked for through
allauth's own page, and the approval completes afterwards with what was typed."""

from __future__ import annotations

import time
from datetime import timedelta
from urllib.parse import quote

import pytest
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import (
    TOTP,
    format_hotp_value,
    generate_totp_secret,
    hotp_value,
)
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.models import AuditEvent, Role, Ticket, TicketStatus, TicketVote
from approvals.policies.versions import save_policy
from approvals.views.stepup import PENDING_KEY
from tests.support import TenantFactory, member, paused_call

pytestmark = pytest.mark.django_db

PRODUCTION = {"release": "2026.07.24", "environment": "production"}
STAGING = {"release": "2026.07.24", "environment": "staging"}
REAUTH = reverse("mfa_reauthenticate")
RECORDS = "account_authentication_methods"


@pytest.fixture
def world():
    tenant = TenantFactory(slug="acme")
    admin = member(tenant, Role.ADMIN, username="ada")
    approver = member(tenant, Role.APPROVER, username="alice")
    save_policy(
        tenant=tenant,
        user=admin,
        tool_name="deploy_release",
        step_up_minutes=10,
        step_up_rules=[{"argument": "environment", "op": "eq", "value": "production"}],
    )
    return tenant, admin, approver


def with_totp(user) -> str:
    secret = generate_totp_secret()
    TOTP.activate(user, secret)
    return secret


def totp_code(secret: str) -> str:
    # RFC 6238: the HOTP of the current 30-second step.
    return format_hotp_value(hotp_value(secret, int(time.time()) // 30))


def ticket_for(tenant, arguments=PRODUCTION) -> Ticket:
    return Ticket.objects.get(run=paused_call(tenant, arguments))


def decide_url(ticket: Ticket) -> str:
    return reverse("approvals:decide", args=[ticket.pk])


def step_up_url(ticket: Ticket) -> str:
    return reverse("approvals:step-up", args=[ticket.pk])


def ticket_url(ticket: Ticket) -> str:
    return reverse("approvals:ticket", args=[ticket.pk])


def reauth_for(ticket: Ticket, view: str = REAUTH) -> str:
    return f"{view}?next={quote(step_up_url(ticket), safe='')}"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def proven(client: Client, user, *, minutes_ago: float, kind: str = "totp") -> None:
    """A second factor as allauth records it, proven minutes ago in this session."""
    session = client.session
    session[RECORDS] = [
        {"method": "password", "at": time.time() - 3600, "username": user.get_username()},
        {"method": "mfa", "at": time.time() - minutes_ago * 60, "type": kind, "id": 1},
    ]
    session["account_authentication_methods_user"] = str(user.pk)
    session.save()


def nothing_decided(ticket: Ticket) -> None:
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING
    assert TicketVote.objects.filter(ticket=ticket).count() == 0
    assert not AuditEvent.objects.filter(
        ticket_id=ticket.pk, action__in=["ticket.approved", "ticket.vote", "auth.step_up"]
    ).exists()


def test_staging_approves_directly(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant, STAGING)

    response = signed_in(approver).post(decide_url(ticket), {"decision": "approve"})

    assert response.status_code == 302
    assert response["Location"] == reverse("approvals:run", args=[ticket.run_id])
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


def test_a_production_approval_without_a_factor_is_held_and_sent_to_reauthenticate(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)

    response = client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})

    assert response.status_code == 302
    assert response["Location"] == reauth_for(ticket)
    nothing_decided(ticket)
    held = client.session[PENDING_KEY][str(ticket.pk)]
    assert (held["message"], held["always"], held["minutes"]) == ("Ship it.", False, 10)
    assert held["digest"] == ticket.arguments_digest
    assert held["expires"] - held["created"] == 600


def test_an_htmx_approval_is_sent_with_hx_redirect(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)

    response = signed_in(approver).post(
        decide_url(ticket), {"decision": "approve"}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 200
    assert response["HX-Redirect"] == reauth_for(ticket)
    nothing_decided(ticket)


def test_a_passkey_without_an_app_is_asked_on_the_passkey_page(world):
    tenant, _, approver = world
    Authenticator.objects.create(user=approver, type=Authenticator.Type.WEBAUTHN, data={})
    # allauth gives a passkey its recovery codes: they must not send the person to a code page.
    Authenticator.objects.create(
        user=approver, type=Authenticator.Type.RECOVERY_CODES, data={"seed": "00"}
    )
    ticket = ticket_for(tenant)

    response = signed_in(approver).post(decide_url(ticket), {"decision": "approve"})

    assert response["Location"] == reauth_for(ticket, reverse("mfa_reauthenticate_webauthn"))


def test_the_approval_completes_after_a_real_totp_reauthentication(world):
    tenant, _, approver = world
    secret = with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    held = client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})

    asked = client.get(held["Location"])
    confirmed = client.post(REAUTH, {"code": totp_code(secret), "next": step_up_url(ticket)})
    page = client.get(confirmed["Location"])
    nothing_decided(ticket)
    done = client.post(step_up_url(ticket))

    assert asked.status_code == 200
    assert confirmed.status_code == 302
    assert confirmed["Location"] == step_up_url(ticket)
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="complete-approval" autofocus' in text
    assert '<blockquote id="step-up-message">Ship it.</blockquote>' in text
    assert done.status_code == 302
    assert done["Location"] == ticket_url(ticket)
    ticket.refresh_from_db()
    assert (ticket.status, ticket.decided_by, ticket.decision_message) == (
        TicketStatus.APPROVED,
        approver,
        "Ship it.",
    )
    approved = AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.approved")
    assert approved.detail["message"] == "Ship it."
    assert approved.detail["step_up"]["type"] == "totp"
    step = AuditEvent.objects.get(action="auth.step_up")
    assert (step.tenant_id, step.actor_id, step.detail) == (
        tenant.pk,
        approver.pk,
        {"type": "totp", "purpose": f"to approve ticket #{ticket.pk}"},
    )
    assert str(ticket.pk) not in client.session[PENDING_KEY]
    after = client.get(ticket_url(ticket)).content.decode()
    assert f"Ticket #{ticket.pk} approved with your second factor." in after


def test_the_held_approval_is_used_once(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})
    proven(client, approver, minutes_ago=0)
    client.post(step_up_url(ticket))

    again = client.post(step_up_url(ticket), follow=True)

    assert "No approval of this ticket is waiting for a second factor" in again.content.decode()
    assert AuditEvent.objects.filter(ticket_id=ticket.pk, action="ticket.approved").count() == 1


def test_a_fresh_factor_approves_at_once(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    proven(client, approver, minutes_ago=3)

    response = client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})

    assert response.status_code == 302
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


def test_a_stale_factor_asks_again(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    proven(client, approver, minutes_ago=11)

    response = client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})

    assert response["Location"] == reauth_for(ticket)
    nothing_decided(ticket)


def test_completion_with_a_factor_gone_stale_asks_again(world, monkeypatch):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})
    proven(client, approver, minutes_ago=0)
    later = timezone.now() + timedelta(minutes=9, seconds=30)
    # The factor was proven a little before the approval was held: time moves past its window
    # while the held approval still has some of its own.
    proven(client, approver, minutes_ago=1)
    monkeypatch.setattr(timezone, "now", lambda: later)

    shown = client.get(step_up_url(ticket))
    sent = client.post(step_up_url(ticket))

    assert shown.status_code == sent.status_code == 302
    assert shown["Location"] == sent["Location"] == reauth_for(ticket)
    nothing_decided(ticket)
    assert str(ticket.pk) in client.session[PENDING_KEY]


def test_the_completion_page_decides_nothing_on_get(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    client.post(decide_url(ticket), {"decision": "approve"})
    proven(client, approver, minutes_ago=0)

    response = client.get(step_up_url(ticket))

    assert response.status_code == 200
    nothing_decided(ticket)


def test_a_held_approval_past_its_window_is_gone(world, monkeypatch):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    client.post(decide_url(ticket), {"decision": "approve"})
    later = timezone.now() + timedelta(minutes=11)
    monkeypatch.setattr(timezone, "now", lambda: later)

    response = client.get(step_up_url(ticket), follow=True)

    assert "No approval of this ticket is waiting" in response.content.decode()
    nothing_decided(ticket)


def test_completion_of_a_ticket_decided_meanwhile_says_so_and_keeps_the_message(world):
    tenant, admin, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})
    signed_in(admin).post(decide_url(ticket), {"decision": "reject", "message": "No."})
    proven(client, approver, minutes_ago=0)

    response = client.post(step_up_url(ticket))

    assert response.status_code == 409
    text = response.content.decode()
    assert "Already rejected by ada" in text
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.REJECTED


def test_completion_of_an_expired_ticket_says_so(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})
    Ticket.objects.filter(pk=ticket.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    proven(client, approver, minutes_ago=0)

    response = client.post(step_up_url(ticket))

    assert response.status_code == 409
    assert "this ticket expired at" in response.content.decode().lower()


def test_without_any_second_factor_the_page_says_how_to_set_one_up(world):
    tenant, _, approver = world
    ticket = ticket_for(tenant)
    client = signed_in(approver)

    response = client.post(decide_url(ticket), {"decision": "approve", "message": "Ship it."})

    assert response.status_code == 403
    text = response.content.decode()
    assert "you have none yet: set one up, then approve again" in text
    assert f'<a href="{reverse("mfa_index")}">Set up two-factor</a>' in text
    assert ">Ship it.</textarea>" in text
    assert PENDING_KEY not in client.session
    nothing_decided(ticket)


def test_a_rejection_needs_no_second_factor(world):
    tenant, _, approver = world
    ticket = ticket_for(tenant)

    response = signed_in(approver).post(
        decide_url(ticket), {"decision": "reject", "message": "Not today."}
    )

    assert response.status_code == 302
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.REJECTED


def test_the_ticket_page_says_a_factor_will_be_asked(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)

    text = signed_in(approver).get(ticket_url(ticket)).content.decode()

    assert (
        "Approving this needs a second factor (within 10 minutes): you will be asked for it" in text
    )
    assert "This approval needs a second factor confirmed within 10 minutes." in text


def test_the_ticket_page_says_when_the_factor_was_confirmed(world):
    tenant, _, approver = world
    with_totp(approver)
    ticket = ticket_for(tenant)
    client = signed_in(approver)
    proven(client, approver, minutes_ago=3.2)

    text = client.get(ticket_url(ticket)).content.decode()

    assert "You confirmed one 3 minutes ago." in text


def test_the_ticket_page_of_a_staging_call_says_nothing_of_a_factor(world):
    tenant, _, approver = world
    ticket = ticket_for(tenant, STAGING)

    text = signed_in(approver).get(ticket_url(ticket)).content.decode()

    assert 'id="step-up-notice"' not in text
    assert (
        "An approval needs a second factor confirmed within 10 minutes when "
        "environment == production: not this call." in text
    )


def test_the_completion_page_is_404_for_another_tenant(world):
    tenant, _, _ = world
    ticket = ticket_for(tenant)
    outsider = member(TenantFactory(), Role.APPROVER)

    assert signed_in(outsider).get(step_up_url(ticket)).status_code == 404
    assert signed_in(outsider).post(step_up_url(ticket)).status_code == 404


def test_a_batch_reports_the_step_up_ticket_as_needing_its_page(world):
    tenant, _, approver = world
    with_totp(approver)
    production = ticket_for(tenant)
    staging = ticket_for(tenant, STAGING)
    client = signed_in(approver)
    # Even a fresh factor: a batch approves nothing a policy wants a second factor for.
    proven(client, approver, minutes_ago=0)

    response = client.post(
        reverse("approvals:batch"),
        {"ticket": [production.pk, staging.pk], "decision": "approve"},
    )

    text = response.content.decode()
    assert response.status_code == 200
    assert '<h2 id="batch-summary">1 of 2 approved</h2>' in text
    assert "approve it from its ticket page." in text
    assert f'<a href="{ticket_url(production)}">#{production.pk}</a>' in text
    assert Ticket.objects.get(pk=staging.pk).status == TicketStatus.APPROVED
    nothing_decided(production)
