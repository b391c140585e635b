"""An auditor in a real browser: the audit history reads as sentences with what changed, its
action filter is grouped by area, a ticket's decision record is one click from its row, the
ticket page names the one ticket it compares with; and none of it scrolls sideways on a phone.

Same machinery as test_console.py: the ASGI server as a process against the test database,
data made before the browser opens (the run is resumed in this process, so no worker).
"""

from __future__ import annotations

import re

import pytest
from django.db import transaction

from approvals.audit import chain
from approvals.decisions.decide import decide
from approvals.models import Ticket
from approvals.policies.versions import save_policy
from approvals.runs.resume import resume
from tests.browser.conftest import chromium_skip_reason, new_page, screenshot
from tests.browser.test_console import expect
from tests.support import PASSWORD, TenantFactory, member, paused_run

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 860}


def _sign_in(page, username: str, then: str) -> None:
    page.goto(f"/login/?next={then}")
    page.fill("#id_login", username)
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    expect(page).to_have_url(re.compile(re.escape(then) + "$"))
    expect(page.locator(".whoami")).to_have_text(username)


def _no_sideways_scroll(page) -> None:
    widths = page.evaluate(
        "({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})"
    )
    assert widths["scroll"] <= widths["inner"], f"{page.url} is {widths} wide at 390 px"


def _history():
    """Acme with a policy of two approvals, a deploy two people approved that ran, a cleared
    session, and a staging deploy waiting, with an earlier approved staging deploy to compare."""
    tenant = TenantFactory(slug="acme", name="Acme")
    admin = member(tenant, "admin", username="root")
    requester = member(tenant, "viewer", username="dev-rita")
    ann = member(tenant, "approver", username="rm-ann")
    ben = member(tenant, "approver", username="rm-ben")
    auditor = member(tenant, "auditor", username="audit-olga")
    save_policy(tenant=tenant, user=admin, tool_name="deploy_release", required_approvals=2)
    run = paused_run(tenant, requested_by=requester)
    decided = Ticket.objects.get(run=run)
    decide(decided, user=ann, approve=True)
    decide(decided, user=ben, approve=True)
    resume(run_id=run.pk, worker_id="w1")
    with transaction.atomic():
        chain.append(
            tenant_id=tenant.pk,
            action="session.cleared",
            actor=admin,
            outcome="cleared",
            detail={"store": "sqlite", "session_id": "acme-release-7", "items": 12},
        )
    staging_run = paused_run(
        tenant, requested_by=requester, prompt="Deploy release 2026.07.20 to staging"
    )
    staging = Ticket.objects.get(run=staging_run)
    decide(staging, user=ann, approve=True)
    decide(staging, user=ben, approve=True)
    waiting = Ticket.objects.get(
        run=paused_run(
            tenant, requested_by=requester, prompt="Deploy release 2026.07.25 to staging"
        )
    )
    return auditor, decided, staging, waiting


def test_audit_history_reads_as_a_record_at_both_widths(console_browser, live_server_only):
    auditor, decided, staging, waiting = _history()

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in(page, auditor.username, "/audit/")

        policy = page.locator('#audit-rows tr[data-action="policy.changed"]')
        expect(policy.locator(".sentence")).to_have_text(
            "root changed the policy for any agent / deploy_release to v1."
        )
        expect(policy.locator(".changes")).to_have_text("approvals needed 1 → 2")
        cleared = page.locator('#audit-rows tr[data-action="session.cleared"]')
        expect(cleared.locator(".sentence")).to_have_text(
            "root cleared session acme-release-7 in the sqlite store: 12 items."
        )
        vote = page.locator('#audit-rows tr[data-action="ticket.vote"]').first
        expect(vote.locator(".sentence")).to_contain_text("rm-ann approved deploy_release on")

        areas = page.locator("#action-filter optgroup").evaluate_all(
            "groups => groups.map(g => g.label)"
        )
        assert areas[:5] == ["Tickets", "Runs", "Policies", "Members", "Sessions"]
        sessions = page.locator('#action-filter optgroup[label="Sessions"] option')
        expect(sessions).to_have_text(["Session cleared"])
        screenshot(page, "audit-record-1-history")

        page.select_option("#action-filter", label="Session cleared")
        page.fill("input[name=actor]", "ROO")
        page.click("form.filters button[type=submit]")
        expect(page.locator("#audit-rows tbody tr")).to_have_count(1)
        expect(page.locator("#audit-rows tbody tr")).to_have_attribute(
            "data-action", "session.cleared"
        )

        page.goto("/audit/?q=acme-release-7")
        expect(page.locator("#audit-rows tbody tr")).to_have_count(1)

        page.goto("/audit/?action=ticket.approved")
        approved = page.locator(f'#audit-rows tr:has(a[href="/tickets/{decided.pk}/"])')
        approved.locator("a.record-link").click()
        expect(page).to_have_url(re.compile(rf"/tickets/{decided.pk}/record/$"))
        expect(page.locator("#record-outcome")).to_contain_text("Approved by rm-ben at")
        expect(page.locator("#record-policy")).to_have_text("v1 · 2 approvals needed")
        expect(page.locator("#record-votes li")).to_have_count(2)
        expect(page.locator("#record-digest")).to_have_text(f"sha256:{decided.arguments_digest}")
        expect(page.locator("#record-effects")).to_contain_text(
            "Result: Release 2026.07.24 is live on production."
        )
        expect(page.locator("#record-events li[data-action='run.completed']")).to_have_count(1)
        screenshot(page, "audit-record-2-record", docs="record-1280")

        page.goto(f"/tickets/{waiting.pk}/")
        expect(page.locator("#baseline")).to_contain_text(
            f"Compared with #{staging.pk}, approved by rm-ben on"
        )
        expect(page.locator("#diff")).to_have_count(1)
        expect(page.locator("#diff tr")).to_have_count(
            1
        )  # the release; the environment is the same
        expect(page.locator("#record-link")).to_have_attribute(
            "href", f"/tickets/{waiting.pk}/record/"
        )
        screenshot(page, "audit-record-3-ticket")

        page.set_viewport_size(PHONE)
        for url, name in [
            ("/audit/", None),
            (f"/tickets/{decided.pk}/record/", "record-390"),
            (f"/tickets/{waiting.pk}/", None),
        ]:
            shot = name or url.strip("/").replace("/", "-")
            page.goto(url)
            expect(page.locator("h1")).to_be_visible()
            _no_sideways_scroll(page)
            screenshot(page, f"audit-record-phone-{shot}", docs=name)
        page.set_viewport_size(DESKTOP)
