"""The two state machines, runs and tickets: every status write goes through move_runs() or
move_tickets(), and every new run through create_run() or born_paused().

Each is one conditional UPDATE from the statuses that may move to the target, so a transition
that is not in the table never happens, and two writers racing for the same row cannot both
win: the caller learns from the count it gets back. The callers add their own conditions (the
lease a worker holds, a ticket's expiry) and write the audit event and live hint that go with
the move, in the same transaction.

    run:    (created starting: create_run; on PostgreSQL one handed over already paused is
            created paused with its sealed state: born_paused)
            starting (started over the API, claimed by a worker) -> paused | completed | failed
                                                                     | needs attention
            starting -> starting (claimed; a lapsed lease cleared by the reaper or claimed again)
            paused -> awaiting caller (a caller's run, all decided) -> paused (new tickets)
                                                                     | completed | failed | expired
            paused -> failed (its caller gave up)
            paused -> queued -> resuming -> completed | failed | needs attention | expired
                                        -> paused (new tickets) | queued (retry later)
            resuming -> resuming (a lapsed lease claimed again); paused -> expired;
            needs attention -> queued (a person resolved it; starting when it never paused)
                             | failed (a person stopped it)
    ticket: pending -> approved | rejected | expired | superseded
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.models import QuerySet, sql
from django.utils import timezone

from approvals.core import statements
from approvals.models import Run, RunStatus, Ticket, TicketStatus

RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.STARTING: frozenset(
        {
            RunStatus.STARTING,
            RunStatus.PAUSED,
            RunStatus.COMPLETED,
            RunStatus.FAILED,
            RunStatus.NEEDS_ATTENTION,
        }
    ),
    RunStatus.PAUSED: frozenset(
        {RunStatus.QUEUED, RunStatus.EXPIRED, RunStatus.AWAITING_CALLER, RunStatus.FAILED}
    ),
    RunStatus.AWAITING_CALLER: frozenset(
        {RunStatus.PAUSED, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.EXPIRED}
    ),
    RunStatus.QUEUED: frozenset({RunStatus.RESUMING}),
    RunStatus.RESUMING: frozenset(
        {
            RunStatus.RESUMING,
            RunStatus.PAUSED,
            RunStatus.QUEUED,
            RunStatus.COMPLETED,
            RunStatus.FAILED,
            RunStatus.NEEDS_ATTENTION,
            RunStatus.EXPIRED,
        }
    ),
    RunStatus.NEEDS_ATTENTION: frozenset({RunStatus.QUEUED, RunStatus.STARTING, RunStatus.FAILED}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.EXPIRED: frozenset(),
}

TICKET_TRANSITIONS: dict[str, frozenset[str]] = {
    TicketStatus.PENDING: frozenset(
        {
            TicketStatus.APPROVED,
            TicketStatus.REJECTED,
            TicketStatus.EXPIRED,
            TicketStatus.SUPERSEDED,
        }
    ),
    TicketStatus.APPROVED: frozenset(),
    TicketStatus.REJECTED: frozenset(),
    TicketStatus.EXPIRED: frozenset(),
    TicketStatus.SUPERSEDED: frozenset(),
}


class TransitionError(ValueError):
    """A move no state machine allows: a bug in the caller, never a user's mistake."""


def _sources(table: dict[str, frozenset[str]], to: str) -> list[str]:
    if to not in table:
        raise TransitionError(f"'{to}' is not a status")
    sources = [status for status, targets in table.items() if to in targets]
    if not sources:
        raise TransitionError(f"nothing moves to '{to}'")
    return sources


def _movable_runs(runs: QuerySet[Run], to: str) -> QuerySet[Run]:
    """The runs of the queryset whose status may move to `to`."""
    return runs.filter(status__in=_sources(RUN_TRANSITIONS, to))


def _movable_tickets(tickets: QuerySet[Ticket], to: str) -> QuerySet[Ticket]:
    """The tickets of the queryset whose status may move to `to` (pending ones)."""
    return tickets.filter(status__in=_sources(TICKET_TRANSITIONS, to))


# How a move is written: the UPDATE of the rows that may move, with the values (for move_runs
# and move_tickets), or its SQL with RETURNING (move_run_returning). The default is the plain
# statement; a caller whose move an audit event follows passes the chain's (audit.changes'
# update_queryset_holding_head, update_holding_head), which takes the chain head's lock in the
# same statement.
Update = Callable[..., int]
UpdateReturning = Callable[..., list[tuple]]
# Two UPDATEs, the second only of rows linked to those the first changed (end_run); returns how
# many rows each changed.
UpdatePair = Callable[..., tuple[int, int]]


