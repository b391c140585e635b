"""Seeing runs finish as a person's open page does: from the tenant's live hints.

The approve-to-completed part once asked the database every millisecond whether the run had
completed. On a 2-core machine those questions took CPU from the very worker and database they
were timing. Here the bench listens on the tenant's group of the channel layer (Redis), as the
run's page does, and blocks until the worker's hint says the run finished. The measurement
then ends when a person would see the run finish: after commit and after the hint's trip
through Redis, which is a little later than the commit itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import DEFAULT_CHANNEL_LAYER, InMemoryChannelLayer, channel_layers

from approvals.live import hints
from approvals.models import TERMINAL_RUN_STATUSES


class Completions:
    """The tenant's live hints, heard on one channel of the shared channel layer."""

    def __init__(self, tenant_id: int) -> None:
        self._layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        if isinstance(self._layer, InMemoryChannelLayer):
            raise RuntimeError("the bench hears runs finish through Redis: set REDIS_URL")
        self._loop = asyncio.new_event_loop()
        self._group = hints.tenant_group(tenant_id)
        self._channel = self._run(self._layer.new_channel())
        self._run(self._layer.group_add(self._group, self._channel))

    def _run(self, coroutine) -> Any:
        return self._loop.run_until_complete(coroutine)

    def finished(self, run_id: int, *, timeout: float) -> str:
        """Block until a hint says the run finished; its status. TimeoutError after timeout s."""
        return self._run(asyncio.wait_for(self._heard(run_id), timeout))

    async def _heard(self, run_id: int) -> str:
        while True:
            message = await self._layer.receive(self._channel)
            if (
                message.get("kind") == "run.changed"
                and message.get("run") == run_id
                and message.get("status") in TERMINAL_RUN_STATUSES
            ):
                return message["status"]

    def close(self) -> None:
        self._run(self._layer.group_discard(self._group, self._channel))
        self._run(self._close())
        self._loop.close()

    async def _close(self) -> None:
        # The pub/sub layer: this process's subscriptions and connection (flush() of the
        # list-based layer would delete every process's messages and groups instead).
        close_pools = getattr(self._layer, "close_pools", None)
        if close_pools is not None:
            await close_pools()
        else:
            await self._layer.flush()
