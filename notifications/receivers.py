"""What notifications hears from approvals (approvals.signals), connected in AppConfig.ready.

The worker's notifications pool fans out the audit events committed since its last poll
(audit_tail); nothing listens to audit_event_committed, so a decision, a pause or a resume
spends nothing on its notifications. A signed audit checkpoint goes to the tenant's webhooks.
The worker's housekeeping gives lost deliveries their task again, and a key rotation re-seals
the webhook secrets.
"""

from __future__ import annotations

from django.dispatch import receiver

from approvals.signals import (
    Rotation,
    audit_checkpointed,
    audit_tail,
    secrets_rotating,
    worker_housekeeping,
)
from notifications import deliveries, endpoints, fan_out


@receiver(audit_tail, dispatch_uid="notifications.catch_up")
def _catch_up(sender, **kwargs) -> int:
    return fan_out.catch_up()


@receiver(audit_checkpointed, dispatch_uid="notifications.checkpoint")
def _checkpoint(sender, event, checkpoint, **kwargs) -> None:
    fan_out.fan_out_checkpoint(audit_event=event, checkpoint=checkpoint)


@receiver(worker_housekeeping, dispatch_uid="notifications.requeue_stale")
def _requeue_stale(sender, **kwargs) -> str:
    lost = deliveries.requeue_stale()
    return f"re-enqueued {lost} webhook and email deliveries" if lost else ""


@receiver(secrets_rotating, dispatch_uid="notifications.rotate_webhook_secrets")
def _rotate_webhook_secrets(sender, **kwargs) -> Rotation:
    counts = endpoints.rotate_webhook_secrets()
    return Rotation("webhook secrets", counts["rotated"], counts["failed"])
