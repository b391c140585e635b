"""Appending on PostgreSQL: the event and the chain head in one statement, guessed from the head
this transaction already holds, and linked right whatever the guess."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import DataError, IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals import signals, transitions
from approvals.audit import alone, changes
from approvals.audit import chain as audit
from approvals.models import AuditEvent, Run, Tenant, Ticket, TicketStatus
from devtools.bench import queries
from tests.support import TenantFactory, paused_run, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES_ONLY = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the one-statement append"
)


def _statements(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT", "ROLLBACK")]


def _append(tenant, outcome: str):
    return audit.append(tenant_id=tenant.pk, action="run.paused", outcome=outcome)


@POSTGRES_ONLY
def test_two_events_of_one_transaction_cost_three_statements():
    tenant = TenantFactory(slug="acme")

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        _append(tenant, "first")
        _append(tenant, "second")

    # The lock and the first event with the head; the second event with the head.
    assert len(_statements(queries.captured_queries)) == 3
    assert audit.verify_chain(tenant).ok


def test_a_wrong_guess_links_the_event_to_the_real_head():
    tenant = TenantFactory(slug="acme")
    with transaction.atomic():
        _append(tenant, "first")
        guesses = getattr(connection, "_audit_heads", {})
        if tenant.pk in guesses:
            # As if this transaction held a head that another writer has since moved on.
            guesses[tenant.pk] = (0, "f" * 64, True)
        second = _append(tenant, "second")

    first = AuditEvent.objects.get(tenant=tenant, seq=1)
    assert (second.seq, second.prev_hash) == (2, first.hash)
    tenant.refresh_from_db()
    assert (tenant.audit_seq, tenant.audit_head) == (2, second.hash)
    assert audit.verify_chain(tenant).ok


def test_a_guess_from_a_rolled_back_transaction_is_never_used_as_the_head():
    tenant = TenantFactory(slug="acme")
    with transaction.atomic():
        _append(tenant, "kept")
    with pytest.raises(RuntimeError), transaction.atomic():
        _append(tenant, "rolled back")
        raise RuntimeError("the caller gave up")

    after = _append_in_transaction(tenant, "after")

    kept = AuditEvent.objects.get(tenant=tenant, seq=1)
    assert (after.seq, after.prev_hash) == (2, kept.hash)
    assert list(AuditEvent.objects.filter(tenant=tenant).values_list("outcome", flat=True)) == [
        "kept",
        "after",
    ]
    assert audit.verify_chain(tenant).ok


def test_another_writer_between_transactions_is_seen():
    tenant = TenantFactory(slug="acme")
    _append_in_transaction(tenant, "mine")
    # Another process appended meanwhile (its event and head, as it would have written them).
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        other = AuditEvent(
            tenant=tenant, action="run.paused", outcome="theirs", actor_name="system"
        )
        other.created_at = AuditEvent.objects.get(tenant=tenant, seq=1).created_at
        other.seq, other.prev_hash = locked.audit_seq + 1, locked.audit_head
        other.hash_key_id = AuditEvent.objects.get(tenant=tenant, seq=1).hash_key_id
        other.hash = audit.event_hash(other)
        other.save(force_insert=True)
        Tenant.objects.filter(pk=tenant.pk).update(audit_seq=other.seq, audit_head=other.hash)

    mine = _append_in_transaction(tenant, "mine again")

    assert (mine.seq, mine.prev_hash) == (3, other.hash)
    assert audit.verify_chain(tenant).ok


def _append_in_transaction(tenant, outcome: str):
    with transaction.atomic():
        return _append(tenant, outcome)


# Text cast to varchar without its length: the column refuses an overlong value, where a cast
# to varchar(n) would cut it short.
ROW = (
    "(%s::bigint, %s::bigint, %s::timestamp with time zone, %s::integer, "
    "%s::varchar, %s::varchar, %s::bigint, %s::bigint, %s::varchar, "
    "%s::varchar, %s::varchar, %s::jsonb, %s::varchar, %s::varchar, "
    "%s::varchar)"
)


@POSTGRES_ONLY
@pytest.mark.parametrize("rows", [1, 3])
def test_the_append_statement_known_answer(monkeypatch, rows):
    # Built once a process for each number of rows and kept: build it afresh here, as a new
    # worker does.
    monkeypatch.setattr(audit, "_INSERT_SQL", {})
    monkeypatch.setattr(audit, "_INSERT_PARTS", {})
    monkeypatch.setattr(audit, "_INSERT_FIELDS", [])

    sql = audit._insert_sql(rows)

    assert sql == (
        'WITH moved AS (UPDATE "approvals_tenant" SET audit_seq = %s, audit_head = %s '
        "WHERE id = %s AND audit_seq = %s AND audit_head = %s RETURNING id) "
        'INSERT INTO "approvals_auditevent" ("tenant_id", "seq", "created_at", "actor_id", '
        '"actor_name", "action", "run_id", "ticket_id", "tool_name", "arguments_digest", '
        '"outcome", "detail", "prev_hash", "hash", "hash_key_id") '
        f"SELECT events.* FROM moved, (VALUES {', '.join([ROW] * rows)}) AS events "
        "RETURNING id, seq"
    )
    assert [f.attname for f in audit._INSERT_FIELDS] == [
        f.attname for f in AuditEvent._meta.concrete_fields if not f.primary_key
    ]
    assert audit._insert_sql(rows) is sql
    assert audit._insert_sql(rows + 1) != sql


def test_an_appended_event_is_a_stored_row_of_this_database():
    tenant = TenantFactory(slug="acme")

    event = _append_in_transaction(tenant, "stored")

    assert (event._state.adding, event._state.db) == (False, connection.alias)
    assert event.pk == AuditEvent.objects.get(tenant=tenant, seq=1).pk


@POSTGRES_ONLY
def test_a_head_that_moved_under_the_row_lock_is_an_error_naming_the_tenant(monkeypatch):
    tenant = TenantFactory(slug="acme")
    # As if another writer moved the head without the tenant's row lock.
    monkeypatch.setattr(audit, "_try_linked", lambda events, seq, head: False)

    with pytest.raises(RuntimeError) as raised, transaction.atomic():
        _append(tenant, "lost")

    assert str(raised.value) == f"tenant {tenant.pk}'s audit head moved under its row lock"


# --- an update that takes the head's lock for the event that follows it -----------------------


def _hold_and_append(run, outcome: str) -> tuple[int, list[str]]:
    """Move the run's title with update_queryset_holding_head, then append: (rows, statements)."""
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        changed = changes.update_queryset_holding_head(Run.objects.filter(pk=run.pk), title=outcome)
        _append(run.tenant, outcome)
    return changed, _statements(queries.captured_queries)


