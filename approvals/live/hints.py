"""Live hints to the console's pages. A hint says what changed; the page re-reads the database.

Two deliveries, one per deployment mode:
- with a shared channel layer (Redis), whoever commits a change sends the hint, after commit;
- with the default in-memory layer, which cannot cross processes, each web process tails the
  audit log (every change writes an audit event in its own transaction) and hints its own
  sockets.
A socket only hears of changes after it opens, so pages re-read their live parts whenever their
socket (re)connects; after that, a lost hint costs at most a poll interval, never a wrong page.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asgiref.sync import SyncToAsync
from channels.layers import (
    DEFAULT_CHANNEL_LAYER,
    InMemoryChannelLayer,
    channel_layers,
    get_channel_layer,
)
from django.db import transaction

from approvals.audit import actions

logger = logging.getLogger(__name__)

# Hints about notification deliveries go to the tenant's admins only (see audit.actions).
DELIVERY_KIND = actions.DELIVERY_CHANGED


def user_group(user_id: int) -> str:
    """The group of one user's sockets: told when the user's memberships change."""
    return f"user.{user_id}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}"


def admin_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}.admins"


def _shared_layer():
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        return None
    return layer


def _server_loop() -> asyncio.AbstractEventLoop | None:
    """The ASGI server's loop when this thread is one that loop lent to synchronous code (a
    view) and it still runs, else None. (A thread that once ran a sync_to_async call of a loop
    since closed keeps that loop in its thread-locals: asgiref then starts a new loop.)"""
    local = SyncToAsync.threadlocal
    loop = getattr(local, "main_event_loop", None)
    if (
        loop is not None
        and getattr(local, "main_event_loop_pid", None) == os.getpid()
        and loop.is_running()
    ):
        return loop
    return None


class _SenderLoop:
    """Hands hints from synchronous code to an event loop and goes on: a decision's answer and a
    worker's resume never wait for Redis. A hint only says what to re-read, so one that arrives
    after the next is harmless; one that fails is logged.

    In a view's thread under the ASGI server, the loop is the server's own: it already holds the
    layer's connections (its sockets' consumers use them). Elsewhere (a worker, a command) it is
    the process's own loop in a daemon thread: async_to_sync there would start a fresh loop for
    every call, and channels-redis keeps its connections per loop, so every hint would open and
    close a Redis connection. That loop has its own instance of the channel layer, so nothing
    else ever touches those connections from another loop.
    """

    TIMEOUT = 2.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._layer = None
        self._pid = 0
        # Hand-offs not yet settled (sent, or their failures logged).
        self._settled = threading.Condition()
        self._pending = 0

    def _own(self):
        with self._lock:
            # A forked child inherits the attributes but not the thread: start its own.
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="live-hints", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
                self._layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
            return self._loop, self._layer

    def send(self, group: str, message: dict[str, Any]) -> None:
        self.send_many([(group, message)])

    def send_many(self, hints: list[tuple[str, dict[str, Any]]], *, here: bool = False) -> None:
        """Every hint in one hand-over, their group_sends side by side (the pub/sub layer
        publishes one at a time on its connection); failures are logged. here:
        called on the server's loop, in its own thread (which then sends them)."""
        with self._settled:
            self._pending += 1
        try:
            future = self._hand_over(hints, here=here)
        except BaseException:
            self._settle()
            raise
        future.add_done_callback(lambda done: self._done(done, hints))

    def _hand_over(self, hints, *, here: bool) -> concurrent.futures.Future | asyncio.Future:
        if here:
            # On the server's loop itself (its ASGI handler, once an answer is sent): a task of
            # that loop, which holds the layer's connections.
            return asyncio.ensure_future(_group_send_all(get_channel_layer(), hints))
        server = _server_loop()
        if server is not None:
            sending = _group_send_all(get_channel_layer(), hints)
            try:
                return asyncio.run_coroutine_threadsafe(sending, server)
            except RuntimeError:
                # The server's loop closed since: this process's own loop sends it.
                sending.close()
        loop, layer = self._own()
        return asyncio.run_coroutine_threadsafe(_group_send_all(layer, hints), loop)

    def _done(self, done: concurrent.futures.Future | asyncio.Future, hints) -> None:
        try:
            if done.cancelled():
                return
            if (error := done.exception()) is not None:
                logger.warning(
                    "live updates to %s not delivered", [g for g, _ in hints], exc_info=error
                )
                return
            for (group, _), error in zip(hints, done.result(), strict=True):
                if error is not None:
                    logger.warning("live update to %s not delivered", group, exc_info=error)
        finally:
            self._settle()

    def _settle(self) -> None:
        with self._settled:
            self._pending -= 1
            self._settled.notify_all()

    def wait_sent(self, timeout: float = TIMEOUT) -> bool:
        """Wait until every hint handed over so far was sent or its failure logged (a command
        about to exit, a test); False when some were still on their way after timeout seconds."""
        with self._settled:
            return self._settled.wait_for(lambda: self._pending == 0, timeout=timeout)


async def _group_send_all(
    layer, hints: list[tuple[str, dict[str, Any]]]
) -> list[BaseException | None]:
    """Send every hint side by side (gathered); each one's error, or None."""
    results = await asyncio.gather(
        *(layer.group_send(group, message) for group, message in hints), return_exceptions=True
    )
    return [r if isinstance(r, BaseException) else None for r in results]


