"""Working as a team: claims, comments and batch decisions (approvals/team.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.audit.chain import verify_chain
from approvals.decisions import batch, claims, comments
from approvals.decisions.decide import decide
from approvals.decisions.errors import NotAllowedError, TicketNotFoundError
from approvals.live import hints as live
from approvals.models import (
    CLAIM_LAPSE,
    AuditEvent,
    Role,
    Run,
    RunStatus,
    Tenant,
    Ticket,
    TicketStatus,
)
from approvals.policies.versions import save_policy
from tests.support import TenantFactory, member, paused_run, pending_ticket

pytestmark = pytest.mark.django_db


def releases(tenant, count: int, *, requested_by=None) -> list[Ticket]:
    return [
        pending_ticket(
            tenant, requested_by=requested_by, prompt=f"Deploy release 2026.07.{n:02d} to staging"
        )
        for n in range(1, count + 1)
    ]


def actions(tenant) -> list[str]:
    return list(
        AuditEvent.objects.filter(tenant=tenant).order_by("seq").values_list("action", flat=True)
    )


@pytest.fixture
def hints(monkeypatch) -> list[tuple[int, str, dict]]:
    """The "ticket.changed" live hints sent, as (tenant, kind, ids)."""
    sent: list[tuple[int, str, dict]] = []
    notify = live.notify_on_commit

    def record(tenant_id: int, kind: str, **data) -> None:
        if kind == "ticket.changed":
            sent.append((tenant_id, kind, data))
        notify(tenant_id, kind, **data)

    monkeypatch.setattr(live, "notify_on_commit", record)
    return sent


@pytest.fixture
def tenant():
    return TenantFactory(slug="acme")


@pytest.fixture
def requester(tenant):
    return member(tenant, Role.VIEWER, username="requester")


# --- claims -----------------------------------------------------------------------------------


def test_claim_records_who_and_when_and_audits(tenant, requester, hints):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")

    claimed = claims.claim(ticket, user=alice)

    assert claimed.claimed_by == alice
    assert claimed.claim_is_active is True
    event = AuditEvent.objects.filter(tenant=tenant).latest("seq")
    assert (event.action, event.actor_name, event.ticket_id, event.detail) == (
        "ticket.claimed",
        "alice",
        ticket.pk,
        {},
    )
    assert hints == [(tenant.pk, "ticket.changed", {"ticket": ticket.pk, "run": ticket.run_id})]
    assert verify_chain(tenant).ok


def test_claim_by_someone_else_is_refused_with_who_and_since_when(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    bob = member(tenant, Role.APPROVER, username="bob")
    claims.claim(ticket, user=alice)
    seq = Tenant.objects.get(pk=tenant.pk).audit_seq

    with pytest.raises(claims.ClaimConflictError) as refused:
        claims.claim(ticket, user=bob)

    ticket.refresh_from_db()
    assert str(refused.value) == (
        f"Claimed by alice since {ticket.claimed_at:%Y-%m-%d %H:%M:%S} UTC."
    )
    assert ticket.claimed_by == alice
    assert Tenant.objects.get(pk=tenant.pk).audit_seq == seq


def test_claim_take_over_is_allowed_and_names_the_previous_claimant(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    bob = member(tenant, Role.ADMIN, username="bob")
    claims.claim(ticket, user=alice)

    claimed = claims.claim(ticket, user=bob, take_over=True)

    assert claimed.claimed_by == bob
    event = AuditEvent.objects.filter(tenant=tenant).latest("seq")
    assert (event.action, event.actor_name, event.detail) == (
        "ticket.claimed",
        "bob",
        {"took_over_from": "alice"},
    )


def test_claim_that_lapsed_is_free_to_take(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    bob = member(tenant, Role.APPROVER, username="bob")
    claims.claim(ticket, user=alice)
    Ticket.objects.filter(pk=ticket.pk).update(
        claimed_at=timezone.now() - CLAIM_LAPSE - timedelta(seconds=1)
    )
    ticket.refresh_from_db()
    assert ticket.claim_is_active is False

    claimed = claims.claim(ticket, user=bob)

    assert claimed.claimed_by == bob
    assert AuditEvent.objects.filter(tenant=tenant).latest("seq").detail == {}


def test_claim_again_by_the_same_person_renews_without_a_new_event(tenant, requester, hints):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    first = claims.claim(ticket, user=alice).claimed_at
    count = AuditEvent.objects.filter(tenant=tenant).count()

    again = claims.claim(ticket, user=alice)

    assert again.claimed_at >= first
    assert AuditEvent.objects.filter(tenant=tenant).count() == count
    assert len(hints) == 1


def test_claim_refused_for_a_viewer_and_for_another_tenant(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    outsider = member(TenantFactory(slug="other"), Role.ADMIN, username="outsider")

    with pytest.raises(NotAllowedError):
        claims.claim(ticket, user=requester)
    with pytest.raises(TicketNotFoundError):
        claims.claim(ticket, user=outsider)

    assert Ticket.objects.get(pk=ticket.pk).claimed_by is None


def test_claim_refused_on_a_decided_ticket(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    decide(ticket, user=member(tenant, Role.APPROVER, username="bob"), approve=False)

    with pytest.raises(claims.NotClaimableError) as refused:
        claims.claim(ticket, user=member(tenant, Role.APPROVER, username="alice"))

    assert str(refused.value) == "this ticket is rejected, so there is nothing to claim"


def test_release_clears_the_claim_and_audits(tenant, requester, hints):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    claims.claim(ticket, user=alice)

    released = claims.release(ticket, user=alice)

    assert (released.claimed_by, released.claimed_at) == (None, None)
    assert actions(tenant)[-2:] == ["ticket.claimed", "ticket.released"]
    assert [kind for _, kind, _ in hints] == ["ticket.changed", "ticket.changed"]


def test_release_of_someone_elses_claim_is_refused(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    claims.claim(ticket, user=alice)

    with pytest.raises(claims.NotClaimableError):
        claims.release(ticket, user=member(tenant, Role.APPROVER, username="bob"))

    assert Ticket.objects.get(pk=ticket.pk).claimed_by == alice


def test_decision_clears_the_claim(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    claims.claim(ticket, user=alice)

    decide(ticket, user=member(tenant, Role.APPROVER, username="bob"), approve=True)

    ticket = Ticket.objects.get(pk=ticket.pk)
    assert (ticket.status, ticket.claimed_by, ticket.claimed_at) == (
        TicketStatus.APPROVED,
        None,
        None,
    )


def test_live_hint_kind_for_team_events_is_ticket_changed(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    claims.claim(ticket, user=alice)
    comments.comment(ticket, user=alice, text="looking")
    claims.release(ticket, user=alice)

    events = AuditEvent.objects.filter(tenant=tenant, action__startswith="ticket.").exclude(
        action="ticket.created"
    )

    assert [live.hint_for(e)["kind"] for e in events] == ["ticket.changed"] * 3
    assert {live.hint_for(e)["ticket"] for e in events} == {ticket.pk}


# --- comments ---------------------------------------------------------------------------------


def test_comment_is_an_audit_event_and_the_chain_verifies(tenant, requester, hints):
    ticket = pending_ticket(tenant, requested_by=requester)
    auditor = member(tenant, Role.AUDITOR, username="carol")

    event = comments.comment(ticket, user=auditor, text="  Is staging green?  ")

    assert (event.action, event.actor_name, event.ticket_id, event.run_id, event.detail) == (
        "ticket.commented",
        "carol",
        ticket.pk,
        ticket.run_id,
        {"text": "Is staging green?"},
    )
    assert comments.comments(ticket) == [event]
    assert hints == [(tenant.pk, "ticket.changed", {"ticket": ticket.pk, "run": ticket.run_id})]
    assert verify_chain(tenant).ok


def test_comment_masks_a_pasted_secret_and_keeps_the_rest(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    secret = "sk-" + "a1B2c3D4e5F6g7H8i9J0" * 2

    event = comments.comment(ticket, user=alice, text=f"use key {secret} for the deploy")

    stored = AuditEvent.objects.get(pk=event.pk).detail["text"]
    assert stored == "use key [redacted] for the deploy"
    assert not AuditEvent.objects.filter(detail__icontains=secret[:12]).exists()


def test_comment_masks_a_whole_private_key_block(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")
    key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"

    event = comments.comment(ticket, user=alice, text=f"here:\n{key}\nthanks")

    assert event.detail == {"text": "here:\n[redacted]\nthanks"}


@pytest.mark.parametrize("text", ["", "   ", "x" * (comments.MAX_COMMENT_CHARS + 1)])
def test_comment_empty_or_too_long_is_refused(tenant, requester, text):
    ticket = pending_ticket(tenant, requested_by=requester)
    count = AuditEvent.objects.count()

    with pytest.raises(comments.CommentError):
        comments.comment(ticket, user=member(tenant, Role.APPROVER), text=text)

    assert AuditEvent.objects.count() == count


def test_comment_by_a_viewer_or_another_tenant_is_refused(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    outsider = member(TenantFactory(slug="other"), Role.ADMIN, username="outsider")

    with pytest.raises(NotAllowedError):
        comments.comment(ticket, user=requester, text="hello")
    with pytest.raises(TicketNotFoundError):
        comments.comment(ticket, user=outsider, text="hello")

    assert comments.comments(ticket) == []


def test_comment_allowed_on_a_decided_ticket(tenant, requester):
    ticket = pending_ticket(tenant, requested_by=requester)
    approver = member(tenant, Role.APPROVER, username="alice")
    decide(ticket, user=approver, approve=False, message="no")

    event = comments.comment(ticket, user=approver, text="rejected: wrong window")

    assert comments.comments(ticket) == [event]


# --- batch decisions --------------------------------------------------------------------------


def test_batch_approve_20_where_3_were_decided_elsewhere(tenant, requester):
    tickets = releases(tenant, 20, requested_by=requester)
    approver = member(tenant, Role.APPROVER, username="alice")
    bob = member(tenant, Role.APPROVER, username="bob")
    elsewhere = [tickets[2], tickets[9], tickets[15]]
    for ticket in elsewhere:
        decide(ticket, user=bob, approve=False, message="not today")

    # The batch was picked from a page drawn before bob decided: it names all 20.
    outcomes = batch.decide_batch([t.pk for t in tickets], user=approver, approve=True)

    done = [o.ticket.pk for o in outcomes if o.done]
    refused = {o.ticket.pk: o.result for o in outcomes if not o.done}
    assert len(done) == 17
    assert set(refused) == {t.pk for t in elsewhere}
    assert all(r.startswith("Already rejected by bob at ") for r in refused.values())
    assert Ticket.objects.filter(pk__in=done, status=TicketStatus.APPROVED).count() == 17
    assert Ticket.objects.filter(status=TicketStatus.REJECTED).count() == 3
    # Each decision is its own event, and each run was handed to the worker.
    approved = AuditEvent.objects.filter(tenant=tenant, action="ticket.approved")
    assert sorted(approved.values_list("ticket_id", flat=True)) == sorted(done)
    assert Run.objects.filter(status=RunStatus.QUEUED).count() == 20
    assert verify_chain(tenant).ok


def test_batch_mixing_tools_is_refused_with_nothing_written(tenant, requester):
    release = pending_ticket(tenant, requested_by=requester)
    invoice = Ticket.objects.get(
        run=paused_run(
            tenant, agent_key="invoice", prompt="Publish invoice INV-1001", requested_by=requester
        )
    )
    seq = Tenant.objects.get(pk=tenant.pk).audit_seq

    with pytest.raises(batch.BatchError) as refused:
        batch.decide_batch(
            [release.pk, invoice.pk], user=member(tenant, Role.APPROVER), approve=True
        )

    assert str(refused.value) == (
        "a batch holds tickets of one tool; this one mixes deploy_release and publish_invoice"
    )
    assert Ticket.objects.filter(status=TicketStatus.PENDING).count() == 2
    assert Tenant.objects.get(pk=tenant.pk).audit_seq == seq


def test_batch_self_approval_is_reported_per_ticket(tenant, requester):
    approver = member(tenant, Role.APPROVER, username="alice")
    others = releases(tenant, 2, requested_by=requester)
    own = pending_ticket(
        tenant, requested_by=approver, prompt="Deploy release 2026.08.01 to staging"
    )

    outcomes = batch.decide_batch([others[0].pk, own.pk, others[1].pk], user=approver, approve=True)

    assert [(o.ticket.pk, o.done, o.result) for o in outcomes] == [
        (others[0].pk, True, "approved"),
        (own.pk, False, "You requested this call, so someone else must approve it."),
        (others[1].pk, True, "approved"),
    ]
    assert Ticket.objects.get(pk=own.pk).status == TicketStatus.PENDING


def test_batch_approval_that_only_counts_towards_a_quorum_is_reported_as_a_vote(tenant, requester):
    admin = member(tenant, Role.ADMIN, username="boss")
    save_policy(tenant=tenant, user=admin, tool_name="deploy_release", required_approvals=2)
    tickets = releases(tenant, 2, requested_by=requester)
    alice = member(tenant, Role.APPROVER, username="alice")

    outcomes = batch.decide_batch([t.pk for t in tickets], user=alice, approve=True)

    assert [(o.done, o.result) for o in outcomes] == [
        (False, "Approval recorded, 1 of 2 approvals: alice."),
        (False, "Approval recorded, 1 of 2 approvals: alice."),
    ]
    assert set(Ticket.objects.values_list("status", flat=True)) == {TicketStatus.PENDING}
    bob = member(tenant, Role.APPROVER, username="bob")
    second = batch.decide_batch([t.pk for t in tickets], user=bob, approve=True)
    assert [(o.done, o.result) for o in second] == [(True, "approved"), (True, "approved")]


def test_batch_reject_sends_the_message_to_each(tenant, requester):
    tickets = releases(tenant, 3, requested_by=requester)

    outcomes = batch.decide_batch(
        [t.pk for t in tickets], user=member(tenant, Role.ADMIN), approve=False, message="freeze"
    )

    assert [o.result for o in outcomes] == ["rejected"] * 3
    assert set(Ticket.objects.values_list("status", "decision_message")) == {
        (TicketStatus.REJECTED, "freeze")
    }


def test_batch_expired_ticket_is_reported(tenant, requester):
    tickets = releases(tenant, 2, requested_by=requester)
    Ticket.objects.filter(pk=tickets[0].pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    outcomes = batch.decide_batch(
        [t.pk for t in tickets], user=member(tenant, Role.ADMIN), approve=True
    )

    assert outcomes[0].done is False
    assert outcomes[0].result.startswith("This ticket expired at ")
    assert outcomes[0].result.endswith(" UTC; the agent must ask again.")
    assert outcomes[1].result == "approved"


def test_batch_by_a_viewer_is_not_allowed_per_ticket(tenant, requester):
    tickets = releases(tenant, 2, requested_by=requester)

    outcomes = batch.decide_batch([t.pk for t in tickets], user=requester, approve=False)

    assert [(o.done, o.result) for o in outcomes] == [
        (False, "The viewer role cannot decide tickets.")
    ] * 2
    assert Ticket.objects.filter(status=TicketStatus.PENDING).count() == 2


def test_batch_naming_another_tenants_ticket_is_refused_whole(tenant, requester):
    mine = pending_ticket(tenant, requested_by=requester)
    other = TenantFactory(slug="other")
    theirs = pending_ticket(other, requested_by=member(other, Role.VIEWER))

    with pytest.raises(batch.BatchError) as refused:
        batch.decide_batch([mine.pk, theirs.pk], user=member(tenant, Role.ADMIN), approve=False)

    assert str(refused.value) == f"no such ticket: #{theirs.pk}"
    assert Ticket.objects.filter(status=TicketStatus.PENDING).count() == 2


def test_batch_over_the_cap_or_empty_is_refused():
    with pytest.raises(batch.BatchError, match="at most 100 tickets; 101 were selected"):
        batch.decide_batch(list(range(1, 102)), user=None, approve=True)
    with pytest.raises(batch.BatchError, match="select at least one ticket"):
        batch.decide_batch([], user=None, approve=True)


def test_batch_approval_refuses_a_ticket_whose_digest_does_not_verify(tenant, requester):
    tickets = releases(tenant, 2, requested_by=requester)
    Ticket.objects.filter(pk=tickets[0].pk).update(arguments_digest="0" * 64)

    outcomes = batch.decide_batch(
        [t.pk for t in tickets], user=member(tenant, Role.ADMIN), approve=True
    )

    assert [(o.done, o.result) for o in outcomes] == [
        (
            False,
            "Not approved: the arguments in the stored state differ from those recorded on the ticket.",
        ),
        (True, "approved"),
    ]
    assert Ticket.objects.get(pk=tickets[0].pk).status == TicketStatus.PENDING
