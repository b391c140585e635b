"""Every console page at 390 px, as each role: nothing scrolls sideways. The main pages are
also saved at 1280 and 390 px for the README (UPDATE_SCREENSHOTS=1 copies them to
docs/screenshots/).

One server, one browser, one page per role: data made first, the browser driven after, as in
test_console.py. A page a role may not see answers its refusal, which must fit too; each page
is seen (200) by at least one role, so no page is only ever checked as a refusal (a page
hidden as 404 is Django's debug page under the test server, not the console's).
"""

from __future__ import annotations

import re

import pytest

from approvals.models import Role, RunStatus, TicketStatus, TicketVote
from approvals.policies.versions import save_policy
from notifications import endpoints
from notifications.models import Event
from sessions_admin.models import StoredItem, StoredSession
from tests.browser.conftest import chromium_skip_reason, screenshot
from tests.browser.test_console import expect
from tests.support import (
    PASSWORD,
    TenantFactory,
    api_token,
    member,
    pending_ticket,
    stored_run,
    stored_ticket,
)

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

WIDE = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
# A release name with no place to break: the arguments, the title and the JSON must wrap.
LONG_RELEASE = "2026.07.25-hotfix_for_the_payment_gateway_timeout_regression_in_eu_west_1"
LONG_OUTPUT = (
    "Release 2026.07.24 is live on production. "
    "https://status.example.com/deployments/2026.07.24/production/rollout-report-with-a-long-path"
)
# The pages saved for the README, by their name under docs/screenshots/.
SHOWN = ("queue", "ticket", "run", "runs", "audit", "policies", "sessions", "webhooks")
# Saved by the tests that walk through those pages with the README's story; one owner each.
OWNED_ELSEWHERE = {"queue", "ticket", "run", "runs", "runs-phone"}


def _docs(name: str) -> str | None:
    return None if name in OWNED_ELSEWHERE else name


def _console():
    """A tenant with a person of each role, a pending call with long arguments, a finished run
    with a long output, a two-approval policy, a session, a webhook and an API token."""
    tenant = TenantFactory(slug="acme", name="Acme")
    people = {
        Role.VIEWER: member(tenant, Role.VIEWER, username="dev-rita"),
        Role.APPROVER: member(tenant, Role.APPROVER, username="rm-alice"),
        Role.AUDITOR: member(tenant, Role.AUDITOR, username="au-dana"),
        Role.ADMIN: member(tenant, Role.ADMIN, username="ad-omar"),
    }
    admin, approver, viewer = people[Role.ADMIN], people[Role.APPROVER], people[Role.VIEWER]
    save_policy(tenant=tenant, user=admin, tool_name="deploy_release", required_approvals=2)
    ticket = pending_ticket(
        tenant, requested_by=viewer, prompt=f"Deploy release {LONG_RELEASE} to production"
    )
    done = stored_run(
        tenant,
        title="Deploy release 2026.07.24 to production",
        status=RunStatus.COMPLETED,
        requested_by=viewer,
        final_output=LONG_OUTPUT,
    )
    decided = stored_ticket(
        tenant,
        run=done,
        status=TicketStatus.APPROVED,
        requested_by=viewer,
        decided_by=approver,
        decided_at=done.created_at,
    )
    TicketVote.objects.create(ticket=decided, user=approver)
    stored = StoredSession.objects.create(tenant=tenant, session_id="support-chat-2026-07-24")
    StoredItem.objects.create(
        session=stored, data={"role": "user", "content": f"Deploy release {LONG_RELEASE}"}
    )
    endpoint, _ = endpoints.create_endpoint(
        tenant=tenant,
        user=admin,
        url="http://127.0.0.1:9/hooks/approvals/a-rather-long-path-for-the-receiving-service",
        description="Release channel",
        events=list(Event.values),
        active=True,
    )
    api_token(tenant, user=admin)
    pages = {
        "queue": "/",
        "decided": "/decided/",
        "my-decisions": "/decisions/mine/",
        "runs": "/runs/",
        "run": f"/runs/{ticket.run_id}/",
        "run-completed": f"/runs/{done.pk}/",
        "ticket": f"/tickets/{ticket.pk}/",
        "ticket-decided": f"/tickets/{decided.pk}/",
        "edit": f"/tickets/{ticket.pk}/edit/",
        "record": f"/tickets/{decided.pk}/record/",
        "search": "/search/?q=2026.07",
        "audit": "/audit/",
        "audit-chains": "/audit/chains/",
        "policies": "/policies/",
        "policy-edit": "/policies/edit/?tenant=acme&tool=deploy_release",
        "groups": "/policies/groups/?tenant=acme",
        "sessions": "/sessions/",
        "session": "/sessions/django/acme/?id=support-chat-2026-07-24",
        "notifications": "/notifications/",
        "webhooks": "/notifications/acme/webhooks/",
        "webhook": f"/notifications/acme/webhooks/{endpoint.pk}/",
        "deliveries": "/notifications/acme/deliveries/",
        "emails": "/notifications/acme/emails/",
        "tokens": "/team/tokens/",
        "members": "/team/members/",
        "member-remove": f"/team/members/{people[Role.VIEWER].pk}/remove/",
        "me": "/me/",
        "api-docs": "/api/v1/docs",
    }
    return people, pages


