"""Runs: one paused agent run, its sealed state, its status and its lease."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from approvals.models.tenants import Tenant


class RunStatus(models.TextChoices):
    STARTING = "starting", "Starting"
    PAUSED = "paused", "Paused"
    QUEUED = "queued", "Queued"
    RESUMING = "resuming", "Resuming"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    NEEDS_ATTENTION = "needs_attention", "Needs attention"
    EXPIRED = "expired", "Expired"
    # A run its caller holds: every ticket is decided, and the caller resumes it in its own process.
    AWAITING_CALLER = "awaiting_caller", "Waiting for the caller"


TERMINAL_RUN_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION, RunStatus.EXPIRED}
)


class RunExecutor(models.TextChoices):
    # The console's worker resumes the run (pause_run, or started over the API).
    CONSOLE = "console", "Console"
    # The caller's own process holds the agent: it submitted the pause and resumes on the
    # signed decisions it fetches, then reports the outcome.
    CALLER = "caller", "Caller"


class Run(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="runs")
    agent_key = models.CharField(max_length=100)
    agent_version = models.CharField(max_length=50)
    schema_version = models.CharField(max_length=20)
    title = models.CharField(max_length=200, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="requested_runs",
    )
    # The encrypted RunState; the associated data binds it to tenant, run and generation.
    state_key_id = models.CharField(max_length=32)
    state_nonce = models.BinaryField(max_length=12)
    state_ciphertext = models.BinaryField()
    state_generation = models.PositiveIntegerField(default=1)
    session_backend = models.CharField(max_length=32, blank=True)
    session_id = models.CharField(max_length=255, blank=True)
    # Where the session lives for its backend (a SQLite file, a Redis key prefix); never a secret.
    session_location = models.CharField(max_length=500, blank=True)
    executor = models.CharField(
        max_length=10, choices=RunExecutor.choices, default=RunExecutor.CONSOLE
    )
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.PAUSED)
    status_reason = models.TextField(blank=True)
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    final_output = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "status", "-created_at"], name="run_tenant_status"),
            models.Index(fields=["status", "lease_expires_at"], name="run_status_lease"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.agent_key} v{self.agent_version}, {self.status})"