def _locked_elsewhere(tenant) -> bool:
    """Whether another connection finds the tenant's row locked."""
    return _row_locked("approvals_tenant", tenant.pk)


def _row_locked(table: str, pk: int) -> bool:
    """Whether another connection finds the row locked."""
    other = psycopg.connect(**connection.get_connection_params())
    try:
        other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE NOWAIT", [pk])
        return False
    except psycopg.errors.LockNotAvailable:
        return True
    finally:
        other.close()


@POSTGRES_ONLY
def test_an_update_holding_the_head_makes_the_next_event_one_statement():
    tenant = TenantFactory(slug="acme")
    _append_in_transaction(tenant, "before")
    run = paused_run(tenant)

    changed, statements = _hold_and_append(run, "held")

    # The update with the lock and the head; the event with the head. Without the hold the
    # event would have locked the row first: three statements.
    assert changed == 1
    assert len(statements) == 2, statements
    assert statements[0].startswith("WITH changed AS (UPDATE")
    run.refresh_from_db()
    assert run.title == "held"
    last = AuditEvent.objects.filter(tenant=tenant).order_by("-seq").first()
    assert (last.outcome, last.prev_hash) == (
        "held",
        AuditEvent.objects.get(tenant=tenant, seq=last.seq - 1).hash,
    )
    assert audit.verify_chain(tenant).ok


@POSTGRES_ONLY
def test_an_update_holding_the_head_holds_the_tenants_row_until_the_transaction_ends():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    with transaction.atomic():
        changes.update_queryset_holding_head(Run.objects.filter(pk=run.pk), title="held")
        assert _locked_elsewhere(tenant)
    assert not _locked_elsewhere(tenant)


@POSTGRES_ONLY
def test_an_update_that_changes_nothing_locks_nothing_and_holds_no_head():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    head = Tenant.objects.values_list("audit_seq", flat=True).get(pk=tenant.pk)

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        changed = changes.update_queryset_holding_head(
            Run.objects.filter(pk=run.pk, title="not this title"), title="held"
        )
        assert changed == 0
        assert not _locked_elsewhere(tenant)
        _append(tenant, "after")

    # Nothing held: the event locks the row itself (the lock, then the event).
    assert len(_statements(queries.captured_queries)) == 3
    assert AuditEvent.objects.get(tenant=tenant, outcome="after").seq == head + 1
    assert audit.verify_chain(tenant).ok


def test_an_update_holding_the_head_reads_the_head_another_writer_left():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    # Another writer's event after anything this connection saw.
    _append_in_transaction(tenant, "theirs")

    _hold_and_append(run, "mine")

    theirs = AuditEvent.objects.get(tenant=tenant, outcome="theirs")
    mine = AuditEvent.objects.get(tenant=tenant, outcome="mine")
    assert (mine.seq, mine.prev_hash) == (theirs.seq + 1, theirs.hash)
    assert audit.verify_chain(tenant).ok


def test_an_update_holding_the_head_returns_the_changed_rows():
    tenant = TenantFactory(slug="acme")
    runs = [paused_run(tenant), paused_run(tenant)]

    with transaction.atomic():
        rows = changes.update_holding_head(
            'UPDATE "approvals_run" SET "title" = %s WHERE "id" IN (%s, %s)',
            ["both", runs[0].pk, runs[1].pk],
            returning='"id", "title"',
        )

    assert sorted(rows) == sorted([(runs[0].pk, "both"), (runs[1].pk, "both")])