def update_statement(queryset: QuerySet, **values) -> tuple[str, tuple]:
    """The SQL and parameters queryset.update(**values) would send, for a caller that sends
    it inside a statement of its own (RETURNING, a CTE)."""
    query = queryset.query.chain(sql.UpdateQuery)
    query.add_update_values(values)
    compiler = query.get_compiler(queryset.db)
    compiler.pre_sql_setup()
    return compiler.as_sql()


def _update(queryset: QuerySet, **values) -> int:
    return queryset.update(**values)


def _update_returning(sql: str, params, *, returning: str, using: str) -> list[tuple]:
    with connections[using].cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {returning}", params)
        return cursor.fetchall()


def update_pair(
    first: QuerySet,
    first_values: dict,
    then: QuerySet,
    then_values: dict,
    *,
    link: str,
    linked_to: str = "pk",
) -> tuple[int, int]:
    """first.update(**first_values), then, when it changed a row, then.update(**then_values).
    link names then's column that points at first's rows, linked_to the column of first's rows
    it holds (their pk unless named): a writer that sends both as one statement (audit.changes'
    update_pair_holding_head) confines then to the rows whose link is the linked_to of a row
    first changed; here then's queryset already names them."""
    moved = first.update(**first_values)
    return moved, then.update(**then_values) if moved else 0


def move_runs(runs: QuerySet[Run], *, to: str, write: Update = _update, **fields) -> int:
    """Move the runs of the queryset that may move to `to`; returns how many moved.

    Also sets `updated_at` (now, unless given) and any other field passed. write: how the
    UPDATE is sent (see Update).
    Raises TransitionError when no status may move to `to`.
    """
    fields.setdefault("updated_at", timezone.now())
    return write(_movable_runs(runs, to), status=to, **fields)


def move_run_returning(
    runs: QuerySet[Run], *, to: str, write: UpdateReturning = _update_returning, **fields
) -> Run | None:
    """move_runs() for at most one run, returning its row as the move left it, or None when it
    did not move: one UPDATE ... RETURNING instead of an UPDATE and a read (a worker's claim).
    write: how the statement is sent (see Update).

    Raises TransitionError as move_runs() does.
    """
    sql, params = move_run_statement(runs, to=to, **fields)
    return moved_run(sql, params, to=to, write=write, using=runs.db)


def move_run_statement(runs: QuerySet[Run], *, to: str, **fields) -> tuple[str, tuple]:
    """The UPDATE move_run_returning() sends (without its RETURNING) and its parameters, unsent:
    for a caller that writes it once per shape (core.statements) and sends it with moved_run().

    Raises TransitionError as move_runs() does.
    """
    fields.setdefault("updated_at", timezone.now())
    return update_statement(_movable_runs(runs, to), status=to, **fields)


def moved_run(
    sql: str, params, *, to: str, write: UpdateReturning = _update_returning, using: str
) -> Run | None:
    """Send move_run_statement()'s UPDATE with write, returning every column of the run: the
    run as the move left it, or None when none moved. Raises TransitionError when more than one
    moved."""
    rows = write(sql, params, returning=statements.returning(Run, using=using), using=using)
    if not rows:
        return None
    if len(rows) > 1:
        raise TransitionError(f"{len(rows)} runs moved to '{to}' where one was meant to")
    return statements.row_object(Run, rows[0], using=using)


def move_tickets(tickets: QuerySet[Ticket], *, to: str, write: Update = _update, **fields) -> int:
    """Move the tickets of the queryset that may move to `to` (pending ones); returns how many.

    write: as for move_runs().
    Raises TransitionError when no status may move to `to`.
    """
    return write(_movable_tickets(tickets, to), status=to, **fields)


