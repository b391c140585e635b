"""The one way in: a committed audit event may notify someone. Cheap and never raising into
the caller (audit sends the signal robustly and logs a failure)."""

from __future__ import annotations

from django.dispatch import receiver

from approvals.signals import audit_event_committed
from notifications import fan_out


@receiver(audit_event_committed, dispatch_uid="notifications.fan_out")
def _fan_out(sender, event, **kwargs) -> None:
    fan_out.fan_out(audit_event=event)