def test_an_update_holding_the_head_outside_a_transaction_is_refused():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    with pytest.raises(RuntimeError) as raised:
        changes.update_queryset_holding_head(Run.objects.filter(pk=run.pk), title="no")

    assert str(raised.value) == "update_holding_head must run inside a transaction"
    run.refresh_from_db()
    assert run.title != "no"


@POSTGRES_ONLY
def test_a_head_held_by_an_update_is_let_go_when_its_transaction_commits():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    # A first transaction holds the head and lets it go at its commit.
    _append_in_transaction(tenant, "first")
    assert connection._audit_heads[tenant.pk][2] is False

    # The next one holds it again through an update: it too must let it go at its commit, or
    # a later transaction would take the head as its own without the row's lock.
    _hold_and_append(run, "held")

    assert connection._audit_heads[tenant.pk][2] is False


# --- two updates, the second of rows linked to the first's, holding the head --------------------


def _pair(run, *, title: str = "ended", was: str | None = None) -> tuple[int, int]:
    """The run's title (when it is still `was`) and then its pending tickets' status changed as
    a pair, in the caller's transaction."""
    return changes.update_pair_holding_head(
        Run.objects.filter(pk=run.pk, title=run.title if was is None else was),
        {"title": title},
        Ticket.objects.filter(run=run, status=TicketStatus.PENDING),
        {"status": TicketStatus.SUPERSEDED},
        link="run_id",
    )


def _end(run, title: str) -> tuple[int, int]:
    with transaction.atomic():
        return _pair(run, title=title)


def test_a_pair_changes_both_and_counts_each():
    tenant = TenantFactory(slug="acme")
    run, other = paused_run(tenant), paused_run(tenant)

    assert _end(run, "ended") == (1, 1)

    run.refresh_from_db()
    assert run.title == "ended"
    assert list(Ticket.objects.filter(run=run).values_list("status", flat=True)) == [
        TicketStatus.SUPERSEDED
    ]
    # Another run's ticket is no row of either update.
    assert Ticket.objects.get(run=other).status == TicketStatus.PENDING


def test_a_pair_whose_first_update_changes_nothing_changes_nothing():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    run.title = "not this title"

    assert _end(run, "ended") == (0, 0)

    assert Ticket.objects.get(run=run).status == TicketStatus.PENDING
    assert Run.objects.get(pk=run.pk).title != "ended"


def test_a_pair_outside_a_transaction_is_refused():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    with pytest.raises(RuntimeError) as raised:
        changes.update_pair_holding_head(
            Run.objects.filter(pk=run.pk),
            {"title": "no"},
            Ticket.objects.filter(run=run),
            {"status": TicketStatus.SUPERSEDED},
            link="run_id",
        )

    assert str(raised.value) == "update_pair_holding_head must run inside a transaction"
    assert Ticket.objects.get(run=run).status == TicketStatus.PENDING


@POSTGRES_ONLY
def test_a_pair_holding_the_head_is_one_statement_and_its_event_one_more():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        changed = _pair(run)
        assert _locked_elsewhere(tenant)
        _append(tenant, "ended")

    assert changed == (1, 1)
    statements = _statements(queries.captured_queries)
    assert len(statements) == 2, statements
    assert statements[0].startswith("WITH first_changed AS (UPDATE")
    assert not _locked_elsewhere(tenant)
    assert audit.verify_chain(tenant).ok


@POSTGRES_ONLY
def test_a_pair_that_changes_nothing_locks_no_tenant():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    with transaction.atomic():
        changed = _pair(run, was="not this title")
        assert changed == (0, 0)
        assert not _locked_elsewhere(tenant)


@POSTGRES_ONLY
def test_a_pair_locks_the_first_rows_then_the_linked_ones_then_the_tenant():
    """While the pair waits for a ticket another transaction holds, it holds the run's row and
    not yet the tenant's: the order run, tickets, tenant, as a decision takes them."""
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    ticket = Ticket.objects.get(run=run)
    holder = psycopg.connect(**connection.get_connection_params())
    holder.execute("SELECT 1 FROM approvals_ticket WHERE id = %s FOR UPDATE", [ticket.pk])
    done: list = []

    def pair() -> None:
        try:
            done.append(_end(run, "ended"))
        finally:
            connection.close()

    worker = threading.Thread(target=pair)
    worker.start()
    try:
        wait_until(
            lambda: _waiting_on_a_lock("first_changed"),
            timeout=10,
            what="the pair to wait for the held ticket",
        )
        assert _row_locked("approvals_run", run.pk)
        assert not _row_locked("approvals_tenant", tenant.pk)
    finally:
        holder.rollback()
        holder.close()
        worker.join(timeout=10)

    assert done == [(1, 1)]
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.SUPERSEDED


def _waiting_on_a_lock(marker: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s",
            [f"%{marker}%"],
        )
        return cursor.fetchone()[0] > 0


# --- several events of a transaction written together (audit.chain.atomic) --------------------


def _outcomes(tenant) -> list[str]:
    return list(
        AuditEvent.objects.filter(tenant=tenant).order_by("seq").values_list("outcome", flat=True)
    )


