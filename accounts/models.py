"""A tenant's single sign-on: the provider its members sign in with, whether a password may
still be used, and the provider's groups that give a role in the tenant."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from approvals.models import Role, Tenant


class TenantSignOn(models.Model):
    """A tenant that signs in through an OpenID Connect provider (config.env.oidc_providers)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="sign_on")
    provider_id = models.CharField(max_length=30)
    # Members must sign in through the provider to work in the tenant: a password (or a
    # passkey alone) is not enough.
    required = models.BooleanField(default=False)
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"{self.tenant.slug} via {self.provider_id}"


class GroupRole(models.Model):
    """Members of the provider's group (a value of its groups claim) get this role in the
    tenant when they sign in: the only way besides an invitation that SSO makes a member."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sso_group_roles")
    provider_id = models.CharField(max_length=30)
    group = models.CharField(max_length=200)
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "provider_id", "group"], name="sso_group_role_unique"
            )
        ]
        ordering = ["provider_id", "group"]

    def __str__(self) -> str:
        return f"{self.provider_id}:{self.group} -> {self.role} in {self.tenant.slug}"


class GroupGrant(models.Model):
    """A membership that a group mapping gave (accounts.sso.sync_groups): the next SSO sign-in
    changes its role with the mapping, and removes it when no mapped group is left. A
    membership without a grant was given by an invitation or an admin and is left alone."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    provider_id = models.CharField(max_length=30)
    groups = models.JSONField(default=list)
    granted_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="sso_group_grant_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.tenant_id} by {self.provider_id}"
