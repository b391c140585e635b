"""Single sign-on in a real browser: "Sign in with Test IdP" on /login/ goes through the
OpenID Connect provider on loopback (tests.accounts.oidc_provider, its own process) with the
authorization code and PKCE, and lands on the queue signed in, a member by a mapped group; the
tenant's admin then sees the Sign-in page at 1280 and 390 px."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from accounts.models import GroupGrant, GroupRole
from approvals.models import AuditEvent, Membership, Role
from devtools.processes import Processes, start_web
from tests.accounts.oidc_provider import oidc_provider, oidc_server  # noqa: F401
from tests.browser.conftest import (
    ARTIFACTS,
    LiveConsole,
    chromium_skip_reason,
    new_page,
    screenshot,
)
from tests.browser.test_console import _sign_in, expect
from tests.conftest import subprocess_env
from tests.support import TenantFactory, member

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]
NO_SIDEWAYS_SCROLL = "document.documentElement.scrollWidth <= window.innerWidth"


@pytest.fixture
def sso_console(request, browser_users, oidc_provider) -> Iterator[LiveConsole]:  # noqa: F811
    """The ASGI server, configured (APPROVALS_OIDC_*) to sign in through the test provider."""
    logs = ARTIFACTS / "logs"
    env = subprocess_env(LOG_LEVEL="INFO", **oidc_provider.env())
    procs = Processes(logs)
    try:
        url, _ = start_web(procs, env, log=logs / f"{request.node.name}-server.log")
        yield LiveConsole(url, procs.started)
    finally:
        procs.stop_all(kill=True)


def test_sign_in_with_the_provider_lands_on_the_queue(
    console_browser,
    sso_console,
    oidc_provider,  # noqa: F811
):
    tenant = TenantFactory(slug="acme", name="Acme")
    admin = member(tenant, Role.ADMIN, username="ops-admin")
    GroupRole.objects.create(tenant=tenant, provider_id="sso", group="deployers", role="approver")
    oidc_provider.set_user(
        sub="b-1", preferred_username="rita", email="rita@example.com", groups=["deployers"]
    )

    with console_browser() as browser:
        page = new_page(browser, sso_console)
        page.goto("/")
        expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
        page.get_by_role("button", name="Sign in with Test IdP").click()
        expect(page).to_have_url(re.compile(r"/$"))
        expect(page.locator("h1")).to_have_text("Waiting for a decision")
        expect(page.locator(".whoami")).to_have_text("rita")
        screenshot(page, "sso-signed-in")

        admin_page = new_page(browser, sso_console)
        _sign_in(admin_page, admin.username)
        admin_page.goto("/team/members/?tenant=acme")
        admin_page.click("#sign-in-link")
        expect(admin_page.locator("h1")).to_have_text("Sign-in · Acme")
        expect(admin_page.locator('#mappings tr[data-group="deployers"]')).to_be_visible()
        admin_page.fill("#id_group", "release-managers")
        admin_page.select_option("#add-mapping select[name=role]", "admin")
        admin_page.click("#add-mapping button[type=submit]")
        expect(admin_page.locator(".flash")).to_contain_text("release-managers")
        screenshot(admin_page, "sso-sign-in-settings-1280")
        admin_page.set_viewport_size({"width": 390, "height": 844})
        admin_page.reload()
        assert admin_page.evaluate(NO_SIDEWAYS_SCROLL)
        screenshot(admin_page, "sso-sign-in-settings-390")

    rita = Membership.objects.get(tenant=tenant, user__username="rita")
    assert rita.role == Role.APPROVER
    assert GroupGrant.objects.filter(tenant=tenant, user=rita.user).exists()
    signed = AuditEvent.objects.get(tenant=tenant, action="auth.signed_in", actor=rita.user)
    assert (signed.detail["method"], signed.detail["provider"]) == ("sso", "sso")
    assert GroupRole.objects.filter(tenant=tenant, group="release-managers", role="admin").exists()


def test_an_invitee_on_a_phone_joins_through_the_provider(
    console_browser,
    sso_console,
    oidc_provider,  # noqa: F811
):
    from approvals import invitations

    tenant = TenantFactory(slug="acme", name="Acme")
    admin = member(tenant, Role.ADMIN, username="ops-admin")
    sent = invitations.invite(tenant=tenant, email="ivy@example.com", role="viewer", actor=admin)
    path = "/" + sent.link.split("/", 3)[3]
    oidc_provider.set_user(sub="b-2", preferred_username="ivy", email="ivy@example.com")

    with console_browser() as browser:
        page = new_page(browser, sso_console)
        page.set_viewport_size({"width": 390, "height": 844})
        page.goto(path)
        expect(page.locator("h1")).to_have_text("Join Acme")
        assert page.evaluate(NO_SIDEWAYS_SCROLL)
        screenshot(page, "sso-invitation-390")
        page.get_by_role("button", name="Sign in with Test IdP").focus()
        page.keyboard.press("Enter")
        expect(page).to_have_url(re.compile(r"/me/$"))
        expect(page.locator("#my-tenants tr[data-tenant=acme]")).to_contain_text("Viewer")
        expect(page.locator("#sso-links")).to_contain_text("Test IdP: linked.")
        screenshot(page, "sso-me-390")

    ivy = Membership.objects.get(tenant=tenant, user__username="ivy")
    assert ivy.role == Role.VIEWER
    accepted = AuditEvent.objects.get(tenant=tenant, action="invitation.accepted")
    assert accepted.actor == ivy.user
    added = AuditEvent.objects.filter(tenant=tenant, action="member.added").latest("seq")
    assert added.detail["via"] == "sso"
