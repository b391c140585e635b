"""Two-factor in a real browser under the console's strict CSP: a passkey enrolled through
Chromium's virtual authenticator signs in without a password; an authenticator app enrolled
with a code computed here is asked for at the next sign-in; the pages fit 1280 and 390 px."""

from __future__ import annotations

import re

import pytest
from allauth.mfa.models import Authenticator

from approvals.models import AuditEvent
from tests.browser.conftest import (
    chromium_skip_reason,
    confirm_password,
    new_page,
    passkey_page,
    screenshot,
    virtual_credentials,
)
from tests.browser.test_console import expect
from tests.support import PASSWORD, TenantFactory, member, pending_ticket, totp_code

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


def _watch_csp(page) -> list[str]:
    """Every CSP refusal and page error the browser reports, to assert there are none."""
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(m.text) if "Content Security Policy" in m.text else None,
    )
    page.on("pageerror", lambda e: problems.append(str(e)))
    return problems


def _sign_in_with_password(page, username: str) -> None:
    page.goto("/login/")
    page.fill("#id_login", username)
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")


def _no_sideways_scroll(page) -> None:
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"{page.url} scrolls sideways: {widths}"


def test_a_passkey_is_enrolled_and_signs_in_without_a_password(console_browser, live_server_only):
    tenant = TenantFactory(slug="acme", name="Acme")
    alice = member(tenant, "approver", username="rm-alice")

    with console_browser() as browser:
        page, authenticator = passkey_page(browser, live_server_only)
        problems = _watch_csp(page)
        _sign_in_with_password(page, "rm-alice")
        expect(page.locator(".whoami")).to_have_text("rm-alice")

        page.goto("/me/")
        page.click("#passkeys-link")
        expect(page.locator("h1")).to_have_text("Confirm Access")
        screenshot(page, "two-factor-reauthenticate")
        confirm_password(page)
        expect(page.locator("h1")).to_have_text("Add a passkey")
        page.fill("input[name=name]", "Laptop")
        page.check("#id_passwordless")
        screenshot(page, "two-factor-passkey-add")
        page.click("#mfa_webauthn_add")
        # The first key makes recovery codes, and allauth shows them.
        expect(page).not_to_have_url(re.compile(r"/webauthn/add/"))
        assert len(virtual_credentials(page, authenticator)) == 1

        page.goto("/accounts/2fa/webauthn/")
        expect(page.locator("table")).to_contain_text("Laptop")
        expect(page.locator("table")).to_contain_text("Passkey")
        screenshot(page, "two-factor-passkeys-1280")
        page.set_viewport_size({"width": 390, "height": 844})
        _no_sideways_scroll(page)
        screenshot(page, "two-factor-passkeys-390")
        page.set_viewport_size({"width": 1280, "height": 860})

        page.click("header button:has-text('Sign out')")
        expect(page).to_have_url(re.compile(r"/login/"))
        screenshot(page, "two-factor-login")
        page.click("#passkey_login")
        expect(page.locator(".whoami")).to_have_text("rm-alice")
        assert problems == []

    key = Authenticator.objects.get(user=alice, type="webauthn")
    assert key.wrap().is_passwordless is True
    enrolled = set(
        AuditEvent.objects.filter(action="mfa.enrolled").values_list("detail__type", flat=True)
    )
    assert enrolled == {"webauthn", "recovery_codes"}
    methods = list(
        AuditEvent.objects.filter(action="auth.signed_in")
        .order_by("seq")
        .values_list("detail__method", flat=True)
    )
    assert methods == ["password", "passkey"]
    assert AuditEvent.objects.filter(action="auth.signed_out").count() == 1


def test_an_authenticator_app_is_enrolled_and_asked_for_at_sign_in(
    console_browser, live_server_only
):
    tenant = TenantFactory(slug="acme", name="Acme")
    member(tenant, "approver", username="rm-bob")

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        problems = _watch_csp(page)
        _sign_in_with_password(page, "rm-bob")
        expect(page.locator(".whoami")).to_have_text("rm-bob")
        page.goto("/me/")
        expect(page.locator("#two-factor-state")).to_contain_text("Off")
        page.click("#two-factor-link")
        expect(page.locator("h1")).to_have_text("Two-Factor Authentication")
        screenshot(page, "two-factor-index-off")
        page.click("#mfa-totp a")
        confirm_password(page)
        expect(page.locator("h1")).to_have_text("Set up an authenticator app")
        qr = page.locator("img.qr")
        expect(qr).to_be_visible()
        assert page.evaluate("document.querySelector('img.qr').naturalWidth") > 0
        secret = page.input_value("#authenticator_secret")
        page.fill("#id_code", "000000")
        page.keyboard.press("Enter")
        expect(page.locator("#code-error")).to_be_visible()
        screenshot(page, "two-factor-activate-error-1280")
        page.set_viewport_size({"width": 390, "height": 844})
        _no_sideways_scroll(page)
        screenshot(page, "two-factor-activate-390")
        page.set_viewport_size({"width": 1280, "height": 860})
        page.fill("#id_code", totp_code(secret))
        page.keyboard.press("Enter")
        expect(page.locator("h1")).to_have_text(re.compile("Recovery Codes"))
        screenshot(page, "two-factor-recovery-codes")

        page.goto("/me/")
        expect(page.locator("#two-factor-state")).to_contain_text("On")
        screenshot(page, "two-factor-me-on")
        page.click("header button:has-text('Sign out')")
        _sign_in_with_password(page, "rm-bob")
        expect(page.locator("h1")).to_have_text("Second factor")
        expect(page.locator("#id_code")).to_be_focused()
        page.keyboard.type("999999")
        page.keyboard.press("Enter")
        expect(page.locator("#code-error")).to_have_text(re.compile("Incorrect code"))
        screenshot(page, "two-factor-stage-error-1280")
        page.set_viewport_size({"width": 390, "height": 844})
        _no_sideways_scroll(page)
        screenshot(page, "two-factor-stage-390")
        page.fill("#id_code", totp_code(secret))
        page.keyboard.press("Enter")
        expect(page.locator(".whoami")).to_have_text("rm-bob")
        assert problems == []

    signed_in = list(
        AuditEvent.objects.filter(action="auth.signed_in").order_by("seq").values_list("detail")
    )
    assert [d[0]["second_factor"] for d in signed_in] == ["none", "totp"]
    assert AuditEvent.objects.filter(action="mfa.failed").count() == 1


def test_a_decider_without_two_factor_is_shown_the_way_instead_of_buttons(
    console_browser, live_server_only
):
    tenant = TenantFactory(slug="acme", name="Acme", deciders_need_two_factor=True)
    member(tenant, "approver", username="rm-carol")
    ticket = pending_ticket(tenant, requested_by=member(tenant, "viewer", username="dev-rita"))

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in_with_password(page, "rm-carol")
        expect(page.locator("#two-factor-needed")).to_contain_text("Acme asks deciders")
        expect(page.locator("#batch-form")).to_have_count(0)
        screenshot(page, "two-factor-queue-callout-1280")
        page.goto(f"/tickets/{ticket.pk}/")
        callout = page.locator("#decision #two-factor-needed")
        expect(callout).to_contain_text("Two-factor first.")
        expect(page.locator("#decide-form")).to_have_count(0)
        screenshot(page, "two-factor-ticket-callout-1280")
        page.set_viewport_size({"width": 390, "height": 844})
        _no_sideways_scroll(page)
        screenshot(page, "two-factor-ticket-callout-390")
        callout.locator("a.button").focus()
        page.keyboard.press("Enter")
        expect(page).to_have_url(re.compile(r"/accounts/2fa/$"))
