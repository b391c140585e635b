"""A change and its events committed alone: one statement in autocommit, no BEGIN, no COMMIT
(update_alone, update_queryset_with_events, send_pair_with_events), for a change whose
transaction would hold nothing else. The statements themselves are audit.changes'.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, DataError, connections, transaction
from django.db.models import QuerySet

from approvals import transitions
from approvals.audit import chain
from approvals.audit.changes import (
    _ALWAYS_HELD,
    _PAIR_BEFORE_LOCK,
    _PAIR_HEAD,
    HEAD_AS_GUESSED,
    _changed,
    _send_pair_with_events,
    _stored,
    _with_events,
    send_pair_holding_head,
    update_queryset_holding_head,
)
from approvals.models import AuditEvent, Tenant

logger = logging.getLogger(__name__)

# A change whose transaction holds nothing else (a run's end, an effect's confirmation) needs no
# transaction of its own when it goes in one statement with its events: in autocommit the
# statement is its own transaction, so BEGIN and COMMIT, two round trips of three, go. Only if a
# wrong guess writes nothing at all. So the change's rows are changed only while the tenant's
# head, as the statement's snapshot reads it, is the guess (_precondition): a head that another
# writer moved before the statement began leaves everything as it was, and the statement names
# the head it read. A head moved by a writer whose event commits while the statement waits for
# the tenant's lock is seen only under that lock, where a statement that would change rows
# without writing their events fails instead (_guard), which undoes every part of it, and
# names the head it found. Either way the change is sent again linked to that head, and after
# a second miss in a transaction of its own, as update_holding_head() does.

# The precondition's answer, at the end of the statement's row: whether it held, and the head it
# read.
_PRE_COLUMNS = (
    "(SELECT held FROM audit_pre), (SELECT audit_seq FROM audit_pre), "
    "(SELECT audit_head FROM audit_pre)"
)


def _precondition(conn, tenant_id: int, guess: tuple[int, str]) -> tuple[str, list[Any]]:
    """The CTE audit_pre that says whether the tenant's head, in the statement's snapshot (no
    lock), is the guess, and what it is; with its parameters."""
    seq, head = guess
    return (
        "WITH audit_pre AS (SELECT audit_seq = %s AND audit_head = %s AS held, audit_seq, "
        f"audit_head FROM {conn.ops.quote_name(Tenant._meta.db_table)} WHERE id = %s), ",
        [seq, head, tenant_id],
    )


def _with_precondition(sql: str, params: Sequence[Any], pre) -> tuple[str, list[Any]]:
    """A statement written with _ALWAYS_HELD, with the precondition pre in its place."""
    if not sql.startswith(_ALWAYS_HELD):
        raise ValueError("not a statement written with a precondition (guarded)")
    pre_sql, pre_params = pre
    return pre_sql + sql[len(_ALWAYS_HELD) :], [*pre_params, *params]


@dataclass(frozen=True)
class _Moved:
    """A change sent alone whose precondition did not hold: nothing was written, and the head
    the statement read instead of its guess (None: the tenant has no row)."""

    head: tuple[int, str] | None


def _pre_answer(held, seq, head) -> _Moved | None:
    """_PRE_COLUMNS' answer: None when the precondition held, else the head it read."""
    if held:
        return None
    return _Moved(None if seq is None else (int(seq), head))


# The guard's text, in PostgreSQL's log as `ERROR: invalid input syntax for type integer: "..."`
# (docs/RELIABILITY.md): only when another writer's event committed while the statement waited
# for the tenant's lock.
_MISSED = "approvals audit head moved, nothing written, sent again at "
_MISSED_HEAD = re.compile(re.escape(_MISSED) + r"(\d+):([0-9a-f]*)")


def _guard(changed: str) -> str:
    """A column that fails its statement when `changed` (SQL) holds and no event was written:
    a cast of text that is no number, naming the head the statement found (_missed)."""
    return (
        f"CASE WHEN {changed} AND NOT EXISTS (SELECT 1 FROM linked) THEN "
        f"('{_MISSED}' || coalesce(moved.audit_seq::text, '') || ':' "
        "|| coalesce(moved.audit_head, ''))::integer END"
    )