def decide_ticket(
    tickets: QuerySet[Ticket],
    *,
    to: str,
    runs: QuerySet[Run],
    run_to: str,
    write: UpdatePair = update_pair,
    run_fields: dict | None = None,
    **fields,
) -> tuple[int, int]:
    """move_tickets() of `tickets` to a decision, then, if one moved, move_runs() of `runs` (the
    ticket's run, under the caller's conditions: execution.queue's rule that nothing else of
    its state is pending) to `run_to`, confined to the runs of the tickets that moved. Returns
    how many tickets and how many runs moved. write: how the two are sent (see UpdatePair);
    audit.changes' update_pair_holding_head sends them as one statement with the chain head's
    lock, last. Sent as one statement, the runs' conditions read the tickets as they were
    before it: a condition on the tickets must leave out the ones this decides.

    Raises TransitionError as move_runs() and move_tickets() do.
    """
    run_fields = {"updated_at": timezone.now(), **(run_fields or {})}
    return write(
        _movable_tickets(tickets, to),
        {"status": to, **fields},
        _movable_runs(runs, run_to),
        {"status": run_to, **run_fields},
        link="id",
        linked_to="run_id",
    )


def create_run(**fields) -> Run:
    """A new run, as every run the console starts is born: starting. One handed over already
    paused (pause_run, a caller's submission) moves on to paused in the same transaction, as a
    started run does, where born_paused() cannot write it paused at once (SQLite).
    Its INSERT is written once per shape (core.statements.bulk_create): no model signals."""
    (run,) = statements.bulk_create(
        "transitions.create_run", [Run(status=RunStatus.STARTING, **fields)]
    )
    return run


# The run table's sequence, by database alias: read once per process.
_run_sequences: dict[str, str] = {}


def reserve_run_id(using: str) -> int:
    """The id of a run about to be born paused (born_paused), read from the run table's own
    sequence on PostgreSQL: its state is sealed to its id before its row is written."""
    connection = connections[using]
    with connection.cursor() as cursor:
        sequence = _run_sequences.get(using)
        if sequence is None:
            cursor.execute(
                "SELECT pg_get_serial_sequence(%s, %s)",
                [connection.ops.quote_name(Run._meta.db_table), Run._meta.pk.column],
            )
            (sequence,) = cursor.fetchone()
            if sequence is None:
                raise TransitionError(
                    f"table {Run._meta.db_table}'s id has no sequence of its own (a restored "
                    "database whose id default is not owned by its column?): no run can be born "
                    "paused until `ALTER SEQUENCE ... OWNED BY` names it"
                )
            _run_sequences[using] = sequence
        cursor.execute("SELECT nextval(%s::regclass)", [sequence])
        (pk,) = cursor.fetchone()
    return pk


def born_paused(run: Run, *, using: str) -> tuple[str, tuple]:
    """The INSERT of a run handed over already paused with its state sealed (its id from
    reserve_run_id), unsent: for audit.changes.update_holding_head, which sends it with the
    lock of its tenant's audit head. The row is written once, paused, where create_run() and a
    move would write it twice. Written once per shape (core.statements.insert): no model
    signals. Raises TransitionError for a run that is not paused or has no id."""
    if run.status != RunStatus.PAUSED or run.pk is None:
        raise TransitionError("only a paused run with a reserved id is born paused")
    return statements.insert("transitions.born_paused", run, using=using)


def supersede_pending(run: Run) -> int:
    """The run ended: its tickets still pending can no longer be decided."""
    return move_tickets(Ticket.objects.filter(run=run), to=TicketStatus.SUPERSEDED)


def end_run(
    run: Run, runs: QuerySet[Run], *, to: str, write: UpdatePair = update_pair, **fields
) -> int:
    """move_runs() of `runs` (the run, as its holder still holds it) to an end status, then, if it
    moved, supersede_pending() of the run's tickets: the run's row first, then its tickets' (the
    order a decision locks them in). Returns how many runs moved. write: how the two are sent
    (see UpdatePair); audit.changes' update_pair_holding_head sends them as one statement that
    also takes the chain head's lock, last.

    Raises TransitionError as move_runs() does.
    """
    moved, _ = end_run_pair(run, runs, to=to, write=write, **fields)
    return moved


def end_run_pair(run: Run, runs: QuerySet[Run], *, to: str, write: Callable[..., Any], **fields):
    """end_run()'s two moves handed to write, and what write returns: for a writer that returns
    the statement unsent (audit.changes.pair_statement), to write it once per shape."""
    fields.setdefault("updated_at", timezone.now())
    pending = _movable_tickets(Ticket.objects.filter(run=run), TicketStatus.SUPERSEDED)
    return write(
        _movable_runs(runs, to),
        {"status": to, **fields},
        pending,
        {"status": TicketStatus.SUPERSEDED},
        link="run_id",
    )