def _overflow(page, where: str) -> list[str]:
    """[] when the page fits its window; else one line saying how wide it is."""
    wide, window = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    return [] if wide <= window else [f"{where} is {wide} px wide in a {window} px window"]


def _sign_in(page, username: str) -> None:
    page.goto("/login/")
    page.fill("#id_login", username)
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    expect(page).not_to_have_url(re.compile(r"/login/"))
    expect(page.locator(".whoami")).to_have_text(username)


def test_every_page_fits_a_phone_for_every_role(console_browser, live_server_only):
    people, pages = _console()
    seen: dict[str, list[str]] = {name: [] for name in pages}
    too_wide: list[str] = []

    with console_browser() as browser:
        context = browser.new_context(base_url=live_server_only.url, viewport=PHONE)
        context.set_default_timeout(15_000)
        page = context.new_page()
        page.goto("/login/")
        expect(page.locator("#id_login")).to_be_visible()
        too_wide += _overflow(page, "the sign-in page")
        screenshot(page, "responsive-login-390")
        context.close()

        for role, user in people.items():
            context = browser.new_context(base_url=live_server_only.url, viewport=PHONE)
            context.set_default_timeout(15_000)
            page = context.new_page()
            _sign_in(page, user.username)
            for name, path in pages.items():
                response = page.goto(path)
                if response.status == 200:
                    seen[name].append(role)
                    # The chain badges are a fragment the audit page loads (a link without
                    # scripts); every other page is a whole page.
                    expect(
                        page.locator("#chains" if name == "audit-chains" else "main")
                    ).to_be_visible()
                # A refusal is the console's page too; a 404 is Django's debug page here.
                if response.status in (200, 403):
                    too_wide += _overflow(page, f"{path} as {role}")
            if role == Role.ADMIN:
                for name in SHOWN:
                    page.goto(pages[name])
                    screenshot(page, f"responsive-{name}-390", docs=_docs(f"{name}-phone"))
                page.set_viewport_size(WIDE)
                for name in SHOWN:
                    page.goto(pages[name])
                    screenshot(page, f"responsive-{name}-1280", docs=_docs(name))
            context.close()

    assert too_wide == []
    assert [name for name, roles in seen.items() if not roles] == []
    # Who sees what: deciding pages for approvers, the record for auditors, set-up for admins.
    assert seen["edit"] == [Role.APPROVER, Role.ADMIN]
    assert seen["audit"] == [Role.AUDITOR, Role.ADMIN]
    assert seen["webhooks"] == [Role.ADMIN]
    assert seen["members"] == [Role.ADMIN]
