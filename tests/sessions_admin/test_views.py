"""The sessions pages: list, detail, clear and purge, for admins only and per tenant."""

from __future__ import annotations

import asyncio
import html
import json
from urllib.parse import urlencode

import pytest
from agents.memory import SQLiteSession
from django.urls import reverse
from django.utils.html import escape

from approvals.models import AuditEvent, Role, Tenant
from sessions_admin.models import ConversationRecord, StoredItem, StoredSession
from sessions_admin.stores import sqlite_path
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db

LIST = reverse("sessions_admin:list")
PURGE = reverse("sessions_admin:purge")
CONFIRM = reverse("sessions_admin:purge-confirm")
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"

CALL_ARGUMENTS = {"release": "2026.07.24", "environment": "production"}
CONVERSATION = [
    {"role": "user", "content": "Deploy release 2026.07.24 to production"},
    {
        "type": "function_call",
        "name": "deploy_release",
        "call_id": "call_1",
        "arguments": json.dumps(CALL_ARGUMENTS),
    },
    {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "Release 2026.07.24 is live on production.",
    },
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Done: 2026.07.24 is live."}],
    },
]


@pytest.fixture(autouse=True)
def _local_stores(settings, tmp_path):
    """SQLite sessions under tmp_path; no Redis unless a test points REDIS_URL somewhere."""
    settings.APPROVALS_SQLITE_SESSION_DIR = tmp_path / "sessions"
    settings.APPROVALS_SQLITE_SESSION_DIR.mkdir()
    settings.REDIS_URL = ""
    settings.APPROVALS_OPENAI_BASE_URL = ""


@pytest.fixture
def acme() -> Tenant:
    return TenantFactory(slug="acme")


@pytest.fixture
def admin_client(client, acme):
    client.force_login(member(acme, Role.ADMIN, username="acme-admin"))
    return client


def orm_session(tenant: Tenant, session_id: str, items: list | None = None) -> StoredSession:
    stored = StoredSession.objects.create(tenant=tenant, session_id=session_id)
    StoredItem.objects.bulk_create(
        StoredItem(session=stored, data=item) for item in (items or CONVERSATION[:1])
    )
    return stored


def sqlite_session(tenant: Tenant, session_id: str, items: list | None = None) -> None:
    session = SQLiteSession(session_id, sqlite_path(tenant))
    try:
        asyncio.run(session.add_items(items or CONVERSATION[:1]))
    finally:
        session.close()


def detail_url(store: str, tenant: str, session_id: str) -> str:
    return (
        reverse("sessions_admin:detail", args=[store, tenant]) + "?" + urlencode({"id": session_id})
    )


def clear_url(store: str, tenant: str, session_id: str) -> str:
    return (
        reverse("sessions_admin:clear", args=[store, tenant]) + "?" + urlencode({"id": session_id})
    )


def listed(response) -> list[str]:
    """The data-session keys of the rows on a list page, in order."""
    body = response.content.decode()
    return [chunk.split('"', 1)[0] for chunk in body.split('data-session="')[1:]]


def orm_ids(tenant: Tenant) -> list[str]:
    return sorted(StoredSession.objects.filter(tenant=tenant).values_list("session_id", flat=True))


def cleared_events() -> list[tuple[str, str, str, int]]:
    return sorted(
        (e.tenant.slug, e.detail["store"], e.detail["session_id"], e.detail["items"])
        for e in AuditEvent.objects.filter(action="session.cleared").select_related("tenant")
    )


# --- list -------------------------------------------------------------------------------------


def test_list_shows_the_admins_sessions_from_every_store(admin_client, acme):
    globex = TenantFactory(slug="globex")
    orm_session(acme, "support-1", CONVERSATION)
    sqlite_session(acme, "support-2")
    ConversationRecord.objects.create(tenant=acme, conversation_id="conv_1")
    orm_session(globex, "globex-only")

    response = admin_client.get(LIST)

    assert response.status_code == 200
    assert listed(response) == [
        "django:acme:support-1",
        "sqlite:acme:support-2",
        "openai_conversations:acme:conv_1",
    ]
    body = response.content.decode()
    assert f'href="{detail_url("django", "acme", "support-1")}"' in body
    assert f'href="{clear_url("sqlite", "acme", "support-2")}"' in body
    assert "globex-only" not in body


