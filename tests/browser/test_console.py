"""End to end in a real browser: sign in, decide tickets, and watch pages update live.

Each test starts the ASGI server and a worker as processes against the test database (see
conftest.py), makes real paused runs in this process, and drives Debian's Chromium through
Playwright. Nothing is reloaded: a page marks its window when it loads, and the mark must still
be there when the live change has arrived. Screenshots go to test-artifacts/ in every run.
"""

from __future__ import annotations

import os
import re
import threading
import time

import pytest
from django.db import connection

from approvals.decisions.decide import decide
from approvals.models import AuditEvent, Run, RunStatus, Ticket, TicketStatus
from approvals.runs.resume import resume
from devtools import demo
from tests.browser.conftest import (
    TIMEOUT_MS,
    approve_confirmed,
    chromium_skip_reason,
    new_page,
    screenshot,
)
from tests.support import PASSWORD, TenantFactory, member, paused_run

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

PREVIOUS = "2026.07.23"
RELEASE = "2026.07.24"
PROMPT = f"Deploy release {RELEASE} to production"
DONE_OUTPUT = f"Release {RELEASE}: Release {RELEASE} is live on production."
DENIED = "Deployment was denied by the release manager."


def expect(target):
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=TIMEOUT_MS)
    return playwright_expect(target)


# --- data ---------------------------------------------------------------------------------------


def _people():
    tenant = TenantFactory(slug="acme", name="Acme")
    requester = member(tenant, "viewer", username="dev-rita")
    approver = member(tenant, "approver", username="rm-alice")
    return tenant, requester, approver


def _approved_and_completed(tenant, requester, approver, release: str) -> Run:
    """An earlier deploy, approved and completed: the ticket page diffs against it.

    The live worker may take the run first (on PostgreSQL a NOTIFY wakes it at once); then this
    process's resume finds it claimed and waits for the worker's outcome instead.
    """
    run = paused_run(
        tenant, requested_by=requester, prompt=f"Deploy release {release} to production"
    )
    decide(Ticket.objects.get(run=run), user=approver, approve=True)
    resume(run_id=run.pk, worker_id="test-setup")
    deadline = time.monotonic() + 20
    while Run.objects.get(pk=run.pk).status != RunStatus.COMPLETED:
        assert time.monotonic() < deadline, Run.objects.get(pk=run.pk).status
        time.sleep(0.05)
    return run


def _ticket(run: Run) -> Ticket:
    return Ticket.objects.get(run=run, status=TicketStatus.PENDING)


# --- browser helpers ----------------------------------------------------------------------------


def _sign_in(page, username: str) -> None:
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
    page.fill("#id_login", username)
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.locator("h1")).to_have_text("Waiting for a decision")
    expect(page.locator(".whoami")).to_have_text(username)


def _wait_live(page) -> None:
    """The page's websocket is open: from now on it hears about changes."""
    expect(page.locator("#live-status")).to_have_attribute("data-state", "open")


def _wait_settled(page, *regions: str) -> None:
    """The page's websocket is open and the re-read of these live regions that its opening
    made has landed (htmx marks a region with htmx-request while its request is out)."""
    _wait_live(page)
    for region in regions:
        expect(page.locator(region)).not_to_have_class(re.compile(r"\bhtmx-request\b"))


def _wait_true(page, expression: str, message: str) -> None:
    """Wait until a JavaScript expression is true on the page. The page's CSP refuses
    wait_for_function's eval: look, letting the page run between."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not page.evaluate(expression) and time.monotonic() < deadline:
        page.wait_for_timeout(20)
    assert page.evaluate(expression), message


def _re_read_answered(page) -> None:
    """Make the page's live regions re-read, as a hint does, and wait until an answer came."""
    page.evaluate(
        """() => {
          document.body.addEventListener("htmx:beforeSwap", () => { window.__asked = true; });
          document.body.dispatchEvent(new CustomEvent("console:changed"));
        }"""
    )
    _wait_true(page, "window.__asked === true", "the re-read never answered")


# The queue's rows carry this mark until they are swapped for a new copy.
_MARK_ROWS = 'document.getElementById("queue-rows").__drawn = true'
_ROWS_MARKED = 'document.getElementById("queue-rows").__drawn === true'


def _mark_loaded(page) -> None:
    page.evaluate("window.__notReloaded = true")


