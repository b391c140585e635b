"""The live channel: one websocket per page, joined to the groups of the user's tenants.

A pushed message is a hint rendered from the page's own partial; on receiving it, the page's
live regions re-read the database through their normal URLs. The socket also joins its user's
group: when the user's memberships change it re-reads them and leaves (or joins) tenants' groups
at once, and it forwards a hint only for a tenant the user belongs to, in a role that hears it.
When some of the user's sessions end (approvals.signins), a socket whose own session ended
closes with SIGNED_OUT_CODE, and the page says so instead of reconnecting.

Those messages may be lost (the channel layer's delivery is at most once), so every
APPROVALS_LIVE_RECHECK_SECONDS a socket also reads its user's memberships and its session again
on its own: a lost message holds for at most that long.
"""

from __future__ import annotations

import asyncio
from importlib import import_module

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.template.loader import render_to_string

from approvals import members
from approvals.live import tail
from approvals.live.hints import DELIVERY_KIND, admin_group, tenant_group, user_group
from approvals.models import Role

# The close code of a socket whose session ended (or that was never signed in): not one the
# browser's websocket reconnects after.
SIGNED_OUT_CODE = 4401


def _session_ended(session_key: str | None) -> bool:
    if not session_key:
        return True
    return not import_module(settings.SESSION_ENGINE).SessionStore().exists(session_key)


class ConsoleConsumer(AsyncWebsocketConsumer):
    groups_joined: set[str]
    # The user's role in each tenant it belongs to, as last read: what the socket may hear.
    roles: dict[int, str]

    async def connect(self) -> None:
        user = self.scope.get("user")
        self.groups_joined = set()
        self.roles = {}
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=SIGNED_OUT_CODE)
            return
        self.user_id = user.pk
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        self.hearing = asyncio.Lock()
        await self._hear(await self._read_roles())
        self.tailing = tail.tail_needed()
        if self.tailing:
            await tail.audit_tail.subscribe(self.user_id)
        await self.accept()
        self.rechecking = asyncio.ensure_future(self._recheck())

    async def _recheck(self) -> None:
        """Every APPROVALS_LIVE_RECHECK_SECONDS, whatever the socket was told: close when its
        session ended, else hear the tenants its user belongs to now."""
        while True:
            await asyncio.sleep(settings.APPROVALS_LIVE_RECHECK_SECONDS)
            if await database_sync_to_async(_session_ended)(self.session_key):
                await self.close(code=SIGNED_OUT_CODE)
                return
            await self._hear(await self._read_roles())

    async def _read_roles(self) -> dict[int, str]:
        roles = await database_sync_to_async(members.roles_of)([self.user_id])
        return roles[self.user_id]

    async def _hear(self, roles: dict[int, str]) -> None:
        """Join the groups these roles hear, and leave the others (one change at a time: a
        message and the recheck may both change them)."""
        async with self.hearing:
            self.roles = roles
            wanted = {user_group(self.user_id)}
            for tenant_id, role in roles.items():
                wanted.add(tenant_group(tenant_id))
                if role == Role.ADMIN:
                    wanted.add(admin_group(tenant_id))
            for group in sorted(self.groups_joined - wanted):
                await self.channel_layer.group_discard(group, self.channel_name)
                self.groups_joined.discard(group)
            for group in sorted(wanted - self.groups_joined):
                await self.channel_layer.group_add(group, self.channel_name)
                self.groups_joined.add(group)

    async def disconnect(self, code: int) -> None:
        rechecking = getattr(self, "rechecking", None)
        if rechecking is not None:
            rechecking.cancel()
        for group in getattr(self, "groups_joined", set()):
            await self.channel_layer.group_discard(group, self.channel_name)
        if getattr(self, "tailing", False):
            await tail.audit_tail.unsubscribe(self.user_id)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        # The channel is one-way; anything a browser sends is ignored.
        return

    async def console_memberships(self, event: dict) -> None:
        """The user's memberships changed: the ones the tail read, or read them now."""
        if "memberships" in event:
            roles = {int(tenant_id): role for tenant_id, role in event["memberships"]}
        else:
            roles = await self._read_roles()
        await self._hear(roles)

    async def console_signed_out(self, event: dict) -> None:
        """Some of the user's sessions ended: close if this socket's session is one of them."""
        if await database_sync_to_async(_session_ended)(self.session_key):
            await self.close(code=SIGNED_OUT_CODE)

    async def console_event(self, event: dict) -> None:
        # A hint queued before the socket left its tenant's group still arrives: drop it.
        role = self.roles.get(event.get("tenant"))
        if role is None or (event.get("kind") == DELIVERY_KIND and role != Role.ADMIN):
            return
        html = render_to_string("approvals/_live_hint.html", {"event": event})
        await self.send(text_data=html)
