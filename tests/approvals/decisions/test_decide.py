"""decide: one compare-and-set from pending; the run's last decision queues exactly one resume."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.decisions.decide import compare_and_set, decide, refuse_unless_pending
from approvals.decisions.errors import (
    AlreadyDecidedError,
    InvalidDecisionError,
    NotAllowedError,
    SelfApprovalError,
    TicketExpiredError,
    TicketNotFoundError,
)
from approvals.models import AuditEvent, Membership, Role, Run, RunStatus, Ticket, TicketStatus
from approvals.runs.pause import pause_run
from tests.support import (
    TenantFactory,
    UserFactory,
    member,
    paused_run,
    run_agent,
    two_call_agent,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # Users are made by the factory with a password; the default PBKDF2 costs ~1 s per user.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


TASK_PATH = "approvals.execution.queue.resume_run_task"
PROMPT = "Deploy release 2026.07.24 to staging and production"


def two_ticket_run(tenant, requester) -> tuple[Run, Ticket, Ticket]:
    result = run_agent("release", PROMPT, agent=two_call_agent())
    # The registry is consulted only for the key and version at pause time.
    run = pause_run(
        result, tenant=tenant, agent_key="release", agent_version="1", requested_by=requester
    )
    staging, production = Ticket.objects.filter(run=run).order_by("pk")
    return run, staging, production


def one_ticket(tenant, requester) -> Ticket:
    return Ticket.objects.get(run=paused_run(tenant, requested_by=requester))


def resume_tasks(run: Run) -> list[DBTaskResult]:
    tasks = DBTaskResult.objects.filter(task_path=TASK_PATH)
    return [task for task in tasks if task.args_kwargs["args"] == [run.pk]]


class Unchanged:
    """Snapshot of what a refused decision must leave as it was."""

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self.audit = AuditEvent.objects.count()
        self.tasks = DBTaskResult.objects.count()
        self.run_status = Run.objects.get(pk=ticket.run_id).status

    def check(self, status: str = TicketStatus.PENDING) -> None:
        ticket = Ticket.objects.get(pk=self.ticket.pk)
        assert ticket.status == status
        assert AuditEvent.objects.count() == self.audit
        assert DBTaskResult.objects.count() == self.tasks
        assert Run.objects.get(pk=self.ticket.run_id).status == self.run_status


# --- decisions --------------------------------------------------------------------------------


def test_decide_approve_records_the_decision_and_queues_the_run():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    approver = member(tenant, Role.APPROVER)
    before = timezone.now()

    decided = decide(ticket, user=approver, approve=True, message="  Ship it.  ")

    assert decided.status == TicketStatus.APPROVED
    assert decided.decided_by == approver
    assert before <= decided.decided_at <= timezone.now()
    assert decided.decision_message == "Ship it."
    assert decided.always is False
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.QUEUED
    tasks = resume_tasks(ticket.run)
    assert len(tasks) == 1
    assert tasks[0].args_kwargs == {"args": [ticket.run_id], "kwargs": {}}
    assert list(
        AuditEvent.objects.filter(run_id=ticket.run_id)
        .order_by("seq")
        .values_list("action", "actor_id")
    ) == [
        ("run.paused", ticket.requested_by_id),
        ("ticket.created", ticket.requested_by_id),
        ("ticket.approved", approver.pk),
        ("run.queued", approver.pk),
    ]


def _stored(ticket: Ticket) -> dict:
    return {f.attname: getattr(ticket, f.attname) for f in Ticket._meta.concrete_fields}


@pytest.mark.parametrize("approve", [True, False])
def test_decide_returns_the_ticket_as_stored_with_its_run_kept(approve, django_assert_num_queries):
    tenant = TenantFactory()
    ticket = Ticket.objects.select_related("run").get(
        pk=one_ticket(tenant, member(tenant, Role.VIEWER)).pk
    )
    approver = member(tenant, Role.APPROVER)
    # Another hand moves the ticket before the decision: what is returned is the row now.
    Ticket.objects.filter(pk=ticket.pk).update(decision_reason="moved meanwhile")

    decided = decide(ticket, user=approver, approve=approve, message="m", always=approve)

    assert _stored(decided) == _stored(Ticket.objects.get(pk=ticket.pk))
    assert decided.decision_reason == "moved meanwhile"
    with django_assert_num_queries(0):
        assert decided.run.status == RunStatus.QUEUED
        assert decided.decided_by == approver


@pytest.mark.parametrize("approve", [True, False])
def test_decide_hints_the_decision_and_the_queued_run_after_commit(
    approve, live_sender, django_capture_on_commit_callbacks
):
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    approver = member(tenant, Role.APPROVER)

    with django_capture_on_commit_callbacks(execute=True):
        decide(ticket, user=approver, approve=approve)
        assert live_sender.sent == []

    status = TicketStatus.APPROVED if approve else TicketStatus.REJECTED
    event = {"type": "console.event", "tenant": tenant.pk}
    assert sorted(live_sender.sent, key=lambda hint: hint[1]["kind"]) == [
        (
            f"tenant.{tenant.pk}",
            {**event, "kind": "run.changed", "run": ticket.run_id, "status": RunStatus.QUEUED},
        ),
        (
            f"tenant.{tenant.pk}",
            {
                **event,
                "kind": "ticket.decided",
                "ticket": ticket.pk,
                "run": ticket.run_id,
                "status": status,
            },
        ),
    ]


def test_decide_takes_the_callers_membership_only_when_it_is_the_deciders():
    tenant, other = TenantFactory(), TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    viewer = member(tenant, Role.VIEWER)
    # An approver's membership of another tenant, handed over with a viewer: the viewer's own
    # membership is read, and its role refuses.
    elsewhere = Membership.objects.get(user=member(other, Role.APPROVER))
    unchanged = Unchanged(ticket)

    with pytest.raises(NotAllowedError):
        decide(ticket, user=viewer, approve=True, membership=elsewhere)

    unchanged.check()


def test_decide_reject_records_the_message_and_queues_the_run():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    approver = member(tenant, Role.ADMIN)
    message = "Deployment was denied by the release manager."

    decided = decide(ticket, user=approver, approve=False, message=message)

    assert decided.status == TicketStatus.REJECTED
    assert decided.decided_by == approver
    assert decided.decided_at is not None
    assert decided.decision_message == message
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.QUEUED
    assert len(resume_tasks(ticket.run)) == 1
    rejected = AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.rejected")
    assert rejected.detail == {"always": False, "message": message}


@pytest.mark.parametrize("approve", [True, False])
def test_decide_without_a_message_records_its_outcome_and_an_empty_detail(approve):
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))

    decide(ticket, user=member(tenant, Role.APPROVER), approve=approve)

    action, outcome = (
        ("ticket.approved", "approved") if approve else ("ticket.rejected", "rejected")
    )
    event = AuditEvent.objects.get(ticket_id=ticket.pk, action=action)
    assert (event.outcome, event.detail) == (outcome, {})


def test_decide_always_approve_is_stored_on_the_ticket():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))

    decided = decide(ticket, user=member(tenant), approve=True, always=True)

    assert decided.always is True
    assert AuditEvent.objects.get(ticket_id=ticket.pk, action="ticket.approved").detail == {
        "always": True,
        "message": "",
    }


def test_decide_queues_the_run_only_when_its_last_ticket_is_decided():
    tenant = TenantFactory()
    run, staging, production = two_ticket_run(tenant, member(tenant, Role.VIEWER))
    approver = member(tenant)

    decide(staging, user=approver, approve=True)

    assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED
    assert resume_tasks(run) == []
    assert list(AuditEvent.objects.filter(action="run.queued")) == []

    decided = decide(production, user=approver, approve=False, message="Not on a Friday.")

    queued = Run.objects.get(pk=run.pk)
    assert queued.status == RunStatus.QUEUED
    # The run's move is dated by the decision that made it.
    assert queued.updated_at == decided.decided_at
    assert len(resume_tasks(run)) == 1
    assert AuditEvent.objects.filter(run_id=run.pk, action="run.queued").count() == 1


def test_decide_on_a_run_that_is_not_paused_enqueues_nothing():
    tenant = TenantFactory()
    run, staging, production = two_ticket_run(tenant, member(tenant, Role.VIEWER))
    approver = member(tenant)
    # A run parked by the worker keeps its status even if someone decides the last ticket.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.NEEDS_ATTENTION)
    decide(staging, user=approver, approve=True)

    decide(production, user=approver, approve=True)

    assert Run.objects.get(pk=run.pk).status == RunStatus.NEEDS_ATTENTION
    assert resume_tasks(run) == []


# --- refusals ---------------------------------------------------------------------------------


def test_decide_already_decided_names_the_winner_and_time():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    winner = member(tenant, username="alice")
    loser = member(tenant, username="bob")
    won = decide(ticket, user=winner, approve=True)
    unchanged = Unchanged(ticket)

    with pytest.raises(AlreadyDecidedError) as raised:
        decide(ticket, user=loser, approve=False, message="no")

    assert str(raised.value) == (
        f"Already approved by alice at {won.decided_at:%Y-%m-%d %H:%M:%S} UTC."
    )
    unchanged.check(TicketStatus.APPROVED)
    assert Ticket.objects.get(pk=ticket.pk).decided_by == winner
    assert len(resume_tasks(ticket.run)) == 1


def test_decide_expired_ticket_is_refused():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    expired_at = timezone.now() - timedelta(seconds=1)
    Ticket.objects.filter(pk=ticket.pk).update(expires_at=expired_at)
    unchanged = Unchanged(ticket)

    with pytest.raises(TicketExpiredError) as refused:
        decide(ticket, user=member(tenant), approve=True)

    assert str(refused.value) == (
        f"this ticket expired at {expired_at:%Y-%m-%d %H:%M:%S} UTC; the agent must ask again"
    )
    unchanged.check()


def test_refuse_unless_pending_holds_a_ticket_pending_until_the_instant_it_expires():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    now = ticket.expires_at
    expired = Ticket(status=TicketStatus.EXPIRED, expires_at=now + timedelta(hours=1))

    assert refuse_unless_pending(ticket, now - timedelta(microseconds=1)) is None
    with pytest.raises(TicketExpiredError):
        refuse_unless_pending(ticket, now)
    # Marked expired by the sweep: refused whatever its expiry time says.
    with pytest.raises(TicketExpiredError):
        refuse_unless_pending(expired, now)


def test_decide_superseded_ticket_is_refused():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    Ticket.objects.filter(pk=ticket.pk).update(status=TicketStatus.SUPERSEDED)
    unchanged = Unchanged(ticket)

    with pytest.raises(TicketExpiredError) as refused:
        decide(ticket, user=member(tenant), approve=True)

    assert str(refused.value) == "this ticket was withdrawn because its run ended"

    unchanged.check(TicketStatus.SUPERSEDED)


def test_decide_self_approval_is_refused():
    tenant = TenantFactory()
    requester = member(tenant, Role.APPROVER)
    ticket = one_ticket(tenant, requester)
    unchanged = Unchanged(ticket)

    with pytest.raises(SelfApprovalError) as refused:
        decide(ticket, user=requester, approve=True)

    assert str(refused.value) == "you requested this call, so someone else must approve it"
    unchanged.check()


def test_decide_requester_may_reject_own_ticket():
    tenant = TenantFactory()
    requester = member(tenant, Role.APPROVER)
    ticket = one_ticket(tenant, requester)

    decided = decide(ticket, user=requester, approve=False, message="Wrong release.")

    assert decided.status == TicketStatus.REJECTED
    assert decided.decided_by == requester
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.QUEUED


@pytest.mark.parametrize("role", [Role.VIEWER, Role.AUDITOR])
@pytest.mark.parametrize("approve", [True, False], ids=["approve", "reject"])
def test_decide_by_non_deciding_role_is_refused(role, approve):
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    unchanged = Unchanged(ticket)

    with pytest.raises(NotAllowedError) as refused:
        decide(ticket, user=member(tenant, role), approve=approve)

    assert str(refused.value) == f"the {role} role cannot decide tickets"

    unchanged.check()


def test_decide_by_user_of_another_tenant_is_not_found():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    outsider = member(TenantFactory(), Role.ADMIN)
    unchanged = Unchanged(ticket)

    with pytest.raises(TicketNotFoundError) as refused:
        decide(ticket, user=outsider, approve=True)

    # The same answer as for a ticket that does not exist: nothing said of another tenant's.
    assert str(refused.value) == "no such ticket"
    unchanged.check()


def test_decide_by_user_without_membership_or_inactive_is_not_found():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    inactive = member(tenant, Role.ADMIN)
    inactive.is_active = False
    inactive.save(update_fields=["is_active"])
    unchanged = Unchanged(ticket)

    for user in (UserFactory(), inactive):
        with pytest.raises(TicketNotFoundError):
            decide(ticket, user=user, approve=True)

    unchanged.check()
    assert Membership.objects.filter(user=inactive, tenant=tenant).count() == 1


def test_decide_message_over_2000_chars_is_refused():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    unchanged = Unchanged(ticket)

    with pytest.raises(InvalidDecisionError) as refused:
        decide(ticket, user=member(tenant), approve=False, message="x" * 2001)

    assert str(refused.value) == "the message is 2001 characters; at most 2000"

    unchanged.check()


def test_decide_message_of_exactly_2000_chars_is_accepted():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))

    decided = decide(ticket, user=member(tenant), approve=False, message="x" * 2000)

    assert decided.decision_message == "x" * 2000


def test_decide_always_with_reject_is_refused():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    unchanged = Unchanged(ticket)

    with pytest.raises(InvalidDecisionError) as refused:
        decide(ticket, user=member(tenant), approve=False, always=True)

    assert str(refused.value) == "'always' goes with an approval, not a rejection"

    unchanged.check()


# --- the compare-and-set itself ---------------------------------------------------------------


def test_compare_and_set_decides_a_pending_ticket_and_ends_its_claim():
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    approver, claimer = member(tenant, Role.APPROVER), member(tenant, Role.APPROVER)
    now = timezone.now()
    Ticket.objects.filter(pk=ticket.pk).update(claimed_by=claimer, claimed_at=now)

    compare_and_set(ticket, status=TicketStatus.REJECTED, user=approver, now=now, message="no")

    stored = Ticket.objects.get(pk=ticket.pk)
    assert (stored.status, stored.decided_by, stored.decided_at, stored.decision_message) == (
        TicketStatus.REJECTED,
        approver,
        now,
        "no",
    )
    assert (stored.always, stored.claimed_by, stored.claimed_at) == (False, None, None)


def test_compare_and_set_that_loses_says_why_and_writes_nothing(django_assert_num_queries):
    tenant = TenantFactory()
    ticket = one_ticket(tenant, member(tenant, Role.VIEWER))
    first, second = member(tenant, Role.APPROVER), member(tenant, Role.APPROVER)
    now = timezone.now()
    compare_and_set(ticket, status=TicketStatus.APPROVED, user=first, now=now)
    assert Ticket.objects.get(pk=ticket.pk).decision_message == ""

    # The update that finds nothing, then the row read again with its decider, for the answer.
    with django_assert_num_queries(2):
        with pytest.raises(AlreadyDecidedError) as lost:
            compare_and_set(ticket, status=TicketStatus.REJECTED, user=second, now=now)
        said = str(lost.value)
    assert said == f"Already approved by {first.username} at {now:%Y-%m-%d %H:%M:%S} UTC."
    # Past its expiry, a pending ticket is refused as expired.
    late = one_ticket(tenant, member(tenant, Role.VIEWER))
    with pytest.raises(TicketExpiredError, match="this ticket expired at"):
        compare_and_set(late, status=TicketStatus.APPROVED, user=first, now=late.expires_at)

    assert Ticket.objects.get(pk=ticket.pk).decided_by == first
    assert Ticket.objects.get(pk=late.pk).status == TicketStatus.PENDING
