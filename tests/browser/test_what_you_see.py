"""What an approver sees, in a real browser: a flagged call shows its hidden characters and
cannot join a batch; a malformed call never reaches the queue; the batch approves the rest.

Same machinery as test_console.py: the ASGI server as a process against the test database,
data made before the browser opens, the database read after it closes.
"""

from __future__ import annotations

import pytest

from approvals.models import Ticket, TicketStatus
from tests.browser.conftest import chromium_skip_reason, new_page, screenshot
from tests.browser.test_console import _people, _sign_in, _wait_live, expect
from tests.support import paused_call

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


def _only_ticket(run) -> Ticket:
    return Ticket.objects.get(run=run)


def test_a_batch_holds_neither_a_flagged_nor_a_malformed_call(console_browser, live_server_only):
    tenant, requester, alice = _people()
    plain = _only_ticket(
        paused_call(tenant, {"environment": "staging", "release": "1"}, requested_by=requester)
    )
    flagged = _only_ticket(
        paused_call(
            tenant, {"environment": "\u202egnigats", "release": "2"}, requested_by=requester
        )
    )
    malformed = _only_ticket(
        paused_call(
            tenant,
            {" environment": "staging", "environment": "production", "release": "3"},
            requested_by=requester,
        )
    )
    assert malformed.status == TicketStatus.REJECTED

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in(page, alice.username)
        _wait_live(page)
        # The malformed call was rejected to the model: it is not in the queue at all.
        expect(page.locator("#queue-rows tr[data-row]")).to_have_count(2)
        expect(page.locator(f"#ticket-row-{malformed.pk}")).to_have_count(0)
        flagged_row = page.locator(f"#ticket-row-{flagged.pk}")
        expect(flagged_row).to_contain_text("flagged: approve on its page")
        expect(flagged_row).to_contain_text("⟨U+202E⟩gnigats")
        expect(flagged_row.locator("input[type=checkbox]")).to_have_count(0)
        screenshot(page, "what-you-see-1-queue")

        page.check(f"#ticket-row-{plain.pk} input[type=checkbox]")
        page.click("#batch-form button.approve")
        dialog = page.locator("dialog.confirm[open]")
        expect(dialog).to_contain_text("Approve 1 deploy_release ticket")
        dialog.locator("button.approve").click()
        expect(page.locator("#batch-summary")).to_have_text("1 of 1 approved")

        page.goto(f"/tickets/{flagged.pk}/")
        expect(page.locator("#flags")).to_contain_text("U+202E right-to-left override")
        expect(page.locator("table.args")).to_contain_text('"⟨U+202E⟩gnigats"')
        screenshot(page, "what-you-see-2-flagged-ticket")
        page.set_viewport_size({"width": 390, "height": 844})
        screenshot(page, "what-you-see-3-flagged-ticket-phone")

        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto(f"/tickets/{malformed.pk}/")
        expect(page.locator("#malformed")).to_contain_text("Malformed call: not approvable.")
        expect(page.locator("button[value=approve]")).to_have_count(0)
        screenshot(page, "what-you-see-4-malformed-ticket")

    statuses = dict(Ticket.objects.values_list("pk", "status"))
    assert statuses == {
        plain.pk: TicketStatus.APPROVED,
        flagged.pk: TicketStatus.PENDING,
        malformed.pk: TicketStatus.REJECTED,
    }
