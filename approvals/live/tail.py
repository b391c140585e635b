"""The in-memory deployment's live hints: each web process tails the audit log.

With the default in-memory channel layer, which cannot cross processes, a web process cannot
hear another's hints; every change writes an audit event in its own transaction, so each web
process reads new events and hints its own sockets.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from approvals.live.hints import group_for, hint_for
from approvals.models import AuditEvent

logger = logging.getLogger(__name__)


class AuditTail:
    """One per web process: new audit events become hints for this process's sockets."""

    def __init__(self) -> None:
        self.subscribers = 0
        self.task: asyncio.Task | None = None

    @staticmethod
    def _latest_id() -> int:
        return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0

    @staticmethod
    def _events_after(last_id: int) -> list:
        return list(
            AuditEvent.objects.filter(id__gt=last_id)
            .only("id", "tenant_id", "action", "run_id", "ticket_id", "outcome")
            .order_by("id")[:500]
        )

    async def subscribe(self) -> None:
        self.subscribers += 1
        if self.task is None or self.task.done():
            last_id = await database_sync_to_async(self._latest_id)()
            self.task = asyncio.create_task(self._run(last_id))

    async def unsubscribe(self) -> None:
        self.subscribers = max(self.subscribers - 1, 0)
        if not self.subscribers and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _run(self, last_id: int) -> None:
        layer = get_channel_layer()
        interval = settings.APPROVALS_LIVE_POLL_SECONDS
        while True:
            await asyncio.sleep(interval)
            try:
                events = await database_sync_to_async(self._events_after)(last_id)
                for event in events:
                    hint = hint_for(event)
                    await layer.group_send(group_for(event.tenant_id, hint), hint)
                    last_id = event.id
            except Exception:
                logger.warning("live tail: reading the audit log failed; retrying", exc_info=True)


audit_tail = AuditTail()


def tail_needed() -> bool:
    return isinstance(get_channel_layer(), InMemoryChannelLayer)
