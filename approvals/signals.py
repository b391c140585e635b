"""The hooks other apps listen on: approvals sends, notifications and sessions_admin receive.

approvals imports neither of them; they connect receivers to these signals in their
AppConfig.ready. Each signal is sent after the change it reports has committed, never inside a
transaction, so a rolled-back change tells no one.
"""

from __future__ import annotations

from dataclasses import dataclass

from axes.signals import user_locked_out
from django.contrib.auth.signals import user_login_failed
from django.dispatch import Signal, receiver

# event=<AuditEvent>: the transaction that appended the event has committed.
audit_event_committed = Signal()

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


# TODO(restructure): the sign-in receivers move to the audit package.
@receiver(user_login_failed, dispatch_uid="approvals.sign_in_failed")
def _sign_in_failed(sender, credentials, request=None, **kwargs) -> None:
    from approvals import services

    services.record_sign_in_failure(username=str(credentials.get("username", "")), locked_out=False)


@receiver(user_locked_out, dispatch_uid="approvals.locked_out")
def _locked_out(sender, request=None, username=None, ip_address=None, **kwargs) -> None:
    from approvals import services

    services.record_sign_in_failure(username=str(username or ""), locked_out=True)