def _missed(error: DataError) -> tuple[int, str] | None:
    """The head a guarded statement found instead of its guess, when error is its guard's."""
    found = _MISSED_HEAD.search(str(error))
    return (int(found[1]), found[2]) if found else None


def _alone(
    conn,
    events: Sequence[AuditEvent],
    send: Callable[[tuple[int, str], Any], Any],
    guess: tuple[int, str] | None = None,
) -> Any:
    """send(guess, pre) in autocommit, pre the precondition that the head is guess (the one
    given, else the one this process last saw), sent again once with the head a miss read
    (send's _Moved) or found (its guard's error); None when it may not (no events, several
    tenants, inside a transaction, not PostgreSQL, no head known, parameters bound by the
    client) or missed twice: the caller then sends the change in a transaction of its own.

    Bound by the client, a statement's values are in its text, and PostgreSQL logs the text of
    a statement that fails (log_min_error_statement): a guard's miss would put the change's
    values (an effect's result, a run's output) in the server's log. Bound by the server
    (config.env's prepared statements, the default) the log has $1, $2, ... instead."""
    if not events or not _may_go_alone(conn):
        return None
    tenant_id = events[0].tenant_id
    if any(event.tenant_id != tenant_id for event in events):
        return None
    guess = guess or chain._last_seen(tenant_id)
    for _ in range(2):
        if guess is None:
            return None
        try:
            sent = send(guess, _precondition(conn, tenant_id, guess))
        except DataError as error:
            if _MISSED not in str(error):
                raise
            # None when the statement locked no head of the events' tenant: the transaction
            # of its own says why.
            sent = _Moved(_missed(error))
        except DatabaseError:
            # A connection lost with the statement is dropped, as atomic() drops one whose
            # rollback failed: the caller's next statement (a task's failure, stored by the
            # task queue) then opens a fresh one instead of failing on the closed one.
            if not conn.is_usable():
                conn.close()
            raise
        if not isinstance(sent, _Moved):
            return sent
        guess = sent.head
        if guess is not None:
            chain._saw(tenant_id, *guess)
    return None


def _may_go_alone(conn) -> bool:
    """Whether a change may be sent alone on this connection (_alone's conditions but the
    events'): PostgreSQL, no transaction, parameters bound by the server."""
    return (
        conn.vendor == "postgresql"
        and not conn.in_atomic_block
        and conn.get_autocommit()
        and bool(conn.settings_dict["OPTIONS"].get("server_side_binding"))
    )


def _events_committed(conn, events: Sequence[AuditEvent], tenant_id, seq, head, ids) -> None:
    """After a guarded statement that changed rows and committed: its events were written with
    it (its guard fails it otherwise), and nothing is held."""
    if tenant_id is None or not ids:
        # Not reached (the guard), and the change has committed: said, not raised, so that
        # a caller does not take a stored change for a lost one.
        logger.error("tenant %s: a guarded change committed without its events", tenant_id)
        return
    _stored(conn, events, ids)
    chain._saw(tenant_id, seq, head)
    chain._announce(events)


def _send_update_alone(conn, sql: str, params, returning: str, written, pre):
    """update_alone()'s statement: sql (an UPDATE written with HEAD_AS_GUESSED), its events
    (written: _with_events') and the precondition pre, in one statement, which fails when it
    would change rows without its events (_guard). Each changed row as (tenant, seq, head,
    event ids, *returning), or _Moved when the precondition did not hold (nothing changed)."""
    ctes, extra = written
    pre_sql, pre_params = pre
    with conn.cursor() as cursor:
        cursor.execute(
            f"{pre_sql}{_changed(sql, returning)[len('WITH ') :]}{ctes} "
            "SELECT moved.id, moved.audit_seq, moved.audit_head, "
            "(SELECT array_agg(id ORDER BY seq) FROM linked), "
            f"{_guard('changed.audit_tenant IS NOT NULL')}, "
            "audit_pre.held, audit_pre.audit_seq, audit_pre.audit_head, changed.* "
            # A row even when nothing changed: the precondition's answer.
            "FROM audit_pre LEFT JOIN (changed LEFT JOIN moved "
            "ON moved.id = changed.audit_tenant) ON true",
            [*pre_params, *params, *extra],
        )
        rows = cursor.fetchall()
    if not rows:
        return _Moved(None)
    changed = [(*row[:4], *row[9:]) for row in rows if row[8] is not None]
    if not changed:
        return _pre_answer(*rows[0][5:8]) or []
    return changed


