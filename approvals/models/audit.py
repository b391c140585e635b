"""The audit log: one append-only, hash-chained event per change."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from approvals.models.runs import Run
from approvals.models.tenants import Tenant
from approvals.models.tickets import Ticket


class AuditEvent(models.Model):
    """Append-only, hash-chained per tenant; the database refuses UPDATE and DELETE."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="audit_events")
    seq = models.BigIntegerField()
    created_at = models.DateTimeField()
    # No database constraints: a deleted user or run must never force a write to this table.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64)
    run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    ticket = models.ForeignKey(
        Ticket,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    tool_name = models.CharField(max_length=200, blank=True)
    arguments_digest = models.CharField(max_length=64, blank=True)
    outcome = models.CharField(max_length=64, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # The id of the APPROVALS_AUDIT_KEYS key whose HMAC-SHA256 linked this event (the key
    # itself is never stored); "" for an event linked with plain SHA-256 before the chain had
    # a key (approvals.audit.chain).
    hash_key_id = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "seq"], name="audit_tenant_seq_unique")
        ]
        indexes = [
            models.Index(fields=["tenant", "-created_at", "-id"], name="audit_tenant_time"),
            models.Index(fields=["run", "seq"], name="audit_run"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}#{self.seq} {self.action}"
