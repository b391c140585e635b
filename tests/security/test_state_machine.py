"""Tickets and runs under any order of pauses, decisions by anyone, expiries, resumes and
resolutions: decisions are final, nobody approves their own call, finished runs stay finished,
no effect happens without an approval, and every audit chain verifies."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db.models import F
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from approvals.audit.chain import verify_chain
from approvals.decisions.decide import decide
from approvals.decisions.errors import (
    AlreadyDecidedError,
    NotAllowedError,
    SelfApprovalError,
    TicketExpiredError,
    TicketNotFoundError,
)
from approvals.models import (
    DECIDING_ROLES,
    TERMINAL_RUN_STATUSES,
    IdempotencyRecord,
    Membership,
    Role,
    Run,
    RunStatus,
    Tenant,
    Ticket,
    TicketStatus,
)
from approvals.runs.pause import pause_run
from approvals.runs.reaper import reap
from approvals.runs.resolution import ResolutionError, resolve
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, run_agent, two_call_agent

pytestmark = pytest.mark.django_db(transaction=True)

ONE_ENVIRONMENT = "Deploy release 2026.07.24 to production"
TWO_ENVIRONMENTS = "Deploy release 2026.07.24 to staging and production"
# Each tenant's people; "approver2" is a second approver, so a requester's colleague exists.
PEOPLE = ["viewer", "approver", "approver2", "auditor", "admin"]
ROLE_OF = {"approver2": Role.APPROVER}
LIVE = {RunStatus.PAUSED, RunStatus.QUEUED, RunStatus.RESUMING}
_machines = itertools.count()
_paused_results: dict[bool, object] = {}


def paused_result(two: bool):
    """A real paused RunResult, made once per kind and stored again for every new run."""
    if two not in _paused_results:
        _paused_results[two] = (
            run_agent("release", TWO_ENVIRONMENTS, agent=two_call_agent())
            if two
            else run_agent("release", ONE_ENVIRONMENT)
        )
    return _paused_results[two]


class TicketsAndRuns(RuleBasedStateMachine):
    runs = Bundle("runs")

    @initialize()
    def people(self) -> None:
        n = next(_machines)
        self.tenants = [TenantFactory(slug=f"machine{n}-{side}") for side in "ab"]
        self.users = {
            (side, who): member(tenant, ROLE_OF.get(who, who), username=f"m{n}-{side}-{who}")
            for side, tenant in enumerate(self.tenants)
            for who in PEOPLE
        }
        self.effects_before = len(demo.read_effects())
        self.ticket_seen: dict[int, str] = {}
        self.finished: set[int] = set()

    def role(self, user, tenant_id: int) -> str | None:
        return (
            Membership.objects.filter(user=user, tenant_id=tenant_id)
            .values_list("role", flat=True)
            .first()
        )

    # --- rules -------------------------------------------------------------------------------

    @rule(target=runs, side=st.integers(0, 1), who=st.sampled_from(PEOPLE), two=st.booleans())
    def pause(self, side: int, who: str, two: bool) -> int:
        run = pause_run(
            paused_result(two),
            tenant=self.tenants[side],
            agent_key="release",
            agent_version="1",
            requested_by=self.users[(side, who)],
        )
        return run.pk

    @rule(
        run_id=runs,
        pick=st.integers(0, 3),
        # Mostly someone of the run's own tenant; sometimes someone of the other one.
        actor=st.tuples(st.sampled_from([0, 0, 0, 1]), st.sampled_from(PEOPLE)),
        approve=st.booleans(),
        always=st.booleans(),
    )
    def decide(self, run_id: int, pick: int, actor: tuple, approve: bool, always: bool) -> None:
        self._decide(run_id, pick, actor, approve, always)

    @rule(
        run_id=runs,
        pick=st.integers(0, 3),
        who=st.sampled_from(["approver", "approver2", "admin"]),
        always=st.booleans(),
    )
    def approve_as_a_decider(self, run_id: int, pick: int, who: str, always: bool) -> None:
        """Approvals by people who may decide, so that runs get to resume at all."""
        self._decide(run_id, pick, (0, who), True, always)

    def _decide(self, run_id: int, pick: int, actor: tuple, approve: bool, always: bool) -> None:
        tickets = list(Ticket.objects.filter(run_id=run_id).order_by("pk"))
        ticket = tickets[pick % len(tickets)]
        side = [t.pk for t in self.tenants].index(ticket.tenant_id)
        user = self.users[((side + actor[0]) % 2, actor[1])]
        before = ticket.status
        role = self.role(user, ticket.tenant_id)
        always = always and approve
        try:
            decide(ticket, user=user, approve=approve, always=always)
        except TicketNotFoundError:
            assert role is None
        except NotAllowedError:
            assert role not in DECIDING_ROLES
        except SelfApprovalError:
            assert approve and ticket.requested_by_id == user.pk
        except (AlreadyDecidedError, TicketExpiredError):
            assert before != TicketStatus.PENDING or ticket.is_expired
        else:
            assert role in DECIDING_ROLES, f"{role} decided ticket {ticket.pk}"
            assert not (approve and ticket.requested_by_id == user.pk), "self-approval"
            assert before == TicketStatus.PENDING

    @rule(now=st.integers(0, 3))
    def expire(self, now: int) -> None:
        # Expiry ends every open run, so it comes up less often than the other rules.
        if now:
            return
        later = timezone.now() + django_settings.APPROVALS_TICKET_TTL + timedelta(minutes=1)
        reap(now=later)

    @rule(run_id=runs)
    def resume(self, run_id: int) -> None:
        resume(run_id=run_id, worker_id="machine-worker")

    @rule(side=st.integers(0, 1), who=st.sampled_from(["approver", "approver2", "admin"]))
    def demote(self, side: int, who: str) -> None:
        """An approver loses the right to decide: what they approved must not run any more."""
        Membership.objects.filter(user=self.users[(side, who)]).update(role=Role.VIEWER)

    @rule(
        run_id=runs,
        actor=st.tuples(st.integers(0, 1), st.sampled_from(PEOPLE)),
        resolution=st.sampled_from(["happened", "retry", "abandon"]),
    )
    def resolve(self, run_id: int, actor: tuple, resolution: str) -> None:
        run = Run.objects.get(pk=run_id)
        user = self.users[actor]
        try:
            resolved = resolve(run, user=user, resolution=resolution)
        except ResolutionError:
            return
        assert self.role(user, run.tenant_id) == Role.ADMIN
        if resolved.status in LIVE:
            # An admin put the run back in the queue: it may run again.
            self.finished.discard(run_id)

    # --- invariants --------------------------------------------------------------------------

    def mine(self):
        return {"tenant__in": getattr(self, "tenants", [])}

    @invariant()
    def decisions_are_final(self) -> None:
        for pk, status in Ticket.objects.filter(**self.mine()).values_list("pk", "status"):
            seen = self.ticket_seen.get(pk, TicketStatus.PENDING)
            assert seen == TicketStatus.PENDING or status == seen, (
                f"ticket {pk} went from {seen} to {status}"
            )
            self.ticket_seen[pk] = status

    @invariant()
    def nobody_approved_their_own_call(self) -> None:
        approved = Ticket.objects.filter(status=TicketStatus.APPROVED, **self.mine())
        assert list(approved.filter(decided_by_id=F("requested_by_id"))) == []

    @invariant()
    def finished_runs_stay_finished(self) -> None:
        for pk, status in Run.objects.filter(**self.mine()).values_list("pk", "status"):
            if pk in self.finished:
                assert status not in LIVE, f"run {pk} came back as {status}"
            if status in TERMINAL_RUN_STATUSES:
                self.finished.add(pk)

    @invariant()
    def no_effect_without_an_approval(self) -> None:
        if not hasattr(self, "tenants"):
            return
        approved = Ticket.objects.filter(status=TicketStatus.APPROVED, **self.mine()).count()
        effects = len(demo.read_effects()) - self.effects_before
        assert effects <= approved, f"{effects} effects for {approved} approved tickets"
        unapproved = IdempotencyRecord.objects.filter(**self.mine()).exclude(
            ticket__status=TicketStatus.APPROVED
        )
        assert list(unapproved) == []

    @invariant()
    def audit_chains_verify(self) -> None:
        for tenant in Tenant.objects.filter(pk__in=[t.pk for t in getattr(self, "tenants", [])]):
            report = verify_chain(tenant)
            assert report.ok, report


def test_state_machine_tickets_and_runs_keep_their_guarantees():
    run_state_machine_as_test(
        TicketsAndRuns,
        settings=settings(
            max_examples=8,
            stateful_step_count=30,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_state_machine_a_scripted_path_reaches_an_effect_the_invariants_count():
    """The control: the rules can reach a completed run with its one effect, and the
    invariants see it (so the random runs are not vacuous)."""
    machine = TicketsAndRuns()
    machine.people()
    run_id = machine.pause(side=0, who="viewer", two=False)
    machine.decide(run_id, pick=0, actor=(0, "viewer"), approve=True, always=False)
    machine.approve_as_a_decider(run_id, pick=0, who="approver", always=False)
    machine.resume(run_id)
    machine.resume(run_id)

    for check in (
        machine.decisions_are_final,
        machine.nobody_approved_their_own_call,
        machine.finished_runs_stay_finished,
        machine.no_effect_without_an_approval,
        machine.audit_chains_verify,
    ):
        check()

    assert Run.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert machine.finished == {run_id}
    assert len(demo.read_effects()) == 1


def test_state_machine_invariant_catches_a_finished_run_queued_again():
    """The control: a completed run put back in the queue by hand breaks an invariant."""
    machine = TicketsAndRuns()
    machine.people()
    run_id = machine.pause(side=0, who="viewer", two=False)
    machine.approve_as_a_decider(run_id, pick=0, who="approver", always=False)
    machine.resume(run_id)
    machine.finished_runs_stay_finished()
    Run.objects.filter(pk=run_id).update(status=RunStatus.QUEUED)

    with pytest.raises(AssertionError, match=f"run {run_id} came back as queued"):
        machine.finished_runs_stay_finished()
