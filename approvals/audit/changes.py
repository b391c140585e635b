"""A change and the chain's head in one statement: an UPDATE (or a pair of them, or an INSERT)
that also locks its rows' tenant and reads its audit head, so the transaction's next event is one
statement (audit.chain's guesses); or that also writes the events which record it, when the head
is where this process last saw it. Sending such a statement alone, in autocommit, is
audit.alone; the chain itself (linking, appending, verifying) is audit.chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import BooleanField, QuerySet
from django.db.models.expressions import RawSQL

from approvals import transitions
from approvals.audit import chain
from approvals.models import AuditEvent, Tenant


def update_holding_head(
    sql: str,
    params: Sequence[Any],
    *,
    returning: str,
    using: str = DEFAULT_DB_ALIAS,
    events: Sequence[AuditEvent] = (),
) -> list[tuple]:
    """Run sql, an UPDATE (without RETURNING) of a table with a tenant_id column, or an INSERT
    into one (transitions.born_paused), and return `returning` (SQL) of each row it changed or
    inserted.

    On PostgreSQL the same statement also locks the changed rows' tenant row and reads its
    audit head, as append() would before its first event (a data-modifying CTE, whose SELECT
    ... FOR UPDATE waits for the lock and reads the head as it then is). The transaction's next
    append() for that tenant then links its event to that head in one statement: an update
    that an audit event follows costs two statements, not three. Nothing is locked when no row
    changed. Elsewhere it is the UPDATE ... RETURNING alone.

    events: built events (new_event) of the changed rows' tenant, which record the change:
    written after it when it changed a row, and only then (nothing is written when it changed
    none). On PostgreSQL, when the head is where this process last saw it, in the same
    statement: one statement for the change and its events (see _with_events), which locks
    the events' tenant only: give events only with a change of that tenant's rows.

    Raises RuntimeError outside a transaction (the lock would end with the statement).
    """
    conn = connections[using]
    if not conn.in_atomic_block:
        raise RuntimeError("update_holding_head must run inside a transaction")
    if conn.vendor == "postgresql":
        return _update_holding_head_postgres(conn, sql, params, returning, events)
    with conn.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {returning}", params)
        rows = cursor.fetchall()
    if rows:
        chain._write(events)
    return rows


def _update_holding_head_postgres(conn, sql: str, params: Sequence[Any], returning: str, events):
    tenants = conn.ops.quote_name(Tenant._meta.db_table)
    written = _with_events(conn, events, after="changed")
    if written is not None:
        rows = _send_update_with_events(conn, sql, params, returning, written)
        if rows:
            # The events' tenant's row (moved names it); rows of another tenant, which the
            # changes of callers passing events never are, leave it NULL and unlocked.
            ours = [row for row in rows if row[0] is not None]
            _events_written(events, (ours or rows)[0][:4])
        return [row[6:] for row in rows]
    statement = (
        f"{_changed(sql, returning)}"
        f"head AS (SELECT id, audit_seq, audit_head FROM {tenants} "
        "WHERE id IN (SELECT audit_tenant FROM changed) ORDER BY id FOR UPDATE) "
        "SELECT head.id, head.audit_seq, head.audit_head, changed.* "
        "FROM changed LEFT JOIN head ON head.id = changed.audit_tenant"
    )
    with conn.cursor() as cursor:
        cursor.execute(statement, params)
        rows = cursor.fetchall()
    _hold_one({row[:3] for row in rows})
    if rows:
        chain._write(events)
    # Each row without the head and the changed row's tenant.
    return [row[4:] for row in rows]


def _changed(sql: str, returning: str) -> str:
    return f"WITH changed AS ({sql} RETURNING tenant_id AS audit_tenant, {returning}), "


def _send_update_with_events(conn, sql, params, returning: str, written):
    """update_holding_head()'s change of sql and its events (written: _with_events'), in one
    statement; each changed row as (tenant, seq, head, event ids, NULL, *returning)."""
    ctes, extra = written
    with conn.cursor() as cursor:
        cursor.execute(
            f"{_changed(sql, returning)}{ctes} SELECT moved.id, moved.audit_seq, "
            "moved.audit_head, (SELECT array_agg(id ORDER BY seq) FROM linked), NULL, changed.* "
            "FROM changed LEFT JOIN moved ON moved.id = changed.audit_tenant",
            [*params, *extra],
        )
        return cursor.fetchall()


def _hold_one(heads: set[tuple[Any, Any, Any]]) -> None:
    """Hold the head a statement read under its lock, when it read one tenant's: (tenant, seq,
    head), the tenant None when nothing was locked."""
    if len(heads) == 1:
        ((tenant_id, seq, head),) = heads
        if tenant_id is not None:
            chain._holding(tenant_id, seq, head)


# --- a change and its events in one statement --------------------------------------------------
#
# A change that an event records (a run's end, an effect's confirmation) takes the tenant's
# head lock in its own statement (above), and the event is one more. When this process last saw
# the head at (seq, hash), the events are linked to it beforehand and go in the change's own
# statement: its `moved` CTE updates the tenant row (which takes its lock, after the change's
# rows) and moves the head only if it still is (seq, hash), as _insert_sql's does, and `linked`
# inserts the events only if it did. Either way the row is locked and `moved` returns the head
# as it now is: a wrong guess writes no event, and the events are linked to the head it returned
# in one more statement, as without a guess. The chain is linked under the lock in both cases.


def _with_events(
    conn,
    events: Sequence[AuditEvent],
    *,
    after: str,
    before_lock: str = "",
    guess: tuple[int, str] | None = None,
):
    """The CTEs `moved` and `linked` that write `events` after the change of CTE `after` (a
    CTE with an audit_tenant column), and their parameters; None when they cannot go in one
    statement (no events, no head seen, events held back in an open atomic(), several
    tenants). before_lock: a condition on no column of the tenant, checked before its row is
    locked (pair_statement's). guess: the head to link the events to, else the one this process
    last saw."""
    if not events or getattr(conn, "_audit_batch", None) is not None:
        return None
    tenant_id = events[0].tenant_id
    guess = guess or chain._last_seen(tenant_id)
    if guess is None or any(event.tenant_id != tenant_id for event in events):
        return None
    seq, head = guess
    linked_seq, linked_head = seq, head
    for event in events:
        chain._link(event, linked_seq, linked_head)
        linked_seq, linked_head = event.seq, event.hash
    into, values = chain._insert_parts(len(events))
    quote = conn.ops.quote_name
    ctes = (
        f"moved AS (UPDATE {quote(Tenant._meta.db_table)} SET "
        "audit_seq = CASE WHEN audit_seq = %s AND audit_head = %s THEN %s ELSE audit_seq END, "
        "audit_head = CASE WHEN audit_seq = %s AND audit_head = %s THEN %s ELSE audit_head END "
        f"WHERE id = %s AND id IN (SELECT audit_tenant FROM {after}){before_lock} "
        "RETURNING id, audit_seq, audit_head), "
        f"linked AS ({into} FROM moved, {values} "
        "WHERE moved.audit_seq = %s AND moved.audit_head = %s RETURNING id, seq)"
    )
    extra = [
        *(seq, head, linked_seq),
        *(seq, head, linked_head),
        tenant_id,
        *(
            f.get_db_prep_save(getattr(event, f.attname), conn)
            for event in events
            for f in chain._INSERT_FIELDS
        ),
        linked_seq,
        linked_head,
    ]
    return ctes, extra


def _events_written(events: Sequence[AuditEvent], head_and_ids: Sequence[Any]) -> None:
    """After a statement of _with_events that changed something: (tenant, seq, head) is the
    tenant's head as the statement left it (locked) and ids the events it inserted (None when
    the head was not the guess: they are linked to that head and written now)."""
    tenant_id, seq, head, ids = head_and_ids
    if tenant_id is None:
        raise RuntimeError(f"tenant {events[0].tenant_id}'s head was not locked with the change")
    if ids:
        _stored(connection, events, ids)
        chain._holding(tenant_id, seq, head)
    else:
        chain._holding(tenant_id, seq, head)
        if not chain._try_linked(list(events), seq, head):
            raise RuntimeError(f"tenant {tenant_id}'s audit head moved under its row lock")
    chain._announce(events)


def update_queryset_holding_head(
    queryset: QuerySet, *, events: Sequence[AuditEvent] = (), **values: Any
) -> int:
    """queryset.update(**values) through update_holding_head(), with its events: how many rows
    changed."""
    update_sql, params = transitions.update_statement(queryset, **values)
    return len(
        update_holding_head(update_sql, params, returning="1", using=queryset.db, events=events)
    )


def update_pair_holding_head(
    first: QuerySet,
    first_values: dict,
    then: QuerySet,
    then_values: dict,
    *,
    link: str,
    linked_to: str = "pk",
    events: Sequence[AuditEvent] = (),
) -> tuple[int, int]:
    """transitions.update_pair(): first.update(**first_values), then then.update(**then_values)
    confined to the rows whose `link` column holds the `linked_to` column (the pk unless named)
    of a row first changed; how many rows each changed. Both read the rows as they were before
    the statement: then's conditions do not see what first changes.

    On PostgreSQL one statement, which also locks the tenant row of the rows first changed and
    reads its audit head, as update_holding_head() does: the rows first changes are locked
    first, then then's (it reads first's changed rows, so it cannot run ahead of them), then the
    tenant's (its lock waits until every row of then is changed). The transaction's next
    append() for that tenant is then one statement. Nothing is locked or changed by then when
    first changed nothing. Elsewhere transitions.update_pair() itself. events: as
    update_holding_head's, written when first changed a row.

    Raises RuntimeError outside a transaction (the lock would end with the statement).
    """
    conn = connections[first.db]
    if not conn.in_atomic_block:
        raise RuntimeError("update_pair_holding_head must run inside a transaction")
    if conn.vendor == "postgresql":
        sql, params = pair_statement(
            first, first_values, then, then_values, link=link, linked_to=linked_to
        )
        return send_pair_holding_head(sql, params, using=first.db, events=events)
    counts = transitions.update_pair(
        first, first_values, then, then_values, link=link, linked_to=linked_to
    )
    if counts[0]:
        chain._write(events)
    return counts


# pair_statement()'s lock of the head and its answer: the last part of its statement, which
# send_pair_holding_head() replaces when it writes events with the change.
_PAIR_BEFORE_LOCK = " AND (SELECT count(*) FROM then_changed) >= 0"
_PAIR_HEAD = (
    "head AS (SELECT id, audit_seq, audit_head FROM {tenants} "
    "WHERE id IN (SELECT audit_tenant FROM first_changed)"
    # A condition on no column of the tenant, so checked once before its rows are read:
    # then's rows are all changed (and locked) before the tenant's is locked.
    f"{_PAIR_BEFORE_LOCK} "
    "ORDER BY id FOR UPDATE) "
    "SELECT (SELECT count(*) FROM first_changed), (SELECT count(*) FROM then_changed), "
    "head.id, head.audit_seq, head.audit_head "
    "FROM (SELECT 1) AS one LEFT JOIN head ON true"
)


def pair_statement(
    first: QuerySet,
    first_values: dict,
    then: QuerySet,
    then_values: dict,
    *,
    link: str,
    linked_to: str = "pk",
    guarded: bool = False,
) -> tuple[str, list[Any]]:
    """The one PostgreSQL statement of update_pair_holding_head(), and its parameters, unsent:
    for a caller that writes it once per shape (core.statements) and sends it with
    send_pair_holding_head(). Its arguments are update_pair_holding_head()'s, so it also serves
    as a transitions.UpdatePair writer that returns the statement instead of running it.

    guarded: a statement that audit.alone.send_pair_with_events() may also send alone, whose
    first update changes rows only while the tenant's head is the events' guess (its
    precondition); sent in a transaction, as written, it holds always."""
    if guarded:
        first = first.filter(HEAD_AS_GUESSED)
    first_sql, first_params = transitions.update_statement(first, **first_values)
    linked = then.filter(**{f"{link}__in": RawSQL("SELECT audit_linked FROM first_changed", ())})
    then_sql, then_params = transitions.update_statement(linked, **then_values)
    quote = connections[first.db].ops.quote_name
    meta = first.model._meta
    key = quote((meta.pk if linked_to == "pk" else meta.get_field(linked_to)).column)
    statement = (
        f"{_ALWAYS_HELD if guarded else 'WITH '}"
        f"first_changed AS ({first_sql} RETURNING {key} AS audit_linked, "
        "tenant_id AS audit_tenant), "
        f"then_changed AS ({then_sql} RETURNING 1), "
        + _PAIR_HEAD.format(tenants=quote(Tenant._meta.db_table))
    )
    return statement, [*first_params, *then_params]


def send_pair_holding_head(
    sql: str,
    params: Sequence[Any],
    *,
    using: str = DEFAULT_DB_ALIAS,
    events: Sequence[AuditEvent] = (),
) -> tuple[int, int]:
    """Send pair_statement()'s statement, on PostgreSQL inside a transaction, and hold the
    tenant's audit head it read (update_pair_holding_head()); how many rows each part changed.
    events: as update_holding_head's, written when first changed a row (in the same statement
    when the head is where this process last saw it)."""
    conn = connections[using]
    if not conn.in_atomic_block:
        raise RuntimeError("send_pair_holding_head must run inside a transaction")
    head_part = _PAIR_HEAD.format(tenants=conn.ops.quote_name(Tenant._meta.db_table))
    if not sql.endswith(head_part):
        raise ValueError("not a statement of pair_statement()")
    written = _with_events(conn, events, after="first_changed", before_lock=_PAIR_BEFORE_LOCK)
    if written is not None:
        first_count, then_count, *head_and_ids = _send_pair_with_events(
            conn, sql[: -len(head_part)], params, written
        )
        if first_count:
            _events_written(events, head_and_ids)
        return first_count, then_count
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    _hold_one({row[2:] for row in rows})
    if rows[0][0]:
        chain._write(events)
    return rows[0][0], rows[0][1]


def _send_pair_with_events(conn, pair_sql: str, params, written, *, columns: str = "") -> tuple:
    """pair_statement()'s statement up to its head (pair_sql) with the events (written:
    _with_events'), sent: (first's count, then's count, tenant, seq, head, event ids, and the
    values of `columns`, SQL the row ends with: audit.alone's guard and precondition)."""
    ctes, extra = written
    with conn.cursor() as cursor:
        cursor.execute(
            f"{pair_sql}{ctes} "
            "SELECT (SELECT count(*) FROM first_changed), (SELECT count(*) FROM then_changed), "
            "moved.id, moved.audit_seq, moved.audit_head, "
            f"(SELECT array_agg(id ORDER BY seq) FROM linked){columns} "
            "FROM (SELECT 1) AS one LEFT JOIN moved ON true",
            [*params, *extra],
        )
        ((*row,),) = cursor.fetchall()
    return tuple(row)


# The precondition of a statement that audit.alone may send alone (pair_statement(guarded=True)),
# as it is written and as a transaction sends it: the tenant's head always counts as the guess
# there (the events are linked under the lock). Sent alone, audit.alone's real one takes its
# place.
_ALWAYS_HELD = (
    "WITH audit_pre AS (SELECT true AS held, NULL::bigint AS audit_seq, "
    "NULL::varchar AS audit_head), "
)
# The condition on the change's rows: the precondition holds.
HEAD_AS_GUESSED = RawSQL(
    "EXISTS (SELECT 1 FROM audit_pre WHERE audit_pre.held)", (), BooleanField()
)


def _stored(conn, events: Sequence[AuditEvent], ids: Sequence[int]) -> None:
    """The events are rows now: their pks, in order."""
    for event, pk in zip(events, ids, strict=True):
        event.pk = pk
        event._state.adding = False
        event._state.db = conn.alias