def test_list_filters_by_store_and_prefix(admin_client, acme):
    orm_session(acme, "test-1")
    orm_session(acme, "support-1")
    sqlite_session(acme, "test-2")

    response = admin_client.get(LIST, {"backend": "django", "prefix": "test-"})

    assert response.status_code == 200
    assert listed(response) == ["django:acme:test-1"]


def test_list_with_nothing_matching_says_so(admin_client, acme):
    response = admin_client.get(LIST, {"prefix": "nothing-"})

    assert response.status_code == 200
    assert listed(response) == []
    assert "No sessions match." in response.content.decode()


def test_list_with_unreachable_redis_shows_its_error_and_lists_the_others(
    admin_client, acme, settings
):
    settings.REDIS_URL = UNREACHABLE_REDIS
    orm_session(acme, "support-1")
    sqlite_session(acme, "support-2")

    response = admin_client.get(LIST)

    body = response.content.decode()
    assert response.status_code == 200
    assert listed(response) == ["django:acme:support-1", "sqlite:acme:support-2"]
    assert body.count('class="callout error store-error"') == 1
    assert '<div class="callout error store-error" role="alert" data-store="redis">' in body
    assert "Redis at redis://127.0.0.1:1: " in body
    assert "this is not an empty store" in body
    assert "No sessions match." not in body


def test_list_with_only_unreachable_redis_is_not_an_empty_store(admin_client, acme, settings):
    settings.REDIS_URL = UNREACHABLE_REDIS

    response = admin_client.get(LIST, {"backend": "redis"})

    body = response.content.decode()
    assert response.status_code == 200
    assert 'data-store="redis"' in body
    assert "No sessions match." not in body


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"backend": "mongo"}, "There is no store called 'mongo' here."),
        # Redis is not configured in these tests, so it is not a store here either.
        ({"backend": "redis"}, "There is no store called 'redis' here."),
        (
            {"older_than": "7x"},
            "'7x' is not an age: use a number and m, h, d or w, such as 7d.",
        ),
        ({"older_than": "999999d"}, "'999999d' is too long ago."),
        ({"tenant": "globex"}, "You are not an admin of a tenant called 'globex'."),
    ],
)
def test_list_with_bad_filters_is_400_with_the_message(admin_client, acme, query, message):
    TenantFactory(slug="globex")
    orm_session(acme, "support-1")

    response = admin_client.get(LIST, query)

    body = response.content.decode()
    assert response.status_code == 400
    assert f"<li>{escape(message)}</li>" in body
    assert listed(response) == []


# --- detail -----------------------------------------------------------------------------------


def test_detail_renders_messages_tool_call_output_and_raw_json(admin_client, acme):
    orm_session(acme, "support-1", CONVERSATION)

    response = admin_client.get(detail_url("django", "acme", "support-1"))

    body = response.content.decode()
    assert response.status_code == 200
    assert "4 items" in body
    assert body.count('<li class="entry entry-') == 4
    assert (
        '<span class="who">User</span> <div class="text">'
        "Deploy release 2026.07.24 to production</div>" in body
    )
    assert '<span class="who">Tool call</span> <span class="tool">deploy_release</span>' in body
    assert '<span class="muted">release</span> <code>&quot;2026.07.24&quot;</code>' in body
    assert '<span class="muted">environment</span> <code>&quot;production&quot;</code>' in body
    assert (
        '<span class="who">Tool result</span> <div class="text">'
        "Release 2026.07.24 is live on production.</div>" in body
    )
    assert (
        '<span class="who">Assistant</span> <div class="text">Done: 2026.07.24 is live.</div>'
        in body
    )
    raw = body.split('<pre class="wrap">', 1)[1].split("</pre>", 1)[0]
    # PostgreSQL's jsonb keeps its own key order: compare the documents, not the text.
    assert json.loads(html.unescape(raw)) == CONVERSATION


def test_detail_of_a_sqlite_session_reads_the_file(admin_client, acme):
    sqlite_session(acme, "support-2", CONVERSATION)

    response = admin_client.get(detail_url("sqlite", "acme", "support-2"))

    assert response.status_code == 200
    assert '<span class="tool">deploy_release</span>' in response.content.decode()


