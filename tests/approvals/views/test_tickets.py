"""The ticket page: the exact call, its verified digest, and a diff with the last approval."""

from __future__ import annotations

import copy
import re

import pytest
from django.urls import reverse

from approvals.core.presenters import ArgRow, Change
from approvals.decisions.decide import decide
from approvals.models import Role, Run, Ticket
from tests.support import TenantFactory, caller_run, member, pending_ticket

pytestmark = pytest.mark.django_db

APPROVE_BUTTON = 'name="decision" value="approve"'
REJECT_BUTTON = 'name="decision" value="reject"'


def page(client, ticket: Ticket, **kwargs):
    return client.get(reverse("approvals:ticket", args=[ticket.pk]), **kwargs)


def test_ticket_shows_the_arguments_table(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.APPROVER))

    response = page(client, ticket)

    assert response.status_code == 200
    assert response.context["arguments"] == [
        ArgRow("environment", '"production"', "text"),
        ArgRow("release", '"2026.07.24"', "text"),
    ]
    body = response.content.decode()
    assert '<th scope="row">release</th>' in body
    # Text is quoted, so it never reads as a number or a boolean.
    assert (
        '<span class="type">text</span> <code class="value">&quot;2026.07.24&quot;</code>' in body
    )
    assert '<span class="tool">deploy_release</span>' in body


def test_ticket_digest_verified_against_the_stored_state(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.APPROVER))

    response = page(client, ticket)

    assert response.context["check"].ok is True
    body = response.content.decode()
    assert "<strong>Digest verified.</strong>" in body
    assert f"sha256:{ticket.arguments_digest}" in body
    assert APPROVE_BUTTON in body
    assert REJECT_BUTTON in body


def test_ticket_first_call_of_a_tool_has_nothing_to_compare_with(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.APPROVER))

    response = page(client, ticket)

    assert response.context["previous"] is None
    assert "nothing to compare with" in response.content.decode()


def test_ticket_diff_against_the_last_approved_call_of_the_same_tool(client):
    tenant = TenantFactory()
    requester = member(tenant, Role.VIEWER)
    approver = member(tenant, Role.APPROVER)
    earlier = pending_ticket(tenant, requested_by=requester)
    decide(earlier, user=approver, approve=True)
    ticket = pending_ticket(
        tenant, requested_by=requester, prompt="Deploy release 2026.07.25 to production"
    )
    client.force_login(approver)

    response = page(client, ticket)

    assert response.context["previous"] == earlier
    assert response.context["changes"] == [
        Change("release", "changed", '"2026.07.24"', '"2026.07.25"')
    ]
    body = response.content.decode()
    assert "<del>&quot;2026.07.24&quot;</del> → <ins>&quot;2026.07.25&quot;</ins>" in body
    assert f"approved by {approver.username}" in body


def approved(tenant, prompt: str, *, approver) -> Ticket:
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER), prompt=prompt)
    decide(ticket, user=approver, approve=True)
    ticket.refresh_from_db()
    return ticket


def test_ticket_diff_compares_with_the_last_approval_for_the_same_environment(client):
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER, username="rita")
    staging = approved(tenant, "Deploy release 2026.07.23 to staging", approver=approver)
    # The newest approval is for production: a staging deploy must not be compared with it.
    approved(tenant, "Deploy release 2026.07.24 to production", approver=approver)
    ticket = pending_ticket(tenant, prompt="Deploy release 2026.07.25 to staging")
    client.force_login(approver)

    response = page(client, ticket)

    assert response.context["previous"] == staging
    assert response.context["baseline"].target == {"environment": "staging"}
    assert response.context["changes"] == [
        Change("release", "changed", '"2026.07.23"', '"2026.07.25"')
    ]
    body = response.content.decode()
    assert "&quot;production&quot;" not in body
    assert (
        f'Compared with <a href="/tickets/{staging.pk}/">#{staging.pk}</a>, approved by rita on '
        f'<time datetime="{staging.decided_at:%Y-%m-%dT%H:%M:%S}'
    ) in body
    assert "for environment &quot;staging&quot;</h3>" in body
    # One diff, against one ticket.
    assert body.count('id="diff"') == 1
    assert body.count('class="diff"') == 1


def test_ticket_with_no_approval_for_its_environment_has_nothing_to_compare_with(client):
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER)
    approved(tenant, "Deploy release 2026.07.24 to production", approver=approver)
    ticket = pending_ticket(tenant, prompt="Deploy release 2026.07.25 to staging")
    client.force_login(approver)

    response = page(client, ticket)

    assert response.context["previous"] is None
    assert (
        "No call of this tool for the same environment was approved in "
        f"{tenant.name} before: nothing to compare with."
    ) in response.content.decode()


def test_ticket_tool_declared_without_a_target_compares_with_any_call(client, settings):
    agents = copy.deepcopy(settings.APPROVALS_AGENTS)
    agents["release"]["1"]["targets"] = {"deploy_release": []}
    settings.APPROVALS_AGENTS = agents
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER)
    production = approved(tenant, "Deploy release 2026.07.24 to production", approver=approver)
    ticket = pending_ticket(tenant, prompt="Deploy release 2026.07.25 to staging")
    client.force_login(approver)

    response = page(client, ticket)

    assert response.context["previous"] == production
    assert response.context["baseline"].target == {}


def test_ticket_decided_compares_with_what_was_approved_before_its_decision(client):
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER)
    first = approved(tenant, "Deploy release 2026.07.24 to production", approver=approver)
    ticket = approved(tenant, "Deploy release 2026.07.25 to production", approver=approver)
    approved(tenant, "Deploy release 2026.07.26 to production", approver=approver)
    client.force_login(approver)

    response = page(client, ticket)

    assert response.context["previous"] == first


def test_ticket_diff_ignores_approvals_in_another_tenant(client):
    tenant, other = TenantFactory(), TenantFactory()
    foreign = pending_ticket(other, requested_by=member(other, Role.VIEWER))
    decide(foreign, user=member(other, Role.APPROVER), approve=True)
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.APPROVER))

    response = page(client, ticket)

    assert response.context["previous"] is None


def test_ticket_of_another_tenant_is_404(client):
    tenant, other = TenantFactory(), TenantFactory()
    ticket = pending_ticket(tenant)
    client.force_login(member(other, Role.ADMIN))

    response = page(client, ticket)

    assert response.status_code == 404


@pytest.mark.parametrize("forged", [999999, 2**63, 10**30])
def test_ticket_forged_id_is_404(client, forged):
    client.force_login(member(TenantFactory(), Role.ADMIN))

    # Beyond any integer column too: no ticket, not an error.
    response = client.get(reverse("approvals:ticket", args=[forged]))

    assert response.status_code == 404


def test_ticket_requester_sees_reject_but_no_approve_button(client):
    tenant = TenantFactory()
    requester = member(tenant, Role.APPROVER)
    ticket = pending_ticket(tenant, requested_by=requester)
    client.force_login(requester)

    response = page(client, ticket)

    body = response.content.decode()
    assert response.context["may_approve"] is False
    assert APPROVE_BUTTON not in body
    assert REJECT_BUTTON in body
    assert "You requested this call, so someone else must approve it." in body


