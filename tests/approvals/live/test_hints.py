"""Live hints sent together: a batch holds the hints its transactions commit and sends them in
one hop; what a rolled-back savepoint hinted is never sent."""

from __future__ import annotations

import pytest
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
        def _started(self):
            loop, _ = super()._started()
            return loop, Layer()

    monkeypatch.setattr(hints, "_shared_layer", Layer)
    monkeypatch.setattr(hints, "_sender", LayerLoop())

    with hints.batched():
        hints._send("tenant.7", _hint("fine"))
        hints._send("tenant.8", _hint("bad"))

    assert sent == ["tenant.7"]
    assert [r.getMessage() for r in caplog.records] == ["live update to tenant.8 not delivered"]