def test_detail_of_an_empty_session_says_it_has_no_items(admin_client, acme):
    StoredSession.objects.create(tenant=acme, session_id="empty-1")

    response = admin_client.get(detail_url("django", "acme", "empty-1"))

    assert response.status_code == 200
    assert "This session has no items." in response.content.decode()


def test_detail_of_a_session_id_with_a_slash(admin_client, acme):
    orm_session(acme, "team/alpha")

    response = admin_client.get(detail_url("django", "acme", "team/alpha"))

    assert response.status_code == 200
    assert "<h1><code>team/alpha</code></h1>" in response.content.decode()


def test_detail_of_a_session_id_ending_in_clear_is_its_own_detail(admin_client, acme):
    orm_session(acme, "x")
    orm_session(acme, "x/clear", CONVERSATION)

    response = admin_client.get(detail_url("django", "acme", "x/clear"))

    # The list links here for "x/clear"; it must not be the clear page of "x".
    assert response.status_code == 200
    assert [t.name for t in response.templates][:1] == ["sessions_admin/detail.html"]
    assert "<h1><code>x/clear</code></h1>" in response.content.decode()


def test_list_with_a_session_whose_id_is_empty_still_lists_the_others(admin_client, acme):
    orm_session(acme, "support-1")
    # The SDK's sessions accept any string as an id, the empty one included.
    orm_session(acme, "")

    response = admin_client.get(LIST)

    assert response.status_code == 200
    assert "django:acme:support-1" in listed(response)


def test_detail_escapes_what_the_session_holds(admin_client, acme):
    orm_session(acme, "support-1", [{"role": "user", "content": "<script>alert(1)</script>"}])

    body = admin_client.get(detail_url("django", "acme", "support-1")).content.decode()

    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


@pytest.mark.parametrize(
    "url",
    [
        detail_url("django", "acme", "missing"),
        detail_url("mongo", "acme", "support-1"),
        detail_url("django", "initech", "support-1"),
    ],
)
def test_detail_of_what_does_not_exist_is_404(admin_client, acme, url):
    orm_session(acme, "support-1")

    assert admin_client.get(url).status_code == 404


def test_detail_with_unreachable_redis_is_503_and_says_the_history_is_not_empty(
    admin_client, acme, settings
):
    settings.REDIS_URL = UNREACHABLE_REDIS

    response = admin_client.get(detail_url("redis", "acme", "support-1"))

    body = response.content.decode()
    assert response.status_code == 503
    assert "Redis cannot be read." in body
    assert "The history is not shown; it is not empty." in body
    assert "This session has no items." not in body


# --- clear ------------------------------------------------------------------------------------


def test_clear_get_asks_for_confirmation_and_changes_nothing(admin_client, acme):
    orm_session(acme, "support-1", CONVERSATION)

    response = admin_client.get(clear_url("django", "acme", "support-1"))

    body = response.content.decode()
    assert response.status_code == 200
    assert "<h1>Clear <code>support-1</code>?</h1>" in body
    assert "<strong>4 items</strong> from Django ORM (Acme)" in body
    assert f'<form method="post" action="{clear_url("django", "acme", "support-1")}">' in body
    assert orm_ids(acme) == ["support-1"]
    assert AuditEvent.objects.count() == 0


def test_clear_post_clears_the_session_and_audits_it(admin_client, acme):
    orm_session(acme, "support-1", CONVERSATION)
    orm_session(acme, "support-2")
    admin = admin_client.session["_auth_user_id"]

    response = admin_client.post(clear_url("django", "acme", "support-1"), follow=True)

    assert response.redirect_chain == [(LIST, 302)]
    assert "Cleared support-1 (4 items)." in response.content.decode()
    assert listed(response) == ["django:acme:support-2"]
    assert orm_ids(acme) == ["support-2"]
    assert StoredItem.objects.count() == 1
    event = AuditEvent.objects.get(action="session.cleared")
    assert (str(event.actor_id), event.detail) == (
        admin,
        {"store": "django", "session_id": "support-1", "items": 4},
    )


