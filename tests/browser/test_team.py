"""Working as a team in a real browser: a claim and a comment seen live by a second approver,
and a batch approval picked with the keyboard and the mouse.

Same machinery as test_console.py: the ASGI server as a process against the test database,
data made before the browser opens, the database read after it closes.
"""

from __future__ import annotations

import re

import pytest

from approvals.models import AuditEvent, Ticket, TicketStatus
from tests.browser.conftest import chromium_skip_reason, new_page, screenshot
from tests.browser.test_console import (
    _assert_not_reloaded,
    _mark_loaded,
    _people,
    _sign_in,
    _ticket,
    _wait_live,
    expect,
)
from tests.support import member, paused_run

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


def test_a_claim_and_a_comment_reach_another_approvers_ticket_page_live(
    console_browser, live_server_only
):
    tenant, requester, alice = _people()
    bob = member(tenant, "approver", username="rm-bob")
    ticket = _ticket(paused_run(tenant, requested_by=requester))

    with console_browser() as browser:
        alice_page = new_page(browser, live_server_only)
        bob_page = new_page(browser, live_server_only)
        _sign_in(alice_page, alice.username)
        _sign_in(bob_page, bob.username)
        for page in (alice_page, bob_page):
            page.goto(f"/tickets/{ticket.pk}/")
            expect(page.locator("#claimant")).to_have_text("Nobody has said they are on it.")
            _wait_live(page)
        _mark_loaded(bob_page)
        # Bob is half-way through a rejection: the hints about alice must not wipe it.
        bob_page.fill("#id_message", "Not during the freeze.")

        alice_page.keyboard.press("c")
        expect(alice_page.locator("#claimant")).to_contain_text("You are on it")
        expect(bob_page.locator("#claimant")).to_contain_text("rm-alice is on it")
        expect(bob_page.locator("#claim-form button")).to_have_text("Take over")
        expect(bob_page.locator("#id_message")).to_have_value("Not during the freeze.")
        expect(bob_page.locator("#decision-stale")).to_be_visible()

        alice_page.fill("#id_comment", "Checking the staging canary first.")
        alice_page.click("#comment-form button[type=submit]")
        expect(alice_page.locator("#comment-list .comment")).to_have_count(1)
        expect(alice_page.locator("#id_comment")).to_have_value("")
        comment = bob_page.locator("#comment-list .comment")
        expect(comment).to_have_count(1)
        expect(comment).to_contain_text("rm-alice")
        expect(comment).to_contain_text("Checking the staging canary first.")
        _assert_not_reloaded(bob_page)
        screenshot(bob_page, "team-1-ticket-claimed-and-commented")

        bob_page.goto("/")
        expect(bob_page.locator(f"#claim-badge-{ticket.pk}")).to_have_text("rm-alice is on it")
        screenshot(bob_page, "team-2-queue-claim-badge")

    assert Ticket.objects.get(pk=ticket.pk).claimed_by == alice
    assert list(
        AuditEvent.objects.filter(ticket_id=ticket.pk)
        .order_by("seq")
        .values_list("action", flat=True)
    ) == ["ticket.created", "ticket.claimed", "ticket.commented"]


def _reread_rows(page) -> None:
    """Make the queue re-read its rows now, as a live hint would, and wait for the new rows."""
    page.evaluate(
        """() => new Promise((done) => {
            document.body.addEventListener("htmx:afterSettle", (event) => {
                if (event.detail.elt.id === "queue-rows") done();
            });
            document.body.dispatchEvent(new CustomEvent("console:changed"));
        })"""
    )


def test_batch_approve_two_releases_from_the_queue(console_browser, live_server_only):
    tenant, requester, alice = _people()
    first, second, third = (
        _ticket(
            paused_run(
                tenant, requested_by=requester, prompt=f"Deploy release 2026.07.0{n} to staging"
            )
        )
        for n in (1, 2, 3)
    )
    invoice = _ticket(
        paused_run(
            tenant, agent_key="invoice", prompt="Publish invoice INV-7", requested_by=requester
        )
    )

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in(page, alice.username)
        _wait_live(page)
        expect(page.locator("#queue-rows tr[data-row]")).to_have_count(4)
        expect(page.locator("#batch-form button.approve")).to_be_disabled()
        _mark_loaded(page)

        # Newest first: the invoice, then the third release; j twice reaches the third, and a
        # live re-read of the rows between the two presses does not lose the cursor.
        page.keyboard.press("j")
        _reread_rows(page)
        expect(page.locator(f"#ticket-row-{invoice.pk}")).to_have_class(re.compile(r"\bselected\b"))
        page.keyboard.press("j")
        page.keyboard.press("x")
        expect(page.locator(f"#ticket-row-{third.pk} input[type=checkbox]")).to_be_checked()
        page.check(f"#ticket-row-{second.pk} input[type=checkbox]")
        expect(page.locator("#batch-count")).to_have_text("2 selected (deploy_release):")
        expect(page.locator(f"#ticket-row-{invoice.pk} input[type=checkbox]")).to_be_disabled()
        screenshot(page, "team-3-batch-selected")

        page.click("#batch-form button.approve")
        dialog = page.locator("dialog.confirm[open]")
        expect(dialog).to_contain_text("Approve 2 deploy_release tickets?")
        dialog.locator("button.approve").click()

        expect(page.locator("#batch-summary")).to_have_text("2 of 2 approved")
        expect(page.locator("#queue-rows tr[data-row]")).to_have_count(2)
        expect(page.locator(f"#ticket-row-{invoice.pk} input[type=checkbox]")).to_be_enabled()
        expect(page.locator("#batch-form button.approve")).to_be_disabled()
        _assert_not_reloaded(page)
        screenshot(page, "team-4-batch-done")

    statuses = dict(Ticket.objects.values_list("pk", "status"))
    assert statuses == {
        first.pk: TicketStatus.PENDING,
        second.pk: TicketStatus.APPROVED,
        third.pk: TicketStatus.APPROVED,
        invoice.pk: TicketStatus.PENDING,
    }
