"""Approval policies: which version applies to a call, who may decide it, when its quorum is met,
and which automatic rule (if any) decides it. Pure reads and arithmetic; writes are in services.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings

from approvals.models import ApprovalPolicy, ApproverGroup, ExpiryAction, Ticket, TicketVote

MAX_APPROVALS = 10

OPERATORS = {
    "eq": "==",
    "ne": "!=",
    "in": "in",
    "not_in": "not in",
    "matches": "matches",
}
_SYMBOLS = {symbol: op for op, symbol in OPERATORS.items()}


# --- which version applies ------------------------------------------------------------------


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
    scopes = list(
        dict.fromkeys(((agent_key, tool_name), ("", tool_name), (agent_key, ""), ("", "")))
    )
    current: dict[tuple[str, str], ApprovalPolicy] = {}
    for policy in ApprovalPolicy.objects.filter(
        tenant_id=tenant_id, agent_key__in={agent_key, ""}, tool_name__in={tool_name, ""}
    ).order_by("-version"):
        current.setdefault((policy.agent_key, policy.tool_name), policy)
    for scope in scopes:
        if scope in current and not current[scope].retired:
            return current[scope]
    return builtin_policy(tenant_id)


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


# --- who may decide -------------------------------------------------------------------------


def groups_of(user, tenant_id: int) -> set[str]:
    if user is None or not getattr(user, "pk", None):
        return set()
    return set(
        ApproverGroup.objects.filter(tenant_id=tenant_id, members=user).values_list(
            "name", flat=True
        )
    )


def vote_refusal(
    vote: TicketVote, groups_now: set[str], ticket: Ticket, policy: ApprovalPolicy
) -> str:
    """Why a vote no longer holds under the groups its voter is in now; "" when it does.

    A vote given after the ticket's escalation needs the escalation group; one given before
    needs the policy's deciding groups (when it names any)."""
    if ticket.escalated_at and policy.escalation_group and vote.created_at >= ticket.escalated_at:
        allowed = [policy.escalation_group]
    else:
        allowed = list(policy.allowed_groups or [])
    if not allowed or groups_now & set(allowed):
        return ""
    return f"only members of {' or '.join(allowed)} may decide this ticket"


def eligible_groups(ticket: Ticket, policy: ApprovalPolicy) -> list[str]:
    """The groups whose members may decide the ticket; empty means anyone who may decide."""
    if ticket.escalated_at and policy.escalation_group:
        return [policy.escalation_group]
    return list(policy.allowed_groups or [])


def refusal_for(user, ticket: Ticket, policy: ApprovalPolicy) -> str:
    """Why this member may not decide the ticket under its policy; "" when they may."""
    allowed = eligible_groups(ticket, policy)
    if not allowed:
        return ""
    if groups_of(user, ticket.tenant_id) & set(allowed):
        return ""
    names = " or ".join(allowed)
    if ticket.escalated_at:
        return f"this ticket was escalated; only members of {names} may decide it now"
    return f"only members of {names} may decide this ticket"


# --- the quorum ------------------------------------------------------------------------------


def _rules(policy: ApprovalPolicy, ticket: Ticket) -> list[dict]:
    # After escalation the escalation group decides; the original group rules no longer apply.
    if ticket.escalated_at and policy.escalation_group:
        return []
    return [r for r in (policy.group_rules or []) if int(r.get("count", 0)) > 0]


def _matched_slots(slots: list[str], voters: list[set[str]]) -> int:
    """How many group slots distinct voters can fill, each voter filling at most one slot."""
    owner: dict[int, int] = {}

    def place(voter: int, seen: set[int]) -> bool:
        for slot, group in enumerate(slots):
            if group in voters[voter] and slot not in seen:
                seen.add(slot)
                if slot not in owner or place(owner[slot], seen):
                    owner[slot] = voter
                    return True
        return False

    return sum(1 for voter in range(len(voters)) if place(voter, set()))


