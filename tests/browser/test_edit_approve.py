"""Edit and approve in a real browser, with the real server and worker: the issue's "an edited
deployment is pre-authorised and runs with the edited release"."""

from __future__ import annotations

import re

import pytest

from approvals.models import AuditEvent, PreAuthorization, Run, RunStatus, Ticket, TicketStatus
from devtools import demo
from tests.browser.conftest import approve_confirmed, chromium_skip_reason, new_page, screenshot
from tests.browser.test_console import _people, _sign_in, _wait_live, expect
from tests.support import paused_run

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

RELEASE = "2026.07.24"
EDITED = "2026.07.25"
DIFF = f'"{RELEASE}" → "{EDITED}"'


def test_an_edited_deployment_is_pre_authorised_and_runs_with_the_edited_release(
    console_browser, live_console
):
    tenant, requester, approver = _people()
    run = paused_run(
        tenant, requested_by=requester, prompt=f"Deploy release {RELEASE} to production"
    )
    ticket = Ticket.objects.get(run=run)

    with console_browser() as browser:
        page = new_page(browser, live_console)
        _sign_in(page, approver.username)
        page.goto(f"/tickets/{ticket.pk}/")
        page.click("#edit-and-approve")
        expect(page).to_have_url(re.compile(rf"/tickets/{ticket.pk}/edit/$"))
        expect(page.locator("#id_arg__release")).to_have_value(RELEASE)

        page.locator("#id_arg__release").fill("")  # a mistake first: nothing is sent
        approve_confirmed(page, "#edit-form")
        expect(page.locator("#arg__release-error")).to_have_text("This argument is required.")
        expect(page.locator("#id_arg__environment")).to_have_value("production")

        page.locator("#id_arg__release").fill(EDITED)
        page.locator("#id_message").fill("Ship the hotfix build instead.")
        screenshot(page, "edit-1-form")
        approve_confirmed(page, "#edit-form")

        expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/$"))
        _wait_live(page)
        expect(page.locator("#run-status")).to_have_attribute("data-status", "completed")
        expect(page.locator("#final-output")).to_contain_text(f"Release {EDITED} is live")
        preauthorised = page.locator('#timeline li[data-action="ticket.preauthorised"]')
        expect(preauthorised).to_contain_text(f"Pre-authorised by {approver.username}")
        expect(preauthorised.locator(".edit-diff")).to_contain_text(DIFF)
        edited = page.locator('#timeline li[data-action="ticket.edited"]')
        expect(edited.locator(".edit-diff")).to_contain_text(DIFF)
        screenshot(page, "edit-2-run")

        page.goto(f"/tickets/{ticket.pk}/")
        expect(page.locator("#edit-outcome")).to_contain_text(
            "was approved by the pre-authorisation"
        )
        expect(page.locator("#edit-diff")).to_contain_text(DIFF)
        screenshot(page, "edit-3-original-ticket")

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert [(e["release"], e["environment"]) for e in demo.read_effects("deploy_release")] == [
        (EDITED, "production")
    ]
    new = Ticket.objects.get(run=run, generation=2)
    assert (new.status, new.decided_by_id) == (TicketStatus.APPROVED, approver.pk)
    assert PreAuthorization.objects.get(original_ticket=ticket).used_by_id == new.pk
    assert AuditEvent.objects.get(action="ticket.preauthorised").actor_id == approver.pk
    assert Run.objects.get(pk=run.pk).final_output.endswith(
        f"Release {EDITED} is live on production."
    )
