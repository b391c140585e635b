"""The caller runs the agent, end to end: a plain Python script, with no Django, in another
process and another folder, pauses its ScriptedModel agent and hands the pause to the console;
a person approves in the browser; the script verifies the signed decision, resumes and
reports; the run's page shows it completed with its output.

The script is the README's (its "caller" block), so what a reader copies is what runs here.
"""

from __future__ import annotations

import re

import pytest
from django.conf import settings

from approvals.models import AuditEvent, Run, RunStatus, TicketStatus
from tests.browser.conftest import (
    TIMEOUT_MS,
    approve_confirmed,
    chromium_skip_reason,
    new_page,
    screenshot,
)
from tests.support import (
    PASSWORD,
    TenantFactory,
    api_token,
    clean_env,
    member,
    pending_ticket_of,
    readme_block,
    start_script_without_django,
)

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

OUTPUT = "Release 2026.07.25 is live on production."


def expect(target):
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=TIMEOUT_MS)
    return playwright_expect(target)


def test_a_caller_script_waits_while_a_person_approves_in_the_browser(
    console_browser, live_console, tmp_path
):
    tenant = TenantFactory(slug="acme", name="Acme")
    approver = member(tenant, "approver", username="rm-alice")
    # The script's token acts as nobody: any approver may decide what it asks.
    _, token = api_token(tenant, "runs:write", "runs:read")
    folder = tmp_path / "release-service"
    folder.mkdir()
    script = folder / "deploy.py"
    script.write_text(readme_block("caller") + "\n", encoding="utf-8")

    process = start_script_without_django(
        script, clean_env(folder, APPROVALS_URL=live_console.url, APPROVALS_TOKEN=token)
    )
    try:
        ticket = pending_ticket_of("acme", process)
        run_id = ticket.run_id
        assert Run.objects.get(pk=run_id).executor == "caller"
        assert (folder / "deployments.log").exists() is False

        with console_browser() as browser:
            page = new_page(browser, live_console)
            page.goto("/")
            page.fill("#id_login", approver.username)
            page.fill("#id_password", PASSWORD)
            page.click("form button[type=submit]")
            expect(page.locator(".whoami")).to_have_text(approver.username)
            row = page.locator(f"#ticket-row-{ticket.pk}")
            expect(row).to_contain_text("deploy_release")
            row.locator("a.row-link").click()
            expect(page).to_have_url(re.compile(rf"/tickets/{ticket.pk}/$"))
            expect(page.locator("#digest-check")).to_contain_text("Digest verified.")
            expect(page.locator("table.args")).to_contain_text("production")
            approve_confirmed(page)

            expect(page).to_have_url(re.compile(rf"/runs/{run_id}/$"))
            expect(page.locator(".flash")).to_contain_text(
                f"Ticket #{ticket.pk} approved. Its caller resumes the run."
            )
            expect(page.locator("#run-executor")).to_have_text("resumed by its caller")
            # The script fetched the signed decision, deployed, resumed and reported.
            expect(page.locator("#run-status")).to_have_attribute("data-status", "completed")
            expect(page.locator("#final-output")).to_have_text(OUTPUT)
            expect(page.locator('#timeline li[data-action="run.completed"]')).to_have_count(1)
            screenshot(page, "caller-runs-1-run-completed")
            page.set_viewport_size({"width": 390, "height": 844})
            expect(page.locator("#final-output")).to_have_text(OUTPUT)
            screenshot(page, "caller-runs-2-run-completed-phone")

        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode == 0, err
    assert out.splitlines() == [
        f"waiting for a decision on {settings.APPROVALS_PUBLIC_URL.rstrip('/')}/runs/{run_id}/",
        f"completed: {OUTPUT}",
    ]
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.final_output, run.requested_by) == (RunStatus.COMPLETED, OUTPUT, None)
    ticket.refresh_from_db()
    assert (ticket.status, ticket.decided_by) == (TicketStatus.APPROVED, approver)
    # Exactly one effect, in the script's own folder.
    assert (folder / "deployments.log").read_text() == "2026.07.25 production\n"
    assert list(
        AuditEvent.objects.filter(run=run)
        .exclude(action="api.request")
        .order_by("seq")
        .values_list("action", flat=True)
    ) == ["run.paused", "ticket.created", "ticket.approved", "run.awaiting_caller", "run.completed"]
