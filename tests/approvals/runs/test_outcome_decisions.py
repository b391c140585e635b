"""A finished run's decisions as webhooks and e-mails tell them (runs.outcome.decisions)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.decisions.edit import NOTE_LEAD
from approvals.models import PreAuthorization, Role, TicketStatus, TicketVote
from approvals.runs.outcome import Decision, decisions
from tests.support import TenantFactory, member, stored_run, stored_ticket

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant():
    return TenantFactory(slug="acme")


def _vote(ticket, user, *, minutes: int, invalidated: bool = False) -> TicketVote:
    at = timezone.now() - timedelta(minutes=minutes)
    return TicketVote.objects.create(
        ticket=ticket, user=user, created_at=at, invalidated_at=at if invalidated else None
    )


def test_decisions_tell_each_decided_call_in_order_with_who_counted(tenant):
    ann, bob, cid = (member(tenant, Role.APPROVER, name) for name in ("ann", "bob", "cid"))
    run = stored_run(tenant, status="completed")
    quorum = stored_ticket(
        tenant, run=run, status=TicketStatus.APPROVED, decided_by=bob, decision_message="ok"
    )
    # The votes that counted, in the order they were given; a vote set aside does not count.
    _vote(quorum, bob, minutes=1)
    _vote(quorum, ann, minutes=3)
    _vote(quorum, cid, minutes=2, invalidated=True)
    rejected = stored_ticket(
        tenant,
        run=run,
        tool="publish_invoice",
        status=TicketStatus.REJECTED,
        decided_by=cid,
        decision_message="token sk-live-abcdefghijklmnopqrstuvwx leaked",
    )
    stored_ticket(tenant, run=run, status=TicketStatus.PENDING)

    found = decisions(run)

    assert found[0] == Decision(
        ticket=quorum.pk,
        tool="deploy_release",
        decision="approved",
        message="ok",
        approvers=["ann", "bob"],
        decided_by="bob",
    )
    assert found[1].ticket == rejected.pk
    assert (found[1].tool, found[1].decision, found[1].approvers) == (
        "publish_invoice",
        "rejected",
        [],
    )
    assert found[1].decided_by == "cid"
    assert "sk-live-abcdefghijklmnopqrstuvwx" not in found[1].message
    assert len(found) == 2


def test_an_edited_call_is_told_as_edited_with_the_approvers_note_only(tenant):
    ann = member(tenant, Role.APPROVER, "ann")
    run = stored_run(tenant, status="completed")
    original = stored_ticket(
        tenant,
        run=run,
        status=TicketStatus.REJECTED,
        decided_by=ann,
        decision_message=f'Run it with {{"release": "2026.07.25"}}. {NOTE_LEAD}wrong release',
    )
    PreAuthorization.objects.create(
        tenant=tenant,
        run=run,
        tool_name="deploy_release",
        arguments_json='{"release":"2026.07.25"}',
        arguments_digest="1" * 64,
        original_ticket=original,
        created_by=ann,
        expires_at=timezone.now() + timedelta(hours=1),
    )

    assert decisions(run) == [
        Decision(
            ticket=original.pk,
            tool="deploy_release",
            decision="edited",
            message="wrong release",
            approvers=[],
            decided_by="ann",
        )
    ]


def test_who_decided_is_the_rule_or_the_expiry_when_no_person_did(tenant):
    run = stored_run(tenant, status="completed")
    by_rule = stored_ticket(tenant, run=run, status=TicketStatus.APPROVED, decision_source="rule")
    expired = stored_ticket(tenant, run=run, status=TicketStatus.EXPIRED, decision_source="expiry")

    found = decisions(run)

    assert [(d.ticket, d.decision, d.decided_by, d.approvers) for d in found] == [
        (by_rule.pk, "approved", "rule", []),
        (expired.pk, "expired", "expiry", []),
    ]


def test_an_approval_without_a_counted_vote_names_its_decider_as_approver(tenant):
    ann = member(tenant, Role.APPROVER, "ann")
    run = stored_run(tenant, status="completed")
    stored_ticket(tenant, run=run, status=TicketStatus.APPROVED, decided_by=ann)

    assert [(d.approvers, d.decided_by) for d in decisions(run)] == [(["ann"], "ann")]


def test_decisions_of_another_run_are_not_told(tenant):
    ann = member(tenant, Role.APPROVER, "ann")
    run, other = stored_run(tenant), stored_run(tenant)
    stored_ticket(tenant, run=other, status=TicketStatus.APPROVED, decided_by=ann)

    assert decisions(run) == []


def test_decisions_read_a_fixed_number_of_queries_whatever_the_tickets_and_votes(tenant):
    people = [member(tenant, Role.APPROVER, f"p{n}") for n in range(3)]
    run = stored_run(tenant, status="completed")
    for n in range(4):
        ticket = stored_ticket(tenant, run=run, status=TicketStatus.APPROVED, decided_by=people[0])
        for minutes, person in enumerate(people):
            _vote(ticket, person, minutes=minutes + n)

    with CaptureQueriesContext(connection) as captured:
        found = decisions(run)

    assert [len(d.approvers) for d in found] == [3, 3, 3, 3]
    assert len(captured) == 2, [q["sql"][:100] for q in captured]


def test_decisions_of_one_ticket_tell_that_ticket_only(tenant):
    ann = member(tenant, Role.APPROVER, "ann")
    run, other = stored_run(tenant, status="completed"), stored_run(tenant)
    first = stored_ticket(tenant, run=run, status=TicketStatus.APPROVED, decided_by=ann)
    second = stored_ticket(
        tenant, run=run, status=TicketStatus.REJECTED, decided_by=ann, decision_message="no"
    )
    pending = stored_ticket(tenant, run=run)
    elsewhere = stored_ticket(tenant, run=other, status=TicketStatus.APPROVED, decided_by=ann)

    assert decisions(run, ticket_id=second.pk) == [decisions(run)[1]]
    assert decisions(run, ticket_id=first.pk) == [decisions(run)[0]]
    assert decisions(run, ticket_id=pending.pk) == []
    assert decisions(run, ticket_id=elsewhere.pk) == []