@POSTGRES_ONLY
def test_events_held_back_by_atomic_are_one_statement_after_an_update_holding_the_head():
    tenant = TenantFactory(slug="acme")
    _append_in_transaction(tenant, "before")
    run = paused_run(tenant)

    with CaptureQueriesContext(connection) as queries, audit.atomic():
        changes.update_queryset_holding_head(Run.objects.filter(pk=run.pk), title="moved")
        events = [_append(tenant, outcome) for outcome in ("one", "two", "three")]
        # Held back: not in the database, no pk, until the block ends.
        assert [e.pk for e in events] == [None, None, None]
        assert not AuditEvent.objects.filter(outcome__in=["one", "two", "three"]).exists()

    statements = _statements(queries.captured_queries)
    # The update with the head's lock, the test's own read, then the three events with the head.
    assert len(statements) == 3, statements
    assert statements[1].startswith("SELECT")
    assert statements[2].startswith("WITH moved AS (UPDATE")
    assert _outcomes(tenant)[-3:] == ["one", "two", "three"]
    stored = {e.seq: e.pk for e in AuditEvent.objects.filter(tenant=tenant)}
    assert [(e.seq, e.pk) for e in events] == [(s, stored[s]) for s in (e.seq for e in events)]
    assert [e._state.adding for e in events] == [False, False, False]
    tenant.refresh_from_db()
    assert (tenant.audit_seq, tenant.audit_head) == (events[-1].seq, events[-1].hash)
    assert audit.verify_chain(tenant).ok


@POSTGRES_ONLY
def test_the_first_events_of_an_atomic_block_lock_the_head_once():
    tenant = TenantFactory(slug="acme")
    _append_in_transaction(tenant, "before")

    with CaptureQueriesContext(connection) as queries, audit.atomic():
        _append(tenant, "one")
        _append(tenant, "two")

    # The tenant's lock, then both events with the head.
    assert len(_statements(queries.captured_queries)) == 2
    assert _outcomes(tenant) == ["before", "one", "two"]
    assert audit.verify_chain(tenant).ok


def test_an_atomic_block_keeps_the_order_of_its_appends_and_links_them():
    # On SQLite each event is written as it is appended; the chain is the same either way.
    tenant = TenantFactory(slug="acme")
    other = TenantFactory(slug="other")

    with audit.atomic():
        _append(tenant, "a1")
        _append(other, "b1")
        _append(tenant, "a2")
        last = _append(other, "b2")

    assert _outcomes(tenant) == ["a1", "a2"]
    assert _outcomes(other) == ["b1", "b2"]
    assert (last.seq, last.prev_hash) == (2, AuditEvent.objects.get(tenant=other, seq=1).hash)
    assert audit.verify_chain(tenant).ok and audit.verify_chain(other).ok


def test_an_exception_leaving_an_atomic_block_writes_none_of_its_events():
    tenant = TenantFactory(slug="acme")
    _append_in_transaction(tenant, "kept")

    with pytest.raises(RuntimeError, match="gave up"), audit.atomic():
        _append(tenant, "dropped")
        raise RuntimeError("the caller gave up")

    after = _append_in_transaction(tenant, "after")
    assert _outcomes(tenant) == ["kept", "after"]
    assert after.seq == 2
    assert audit.verify_chain(tenant).ok


def test_an_atomic_block_inside_another_writes_the_outer_events_first():
    tenant = TenantFactory(slug="acme")

    with audit.atomic():
        _append(tenant, "outer one")
        with audit.atomic():
            _append(tenant, "inner")
        with pytest.raises(RuntimeError), audit.atomic():
            _append(tenant, "inner, rolled back")
            raise RuntimeError("the inner block gave up")
        _append(tenant, "outer two")

    assert _outcomes(tenant) == ["outer one", "inner", "outer two"]
    assert audit.verify_chain(tenant).ok


def test_an_atomic_block_marked_for_rollback_writes_none_of_its_events_as_atomic_would():
    tenant = TenantFactory(slug="acme")
    _append_in_transaction(tenant, "kept")

    # An error caught inside the block from a block without a savepoint marks the transaction
    # for rollback: transaction.atomic() rolls it back as it ends, without raising.
    with audit.atomic():
        _append(tenant, "dropped")
        Tenant.objects.filter(pk=tenant.pk).update(name="renamed")
        try:
            with transaction.atomic(savepoint=False):
                Tenant.objects.create(slug="acme", name="a second acme")
        except IntegrityError:
            pass
        assert connection.needs_rollback

    tenant.refresh_from_db()
    assert tenant.name != "renamed"
    after = _append_in_transaction(tenant, "after")
    assert _outcomes(tenant) == ["kept", "after"]
    assert after.seq == 2
    assert audit.verify_chain(tenant).ok


@POSTGRES_ONLY
def test_a_savepoint_inside_an_atomic_block_is_refused_an_event_while_others_wait():
    tenant = TenantFactory(slug="acme")

    with pytest.raises(RuntimeError) as raised, audit.atomic():
        _append(tenant, "held")
        with transaction.atomic():
            _append(tenant, "in a savepoint")

    assert str(raised.value) == (
        "an audit event appended in a savepoint inside audit.chain.atomic() while others "
        "are held back; append it outside the savepoint"
    )
    assert _outcomes(tenant) == []


