"""Tenants, their members and roles: who may see and do what in a tenant."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # Head of the tenant's audit hash chain; written under this row's lock with each event.
    audit_seq = models.BigIntegerField(default=0)
    audit_head = models.CharField(max_length=64, default="")
    created_at = models.DateTimeField(default=timezone.now)
    # Deciders (approvers and admins) must have a second factor (TOTP or a passkey) before
    # they may decide a ticket (approvals.decisions.decide.check_decider).
    deciders_need_two_factor = models.BooleanField(default=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    APPROVER = "approver", "Approver"
    AUDITOR = "auditor", "Auditor"
    ADMIN = "admin", "Admin"


# The role sets, each defined once: who decides tickets, reads the audit history, and writes in
# a ticket's discussion (viewers read it).
DECIDING_ROLES = frozenset({Role.APPROVER, Role.ADMIN})
HISTORY_ROLES = frozenset({Role.AUDITOR, Role.ADMIN})
COMMENTING_ROLES = frozenset({Role.APPROVER, Role.AUDITOR, Role.ADMIN})


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_user_tenant_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"

    @property
    def can_decide(self) -> bool:
        return self.role in DECIDING_ROLES

    @property
    def can_read_history(self) -> bool:
        return self.role in HISTORY_ROLES

    @property
    def can_comment(self) -> bool:
        return self.role in COMMENTING_ROLES

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN


class Invitation(models.Model):
    """An email invited to become a member with a role; its link carries a token stored hashed."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices)
    # SHA-256 of the link's token: the token itself is only in the email.
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.email} @ {self.tenant} ({self.role})"

    @property
    def is_pending(self) -> bool:
        return (
            self.accepted_at is None
            and self.revoked_at is None
            and self.expires_at > timezone.now()
        )
