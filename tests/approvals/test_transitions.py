"""The two state machines: every status write is a move the table allows, made in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db import connection, transaction

from approvals import transitions
from approvals.audit import changes
from approvals.models import Run, RunStatus, Ticket, TicketStatus
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

APPROVALS = Path(__file__).resolve().parents[2] / "approvals"


@pytest.fixture
def run():
    tenant = TenantFactory()
    return paused_run(tenant, requested_by=member(tenant))


def test_move_runs_moves_an_allowed_transition(run):
    moved = transitions.move_runs(Run.objects.filter(pk=run.pk), to=RunStatus.QUEUED)

    assert moved == 1
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED


@pytest.mark.parametrize("finished", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.EXPIRED])
def test_move_runs_never_moves_a_finished_run(run, finished):
    Run.objects.filter(pk=run.pk).update(status=finished)

    for target in (RunStatus.QUEUED, RunStatus.RESUMING, RunStatus.PAUSED):
        assert transitions.move_runs(Run.objects.filter(pk=run.pk), to=target) == 0
    assert Run.objects.get(pk=run.pk).status == finished


def test_move_runs_skips_a_paused_run_asked_to_complete(run):
    """Only a resuming run completes: paused -> completed is not in the table."""
    assert transitions.move_runs(Run.objects.filter(pk=run.pk), to=RunStatus.COMPLETED) == 0
    assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED


def test_move_runs_refuses_an_unknown_status(run):
    with pytest.raises(transitions.TransitionError, match="'done' is not a status"):
        transitions.move_runs(Run.objects.filter(pk=run.pk), to="done")


def test_move_runs_refuses_a_status_nothing_moves_to(run):
    """A run is created paused or moved back by a resume; nothing moves a run to a status
    that is not in some row of the table."""
    table = dict(transitions.RUN_TRANSITIONS)
    assert {t for targets in table.values() for t in targets} == set(RunStatus.values)


def test_move_tickets_decides_only_pending_tickets(run):
    ticket = Ticket.objects.get(run=run)
    tickets = Ticket.objects.filter(pk=ticket.pk)

    assert transitions.move_tickets(tickets, to=TicketStatus.APPROVED) == 1
    assert transitions.move_tickets(tickets, to=TicketStatus.REJECTED) == 0
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


def test_move_tickets_refuses_back_to_pending(run):
    with pytest.raises(transitions.TransitionError, match="nothing moves to 'pending'"):
        transitions.move_tickets(Ticket.objects.filter(run=run), to=TicketStatus.PENDING)


def test_supersede_pending_leaves_decided_tickets_alone(run):
    ticket = Ticket.objects.get(run=run)
    Ticket.objects.filter(pk=ticket.pk).update(status=TicketStatus.REJECTED)

    assert transitions.supersede_pending(run) == 0
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.REJECTED


def _status_writes(tree: ast.AST) -> list[int]:
    """Lines that write a status column: .update(status=...), .create(status=...) or a save
    whose update_fields name "status"."""
    lines = []
    # The copies of functions that the mutation run writes beside the code (their names hold
    # "__mutmut_") are its mutants, not the product's writes.
    mutants = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and "__mutmut_" in node.name
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in mutants:
            continue
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        status = keywords.get("status")
        # The ledger's rows and the task queue's rows have statuses of their own (claimed, done,
        # failed; ready, running, failed): no state machine of a run or a ticket.
        if status is not None and ast.unparse(status).startswith(
            ("LedgerStatus.", "TaskResultStatus.")
        ):
            continue
        if node.func.attr in {"update", "create", "update_or_create"} and status is not None:
            lines.append(node.lineno)
        fields = keywords.get("update_fields")
        if node.func.attr == "save" and fields is not None and "status" in ast.unparse(fields):
            lines.append(node.lineno)
    return lines


def _resuming(run) -> Run:
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RESUMING)
    return Run.objects.get(pk=run.pk)


@pytest.mark.parametrize("write", ["plain", "holding the head"])
def test_end_run_moves_the_run_then_supersedes_its_pending_tickets(run, write):
    run = _resuming(run)
    ticket = Ticket.objects.get(run=run)
    other = paused_run(run.tenant)
    writer = {
        "plain": transitions.update_pair,
        "holding the head": changes.update_pair_holding_head,
    }

    with transaction.atomic():
        moved = transitions.end_run(
            run,
            Run.objects.filter(pk=run.pk),
            to=RunStatus.FAILED,
            write=writer[write],
            status_reason="broke",
        )

    assert moved == 1
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (RunStatus.FAILED, "broke")
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.SUPERSEDED
    assert Ticket.objects.get(run=other).status == TicketStatus.PENDING


def test_end_run_of_a_run_that_may_not_end_so_touches_no_ticket(run):
    # A paused run is not completed: only a resuming one is.
    moved = transitions.end_run(run, Run.objects.filter(pk=run.pk), to=RunStatus.COMPLETED)

    assert moved == 0
    assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED
    assert Ticket.objects.get(run=run).status == TicketStatus.PENDING


def test_end_run_leaves_decided_tickets_alone(run):
    run = _resuming(run)
    ticket = Ticket.objects.get(run=run)
    Ticket.objects.filter(pk=ticket.pk).update(status=TicketStatus.APPROVED)

    assert transitions.end_run(run, Run.objects.filter(pk=run.pk), to=RunStatus.COMPLETED) == 1
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


def test_end_run_refuses_an_unknown_status(run):
    with pytest.raises(transitions.TransitionError, match="'done' is not a status"):
        transitions.end_run(run, Run.objects.filter(pk=run.pk), to="done")


WRITERS = {"plain": transitions.update_pair, "holding the head": changes.update_pair_holding_head}


def _decide(ticket, run, *, runs=None, to=TicketStatus.APPROVED, write):
    with transaction.atomic():
        return transitions.decide_ticket(
            Ticket.objects.filter(pk=ticket.pk),
            to=to,
            runs=runs if runs is not None else Run.objects.filter(pk=run.pk),
            run_to=RunStatus.QUEUED,
            write=WRITERS[write],
            decision_message="fine",
        )


@pytest.mark.parametrize("write", list(WRITERS))
def test_decide_ticket_moves_the_ticket_then_its_run(run, write):
    ticket = Ticket.objects.get(run=run)
    other = paused_run(run.tenant)

    assert _decide(ticket, run, write=write) == (1, 1)

    ticket.refresh_from_db()
    assert (ticket.status, ticket.decision_message) == (TicketStatus.APPROVED, "fine")
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert Run.objects.get(pk=other.pk).status == RunStatus.PAUSED


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement pair")
def test_decide_ticket_in_one_statement_moves_only_the_run_of_the_ticket_it_moved(run):
    ticket = Ticket.objects.get(run=run)
    other = paused_run(run.tenant)

    # The runs' queryset names another run too: the statement confines it to the decided
    # ticket's run (the plain pair leaves that to the queryset).
    both = Run.objects.filter(pk__in=[run.pk, other.pk])

    assert _decide(ticket, run, runs=both, write="holding the head") == (1, 1)
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert Run.objects.get(pk=other.pk).status == RunStatus.PAUSED


@pytest.mark.parametrize("write", list(WRITERS))
def test_decide_ticket_that_moves_no_ticket_moves_no_run(run, write):
    ticket = Ticket.objects.get(run=run)
    Ticket.objects.filter(pk=ticket.pk).update(status=TicketStatus.REJECTED)

    assert _decide(ticket, run, write=write) == (0, 0)

    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.REJECTED
    assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED


def test_every_status_write_goes_through_transitions():
    """Outside transitions.py no product module writes a run's or a ticket's status."""
    writers = {}
    for path in sorted(APPROVALS.rglob("*.py")):
        if "migrations" in path.parts or path.name == "transitions.py":
            continue
        lines = _status_writes(ast.parse(path.read_text()))
        if lines:
            writers[str(path.relative_to(APPROVALS))] = lines
    assert writers == {}