def test_a_savepoint_inside_an_atomic_block_writes_its_event_when_none_wait():
    tenant = TenantFactory(slug="acme")

    with audit.atomic():
        with transaction.atomic():
            _append(tenant, "in a savepoint")
        with pytest.raises(RuntimeError), transaction.atomic():
            _append(tenant, "in a savepoint rolled back")
            raise RuntimeError("the savepoint gave up")
        _append(tenant, "held")

    assert _outcomes(tenant) == ["in a savepoint", "held"]
    assert audit.verify_chain(tenant).ok


@POSTGRES_ONLY
def test_events_held_back_are_linked_under_the_lock_when_the_guess_is_wrong():
    tenant = TenantFactory(slug="acme")
    _append_in_transaction(tenant, "before")

    with audit.atomic():
        _append(tenant, "one")
        # As if this transaction held a head that another writer has since moved on.
        _append(tenant, "two")
        audit._guesses()[tenant.pk] = (0, "f" * 64, True)

    assert _outcomes(tenant) == ["before", "one", "two"]
    assert audit.verify_chain(tenant).ok


# --- a change and the events that record it, in one statement ---------------------------------


def _event(tenant, outcome: str):
    return audit.new_event(tenant_id=tenant.pk, action="run.paused", outcome=outcome)


def _retitle_with_event(run, title: str, *, was: str | None = None):
    """Move the run's title (when it is still `was`) with the event that records it:
    (rows changed, statements, the event)."""
    event = _event(run.tenant, title)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        changed = changes.update_queryset_holding_head(
            Run.objects.filter(pk=run.pk, title=run.title if was is None else was),
            events=[event],
            title=title,
        )
    return changed, _statements(queries.captured_queries), event


def _linked_last(tenant, event) -> None:
    """The event is the tenant's last, linked to the one before it, and the head is its."""
    last = AuditEvent.objects.filter(tenant=tenant).order_by("-seq").first()
    assert last.pk == event.pk
    assert last.prev_hash == AuditEvent.objects.get(tenant=tenant, seq=last.seq - 1).hash
    tenant.refresh_from_db()
    assert (tenant.audit_seq, tenant.audit_head) == (last.seq, last.hash)
    assert audit.verify_chain(tenant).ok


@POSTGRES_ONLY
def test_a_change_and_its_event_are_one_statement_when_the_head_is_where_this_process_saw_it():
    tenant = TenantFactory(slug="acme")
    # The pause's events: this process saw the head they left.
    run = paused_run(tenant)

    changed, statements, event = _retitle_with_event(run, "moved")

    assert changed == 1
    assert len(statements) == 1, statements
    assert event.pk is not None
    run.refresh_from_db()
    assert run.title == "moved"
    _linked_last(tenant, event)


def test_a_change_whose_head_moved_on_elsewhere_links_its_event_to_the_real_head():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    # As if another process had appended since this one last saw the head.
    audit._saw(tenant.pk, 1, "f" * 64)

    changed, statements, event = _retitle_with_event(run, "moved")

    assert changed == 1
    if connection.vendor == "postgresql":
        # The change with the lock (the guess refused under it), then the event.
        assert len(statements) == 2, statements
    _linked_last(tenant, event)


def test_a_change_that_changes_nothing_writes_no_event():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)

    changed, _, event = _retitle_with_event(run, "moved", was="not this title")

    assert changed == 0
    assert event.pk is None
    assert not AuditEvent.objects.filter(tenant=tenant, outcome="moved").exists()
    assert Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk) == head
    assert audit.verify_chain(tenant).ok


@POSTGRES_ONLY
def test_a_change_with_its_event_holds_the_tenants_row_until_the_transaction_ends():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    with transaction.atomic():
        changes.update_queryset_holding_head(
            Run.objects.filter(pk=run.pk), events=[_event(tenant, "held")], title="held"
        )
        assert _locked_elsewhere(tenant)
        # The transaction goes on holding the head it moved: its next event is one statement.
        with CaptureQueriesContext(connection) as queries:
            after = _append(tenant, "after")
    assert len(_statements(queries.captured_queries)) == 1
    assert not _locked_elsewhere(tenant)
    _linked_last(tenant, after)


def test_a_pair_and_its_event():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    event = _event(tenant, "ended")

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        changed = changes.update_pair_holding_head(
            Run.objects.filter(pk=run.pk),
            {"title": "ended"},
            Ticket.objects.filter(run=run, status=TicketStatus.PENDING),
            {"status": TicketStatus.SUPERSEDED},
            link="run_id",
            events=[event],
        )

    assert changed == (1, 1)
    if connection.vendor == "postgresql":
        assert len(_statements(queries.captured_queries)) == 1
    assert Ticket.objects.get(run=run).status == TicketStatus.SUPERSEDED
    _linked_last(tenant, event)


def _end_statement(run, *, guarded: bool, was: str | None = None):
    """pair_statement() of the run's retitling to "ended" (when its title is `was`, else its
    own) and its pending tickets superseded."""
    return changes.pair_statement(
        Run.objects.filter(pk=run.pk, title=run.title if was is None else was),
        {"title": "ended"},
        Ticket.objects.filter(run=run, status=TicketStatus.PENDING),
        {"status": TicketStatus.SUPERSEDED},
        link="run_id",
        guarded=guarded,
    )


