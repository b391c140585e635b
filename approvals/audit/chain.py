"""The append-only, hash-chained audit log.

Each tenant has its own chain: an event's hash is an HMAC-SHA256, under a key from the
environment (APPROVALS_AUDIT_KEYS, never the database), of the previous event's hash and the
event's own fields; the event records which key linked it. The tenant row keeps the head, so a
removed tail is found too (and a signed checkpoint outside the database finds a tail removed
with its head moved back: audit.checkpoints).

Events written before the chain had a key have no key id and plain SHA-256 links: they still
verify as they are, but once a tenant's chain has a keyed event, an unkeyed one after it is a
break.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Count, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from approvals import signals, transitions
from approvals.audit import actions
from approvals.core import signatures
from approvals.core.canonical import canonical_json
from approvals.core.redaction import redact
from approvals.models import AuditEvent, Tenant

GENESIS = "0" * 64
logger = logging.getLogger("approvals.audit")


def _event_payload(event: AuditEvent) -> str:
    return canonical_json(
        {
            "tenant": event.tenant_id,
            "seq": event.seq,
            "created_at": event.created_at.astimezone(UTC).isoformat(timespec="microseconds"),
            "actor": event.actor_id,
            "actor_name": event.actor_name,
            "action": event.action,
            "run": event.run_id,
            "ticket": event.ticket_id,
            "tool_name": event.tool_name,
            "arguments_digest": event.arguments_digest,
            "outcome": event.outcome,
            "detail": event.detail,
        }
    )


def event_hash(event: AuditEvent, *, prev_hash: str | None = None) -> str:
    """The event's link: HMAC-SHA256 under its key, or plain SHA-256 for an unkeyed event, of
    the previous event's hash and the event's contents.

    prev_hash defaults to the event's stored prev_hash; verification passes the hash it
    recomputed for the previous event instead, so it never trusts a stored link.
    Raises signatures.UnknownAuditKeyError when its key is not in APPROVALS_AUDIT_KEYS.
    """
    prev = event.prev_hash if prev_hash is None else prev_hash
    message = f"{prev}\n{_event_payload(event)}".encode()
    if not event.hash_key_id:
        return signatures.plain_link(message)
    return signatures.link(event.hash_key_id, message)


def append(**fields: Any) -> AuditEvent:
    """Append one event to the tenant's chain. Must run inside the caller's transaction.
    fields: new_event()'s (tenant_id and action, then who, what and the outcome).

    Side effects: locks the tenant row until the transaction ends, inserts the event and
    moves the tenant's chain head; on commit, sends signals.audit_event_committed. Inside
    atomic() the event is written when the block ends (its pk and link are set then).
    Raises actions.UnknownActionError for an action missing from the table, RuntimeError
    outside a transaction.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("audit.append must run inside a transaction")
    event = new_event(**fields)
    _write([event])
    return event


