"""clear_session, plan_purge, purge and the purge_sessions command, across the ORM, SQLite files
and Redis: a dry run changes nothing; a purge clears only matching sessions, each one audited."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from datetime import timedelta
from io import StringIO

import pytest
import redis
from agents.extensions.memory import RedisSession
from agents.memory import SQLiteSession
from django.core.management import CommandError, call_command
from django.utils import timezone

from approvals.models import AuditEvent, Tenant
from sessions_admin import services
from sessions_admin.models import StoredItem, StoredSession
from sessions_admin.stores import (
    STORES,
    Filters,
    SessionMissing,
    list_sessions,
    redis_prefix,
    sqlite_path,
)
from tests.support import TenantFactory

pytestmark = pytest.mark.django_db

REDIS_TEST_URL = "redis://127.0.0.1:6379/14"
BACKENDS = ["django", "sqlite", "redis"]
# session id -> idle days; two items each.
SESSIONS = {"test-old-1": 10, "test-fresh-1": 0, "support-old-1": 10, "support-fresh-1": 0}


@pytest.fixture
def stores(settings, tmp_path):
    """Sessions in every local backend, for two tenants: SQLite under tmp_path, Redis db 14."""
    prefix = f"test-purge-f:{uuid.uuid4().hex}"
    settings.APPROVALS_SQLITE_SESSION_DIR = tmp_path / "sessions"
    settings.APPROVALS_SQLITE_SESSION_DIR.mkdir()
    settings.REDIS_URL = REDIS_TEST_URL
    settings.APPROVALS_REDIS_SESSION_PREFIX = prefix
    tenants = [TenantFactory(slug="acme"), TenantFactory(slug="globex")]
    for tenant in tenants:
        _seed(tenant)
    yield tenants
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _conversation(session_id: str) -> list[dict]:
    return [
        {"role": "user", "content": f"Question about {session_id}"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "An answer."}],
        },
    ]


def _seed(tenant: Tenant) -> None:
    now = timezone.now()
    for session_id, idle_days in SESSIONS.items():
        then = now - timedelta(days=idle_days)
        stored = StoredSession.objects.create(
            tenant=tenant, session_id=session_id, created_at=then, updated_at=then
        )
        StoredItem.objects.bulk_create(
            StoredItem(session=stored, data=item, created_at=then)
            for item in _conversation(session_id)
        )

        path = sqlite_path(tenant)
        session = SQLiteSession(session_id, path)
        try:
            asyncio.run(session.add_items(_conversation(session_id)))
        finally:
            session.close()
        stamp = then.strftime("%Y-%m-%d %H:%M:%S")
        with sqlite3.connect(path) as connection:
            connection.execute(
                "UPDATE agent_sessions SET created_at = ?, updated_at = ? WHERE session_id = ?",
                (stamp, stamp, session_id),
            )
            connection.execute(
                "UPDATE agent_messages SET created_at = ? WHERE session_id = ?",
                (stamp, session_id),
            )
        connection.close()

        asyncio.run(_seed_redis(tenant, session_id, int(then.timestamp())))


async def _seed_redis(tenant: Tenant, session_id: str, stamp: int) -> None:
    session = RedisSession.from_url(session_id, url=REDIS_TEST_URL, key_prefix=redis_prefix(tenant))
    try:
        await session.add_items(_conversation(session_id))
    finally:
        await session.close()
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        client.hset(
            f"{redis_prefix(tenant)}:{session_id}",
            mapping={"created_at": stamp, "updated_at": stamp},
        )
    finally:
        client.close()


def _snapshot() -> dict[str, list[tuple[str, str, int]]]:
    """Every session of every backend with its item count, read back through the stores."""
    listing = list_sessions(
        Filters(tenants=list(Tenant.objects.order_by("slug"))), [STORES[b] for b in BACKENDS]
    )
    assert listing.errors == {}
    snapshot: dict[str, list[tuple[str, str, int]]] = {b: [] for b in BACKENDS}
    for info in listing.sessions:
        snapshot[info.store].append((info.tenant.slug, info.session_id, info.items))
    return {store: sorted(rows) for store, rows in snapshot.items()}


def _everything_but(*cleared: str) -> dict[str, list[tuple[str, str, int]]]:
    rows = sorted(
        (slug, session_id, 2)
        for slug in ("acme", "globex")
        for session_id in SESSIONS
        if session_id not in cleared
    )
    return dict.fromkeys(BACKENDS, rows)


def _cleared_events() -> list[tuple[str, str, str, int, str]]:
    return sorted(
        (e.tenant.slug, e.detail["store"], e.detail["session_id"], e.detail["items"], e.outcome)
        for e in AuditEvent.objects.filter(action="session.cleared").select_related("tenant")
    )


# --- services ---------------------------------------------------------------------------------


def test_seeded_stores_hold_every_session_everywhere(stores):
    assert _snapshot() == _everything_but()


def test_plan_purge_is_a_dry_run_that_changes_nothing(stores):
    before = _snapshot()

    plan = services.plan_purge(
        store_names=BACKENDS, filters=Filters(prefix="test-", tenants=stores)
    )

    assert plan.count == 12
    assert plan.errors == {}
    assert [(p.store, len(p.sessions), p.items) for p in plan.stores] == [
        ("django", 4, 8),
        ("sqlite", 4, 8),
        ("redis", 4, 8),
    ]
    # Stores order their samples differently; what matters is which sessions.
    assert sorted(plan.stores[0].sample) == [
        "acme/test-fresh-1",
        "acme/test-old-1",
        "globex/test-fresh-1",
        "globex/test-old-1",
    ]
    assert _snapshot() == before
    assert AuditEvent.objects.count() == 0


def test_purge_by_prefix_clears_only_matching_sessions_in_every_backend(stores):
    plan = services.plan_purge(
        store_names=BACKENDS, filters=Filters(prefix="test-", tenants=stores)
    )

    result = services.purge(plan=plan, actor_name="test")

    assert result.failed == []
    assert len(result.cleared) == 12
    assert {c[3] for c in result.cleared} == {2}
    assert _snapshot() == _everything_but("test-old-1", "test-fresh-1")
    events = _cleared_events()
    assert len(events) == 12
    assert events[:3] == [
        ("acme", "django", "test-fresh-1", 2, "cleared"),
        ("acme", "django", "test-old-1", 2, "cleared"),
        ("acme", "redis", "test-fresh-1", 2, "cleared"),
    ]
    assert set(AuditEvent.objects.values_list("actor_name", flat=True)) == {"test"}


def test_purge_by_age_clears_only_idle_sessions(stores):
    cutoff = timezone.now() - timedelta(days=7)
    plan = services.plan_purge(
        store_names=BACKENDS, filters=Filters(prefix="", older_than=cutoff, tenants=stores)
    )

    result = services.purge(plan=plan)

    assert sorted({c[2] for c in result.cleared}) == ["support-old-1", "test-old-1"]
    assert len(result.cleared) == 12
    assert _snapshot() == _everything_but("test-old-1", "support-old-1")
    assert len(_cleared_events()) == 12


def test_purge_by_prefix_is_case_sensitive_in_every_backend(stores):
    acme, _ = stores
    # SQLite's LIKE ignores case: the stores must not let "test-" take "TEST-keep".
    StoredItem.objects.create(
        session=StoredSession.objects.create(tenant=acme, session_id="TEST-keep"), data={}
    )
    session = SQLiteSession("TEST-keep", sqlite_path(acme))
    try:
        asyncio.run(session.add_items(_conversation("TEST-keep")))
    finally:
        session.close()
    asyncio.run(_seed_redis(acme, "TEST-keep", int(time.time())))

    plan = services.plan_purge(
        store_names=BACKENDS, filters=Filters(prefix="test-", tenants=stores)
    )
    services.purge(plan=plan)

    snapshot = _snapshot()
    for store in BACKENDS:
        assert [r[:2] for r in snapshot[store] if r[0] == "acme"] == [
            ("acme", "TEST-keep"),
            ("acme", "support-fresh-1"),
            ("acme", "support-old-1"),
        ]


def test_purge_for_one_tenant_leaves_the_other_intact(stores):
    acme, globex = stores
    plan = services.plan_purge(
        store_names=BACKENDS, filters=Filters(prefix="test-old", tenants=[acme])
    )

    services.purge(plan=plan)

    snapshot = _snapshot()
    for store in BACKENDS:
        assert [r for r in snapshot[store] if r[0] == "globex"] == [
            r for r in _everything_but()[store] if r[0] == "globex"
        ]
        assert ("acme", "test-old-1", 2) not in snapshot[store]
    assert {e[0] for e in _cleared_events()} == {"acme"}


def test_purge_reports_a_session_that_vanished_after_the_plan_and_goes_on(stores):
    acme, _ = stores
    plan = services.plan_purge(
        store_names=["django"], filters=Filters(prefix="test-", tenants=[acme])
    )
    StoredSession.objects.filter(tenant=acme, session_id="test-old-1").delete()

    result = services.purge(plan=plan)

    assert [c[2] for c in result.cleared] == ["test-fresh-1"]
    assert [(f[0], f[1]) for f in result.failed] == [("django", "acme")]
    assert result.failed[0][2].startswith("test-old-1: ")
    assert [e[2] for e in _cleared_events()] == ["test-fresh-1"]


def test_clear_session_audits_store_id_and_count(stores):
    acme, _ = stores

    count = services.clear_session(store_name="sqlite", tenant=acme, session_id="support-old-1")

    assert count == 2
    assert _cleared_events() == [("acme", "sqlite", "support-old-1", 2, "cleared")]
    assert ("acme", "support-old-1", 2) not in _snapshot()["sqlite"]
    assert ("acme", "support-old-1", 2) in _snapshot()["django"]


def test_clear_session_of_a_missing_session_audits_nothing(stores):
    acme, _ = stores

    with pytest.raises(SessionMissing):
        services.clear_session(store_name="redis", tenant=acme, session_id="nope")

    assert AuditEvent.objects.count() == 0
    assert _snapshot() == _everything_but()


# --- the command ----------------------------------------------------------------------------


def _purge(*args: str) -> str:
    out = StringIO()
    call_command("purge_sessions", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.parametrize("backend", BACKENDS)
def test_command_dry_run_changes_nothing(stores, backend):
    out = _purge("--backend", backend, "--prefix", "test-", "--dry-run")

    lines = out.splitlines()
    assert [lines[0], *sorted(lines[1:])] == [
        f"{backend}: would clear 4 sessions, 8 items",
        "  acme/test-fresh-1",
        "  acme/test-old-1",
        "  globex/test-fresh-1",
        "  globex/test-old-1",
    ]
    assert _snapshot() == _everything_but()
    assert AuditEvent.objects.count() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_command_yes_clears_by_prefix_and_age_only_in_that_backend(stores, backend):
    out = _purge("--backend", backend, "--prefix", "test-", "--older-than", "7d", "--yes")

    assert out.splitlines() == [
        f"{backend}: clearing 2 sessions, 4 items",
        "  acme/test-old-1",
        "  globex/test-old-1",
        f"{backend}: cleared 2 sessions, 4 items",
    ]
    expected = _everything_but()
    expected[backend] = _everything_but("test-old-1")[backend]
    assert _snapshot() == expected
    assert _cleared_events() == [
        ("acme", backend, "test-old-1", 2, "cleared"),
        ("globex", backend, "test-old-1", 2, "cleared"),
    ]
    assert set(AuditEvent.objects.values_list("actor_name", flat=True)) == {
        "purge_sessions command"
    }


def test_command_for_one_tenant(stores):
    out = _purge("--backend", "django", "--prefix", "support-", "--tenant", "globex", "--yes")

    assert out.splitlines()[-1] == "django: cleared 2 sessions, 4 items"
    assert [e[:3] for e in _cleared_events()] == [
        ("globex", "django", "support-fresh-1"),
        ("globex", "django", "support-old-1"),
    ]


def test_command_with_nothing_matching_clears_nothing(stores):
    out = _purge("--backend", "redis", "--prefix", "nothing-", "--yes")

    assert out.splitlines() == [
        "redis: clearing 0 sessions, 0 items",
        "redis: cleared 0 sessions, 0 items",
    ]
    assert _snapshot() == _everything_but()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--backend", "django", "--prefix", "test-", "--older-than", "7x"],
            "'7x' is not an age: use a number and m, h, d or w, such as 7d",
        ),
        (
            ["--backend", "django", "--prefix", "test-", "--older-than=-1d"],
            "'-1d' is not an age: use a number and m, h, d or w, such as 7d",
        ),
        (
            ["--backend", "mongo", "--prefix", "test-"],
            "no store 'mongo' here (configured: django, sqlite, redis, openai_conversations)",
        ),
        (
            ["--backend", "django", "--prefix", ""],
            "--prefix must not be empty: a purge never takes every session",
        ),
        (
            ["--backend", "django", "--prefix", "test-", "--tenant", "initech"],
            "no tenant 'initech'",
        ),
    ],
)
def test_command_refuses_bad_arguments_with_one_line(stores, args, message):
    with pytest.raises(CommandError) as raised:
        _purge(*args, "--yes")

    assert str(raised.value) == message
    assert "\n" not in str(raised.value)
    assert _snapshot() == _everything_but()
    assert AuditEvent.objects.count() == 0


def test_command_with_unreachable_redis_fails_and_clears_nothing(stores, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    with pytest.raises(
        CommandError, match=r"^redis cannot be read: Redis at redis://127\.0\.0\.1:1"
    ):
        _purge("--backend", "redis", "--prefix", "test-", "--yes")

    settings.REDIS_URL = REDIS_TEST_URL
    assert _snapshot() == _everything_but()
    assert AuditEvent.objects.count() == 0


def test_command_without_redis_url_does_not_offer_redis(stores, settings):
    settings.REDIS_URL = ""

    with pytest.raises(CommandError, match=r"^no store 'redis' here \(configured: django, sqlite"):
        _purge("--backend", "redis", "--prefix", "test-", "--dry-run")


def test_seeded_redis_timestamps_are_what_the_age_filter_reads(stores):
    acme, _ = stores
    infos = {
        i.session_id: i
        for i in STORES["redis"].list(Filters(tenants=[acme]))
        if i.session_id.endswith("old-1")
    }

    assert sorted(infos) == ["support-old-1", "test-old-1"]
    idle = time.time() - infos["test-old-1"].last_activity.timestamp()
    assert 9.9 * 86400 < idle < 10.1 * 86400
