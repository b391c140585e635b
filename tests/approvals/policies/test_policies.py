"""Approval policies: quorum, group rules, self-approval, policy versions, expiry actions and
automatic decisions, through the services."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.decisions.decide import decide, progress_of, vote
from approvals.decisions.edit import edit_and_approve
from approvals.decisions.errors import (
    AlreadyDecidedError,
    AlreadyVotedError,
    InvalidDecisionError,
    NotAllowedError,
    SelfApprovalError,
)
from approvals.live.hints import hint_for
from approvals.models import (
    ApprovalPolicy,
    ApproverGroup,
    AuditEvent,
    Role,
    Run,
    RunStatus,
    Ticket,
    TicketStatus,
    TicketVote,
)
from approvals.policies import quorum, rules, scopes
from approvals.policies.groups import delete_group
from approvals.policies.versions import PolicyError, remove_policy, save_policy
from approvals.runs.pause import pause_run
from approvals.runs.reaper import reap
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

TASK_PATH = "approvals.execution.queue.resume_run_task"


def resume_tasks(run: Run) -> int:
    tasks = DBTaskResult.objects.filter(task_path=TASK_PATH)
    return sum(1 for task in tasks if task.args_kwargs["args"] == [run.pk])


def actions(ticket: Ticket) -> list[str]:
    return list(
        AuditEvent.objects.filter(ticket_id=ticket.pk)
        .order_by("seq")
        .values_list("action", flat=True)
    )


@pytest.fixture
def world():
    tenant = TenantFactory(slug="acme")
    people = {
        "admin": member(tenant, Role.ADMIN, username="boss"),
        "requester": member(tenant, Role.VIEWER, username="req"),
        "alice": member(tenant, Role.APPROVER, username="alice"),
        "bob": member(tenant, Role.APPROVER, username="bob"),
        "carol": member(tenant, Role.APPROVER, username="carol"),
    }
    return tenant, people


def group(tenant, name, *users) -> ApproverGroup:
    found, _ = ApproverGroup.objects.get_or_create(tenant=tenant, name=name)
    found.members.add(*users)
    return found


def set_policy(tenant, admin, tool_name="deploy_release", agent_key="", **values):
    return save_policy(
        tenant=tenant, user=admin, agent_key=agent_key, tool_name=tool_name, **values
    )


def new_ticket(tenant, requester, prompt="Deploy release 2026.07.24 to production") -> Ticket:
    return Ticket.objects.get(run=paused_run(tenant, requested_by=requester, prompt=prompt))


# --- resolution -----------------------------------------------------------------------------


def test_policy_resolution_prefers_the_most_specific_current_version(world):
    tenant, p = world
    assert scopes.resolve(tenant.pk, "release", "deploy_release").is_builtin
    default = set_policy(tenant, p["admin"], tool_name="", required_approvals=3)
    assert scopes.resolve(tenant.pk, "release", "deploy_release") == default
    set_policy(tenant, p["admin"], required_approvals=2)
    latest = set_policy(tenant, p["admin"], required_approvals=4)

    assert scopes.resolve(tenant.pk, "release", "deploy_release") == latest
    assert latest.version == 2
    assert scopes.resolve(tenant.pk, "invoice", "publish_invoice") == default
    assert ApprovalPolicy.objects.filter(tenant=tenant, tool_name="deploy_release").count() == 2


def test_the_policies_of_several_tools_are_resolved_in_one_query(world, django_assert_num_queries):
    tenant, p = world
    default = set_policy(tenant, p["admin"], tool_name="", required_approvals=3)
    deploy = set_policy(tenant, p["admin"], required_approvals=2)
    rollback = set_policy(tenant, p["admin"], tool_name="rollback", agent_key="release")
    # Removed scopes are passed over: the release agent's own default is gone.
    set_policy(tenant, p["admin"], tool_name="", agent_key="release", required_approvals=4)
    ApprovalPolicy.objects.filter(tenant=tenant, agent_key="release", tool_name="").update(
        retired=True
    )

    with django_assert_num_queries(1):
        found = scopes.resolve_many(
            tenant.pk, "release", ["deploy_release", "rollback", "notify", "deploy_release"]
        )

    assert found == {"deploy_release": deploy, "rollback": rollback, "notify": default}
    assert found == {name: scopes.resolve(tenant.pk, "release", name) for name in found}


def test_ticket_records_its_policy_and_its_expiry_comes_from_it(world):
    tenant, p = world
    policy = set_policy(tenant, p["admin"], expiry_seconds=600)

    ticket = new_ticket(tenant, p["requester"])

    assert ticket.policy == policy
    assert ticket.expires_at - ticket.created_at == timedelta(seconds=600)


def test_policy_change_is_audited_with_a_diff(world):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=2)

    event = AuditEvent.objects.get(action="policy.changed")

    assert event.actor_name == "boss"
    assert event.detail["version"] == 1
    assert event.detail["changes"] == {"required_approvals": [1, 2]}


def test_policy_change_by_a_non_admin_is_refused(world):
    tenant, p = world
    with pytest.raises(PolicyError):
        set_policy(tenant, p["alice"], required_approvals=2)
    with pytest.raises(PolicyError):
        set_policy(tenant, p["admin"], required_approvals=2, allowed_groups=["nobody"])
    assert ApprovalPolicy.objects.count() == 0


# --- quorum ---------------------------------------------------------------------------------


def test_quorum_of_two_one_approver_twice_stays_pending_then_second_approves(world):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=2)
    ticket = new_ticket(tenant, p["requester"])

    decide(ticket, user=p["alice"], approve=True)
    with pytest.raises(AlreadyVotedError) as refused:
        decide(ticket, user=p["alice"], approve=True)
    voted = TicketVote.objects.get(ticket=ticket).created_at
    assert str(refused.value) == (
        f"you already approved this ticket at {voted:%Y-%m-%d %H:%M:%S} UTC; "
        "it needs another person (1 of 2 approvals: alice)"
    )

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING
    assert TicketVote.objects.filter(ticket=ticket).count() == 1
    assert ticket.run.status == RunStatus.PAUSED
    assert resume_tasks(ticket.run) == 0
    assert actions(ticket) == ["ticket.created", "ticket.vote"]

    decide(ticket, user=p["bob"], approve=True)

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.APPROVED
    assert ticket.decided_by == p["bob"]
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.QUEUED
    assert resume_tasks(ticket.run) == 1
    approved = AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.approved")
    assert approved.detail["voters"] == ["alice", "bob"]


def test_quorum_vote_and_approval_record_the_channel_policy_and_voters_and_hint_the_ticket(
    world, live_sender, django_capture_on_commit_callbacks
):
    tenant, p = world
    policy = set_policy(tenant, p["admin"], required_approvals=2)
    ticket = new_ticket(tenant, p["requester"])
    via = {"via": "api", "prefix": "ak_1234"}
    hint = {"type": "console.event", "tenant": tenant.pk, "ticket": ticket.pk, "run": ticket.run_id}

    with django_capture_on_commit_callbacks(execute=True):
        decide(ticket, user=p["alice"], approve=True, via=via)
    vote = AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.vote")
    assert (vote.actor_id, vote.outcome) == (p["alice"].pk, "pending")
    assert vote.detail == {
        "progress": "1 of 2 approvals: alice",
        "policy": policy.version,
        "via": "api",
        "prefix": "ak_1234",
    }
    assert live_sender.sent == [
        (f"tenant.{tenant.pk}", {**hint, "kind": "ticket.changed"}),
    ]

    decide(ticket, user=p["bob"], approve=True, message="both of us")

    approved = AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.approved")
    assert approved.detail == {
        "always": False,
        "message": "both of us",
        "voters": ["alice", "bob"],
        "policy": policy.version,
    }


def test_progress_of_reads_the_votes_with_their_voters_in_one_query(
    world, django_assert_num_queries
):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=3)
    ticket = new_ticket(tenant, p["requester"])
    for person in ("alice", "bob"):
        decide(ticket, user=p[person], approve=True)
    ticket = Ticket.objects.select_related("policy").get(pk=ticket.pk)

    with django_assert_num_queries(1):
        shown = progress_of(ticket).describe()

    assert shown == "2 of 3 approvals: alice, bob"


def test_a_vote_reads_the_earlier_votes_with_their_voters_and_is_dated_as_the_decision(
    world, django_assert_num_queries
):
    tenant, p = world
    policy = set_policy(tenant, p["admin"], required_approvals=2)
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)
    now = timezone.now()

    # The earlier votes and their voters in one query, then the vote's own insert.
    with django_assert_num_queries(2):
        progress = vote(ticket, policy, user=p["bob"], now=now)

    assert (progress.met, progress.voters) == (True, ["alice", "bob"])
    assert TicketVote.objects.get(ticket=ticket, user=p["bob"]).created_at == now


def test_decide_returns_the_ticket_with_the_policy_it_was_decided_under(
    world, django_assert_num_queries
):
    tenant, p = world
    policy = set_policy(tenant, p["admin"], required_approvals=1)
    ticket = new_ticket(tenant, p["requester"])

    decided = decide(ticket, user=p["alice"], approve=True)

    with django_assert_num_queries(0):
        assert (decided.policy_id, decided.policy) == (policy.pk, policy)


def test_decide_reads_the_tickets_policy_and_decider_with_the_ticket(world):
    """A saved policy costs the decision no query of its own, nor does naming who won."""
    tenant, p = world

    def queries_to_approve(ticket: Ticket) -> int:
        with CaptureQueriesContext(connection) as queries:
            decide(ticket, user=p["alice"], approve=True)
        return len(queries)

    builtin = new_ticket(tenant, p["requester"])
    under_builtin = queries_to_approve(builtin)
    # Saving a policy moves the pending tickets to it, so the built-in one is decided first.
    set_policy(tenant, p["admin"], required_approvals=1)
    saved = new_ticket(tenant, p["requester"])
    assert (builtin.policy_id, saved.policy_id is not None) == (None, True)
    under_saved = queries_to_approve(saved)

    # The memberships, the run's lock and the ticket with its policy and decider, in and out
    # of the savepoint: the refusal names alice without reading her again.
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(AlreadyDecidedError) as refused:
            decide(saved, user=p["bob"], approve=False)
        said = str(refused.value)

    assert under_saved == under_builtin
    assert len(queries) == 6
    assert said.startswith("Already approved by alice at ")


def test_quorum_of_one_behaves_as_before(world):
    tenant, p = world
    ticket = new_ticket(tenant, p["requester"])

    decide(ticket, user=p["alice"], approve=True)

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.APPROVED
    assert actions(ticket) == ["ticket.created", "ticket.approved"]
    assert resume_tasks(ticket.run) == 1


def test_rejection_by_one_eligible_person_rejects_at_once_under_a_quorum(world):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=2)
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)

    decide(ticket, user=p["bob"], approve=False, message="not today")

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.REJECTED
    assert resume_tasks(ticket.run) == 1


def test_group_rules_need_one_from_each_group(world):
    tenant, p = world
    group(tenant, "release managers", p["alice"], p["bob"])
    group(tenant, "security reviewers", p["carol"])
    set_policy(
        tenant,
        p["admin"],
        required_approvals=2,
        group_rules=[
            {"group": "release managers", "count": 1},
            {"group": "security reviewers", "count": 1},
        ],
    )
    ticket = new_ticket(tenant, p["requester"])

    decide(ticket, user=p["alice"], approve=True)
    decide(ticket, user=p["bob"], approve=True)

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING
    progress = quorum.progress(ticket, ticket.policy, list(ticket.votes.all()))
    assert progress.describe() == "2 of 2 approvals: alice, bob; needs 1 from security reviewers"

    decide(ticket, user=p["carol"], approve=True)

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.APPROVED
    assert ticket.decided_by == p["carol"]


def test_only_allowed_groups_may_decide_and_the_refusal_names_them(world):
    tenant, p = world
    group(tenant, "release managers", p["alice"])
    set_policy(tenant, p["admin"], allowed_groups=["release managers"])
    ticket = new_ticket(tenant, p["requester"])

    with pytest.raises(NotAllowedError, match="only members of release managers"):
        decide(ticket, user=p["bob"], approve=True)
    with pytest.raises(NotAllowedError):
        decide(ticket, user=p["bob"], approve=False)
    assert TicketVote.objects.count() == 0

    decide(ticket, user=p["alice"], approve=True)
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"required_approvals": 2},
        {"group_rules": [{"group": "release managers", "count": 1}]},
    ],
    ids=["quorum-1", "quorum-2", "group-rule"],
)
def test_self_approval_is_refused_under_every_policy(world, values):
    tenant, p = world
    group(tenant, "release managers", p["alice"], p["bob"])
    set_policy(tenant, p["admin"], **values)
    ticket = new_ticket(tenant, p["alice"])

    with pytest.raises(SelfApprovalError):
        decide(ticket, user=p["alice"], approve=True)

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING
    assert TicketVote.objects.count() == 0


# --- policy changes -------------------------------------------------------------------------


def test_policy_change_invalidates_pending_votes_then_approving_again_works(world):
    tenant, p = world
    v1 = set_policy(tenant, p["admin"], required_approvals=2)
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)

    v2 = set_policy(tenant, p["admin"], required_approvals=2, expiry_seconds=7200)

    ticket.refresh_from_db()
    assert ticket.policy == v2
    vote = TicketVote.objects.get(ticket=ticket)
    assert vote.policy == v1
    assert not vote.is_valid
    event = AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.votes_invalidated")
    assert event.detail["voters"] == ["alice"]
    assert event.detail["reason"].startswith(
        "1 approval given under policy v1 were invalidated when boss changed the policy to v2"
    )

    decide(ticket, user=p["bob"], approve=True)
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    decide(ticket, user=p["alice"], approve=True)
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.APPROVED
    assert TicketVote.objects.filter(ticket=ticket).count() == 3


def test_a_new_specific_policy_takes_over_tickets_on_the_default(world):
    tenant, p = world
    ticket = new_ticket(tenant, p["requester"])
    assert ticket.policy is None

    policy = set_policy(tenant, p["admin"], required_approvals=2)

    ticket.refresh_from_db()
    assert ticket.policy == policy
    decide(ticket, user=p["alice"], approve=True)
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


# --- expiry ---------------------------------------------------------------------------------


def lapse(ticket: Ticket) -> None:
    Ticket.objects.filter(pk=ticket.pk).update(expires_at=timezone.now() - timedelta(seconds=1))


@pytest.mark.django_db(transaction=True)
def test_expiry_reject_rejects_with_a_message_and_the_run_resumes(world):
    tenant, p = world
    set_policy(tenant, p["admin"], on_expiry="reject")
    ticket = new_ticket(tenant, p["requester"])
    lapse(ticket)

    report = reap()

    ticket.refresh_from_db()
    assert report.rejected == [ticket.pk]
    assert ticket.status == TicketStatus.REJECTED
    assert ticket.decision_source == "expiry"
    assert "was rejected and did not run" in ticket.decision_message
    event = AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.rejected")
    assert event.detail["by"] == "expiry"
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.QUEUED
    assert resume_tasks(ticket.run) == 1

    outcome = resume(run_id=ticket.run_id)

    assert outcome.status == RunStatus.COMPLETED
    assert demo.read_effects() == []


def test_expiry_escalate_moves_to_the_group_then_rejects_on_a_second_lapse(world):
    tenant, p = world
    group(tenant, "on-call leads", p["carol"])
    set_policy(
        tenant,
        p["admin"],
        on_expiry="escalate",
        escalation_group="on-call leads",
        escalation_seconds=900,
    )
    ticket = new_ticket(tenant, p["requester"])
    lapse(ticket)

    report = reap()

    ticket.refresh_from_db()
    assert report.escalated == [ticket.pk]
    assert ticket.status == TicketStatus.PENDING
    assert ticket.escalated_at is not None
    assert timedelta(seconds=890) < ticket.expires_at - timezone.now() <= timedelta(seconds=900)
    assert actions(ticket)[-1] == "ticket.escalated"
    with pytest.raises(NotAllowedError, match="escalated"):
        decide(ticket, user=p["alice"], approve=True)

    lapse(ticket)
    report = reap()

    ticket.refresh_from_db()
    assert report.rejected == [ticket.pk]
    assert ticket.status == TicketStatus.REJECTED
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.QUEUED


@pytest.mark.django_db(transaction=True)
def test_escalated_ticket_can_be_approved_by_the_escalation_group(world):
    tenant, p = world
    group(tenant, "on-call leads", p["carol"])
    set_policy(tenant, p["admin"], on_expiry="escalate", escalation_group="on-call leads")
    ticket = new_ticket(tenant, p["requester"])
    lapse(ticket)
    reap()

    decide(Ticket.objects.get(pk=ticket.pk), user=p["carol"], approve=True)

    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED
    assert resume(run_id=ticket.run_id).status == RunStatus.COMPLETED
    assert len(demo.read_effects()) == 1


def test_expiry_expire_keeps_todays_behaviour(world):
    tenant, p = world
    ticket = new_ticket(tenant, p["requester"])
    lapse(ticket)

    report = reap()

    assert report.expired_runs == [ticket.run_id]
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.EXPIRED


# --- automatic decisions --------------------------------------------------------------------

STAGING_RULE = {
    "argument": "environment",
    "op": "ne",
    "value": "production",
    "decision": "approve",
    "reason": "staging deployments are low risk",
}


@pytest.mark.django_db(transaction=True)
def test_automatic_approval_by_rule_queues_the_run(world):
    tenant, p = world
    set_policy(tenant, p["admin"], auto_rules=[STAGING_RULE])

    ticket = new_ticket(tenant, p["requester"], prompt="Deploy release 2026.07.25 to staging")

    assert ticket.status == TicketStatus.APPROVED
    assert ticket.decision_source == "rule"
    assert ticket.decision_reason == (
        "approve if environment != production: staging deployments are low risk"
    )
    event = AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.auto_approved")
    assert event.detail["reason"] == "staging deployments are low risk"
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.QUEUED
    assert resume_tasks(ticket.run) == 1
    assert resume(run_id=ticket.run_id).status == RunStatus.COMPLETED
    assert [e["environment"] for e in demo.read_effects()] == ["staging"]


def test_a_call_the_rule_does_not_match_becomes_a_normal_ticket(world):
    tenant, p = world
    set_policy(tenant, p["admin"], auto_rules=[STAGING_RULE])

    ticket = new_ticket(tenant, p["requester"])

    assert ticket.status == TicketStatus.PENDING
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.PAUSED
    assert "ticket.auto_approved" not in actions(ticket)


@pytest.mark.django_db(transaction=True)
def test_automatic_rejection_by_rule_gives_the_reason_to_the_model(world):
    tenant, p = world
    rule = {
        "argument": "release",
        "op": "matches",
        "value": r"2026\.07\..*",
        "decision": "reject",
        "reason": "July releases are frozen",
    }
    set_policy(tenant, p["admin"], auto_rules=[rule])

    ticket = new_ticket(tenant, p["requester"])

    assert ticket.status == TicketStatus.REJECTED
    assert ticket.decision_message == "July releases are frozen"
    assert actions(ticket)[-1] == "ticket.auto_rejected"
    assert resume(run_id=ticket.run_id).status == RunStatus.COMPLETED
    assert demo.read_effects() == []


@pytest.mark.parametrize(
    ("op", "value", "matches"),
    [
        ("eq", "staging", True),
        ("ne", "staging", False),
        ("in", "staging, qa", True),
        ("not_in", "staging, qa", False),
        ("matches", "stag.*", True),
        ("matches", "prod.*", False),
    ],
)
def test_rule_operators(op, value, matches):
    rule = {"argument": "environment", "op": op, "value": value}
    assert rules.rule_matches(rule, {"environment": "staging"}) is matches
    assert rules.rule_matches(rule, {"other": "staging"}) is False


def test_rule_text_round_trips_and_bad_regex_is_refused():
    text = "approve if environment != production because staging is low risk"
    assert rules.format_auto_rules(rules.parse_auto_rules(text)) == text
    with pytest.raises(rules.RuleSyntaxError, match="regular expression"):
        rules.parse_auto_rules("reject if release matches ([ because broken")
    with pytest.raises(rules.RuleSyntaxError, match="line 1"):
        rules.parse_auto_rules("approve when it feels right")


def test_policy_audit_events_become_live_hints_of_the_right_kind():
    kinds = {
        action: hint_for(AuditEvent(action=action, run_id=1, ticket_id=2, outcome="pending"))[
            "kind"
        ]
        for action in ("ticket.vote", "ticket.escalated", "ticket.auto_approved")
    }

    assert kinds == {
        "ticket.vote": "ticket.changed",
        "ticket.escalated": "ticket.changed",
        "ticket.auto_approved": "ticket.decided",
    }


def test_decide_command_reports_a_vote_towards_the_quorum(world):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=2)
    ticket = new_ticket(tenant, p["requester"])
    out = StringIO()

    call_command("decide", str(ticket.pk), "--approve", "--user", "alice", stdout=out)

    assert out.getvalue().strip() == (
        f"ticket {ticket.pk} approval by alice recorded (1 of 2 approvals: alice); "
        f"run {ticket.run_id} is paused"
    )


# --- where policies meet the rest -------------------------------------------------------------


# The approved tools run in the SDK's thread, which needs committed rows.
@pytest.mark.django_db(transaction=True)
def test_an_approval_given_in_time_survives_a_sibling_tickets_escalation(world):
    from tests.support import run_agent, two_call_agent

    tenant, p = world
    result = run_agent("release", "Deploy 2026.07.24", agent=two_call_agent())
    run = pause_run(
        result, tenant=tenant, agent_key="release", agent_version="1", requested_by=p["requester"]
    )
    staging, production = Ticket.objects.filter(run=run).order_by("pk")
    decide(staging, user=p["alice"], approve=True)
    # Staging was approved in time long ago; production lapsed and was escalated, and is
    # decided now, well after staging's own expiry (and the resume grace) has passed.
    long_ago = timezone.now() - timedelta(hours=3)
    Ticket.objects.filter(pk=staging.pk).update(
        decided_at=long_ago, expires_at=long_ago + timedelta(minutes=10)
    )
    Ticket.objects.filter(pk=production.pk).update(
        escalated_at=timezone.now(), expires_at=timezone.now() + timedelta(hours=1)
    )
    decide(production, user=p["bob"], approve=True)

    outcome = resume(run_id=run.pk)

    assert outcome.status == RunStatus.COMPLETED, outcome.reason
    assert sorted(e["environment"] for e in demo.read_effects("deploy_release")) == [
        "production",
        "staging",
    ]


def test_an_approval_past_the_whole_generations_expiry_is_still_refused(world):
    tenant, p = world
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)
    long_ago = timezone.now() - timedelta(hours=3)
    Ticket.objects.filter(pk=ticket.pk).update(
        decided_at=long_ago, expires_at=long_ago + timedelta(minutes=10)
    )

    outcome = resume(run_id=ticket.run_id)

    assert outcome.status == RunStatus.EXPIRED
    assert demo.read_effects() == []


def test_a_quorum_that_lost_a_voter_is_refused_at_resume(world):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=2)
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)
    decide(ticket, user=p["bob"], approve=True)
    # Alice's account is deleted after the quorum was met: her vote goes with it.
    p["alice"].delete()

    outcome = resume(run_id=ticket.run_id)

    assert outcome.status == RunStatus.NEEDS_ATTENTION
    assert "no longer has the approvals its policy needs" in outcome.reason
    assert demo.read_effects() == []


def test_a_voter_taken_out_of_the_rules_group_no_longer_counts_at_resume(world):
    tenant, p = world
    managers = group(tenant, "release managers", p["alice"])
    set_policy(
        tenant,
        p["admin"],
        required_approvals=2,
        group_rules=[{"group": "release managers", "count": 1}],
    )
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)
    decide(ticket, user=p["bob"], approve=True)
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED
    # Alice leaves the release managers before the worker resumes: nobody speaks for them.
    managers.members.remove(p["alice"])

    outcome = resume(run_id=ticket.run_id)

    assert outcome.status == RunStatus.NEEDS_ATTENTION
    assert "needs 1 from release managers" in outcome.reason
    assert demo.read_effects() == []


def test_a_voter_taken_out_of_the_deciding_groups_is_refused_at_resume(world):
    tenant, p = world
    managers = group(tenant, "release managers", p["alice"])
    set_policy(tenant, p["admin"], allowed_groups=["release managers"])
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)
    managers.members.remove(p["alice"])

    outcome = resume(run_id=ticket.run_id)

    assert outcome.status == RunStatus.NEEDS_ATTENTION
    assert "alice, whose approval counted for ticket" in outcome.reason
    assert "only members of release managers may decide this ticket" in outcome.reason
    assert demo.read_effects() == []


@pytest.mark.django_db(transaction=True)
def test_voters_still_in_their_groups_resume_and_run_once(world):
    tenant, p = world
    group(tenant, "release managers", p["alice"])
    set_policy(
        tenant,
        p["admin"],
        required_approvals=2,
        group_rules=[{"group": "release managers", "count": 1}],
        allowed_groups=[],
    )
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)
    decide(ticket, user=p["bob"], approve=True)

    outcome = resume(run_id=ticket.run_id)

    assert outcome.status == RunStatus.COMPLETED
    assert len(demo.read_effects()) == 1


@pytest.mark.parametrize(
    "values",
    [
        {"required_approvals": 2},
        {
            "required_approvals": 1,
            "auto_rules": [
                {
                    "argument": "environment",
                    "op": "eq",
                    "value": "moon",
                    "decision": "reject",
                    "reason": "no such environment",
                }
            ],
        },
    ],
    ids=["quorum", "reject-rule"],
)
def test_always_is_refused_where_it_would_waive_the_policy(world, values):
    tenant, p = world
    set_policy(tenant, p["admin"], **values)
    ticket = new_ticket(tenant, p["requester"])

    with pytest.raises(InvalidDecisionError) as refused:
        decide(ticket, user=p["alice"], approve=True, always=True)

    assert str(refused.value) == (
        "'always' is not offered under this ticket's policy: it asks for more than one person "
        "or rejects some arguments, so each later call needs its own approval"
    )

    assert not TicketVote.objects.exists()
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


def test_always_is_offered_under_a_single_approval_policy(world):
    tenant, p = world
    ticket = new_ticket(tenant, p["requester"])

    decide(ticket, user=p["alice"], approve=True, always=True)

    assert Ticket.objects.get(pk=ticket.pk).always is True


def test_a_rule_that_rejects_beats_a_pre_authorisation(world):
    tenant, p = world
    set_policy(
        tenant,
        p["admin"],
        auto_rules=[
            {
                "argument": "release",
                "op": "eq",
                "value": "2026.07.25",
                "decision": "reject",
                "reason": "2026.07.25 is withdrawn",
            }
        ],
    )
    ticket = new_ticket(tenant, p["requester"])
    edit_and_approve(
        ticket, user=p["alice"], arguments={"environment": "production", "release": "2026.07.25"}
    )

    resume(run_id=ticket.run_id)

    again = Ticket.objects.get(run_id=ticket.run_id, generation=2)
    assert (again.status, again.decision_source) == (TicketStatus.REJECTED, "rule")
    assert again.decision_message == "2026.07.25 is withdrawn"
    assert actions(again)[-1] == "ticket.auto_rejected"
    from approvals.models import PreAuthorization

    assert PreAuthorization.objects.get(original_ticket=ticket).used_by is None


# --- removing a scope's policy ----------------------------------------------------------------


def test_removing_a_tools_policy_moves_its_tickets_to_the_tenant_default(world):
    tenant, p = world
    default = set_policy(tenant, p["admin"], tool_name="", required_approvals=1)
    strict = set_policy(tenant, p["admin"], required_approvals=2)
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)  # 1 of 2
    assert Ticket.objects.get(pk=ticket.pk).policy_id == strict.pk

    removed = remove_policy(tenant=tenant, user=p["admin"], tool_name="deploy_release")

    ticket.refresh_from_db()
    assert (removed.version, removed.retired, removed.required_approvals) == (2, True, 2)
    assert ticket.policy_id == default.pk and ticket.status == TicketStatus.PENDING
    assert scopes.resolve(tenant.pk, "release", "deploy_release") == default
    assert scopes.current_for_scope(tenant.pk, "", "deploy_release") is None
    assert [pol.pk for pol in scopes.current_policies(tenant.pk)] == [default.pk]
    vote = TicketVote.objects.get(ticket=ticket)
    assert "removed the policy for any agent / deploy_release" in vote.invalidated_reason
    event = AuditEvent.objects.get(action="policy.removed")
    assert (event.detail["removed"], event.detail["version"], event.detail["tickets_moved"]) == (
        1,
        2,
        1,
    )
    # Under the default one approval is enough: alice approves again and it is decided.
    decide(ticket, user=p["alice"], approve=True)
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


def test_removing_the_only_policy_falls_back_to_the_builtin_default(world):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=3)
    ticket = new_ticket(tenant, p["requester"])

    remove_policy(tenant=tenant, user=p["admin"], tool_name="deploy_release")

    ticket.refresh_from_db()
    assert ticket.policy_id is None
    assert scopes.policy_of(ticket).is_builtin


def test_removing_a_tools_policy_leaves_tickets_of_a_more_specific_scope(world):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=2)
    specific = set_policy(tenant, p["admin"], agent_key="release", required_approvals=3)
    ticket = new_ticket(tenant, p["requester"])
    assert ticket.policy_id == specific.pk

    remove_policy(tenant=tenant, user=p["admin"], tool_name="deploy_release")

    assert Ticket.objects.get(pk=ticket.pk).policy_id == specific.pk
    assert AuditEvent.objects.get(action="policy.removed").detail["tickets_moved"] == 0


def test_a_removed_scope_comes_back_with_the_next_save(world):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=2)
    remove_policy(tenant=tenant, user=p["admin"], tool_name="deploy_release")
    ticket = new_ticket(tenant, p["requester"])
    assert ticket.policy_id is None

    back = set_policy(tenant, p["admin"], required_approvals=2)

    assert (back.version, back.retired) == (3, False)
    assert Ticket.objects.get(pk=ticket.pk).policy_id == back.pk
    assert scopes.current_for_scope(tenant.pk, "", "deploy_release") == back


def test_removing_a_scope_without_a_policy_is_refused_and_writes_nothing(world):
    tenant, p = world
    set_policy(tenant, p["admin"], required_approvals=2)
    remove_policy(tenant=tenant, user=p["admin"], tool_name="deploy_release")

    for _ in range(2):  # never saved; already removed
        with pytest.raises(PolicyError, match="has no policy of its own"):
            remove_policy(tenant=tenant, user=p["admin"], tool_name="publish_invoice")
    with pytest.raises(PolicyError, match="has no policy of its own"):
        remove_policy(tenant=tenant, user=p["admin"], tool_name="deploy_release")
    with pytest.raises(PolicyError):
        remove_policy(tenant=tenant, user=p["alice"], tool_name="deploy_release")

    assert ApprovalPolicy.objects.count() == 2
    assert AuditEvent.objects.filter(action="policy.removed").count() == 1


@pytest.mark.parametrize(
    "allowed", [[], ["release managers"]], ids=["any-decider", "allowed-groups"]
)
def test_a_voter_taken_out_of_the_escalation_group_is_refused_at_resume(world, allowed):
    tenant, p = world
    leads = group(tenant, "on-call leads", p["carol"])
    group(tenant, "release managers", p["alice"])
    set_policy(
        tenant,
        p["admin"],
        on_expiry="escalate",
        escalation_group="on-call leads",
        allowed_groups=allowed,
    )
    ticket = new_ticket(tenant, p["requester"])
    lapse(ticket)
    reap()
    decide(Ticket.objects.get(pk=ticket.pk), user=p["carol"], approve=True)
    leads.members.remove(p["carol"])

    outcome = resume(run_id=ticket.run_id)

    assert outcome.status == RunStatus.NEEDS_ATTENTION
    assert "carol, whose approval counted for ticket" in outcome.reason
    assert "only members of on-call leads may decide this ticket" in outcome.reason
    assert demo.read_effects() == []


def test_a_group_an_approved_ticket_still_counts_on_cannot_be_deleted(world):
    tenant, p = world
    group(tenant, "release managers", p["alice"])
    set_policy(tenant, p["admin"], allowed_groups=["release managers"])
    ticket = new_ticket(tenant, p["requester"])
    decide(ticket, user=p["alice"], approve=True)  # approved; the run not resumed yet
    set_policy(tenant, p["admin"], allowed_groups=[])  # the current version names no group

    with pytest.raises(PolicyError, match=rf"still counts for ticket #{ticket.pk},"):
        delete_group(tenant=tenant, user=p["admin"], name="release managers")
    assert ApproverGroup.objects.filter(name="release managers").exists()

    # Once the run has resumed (here: completed), the group can go.
    Run.objects.filter(pk=ticket.run_id).update(status=RunStatus.COMPLETED)
    delete_group(tenant=tenant, user=p["admin"], name="release managers")
    assert not ApproverGroup.objects.exists()


def test_deleting_a_group_by_a_malformed_name_is_refused(world):
    tenant, p = world

    for name in ("", "   ", "a\x00b", "x" * 101):
        with pytest.raises(PolicyError, match="name the group to delete"):
            delete_group(tenant=tenant, user=p["admin"], name=name)