def test_clear_post_in_a_sqlite_file_leaves_the_others(admin_client, acme):
    sqlite_session(acme, "support-1", CONVERSATION)
    sqlite_session(acme, "support-2")

    response = admin_client.post(clear_url("sqlite", "acme", "support-1"))

    assert response.status_code == 302
    assert listed(admin_client.get(LIST)) == ["sqlite:acme:support-2"]
    assert cleared_events() == [("acme", "sqlite", "support-1", 4)]


def test_clear_post_of_a_missing_session_is_404_and_audits_nothing(admin_client, acme):
    response = admin_client.post(clear_url("django", "acme", "missing"))

    assert response.status_code == 404
    assert AuditEvent.objects.count() == 0


def test_clear_post_with_unreachable_redis_is_503_and_clears_nothing(admin_client, acme, settings):
    settings.REDIS_URL = UNREACHABLE_REDIS

    response = admin_client.post(clear_url("redis", "acme", "support-1"))

    body = response.content.decode()
    assert response.status_code == 503
    assert "Redis cannot be reached." in body
    assert "Nothing was cleared." in body
    assert AuditEvent.objects.count() == 0


def test_clear_refuses_other_methods(admin_client, acme):
    orm_session(acme, "support-1")

    response = admin_client.put(clear_url("django", "acme", "support-1"))

    assert response.status_code == 405
    assert orm_ids(acme) == ["support-1"]


# --- purge ------------------------------------------------------------------------------------


def test_purge_page_without_filters_shows_the_form_only(admin_client, acme):
    orm_session(acme, "test-1")

    response = admin_client.get(PURGE)

    body = response.content.decode()
    assert response.status_code == 200
    assert 'id="dry-run"' not in body
    assert orm_ids(acme) == ["test-1"]


def test_purge_page_without_prefix_or_age_is_400(admin_client, acme):
    orm_session(acme, "test-1")

    response = admin_client.get(PURGE, {"backend": "django"})

    assert response.status_code == 400
    assert "Give an id prefix or an age: a purge never takes every session." in (
        response.content.decode()
    )


def test_purge_dry_run_shows_counts_and_a_sample_and_changes_nothing(admin_client, acme):
    orm_session(acme, "test-1", CONVERSATION)
    orm_session(acme, "test-2")
    orm_session(acme, "support-1")
    sqlite_session(acme, "test-3", CONVERSATION[:2])

    response = admin_client.get(PURGE, {"prefix": "test-"})

    body = response.content.decode()
    assert response.status_code == 200
    assert "<h2>Dry run: 3 sessions would be cleared</h2>" in body
    assert (
        '<tr data-store="django"><td>django</td>\n      <td>2</td><td>5</td>'
        "<td><code>acme/test-1</code>, <code>acme/test-2</code></td></tr>" in body
    )
    assert (
        '<tr data-store="sqlite"><td>sqlite</td>\n      <td>1</td><td>2</td>'
        "<td><code>acme/test-3</code></td></tr>" in body
    )
    assert "Type <strong>3</strong> to clear these sessions" in body
    assert '<input type="hidden" name="prefix" value="test-">' in body
    assert orm_ids(acme) == ["support-1", "test-1", "test-2"]
    assert AuditEvent.objects.count() == 0


def test_purge_confirm_with_the_wrong_count_is_409_and_clears_nothing(admin_client, acme):
    orm_session(acme, "test-1")
    orm_session(acme, "test-2")

    response = admin_client.post(CONFIRM, {"prefix": "test-", "confirm": "3"})

    assert response.status_code == 409
    assert "You typed 3, but 2 sessions match now. Nothing was purged;" in response.content.decode()
    assert orm_ids(acme) == ["test-1", "test-2"]
    assert AuditEvent.objects.count() == 0


def test_purge_confirm_with_no_count_is_409(admin_client, acme):
    orm_session(acme, "test-1")

    response = admin_client.post(CONFIRM, {"prefix": "test-"})

    assert response.status_code == 409
    assert "You typed nothing, but 1 sessions match now." in response.content.decode()
    assert orm_ids(acme) == ["test-1"]


