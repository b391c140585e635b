"""Live hints sent together: a batch holds the hints its transactions commit and sends them in
one hop; what a rolled-back savepoint hinted is never sent."""

from __future__ import annotations

import asyncio
import os

import pytest
from asgiref.sync import SyncToAsync, async_to_sync, sync_to_async
from django.db import transaction

from approvals.live import hints

pytestmark = pytest.mark.django_db


def _hint(kind: str, **data) -> dict:
    return {"type": "console.event", "kind": kind, "tenant": 7, **data}


def test_batched_sends_the_hints_of_its_commit_together(
    live_sender, django_capture_on_commit_callbacks
):
    with hints.batched():
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            hints.notify_on_commit(7, "ticket.decided", ticket=1)
            hints.notify_on_commit(7, "run.changed", run=2)
        assert live_sender.many == []

    assert live_sender.many == [
        [
            ("tenant.7", _hint("ticket.decided", ticket=1)),
            ("tenant.7", _hint("run.changed", run=2)),
        ]
    ]
    assert live_sender.one == []


def test_batched_never_sends_the_hint_of_a_rolled_back_savepoint(
    live_sender, django_capture_on_commit_callbacks
):
    with (
        hints.batched(),
        django_capture_on_commit_callbacks(execute=True),
        transaction.atomic(),
    ):
        hints.notify_on_commit(7, "ticket.decided", ticket=1)
        with pytest.raises(RuntimeError), transaction.atomic():
            hints.notify_on_commit(7, "ticket.changed", ticket=3)
            raise RuntimeError("rolled back")

    assert live_sender.one == [("tenant.7", _hint("ticket.decided", ticket=1))]
    assert live_sender.many == []


def test_a_hint_committed_after_the_batch_is_sent_on_its_own(
    live_sender, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        # The outer transaction commits after the block: its hint is not held.
        with hints.batched(), transaction.atomic():
            hints.notify_on_commit(7, "run.changed", run=2)
        assert live_sender.one == []

    assert live_sender.one == [("tenant.7", _hint("run.changed", run=2))]
    assert live_sender.many == []


def test_a_failed_hint_of_a_batch_is_logged_and_the_others_sent(monkeypatch, caplog):
    sent = []

    class Layer:
        async def group_send(self, group: str, message: dict) -> None:
            if message["kind"] == "bad":
                raise ConnectionError("redis went away")
            sent.append(group)

    class LayerLoop(hints._SenderLoop):
        def _own(self):
            loop, _ = super()._own()
            return loop, Layer()

    monkeypatch.setattr(hints, "_shared_layer", Layer)
    monkeypatch.setattr(hints, "_sender", LayerLoop())

    with hints.batched():
        hints._send("tenant.7", _hint("fine"))
        hints._send("tenant.8", _hint("bad"))
    assert hints._sender.wait_sent()

    assert sent == ["tenant.7"]
    assert [r.getMessage() for r in caplog.records] == ["live update to tenant.8 not delivered"]


def test_a_view_hands_its_hint_to_the_servers_loop_and_answers_without_waiting(monkeypatch):
    """In a view's thread under the ASGI server, the hint goes to the server's own loop (it holds
    the layer's connections) and the view goes on: here the layer only sends once the view has
    returned, so a view that waited for it would give up and the hint would be lost."""
    delivered = []

    class Layer:
        gate: asyncio.Event | None = None

        async def group_send(self, group: str, message: dict) -> None:
            await asyncio.wait_for(Layer.gate.wait(), timeout=5)
            delivered.append((group, message["kind"], asyncio.get_running_loop()))

    monkeypatch.setattr(hints, "_shared_layer", Layer)
    monkeypatch.setattr(hints, "get_channel_layer", Layer)
    monkeypatch.setattr(hints, "_sender", hints._SenderLoop())

    def view() -> None:
        hints._send("tenant.7", _hint("run.changed", run=2))

    async def server() -> asyncio.AbstractEventLoop:
        Layer.gate = asyncio.Event()
        await sync_to_async(view)()
        Layer.gate.set()
        assert await sync_to_async(hints._sender.wait_sent, thread_sensitive=False)()
        return asyncio.get_running_loop()

    server_loop = async_to_sync(server)()

    assert delivered == [("tenant.7", "run.changed", server_loop)]


def test_a_thread_left_with_a_closed_loop_of_a_server_sends_through_the_process_loop(
    monkeypatch,
):
    """A thread that once lent itself to a loop keeps that loop in asgiref's thread-locals after
    it closed: the hint then goes out through the process's own loop, not into the closed one."""
    delivered = []

    class Layer:
        async def group_send(self, group: str, message: dict) -> None:
            delivered.append((group, asyncio.get_running_loop()))

    class LayerLoop(hints._SenderLoop):
        def _own(self):
            loop, _ = super()._own()
            return loop, Layer()

    closed = asyncio.new_event_loop()
    closed.close()
    monkeypatch.setattr(SyncToAsync.threadlocal, "main_event_loop", closed, raising=False)
    monkeypatch.setattr(SyncToAsync.threadlocal, "main_event_loop_pid", os.getpid(), raising=False)
    monkeypatch.setattr(hints, "_shared_layer", Layer)
    sender = LayerLoop()
    monkeypatch.setattr(hints, "_sender", sender)

    hints._send("tenant.7", _hint("run.changed", run=2))
    assert sender.wait_sent()

    assert delivered == [("tenant.7", sender._own()[0])]