@dataclass
class Progress:
    required: int
    voters: list[str]
    missing_groups: list[tuple[int, str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.voters)

    @property
    def met(self) -> bool:
        return self.count >= self.required and not self.missing_groups

    def describe(self) -> str:
        noun = "approval" if self.required == 1 else "approvals"
        text = f"{self.count} of {self.required} {noun}"
        if self.voters:
            text += ": " + ", ".join(self.voters)
        if self.missing_groups:
            text += "; needs " + " and ".join(f"{n} from {g}" for n, g in self.missing_groups)
        return text


def progress(ticket: Ticket, policy: ApprovalPolicy, votes: list[TicketVote]) -> Progress:
    """Where the ticket's valid votes stand against its policy."""
    valid = [v for v in votes if v.is_valid]
    rules = _rules(policy, ticket)
    sets = [set(v.groups) for v in valid]
    missing: list[tuple[int, str]] = []
    for rule in rules:
        group, count = rule["group"], int(rule["count"])
        have = sum(1 for groups in sets if group in groups)
        if have < count:
            missing.append((count - have, group))
    slots = [r["group"] for r in rules for _ in range(int(r["count"]))]
    if not missing and _matched_slots(slots, sets) < len(slots):
        # Each rule alone is met, but one person cannot count for two rules at once.
        missing.append((1, " or ".join(r["group"] for r in rules)))
    return Progress(
        required=max(1, policy.required_approvals),
        voters=[v.user.get_username() for v in valid],
        missing_groups=missing,
    )


def counted_groups(user_groups: set[str], ticket: Ticket, policy: ApprovalPolicy) -> list[str]:
    """The groups the policy names that the voter belongs to (what their vote can count for)."""
    named = {r["group"] for r in _rules(policy, ticket)} | set(eligible_groups(ticket, policy))
    return sorted(user_groups & named)


# --- automatic decisions ---------------------------------------------------------------------


@dataclass(frozen=True)
class AutoDecision:
    approve: bool
    rule: str
    reason: str


def _lookup(arguments: Any, path: str) -> tuple[bool, Any]:
    value = arguments
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def rule_matches(rule: dict, arguments: Any) -> bool:
    """A missing argument never matches: an absent value is no evidence of low risk."""
    found, value = _lookup(arguments, rule["argument"])
    if not found:
        return False
    text, expected, op = _as_text(value), rule["value"], rule["op"]
    if op == "eq":
        return text == expected
    if op == "ne":
        return text != expected
    options = [o.strip() for o in expected.split(",")]
    if op == "in":
        return text in options
    if op == "not_in":
        return text not in options
    if op == "matches":
        return re.fullmatch(expected, text) is not None
    return False


def describe_rule(rule: dict) -> str:
    return (
        f"{rule['decision']} if {rule['argument']} {OPERATORS[rule['op']]} {rule['value']} "
        f"because {rule['reason']}"
    )


def allows_always(policy: ApprovalPolicy) -> bool:
    """Whether one person may approve a tool for the rest of a run. "Always" lets later calls
    of the tool run without a ticket, so it would waive a quorum, group rules or a rule that
    rejects some arguments: it is offered only when one approval from anyone allowed is all
    the policy asks."""
    return (
        policy.required_approvals <= 1
        and not policy.group_rules
        and not any(rule.get("decision") == "reject" for rule in policy.auto_rules or [])
    )


def automatic_decision(policy: ApprovalPolicy, arguments_json: str) -> AutoDecision | None:
    """The first of the policy's rules that matches the canonical arguments, if any."""
    if not policy.auto_rules:
        return None
    try:
        arguments = json.loads(arguments_json)
    except ValueError:
        return None
    for rule in policy.auto_rules:
        if rule_matches(rule, arguments):
            return AutoDecision(
                approve=rule["decision"] == "approve",
                rule=describe_rule(rule).split(" because ")[0],
                reason=rule["reason"],
            )
    return None


# --- the text forms of rules -----------------------------------------------------------------

_RULE_LINE = re.compile(
    r"^(?P<decision>approve|reject)\s+if\s+(?P<argument>[A-Za-z_][\w.]*)\s+"
    r"(?P<op>==|!=|not\s+in|in|matches)\s+(?P<value>.+?)\s+because\s+(?P<reason>.+)$",
    re.IGNORECASE,
)
_GROUP_LINE = re.compile(r"^(?P<count>\d+)\s+(?:from\s+)?(?P<group>.+)$")


class RuleSyntaxError(ValueError):
    pass


def parse_auto_rules(text: str) -> list[dict]:
    rules = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        match = _RULE_LINE.match(line)
        if match is None:
            raise RuleSyntaxError(
                f"line {number}: write 'approve if ARGUMENT OP VALUE because REASON' "
                "(OP is ==, !=, in, not in or matches)"
            )
        op = _SYMBOLS[" ".join(match["op"].lower().split())]
        value = match["value"].strip()
        if op == "matches":
            try:
                re.compile(value)
            except re.error as error:
                raise RuleSyntaxError(
                    f"line {number}: {value!r} is not a valid regular expression ({error})"
                ) from None
        rules.append(
            {
                "argument": match["argument"],
                "op": op,
                "value": value,
                "decision": match["decision"].lower(),
                "reason": match["reason"].strip(),
            }
        )
    return rules


def format_auto_rules(rules: list[dict]) -> str:
    return "\n".join(describe_rule(r) for r in rules)


def parse_group_rules(text: str) -> list[dict]:
    rules = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        match = _GROUP_LINE.match(line)
        if match is None or not 1 <= int(match["count"]) <= MAX_APPROVALS:
            raise RuleSyntaxError(
                f"line {number}: write 'COUNT GROUP', e.g. '1 release managers' "
                f"(COUNT from 1 to {MAX_APPROVALS})"
            )
        rules.append({"group": match["group"].strip(), "count": int(match["count"])})
    return rules


def format_group_rules(rules: list[dict]) -> str:
    return "\n".join(f"{r['count']} {r['group']}" for r in rules)
