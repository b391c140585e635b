"""Saving and removing a scope's policy: each change is a new version, and the pending tickets it
now governs move to it.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals import members
from approvals.audit import chain
from approvals.core.errors import DomainError
from approvals.live import hints
from approvals.models import (
    ApprovalPolicy,
    ApproverGroup,
    ExpiryAction,
    Tenant,
    Ticket,
    TicketStatus,
    TicketVote,
)
from approvals.policies import quorum, rules, scopes


class PolicyError(DomainError):
    """A policy or group change was refused; nothing was written."""


class PolicyUnchanged(PolicyError):
    """The values are those of the current version: no new version, no approvals invalidated."""

    def __init__(self, policy: ApprovalPolicy) -> None:
        super().__init__(f"nothing changed: {policy.scope_label} stays at v{policy.version}")
        self.policy = policy


POLICY_FIELDS = (
    "required_approvals",
    "group_rules",
    "allowed_groups",
    "expiry_seconds",
    "on_expiry",
    "expiry_message",
    "escalation_group",
    "escalation_seconds",
    "auto_rules",
    "step_up_minutes",
    "step_up_rules",
)

# A day: longer is no fresh factor at all.
MAX_STEP_UP_MINUTES = 24 * 60


def require_admin(user, tenant_id: int) -> None:
    if not members.is_admin(user, tenant_id):
        raise PolicyError("only an admin of this tenant can change its policies")


def save_policy(
    *, tenant: Tenant, user, agent_key: str = "", tool_name: str = "", **values: Any
) -> ApprovalPolicy:
    """Write the next version of the policy for (tenant, agent_key, tool_name).

    Side effects, in one transaction: a new immutable ApprovalPolicy row (version + 1); audit
    event policy.changed with the fields that changed; every pending ticket the new version now
    governs moves to it, and the approvals given under the old version are invalidated (audit
    ticket.votes_invalidated, live hint ticket.changed). Raises PolicyError (PolicyUnchanged
    when the values are the current version's), writing nothing.
    """
    require_admin(user, tenant.pk)
    unknown = set(values) - set(POLICY_FIELDS)
    if unknown:
        raise PolicyError(f"unknown policy fields: {sorted(unknown)}")
    required = int(values.get("required_approvals", 1))
    if not 1 <= required <= quorum.MAX_APPROVALS:
        raise PolicyError(f"required approvals must be from 1 to {quorum.MAX_APPROVALS}")
    named = scopes.groups_named(ApprovalPolicy(**values))
    check_groups_exist(tenant, named)
    if values.get("on_expiry") == ExpiryAction.ESCALATE and not values.get("escalation_group"):
        raise PolicyError("escalation needs a group to escalate to")
    for rule in [*(values.get("auto_rules") or []), *(values.get("step_up_rules") or [])]:
        if rule.get("op") not in rules.OPERATORS:
            raise PolicyError(f"unknown operator {rule.get('op')!r}")
    step_up = values.get("step_up_minutes")
    if step_up is not None and not 1 <= int(step_up) <= MAX_STEP_UP_MINUTES:
        raise PolicyError(
            f"a second factor is asked within 1 to {MAX_STEP_UP_MINUTES} minutes, or not at all"
        )
    with transaction.atomic():
        # The tenant's lock orders concurrent edits, so versions never collide, and a group
        # deleted meanwhile (delete_group takes the same lock) is seen here.
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        check_groups_exist(tenant, named)
        latest = scopes.latest_for_scope(tenant.pk, agent_key, tool_name)
        previous = latest if latest is not None and not latest.retired else None
        before = previous or scopes.builtin_policy(tenant.pk)
        now = timezone.now()
        policy = ApprovalPolicy(
            tenant=tenant,
            agent_key=agent_key,
            tool_name=tool_name,
            version=(latest.version if latest else 0) + 1,
            created_by=user,
            created_at=now,
            **values,
        )
        changes = {
            name: [getattr(before, name), getattr(policy, name)]
            for name in POLICY_FIELDS
            if getattr(before, name) != getattr(policy, name)
        }
        # Saving the same values again must not cost pending tickets their approvals.
        if previous is not None and not changes:
            raise PolicyUnchanged(previous)
        _write_version(
            policy,
            user=user,
            now=now,
            why=f"changed the policy to v{policy.version}",
            action="policy.changed",
            outcome="changed",
            changes=changes,
        )
    return policy


def remove_policy(
    *, tenant: Tenant, user, agent_key: str = "", tool_name: str = ""
) -> ApprovalPolicy:
    """Remove a scope's own policy: its tickets fall back to the next scope that has one (the
    tool alone, the agent alone, the tenant default, then the built-in default).

    Side effects, in one transaction under the tenant's lock: a new version marked retired
    (keeping the removed version's values, for the history); every pending ticket it governed
    moves to the fallback and the approvals it had are invalidated (audit
    ticket.votes_invalidated, live hint ticket.changed); audit event policy.removed. Raises
    PolicyError when the scope has no policy of its own, writing nothing.
    """
    require_admin(user, tenant.pk)
    with transaction.atomic():
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        current = scopes.current_for_scope(tenant.pk, agent_key, tool_name)
        if current is None:
            raise PolicyError(
                f"{ApprovalPolicy(agent_key=agent_key, tool_name=tool_name).scope_label} "
                "has no policy of its own to remove"
            )
        now = timezone.now()
        retired = ApprovalPolicy(
            tenant=tenant,
            agent_key=agent_key,
            tool_name=tool_name,
            version=current.version + 1,
            retired=True,
            created_by=user,
            created_at=now,
            **{name: getattr(current, name) for name in POLICY_FIELDS},
        )
        _write_version(
            retired,
            user=user,
            now=now,
            why=f"removed the policy for {retired.scope_label}",
            action="policy.removed",
            outcome="removed",
            removed=current.version,
        )
    return retired


def _write_version(
    policy: ApprovalPolicy, *, user, now, why: str, action: str, outcome: str, **detail: Any
) -> None:
    """Store a scope's new version, move the pending tickets it now decides (their approvals
    invalidated with `why`) and audit it. Runs in the caller's transaction, under the tenant's
    lock."""
    policy.save()
    moved = _move_pending_tickets(policy, user=user, now=now, why=why)
    chain.append(
        tenant_id=policy.tenant_id,
        action=action,
        actor=user,
        outcome=outcome,
        detail={
            "scope": policy.scope_label,
            "agent": policy.agent_key,
            "tool": policy.tool_name,
            "version": policy.version,
            **detail,
            "tickets_moved": moved,
        },
    )


def _move_pending_tickets(scope: ApprovalPolicy, *, user, now, why: str) -> int:
    """Move each pending ticket of the scope to the policy that governs it now.

    A ticket of the scope that a more specific scope governs stays where it is. The approvals a
    moved ticket had were given under other rules: they are invalidated, with `why`.
    """
    pending = Ticket.objects.filter(
        tenant_id=scope.tenant_id, status=TicketStatus.PENDING
    ).select_related("run", "policy")
    if scope.tool_name:
        pending = pending.filter(tool_name=scope.tool_name)
    if scope.agent_key:
        pending = pending.filter(run__agent_key=scope.agent_key)
    moved = 0
    governing: dict[tuple[str, str], ApprovalPolicy] = {}  # one resolve per agent and tool
    for ticket in pending:
        key = (ticket.run.agent_key, ticket.tool_name)
        if key not in governing:
            governing[key] = scopes.resolve(ticket.tenant_id, *key)
        policy = governing[key]
        if ticket.policy_id == policy.pk:
            continue
        old = scopes.policy_of(ticket)
        Ticket.objects.filter(pk=ticket.pk).update(policy=policy if policy.pk else None)
        moved += 1
        votes = list(ticket.votes.filter(invalidated_at__isnull=True).select_related("user"))
        if not votes:
            continue
        reason = f"invalidated when {user.get_username()} {why} at {now:%Y-%m-%d %H:%M} UTC"
        TicketVote.objects.filter(pk__in=[v.pk for v in votes]).update(
            invalidated_at=now, invalidated_reason=reason
        )
        noun = "approval" if len(votes) == 1 else "approvals"
        chain.append_for_ticket(
            ticket,
            action="ticket.votes_invalidated",
            actor=user,
            outcome=TicketStatus.PENDING,
            detail={
                "voters": [v.user.get_username() for v in votes],
                "from": old.version,
                "to": policy.version,
                "reason": f"{len(votes)} {noun} given under policy {scopes.version_label(old)} "
                f"were {reason}; approve again",
            },
        )
        hints.notify_on_commit(
            ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=ticket.run_id
        )
    return moved


def check_groups_exist(tenant: Tenant, named: set[str]) -> None:
    existing = set(
        ApproverGroup.objects.filter(tenant=tenant, name__in=named).values_list("name", flat=True)
    )
    if named - existing:
        raise PolicyError(f"no such group: {', '.join(sorted(named - existing))}")
