"""An SDK session stored by Django's ORM, so conversations can live beside the approvals.

Implements the SDK's SessionABC (get_items, add_items, pop_item, clear_session); it works with
Runner.run(..., session=...) across processes and can be wrapped in EncryptedSession.
"""

from __future__ import annotations

import json
from typing import Any

from agents.memory.session import SessionABC
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.utils import timezone

from approvals.models import Tenant
from sessions_admin.models import StoredItem, StoredSession


class DjangoSession(SessionABC):
    def __init__(self, session_id: str, *, tenant: Tenant | str) -> None:
        self.session_id = session_id
        self._tenant = tenant

    # --- helpers (sync, run in a worker thread) ---

    def _tenant_id(self) -> int:
        if isinstance(self._tenant, Tenant):
            return self._tenant.pk
        return Tenant.objects.only("pk").get(slug=self._tenant).pk

    def _session(self, create: bool) -> StoredSession | None:
        tenant_id = self._tenant_id()
        if create:
            session, _ = StoredSession.objects.get_or_create(
                tenant_id=tenant_id, session_id=self.session_id
            )
            return session
        return StoredSession.objects.filter(tenant_id=tenant_id, session_id=self.session_id).first()

    def _get(self, limit: int | None) -> list[Any]:
        session = self._session(create=False)
        if session is None:
            return []
        items = StoredItem.objects.filter(session=session)
        if limit is not None:
            rows = list(items.order_by("-id").values_list("data", flat=True)[: max(limit, 0)])
            rows.reverse()
            return rows
        return list(items.order_by("id").values_list("data", flat=True))

    def _add(self, items: list[Any]) -> None:
        if not items:
            return
        # Items are JSON documents; round-trip through json so pydantic objects become dicts.
        payload = [json.loads(json.dumps(item, default=_dump)) for item in items]
        with transaction.atomic():
            session = self._session(create=True)
            now = timezone.now()
            StoredItem.objects.bulk_create(
                [StoredItem(session=session, data=data, created_at=now) for data in payload]
            )
            StoredSession.objects.filter(pk=session.pk).update(updated_at=now)

    def _pop(self) -> Any | None:
        with transaction.atomic():
            session = self._session(create=False)
            if session is None:
                return None
            last = (
                StoredItem.objects.select_for_update()
                .filter(session=session)
                .order_by("-id")
                .first()
            )
            if last is None:
                return None
            data = last.data
            last.delete()
            return data

    def _clear(self) -> int:
        session = self._session(create=False)
        if session is None:
            return 0
        count, _ = StoredItem.objects.filter(session=session).delete()
        session.delete()
        return count

    # --- the SDK's protocol ---

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return await _in_worker_thread(self._get)(limit)

    async def add_items(self, items: list[Any]) -> None:
        await _in_worker_thread(self._add)(items)

    async def pop_item(self) -> Any | None:
        return await _in_worker_thread(self._pop)()

    async def clear_session(self) -> None:
        await _in_worker_thread(self._clear)()

    # --- how the approval console records and reopens it ---

    def describe_for_console(self) -> tuple[str, str, str]:
        slug = self._tenant.slug if isinstance(self._tenant, Tenant) else self._tenant
        return ("django", self.session_id, slug)


def _in_worker_thread(func):
    """func in a worker thread, whose database connection is closed before the thread is reused."""

    def run(*args: Any) -> Any:
        try:
            return func(*args)
        finally:
            connections.close_all()

    return sync_to_async(run, thread_sensitive=False)


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_unset=True)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def open_for_console(session_id: str, location: str) -> DjangoSession:
    return DjangoSession(session_id, tenant=location)
