"""The quorum's rules word for word: who fills which group slot, what is still missing, and why a
vote or a member is refused. Known answers on unsaved rows, so each rule is checked by itself;
the paths through deciding and resuming are in test_policies.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from approvals.models import ApprovalPolicy, ApproverGroup, Ticket, TicketVote
from approvals.policies import quorum
from tests.support import TenantFactory, member

User = get_user_model()
NOW = timezone.now()


def policy(**values) -> ApprovalPolicy:
    return ApprovalPolicy(**{"required_approvals": 1, **values})


def ticket(escalated_at=None) -> Ticket:
    return Ticket(tenant_id=1, escalated_at=escalated_at)


def votes(*groups_of_voters: list[str], at=NOW) -> list[TicketVote]:
    return [
        TicketVote(user=User(username=f"voter{n}"), groups=list(groups), created_at=at)
        for n, groups in enumerate(groups_of_voters, start=1)
    ]


# --- who fills which group slot ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "voters", "filled"),
    [
        (["ops"], [{"ops"}], 1),
        (["ops"], [{"dev"}], 0),
        (["ops"], [set()], 0),
        (["ops", "dev"], [{"ops", "dev"}], 1),
        (["ops", "ops"], [{"ops"}, {"ops"}], 2),
        # The first voter takes "ops"; the second can fill only "ops": the first moves to "dev".
        (["ops", "dev"], [{"ops", "dev"}, {"ops"}], 2),
        (["ops", "dev"], [{"ops"}, {"ops"}], 1),
    ],
)
def test_matched_slots_counts_each_voter_in_at_most_one_slot_of_a_group_they_are_in(
    slots, voters, filled
):
    assert quorum._matched_slots(slots, voters) == filled


# --- what is still missing --------------------------------------------------------------------


def test_progress_counts_what_each_group_rule_still_misses():
    rules = [{"group": "ops", "count": 3}, {"group": "dev", "count": 1}]

    progress = quorum.progress(ticket(), policy(group_rules=rules), votes(["ops"]))

    assert progress.missing_groups == [(2, "ops"), (1, "dev")]
    assert not progress.met
    assert progress.describe() == "1 of 1 approval: voter1; needs 2 from ops and 1 from dev"


def test_progress_one_person_in_two_groups_cannot_meet_both_rules():
    rules = [{"group": "ops", "count": 1}, {"group": "dev", "count": 1}]

    progress = quorum.progress(
        ticket(), policy(required_approvals=1, group_rules=rules), votes(["ops", "dev"])
    )

    assert progress.missing_groups == [(1, "ops or dev")]
    assert not progress.met
    assert progress.describe() == "1 of 1 approval: voter1; needs 1 from ops or dev"


def test_progress_two_people_one_in_each_group_meet_both_rules():
    rules = [{"group": "ops", "count": 1}, {"group": "dev", "count": 1}]

    progress = quorum.progress(
        ticket(), policy(required_approvals=2, group_rules=rules), votes(["ops", "dev"], ["ops"])
    )

    assert progress.missing_groups == []
    assert progress.met


def test_group_rules_hold_until_the_ticket_is_escalated_not_merely_because_a_policy_can_escalate():
    rules = [{"group": "ops", "count": 1}]
    can_escalate = policy(group_rules=rules, escalation_group="on-call")

    before = quorum.progress(ticket(), can_escalate, votes(["dev"]))
    after = quorum.progress(ticket(escalated_at=NOW), can_escalate, votes(["on-call"]))

    assert before.missing_groups == [(1, "ops")]
    assert after.missing_groups == []
    assert quorum.counted_groups({"ops"}, ticket(), can_escalate) == ["ops"]


@pytest.mark.parametrize("rule", [{"group": "ops"}, {"group": "ops", "count": 0}])
def test_a_group_rule_without_a_count_asks_nothing_and_names_no_group(rule):
    rules_policy = policy(group_rules=[rule])

    progress = quorum.progress(ticket(), rules_policy, votes(["dev"]))

    assert progress.missing_groups == []
    assert progress.met
    assert quorum.counted_groups({"ops"}, ticket(), rules_policy) == []


# --- why a vote no longer holds ---------------------------------------------------------------


def test_vote_refusal_names_every_deciding_group():
    deciding = policy(allowed_groups=["ops", "release managers"])

    refusal = quorum.vote_refusal(votes(["dev"])[0], {"dev"}, ticket(), deciding)

    assert refusal == "only members of ops or release managers may decide this ticket"
    assert quorum.vote_refusal(votes(["ops"])[0], {"ops"}, ticket(), deciding) == ""


def test_a_vote_given_as_the_ticket_escalates_needs_the_escalation_group():
    escalating = policy(allowed_groups=["ops"], escalation_group="on-call")
    at_escalation = votes(["ops"], at=NOW)[0]
    before_it = votes(["ops"], at=NOW - timedelta(microseconds=1))[0]

    assert quorum.vote_refusal(at_escalation, {"ops"}, ticket(escalated_at=NOW), escalating) == (
        "only members of on-call may decide this ticket"
    )
    assert quorum.vote_refusal(before_it, {"ops"}, ticket(escalated_at=NOW), escalating) == ""


def test_an_escalated_ticket_whose_policy_names_no_escalation_group_keeps_its_deciding_groups():
    no_escalation_group = policy(allowed_groups=["ops"], escalation_group="")
    escalated = ticket(escalated_at=NOW - timedelta(hours=1))

    assert quorum.vote_refusal(votes(["ops"])[0], {"ops"}, escalated, no_escalation_group) == ""
    assert quorum.vote_refusal(votes(["ops"])[0], {"ops"}, ticket(), no_escalation_group) == ""


# --- why a member may not decide --------------------------------------------------------------


def test_refusal_for_someone_in_no_group_names_every_deciding_group():
    deciding = policy(allowed_groups=["ops", "release managers"])

    assert quorum.refusal_for(None, ticket(), deciding) == (
        "only members of ops or release managers may decide this ticket"
    )
    assert quorum.refusal_for(None, ticket(escalated_at=NOW), deciding) == (
        "this ticket was escalated; only members of ops or release managers may decide it now"
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "nobody",
    [None, AnonymousUser(), User(username="unsaved"), object()],
    ids=["none", "anonymous", "unsaved", "not-an-account"],
)
def test_groups_of_someone_who_is_no_saved_account_is_no_group_and_asks_nothing(
    nobody, django_assert_num_queries
):
    with django_assert_num_queries(0):
        assert quorum.groups_of(nobody, tenant_id=1) == set()


@pytest.mark.django_db
def test_groups_of_are_the_groups_of_that_tenant_only():
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    alice = member(acme, username="alice")
    member(globex, username="alice")
    for tenant, name in [(acme, "ops"), (globex, "globex ops")]:
        ApproverGroup.objects.create(tenant=tenant, name=name).members.add(alice)

    assert quorum.groups_of(alice, acme.id) == {"ops"}
    assert quorum.groups_of(alice, globex.id) == {"globex ops"}
