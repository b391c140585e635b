"""The tenant rule "deciders must have two-factor": the ticket page, the batch and the API refuse
with the same sentence, and pass once the person has a second factor; viewers are unaffected."""

from __future__ import annotations

import pytest
from allauth.mfa.models import Authenticator
from allauth.mfa.recovery_codes.internal.auth import RecoveryCodes
from django.urls import reverse

from approvals.decisions import factors
from approvals.decisions.decide import decide
from approvals.decisions.errors import NotAllowedError, TwoFactorRequiredError
from approvals.models import AuditEvent, Role, Ticket, TicketStatus
from tests.support import TenantFactory, api_token, bearer, give_totp, member, pending_ticket

pytestmark = pytest.mark.django_db

REASON = (
    "Set up two-factor on your page (/accounts/2fa/) before deciding: "
    "this team asks deciders for it."
)


@pytest.fixture
def tenant():
    return TenantFactory(slug="acme", deciders_need_two_factor=True)


@pytest.fixture
def ticket(tenant):
    return pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER, username="requester"))


def test_decide_without_a_second_factor_is_refused_with_what_to_do(tenant, ticket):
    approver = member(tenant, Role.APPROVER, username="alice")

    with pytest.raises(TwoFactorRequiredError) as refused:
        decide(ticket, user=approver, approve=True)

    assert refused.value.sentence() == REASON
    assert refused.value.status == 403
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert not AuditEvent.objects.filter(action="ticket.approved").exists()


def test_decide_with_totp_passes(tenant, ticket):
    approver = member(tenant, Role.APPROVER, username="alice")
    give_totp(approver)

    decided = decide(ticket, user=approver, approve=True)

    assert decided.status == TicketStatus.APPROVED


def test_decide_in_a_tenant_that_does_not_ask_needs_no_second_factor():
    tenant = TenantFactory(slug="calm")
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER, username="rq"))

    decided = decide(ticket, user=member(tenant, Role.APPROVER), approve=False)

    assert decided.status == TicketStatus.REJECTED


def test_a_viewer_is_refused_for_the_role_not_the_second_factor(tenant, ticket):
    viewer = member(tenant, Role.VIEWER, username="vic")

    with pytest.raises(NotAllowedError) as refused:
        decide(ticket, user=viewer, approve=False)

    assert not isinstance(refused.value, TwoFactorRequiredError)
    assert (
        factors.lacks_second_factor(viewer.memberships.get(), tenant=tenant, user=viewer) is False
    )


def test_recovery_codes_alone_are_no_second_factor(tenant):
    approver = member(tenant, Role.APPROVER, username="alice")
    RecoveryCodes.activate(approver)

    assert factors.has_second_factor(approver) is False


# --- the ticket page -------------------------------------------------------------------------


def test_ticket_page_shows_a_callout_instead_of_the_decision_form(client, tenant, ticket):
    client.force_login(member(tenant, Role.APPROVER, username="alice"))

    body = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()

    assert 'id="two-factor-needed"' in body
    assert 'href="/accounts/2fa/">Set up two-factor</a>' in body
    assert 'id="decide-form"' not in body


def test_ticket_page_decide_is_refused_403_with_the_reason(client, tenant, ticket):
    client.force_login(member(tenant, Role.APPROVER, username="alice"))

    response = client.post(
        reverse("approvals:decide", args=[ticket.pk]), {"decision": "approve", "message": ""}
    )

    assert response.status_code == 403
    assert REASON in response.content.decode()
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


def test_ticket_page_with_totp_shows_the_form_and_decides(client, tenant, ticket):
    approver = member(tenant, Role.APPROVER, username="alice")
    give_totp(approver)
    client.force_login(approver)

    body = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()
    response = client.post(
        reverse("approvals:decide", args=[ticket.pk]), {"decision": "approve", "message": ""}
    )

    assert 'id="decide-form"' in body
    assert 'id="two-factor-needed"' not in body
    assert response.status_code == 302
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


