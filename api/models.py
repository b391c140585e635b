"""API tokens: a tenant's credential for the HTTP API, stored as a prefix and a hash."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from approvals.models import Tenant


class Scope(models.TextChoices):
    RUNS_WRITE = "runs:write", "Start and hand over runs, report outcomes"
    RUNS_READ = "runs:read", "Read runs"
    TICKETS_READ = "tickets:read", "Read tickets"
    TICKETS_DECIDE = "tickets:decide", "Decide tickets as the token's person"


class ApiToken(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The visible part of the token (apc_<prefix>_<secret>), shown in lists and the audit log.
    prefix = models.CharField(max_length=8, unique=True)
    # SHA-256 hex of the whole token: the token itself is shown once and never stored.
    token_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    expires_at = models.DateTimeField()
    # The person the token acts as: decisions are theirs, runs are requested by them.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_tokens",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now)
    # Written at most once a minute (api.tokens.record_use), never on every request.
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"API token {self.prefix} ({self.name})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expires_at <= timezone.now()

    @property
    def status(self) -> str:
        if self.is_revoked:
            return "revoked"
        return "expired" if self.is_expired else "active"

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes
