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
from approvals.models import TERMINAL_RUN_STATUSES, AuditEvent
from devtools.bench.stats import summary_ms

# The steps of approve to completed, each between two moments: the decision sent and answered
# (the bench's clock), the worker's claim, the effect done and the run's end (the times of
# their audit events, taken as each is built: the claim's after its statement, the effect's
# right after the effect, the end's just before its statement), the end heard (the bench).
PHASES = (
    ("decision", "sent", "answered"),
    ("answer_to_claim", "answered", "run.resuming"),
    ("claim_to_effect", "run.resuming", "effect.done"),
    ("effect_to_end", "effect.done", "run.completed"),
    ("end_to_heard", "run.completed", "heard"),
)


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


def phases(moments: list[tuple[int, float, float, float]]) -> dict[str, dict[str, float]]:
    """Where approve to completed went, step by step (PHASES), from (run id, sent, answered,
    heard) of each decision (time.time()) and the audit events of its run: each step's
    summary in ms, over the runs whose events are all there."""
    times: dict[int, dict[str, float]] = {}
    events = (
        AuditEvent.objects.filter(
            run_id__in=[run_id for run_id, *_ in moments],
            action__in=["run.resuming", "effect.done", "run.completed"],
        )
        .order_by("seq")
        .values_list("run_id", "action", "created_at")
    )
    # In chain order, the last of each: a run claimed again, or with several effects, is timed
    # by the attempt and the effect that led to its end.
    for run_id, action, created_at in events:
        times.setdefault(run_id, {})[action] = created_at.timestamp()
    steps: dict[str, list[float]] = {name: [] for name, _, _ in PHASES}
    for run_id, sent, answered, heard in moments:
        at = {**times.get(run_id, {}), "sent": sent, "answered": answered, "heard": heard}
        if all(start in at and end in at for _, start, end in PHASES):
            for name, start, end in PHASES:
                steps[name].append(at[end] - at[start])
    return {name: summary_ms(values) for name, values in steps.items() if values}