@pytest.mark.parametrize("guarded", [False, True])
@pytest.mark.parametrize("guess", ["seen", "moved on"])
def test_a_pair_sent_with_its_events_writes_them_whatever_the_guess(guess, guarded):
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    if guess == "moved on":
        audit._saw(tenant.pk, 1, "f" * 64)
    events = [_event(tenant, "ended"), _event(tenant, "and then")]

    with transaction.atomic():
        if connection.vendor == "postgresql":
            # In a transaction a guarded statement's precondition always holds.
            sql, params = _end_statement(run, guarded=guarded)
            changed = changes.send_pair_holding_head(sql, params, events=events)
        else:
            changed = _pair(run)
            for event in events:
                audit.append(tenant_id=tenant.pk, action="run.paused", outcome=event.outcome)

    assert changed == (1, 1)
    assert _outcomes(tenant)[-2:] == ["ended", "and then"]
    assert audit.verify_chain(tenant).ok


def test_a_pair_that_changes_nothing_writes_no_event():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    before = _outcomes(tenant)

    with transaction.atomic():
        changed = changes.update_pair_holding_head(
            Run.objects.filter(pk=run.pk, title="not this title"),
            {"title": "ended"},
            Ticket.objects.filter(run=run, status=TicketStatus.PENDING),
            {"status": TicketStatus.SUPERSEDED},
            link="run_id",
            events=[_event(tenant, "ended")],
        )

    assert changed == (0, 0)
    assert _outcomes(tenant) == before
    assert Ticket.objects.get(run=run).status == TicketStatus.PENDING


def test_a_change_with_its_event_inside_atomic_keeps_the_order_of_the_appends():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    with audit.atomic():
        _append(tenant, "one")
        changes.update_queryset_holding_head(
            Run.objects.filter(pk=run.pk), events=[_event(tenant, "two")], title="two"
        )
        _append(tenant, "three")

    assert _outcomes(tenant)[-3:] == ["one", "two", "three"]
    assert audit.verify_chain(tenant).ok


def _announced(call):
    """call()'s answer, and the pks of the events announced (audit_event_committed) meanwhile."""
    seen = []

    def heard(sender, event, **kwargs):
        seen.append(event.pk)

    signals.audit_event_committed.connect(heard)
    try:
        return call(), seen
    finally:
        signals.audit_event_committed.disconnect(heard)


def test_a_change_with_its_event_announces_the_event_once_committed():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    (changed, _, event), seen = _announced(lambda: _retitle_with_event(run, "moved"))

    assert changed == 1
    assert seen == [event.pk]


# --- a change and its events committed alone (autocommit) -------------------------------------


def _retitle_alone(run, title: str, *, was: str | None = None):
    """_retitle_with_event outside any transaction: (rows changed, statements sent (failed ones
    too), transactions committed, the event)."""
    event = _event(run.tenant, title)
    with queries.counting() as counts:
        changed = alone.update_queryset_with_events(
            Run.objects.filter(pk=run.pk, title=run.title if was is None else was),
            events=[event],
            title=title,
        )
    return changed, [sql for _, sql in counts.log], counts["commits"], event


@POSTGRES_ONLY
def test_a_change_with_its_event_alone_is_one_statement_and_no_transaction():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    changed, statements, commits, event = _retitle_alone(run, "moved")

    assert changed == 1
    assert len(statements) == 1, statements
    assert commits == 0
    assert Run.objects.get(pk=run.pk).title == "moved"
    _linked_last(tenant, event)
    # Nothing is held: the statement's lock ended with it.
    assert not _locked_elsewhere(tenant)
    assert not audit._guesses().get(tenant.pk, (0, "", False))[2]
    assert audit._last_seen(tenant.pk) == (event.seq, event.hash)


@POSTGRES_ONLY
def test_a_change_alone_whose_guess_missed_is_sent_again_linked_to_the_head_it_read(monkeypatch):
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    # As if another process had appended since this one last saw the head.
    audit._saw(tenant.pk, 1, "f" * 64)
    guards = []
    monkeypatch.setattr(alone, "_missed", lambda error: guards.append(error))

    changed, statements, commits, event = _retitle_alone(run, "moved")

    assert changed == 1
    # The first changed nothing (its precondition), without an error; the second wrote both.
    assert len(statements) == 2, statements
    assert guards == []
    assert commits == 0
    assert Run.objects.get(pk=run.pk).title == "moved"
    assert AuditEvent.objects.filter(tenant=tenant, outcome="moved").count() == 1
    _linked_last(tenant, event)


def _send_alone(run, *, guess: tuple[int, str], precondition: tuple[int, str]):
    """The ledger's statement alone, its event linked to guess, its precondition that the head
    is `precondition`."""
    update_sql, params = transitions.update_statement(
        Run.objects.filter(pk=run.pk).filter(changes.HEAD_AS_GUESSED), title="x"
    )
    written = changes._with_events(
        connection, [_event(run.tenant, "x")], after="changed", guess=guess
    )
    pre = alone._precondition(connection, run.tenant_id, precondition)
    return alone._send_update_alone(connection, update_sql, params, "1", written, pre)


