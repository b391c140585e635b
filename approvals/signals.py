"""The hooks other apps listen on: approvals sends, notifications and sessions_admin receive.

approvals imports neither of them; they connect receivers to these signals in their
AppConfig.ready. Each signal is sent after the change it reports has committed, never inside a
transaction, so a rolled-back change tells no one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger(__name__)

# event=<AuditEvent>: the transaction that appended the event has committed. Sent in the
# committing process (a request, a resume): a receiver here costs that process its time, so
# work that reads the database belongs to audit_tail instead.
audit_event_committed = Signal()

# Sent by the worker's notifications pool on every poll (no arguments), never by a request or a
# resume: a receiver reads the audit events committed since it last looked and does its work
# with them (notifications: the fan-out), off the process that committed them. It returns how
# many events it handled, so the pool polls again at once while there is a backlog.
audit_tail = Signal()

# event=<AuditEvent audit.checkpointed>, checkpoint=<dict>: a tenant's chain head was signed
# into a checkpoint (manage.py audit_checkpoint) and the event recording it has committed.
# checkpoint is {"statement": {...}, "signature": base64, "public_key": base64}, as
# approvals.audit.checkpoints describes: the tenant's own statement, no other tenant's.
audit_checkpointed = Signal()

# run=<Run>: a run's paused state has been stored (its first pause, or a pause after a resume).
run_paused = Signal()

# Sent by the worker's housekeeping loop on every pass (no arguments). A receiver does its own
# housekeeping and returns a sentence for the worker's log, or "" when there was nothing to do.
worker_housekeeping = Signal()

# Sent by `manage.py rotate_keys` once the run states are re-sealed (no arguments). A receiver
# re-seals what it keeps under the console's keys and returns a Rotation.
secrets_rotating = Signal()


@dataclass(frozen=True)
class Rotation:
    """What one receiver of secrets_rotating re-sealed: e.g. what="webhook secrets"."""

    what: str
    rotated: int
    failed: int


def send_on_commit(signal: Signal, *, sender: Any = None, **kwargs: Any) -> None:
    """Send the signal once the caller's transaction commits (at once outside one).

    A failing receiver is logged, never raised into the code whose transaction committed.
    """

    def send() -> None:
        for receiver, result in signal.send_robust(sender=sender, **kwargs):
            if isinstance(result, Exception):
                logger.error("receiver %r failed (%s)", receiver, kwargs, exc_info=result)

    transaction.on_commit(send)