def test_purge_confirm_with_the_right_count_clears_matching_sessions_only(admin_client, acme):
    globex = TenantFactory(slug="globex")
    orm_session(acme, "test-1", CONVERSATION)
    orm_session(acme, "support-1")
    sqlite_session(acme, "test-2")
    sqlite_session(acme, "support-2")
    orm_session(globex, "test-1")

    response = admin_client.post(CONFIRM, {"prefix": "test-", "confirm": "2"}, follow=True)

    assert response.redirect_chain == [(LIST, 302)]
    assert "Purged 2 sessions (5 items)." in response.content.decode()
    assert listed(admin_client.get(LIST)) == ["django:acme:support-1", "sqlite:acme:support-2"]
    # Another tenant's session with a matching id is not this admin's to purge.
    assert orm_ids(globex) == ["test-1"]
    assert cleared_events() == [("acme", "django", "test-1", 4), ("acme", "sqlite", "test-2", 1)]


def test_purge_confirm_without_prefix_or_age_is_400(admin_client, acme):
    orm_session(acme, "test-1")

    response = admin_client.post(CONFIRM, {"backend": "django", "confirm": "1"})

    assert response.status_code == 400
    assert orm_ids(acme) == ["test-1"]


def test_purge_confirm_with_an_unreadable_store_clears_nothing(admin_client, acme, settings):
    settings.REDIS_URL = UNREACHABLE_REDIS
    orm_session(acme, "test-1")

    response = admin_client.post(CONFIRM, {"prefix": "test-", "confirm": "1"})

    assert response.status_code == 409
    assert "Some stores cannot be read, so nothing was purged." in response.content.decode()
    assert orm_ids(acme) == ["test-1"]
    assert AuditEvent.objects.count() == 0


def test_purge_confirm_refuses_get(admin_client, acme):
    orm_session(acme, "test-1")

    response = admin_client.get(CONFIRM, {"prefix": "test-", "confirm": "1"})

    assert response.status_code == 405
    assert orm_ids(acme) == ["test-1"]


# --- who may see the pages ----------------------------------------------------------------------


def _every_page(client) -> dict[str, int]:
    return {
        "list": client.get(LIST).status_code,
        "detail": client.get(detail_url("django", "acme", "support-1")).status_code,
        "clear": client.get(clear_url("django", "acme", "support-1")).status_code,
        "clear POST": client.post(clear_url("django", "acme", "support-1")).status_code,
        "purge": client.get(PURGE, {"prefix": "support-"}).status_code,
        "purge POST": client.post(CONFIRM, {"prefix": "support-", "confirm": "1"}).status_code,
    }


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER, Role.AUDITOR])
def test_non_admin_gets_404_on_every_sessions_page(client, acme, role):
    orm_session(acme, "support-1")
    client.force_login(member(acme, role))

    statuses = _every_page(client)

    assert statuses == dict.fromkeys(statuses, 404)
    assert orm_ids(acme) == ["support-1"]
    assert AuditEvent.objects.filter(action="session.cleared").count() == 0


def test_admin_of_another_tenant_gets_404_for_this_tenants_session(client, acme):
    orm_session(acme, "support-1")
    globex = TenantFactory(slug="globex")
    user = member(globex, Role.ADMIN)
    # An admin elsewhere and a viewer here is still not an admin here.
    member(acme, Role.VIEWER, username=user.username)
    client.force_login(user)

    statuses = _every_page(client)

    assert statuses == {
        "list": 200,
        "detail": 404,
        "clear": 404,
        "clear POST": 404,
        "purge": 200,
        # None of this admin's sessions match, so the typed 1 is wrong.
        "purge POST": 409,
    }
    assert listed(client.get(LIST)) == []
    assert "Dry run: 0 sessions" in client.get(PURGE, {"prefix": "support-"}).content.decode()
    assert orm_ids(acme) == ["support-1"]
    assert AuditEvent.objects.filter(action="session.cleared").count() == 0


def test_admin_of_another_tenant_cannot_name_this_tenant_in_a_purge(client, acme):
    orm_session(acme, "support-1")
    client.force_login(member(TenantFactory(slug="globex"), Role.ADMIN))

    response = client.post(CONFIRM, {"prefix": "support-", "tenant": "acme", "confirm": "1"})

    assert response.status_code == 400
    assert escape("You are not an admin of a tenant called 'acme'.") in (response.content.decode())
    assert orm_ids(acme) == ["support-1"]


def test_anonymous_is_sent_to_sign_in(client, acme):
    response = client.get(LIST)

    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={LIST}"