def new_event(
    *,
    tenant_id: int,
    action: str,
    actor=None,
    actor_name: str = "",
    run_id: int | None = None,
    ticket_id: int | None = None,
    tool_name: str = "",
    arguments_digest: str = "",
    outcome: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """The event append() would write, built (its action checked, its detail redacted, its
    time and key set) but neither linked nor written: for a statement that writes it with the
    change it records (update_holding_head, send_pair_holding_head).

    Raises actions.UnknownActionError for an action missing from the table.
    """
    actions.get(action)
    return AuditEvent(
        tenant_id=tenant_id,
        created_at=timezone.now(),
        actor_id=getattr(actor, "pk", None),
        actor_name=actor_name or (actor.get_username() if actor is not None else "system"),
        action=action,
        run_id=run_id,
        ticket_id=ticket_id,
        tool_name=tool_name,
        arguments_digest=arguments_digest,
        outcome=outcome,
        # Defence in depth: callers pass safe facts, and anything secret-shaped is masked.
        detail=redact(detail or {}),
        hash_key_id=signatures.audit_key_id(),
    )


def _write(events: Sequence[AuditEvent]) -> None:
    """Write built events (new_event) in order, as append() writes each: held back inside
    atomic(), else at once; each announced on commit."""
    for event in events:
        if not _held_back(event):
            if connection.vendor == "postgresql":
                _append_linked([event])
            else:
                _append_locked(event)
    _announce(events)


def _announce(events: Sequence[AuditEvent]) -> None:
    for event in events:
        signals.send_on_commit(signals.audit_event_committed, sender=AuditEvent, event=event)


def _link(event: AuditEvent, seq: int, head: str) -> None:
    event.seq = seq + 1
    event.prev_hash = head or GENESIS
    event.hash = event_hash(event)


def _append_locked(event: AuditEvent) -> None:
    """Lock the tenant row, read its head, insert the event, move the head: three statements."""
    tenant = (
        Tenant.objects.select_for_update().only("audit_seq", "audit_head").get(pk=event.tenant_id)
    )
    _link(event, tenant.audit_seq, tenant.audit_head)
    event.save(force_insert=True)
    Tenant.objects.filter(pk=event.tenant_id).update(audit_seq=event.seq, audit_head=event.hash)


# --- PostgreSQL: the event and its head in one statement ---------------------------------------
#
# The head moves only from the (seq, hash) the event was linked to, and the event is inserted
# only if it moved: one statement (a data-modifying CTE) whose UPDATE takes the tenant row's
# lock and re-checks the head under it. So the link is right whatever the connection guessed;
# a wrong guess inserts nothing and the event is linked again under an explicit lock.
#
# The guess is the head this connection last linked for the tenant, used only while its
# transaction holds the tenant's row (a decision's vote and approval, a pause's run and ticket
# events): always right then, one statement per event instead of three. A transaction's first
# event locks the row first (two statements): in a new transaction another process may have
# appended since.


def _guesses() -> dict[int, tuple[int, str, bool]]:
    guesses = getattr(connection, "_audit_heads", None)
    if guesses is None:
        guesses = connection._audit_heads = {}
    return guesses


def _released(tenant_id: int) -> None:
    entry = _guesses().get(tenant_id)
    if entry is not None:
        _guesses()[tenant_id] = (entry[0], entry[1], False)


def _holding(tenant_id: int, seq: int, head: str) -> None:
    _saw(tenant_id, seq, head)
    was = _guesses().get(tenant_id)
    _guesses()[tenant_id] = (seq, head, True)
    if was is None or not was[2]:
        # The lock ends with the transaction; a rolled-back one leaves the flag set, which only
        # costs one refused guess.
        transaction.on_commit(lambda: _released(tenant_id))


# The head this process last read or linked for each tenant, whichever thread or connection did:
# the guess with which a change and its events go in one statement (_with_events). Only a
# guess: the statement re-checks it under the tenant row's lock, and a wrong one (another
# process appended since, or a transaction that linked it rolled back) costs nothing more than
# the change and its events in two statements, as without a guess.
_seen: dict[int, tuple[int, str]] = {}
_seen_lock = threading.Lock()


def _saw(tenant_id: int, seq: int, head: str) -> None:
    # The latest sighting wins, even of a lower seq: a database restored or reset since.
    with _seen_lock:
        _seen[tenant_id] = (seq, head)


def _last_seen(tenant_id: int) -> tuple[int, str] | None:
    with _seen_lock:
        return _seen.get(tenant_id)


_INSERT_SQL: dict[int, str] = {}
_INSERT_PARTS: dict[int, tuple[str, str]] = {}
_INSERT_FIELDS: list = []


def _insert_parts(rows: int) -> tuple[str, str]:
    """The INSERT of `rows` events up to its FROM (`INSERT INTO ... SELECT events.*`), and the
    VALUES it selects from (`(VALUES ...) AS events`), with a parameter for each field of each
    event (_INSERT_FIELDS, in order)."""
    if rows not in _INSERT_PARTS:
        quote = connection.ops.quote_name
        fields = [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]
        row = "(" + ", ".join(f"%s::{f.db_type(connection)}" for f in fields) + ")"
        _INSERT_FIELDS[:] = fields
        _INSERT_PARTS[rows] = (
            f"INSERT INTO {quote(AuditEvent._meta.db_table)} "
            f"({', '.join(quote(f.column) for f in fields)}) SELECT events.*",
            f"(VALUES {', '.join([row] * rows)}) AS events",
        )
    return _INSERT_PARTS[rows]


def _insert_sql(rows: int) -> str:
    """The statement that moves the head and inserts `rows` events linked to it, or nothing."""
    if rows not in _INSERT_SQL:
        into, values = _insert_parts(rows)
        _INSERT_SQL[rows] = (
            f"WITH moved AS (UPDATE {connection.ops.quote_name(Tenant._meta.db_table)} "
            "SET audit_seq = %s, audit_head = %s "
            "WHERE id = %s AND audit_seq = %s AND audit_head = %s RETURNING id) "
            f"{into} FROM moved, {values} RETURNING id, seq"
        )
    return _INSERT_SQL[rows]


def _try_linked(events: list[AuditEvent], seq: int, head: str) -> bool:
    """Link the events (of one tenant, in order) after (seq, head) and write them with the head
    in one statement; False, having written nothing, when the head was not (seq, head)."""
    linked_seq, linked_head = seq, head
    for event in events:
        _link(event, linked_seq, linked_head)
        linked_seq, linked_head = event.seq, event.hash
    sql = _insert_sql(len(events))
    values = [
        f.get_db_prep_save(getattr(event, f.attname), connection)
        for event in events
        for f in _INSERT_FIELDS
    ]
    last = events[-1]
    with connection.cursor() as cursor:
        cursor.execute(sql, [last.seq, last.hash, last.tenant_id, seq, head, *values])
        rows = cursor.fetchall()
    if not rows:
        return False
    ids = {seq: pk for pk, seq in rows}
    for event in events:
        event.pk = ids[event.seq]
        event._state.adding = False
        event._state.db = connection.alias
    _holding(last.tenant_id, last.seq, last.hash)
    return True


def _append_linked(events: list[AuditEvent]) -> None:
    tenant_id = events[0].tenant_id
    guess = _guesses().get(tenant_id)
    if guess is not None and guess[2] and _try_linked(events, guess[0], guess[1]):
        return
    tenant = Tenant.objects.select_for_update().only("audit_seq", "audit_head").get(pk=tenant_id)
    if not _try_linked(events, tenant.audit_seq, tenant.audit_head):
        raise RuntimeError(f"tenant {tenant_id}'s audit head moved under its row lock")


# --- several events, one statement ------------------------------------------------------------
#
# A transaction that appends several events (a decision's and its run's; a pause's and its
# tickets') can write them together once it has done the rest: atomic() holds back the events
# appended at its own level and writes each tenant's in one statement when the block ends. An
# exception leaving the block rolls back the transaction (or savepoint) it opened, so events
# dropped with it were never anywhere else. An append inside a savepoint that transaction.atomic()
# opened within the block is written at once, and only while nothing is held back (a savepoint
# rolled back must take its own events, and only those, with it; the chain keeps the order of
# the appends). On SQLite every event is written when appended.


class _Batch:
    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.events: list[AuditEvent] = []


def _held_back(event: AuditEvent) -> bool:
    """Hold the event back for the open batch, if it may be: True when it was."""
    batch = getattr(connection, "_audit_batch", None)
    if batch is None:
        return False
    if len(connection.savepoint_ids) == batch.depth:
        batch.events.append(event)
        return True
    if batch.events:
        # Written now, it would go into the savepoint with those held back, or ahead of them.
        raise RuntimeError(
            "an audit event appended in a savepoint inside audit.chain.atomic() while others "
            "are held back; append it outside the savepoint"
        )
    return False


def _write_held_back(batch: _Batch) -> None:
    events, batch.events = batch.events, []
    for tenant_id in dict.fromkeys(e.tenant_id for e in events):
        _append_linked([e for e in events if e.tenant_id == tenant_id])


@contextmanager
def atomic() -> Iterator[None]:
    """transaction.atomic() whose audit events are written when the block ends, one statement
    per tenant (on PostgreSQL; elsewhere as appended). Events appended in the block have no pk
    and are not in the database until then. Inside another such block, that block's events
    are written first, and this one's savepoint holds back its own.
    """
    if connection.vendor != "postgresql":
        with transaction.atomic():
            yield
        return
    outer = getattr(connection, "_audit_batch", None)
    if outer is not None:
        _write_held_back(outer)
    with transaction.atomic():
        batch = connection._audit_batch = _Batch(len(connection.savepoint_ids))
        try:
            yield
            # A transaction marked for rollback (an error caught inside the block) rolls back
            # as the block ends, as transaction.atomic() does: its events go with it.
            if not connection.needs_rollback:
                _write_held_back(batch)
        finally:
            connection._audit_batch = outer


def update_holding_head(
    sql: str,
    params: Sequence[Any],
    *,
    returning: str,
    using: str = DEFAULT_DB_ALIAS,
    events: Sequence[AuditEvent] = (),
) -> list[tuple]:
    """Run sql, an UPDATE (without RETURNING) of a table with a tenant_id column, and return
    `returning` (SQL) of each row it changed.

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
        _write(events)
    return rows


def _update_holding_head_postgres(conn, sql: str, params: Sequence[Any], returning: str, events):
    tenants = conn.ops.quote_name(Tenant._meta.db_table)
    changed = f"WITH changed AS ({sql} RETURNING tenant_id AS audit_tenant, {returning}), "
    written = _with_events(conn, events, after="changed", before_lock="")
    if written is not None:
        ctes, extra = written
        with conn.cursor() as cursor:
            cursor.execute(
                f"{changed}{ctes} SELECT moved.id, moved.audit_seq, moved.audit_head, "
                "(SELECT array_agg(id ORDER BY seq) FROM linked), changed.* "
                "FROM changed LEFT JOIN moved ON moved.id = changed.audit_tenant",
                [*params, *extra],
            )
            rows = cursor.fetchall()
        if rows:
            # The events' tenant's row (moved names it); rows of another tenant, which the
            # changes of callers passing events never are, leave it NULL and unlocked.
            ours = [row for row in rows if row[0] is not None]
            _events_written(events, (ours or rows)[0][:4])
        return [row[5:] for row in rows]
    statement = (
        f"{changed}"
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
        _write(events)
    # Each row without the head and the changed row's tenant.
    return [row[4:] for row in rows]


def _hold_one(heads: set[tuple[Any, Any, Any]]) -> None:
    """Hold the head a statement read under its lock, when it read one tenant's: (tenant, seq,
    head), the tenant None when nothing was locked."""
    if len(heads) == 1:
        ((tenant_id, seq, head),) = heads
        if tenant_id is not None:
            _holding(tenant_id, seq, head)


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


def _with_events(conn, events: Sequence[AuditEvent], *, after: str, before_lock: str):
    """The CTEs `moved` and `linked` that write `events` after the change of CTE `after` (a
    CTE with an audit_tenant column), and their parameters; None when they cannot go in one
    statement (no events, no head seen, events held back in an open atomic(), several
    tenants). before_lock: a condition on no column of the tenant, checked before its row is
    locked (pair_statement's)."""
    if not events or getattr(conn, "_audit_batch", None) is not None:
        return None
    tenant_id = events[0].tenant_id
    guess = _last_seen(tenant_id)
    if guess is None or any(event.tenant_id != tenant_id for event in events):
        return None
    seq, head = guess
    linked_seq, linked_head = seq, head
    for event in events:
        _link(event, linked_seq, linked_head)
        linked_seq, linked_head = event.seq, event.hash
    into, values = _insert_parts(len(events))
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
            for f in _INSERT_FIELDS
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
        for event, pk in zip(events, ids, strict=True):
            event.pk = pk
            event._state.adding = False
            event._state.db = connection.alias
        _holding(tenant_id, seq, head)
    else:
        _holding(tenant_id, seq, head)
        if not _try_linked(list(events), seq, head):
            raise RuntimeError(f"tenant {tenant_id}'s audit head moved under its row lock")
    _announce(events)


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
        _write(events)
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
) -> tuple[str, list[Any]]:
    """The one PostgreSQL statement of update_pair_holding_head(), and its parameters, unsent:
    for a caller that writes it once per shape (core.statements) and sends it with
    send_pair_holding_head(). Its arguments are update_pair_holding_head()'s, so it also serves
    as a transitions.UpdatePair writer that returns the statement instead of running it."""
    first_sql, first_params = transitions.update_statement(first, **first_values)
    linked = then.filter(**{f"{link}__in": RawSQL("SELECT audit_linked FROM first_changed", ())})
    then_sql, then_params = transitions.update_statement(linked, **then_values)
    quote = connections[first.db].ops.quote_name
    meta = first.model._meta
    key = quote((meta.pk if linked_to == "pk" else meta.get_field(linked_to)).column)
    statement = (
        f"WITH first_changed AS ({first_sql} RETURNING {key} AS audit_linked, "
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
        ctes, extra = written
        with conn.cursor() as cursor:
            cursor.execute(
                f"{sql[: -len(head_part)]}{ctes} "
                "SELECT (SELECT count(*) FROM first_changed), (SELECT count(*) FROM then_changed), "
                "moved.id, moved.audit_seq, moved.audit_head, "
                "(SELECT array_agg(id ORDER BY seq) FROM linked) "
                "FROM (SELECT 1) AS one LEFT JOIN moved ON true",
                [*params, *extra],
            )
            ((first_count, then_count, *head_and_ids),) = cursor.fetchall()
        if first_count:
            _events_written(events, head_and_ids)
        return first_count, then_count
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    _hold_one({row[2:] for row in rows})
    if rows[0][0]:
        _write(events)
    return rows[0][0], rows[0][1]


def append_for_ticket(
    ticket,
    *,
    action: str,
    actor=None,
    actor_name: str = "",
    outcome: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """append() for an event about one ticket: its tenant, run, tool and argument digest."""
    return append(
        tenant_id=ticket.tenant_id,
        action=action,
        actor=actor,
        actor_name=actor_name,
        run_id=ticket.run_id,
        ticket_id=ticket.pk,
        tool_name=ticket.tool_name,
        arguments_digest=ticket.arguments_digest,
        outcome=outcome,
        detail=detail,
    )


def events_per_key() -> dict[str, int]:
    """How many audit events each key id linked, over all tenants ("" for unkeyed ones)."""
    rows = AuditEvent.objects.values_list("hash_key_id").annotate(n=Count("pk")).order_by()
    return dict(rows)


@dataclass(frozen=True)
class ChainReport:
    tenant_slug: str
    events: int
    ok: bool
    broken_seq: int | None = None
    broken_event_id: int | None = None
    reason: str = ""
    # Events linked before the chain had a key (plain SHA-256), among those read.
    unkeyed: int = 0


def verify_chain(tenant: Tenant, *, head: tuple[int, str] | None = None) -> ChainReport:
    """Recompute the tenant's chain from its first event to its recorded head.

    head=(seq, hash) checks the chain up to that event, against that head, instead of the
    tenant's (events appended meanwhile are left for the next check).
    """
    expected_prev = GENESIS
    expected_seq = 1
    count = 0
    unkeyed = 0
    keyed_seen = False

    def broken(seq: int, event_id: int | None, reason: str) -> ChainReport:
        return ChainReport(tenant.slug, count, False, seq, event_id, reason, unkeyed)

    events = AuditEvent.objects.filter(tenant=tenant).order_by("seq")
    if head is not None:
        events = events.filter(seq__lte=head[0])
    for event in events.iterator(chunk_size=2000):
        count += 1
        if event.seq != expected_seq:
            return broken(expected_seq, event.pk, f"event #{expected_seq} is missing")
        if event.prev_hash != expected_prev:
            return broken(event.seq, event.pk, "previous-hash link is broken")
        if event.hash_key_id:
            keyed_seen = True
        elif keyed_seen:
            return broken(event.seq, event.pk, "an unkeyed event after a keyed one")
        else:
            unkeyed += 1
        try:
            recomputed = event_hash(event, prev_hash=expected_prev)
        except signatures.UnknownAuditKeyError:
            reason = f"linked with key {event.hash_key_id!r}, which is not in APPROVALS_AUDIT_KEYS"
            return broken(event.seq, event.pk, reason)
        if recomputed != event.hash:
            return broken(event.seq, event.pk, "contents differ from their hash")
        expected_prev = event.hash
        expected_seq += 1
    if head is None:
        tenant.refresh_from_db(fields=["audit_seq", "audit_head"])
        head = (tenant.audit_seq, tenant.audit_head or GENESIS)
    if head[0] != expected_seq - 1:
        return broken(
            expected_seq, None, f"chain ends at #{expected_seq - 1} but the head says #{head[0]}"
        )
    if head[1] != expected_prev:
        return broken(head[0], None, f"the head's hash is not that of event #{head[0]}")
    return ChainReport(tenant.slug, count, True, unkeyed=unkeyed)
