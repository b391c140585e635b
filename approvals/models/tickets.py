"""Tickets: one pending tool call each, the votes towards its quorum, and the pre-authorisations an edit makes."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from approvals.models.policies import ApprovalPolicy
from approvals.models.runs import Run
from approvals.models.tenants import Tenant

# A claim nobody renewed for this long no longer stops anyone else from claiming.
CLAIM_LAPSE = timedelta(minutes=30)


class TicketStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    SUPERSEDED = "superseded", "Superseded"


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
