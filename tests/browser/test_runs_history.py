"""The runs list, the Decided tab, My decisions and the search, in a real browser at 1280 and
390 px: what they show, that the runs list follows a run live, and that no page scrolls
sideways on a phone.

Same machinery as test_console.py: the ASGI server as a process against the test database,
data made before the browser opens, the database read after it closes.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from approvals.decisions.decide import decide
from approvals.models import RunStatus, TicketStatus, TicketVote
from approvals.runs.resume import resume
from tests.browser.conftest import chromium_skip_reason, new_page, screenshot
from tests.browser.test_console import PROMPT, _people, _sign_in, _ticket, _wait_live, expect
from tests.support import paused_run, stored_run, stored_ticket

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

STAGING = "Deploy release 2026.07.25 to staging"
WIDE = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


def _history(tenant, requester, approver):
    """A finished run whose call the approver approved, and another call they rejected."""
    done = stored_run(
        tenant,
        title=STAGING,
        status=RunStatus.COMPLETED,
        requested_by=requester,
        final_output="Release 2026.07.25 is live on staging.",
    )
    approved = stored_ticket(
        tenant,
        run=done,
        arguments='{"environment":"staging","release":"2026.07.25"}',
        status=TicketStatus.APPROVED,
        requested_by=requester,
        decided_by=approver,
        decided_at=done.created_at,
    )
    TicketVote.objects.create(ticket=approved, user=approver)
    rejected = stored_ticket(
        tenant,
        run=stored_run(
            tenant,
            title="Publish invoice INV-2231 to a customer with a rather long name",
            status=RunStatus.COMPLETED,
            requested_by=requester,
            final_output="The invoice was not published: the release manager said no.",
        ),
        tool="publish_invoice",
        arguments='{"invoice":"INV-2231","customer":"Example Holdings International Ltd"}',
        status=TicketStatus.REJECTED,
        requested_by=requester,
        decided_by=approver,
        decided_at=done.created_at,
        decision_message="Wait for the customer's purchase order number first.",
    )
    return done, approved, rejected


def _no_sideways_scroll(page) -> None:
    widths = page.evaluate(
        "[document.documentElement.scrollWidth, window.innerWidth, location.pathname]"
    )
    assert widths[0] <= widths[1], widths


def test_runs_decided_mine_and_search_read_well_at_both_widths(console_browser, live_server_only):
    tenant, requester, approver = _people()
    done, approved, rejected = _history(tenant, requester, approver)
    live = paused_run(tenant, requested_by=requester, prompt=PROMPT)
    decide(_ticket(live), user=approver, approve=True)
    outcome: dict[str, object] = {}

    def resume_in_a_thread() -> None:
        # The ORM refuses the test's thread while Playwright's loop runs; another thread is fine.
        try:
            outcome["status"] = resume(run_id=live.pk, worker_id="test-worker").status
        finally:
            connection.close()

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in(page, approver.username)

        # The runs list, linked in the navigation, follows the queued run live to its end.
        page.click("nav[aria-label=Main] >> text=Runs")
        expect(page.locator("h1")).to_have_text("Runs")
        _wait_live(page)
        live_row = page.locator(f"#run-row-{live.pk}")
        expect(live_row.locator(".badge")).to_have_text("Queued")
        expect(page.locator(f"#run-row-{done.pk}")).to_contain_text(STAGING)
        expect(page.locator(f"#run-row-{done.pk} .output-excerpt")).to_have_text(
            "Release 2026.07.25 is live on staging."
        )
        thread = threading.Thread(target=resume_in_a_thread)
        thread.start()
        thread.join(timeout=60)
        assert outcome.get("status") == RunStatus.COMPLETED, outcome
        expect(live_row.locator(".badge")).to_have_text("Completed")
        expect(live_row.locator(".output-excerpt")).to_contain_text("is live on production")
        screenshot(page, "runs-history-1-runs-1280", docs="runs")

        # The run's page tells its outcome in full.
        page.click(f"#run-row-{done.pk} a.row-link")
        expect(page.locator("#final-output")).to_have_text("Release 2026.07.25 is live on staging.")

        # The Decided tab, from the queue.
        page.goto("/")
        page.click("#tab-decided")
        expect(page.locator("h1")).to_have_text("Decided tickets")
        expect(page.locator(f"#decided-row-{rejected.pk}")).to_contain_text(
            "Wait for the customer's purchase order number first."
        )
        page.select_option("select[name=status]", "approved")
        page.click("form.filters button[type=submit]")
        expect(page.locator("#history-rows tbody tr")).to_have_count(2)
        expect(page.locator(f"#decided-row-{rejected.pk}")).to_have_count(0)
        screenshot(page, "runs-history-2-decided-1280", docs="decided")

        # My decisions: the approver's part and how it ended.
        page.click("#tab-mine")
        expect(page.locator("h1")).to_have_text("My decisions")
        expect(page.locator(f"#my-part-{rejected.pk}")).to_have_text("You rejected")
        expect(page.locator(f"#my-part-{approved.pk}")).to_have_text(
            "You approved, and your approval completed the quorum"
        )
        screenshot(page, "runs-history-3-mine-1280", docs="my-decisions")

        # The header's search box finds the release in a call's arguments and a run's title.
        page.fill("#header-search", "2026.07.25")
        page.press("#header-search", "Enter")
        expect(page.locator("h1")).to_have_text("Search")
        expect(page.locator("#ticket-results tbody tr")).to_have_count(1)
        expect(page.locator(f"#found-ticket-{approved.pk}")).to_contain_text("deploy_release")
        expect(page.locator(f"#found-run-{done.pk}")).to_contain_text(STAGING)
        screenshot(page, "runs-history-3-search-1280", docs="search")

        # At 390 px no page scrolls sideways, and each still says what it holds.
        page.set_viewport_size(PHONE)
        for path, name, text, docs in [
            ("/runs/", "runs", STAGING, "runs-phone"),
            ("/decided/", "decided", "Wait for the customer's purchase order", "decided-phone"),
            ("/decisions/mine/", "mine", "You rejected", "my-decisions-phone"),
            ("/search/?q=2026.07.25", "search", STAGING, "search-phone"),
            ("/", "queue", "Waiting for a decision", None),
            (f"/runs/{done.pk}/", "run", "Release 2026.07.25 is live on staging.", None),
        ]:
            page.goto(path)
            expect(page.locator("main")).to_contain_text(text)
            _no_sideways_scroll(page)
            screenshot(page, f"runs-history-4-{name}-390", docs=docs)
