"""The in-memory deployment's live hints: each web process tails the audit log.

With the default in-memory channel layer, which cannot cross processes, a web process cannot
hear another's hints; every change writes an audit event in its own transaction, so each web
process reads new events and hints its own sockets.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from approvals import members
from approvals.live.hints import (
    MEMBERSHIPS_CHANGED,
    SESSIONS_ENDED,
    SIGNED_OUT,
    group_for,
    hint_for,
    user_group,
)
from approvals.models import AuditEvent

logger = logging.getLogger(__name__)


class AuditTail:
    """One per web process: new audit events become hints for this process's sockets.

    A membership changed in another process cannot reach this one's sockets through the
    in-memory layer, so before it hands out a batch of hints the tail reads the memberships of
    the users whose sockets it serves (one query) and tells each user whose memberships changed
    (ConsoleConsumer.console_memberships) before any of the batch's hints. A batch holding
    auth.sessions_ended tells those users' sockets to check their sessions
    (ConsoleConsumer.console_signed_out).
    """

    def __init__(self) -> None:
        self.subscribers = 0
        self.task: asyncio.Task | None = None
        # Sockets per user, and each user's memberships as the tail last told its sockets.
        self.users: Counter[int] = Counter()
        self.told: dict[int, list[list]] = {}

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

    @staticmethod
    def _signed_out_users(event_ids: list[int]) -> set[int]:
        details = AuditEvent.objects.filter(id__in=event_ids).values_list("detail", flat=True)
        return {detail["user_id"] for detail in details if "user_id" in detail}

    async def _tell_signed_out(self, layer, events: list) -> None:
        ended = [event.id for event in events if event.action == SESSIONS_ENDED]
        if not ended:
            return
        user_ids = await database_sync_to_async(self._signed_out_users)(ended)
        for user_id in sorted(user_ids):
            if user_id in self.users:
                await layer.group_send(user_group(user_id), {"type": SIGNED_OUT})

    async def subscribe(self, user_id: int | None = None) -> None:
        self.subscribers += 1
        if user_id is not None:
            self.users[user_id] += 1
            # The new socket read the memberships itself: tell the user's sockets afresh.
            self.told.pop(user_id, None)
        if self.task is None or self.task.done():
            last_id = await database_sync_to_async(self._latest_id)()
            self.task = asyncio.create_task(self._run(last_id))

    async def unsubscribe(self, user_id: int | None = None) -> None:
        self.subscribers = max(self.subscribers - 1, 0)
        if user_id is not None and self.users[user_id] > 0:
            self.users[user_id] -= 1
            if not self.users[user_id]:
                del self.users[user_id]
                self.told.pop(user_id, None)
        if not self.subscribers and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _tell_changed_memberships(self, layer) -> None:
        user_ids = list(self.users)
        if not user_ids:
            return
        roles = await database_sync_to_async(members.roles_of)(user_ids)
        for user_id in user_ids:
            memberships = sorted([tenant_id, role] for tenant_id, role in roles[user_id].items())
            if user_id in self.users and self.told.get(user_id) != memberships:
                message = {"type": MEMBERSHIPS_CHANGED, "memberships": memberships}
                await layer.group_send(user_group(user_id), message)
                self.told[user_id] = memberships

    async def _run(self, last_id: int) -> None:
        layer = get_channel_layer()
        interval = settings.APPROVALS_LIVE_POLL_SECONDS
        while True:
            await asyncio.sleep(interval)
            try:
                events = await database_sync_to_async(self._events_after)(last_id)
                if events:
                    await self._tell_changed_memberships(layer)
                    await self._tell_signed_out(layer, events)
                for event in events:
                    hint = hint_for(event)
                    await layer.group_send(group_for(event.tenant_id, hint), hint)
                    last_id = event.id
            except Exception:
                logger.warning("live tail: reading the audit log failed; retrying", exc_info=True)


audit_tail = AuditTail()


def tail_needed() -> bool:
    return isinstance(get_channel_layer(), InMemoryChannelLayer)
