"""The sign-in journey of a release manager, end to end in Chromium.

Rita signs in through the OpenID Connect provider on loopback (tests.accounts.oidc_provider, its
own process; a member by the group her provider sends), enrols a passkey on Chromium's virtual
authenticator, approves a staging deploy with no second factor asked (the policy's step-up is
for production only), and approves a production deploy: the console holds it, asks for the
passkey, and completes the same approval with the message she typed. An auditor who signs in
with a local password then reads each step in the audit history.
"""

from __future__ import annotations

import re

import pytest
from allauth.mfa.models import Authenticator

from accounts.models import GroupRole
from approvals.models import AuditEvent, Membership, Role, Ticket, TicketStatus
from approvals.policies.versions import save_policy
from tests.accounts.oidc_provider import oidc_provider, oidc_server  # noqa: F401
from tests.browser.conftest import (
    approve_confirmed,
    chromium_skip_reason,
    new_page,
    passkey_page,
    screenshot,
    virtual_credentials,
)
from tests.browser.test_console import _sign_in, expect
from tests.browser.test_sso import sso_console  # noqa: F401
from tests.support import TenantFactory, member, paused_call

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

MESSAGE = "Go: the change window is open and the canary is green."


def _approve(page, ticket: Ticket, message: str = "") -> None:
    page.goto(f"/tickets/{ticket.pk}/")
    if message:
        page.fill("#id_message", message)
    approve_confirmed(page)


def test_sso_passkey_and_step_up_for_production_only(
    console_browser,
    sso_console,  # noqa: F811
    oidc_provider,  # noqa: F811
):
    console = sso_console
    tenant = TenantFactory(slug="acme", name="Acme")
    admin = member(tenant, Role.ADMIN, username="ops-admin")
    auditor = member(tenant, Role.AUDITOR, username="audrey")
    requester = member(tenant, Role.VIEWER, username="release-bot")
    GroupRole.objects.create(tenant=tenant, provider_id="sso", group="deployers", role="approver")
    save_policy(
        tenant=tenant,
        user=admin,
        tool_name="deploy_release",
        step_up_minutes=10,
        step_up_rules=[{"argument": "environment", "op": "eq", "value": "production"}],
    )
    staging = Ticket.objects.get(
        run=paused_call(
            tenant, {"release": "2026.12.02", "environment": "staging"}, requested_by=requester
        )
    )
    production = Ticket.objects.get(
        run=paused_call(
            tenant, {"release": "2026.12.02", "environment": "production"}, requested_by=requester
        )
    )
    oidc_provider.set_user(
        sub="idp-rita", preferred_username="rita", email="rita@example.com", groups=["deployers"]
    )

    with console_browser() as browser:
        page, authenticator = passkey_page(browser, console)

        # 1. Single sign-on: the provider's group makes her an approver.
        page.goto("/")
        expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
        page.get_by_role("button", name="Sign in with Test IdP").click()
        expect(page.locator(".whoami")).to_have_text("rita")

        # 2. A passkey: her provider's sign-in a moment ago is the proof allauth asks for.
        page.goto("/accounts/2fa/webauthn/add/")
        expect(page.locator("h1")).to_have_text("Add a passkey")
        page.fill("input[name=name]", "Rita's laptop")
        page.check("#id_passwordless")
        page.click("#mfa_webauthn_add")
        expect(page).not_to_have_url(re.compile(r"/webauthn/add/"))
        assert len(virtual_credentials(page, authenticator)) == 1

        # 3. Staging: approved at once, no second factor asked.
        _approve(page, staging)
        expect(page.locator(".flash")).to_contain_text(f"Ticket #{staging.pk} approved")

        # 4. Production: held, the passkey asked for, then the same approval completed.
        page.goto(f"/tickets/{production.pk}/")
        expect(page.locator("#step-up-notice")).to_contain_text("second factor")
        screenshot(page, "journey-production-ticket")
        _approve(page, production, MESSAGE)
        expect(page).to_have_url(re.compile(r"/accounts/2fa/webauthn/reauthenticate/"))
        screenshot(page, "journey-step-up-passkey")
        page.click("#mfa_webauthn_reauthenticate")
        expect(page).to_have_url(re.compile(rf"/tickets/{production.pk}/step-up/"))
        expect(page.locator("#step-up-message")).to_contain_text(MESSAGE)
        page.click("#complete-approval")
        expect(page.locator(".flash")).to_contain_text(f"Ticket #{production.pk} approved")
        screenshot(page, "journey-production-approved")

        # 5. The auditor, with a local password, reads each step in the history.
        history = new_page(browser, console)
        _sign_in(history, auditor.username)
        history.goto("/audit/?tenant=acme")
        rows = history.locator("#audit-rows")
        for sentence in (
            "rita signed in with sso",
            "rita added a two-factor method: webauthn",
            f"rita approved deploy_release on ticket #{staging.pk}",
            f"rita confirmed a second factor (webauthn) to approve ticket #{production.pk}",
            f"rita approved deploy_release on ticket #{production.pk}",
        ):
            expect(rows).to_contain_text(sentence)
        screenshot(history, "journey-audit-history")

    rita = Membership.objects.get(tenant=tenant, user__username="rita")
    assert rita.role == Role.APPROVER
    assert Authenticator.objects.filter(user=rita.user, type="webauthn").count() == 1
    staging.refresh_from_db()
    production.refresh_from_db()
    assert (staging.status, staging.decided_by_id) == (TicketStatus.APPROVED, rita.user_id)
    assert (production.status, production.decided_by_id) == (TicketStatus.APPROVED, rita.user_id)
    assert production.decision_message == MESSAGE

    events = list(AuditEvent.objects.filter(tenant=tenant, actor=rita.user).order_by("seq"))
    steps = [(e.action, e.ticket_id) for e in events]
    actions = [action for action, _ in steps]
    assert actions.index("auth.signed_in") < actions.index("mfa.enrolled")
    assert actions.index("mfa.enrolled") < steps.index(("ticket.approved", staging.pk))
    step_up = next(e for e in events if e.action == "auth.step_up")
    assert step_up.detail["type"] == "webauthn"
    assert steps.index(("ticket.approved", staging.pk)) < actions.index("auth.step_up")
    assert actions.index("auth.step_up") < steps.index(("ticket.approved", production.pk))
    signed_in = next(e for e in events if e.action == "auth.signed_in")
    assert (signed_in.detail["method"], signed_in.detail["provider"]) == ("sso", "sso")
    approvals = {e.ticket_id: e.detail for e in events if e.action == "ticket.approved"}
    assert "step_up" not in approvals[staging.pk]
    assert approvals[production.pk]["step_up"]["type"] == "webauthn"