@POSTGRES_ONLY
def test_a_change_alone_whose_head_moved_before_it_began_changes_nothing_and_reads_the_head():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)
    events = AuditEvent.objects.filter(tenant=tenant).count()

    # No error: the precondition read another head in the statement's snapshot.
    sent = _send_alone(run, guess=(1, "f" * 64), precondition=(1, "f" * 64))

    assert sent == alone._Moved(head)
    assert Run.objects.get(pk=run.pk).title == run.title
    assert AuditEvent.objects.filter(tenant=tenant).count() == events
    assert Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk) == head


@POSTGRES_ONLY
def test_a_change_alone_that_changes_no_row_answers_none_whether_its_head_held_or_not():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)
    no_such_run = Run(pk=run.pk + 10_000, tenant=tenant)

    assert _send_alone(no_such_run, guess=head, precondition=head) == []
    assert _send_alone(no_such_run, guess=head, precondition=(1, "f" * 64)) == alone._Moved(head)
    assert Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk) == head


@POSTGRES_ONLY
def test_a_guarded_statement_whose_guess_missed_under_the_lock_changes_nothing_and_names_the_head():
    """The precondition held (as it does when the head moves while the statement waits for the
    tenant's lock), but the events' guess is not the head under the lock: the guard fails it."""
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)
    events = AuditEvent.objects.filter(tenant=tenant).count()

    with pytest.raises(DataError) as raised:
        _send_alone(run, guess=(1, "f" * 64), precondition=head)

    assert alone._missed(raised.value) == head
    assert Run.objects.get(pk=run.pk).title == run.title
    assert AuditEvent.objects.filter(tenant=tenant).count() == events
    assert Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk) == head


def test_a_change_alone_that_misses_twice_goes_in_a_transaction_of_its_own(monkeypatch):
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    audit._saw(tenant.pk, 1, "f" * 64)
    # As if another process appended again before each sending: every head read is stale.
    monkeypatch.setattr(alone, "_pre_answer", lambda *answer: alone._Moved((1, "e" * 64)))

    changed, statements, commits, event = _retitle_alone(run, "moved")

    assert changed == 1
    assert commits == 1
    if connection.vendor == "postgresql":
        # Two refused alone, then the change with the lock and the event, in one transaction.
        assert len(statements) == 4, statements
    assert AuditEvent.objects.filter(tenant=tenant, outcome="moved").count() == 1
    _linked_last(tenant, event)


def test_a_change_alone_that_changes_nothing_writes_no_event():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)

    changed, statements, commits, event = _retitle_alone(run, "moved", was="not this title")

    assert changed == 0
    assert event.pk is None
    if connection.vendor == "postgresql":
        assert (len(statements), commits) == (1, 0)
    assert Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk) == head
    assert audit.verify_chain(tenant).ok


@pytest.mark.parametrize(
    "title, error",
    [
        # Longer than its column: a DataError that is not the guard's (SQLite keeps it).
        pytest.param("t" * 1000, DataError, marks=POSTGRES_ONLY),
        (None, IntegrityError),
    ],
)
def test_a_change_alone_that_fails_for_another_reason_raises_and_writes_nothing(title, error):
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    events = AuditEvent.objects.filter(tenant=tenant).count()

    with pytest.raises(error):
        _retitle_alone(run, title)

    assert Run.objects.get(pk=run.pk).title == run.title
    assert AuditEvent.objects.filter(tenant=tenant).count() == events
    assert audit.verify_chain(tenant).ok


def test_a_change_alone_inside_a_transaction_is_part_of_it():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)

    with pytest.raises(LookupError), transaction.atomic():
        alone.update_queryset_with_events(
            Run.objects.filter(pk=run.pk), events=[_event(tenant, "undone")], title="undone"
        )
        raise LookupError("the caller's transaction fails after the change")

    assert Run.objects.get(pk=run.pk).title == run.title
    assert not AuditEvent.objects.filter(tenant=tenant, outcome="undone").exists()
    assert audit.verify_chain(tenant).ok


def test_a_change_alone_announces_its_event_once():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    audit._saw(tenant.pk, 1, "f" * 64)

    (changed, _, _, event), seen = _announced(lambda: _retitle_alone(run, "moved"))

    assert changed == 1
    assert seen == [event.pk]


