"""One attempt's bookkeeping on a delivery row, shared by webhook deliveries and emails.

A Delivery and an EmailDelivery move the same way: an attempt is claimed (attempts + 1, the
row kept from other tasks for IN_FLIGHT), sent outside any transaction, then settled
(delivered; failed after MAX_ATTEMPTS; or pending until the next attempt of BACKOFF); a failed
row can be reopened by hand. Sending and enqueueing are the callers'.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from approvals.core.redaction import redact
from approvals.execution.queue import SIDE_QUEUE
from notifications.models import DeliveryStatus

MAX_ATTEMPTS = 5
# Waits after attempts 1..4; the fifth failure is final.
BACKOFF = [
    timedelta(seconds=10),
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=30),
]
# A claimed attempt keeps others off the delivery for this long (longer than any request).
IN_FLIGHT = timedelta(seconds=30)
# Every notifications task goes to the worker's notifications pool, never the resumes' queue.
QUEUE = SIDE_QUEUE

logger = logging.getLogger("notifications")


class NotRetryable(Exception):
    pass


class DeliveryFailed(Exception):
    """Every attempt a delivery task made failed; raised so the queue records the task FAILED."""


def short_error(text: str) -> str:
    """An attempt's error as recorded: one line, secret-shaped values redacted, 200 characters."""
    return str(redact(" ".join(text.split())))[:200]


def claim(rows, pk: int, now: datetime):
    """Take the next attempt of a pending row (a Delivery or an EmailDelivery) whose time has
    come: attempts + 1, and the row kept from other tasks for IN_FLIGHT. None when there is
    none."""
    with transaction.atomic():
        row = rows.select_for_update().filter(pk=pk).first()
        if row is None or row.status != DeliveryStatus.PENDING:
            return None
        # Another task holds it, or this one ran before its time: leave it to that one.
        if row.next_attempt_at and row.next_attempt_at > now + timedelta(seconds=1):
            return None
        row.attempts += 1
        row.next_attempt_at = now + IN_FLIGHT
        row.updated_at = now
        row.save(update_fields=["attempts", "next_attempt_at", "updated_at"])
        return row


def still_claimed(rows, row) -> bool:
    """Lock the row and tell whether this attempt's claim is still the latest one.

    An attempt that outlived IN_FLIGHT may have been overtaken (the reaper re-enqueued the
    row and another attempt claimed it, or it was retried by hand): its outcome is dropped
    rather than written over the newer one."""
    return (
        rows.select_for_update()
        .filter(pk=row.pk, status=DeliveryStatus.PENDING, attempts=row.attempts)
        .exists()
    )


def settle(row, *, ok: bool, now: datetime) -> bool:
    """Move a claimed row on after its attempt: delivered; failed after MAX_ATTEMPTS (returns
    True, the failure is final); or pending until the backoff's next attempt."""
    row.updated_at = now
    if ok:
        row.status = DeliveryStatus.DELIVERED
        row.delivered_at = now
        row.next_attempt_at = None
        return False
    if row.attempts >= MAX_ATTEMPTS:
        row.status = DeliveryStatus.FAILED
        row.next_attempt_at = None
        return True
    row.next_attempt_at = now + BACKOFF[min(row.attempts, len(BACKOFF)) - 1]
    return False


def reopen(rows, pk: int, noun: str) -> None:
    """A failed row back to pending from its first attempt; compare-and-set, so two clicks
    reopen it once. Raises NotRetryable when it is not failed."""
    now = timezone.now()
    won = rows.filter(pk=pk, status=DeliveryStatus.FAILED).update(
        status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=now, updated_at=now
    )
    if not won:
        raise NotRetryable(f"only a failed {noun} can be retried")


def report(kind: str, rows, *, skipped: int = 0) -> dict[str, int]:
    """What a delivery task's attempts did, as its result and one log line.

    rows are what the task's attempts left (None for an attempt that was not due). Returns the
    counts {"delivered", "failed", "skipped"}; a failed attempt counts whether it will be
    retried or not. Side effects: logs the line (a warning when an attempt failed); raises
    DeliveryFailed with it when attempts were made and none delivered, so the task's result is
    FAILED rather than SUCCESSFUL.
    """
    rows = list(rows)
    counts = {
        "delivered": sum(1 for r in rows if r is not None and r.status == DeliveryStatus.DELIVERED),
        "failed": sum(1 for r in rows if r is not None and r.status != DeliveryStatus.DELIVERED),
        "skipped": skipped + sum(1 for r in rows if r is None),
    }
    retrying = sum(1 for r in rows if r is not None and r.status == DeliveryStatus.PENDING)
    line = (
        f"{kind} deliveries: {counts['delivered']} delivered, {counts['failed']} failed"
        + (f" ({retrying} to be retried)" if retrying else "")
        + (
            f", {counts['skipped']} skipped (not pending, or not due yet)"
            if counts["skipped"]
            else ""
        )
    )
    if counts["failed"] and not counts["delivered"]:
        logger.warning(line)
        raise DeliveryFailed(line)
    logger.log(logging.WARNING if counts["failed"] else logging.INFO, line)
    return counts
