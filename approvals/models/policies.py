"""Approval policies and approver groups: versioned rules for (tenant, agent, tool)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from approvals.models.tenants import Tenant


class ExpiryAction(models.TextChoices):
    EXPIRE = "expire", "Expire (the run stops)"
    REJECT = "reject", "Reject (the model is told, the run continues)"
    ESCALATE = "escalate", "Escalate to another group, then reject"


class ApproverGroup(models.Model):
    """A named set of a tenant's members, e.g. release managers; policies refer to it by name."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="approver_groups")
    name = models.CharField(max_length=100)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="approver_groups"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="approver_group_unique")
        ]

    def __str__(self) -> str:
        return self.name


class ApprovalPolicy(models.Model):
    """One immutable version of the rules for (tenant, agent, tool); blank agent and tool make
    the tenant's default. An edit writes a new row with the next version; the highest version
    of a scope is the current one."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="policies")
    agent_key = models.CharField(max_length=100, blank=True)
    tool_name = models.CharField(max_length=200, blank=True)
    version = models.PositiveIntegerField()
    required_approvals = models.PositiveSmallIntegerField(default=1)
    # [{"group": "release managers", "count": 1}, ...]
    group_rules = models.JSONField(default=list, blank=True)
    # Names of the groups whose members may decide; empty: any member who may decide.
    allowed_groups = models.JSONField(default=list, blank=True)
    # None: the console's default time to live.
    expiry_seconds = models.PositiveIntegerField(null=True, blank=True)
    on_expiry = models.CharField(
        max_length=16, choices=ExpiryAction.choices, default=ExpiryAction.EXPIRE
    )
    expiry_message = models.TextField(blank=True)
    escalation_group = models.CharField(max_length=100, blank=True)
    escalation_seconds = models.PositiveIntegerField(null=True, blank=True)
    # [{"argument": "environment", "op": "ne", "value": "production", "decision": "approve",
    #   "reason": "..."}, ...]
    auto_rules = models.JSONField(default=list, blank=True)
    # Step-up: an approval needs a second factor proven within the last N minutes of the
    # approver's session (None: no step-up). With rules ([{"argument": "environment", "op":
    # "eq", "value": "production"}, ...]) only a call one of them matches needs it. A batch or
    # an API token cannot approve such a call (approvals.decisions.stepup).
    step_up_minutes = models.PositiveSmallIntegerField(null=True, blank=True)
    step_up_rules = models.JSONField(default=list, blank=True)
    # A version that removes the scope's own policy: tickets fall back to the next scope (the
    # tool alone, the agent alone, the tenant default, the built-in default). It keeps the
    # values of the version it removed, for the history; a later save brings the scope back.
    retired = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "agent_key", "tool_name", "version"],
                name="policy_scope_version_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.scope_label} v{self.version}"

    @property
    def scope_label(self) -> str:
        if not self.agent_key and not self.tool_name:
            return "tenant default"
        return f"{self.agent_key or 'any agent'} / {self.tool_name or 'any tool'}"

    @property
    def is_builtin(self) -> bool:
        return self.pk is None
