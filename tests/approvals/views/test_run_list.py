"""The runs list: every run of the user's tenants, filtered, searched, keyset-paged and live."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals.models import Role, RunStatus
from tests.support import TenantFactory, member, queries_for, stored_run, stored_ticket

pytestmark = pytest.mark.django_db

RUNS = reverse("approvals:runs")


def shown(response) -> list[int]:
    return [run.pk for run in response.context["runs"]]


def listing(client, **params) -> list[int]:
    response = client.get(f"{RUNS}?{urlencode(params)}")
    assert response.status_code == 200
    return shown(response)


def test_run_list_shows_each_run_with_its_status_requester_and_outcome(client):
    tenant = TenantFactory()
    rita = member(tenant, Role.VIEWER, username="dev-rita")
    done = stored_run(
        tenant,
        title="Deploy release 2026.07.24 to production",
        status=RunStatus.COMPLETED,
        final_output="Release 2026.07.24 is live on production.",
        requested_by=rita,
    )
    failed = stored_run(
        tenant, title="Publish invoice", status=RunStatus.FAILED, status_reason="The tool raised."
    )
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(RUNS)
    body = response.content.decode()

    assert response.status_code == 200
    assert shown(response) == [failed.pk, done.pk]
    assert f'<span class="ticket-no">#{done.pk}</span>' in body
    assert f'href="/runs/{done.pk}/"' in body
    assert "Deploy release 2026.07.24 to production" in body
    assert '<span class="badge status-completed" data-status="completed">Completed</span>' in body
    assert '<span class="badge status-failed" data-status="failed">Failed</span>' in body
    assert '<td data-label="Requested by">dev-rita</td>' in body
    assert '<span class="output-excerpt">Release 2026.07.24 is live on production.</span>' in body
    assert "The tool raised." in body
    assert 'hx-trigger="console:changed from:body"' in body


def test_run_list_never_shows_another_tenants_runs(client):
    mine, theirs = TenantFactory(), TenantFactory()
    wanted = stored_run(mine)
    stored_run(theirs, title="Their secret deploy")
    client.force_login(member(mine, Role.VIEWER))

    response = client.get(RUNS)

    assert shown(response) == [wanted.pk]
    assert "Their secret deploy" not in response.content.decode()


def test_run_list_of_anonymous_user_redirects_to_sign_in(client):
    response = client.get(RUNS)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_run_list_post_is_refused(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.ADMIN))

    assert client.post(RUNS).status_code == 405


def test_run_list_filters_by_status_agent_and_requester(client):
    tenant = TenantFactory()
    rita = member(tenant, Role.VIEWER)
    completed = stored_run(tenant, status=RunStatus.COMPLETED)
    invoice = stored_run(tenant, agent_key="invoice")
    asked = stored_run(tenant, requested_by=rita)
    client.force_login(member(tenant, Role.VIEWER))

    assert listing(client, status="completed") == [completed.pk]
    assert listing(client, agent="invoice") == [invoice.pk]
    assert listing(client, requester=rita.username) == [asked.pk]


def test_run_list_filters_by_date_range_in_utc_days(client):
    tenant = TenantFactory()
    now = timezone.now()
    old = stored_run(tenant, created_at=now - timedelta(days=10))
    recent = stored_run(tenant, created_at=now - timedelta(days=1))
    client.force_login(member(tenant, Role.VIEWER))
    day = (now - timedelta(days=1)).date().isoformat()

    assert listing(client, since=day) == [recent.pk]
    assert listing(client, until=(now - timedelta(days=5)).date().isoformat()) == [old.pk]
    assert listing(client, since=day, until=day) == [recent.pk]


def test_run_list_searches_titles_numbers_and_argument_values(client):
    tenant = TenantFactory()
    titled = stored_run(tenant, title="Deploy release 2026.07.25 to staging")
    called = stored_run(tenant, title="Deploy")
    stored_ticket(tenant, run=called, arguments='{"release":"2026.07.25"}')
    stored_run(tenant, title="Unrelated")
    client.force_login(member(tenant, Role.VIEWER))

    assert listing(client, q="2026.07.25") == [called.pk, titled.pk]
    assert listing(client, q=f"#{titled.pk}") == [titled.pk]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"status": "sleeping"}, "There is no status called &#x27;sleeping&#x27; here."),
        ({"agent": "nope"}, "There is no agent called &#x27;nope&#x27;."),
        ({"since": "2026-02-30"}, "Enter a valid date."),
        ({"since": "2026-07-02", "until": "2026-07-01"}, "The start date is after the end date."),
        ({"q": "x" * 101}, "Ensure this value has at most 100 characters (it has 101)."),
        ({"after": "garbage!"}, "that page link is broken or out of date"),
    ],
)
def test_run_list_unusable_filter_is_400_with_the_reason(client, params, message):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(f"{RUNS}?{urlencode(params)}")

    assert response.status_code == 400
    assert message in response.content.decode()


def test_run_list_requester_of_another_tenant_is_refused_like_a_name_nobody_has(client):
    mine, theirs = TenantFactory(), TenantFactory()
    outsider = member(theirs, Role.VIEWER)
    client.force_login(member(mine, Role.VIEWER))

    response = client.get(f"{RUNS}?requester={outsider.username}")

    assert response.status_code == 400
    assert f"Nobody called &#x27;{outsider.username}&#x27; is a member" in response.content.decode()


def test_run_list_pages_by_keyset_without_duplicates_or_gaps(client):
    tenant = TenantFactory()
    now = timezone.now()
    runs = [stored_run(tenant, created_at=now - timedelta(minutes=i)) for i in range(30)]
    client.force_login(member(tenant, Role.VIEWER))

    first = client.get(RUNS)
    second = client.get(f"{RUNS}?{first.context['next_query']}")

    assert shown(first) + shown(second) == [r.pk for r in runs]
    assert second.context["next_query"] == ""
    assert "Older runs →" in first.content.decode()


def test_run_list_queries_do_not_grow_with_rows(client, django_assert_num_queries):
    tenant = TenantFactory()
    stored_run(tenant, requested_by=member(tenant, Role.VIEWER))
    client.force_login(member(tenant, Role.VIEWER))
    at_one = queries_for(client, RUNS)

    for _ in range(2):
        stored_run(tenant, requested_by=member(tenant, Role.VIEWER), status=RunStatus.COMPLETED)
    with django_assert_num_queries(at_one):
        response = client.get(RUNS)
    assert len(shown(response)) == 3


def test_run_list_htmx_request_for_rows_returns_the_partial_only(client):
    tenant = TenantFactory()
    run = stored_run(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(RUNS, headers={"HX-Request": "true", "HX-Target": "runs-rows"})

    body = response.content.decode().strip()
    assert body.startswith('<div id="runs-rows"')
    assert "<html" not in body
    assert f'id="run-row-{run.pk}"' in body


def test_run_list_empty_says_so_and_offers_to_clear_filters(client):
    tenant = TenantFactory()
    stored_run(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    body = client.get(f"{RUNS}?status=failed").content.decode()

    assert "No runs match these filters." in body
    assert '<a href="/runs/?tenant=">Show every run</a>' in body


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER, Role.AUDITOR, Role.ADMIN])
def test_navigation_links_the_runs_list_for_every_member(client, role):
    tenant = TenantFactory()
    client.force_login(member(tenant, role))

    body = client.get(reverse("approvals:queue")).content.decode()

    assert '<a href="/runs/" >Runs</a>' in body
    assert 'action="/search/" class="header-search" role="search"' in body


def test_run_page_shows_its_whole_final_output_and_leads_back_to_the_list(client):
    tenant = TenantFactory()
    output = "Release 2026.07.24 is live.\n" + "All checks passed. " * 40
    run = stored_run(tenant, status=RunStatus.COMPLETED, final_output=output)
    client.force_login(member(tenant, Role.VIEWER))

    body = client.get(reverse("approvals:run", args=[run.pk])).content.decode()

    assert ("All checks passed. " * 40).strip() in body
    assert '<a href="/runs/">Runs</a> / Run' in body


def test_run_list_rows_are_a_keyboard_list_and_the_footer_says_so(client):
    tenant = TenantFactory()
    run = stored_run(tenant)
    client.force_login(member(tenant, Role.APPROVER))

    body = client.get(RUNS).content.decode()

    assert '<table class="queue runs stack" data-keyboard-list>' in body
    assert f'<tr data-row id="run-row-{run.pk}"' in body
    assert re.findall(r'data-hint="([^"]+)"', body) == ["j/k", "Enter"]


def test_run_list_without_rows_promises_no_keys(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.APPROVER))

    body = client.get(RUNS).content.decode()

    assert re.findall(r'data-hint="([^"]+)"', body) == []
