"""The idempotency ledger: one row per side effect of an approved call, claimed before it runs."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from approvals.models.runs import Run
from approvals.models.tenants import Tenant
from approvals.models.tickets import Ticket


class LedgerStatus(models.TextChoices):
    CLAIMED = "claimed", "Claimed"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class IdempotencyRecord(models.Model):
    """One side effect, claimed before it happens and confirmed after."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="ledger")
    key = models.CharField(max_length=64, unique=True)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="effects")
    ticket = models.ForeignKey(
        Ticket, null=True, blank=True, on_delete=models.PROTECT, related_name="effects"
    )
    operation = models.CharField(max_length=100)
    resource = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=LedgerStatus.choices)
    claimed_by = models.CharField(max_length=200)
    claimed_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)
    result = models.TextField(blank=True)
    error = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.operation} {self.resource} ({self.status})"