def _assert_not_reloaded(page) -> None:
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"


# --- tests --------------------------------------------------------------------------------------


def test_approve_in_the_browser_and_watch_the_run_complete_live(console_browser, live_console):
    """Sign in, open the newest ticket with j + Enter, check digest and diff, approve with `a`,
    and see the run page reach completed without a reload; the worker deployed exactly once."""
    tenant, requester, approver = _people()
    earlier_approver = member(tenant, "approver", username="rm-bob")
    _approved_and_completed(tenant, requester, earlier_approver, PREVIOUS)
    invoice = paused_run(
        tenant, agent_key="invoice", prompt="Publish invoice INV-781", requested_by=requester
    )
    run = paused_run(tenant, requested_by=requester, prompt=PROMPT)
    ticket, other = _ticket(run), _ticket(invoice)

    with console_browser() as browser:
        page = new_page(browser, live_console)
        _sign_in(page, approver.username)
        expect(page.locator("#queue-rows tr[data-row]")).to_have_count(2)
        expect(page.locator("#queue-rows tr[data-row]").first).to_have_id(f"ticket-row-{ticket.pk}")
        expect(page.locator(f"#ticket-row-{ticket.pk}")).to_contain_text("deploy_release")
        expect(page.locator(f"#ticket-row-{other.pk}")).to_contain_text("publish_invoice")
        _wait_live(page)
        screenshot(page, "approve-1-queue", docs="queue")

        page.keyboard.press("j")
        expect(page.locator(f"#ticket-row-{ticket.pk}")).to_have_class(re.compile(r"\bselected\b"))
        page.keyboard.press("Enter")
        expect(page).to_have_url(re.compile(rf"/tickets/{ticket.pk}/$"))

        expect(page.locator("#digest-check")).to_contain_text("Digest verified.")
        expect(page.locator("#digest-check")).to_contain_text(f"sha256:{ticket.arguments_digest}")
        change = page.locator("#diff tr", has=page.locator("th", has_text="release"))
        expect(change).to_have_class(re.compile(r"\bchanged\b"))
        # Text shows quoted: it never reads as a number.
        expect(change.locator("del")).to_have_text(f'"{PREVIOUS}"')
        expect(change.locator("ins")).to_have_text(f'"{RELEASE}"')
        expect(page.locator("#diff tr")).to_have_count(1)  # the environment did not change
        _wait_live(page)
        screenshot(page, "approve-2-ticket", docs="ticket")

        page.keyboard.press("a")
        dialog = page.locator("dialog.confirm[open]")
        expect(dialog).to_contain_text("Approve deploy_release with these arguments?")
        dialog.locator("button.approve").click()

        expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/$"))
        _mark_loaded(page)
        expect(page.locator(".flash")).to_contain_text(f"Ticket #{ticket.pk} approved.")
        expect(page.locator("#run-status")).to_have_attribute("data-status", "completed")
        expect(page.locator("#final-output")).to_have_text(DONE_OUTPUT)
        expect(page.locator('#timeline li[data-action="run.completed"]')).to_have_count(1)
        _assert_not_reloaded(page)
        screenshot(page, "approve-3-run", docs="run")

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.final_output == DONE_OUTPUT
    deploys = demo.read_effects("deploy_release")
    assert [e["release"] for e in deploys] == [PREVIOUS, RELEASE]  # the first is the set-up's
    assert deploys[1]["environment"] == "production"
    assert deploys[1]["pid"] != os.getpid()  # the worker process did it
    assert Ticket.objects.get(pk=ticket.pk).decided_by == approver
    assert Ticket.objects.get(pk=other.pk).status == TicketStatus.PENDING


