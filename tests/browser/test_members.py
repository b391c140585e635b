"""The Team page in a real browser, at 1280 and 390 px: an admin adds a member, changes a role
and invites by email; the invitee opens the email's link on a phone, makes an account and
lands on their own page as a member."""

from __future__ import annotations

import re

import pytest

from approvals.models import AuditEvent, Invitation, Membership
from tests.browser.conftest import chromium_skip_reason, new_page, screenshot
from tests.browser.test_console import _sign_in, expect
from tests.support import TenantFactory, UserFactory, member, wait_until

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

NEW_PASSWORD = "a-long-new-pass-2026"
NO_SIDEWAYS_SCROLL = "document.documentElement.scrollWidth <= window.innerWidth"


def _no_sideways_scroll(page) -> None:
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert page.evaluate(NO_SIDEWAYS_SCROLL), f"{page.url} scrolls sideways: {widths}"


def _emailed_link(console) -> str:
    """The invitation link in the email the server printed (the console mail backend)."""
    web = console.processes[0]
    found = wait_until(
        lambda: re.search(r"https?://[^/\s]+(/invitations/[\w-]+/)", web.output()),
        timeout=15,
        what="the invitation email in the server's output",
    )
    return found.group(1)


def test_admin_adds_changes_a_role_invites_and_the_invitee_accepts(
    console_browser, live_server_only
):
    tenant = TenantFactory(slug="acme", name="Acme")
    admin = member(tenant, "admin", username="ops-admin")
    member(tenant, "viewer", username="vic")
    UserFactory(username="newbie", email="newbie@example.com")

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in(page, admin.username)
        page.click("nav >> text=Team")
        expect(page.locator("h1")).to_have_text("Team · Acme")
        _no_sideways_scroll(page)

        page.fill("#id_user", "newbie@example.com")
        page.select_option("#add-member select[name=role]", "approver")
        page.click("#add-member button[type=submit]")
        expect(page.locator(".flash")).to_have_text("Added newbie to Acme as approver.")
        expect(page.locator('tr[data-member="newbie"] select')).to_have_value("approver")

        vic_row = page.locator('tr[data-member="vic"]')
        vic_row.locator("select").select_option("auditor")
        vic_row.locator("button", has_text="Change").click()
        expect(page.locator(".flash")).to_have_text("vic is now auditor.")

        page.fill("#id_email", "nina@example.com")
        page.select_option("#invite select[name=role]", "approver")
        page.click("#invite button[type=submit]")
        expect(page.locator(".flash")).to_contain_text("Invited nina@example.com as approver")
        expect(page.locator('tr[data-invitation="nina@example.com"]')).to_be_visible()
        _no_sideways_scroll(page)
        screenshot(page, "members-1280", docs="members-1280")

        page.set_viewport_size({"width": 390, "height": 844})
        page.reload()
        _no_sideways_scroll(page)
        screenshot(page, "members-390", docs="members-390")

        link = _emailed_link(live_server_only)
        phone = browser.new_context(
            base_url=live_server_only.url, viewport={"width": 390, "height": 844}
        ).new_page()
        phone.goto(link)
        expect(phone.locator("h1")).to_have_text("Join Acme")
        _no_sideways_scroll(phone)
        screenshot(phone, "invitation-390")
        phone.fill("#id_username", "nina")
        phone.fill("#id_password", NEW_PASSWORD)
        phone.fill("#id_password_again", NEW_PASSWORD)
        phone.click("#accept")
        expect(phone).to_have_url(re.compile(r"/me/$"))
        expect(phone.locator(".flash")).to_have_text("Welcome to Acme: you are approver.")
        expect(phone.locator('tr[data-tenant="acme"]')).to_contain_text("Approver")
        expect(phone.locator(".whoami")).to_have_text("nina")
        _no_sideways_scroll(phone)
        screenshot(phone, "me-390")

        # The link works once.
        phone.goto(link)
        expect(phone.locator("#invitation-problem")).to_contain_text("already used")

        page.reload()
        expect(page.locator('tr[data-member="nina"] select')).to_have_value("approver")
        expect(page.locator('tr[data-invitation="nina@example.com"]')).to_have_count(0)
        page.locator('tr[data-member="vic"] a', has_text="Remove").click()
        expect(page.locator("h1")).to_have_text("Remove vic from Acme?")
        _no_sideways_scroll(page)
        page.click("#confirm-remove")
        expect(page.locator(".flash")).to_have_text("Removed vic from Acme.")

    roles = dict(Membership.objects.filter(tenant=tenant).values_list("user__username", "role"))
    assert roles == {"ops-admin": "admin", "newbie": "approver", "nina": "approver"}
    assert Invitation.objects.get().accepted_by.username == "nina"
    assert list(
        AuditEvent.objects.filter(tenant=tenant, action__regex=r"^(member|invitation)\.")
        .order_by("seq")
        .values_list("action", flat=True)
    ) == [
        "member.added",
        "member.role_changed",
        "invitation.sent",
        "member.added",
        "invitation.accepted",
        "member.removed",
    ]
