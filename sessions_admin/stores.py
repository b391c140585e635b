"""Where agent conversations live, and how the console lists, reads and clears them.

The SDK's Session protocol cannot list sessions, so each store is read in its own way:
- django: the ORM tables of sessions_admin (tenant on each row);
- sqlite: one SQLiteSession file per tenant, APPROVALS_SQLITE_SESSION_DIR/<tenant>.sqlite3;
- redis: RedisSession keys under <APPROVALS_REDIS_SESSION_PREFIX>:<tenant>, found by SCAN;
- openai_conversations: the conversation ids runs used, read and deleted through the API.
A store that cannot be reached raises StoreUnavailable with the reason: never an empty list.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from agents.memory import OpenAIConversationsSession, SQLiteSession
from django.conf import settings
from django.db.models import Count, Max, Min

from approvals.execution import sessions as agent_sessions
from approvals.models import Tenant
from sessions_admin.models import ConversationRecord, StoredItem, StoredSession


class StoreUnavailable(Exception):
    pass


class SessionMissing(LookupError):
    pass


@dataclass
class SessionInfo:
    store: str
    session_id: str
    tenant: Tenant
    items: int | None
    first_activity: datetime | None
    last_activity: datetime | None

    @property
    def key(self) -> str:
        return f"{self.store}:{self.tenant.slug}:{self.session_id}"


@dataclass
class Filters:
    prefix: str = ""
    older_than: datetime | None = None
    tenants: list[Tenant] = field(default_factory=list)

    def matches(self, info: SessionInfo) -> bool:
        if self.prefix and not info.session_id.startswith(self.prefix):
            return False
        if self.older_than is not None:
            last = info.last_activity or info.first_activity
            if last is None or last >= self.older_than:
                return False
        return True


_AGE = {"m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> timedelta:
    """'7d', '12h', '30m', '2w' as a timedelta; ValueError with a sentence otherwise."""
    text = (text or "").strip().lower()
    if len(text) < 2 or text[-1] not in _AGE or not text[:-1].isdigit():
        raise ValueError(f"{text!r} is not an age: use a number and m, h, d or w, such as 7d")
    value = int(text[:-1])
    if value < 1:
        raise ValueError(f"{text!r} is no age at all: use at least 1")
    if value > 100000:
        raise ValueError(f"{text!r} is too long ago")
    return timedelta(seconds=value * _AGE[text[-1]])


def _parse_time(value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, bytes):
        value = value.decode()
    try:
        if isinstance(value, int | float) or (
            isinstance(value, str) and value.replace(".", "", 1).isdigit()
        ):
            return datetime.fromtimestamp(float(value), tz=UTC)
        parsed = datetime.fromisoformat(str(value).replace(" ", "T"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- django (ORM) ---------------------------------------------------------------------------


class DjangoStore:
    name = "django"
    label = "Django ORM"

    def list(self, filters: Filters) -> list[SessionInfo]:
        tenants = {t.pk: t for t in filters.tenants}
        rows = (
            StoredSession.objects.filter(tenant_id__in=tenants)
            .annotate(
                n=Count("items"), first=Min("items__created_at"), last=Max("items__created_at")
            )
            .order_by("session_id")
        )
        if filters.prefix:
            rows = rows.filter(session_id__startswith=filters.prefix)
        infos = [
            SessionInfo(
                self.name,
                r.session_id,
                tenants[r.tenant_id],
                r.n,
                r.first or r.created_at,
                r.last or r.updated_at,
            )
            for r in rows
        ]
        return [i for i in infos if filters.matches(i)]

    def items(self, tenant: Tenant, session_id: str) -> list[Any]:
        session = StoredSession.objects.filter(tenant=tenant, session_id=session_id).first()
        if session is None:
            raise SessionMissing(session_id)
        return list(
            StoredItem.objects.filter(session=session).order_by("id").values_list("data", flat=True)
        )

    def clear(self, tenant: Tenant, session_id: str) -> int:
        session = StoredSession.objects.filter(tenant=tenant, session_id=session_id).first()
        if session is None:
            raise SessionMissing(session_id)
        count, _ = StoredItem.objects.filter(session=session).delete()
        session.delete()
        return count


# --- sqlite files -----------------------------------------------------------------------------


def sqlite_path(tenant: Tenant) -> Path:
    return Path(settings.APPROVALS_SQLITE_SESSION_DIR) / f"{tenant.slug}.sqlite3"


class SQLiteStore:
    name = "sqlite"
    label = "SQLite files"

    def _connect(self, tenant: Tenant) -> sqlite3.Connection | None:
        path = sqlite_path(tenant)
        if not path.exists():
            return None
        try:
            connection = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=5)
            connection.execute("SELECT 1 FROM agent_sessions LIMIT 1")
        except sqlite3.Error as error:
            raise StoreUnavailable(f"{path.name}: {error}") from None
        return connection

    def list(self, filters: Filters) -> list[SessionInfo]:
        infos: list[SessionInfo] = []
        for tenant in filters.tenants:
            connection = self._connect(tenant)
            if connection is None:
                continue
            try:
                rows = connection.execute(
                    "SELECT s.session_id, s.created_at, s.updated_at, COUNT(m.id), MIN(m.created_at), MAX(m.created_at) "
                    "FROM agent_sessions s LEFT JOIN agent_messages m ON m.session_id = s.session_id "
                    "WHERE s.session_id LIKE ? ESCAPE '\\' GROUP BY s.session_id ORDER BY s.session_id",
                    (_like_prefix(filters.prefix),),
                ).fetchall()
            except sqlite3.Error as error:
                raise StoreUnavailable(f"{sqlite_path(tenant).name}: {error}") from None
            finally:
                connection.close()
            for session_id, created, updated, count, first, last in rows:
                infos.append(
                    SessionInfo(
                        self.name,
                        session_id,
                        tenant,
                        count,
                        _parse_time(first) or _parse_time(created),
                        _parse_time(last) or _parse_time(updated),
                    )
                )
        return [i for i in infos if filters.matches(i)]

    def items(self, tenant: Tenant, session_id: str) -> list[Any]:
        connection = self._connect(tenant)
        if connection is None:
            raise SessionMissing(session_id)
        try:
            exists = connection.execute(
                "SELECT 1 FROM agent_sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
            if not exists:
                raise SessionMissing(session_id)
            rows = connection.execute(
                "SELECT message_data FROM agent_messages WHERE session_id = ? ORDER BY id",
                (session_id,),
            ).fetchall()
        except sqlite3.Error as error:
            raise StoreUnavailable(str(error)) from None
        finally:
            connection.close()
        return [json.loads(row[0]) for row in rows]

    def clear(self, tenant: Tenant, session_id: str) -> int:
        count = len(self.items(tenant, session_id))
        session = SQLiteSession(session_id, sqlite_path(tenant))
        try:
            asyncio.run(session.clear_session())
        finally:
            session.close()
        return count


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


# --- redis ------------------------------------------------------------------------------------


def redis_prefix(tenant: Tenant) -> str:
    return f"{settings.APPROVALS_REDIS_SESSION_PREFIX}:{tenant.slug}"


class RedisStore:
    name = "redis"
    label = "Redis"

    def _run(self, work):
        """Run work(client) on a client this call owns, closed in finally whatever happens."""

        async def go():
            client = aioredis.from_url(
                settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=5
            )
            try:
                return await work(client)
            finally:
                await client.aclose()

        try:
            return asyncio.run(go())
        except (OSError, ConnectionError, TimeoutError) as error:
            raise StoreUnavailable(f"Redis at {_safe_url(settings.REDIS_URL)}: {error}") from None
        except Exception as error:
            if type(error).__module__.startswith("redis"):
                raise StoreUnavailable(
                    f"Redis at {_safe_url(settings.REDIS_URL)}: {error}"
                ) from None
            raise

    def list(self, filters: Filters) -> list[SessionInfo]:
        async def work(client) -> list[SessionInfo]:
            infos = []
            for tenant in filters.tenants:
                base = redis_prefix(tenant) + ":"
                async for raw_key in client.scan_iter(
                    match=_glob(base + filters.prefix) + "*", count=500, _type="HASH"
                ):
                    key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
                    session_id = key[len(base) :]
                    meta = await client.hgetall(key)
                    meta = {(k.decode() if isinstance(k, bytes) else k): v for k, v in meta.items()}
                    count = await client.llen(f"{key}:messages")
                    infos.append(
                        SessionInfo(
                            self.name,
                            session_id,
                            tenant,
                            count,
                            _parse_time(meta.get("created_at")),
                            _parse_time(meta.get("updated_at")),
                        )
                    )
            return infos

        infos = self._run(work)
        return sorted(
            (i for i in infos if filters.matches(i)), key=lambda i: (i.tenant.slug, i.session_id)
        )

    def items(self, tenant: Tenant, session_id: str) -> list[Any]:
        key = f"{redis_prefix(tenant)}:{session_id}"

        async def work(client) -> list[Any]:
            if not await client.exists(key):
                raise SessionMissing(session_id)
            return [json.loads(raw) for raw in await client.lrange(f"{key}:messages", 0, -1)]

        return self._run(work)

    def clear(self, tenant: Tenant, session_id: str) -> int:
        key = f"{redis_prefix(tenant)}:{session_id}"

        async def work(client) -> int:
            if not await client.exists(key):
                raise SessionMissing(session_id)
            count = await client.llen(f"{key}:messages")
            await client.delete(key, f"{key}:messages", f"{key}:counter")
            return count

        return self._run(work)


def _glob(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _safe_url(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}"


# --- OpenAI conversations -------------------------------------------------------------------


class ConversationsStore:
    name = "openai_conversations"
    label = "OpenAI Conversations"

    def _client(self):
        client = agent_sessions.openai_client()
        if client is None and not settings.OPENAI_API_KEY:
            raise StoreUnavailable(
                "OPENAI_API_KEY is not set, so recorded conversations cannot be read"
            )
        return client

    def list(self, filters: Filters) -> list[SessionInfo]:
        rows = (
            ConversationRecord.objects.filter(tenant__in=filters.tenants)
            .select_related("tenant")
            .order_by("conversation_id")
        )
        if filters.prefix:
            rows = rows.filter(conversation_id__startswith=filters.prefix)
        infos = [
            SessionInfo(self.name, r.conversation_id, r.tenant, None, r.first_seen, r.last_seen)
            for r in rows
        ]
        return [i for i in infos if filters.matches(i)]

    def _call(self, session_id: str, work):
        """work(session) on a conversations session whose client, if this call made it, is closed."""

        async def go():
            client = self._client()
            try:
                return await work(
                    OpenAIConversationsSession(conversation_id=session_id, openai_client=client)
                )
            finally:
                if client is not None:
                    await client.close()

        try:
            return asyncio.run(go())
        except StoreUnavailable:
            raise
        except Exception as error:
            raise StoreUnavailable(f"OpenAI Conversations: {error}") from None

    def items(self, tenant: Tenant, session_id: str) -> list[Any]:
        if not ConversationRecord.objects.filter(
            tenant=tenant, conversation_id=session_id
        ).exists():
            raise SessionMissing(session_id)
        return self._call(session_id, lambda session: session.get_items())

    def clear(self, tenant: Tenant, session_id: str) -> int:
        if not ConversationRecord.objects.filter(
            tenant=tenant, conversation_id=session_id
        ).exists():
            raise SessionMissing(session_id)

        async def clear(session) -> int:
            count = len(await session.get_items())
            await session.clear_session()
            return count

        count = self._call(session_id, clear)
        ConversationRecord.objects.filter(tenant=tenant, conversation_id=session_id).delete()
        return count


STORES = {
    store.name: store
    for store in (DjangoStore(), SQLiteStore(), RedisStore(), ConversationsStore())
}


def configured_stores() -> list:
    """The stores this deployment uses: Redis only with REDIS_URL."""
    return [s for s in STORES.values() if s.name != "redis" or settings.REDIS_URL]


def get_store(name: str):
    store = STORES.get(name)
    if store is None or store not in configured_stores():
        raise SessionMissing(f"no store named {name!r}")
    return store


@dataclass
class Listing:
    sessions: list[SessionInfo]
    errors: dict[str, str]


def list_sessions(filters: Filters, stores: Iterable | None = None) -> Listing:
    sessions: list[SessionInfo] = []
    errors: dict[str, str] = {}
    for store in stores if stores is not None else configured_stores():
        try:
            sessions.extend(store.list(filters))
        except StoreUnavailable as error:
            errors[store.name] = str(error)
    return Listing(sessions, errors)
