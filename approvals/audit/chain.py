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
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from approvals import signals
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
    change it records (audit.changes: update_holding_head, send_pair_holding_head).

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
        # Each value cast to its column's type without a length: an explicit cast to
        # varchar(n) would cut an overlong value short (its hash covering the whole), where
        # the column's own check refuses it.
        row = "(" + ", ".join(f"%s::{_unsized(f.db_type(connection))}" for f in fields) + ")"
        _INSERT_FIELDS[:] = fields
        _INSERT_PARTS[rows] = (
            f"INSERT INTO {quote(AuditEvent._meta.db_table)} "
            f"({', '.join(quote(f.column) for f in fields)}) SELECT events.*",
            f"(VALUES {', '.join([row] * rows)}) AS events",
        )
    return _INSERT_PARTS[rows]


def _unsized(db_type: str) -> str:
    return re.sub(r"^varchar\(\d+\)$", "varchar", db_type)


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
