"""Who may decide a ticket, and when its approvals meet its policy's quorum and group rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from approvals.models import (
    ApprovalPolicy,
    ApproverGroup,
    Ticket,
    TicketVote,
)

MAX_APPROVALS = 10


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

    def tally(self) -> str:
        """ "1 of 2 approvals": where the count stands, without names (the queue's column)."""
        noun = "approval" if self.required == 1 else "approvals"
        return f"{self.count} of {self.required} {noun}"

    def describe(self) -> str:
        text = self.tally()
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


def voter_groups(user, ticket: Ticket, policy: ApprovalPolicy) -> list[str]:
    """What the user's vote on the ticket can count for (counted_groups of the groups the user
    is in now); no query when the policy names no group."""
    named = {r["group"] for r in _rules(policy, ticket)} | set(eligible_groups(ticket, policy))
    if not named:
        return []
    return counted_groups(groups_of(user, ticket.tenant_id), ticket, policy)


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
