"""Rows of the approval console. Facts about one row live here; anything that touches several
rows, writes the audit log or enqueues work is in services.py."""

from __future__ import annotations

from datetime import timedelta

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

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    APPROVER = "approver", "Approver"
    AUDITOR = "auditor", "Auditor"
    ADMIN = "admin", "Admin"


DECIDING_ROLES = frozenset({Role.APPROVER, Role.ADMIN})


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


class RunStatus(models.TextChoices):
    PAUSED = "paused", "Paused"
    QUEUED = "queued", "Queued"
    RESUMING = "resuming", "Resuming"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    NEEDS_ATTENTION = "needs_attention", "Needs attention"
    EXPIRED = "expired", "Expired"


TERMINAL_RUN_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION, RunStatus.EXPIRED}
)


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


# A claim nobody renewed for this long no longer stops anyone else from claiming.
CLAIM_LAPSE = timedelta(minutes=30)


class TicketStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    SUPERSEDED = "superseded", "Superseded"


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


class Ticket(models.Model):
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="tickets")
    # Copied from the run so the queue is one indexed scan.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="tickets")
    generation = models.PositiveIntegerField()
    agent_name = models.CharField(max_length=200, blank=True)
    tool_name = models.CharField(max_length=200)
    tool_call_id = models.CharField(max_length=200)
    arguments_json = models.TextField()
    arguments_digest = models.CharField(max_length=64)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="requested_tickets",
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    status = models.CharField(
        max_length=16, choices=TicketStatus.choices, default=TicketStatus.PENDING
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="decided_tickets",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_message = models.TextField(blank=True)
    always = models.BooleanField(default=False)
    # The policy version the ticket is decided under (None: created before policies existed).
    policy = models.ForeignKey(
        ApprovalPolicy, null=True, blank=True, on_delete=models.PROTECT, related_name="tickets"
    )
    # Set when nobody decided in time and the ticket went to the policy's escalation group.
    escalated_at = models.DateTimeField(null=True, blank=True)
    # "": a person decided; "rule", "expiry": decided without a person, decision_reason says why.
    decision_source = models.CharField(max_length=16, blank=True)
    decision_reason = models.TextField(blank=True)
    # "I'm on it": who is looking at this ticket; a claim lapses after CLAIM_LAPSE.
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="claimed_tickets",
    )
    claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "tool_call_id"], name="ticket_run_call_unique")
        ]
        indexes = [
            models.Index(
                fields=["tenant", "status", "-created_at", "-id"], name="ticket_tenant_queue"
            ),
            models.Index(fields=["status", "expires_at"], name="ticket_status_expiry"),
            # The queue across all of a user's tenants: newest pending first, without a sort.
            models.Index(
                fields=["-created_at", "-id"],
                condition=models.Q(status="pending"),
                name="ticket_pending_recent",
            ),
        ]

    def __str__(self) -> str:
        return f"ticket {self.pk} {self.tool_name} ({self.status})"

    @property
    def is_pending(self) -> bool:
        return self.status == TicketStatus.PENDING

    @property
    def is_expired(self) -> bool:
        return self.status == TicketStatus.EXPIRED or (
            self.is_pending and self.expires_at <= timezone.now()
        )

    def is_requested_by(self, user) -> bool:
        return self.requested_by_id is not None and self.requested_by_id == user.pk

    @property
    def claim_is_active(self) -> bool:
        """A claim counts while the ticket is pending and the claim has not lapsed."""
        return (
            self.claimed_by_id is not None
            and self.claimed_at is not None
            and self.is_pending
            and self.claimed_at > timezone.now() - CLAIM_LAPSE
        )

    @property
    def active_claimant(self):
        return self.claimed_by if self.claim_is_active else None


class TicketVote(models.Model):
    """One person's approval counted towards a ticket's quorum."""

    ticket = models.ForeignKey(Ticket, on_delete=models.CASCADE, related_name="votes")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    policy = models.ForeignKey(
        ApprovalPolicy, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    # The groups of the ticket's policy the person belonged to when voting.
    groups = models.JSONField(default=list, blank=True)
    invalidated_at = models.DateTimeField(null=True, blank=True)
    invalidated_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["created_at", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["ticket", "user"],
                condition=models.Q(invalidated_at__isnull=True),
                name="vote_one_valid_per_person",
            )
        ]

    def __str__(self) -> str:
        return f"vote {self.user_id} on ticket {self.ticket_id}"

    @property
    def is_valid(self) -> bool:
        return self.invalidated_at is None


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


class PreAuthorization(models.Model):
    """An approver's edit of a call: the original was rejected with the corrected arguments,
    and a new call of exactly this tool and digest in the same run is approved once, by them."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="preauthorizations")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="preauthorizations")
    tool_name = models.CharField(max_length=200)
    arguments_json = models.TextField()
    arguments_digest = models.CharField(max_length=64)
    # The rejected call it corrects; a ticket is decided once, so it is edited at most once.
    original_ticket = models.OneToOneField(
        Ticket, on_delete=models.PROTECT, related_name="preauthorization"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="preauthorizations",
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_by = models.OneToOneField(
        Ticket,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="preauthorized_by",
    )
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["run", "tool_name", "arguments_digest"], name="preauth_lookup"),
        ]

    def __str__(self) -> str:
        return f"pre-authorisation {self.pk} {self.tool_name} (ticket {self.original_ticket_id})"

    @property
    def is_used(self) -> bool:
        return self.used_by_id is not None
