"""Sign-in failures reach the audit log. Auth offers only signals as a hook, so they live here
and do nothing but call the service.

`audit_event_committed` is the one hook other apps (notifications) listen on: audit.append
sends it once the event's transaction has committed, so a rolled-back change notifies no one.
"""

from __future__ import annotations

from axes.signals import user_locked_out
from django.contrib.auth.signals import user_login_failed
from django.dispatch import Signal, receiver

from approvals import services

# Sent with event=<AuditEvent> after the transaction that wrote the event commits.
audit_event_committed = Signal()


@receiver(user_login_failed, dispatch_uid="approvals.sign_in_failed")
def _sign_in_failed(sender, credentials, request=None, **kwargs) -> None:
    services.record_sign_in_failure(username=str(credentials.get("username", "")), locked_out=False)


@receiver(user_locked_out, dispatch_uid="approvals.locked_out")
def _locked_out(sender, request=None, username=None, ip_address=None, **kwargs) -> None:
    services.record_sign_in_failure(username=str(username or ""), locked_out=True)
