"""Step-up: an approval a policy marks as risky needs a second factor proven in the last N
minutes of the approver's own session. A batch and an API token prove none, so they are
refused with the same sentence the ticket page turns into a request for the factor."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from approvals.decisions.errors import StepUpRequiredError
from approvals.models import ApprovalPolicy, Ticket
from approvals.policies import rules


def needs_step_up(ticket: Ticket, policy: ApprovalPolicy) -> int | None:
    """The minutes within which a second factor must have been proven to approve this ticket
    under this policy, or None when it needs none. No rules: every approval needs it; with
    rules, only a call one of them matches."""
    minutes = policy.step_up_minutes
    if not minutes:
        return None
    conditions = policy.step_up_rules or []
    if not conditions:
        return minutes
    try:
        arguments = json.loads(ticket.arguments_json)
    except ValueError:
        # Arguments that cannot be read are no evidence of low risk.
        return minutes
    return minutes if any(rules.rule_matches(c, arguments) for c in conditions) else None


def is_fresh(factor_at: datetime | None, minutes: int, *, now: datetime) -> bool:
    return factor_at is not None and now - timedelta(minutes=minutes) <= factor_at <= now


def require_fresh_factor(
    ticket: Ticket, policy: ApprovalPolicy, *, factor_at: datetime | None, now: datetime
) -> int | None:
    """The step-up minutes the approval needed (None: none). Raises StepUpRequiredError when
    it needs a second factor and factor_at is missing or older than the window."""
    minutes = needs_step_up(ticket, policy)
    if minutes is not None and not is_fresh(factor_at, minutes, now=now):
        raise StepUpRequiredError(minutes, stale=factor_at is not None)
    return minutes


def describe(policy: ApprovalPolicy) -> str:
    """The policy's step-up as one sentence for the pages that summarise it; "" when off."""
    minutes = policy.step_up_minutes
    if not minutes:
        return ""
    unit = "minute" if minutes == 1 else "minutes"
    sentence = f"An approval needs a second factor confirmed within {minutes} {unit}"
    conditions = policy.step_up_rules or []
    if conditions:
        sentence += " when " + " or ".join(rules.describe_condition(c) for c in conditions)
    return sentence + "."


def describe_for(ticket: Ticket, policy: ApprovalPolicy) -> str:
    """What the policy's step-up means for this ticket, for its page; "" when the policy has
    none."""
    if not policy.step_up_minutes:
        return ""
    minutes = needs_step_up(ticket, policy)
    if minutes is None:
        return describe(policy).removesuffix(".") + ": not this call."
    unit = "minute" if minutes == 1 else "minutes"
    return f"This approval needs a second factor confirmed within {minutes} {unit}."
