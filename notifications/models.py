"""Webhook endpoints per tenant, one delivery row per (endpoint, audit event), and one email
delivery row per (audit event, recipient)."""

from __future__ import annotations

import json

from django.conf import settings
from django.db import models
from django.utils import timezone

from approvals.models import Tenant


class Event(models.TextChoices):
    """What a notification is about; several audit actions map to one event (see events.py)."""

    TICKET_CREATED = "ticket.created", "New ticket"
    TICKET_DECIDED = "ticket.decided", "Ticket decided"
    TICKET_EXPIRED = "ticket.expired", "Ticket expired"
    TICKET_ESCALATED = "ticket.escalated", "Ticket escalated"
    # A caller's run: every ticket decided, its caller may fetch the decisions and resume.
    RUN_DECIDED = "run.decided", "Run decided, waiting for its caller"
    RUN_COMPLETED = "run.completed", "Run completed"
    RUN_FAILED = "run.failed", "Run failed, expired or in doubt"
    # The tenant's audit chain head, signed (manage.py audit_checkpoint): webhooks only.
    AUDIT_CHECKPOINT = "audit.checkpoint", "Audit checkpoint"


class WebhookEndpoint(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=500)
    description = models.CharField(max_length=200, blank=True)
    # A list of Event values; an empty list receives nothing.
    events = models.JSONField(default=list)
    active = models.BooleanField(default=True)
    # The signing secret, sealed by approvals.crypto and bound to tenant and endpoint.
    secret_key_id = models.CharField(max_length=32, blank=True)
    secret_nonce = models.BinaryField(max_length=12, blank=True)
    secret_ciphertext = models.BinaryField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant", "pk"]
        indexes = [models.Index(fields=["tenant", "active"], name="webhook_tenant_active")]

    def __str__(self) -> str:
        return f"{self.tenant} -> {self.url}"

    def wants(self, event: str) -> bool:
        return self.active and event in self.events

    @property
    def event_labels(self) -> list[str]:
        return [Event(e).label for e in self.events if e in Event.values]


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


class Attempted(models.Model):
    """What a delivery and an email share: what they tell about, and how their attempts went
    (notifications.attempts claims, settles and reopens them the same way)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    # The audit event it tells about; no constraint, like the audit log's own links.
    audit_event = models.ForeignKey(
        "approvals.AuditEvent",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    event = models.CharField(max_length=32, choices=Event.choices)
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @property
    def can_retry(self) -> bool:
        return self.status == DeliveryStatus.FAILED


class Delivery(Attempted):
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    # The exact body sent on every attempt, so a retry signs the same bytes.
    payload = models.TextField()
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_duration_ms = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "audit_event"], name="delivery_endpoint_event_unique"
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "-created_at", "-id"], name="delivery_tenant_time"),
            models.Index(fields=["endpoint", "-created_at", "-id"], name="delivery_endpoint_time"),
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} {self.event} ({self.status})"

    @property
    def link(self) -> str:
        """The ticket or run the delivery tells about, as sent in its payload."""
        try:
            url = json.loads(self.payload).get("url")
        except (ValueError, AttributeError):
            return ""
        return url if isinstance(url, str) and url.startswith(("http://", "https://")) else ""

    @property
    def error_note(self) -> str:
        """The last error, unless it only repeats the HTTP status shown beside it."""
        return "" if self.last_error == f"HTTP {self.last_status_code}" else self.last_error


class EmailDelivery(Attempted):
    """One notification email to one address, so a bad mailbox retries only itself."""

    recipient = models.EmailField(max_length=254)
    # Rendered once at fan-out, so every attempt sends the same message. Like the payload of a
    # webhook it holds ids, the tool, the digest, the status and a link, never argument values.
    subject = models.CharField(max_length=200)
    body = models.TextField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["audit_event", "recipient"], name="email_delivery_event_recipient_unique"
            )
        ]
        indexes = [
            models.Index(
                fields=["tenant", "-created_at", "-id"], name="email_delivery_tenant_time"
            ),
            # The reaper's scan for pending emails that lost their task.
            models.Index(fields=["status", "next_attempt_at"], name="email_delivery_due"),
        ]

    def __str__(self) -> str:
        return f"email {self.pk} {self.event} ({self.status})"

    @property
    def link(self) -> str:
        """The ticket or run the email tells about: the body's "Open it:" line."""
        for line in self.body.splitlines():
            if line.startswith("Open it: "):
                url = line.removeprefix("Open it: ").strip()
                return url if url.startswith(("http://", "https://")) else ""
        return ""


class FanOutCursor(models.Model):
    """How far the fan-out has read a tenant's audit chain: every event up to seq is fanned out.

    Kept here, not on the tenant row, which every audit append locks: the worker's fan-out
    moves it (notifications.fan_out.catch_up) without ever waiting on a decision or a resume.
    A tenant without a cursor is new since the cursors were made, and is read from its start.
    """

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, primary_key=True, related_name="fan_out_cursor"
    )
    seq = models.BigIntegerField(default=0)
    # Passes in a row whose fan-out of the event after seq raised; reset when it goes through.
    failures = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"fan-out of {self.tenant_id} at #{self.seq}"
