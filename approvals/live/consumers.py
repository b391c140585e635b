"""The live channel: one websocket per page, joined to the groups of the user's tenants.

A pushed message is a hint rendered from the page's own partial; on receiving it, the page's
live regions re-read the database through their normal URLs.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from approvals.live import tail
from approvals.live.hints import admin_group, tenant_group
from approvals.models import Membership, Role


class ConsoleConsumer(AsyncWebsocketConsumer):
    groups_joined: list[str]

    async def connect(self) -> None:
        user = self.scope.get("user")
        self.groups_joined = []
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=4401)
            return
        memberships = await database_sync_to_async(
            lambda: list(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
        )()
        for tenant_id, role in memberships:
            groups = [tenant_group(tenant_id)]
            if role == Role.ADMIN:
                groups.append(admin_group(tenant_id))
            for group in groups:
                await self.channel_layer.group_add(group, self.channel_name)
                self.groups_joined.append(group)
        self.tailing = tail.tail_needed()
        if self.tailing:
            await tail.audit_tail.subscribe()
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        if getattr(self, "tailing", False):
            await tail.audit_tail.unsubscribe()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        # The channel is one-way; anything a browser sends is ignored.
        return

    async def console_event(self, event: dict) -> None:
        html = render_to_string("approvals/_live_hint.html", {"event": event})
        await self.send(text_data=html)
