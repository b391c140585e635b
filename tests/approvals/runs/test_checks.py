"""The tickets a resume checks, read with their valid votes in one query (runs.checks)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Membership, Role, Ticket, TicketVote
from approvals.runs import checks
from approvals.runs.pause import pause_run
from tests.support import TenantFactory, member, run_agent, two_call_agent

pytestmark = pytest.mark.django_db


def _two_tickets(tenant):
    result = run_agent(
        "release", "Deploy release 2026.07.24 to staging and production", agent=two_call_agent()
    )
    run = pause_run(result, tenant=tenant, agent_key="release", agent_version="1")
    return run, list(Ticket.objects.filter(run=run).order_by("pk"))


def test_the_tickets_come_with_their_valid_votes_voters_and_roles_in_one_query():
    tenant = TenantFactory(slug="acme")
    run, (first, second) = _two_tickets(tenant)
    ann = member(tenant, Role.APPROVER, "ann")
    bob = member(tenant, Role.ADMIN, "bob")
    gone = member(tenant, Role.APPROVER, "gone")
    outsider = member(TenantFactory(slug="other"), Role.APPROVER, "outsider")
    bob_vote = TicketVote.objects.create(ticket=first, user=bob, groups=["ops"])
    ann_vote = TicketVote.objects.create(ticket=first, user=ann)
    TicketVote.objects.create(
        ticket=first, user=gone, invalidated_at=timezone.now(), invalidated_reason="edited"
    )
    outsider_vote = TicketVote.objects.create(ticket=first, user=outsider)
    # Roles as they are now, not as they were at the vote.
    Membership.objects.filter(user=ann, tenant=tenant).update(role=Role.AUDITOR)

    with CaptureQueriesContext(connection) as queries:
        tickets, votes_of = checks.decided_tickets(run)
        voters = [
            (v.pk, v.user.get_username(), v.user.is_active, v.user.email, v.voter_role)
            for v in votes_of[first.pk]
        ]

    assert len(queries.captured_queries) == 1
    assert [t.pk for t in tickets] == [first.pk, second.pk]
    assert all(not hasattr(t, "voter_role") for t in tickets)
    assert votes_of[second.pk] == []
    assert voters == [
        (bob_vote.pk, "bob", True, bob.email, Role.ADMIN),
        (ann_vote.pk, "ann", True, ann.email, Role.AUDITOR),
        (outsider_vote.pk, "outsider", True, outsider.email, None),
    ]
    # Each vote as the ORM reads it, field by field.
    for vote in votes_of[first.pk]:
        stored = TicketVote.objects.get(pk=vote.pk)
        for field in TicketVote._meta.concrete_fields:
            assert getattr(vote, field.attname) == getattr(stored, field.attname), field.name
    assert votes_of[first.pk][0].groups == ["ops"]


def test_a_run_without_tickets_reads_none():
    tenant = TenantFactory(slug="acme")
    run, tickets = _two_tickets(tenant)
    Ticket.objects.filter(run=run).update(generation=run.state_generation + 1)

    assert checks.decided_tickets(run) == ([], {})