def update_alone(
    sql: str,
    params: Sequence[Any],
    *,
    returning: str,
    events: Sequence[AuditEvent],
    using: str = DEFAULT_DB_ALIAS,
    guess: tuple[int, str] | None = None,
) -> list[tuple] | None:
    """sql, an UPDATE of rows of the events' tenant written with the condition HEAD_AS_GUESSED,
    and the events that record it, in one statement committed alone (_alone): `returning`
    (SQL) of each row it changed, its events written with it; [] when it changed none (the head
    was the guess: nothing else stopped it), and nothing written. None when it was not sent or
    missed twice: nothing is written, and the caller sends the change in a transaction of its
    own. guess: the tenant's head as the caller last read it (else as this process last saw
    it), the events' first guess."""
    conn = connections[using]
    if not sql.startswith("UPDATE "):
        raise ValueError("not an UPDATE")

    def send(guess: tuple[int, str], pre) -> list[tuple] | _Moved:
        written = _with_events(conn, events, after="changed", guess=guess)
        rows = _send_update_alone(conn, sql, params, returning, written, pre)
        if isinstance(rows, _Moved):
            return rows
        if rows:
            ours = [row for row in rows if row[0] is not None]
            _events_committed(conn, events, *(ours or rows)[0][:4])
        return [row[4:] for row in rows]

    return _alone(conn, events, send, guess)


def update_queryset_with_events(
    queryset: QuerySet, *, events: Sequence[AuditEvent], **values: Any
) -> int:
    """update_queryset_holding_head() anywhere: how many rows changed. The change and its
    events commit together or not at all. Outside a transaction on PostgreSQL, one statement in
    autocommit (no BEGIN, no COMMIT), sent again once when the head had moved (update_alone);
    else in a transaction of its own. Inside one, part of it (update_queryset_holding_head())."""
    conn = connections[queryset.db]
    rows = None
    if _may_go_alone(conn):
        update_sql, params = transitions.update_statement(
            queryset.filter(HEAD_AS_GUESSED), **values
        )
        rows = update_alone(update_sql, params, returning="1", events=events, using=queryset.db)
    if rows is None:
        with transaction.atomic(using=queryset.db):
            return update_queryset_holding_head(queryset, events=events, **values)
    return len(rows)


def send_pair_with_events(
    sql: str,
    params: Sequence[Any],
    *,
    using: str = DEFAULT_DB_ALIAS,
    events: Sequence[AuditEvent],
) -> tuple[int, int]:
    """send_pair_holding_head() anywhere, as update_queryset_with_events() sends its change:
    how many rows each part changed. sql: a statement of pair_statement(guarded=True)."""
    conn = connections[using]
    head_part = _PAIR_HEAD.format(tenants=conn.ops.quote_name(Tenant._meta.db_table))
    if not sql.endswith(head_part) or not sql.startswith(_ALWAYS_HELD):
        raise ValueError("not a statement of pair_statement(guarded=True)")

    def send(guess: tuple[int, str], pre) -> tuple[int, int] | _Moved:
        written = _with_events(
            conn, events, after="first_changed", before_lock=_PAIR_BEFORE_LOCK, guess=guess
        )
        pair_sql, pair_params = _with_precondition(sql[: -len(head_part)], params, pre)
        first_count, then_count, *head_and_ids, _, held, seq, head = _send_pair_with_events(
            conn,
            pair_sql,
            pair_params,
            written,
            columns=f", {_guard('EXISTS (SELECT 1 FROM first_changed)')}, {_PRE_COLUMNS}",
        )
        if first_count:
            _events_committed(conn, events, *head_and_ids)
            return first_count, then_count
        return _pre_answer(held, seq, head) or (first_count, then_count)

    counts = _alone(conn, events, send)
    if counts is None:
        with transaction.atomic(using=using):
            counts = send_pair_holding_head(sql, params, using=using, events=events)
    return counts
