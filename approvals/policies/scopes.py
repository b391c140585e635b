"""Which policy version governs a call: the most specific scope in force, down to the built-in
default.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db.models import QuerySet

from approvals.core import statements
from approvals.models import (
    ApprovalPolicy,
    ExpiryAction,
    Ticket,
)


def builtin_policy(tenant_id: int) -> ApprovalPolicy:
    """Today's behaviour, never stored: one approval by anyone who may decide, expire on expiry."""
    return ApprovalPolicy(
        tenant_id=tenant_id,
        version=0,
        required_approvals=1,
        on_expiry=ExpiryAction.EXPIRE,
    )


def latest_for_scope(tenant_id: int, agent_key: str, tool_name: str) -> ApprovalPolicy | None:
    """The scope's newest version, a retired one included (it numbers the next version)."""
    return (
        ApprovalPolicy.objects.filter(tenant_id=tenant_id, agent_key=agent_key, tool_name=tool_name)
        .order_by("-version")
        .first()
    )


def current_for_scope(tenant_id: int, agent_key: str, tool_name: str) -> ApprovalPolicy | None:
    """The scope's own policy in force, or None when it has none (never saved, or removed)."""
    latest = latest_for_scope(tenant_id, agent_key, tool_name)
    return None if latest is None or latest.retired else latest


def current_policies(tenant_id: int) -> list[ApprovalPolicy]:
    """The current version of each of the tenant's scopes in force: the default first, then by
    scope; a removed scope is left out."""
    latest: dict[tuple[str, str], ApprovalPolicy] = {}
    for policy in ApprovalPolicy.objects.filter(tenant_id=tenant_id).order_by("version"):
        latest[(policy.agent_key, policy.tool_name)] = policy
    return sorted(
        (p for p in latest.values() if not p.retired),
        key=lambda p: (bool(p.agent_key or p.tool_name), p.scope_label),
    )


def groups_named(policy: ApprovalPolicy) -> set[str]:
    """Every group a policy names: in its rules, in who may decide, and to escalate to."""
    named = {rule["group"] for rule in policy.group_rules or []}
    named |= set(policy.allowed_groups or [])
    if policy.escalation_group:
        named.add(policy.escalation_group)
    return named


def resolve(tenant_id: int, agent_key: str, tool_name: str) -> ApprovalPolicy:
    """The most specific current policy: agent+tool, then tool alone, then agent alone, then the
    tenant's default, then the built-in default; a removed scope is passed over. One query for
    all four scopes."""
    return resolve_many(tenant_id, agent_key, [tool_name])[tool_name]


def resolve_many(
    tenant_id: int, agent_key: str, tool_names: Iterable[str]
) -> dict[str, ApprovalPolicy]:
    """resolve() for each of the agent's tools named, by tool name: one query for them all."""
    names = set(tool_names)
    current: dict[tuple[str, str], ApprovalPolicy] = {}
    ordered = sorted(names - {""})
    values = {
        "tenant": tenant_id,
        "agent": agent_key,
        **{f"tool{n}": name for n, name in enumerate(ordered)},
    }
    if agent_key:
        # Every pause reads this: written once per process and number of tools.
        policies = statements.objects(("scopes.resolve", len(ordered)), _in_scopes, values)
    else:
        policies = _in_scopes(values)
    for policy in policies:
        current.setdefault((policy.agent_key, policy.tool_name), policy)

    def most_specific(tool_name: str) -> ApprovalPolicy:
        for scope in ((agent_key, tool_name), ("", tool_name), (agent_key, ""), ("", "")):
            if scope in current and not current[scope].retired:
                return current[scope]
        return builtin_policy(tenant_id)

    return {name: most_specific(name) for name in names}


def _in_scopes(values) -> QuerySet[ApprovalPolicy]:
    """The tenant's policies of the four scopes of each tool named tool0, tool1, ... (none of
    them, nor the agent, ""), newest version first."""
    tools = [value for name, value in values.items() if name.startswith("tool")]
    return ApprovalPolicy.objects.filter(
        tenant_id=values["tenant"],
        agent_key__in=[values["agent"], ""],
        tool_name__in=[*tools, ""],
    ).order_by("-version")


def policy_of(ticket: Ticket) -> ApprovalPolicy:
    return ticket.policy if ticket.policy_id else builtin_policy(ticket.tenant_id)


def time_to_live(policy: ApprovalPolicy) -> timedelta:
    if policy.expiry_seconds:
        return timedelta(seconds=policy.expiry_seconds)
    return settings.APPROVALS_TICKET_TTL


def escalation_window(policy: ApprovalPolicy) -> timedelta:
    if policy.escalation_seconds:
        return timedelta(seconds=policy.escalation_seconds)
    return time_to_live(policy)


def version_label(policy: ApprovalPolicy) -> str:
    return "the built-in default" if policy.is_builtin else f"v{policy.version}"
