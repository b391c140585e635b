"""Sessions in a real browser, at 1280 and 390 px: a person signs out their other session from
their own page (keyboard only), and a member removed by an admin sees, on the page they had
open, that they were signed out; neither page keeps reconnecting."""

from __future__ import annotations

import re

import pytest

from approvals.models import AuditEvent
from tests.browser.conftest import chromium_skip_reason, new_page, screenshot
from tests.browser.test_console import _sign_in, _wait_live, expect
from tests.support import TenantFactory, member

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

NO_SIDEWAYS_SCROLL = "document.documentElement.scrollWidth <= window.innerWidth"


def test_a_person_signs_out_their_other_session_with_the_keyboard(
    console_browser, live_server_only
):
    tenant = TenantFactory(slug="acme", name="Acme")
    member(tenant, "approver", username="ana")

    with console_browser() as browser:
        phone = new_page(browser, live_server_only)
        phone.set_viewport_size({"width": 390, "height": 844})
        _sign_in(phone, "ana")
        _wait_live(phone)
        desk = new_page(browser, live_server_only)
        _sign_in(desk, "ana")

        desk.goto("/me/")
        desk.focus("#my-sessions")
        desk.keyboard.press("Enter")
        expect(desk.locator("h1")).to_have_text("Your sessions")
        expect(desk.locator("#sessions tbody tr")).to_have_count(2)
        expect(desk.locator("#sessions tr[data-current] .badge")).to_have_text("this session")
        expect(desk.locator("#sessions tbody")).to_contain_text("Chrome on Linux")
        screenshot(desk, "sessions-1280")
        phone_view = new_page(browser, live_server_only)
        phone_view.set_viewport_size({"width": 390, "height": 844})
        phone_view.context.add_cookies(desk.context.cookies())
        phone_view.goto("/accounts/sessions/")
        assert phone_view.evaluate(NO_SIDEWAYS_SCROLL)
        screenshot(phone_view, "sessions-390")

        desk.focus("#end-others")
        desk.keyboard.press("Enter")
        # The confirmation opens with its confirming button focused.
        expect(desk.locator("dialog.confirm")).to_be_visible()
        desk.keyboard.press("Enter")
        expect(desk.locator(".flash")).to_have_text("Signed out 1 other session.")
        expect(desk.locator("#sessions tbody tr")).to_have_count(1)

        # The phone's open page hears it at once and says so, instead of reconnecting.
        expect(phone.locator("#signed-out")).to_contain_text("You were signed out.")
        expect(phone.locator("#live-status")).to_have_attribute("data-state", "closed")
        screenshot(phone, "signed-out-390")
        phone.click("#signed-out a")
        expect(phone).to_have_url(re.compile(r"/login/\?next=%2F$"))

    [event] = AuditEvent.objects.filter(tenant=tenant, action="auth.sessions_ended")
    assert (event.actor_name, event.detail["sessions"], event.detail["reason"]) == (
        "ana",
        1,
        "signed out the other sessions",
    )


def test_a_removed_member_sees_they_were_signed_out(console_browser, live_server_only):
    tenant = TenantFactory(slug="acme", name="Acme")
    member(tenant, "admin", username="ops-admin")
    member(tenant, "approver", username="leaver")

    with console_browser() as browser:
        leaver = new_page(browser, live_server_only)
        _sign_in(leaver, "leaver")
        _wait_live(leaver)
        admin = new_page(browser, live_server_only)
        _sign_in(admin, "ops-admin")
        admin.goto("/team/members/")
        admin.click("tr[data-member=leaver] >> text=Remove…")
        admin.click("#confirm-remove")
        expect(admin.locator(".flash")).to_contain_text("leaver")

        expect(leaver.locator("#signed-out")).to_contain_text("You were signed out.")
        screenshot(leaver, "removed-signed-out-1280")
        leaver.reload()
        expect(leaver).to_have_url(re.compile(r"/login/"))

    [event] = AuditEvent.objects.filter(tenant=tenant, action="auth.sessions_ended")
    assert event.detail["reason"] == "removed from acme"
    assert event.actor_name == "ops-admin"
