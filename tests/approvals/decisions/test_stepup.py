"""Step-up: an approval a policy marks as risky needs a second factor proven in the last N
minutes; a batch and an API token prove none, a rejection needs none."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.decisions import stepup
from approvals.decisions.batch import decide_batch
from approvals.decisions.decide import decide
from approvals.decisions.errors import StepUpRequiredError
from approvals.models import ApprovalPolicy, AuditEvent, Role, Ticket, TicketStatus, TicketVote
from approvals.policies import rules
from approvals.policies.versions import PolicyError, save_policy
from tests.support import TenantFactory, member, paused_call

pytestmark = pytest.mark.django_db

PRODUCTION = {"release": "2026.07.24", "environment": "production"}
STAGING = {"release": "2026.07.24", "environment": "staging"}
ONLY_PRODUCTION = [{"argument": "environment", "op": "eq", "value": "production"}]


@pytest.fixture
def world():
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN, username="ada")
    approver = member(tenant, Role.APPROVER, username="alice")
    return tenant, admin, approver


def ticket_for(tenant, arguments) -> Ticket:
    return Ticket.objects.get(run=paused_call(tenant, arguments))


def step_up_policy(tenant, admin, *, minutes=10, conditions=ONLY_PRODUCTION):
    return save_policy(
        tenant=tenant,
        user=admin,
        tool_name="deploy_release",
        step_up_minutes=minutes,
        step_up_rules=conditions,
    )


def decisions_written(ticket: Ticket) -> list[str]:
    return list(
        AuditEvent.objects.filter(ticket_id=ticket.pk)
        .exclude(action="ticket.created")
        .values_list("action", flat=True)
    )


def test_needs_step_up_only_where_a_condition_matches(world):
    tenant, admin, _ = world
    policy = step_up_policy(tenant, admin)

    assert stepup.needs_step_up(ticket_for(tenant, PRODUCTION), policy) == 10
    assert stepup.needs_step_up(ticket_for(tenant, STAGING), policy) is None


def test_needs_step_up_without_conditions_is_every_approval(world):
    tenant, admin, _ = world
    policy = step_up_policy(tenant, admin, minutes=5, conditions=[])

    assert stepup.needs_step_up(ticket_for(tenant, STAGING), policy) == 5


def test_a_policy_without_step_up_approves_without_a_factor(world):
    tenant, _, approver = world
    ticket = ticket_for(tenant, PRODUCTION)

    decided = decide(ticket, user=approver, approve=True)

    assert decided.status == TicketStatus.APPROVED
    assert "step_up" not in AuditEvent.objects.get(action="ticket.approved").detail


def test_staging_approves_directly_when_the_rule_names_production(world):
    tenant, admin, approver = world
    step_up_policy(tenant, admin)
    ticket = ticket_for(tenant, STAGING)

    assert decide(ticket, user=approver, approve=True).status == TicketStatus.APPROVED


def test_production_without_a_factor_is_refused_writing_nothing(world):
    tenant, admin, approver = world
    step_up_policy(tenant, admin)
    ticket = ticket_for(tenant, PRODUCTION)

    with pytest.raises(StepUpRequiredError) as refused:
        decide(ticket, user=approver, approve=True, message="Ship it.")

    assert refused.value.minutes == 10
    assert refused.value.status == 403
    assert refused.value.sentence() == (
        "This approval needs a second factor confirmed within the last 10 minutes, which a "
        "batch or an API token cannot give: approve it from its ticket page."
    )
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING
    assert TicketVote.objects.filter(ticket=ticket).count() == 0
    assert decisions_written(ticket) == []


def test_a_fresh_factor_approves_and_the_audit_names_it(world):
    tenant, admin, approver = world
    step_up_policy(tenant, admin)
    ticket = ticket_for(tenant, PRODUCTION)
    proven = timezone.now() - timedelta(minutes=9)

    decided = decide(
        ticket,
        user=approver,
        approve=True,
        message="Ship it.",
        factor_at=proven,
        factor_type="totp",
    )

    assert (decided.status, decided.decision_message) == (TicketStatus.APPROVED, "Ship it.")
    approved = AuditEvent.objects.get(action="ticket.approved")
    assert approved.detail["step_up"] == {"type": "totp", "at": proven.isoformat()}
    step = AuditEvent.objects.get(action="auth.step_up")
    assert (step.tenant_id, step.actor_id, step.ticket_id, step.outcome) == (
        tenant.pk,
        approver.pk,
        ticket.pk,
        "confirmed",
    )
    assert step.detail == {"type": "totp", "purpose": f"to approve ticket #{ticket.pk}"}


def test_a_stale_factor_is_refused(world):
    tenant, admin, approver = world
    step_up_policy(tenant, admin)
    ticket = ticket_for(tenant, PRODUCTION)

    with pytest.raises(StepUpRequiredError) as refused:
        decide(
            ticket,
            user=approver,
            approve=True,
            factor_at=timezone.now() - timedelta(minutes=10, seconds=1),
            factor_type="totp",
        )

    assert refused.value.stale
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert decisions_written(ticket) == []


def test_a_rejection_needs_no_factor(world):
    tenant, admin, approver = world
    step_up_policy(tenant, admin)
    ticket = ticket_for(tenant, PRODUCTION)

    decided = decide(ticket, user=approver, approve=False, message="Not today.")

    assert decided.status == TicketStatus.REJECTED
    assert not AuditEvent.objects.filter(action="auth.step_up").exists()


def test_the_policy_read_under_the_lock_decides(world):
    """A ticket read before the policy asked for step-up is still held by it."""
    tenant, admin, approver = world
    ticket = ticket_for(tenant, PRODUCTION)
    step_up_policy(tenant, admin)

    with pytest.raises(StepUpRequiredError):
        decide(ticket, user=approver, approve=True)


def test_a_batch_reports_the_step_up_ticket_and_decides_the_others(world):
    tenant, admin, approver = world
    step_up_policy(tenant, admin)
    production = ticket_for(tenant, PRODUCTION)
    staging = ticket_for(tenant, STAGING)

    outcomes = decide_batch([production.pk, staging.pk], user=approver, approve=True)

    assert [(o.ticket.pk, o.done) for o in outcomes] == [(production.pk, False), (staging.pk, True)]
    assert "approve it from its ticket page" in outcomes[0].result
    assert outcomes[0].result.startswith("This approval needs a second factor")
    assert Ticket.objects.get(pk=production.pk).status == TicketStatus.PENDING
    assert Ticket.objects.get(pk=staging.pk).status == TicketStatus.APPROVED
    assert decisions_written(production) == []


def test_a_batch_may_reject_a_step_up_ticket(world):
    tenant, admin, approver = world
    step_up_policy(tenant, admin)
    production = ticket_for(tenant, PRODUCTION)

    [outcome] = decide_batch([production.pk], user=approver, approve=False)

    assert (outcome.done, outcome.result) == (True, TicketStatus.REJECTED)


def test_a_new_version_keeps_and_compares_the_step_up_fields(world):
    tenant, admin, _ = world
    first = step_up_policy(tenant, admin)
    second = step_up_policy(tenant, admin, minutes=5)

    assert (first.step_up_minutes, second.step_up_minutes) == (10, 5)
    assert second.step_up_rules == ONLY_PRODUCTION
    changed = AuditEvent.objects.filter(action="policy.changed").order_by("seq").last()
    assert changed.detail["changes"] == {"step_up_minutes": [10, 5]}
    with pytest.raises(PolicyError, match="nothing changed"):
        step_up_policy(tenant, admin, minutes=5)


def test_a_step_up_window_out_of_range_is_refused(world):
    tenant, admin, _ = world

    with pytest.raises(PolicyError, match="within 1 to 1440 minutes"):
        step_up_policy(tenant, admin, minutes=0)


def test_describe_says_the_window_and_the_conditions(world):
    tenant, admin, _ = world

    assert stepup.describe(step_up_policy(tenant, admin)) == (
        "An approval needs a second factor confirmed within 10 minutes when "
        "environment == production."
    )


def test_describe_for_a_ticket_says_whether_this_call_needs_it(world):
    tenant, admin, _ = world
    policy = step_up_policy(tenant, admin, minutes=1)

    assert stepup.describe_for(ticket_for(tenant, PRODUCTION), policy) == (
        "This approval needs a second factor confirmed within 1 minute."
    )
    assert stepup.describe_for(ticket_for(tenant, STAGING), policy) == (
        "An approval needs a second factor confirmed within 1 minute when "
        "environment == production: not this call."
    )


def test_each_vote_of_a_quorum_needs_its_own_fresh_factor(world):
    tenant, admin, approver = world
    bob = member(tenant, Role.APPROVER, username="bob")
    save_policy(
        tenant=tenant,
        user=admin,
        tool_name="deploy_release",
        required_approvals=2,
        step_up_minutes=10,
    )
    ticket = ticket_for(tenant, STAGING)
    now = timezone.now()

    first = decide(ticket, user=approver, approve=True, factor_at=now, factor_type="webauthn")
    after_first = first.status
    with pytest.raises(StepUpRequiredError):
        decide(ticket, user=bob, approve=True)
    second = decide(ticket, user=bob, approve=True, factor_at=now, factor_type="totp")

    assert (after_first, second.status) == (TicketStatus.PENDING, TicketStatus.APPROVED)
    vote = AuditEvent.objects.get(action="ticket.vote")
    assert (vote.actor_id, vote.outcome) == (approver.pk, "pending")
    assert set(vote.detail) == {"progress", "policy", "step_up"}
    assert vote.detail["policy"] == ApprovalPolicy.objects.get(tenant=tenant).version
    assert vote.detail["step_up"] == {"type": "webauthn", "at": now.isoformat()}
    approved = AuditEvent.objects.get(action="ticket.approved")
    assert approved.detail["step_up"]["type"] == "totp"
    assert AuditEvent.objects.filter(action="auth.step_up").count() == 2


def test_a_fresh_factor_on_a_call_that_needs_none_records_no_step_up(world):
    tenant, admin, approver = world
    step_up_policy(tenant, admin)
    ticket = ticket_for(tenant, STAGING)

    decide(ticket, user=approver, approve=True, factor_at=timezone.now(), factor_type="totp")

    approved = AuditEvent.objects.get(action="ticket.approved", ticket_id=ticket.pk)
    assert "step_up" not in approved.detail
    assert AuditEvent.objects.filter(action="auth.step_up").count() == 0


def test_a_factor_of_no_named_type_is_recorded_as_a_second_factor(world):
    tenant, admin, approver = world
    step_up_policy(tenant, admin)
    ticket = ticket_for(tenant, PRODUCTION)
    now = timezone.now()

    decide(ticket, user=approver, approve=True, factor_at=now)

    approved = AuditEvent.objects.get(action="ticket.approved", ticket_id=ticket.pk)
    assert approved.detail["step_up"] == {"type": "mfa", "at": now.isoformat()}
    step_up = AuditEvent.objects.get(action="auth.step_up")
    assert (step_up.actor_id, step_up.detail["type"]) == (approver.pk, "mfa")


# --- the sentences the pages show, and the window's edges ---------------------------------


def test_describe_of_a_policy_without_step_up_is_empty():
    off = ApprovalPolicy(step_up_minutes=None)

    assert stepup.describe(off) == ""
    # The ticket is not even read when the policy has no step-up.
    assert stepup.describe_for(None, off) == ""


def test_describe_joins_the_conditions_with_or():
    conditions = [
        {"argument": "environment", "op": "eq", "value": "production"},
        {"argument": "region", "op": "eq", "value": "eu"},
    ]
    policy = ApprovalPolicy(step_up_minutes=1, step_up_rules=conditions)

    first, second = (rules.describe_condition(c) for c in conditions)
    assert stepup.describe(policy) == (
        f"An approval needs a second factor confirmed within 1 minute when {first} or {second}."
    )


def test_is_fresh_holds_at_both_edges_of_the_window_and_not_beyond():
    now = timezone.now()

    assert stepup.is_fresh(now, 10, now=now)
    assert stepup.is_fresh(now - timedelta(minutes=10), 10, now=now)
    assert not stepup.is_fresh(now - timedelta(minutes=10, microseconds=1), 10, now=now)
    assert not stepup.is_fresh(now + timedelta(microseconds=1), 10, now=now)
    assert not stepup.is_fresh(None, 10, now=now)