_sender = _SenderLoop()
# The hints of the batch open in this thread (see batched), or None.
_batch = threading.local()


def _send(group: str, message: dict[str, Any]) -> None:
    held = getattr(_batch, "hints", None)
    if held is not None:
        held.append((group, message))
        return
    _send_many([(group, message)])


def _send_many(hints: list[tuple[str, dict[str, Any]]], *, here: bool = False) -> None:
    """Hand the hints to a loop in one hop, their group_sends side by side (see _SenderLoop);
    here: this thread runs the server's loop, which sends them."""
    try:
        if _shared_layer() is None:
            return
        if here:
            _sender.send_many(hints, here=True)
        elif len(hints) == 1:
            _sender.send(*hints[0])
        else:
            _sender.send_many(hints)
    except Exception:
        # Live updates are a convenience; pages still show the truth on the next load.
        logger.warning("live updates to %s not delivered", [g for g, _ in hints], exc_info=True)


@contextmanager
def batched() -> Iterator[None]:
    """Hold the hints sent in this thread inside the block and send them together when it ends.

    For a transaction opened inside the block: its commit runs the hints' on_commit callbacks
    there (a rolled-back savepoint's never run, as without a batch), and their hints then go
    out in one hop to the layer's loop, their group_sends gathered, rather than one hop
    after another. The order between the hints of one batch is not kept:
    each says only what to re-read. Hints whose callbacks run after the block (an outer
    transaction commits later) are sent on their own, as usual. Nested blocks join the outer.
    Side effects: after the block, the held hints are sent (failures logged, never raised).
    """
    kept: list[tuple[str, dict[str, Any]]] = []
    try:
        with held(kept):
            yield
    finally:
        if kept:
            _send_many(kept)


@contextmanager
def held(into: list[tuple[str, dict[str, Any]]]) -> Iterator[None]:
    """As batched(), but the hints held in the block are put into `into` as it ends instead of
    being sent: the caller sends them later with send_held(). The ASGI handler holds a
    request's hints this way and sends them once the answer is sent, so that their Redis work
    never competes with the answer. Inside a batch (or another such block), the block joins
    it: the outer one sends or keeps them.
    """
    if getattr(_batch, "hints", None) is not None:
        yield
        return
    _batch.hints = []
    try:
        yield
    finally:
        into.extend(_batch.hints)
        _batch.hints = None


def send_held(hints: list[tuple[str, dict[str, Any]]], *, on_loop: bool = True) -> None:
    """Send hints held() kept, together (failures logged, never raised): from the server's own
    loop (its coroutines call it), or with on_loop False from a thread, as hints are sent."""
    if hints:
        _send_many(hints, here=on_loop)


# Every hint names its tenant: a socket forwards only hints of the tenants its user belongs to
# now, even one already queued for it before it left the tenant's group.
def notify_on_commit(tenant_id: int, kind: str, **data: Any) -> None:
    message = {"type": "console.event", "kind": kind, "tenant": tenant_id, **data}
    transaction.on_commit(lambda: _send(tenant_group(tenant_id), message))


def notify_admins_on_commit(tenant_id: int, **data: Any) -> None:
    """A delivery changed: a hint for the tenant's admins (their delivery log re-reads)."""
    message = {"type": "console.event", "kind": DELIVERY_KIND, "tenant": tenant_id, **data}
    transaction.on_commit(lambda: _send(admin_group(tenant_id), message))


MEMBERSHIPS_CHANGED = "console.memberships"


def memberships_changed_on_commit(user_id: int) -> None:
    """The user's memberships changed: after commit, the user's open sockets re-read theirs and
    stop (or start) hearing tenants at once. With the in-memory layer the audit tail tells them
    (tail.AuditTail), since this process may not be the one holding the sockets."""
    message = {"type": MEMBERSHIPS_CHANGED}
    transaction.on_commit(lambda: _send(user_group(user_id), message))


SIGNED_OUT = "console.signed_out"
# The audit action whose events tell the in-memory tail that a user's sessions ended.
SESSIONS_ENDED = "auth.sessions_ended"


def signed_out_on_commit(user_id: int) -> None:
    """Some of the user's sessions ended: after commit, each of the user's open sockets checks
    that its own session still exists and closes when it does not (the socket of a session
    that was kept stays open). With the in-memory layer the audit tail tells them
    (tail.AuditTail), from the auth.sessions_ended event."""
    message = {"type": SIGNED_OUT}
    transaction.on_commit(lambda: _send(user_group(user_id), message))


def group_for(tenant_id: int, hint: dict[str, Any]) -> str:
    return admin_group(tenant_id) if hint["kind"] == DELIVERY_KIND else tenant_group(tenant_id)


def hint_for(event) -> dict[str, Any]:
    """The hint an audit event stands for, from the table of actions."""
    action = actions.ACTIONS.get(event.action)
    return {
        "type": "console.event",
        "kind": action.live if action and action.live else event.action,
        "tenant": event.tenant_id,
        "run": event.run_id,
        "ticket": event.ticket_id,
        "status": event.outcome,
    }