def test_a_decided_ticket_leaves_another_approvers_queue_live(console_browser, live_console):
    """Two approvers in two browser contexts watch the queue; one decides a ticket, and the
    other's row for it goes away without a reload while the other row stays."""
    tenant, requester, alice = _people()
    bob = member(tenant, "approver", username="rm-bob")
    staying = paused_run(
        tenant, requested_by=requester, prompt="Deploy release 2026.07.20 to staging"
    )
    leaving = paused_run(tenant, requested_by=requester, prompt=PROMPT)
    staying_ticket, leaving_ticket = _ticket(staying), _ticket(leaving)

    with console_browser() as browser:
        alice_page = new_page(browser, live_console)
        bob_page = new_page(browser, live_console)
        _sign_in(alice_page, alice.username)
        _sign_in(bob_page, bob.username)
        for page in (alice_page, bob_page):
            expect(page.locator(f"#ticket-row-{leaving_ticket.pk}")).to_be_visible()
            expect(page.locator(f"#ticket-row-{staying_ticket.pk}")).to_be_visible()
            _wait_live(page)
        _mark_loaded(bob_page)

        alice_page.click(f"#ticket-row-{leaving_ticket.pk} a.row-link")
        expect(alice_page).to_have_url(re.compile(rf"/tickets/{leaving_ticket.pk}/$"))
        approve_confirmed(alice_page)
        expect(alice_page).to_have_url(re.compile(rf"/runs/{leaving.pk}/$"))

        bob_page.wait_for_selector(f"#ticket-row-{leaving_ticket.pk}", state="detached")
        expect(bob_page.locator(f"#ticket-row-{staying_ticket.pk}")).to_be_visible()
        expect(bob_page.locator("#queue-rows tr[data-row]")).to_have_count(1)
        expect(bob_page.locator("#live-hint")).to_have_attribute("data-kind", re.compile(r"."))
        _assert_not_reloaded(bob_page)
        screenshot(bob_page, "queue-live-after-decision")

    decided = Ticket.objects.select_related("decided_by").get(pk=leaving_ticket.pk)
    assert decided.status == TicketStatus.APPROVED
    assert decided.decided_by == alice
    assert Ticket.objects.get(pk=staying_ticket.pk).status == TicketStatus.PENDING


def test_reject_with_a_message_shows_it_in_the_timeline(console_browser, live_console):
    """`r` opens the confirmation with its message field; a typed message and Reject reject the call;
    the run page shows the message in the timeline and the run completes with no effect."""
    tenant, requester, approver = _people()
    run = paused_run(tenant, requested_by=requester, prompt=PROMPT)
    ticket = _ticket(run)

    with console_browser() as browser:
        page = new_page(browser, live_console)
        _sign_in(page, approver.username)
        page.click(f"#ticket-row-{ticket.pk} a.row-link")
        expect(page).to_have_url(re.compile(rf"/tickets/{ticket.pk}/$"))
        expect(page.locator("#digest-check")).to_contain_text("Digest verified.")
        expect(page.locator("#diff")).to_contain_text("nothing to compare with")

        # `r` opens the reject confirmation with the message field focused; Escape leaves it.
        page.keyboard.press("r")
        dialog = page.locator("dialog.confirm[open]")
        expect(dialog).to_contain_text("Reject this call? The message goes back to the agent.")
        expect(dialog.locator("#confirm-message")).to_be_focused()
        page.keyboard.press("Escape")
        expect(page.locator("dialog.confirm")).to_have_count(0)
        page.keyboard.press("r")
        dialog.locator("#confirm-message").fill(DENIED)
        screenshot(page, "reject-1-ticket")
        dialog.locator("button.reject").click()

        expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/$"))
        _mark_loaded(page)
        rejected = page.locator('#timeline li[data-action="ticket.rejected"]')
        expect(rejected).to_contain_text("Rejected")
        expect(rejected.locator("blockquote")).to_have_text(DENIED)
        expect(page.locator("#run-status")).to_have_attribute("data-status", "completed")
        expect(page.locator("#final-output")).to_contain_text(DENIED)
        _assert_not_reloaded(page)
        screenshot(page, "reject-2-run")

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert demo.read_effects() == []
    assert Ticket.objects.get(pk=ticket.pk).decision_message == DENIED
    event = AuditEvent.objects.get(run_id=run.pk, action="ticket.rejected")
    assert event.detail["message"] == DENIED


def test_a_live_re_read_waits_for_a_press_to_be_released(console_browser, live_console):
    """A row pressed while the queue's live re-read answers keeps its link until the release:
    the click opens the ticket (were the rows swapped between press and release, the click
    would be lost), and the queue is re-read after."""
    tenant, requester, approver = _people()
    ticket = _ticket(paused_run(tenant, requested_by=requester, prompt=PROMPT))

    with console_browser() as browser:
        page = new_page(browser, live_console)
        _sign_in(page, approver.username)
        # The socket's opening re-reads the rows once: let that land before marking them.
        _wait_settled(page, "#queue-rows")
        page.evaluate(_MARK_ROWS)
        box = page.locator(f"#ticket-row-{ticket.pk} a.row-link").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        _re_read_answered(page)
        assert page.evaluate(_ROWS_MARKED)
        page.mouse.up()
        expect(page).to_have_url(re.compile(rf"/tickets/{ticket.pk}/$"))


