"""The issue's demo in a real browser: an admin asks for two approvals on the deploy tool, two
approvers approve, and a third approver watching the ticket sees it approved live."""

from __future__ import annotations

import re

import pytest

from approvals.models import ApprovalPolicy, Run, RunStatus, Ticket, TicketStatus, TicketVote
from devtools import demo
from tests.browser.conftest import approve_confirmed, chromium_skip_reason, new_page, screenshot
from tests.browser.test_console import PROMPT, _mark_loaded, _sign_in, _wait_live, expect
from tests.support import TenantFactory, member, paused_run

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


def _approve(page) -> None:
    approve_confirmed(page)


def test_two_approvals_set_by_an_admin_two_approve_a_third_watches(console_browser, live_console):
    tenant = TenantFactory(slug="acme", name="Acme")
    requester = member(tenant, "viewer", username="dev-rita")
    admin = member(tenant, "admin", username="ops-admin")
    alice = member(tenant, "approver", username="rm-alice")
    bob = member(tenant, "approver", username="rm-bob")
    carol = member(tenant, "approver", username="rm-carol")
    run = paused_run(tenant, requested_by=requester, prompt=PROMPT)
    ticket = Ticket.objects.get(run=run)
    ticket_path = f"/tickets/{ticket.pk}/"

    with console_browser() as browser:
        admin_page = new_page(browser, live_console)
        _sign_in(admin_page, admin.username)
        admin_page.click("nav >> text=Policies")
        expect(admin_page.locator("h1")).to_have_text("Approval policies · Acme")
        admin_page.select_option("select[name=tool]", "deploy_release")
        admin_page.click("text=New or edit policy for this scope")
        expect(admin_page.locator("h1")).to_have_text("Policy: any agent / deploy_release")
        admin_page.fill("#id_required_approvals", "2")
        admin_page.click("#policy-form button[type=submit]")
        expect(admin_page.locator(".flash")).to_contain_text("Saved any agent / deploy_release v1")
        expect(admin_page.locator('#versions li[data-version="1"]')).to_contain_text("2 approvals")
        screenshot(admin_page, "policy-two-approvals")

        watcher = new_page(browser, live_console)
        _sign_in(watcher, carol.username)
        watcher.goto(ticket_path)
        expect(watcher.locator("#quorum-progress")).to_have_text("0 of 2 approvals")
        hints = watcher.locator("#keys [data-hint]")
        expect(hints).to_have_count(4)
        assert hints.evaluate_all("els => els.map(e => e.dataset.hint)") == ["a", "r", "Esc", "c"]
        _wait_live(watcher)
        _mark_loaded(watcher)

        first = new_page(browser, live_console)
        _sign_in(first, alice.username)
        first.goto(ticket_path)
        _approve(first)
        expect(first).to_have_url(re.compile(rf"{ticket_path}$"))
        expect(first.locator(".flash")).to_contain_text("1 of 2 approvals: rm-alice")
        expect(first.locator("#already-voted")).to_be_visible()
        expect(watcher.locator("#quorum-progress")).to_contain_text("1 of 2 approvals: rm-alice")

        second = new_page(browser, live_console)
        _sign_in(second, bob.username)
        second.goto(ticket_path)
        _approve(second)
        expect(second).to_have_url(re.compile(rf"/runs/{run.pk}/$"))
        expect(second.locator("#run-status")).to_have_attribute("data-status", "completed")

        expect(watcher.locator("#decision-outcome")).to_contain_text("Approved")
        expect(watcher.locator("#decision-voters")).to_have_text("Approved by rm-alice, rm-bob.")
        # Every part of the page followed: the badge, the quorum, the expiry line, the claim.
        expect(watcher.locator("#ticket-status")).to_have_attribute("data-status", "approved")
        expect(watcher.locator("#head-progress")).to_have_count(0)
        expect(watcher.locator("#ticket-expiry")).to_have_count(0)
        expect(watcher.locator("#ticket-decided")).to_contain_text("approved by rm-bob at")
        expect(watcher.locator("#claim-form")).to_have_count(0)
        # The keys went with the buttons: nothing is left to approve, reject or claim.
        expect(watcher.locator("#keys [data-hint]")).to_have_count(0)
        assert watcher.evaluate("window.__notReloaded === true"), "the page was reloaded"
        screenshot(watcher, "policy-third-approver-watching")

    assert ApprovalPolicy.objects.get(tool_name="deploy_release").required_approvals == 2
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.APPROVED
    assert ticket.decided_by == bob
    assert TicketVote.objects.filter(ticket=ticket).count() == 2
    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    assert len(demo.read_effects("deploy_release")) == 1