def test_ticket_viewer_sees_no_decision_form(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = page(client, ticket)

    body = response.content.decode()
    assert response.status_code == 200
    assert 'id="decide-form"' not in body
    assert APPROVE_BUTTON not in body
    assert "Your role (viewer) can view tickets but not decide them." in body


def test_ticket_auditor_sees_no_decision_form(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant)
    client.force_login(member(tenant, Role.AUDITOR))

    response = page(client, ticket)

    assert 'id="decide-form"' not in response.content.decode()


def test_ticket_tampered_digest_shows_the_mismatch_and_no_approve_button(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    Ticket.objects.filter(pk=ticket.pk).update(arguments_digest="f" * 64)
    client.force_login(member(tenant, Role.APPROVER))

    response = page(client, ticket)

    body = response.content.decode()
    assert response.context["check"].ok is False
    assert "Digest mismatch: approval is disabled." in body
    assert "f" * 64 in body
    assert APPROVE_BUTTON not in body


def test_ticket_tampered_arguments_show_which_fields_differ(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    Ticket.objects.filter(pk=ticket.pk).update(
        arguments_json='{"environment":"staging","release":"2026.07.24"}',
        arguments_digest="f" * 64,
    )
    client.force_login(member(tenant, Role.APPROVER))

    response = page(client, ticket)

    assert response.context["check"].differences == [
        Change("environment", "changed", '"staging"', '"production"')
    ]
    assert (
        "<del>&quot;staging&quot;</del> <ins>&quot;production&quot;</ins>"
        in response.content.decode()
    )


def test_ticket_tampered_digest_still_offers_reject(client):
    # The page tells the approver to "Reject it", and the decide view accepts a rejection.
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    Ticket.objects.filter(pk=ticket.pk).update(arguments_digest="f" * 64)
    client.force_login(member(tenant, Role.APPROVER))

    response = page(client, ticket)

    body = response.content.decode()
    assert "Approval is disabled: the arguments do not verify." in body
    assert REJECT_BUTTON in body
    assert 'value="approve"' not in body


def test_ticket_decided_shows_who_decided(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    approver = member(tenant, Role.APPROVER, username="carol")
    decide(ticket, user=approver, approve=False, message="Not today.")
    client.force_login(approver)

    response = page(client, ticket)

    body = response.content.decode()
    assert "<strong>Rejected</strong> by carol at" in body
    assert "<blockquote>Not today.</blockquote>" in body
    assert 'id="decide-form"' not in body


def test_ticket_htmx_request_for_decision_returns_the_partial_only(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.APPROVER))

    response = page(client, ticket, headers={"HX-Request": "true", "HX-Target": "decision"})

    body = response.content.decode().strip()
    assert body.startswith('<section class="card decision" id="decision"')
    assert "<html" not in body
    assert APPROVE_BUTTON in body


def test_ticket_post_is_refused(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant)
    client.force_login(member(tenant, Role.APPROVER))

    response = client.post(reverse("approvals:ticket", args=[ticket.pk]))

    assert response.status_code == 405


# --- what the page says follows the ticket ------------------------------------------------------


def test_ticket_head_rereads_alone_and_follows_the_decision(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.VIEWER))
    decide(ticket, user=member(tenant, Role.APPROVER, username="rm-alice"), approve=True)

    response = page(client, ticket, headers={"HX-Request": "true", "HX-Target": "ticket-head"})

    body = response.content.decode().strip()
    assert response.status_code == 200
    assert body.startswith('<div class="page-head" id="ticket-head"')
    assert 'id="ticket-status" data-status="approved">Approved</span>' in body
    assert 'hx-trigger="console:changed from:body"' in body
    assert "<html" not in body


def test_ticket_decided_shows_when_and_by_whom_and_no_expiry(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.VIEWER))
    before = page(client, ticket).content.decode()
    decide(ticket, user=member(tenant, Role.APPROVER, username="rm-alice"), approve=True)
    ticket.refresh_from_db()

    body = page(client, ticket).content.decode()

    assert "<dt>Expires</dt>" in before
    assert "<dt>Expires</dt>" not in body
    assert "data-countdown" not in body
    assert (
        f'<dt>Decided</dt><dd id="ticket-decided">approved by rm-alice at '
        f'<time datetime="{ticket.decided_at:%Y-%m-%dT%H:%M:%S}'
    ) in body


def test_ticket_of_a_run_that_cannot_resume_warns_and_offers_only_reject(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    Run.objects.filter(pk=ticket.run_id).update(agent_version="9")
    client.force_login(member(tenant, Role.APPROVER))

    body = page(client, ticket).content.decode()

    assert 'id="resume-blocked"' in body
    assert "Agent &#x27;release&#x27; version &#x27;9&#x27; is not deployed (deployed: 1)." in body
    assert "Reject the call with a message" in body
    assert "ask an admin to deploy agent <strong>release</strong> v9" in body
    assert APPROVE_BUTTON not in body
    assert REJECT_BUTTON in body
    assert 'id="edit-and-approve"' not in body
    assert 'data-hint="a"' not in body
    assert 'data-hint="r"' in body


def test_ticket_of_a_run_in_an_unknown_sdk_schema_warns(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    Run.objects.filter(pk=ticket.run_id).update(schema_version="0.1")
    client.force_login(member(tenant, Role.APPROVER))

    body = page(client, ticket).content.decode()

    assert "The state was written in SDK schema &#x27;0.1&#x27;" in body
    assert APPROVE_BUTTON not in body


def test_ticket_of_a_callers_run_of_an_agent_the_console_lacks_offers_approve(client):
    """The caller resumes its own run, so an agent this console has not installed blocks
    nothing."""
    tenant = TenantFactory()
    ticket = Ticket.objects.get(run=caller_run(tenant, requested_by=member(tenant, Role.VIEWER)))
    Run.objects.filter(pk=ticket.run_id).update(agent_key="pipeline-release")
    client.force_login(member(tenant, Role.APPROVER))

    body = page(client, ticket).content.decode()

    assert 'id="resume-blocked"' not in body
    assert APPROVE_BUTTON in body
    assert REJECT_BUTTON in body


# --- keyboard hints: only what works here, for this person --------------------------------------


def hints(body: str) -> list[str]:
    return re.findall(r'data-hint="([^"]+)"', body)


def test_ticket_keys_for_an_approver_are_approve_reject_and_claim(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.APPROVER))

    assert hints(page(client, ticket).content.decode()) == ["a", "r", "Esc", "c"]


@pytest.mark.parametrize("role", [Role.VIEWER, Role.AUDITOR])
def test_ticket_keys_for_who_cannot_decide_are_none(client, role):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, role))

    body = page(client, ticket).content.decode()

    assert hints(body) == []
    assert "<kbd>a</kbd>" not in body
    assert "<kbd>r</kbd>" not in body


def test_ticket_keys_for_the_requester_leave_out_approve(client):
    tenant = TenantFactory()
    requester = member(tenant, Role.APPROVER)
    ticket = pending_ticket(tenant, requested_by=requester)
    client.force_login(requester)

    assert hints(page(client, ticket).content.decode()) == ["r", "Esc", "c"]


def test_ticket_keys_of_a_decided_ticket_are_none_and_follow_the_reread(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.APPROVER))
    decide(ticket, user=member(tenant, Role.APPROVER), approve=True)

    full = page(client, ticket).content.decode()
    partial = page(
        client, ticket, headers={"HX-Request": "true", "HX-Target": "decision"}
    ).content.decode()

    assert hints(full) == []
    # The decision box's re-read carries the hints along, out of band, so they stay true.
    assert '<span id="keys-decision" hx-swap-oob="true"></span>' in partial