def test_a_re_read_held_by_a_press_whose_release_never_comes_lands_after_2_s(
    console_browser, live_server_only
):
    """A release the page never sees (a native select's popup, a context menu takes it) must
    not hold a live re-read back for good: it lands 2 s after the press, the pointer still down."""
    tenant, requester, approver = _people()
    _ticket(paused_run(tenant, requested_by=requester, prompt=PROMPT))

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in(page, approver.username)
        _wait_settled(page, "#queue-rows")
        page.evaluate(_MARK_ROWS)
        # A press on the page's background, whose release never comes.
        page.mouse.move(5, page.viewport_size["height"] - 5)
        page.mouse.down()
        pressed = time.monotonic()
        _re_read_answered(page)
        _wait_true(page, f"!({_ROWS_MARKED})", "the held re-read never landed")
        assert time.monotonic() - pressed >= 2.0
        page.mouse.up()


def test_a_stale_notice_waits_for_a_press_on_approve_to_be_released(
    console_browser, live_server_only
):
    """A live re-read that finds the decision busy says so in a notice above the buttons, which
    pushes them down. Shown while Approve is pressed, it would move the button from under the
    pointer, and the click would be lost (no confirmation). It shows after the release, and the
    release's click opens the confirmation."""
    tenant, requester, approver = _people()
    ticket = _ticket(paused_run(tenant, requested_by=requester, prompt=PROMPT))

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in(page, approver.username)
        page.goto(f"/tickets/{ticket.pk}/")
        page.wait_for_load_state("load")
        # The socket's opening re-reads the live regions once: let that land first.
        _wait_settled(page, "#ticket-head", "#claim", "#decision", "#comment-list")
        approve = page.locator("#decide-form button.approve")
        box = approve.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 4)
        page.mouse.down()
        # The pressed button has the focus, so the decision is busy: its re-read is skipped
        # (and the notice asked for) as the event goes out; the other regions' answers show
        # that it went out.
        _re_read_answered(page)
        assert page.locator("#decision-stale").is_hidden()
        assert approve.bounding_box()["y"] == box["y"]
        page.mouse.up()
        expect(page.locator("dialog.confirm[open] button.approve")).to_be_visible()
        expect(page.locator("#decision-stale")).to_be_visible()
        page.keyboard.press("Escape")
        expect(page.locator("dialog.confirm")).to_have_count(0)
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


def test_a_change_between_render_and_socket_open_still_reaches_the_page(
    console_browser, live_server_only
):
    """The run page is rendered while the run is queued; the run completes before the page's
    websocket is open (its script is held back meanwhile). The page must still catch up.

    This pins down the window the approve and reject tests hit by chance when the worker is
    fast: hints only cover changes after the socket subscribed, so without a re-read once the
    socket opens the page shows `queued` for good.
    """
    tenant, requester, approver = _people()
    run = paused_run(tenant, requested_by=requester, prompt=PROMPT)
    decide(_ticket(run), user=approver, approve=True)
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    outcome: dict[str, object] = {}

    def resume_in_a_thread() -> None:
        # The ORM refuses the test's thread while Playwright's loop runs; another thread is fine.
        try:
            outcome["status"] = resume(run_id=run.pk, worker_id="test-worker").status
        finally:
            connection.close()

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in(page, approver.username)
        held = []
        page.route("**/static/django_htmx/ext/hx-ws-*.js", lambda route: held.append(route))
        page.goto(f"/runs/{run.pk}/", wait_until="commit")  # rendered: the run is queued
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(20)  # lets Playwright deliver the held request
        assert held, "the websocket extension was never requested"

        thread = threading.Thread(target=resume_in_a_thread)
        thread.start()
        thread.join(timeout=60)
        assert outcome.get("status") == RunStatus.COMPLETED, outcome

        held[0].continue_()
        _wait_live(page)
        _mark_loaded(page)
        expect(page.locator("#run-status")).to_have_attribute("data-status", "completed")
        expect(page.locator("#final-output")).to_have_text(DONE_OUTPUT)
        _assert_not_reloaded(page)