def test_ticket_page_of_a_viewer_shows_no_two_factor_callout(client, tenant, ticket):
    client.force_login(member(tenant, Role.VIEWER, username="vic"))

    body = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()

    assert 'id="two-factor-needed"' not in body
    assert "can view tickets but not decide them" in body


# --- the queue and the batch -----------------------------------------------------------------


def test_queue_shows_the_callout_and_no_batch_bar(client, tenant, ticket):
    client.force_login(member(tenant, Role.APPROVER, username="alice"))

    body = client.get(reverse("approvals:queue")).content.decode()

    assert 'id="two-factor-needed"' in body
    assert "Acme asks deciders for a second factor" in body
    assert 'id="batch-form"' not in body


def test_queue_with_totp_shows_the_batch_bar(client, tenant, ticket):
    approver = member(tenant, Role.APPROVER, username="alice")
    give_totp(approver)
    client.force_login(approver)

    body = client.get(reverse("approvals:queue")).content.decode()

    assert 'id="two-factor-needed"' not in body
    assert 'id="batch-form"' in body


def test_batch_reports_the_reason_per_ticket_then_passes_with_totp(client, tenant, ticket):
    approver = member(tenant, Role.APPROVER, username="alice")
    client.force_login(approver)
    batch = {"ticket": [ticket.pk], "decision": "reject", "message": "no"}

    refused = client.post(reverse("approvals:batch"), batch, headers={"HX-Request": "true"})
    give_totp(approver)
    passed = client.post(reverse("approvals:batch"), batch, headers={"HX-Request": "true"})

    assert refused.status_code == 200
    assert f'id="batch-ticket-{ticket.pk}"' in refused.content.decode()
    assert REASON in refused.content.decode()
    assert '<h2 id="batch-summary">1 of 1 rejected</h2>' in passed.content.decode()
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.REJECTED


# --- the API ---------------------------------------------------------------------------------


def test_api_decision_is_403_with_the_reason_then_passes_with_totp(client, tenant, ticket):
    approver = member(tenant, Role.APPROVER, username="alice")
    _, secret = api_token(tenant, "tickets:decide", user=approver)
    url = f"/api/v1/tickets/{ticket.pk}/decision"
    body = {"decision": "approve", "arguments_digest": ticket.arguments_digest}

    refused = client.post(url, body, content_type="application/json", headers=bearer(secret))
    give_totp(approver)
    passed = client.post(url, body, content_type="application/json", headers=bearer(secret))

    assert refused.status_code == 403
    assert refused.json() == {"detail": REASON, "code": "two_factor_required"}
    assert passed.status_code == 200
    assert passed.json()["status"] == "approved"


# --- what a person's page shows of their second factors -------------------------------------


def _passkey(user, name: str) -> Authenticator:
    return Authenticator.objects.create(
        user=user,
        type=Authenticator.Type.WEBAUTHN,
        data={"name": name, "credential": {}, "passwordless": True},
    )


def test_factors_of_a_person_with_none_is_all_off(tenant):
    nobody = member(tenant, Role.APPROVER, username="nobody")

    assert factors.factors_of(nobody) == factors.Factors(
        totp=False, passkeys=0, recovery_codes_left=None
    )
    assert factors.factors_of(nobody).enabled is False


def test_factors_of_counts_each_kind_and_the_unused_recovery_codes(tenant):
    both = member(tenant, Role.APPROVER, username="both")
    _, codes = give_totp(both)
    _passkey(both, "laptop")
    _passkey(both, "phone")
    RecoveryCodes(Authenticator.objects.get(user=both, type="recovery_codes")).validate_code(
        codes[0]
    )

    assert factors.factors_of(both) == factors.Factors(
        totp=True, passkeys=2, recovery_codes_left=len(codes) - 1
    )


def test_factors_of_passkeys_alone_are_enabled_without_an_app(tenant):
    keys_only = member(tenant, Role.APPROVER, username="keys-only")
    _passkey(keys_only, "laptop")

    found = factors.factors_of(keys_only)

    assert (found.totp, found.passkeys, found.recovery_codes_left) == (False, 1, None)
    assert found.enabled is True