@pytest.mark.parametrize("guess", ["seen", "moved on"])
def test_a_pair_alone_writes_both_changes_and_the_event_whatever_the_guess(guess, monkeypatch):
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    if guess == "moved on":
        audit._saw(tenant.pk, 1, "f" * 64)
    guards = []
    monkeypatch.setattr(alone, "_missed", lambda error: guards.append(error))
    event = _event(tenant, "ended")
    first = Run.objects.filter(pk=run.pk)
    then = Ticket.objects.filter(run=run, status=TicketStatus.PENDING)

    with queries.counting() as counts:
        if connection.vendor == "postgresql":
            sql, params = changes.pair_statement(
                first,
                {"title": "ended"},
                then,
                {"status": TicketStatus.SUPERSEDED},
                link="run_id",
                guarded=True,
            )
            changed = alone.send_pair_with_events(sql, params, events=[event])
        else:
            with transaction.atomic():
                changed = changes.update_pair_holding_head(
                    first,
                    {"title": "ended"},
                    then,
                    {"status": TicketStatus.SUPERSEDED},
                    link="run_id",
                    events=[event],
                )

    assert changed == (1, 1)
    if connection.vendor == "postgresql":
        assert (counts["main"], counts["commits"]) == ({"seen": 1, "moved on": 2}[guess], 0)
        # A miss read before the statement began changes nothing and fails nothing.
        assert guards == []
    assert Ticket.objects.get(run=run).status == TicketStatus.SUPERSEDED
    _linked_last(tenant, event)


@POSTGRES_ONLY
def test_a_pair_alone_is_refused_a_statement_written_without_its_precondition():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    sql, params = _end_statement(run, guarded=False)

    with pytest.raises(ValueError, match="guarded"):
        alone.send_pair_with_events(sql, params, events=[_event(tenant, "ended")])

    assert Run.objects.get(pk=run.pk).title == run.title


@POSTGRES_ONLY
def test_a_pair_alone_whose_first_update_changes_nothing_writes_nothing():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    before = _outcomes(tenant)
    sql, params = _end_statement(run, guarded=True, was="not this title")

    changed = alone.send_pair_with_events(sql, params, events=[_event(tenant, "ended")])

    assert changed == (0, 0)
    assert _outcomes(tenant) == before
    assert Ticket.objects.get(run=run).status == TicketStatus.PENDING


@POSTGRES_ONLY
def test_a_change_alone_that_waited_for_another_writers_lock_links_its_event_after_that_writers():
    """Another transaction appends and holds the tenant's row while the change waits for it:
    under the lock the head is no longer the guess, the statement undoes itself, and is sent
    again after the other writer's event."""
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    guess = audit._last_seen(tenant.pk)
    appended, commit = threading.Event(), threading.Event()
    writer_pid: list[int] = []
    done: list = []

    def other_writer() -> None:
        try:
            with transaction.atomic():
                _append(tenant, "between")
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    writer_pid.append(cursor.fetchone()[0])
                appended.set()
                commit.wait(timeout=10)
        finally:
            connection.close()

    def change() -> None:
        try:
            done.append(_retitle_alone(run, "moved"))
        except BaseException as error:
            done.append(error)
        finally:
            connection.close()

    def blocked_by_the_writer() -> bool:
        # A backend of this database that waits on the other writer: the change, and only it.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND %s = ANY(pg_blocking_pids(pid))",
                [writer_pid[0]],
            )
            return cursor.fetchone()[0] > 0

    writer = threading.Thread(target=other_writer)
    writer.start()
    changer = threading.Thread(target=change)
    try:
        assert appended.wait(timeout=10)
        # This process saw the head before the other writer moved it.
        audit._saw(tenant.pk, *guess)
        changer.start()
        wait_until(
            blocked_by_the_writer, timeout=10, what="the change to wait for the tenant's row"
        )
    finally:
        commit.set()
        writer.join(timeout=10)
        if changer.ident:
            changer.join(timeout=10)

    if isinstance(done[0], BaseException):
        raise done[0]
    [(changed, statements, commits, event)] = done
    assert changed == 1
    # The other writer's, counted too: the change's statements committed on their own.
    assert commits == 1
    # Its statements only (the other writer's append is counted too).
    assert len([sql for sql in statements if sql.startswith("WITH audit_pre AS")]) == 2, statements
    assert _outcomes(tenant)[-2:] == ["between", "moved"]
    assert Run.objects.get(pk=run.pk).title == "moved"
    _linked_last(tenant, event)


def test_a_change_alone_with_values_bound_by_the_client_goes_in_a_transaction(monkeypatch):
    """Bound by the client, a failed statement's values would be in PostgreSQL's log: no guess
    that may fail is sent."""
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "server_side_binding", False)
    audit._saw(tenant.pk, 1, "f" * 64)

    changed, statements, commits, event = _retitle_alone(run, "moved")

    assert changed == 1
    assert commits == 1
    if connection.vendor == "postgresql":
        # The change with the lock (the guess refused under it, no error), then the event.
        assert len(statements) == 2, statements
    _linked_last(tenant, event)


def test_an_overlong_event_field_is_refused_whole_never_stored_cut_short():
    tenant = TenantFactory(slug="acme")
    paused_run(tenant)
    head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)
    outcome = "x" * 100  # the column holds 64

    if connection.vendor == "postgresql":
        with pytest.raises(DataError), transaction.atomic():
            _append(tenant, outcome)
        assert Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk) == head
        assert not AuditEvent.objects.filter(tenant=tenant, outcome__startswith="x").exists()
    else:
        # SQLite keeps the whole value: the hash covers what is stored.
        with transaction.atomic():
            _append(tenant, outcome)
        assert AuditEvent.objects.filter(tenant=tenant, outcome=outcome).exists()
    assert audit.verify_chain(tenant).ok
