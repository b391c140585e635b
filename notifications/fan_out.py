"""The fan-out: a committed audit event becomes webhook deliveries and emails.

It runs when an audit event has committed (approvals.signals.audit_event_committed, connected
in receivers); it only writes delivery rows and enqueues their tasks, so a slow receiver or
SMTP server never slows a decision. Sending is the tasks' (deliveries, emails). A signed audit
checkpoint goes out the same way, with its statement, when approvals.signals.audit_checkpointed
says so (fan_out_checkpoint).
"""

from __future__ import annotations

import json

from django.db import transaction
from django.utils import timezone

from approvals.core.links import public_url
from approvals.live import hints
from approvals.models import AuditEvent
from notifications.attempts import wake_worker
from notifications.deliveries import deliver_webhook_task
from notifications.emails import create_emails, email_for, recipients_for
from notifications.events import event_for, facts_for
from notifications.models import Delivery, DeliveryStatus, Event, WebhookEndpoint


def fan_out(*, audit_event: AuditEvent) -> list[Delivery]:
    """Turn a committed audit event into deliveries and emails.

    Side effects: one Delivery row per active endpoint of the tenant that wants the event
    (idempotent per endpoint and event) with its delivery task enqueued; one EmailDelivery row
    per recipient (idempotent per recipient and event), its message rendered now, with its
    email task enqueued. Nothing at all for an audit action that does not notify.
    """
    event = event_for(audit_event)
    # A checkpoint is delivered with its signed statement (fan_out_checkpoint), never as a
    # plain notification.
    if event is None or event == Event.AUDIT_CHECKPOINT:
        return []
    # Filtered here, not in SQL: JSON containment differs between SQLite and PostgreSQL.
    active = WebhookEndpoint.objects.filter(tenant_id=audit_event.tenant_id, active=True)
    endpoints = [e for e in active if e.wants(event)]
    facts = facts_for(audit_event, event)
    recipients = recipients_for(facts, audit_event.tenant_id)
    if not endpoints and not recipients:
        return []
    body = json.dumps(facts.payload(audit_event), separators=(",", ":"), sort_keys=True)
    now = timezone.now()
    with transaction.atomic():
        created = _deliveries(endpoints, audit_event, event, body, now)
        if recipients:
            subject, text = email_for(facts)
            create_emails(audit_event, event, subject, text, recipients, now)
        if created or recipients:
            hints.notify_admins_on_commit(audit_event.tenant_id, status=DeliveryStatus.PENDING)
        wake_worker()
    return created


def fan_out_checkpoint(*, audit_event: AuditEvent, checkpoint: dict) -> list[Delivery]:
    """Offer a tenant's signed checkpoint statement to its webhooks.

    checkpoint is the tenant's entry of approvals.audit.checkpoints (statement, signature,
    public key), sent with the audit.checkpointed event that recorded it. A receiver can keep it
    as a copy of the chain's head outside the console's database and check its signature.

    Side effects: one Delivery row (event audit.checkpoint, idempotent per endpoint and audit
    event) per active endpoint of the tenant that subscribed to audit.checkpoint, with its
    delivery task enqueued; no email.
    """
    active = WebhookEndpoint.objects.filter(tenant_id=audit_event.tenant_id, active=True)
    endpoints = [e for e in active if e.wants(Event.AUDIT_CHECKPOINT)]
    if not endpoints:
        return []
    tenant = checkpoint["statement"]["tenant"]
    payload = {
        # Stable across retries: receivers deduplicate on it.
        "id": f"{tenant}:{audit_event.seq}",
        "event": Event.AUDIT_CHECKPOINT.value,
        "action": audit_event.action,
        "tenant": tenant,
        "checkpoint": checkpoint,
        "time": audit_event.created_at.isoformat(),
        "url": public_url("approvals:audit"),
    }
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True)
    with transaction.atomic():
        created = _deliveries(endpoints, audit_event, Event.AUDIT_CHECKPOINT, body, timezone.now())
        if created:
            hints.notify_admins_on_commit(audit_event.tenant_id, status=DeliveryStatus.PENDING)
        wake_worker()
    return created


def _deliveries(endpoints, audit_event: AuditEvent, event: str, body: str, now) -> list[Delivery]:
    """One pending Delivery per endpoint (none twice for an audit event), its task enqueued."""
    created = []
    for endpoint in endpoints:
        delivery, new = Delivery.objects.get_or_create(
            endpoint=endpoint,
            audit_event_id=audit_event.pk,
            defaults={
                "tenant_id": endpoint.tenant_id,
                "event": event,
                "payload": body,
                "next_attempt_at": now,
                "created_at": now,
                "updated_at": now,
            },
        )
        if new:
            deliver_webhook_task.enqueue(delivery.pk)
            created.append(delivery)
    return created
