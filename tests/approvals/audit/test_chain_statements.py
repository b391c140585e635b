"""Appending on PostgreSQL: the event and the chain head in one statement, guessed from the head
this transaction already holds, and linked right whatever the guess."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals.audit import chain as audit
from approvals.models import AuditEvent, Tenant
from tests.support import TenantFactory

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


@POSTGRES_ONLY
def test_the_append_statement_known_answer(monkeypatch):
    # Built once a process and kept: build it afresh here, as a new worker does.
    monkeypatch.setattr(audit, "_INSERT_SQL", None)
    monkeypatch.setattr(audit, "_INSERT_FIELDS", [])

    sql = audit._insert_sql()

    assert sql == (
        'WITH moved AS (UPDATE "approvals_tenant" SET audit_seq = %s, audit_head = %s '
        "WHERE id = %s AND audit_seq = %s AND audit_head = %s RETURNING id) "
        'INSERT INTO "approvals_auditevent" ("tenant_id", "seq", "created_at", "actor_id", '
        '"actor_name", "action", "run_id", "ticket_id", "tool_name", "arguments_digest", '
        '"outcome", "detail", "prev_hash", "hash", "hash_key_id") '
        "SELECT %s::bigint, %s::bigint, %s::timestamp with time zone, %s::integer, "
        "%s::varchar(150), %s::varchar(64), %s::bigint, %s::bigint, %s::varchar(200), "
        "%s::varchar(64), %s::varchar(64), %s::jsonb, %s::varchar(64), %s::varchar(64), "
        "%s::varchar(32) FROM moved RETURNING id"
    )
    assert [f.attname for f in audit._INSERT_FIELDS] == [
        f.attname for f in AuditEvent._meta.concrete_fields if not f.primary_key
    ]
    assert audit._insert_sql() is sql


def test_an_appended_event_is_a_stored_row_of_this_database():
    tenant = TenantFactory(slug="acme")

    event = _append_in_transaction(tenant, "stored")

    assert (event._state.adding, event._state.db) == (False, connection.alias)
    assert event.pk == AuditEvent.objects.get(tenant=tenant, seq=1).pk


@POSTGRES_ONLY
def test_a_head_that_moved_under_the_row_lock_is_an_error_naming_the_tenant(monkeypatch):
    tenant = TenantFactory(slug="acme")
    # As if another writer moved the head without the tenant's row lock.
    monkeypatch.setattr(audit, "_try_linked", lambda event, seq, head: False)

    with pytest.raises(RuntimeError) as raised, transaction.atomic():
        _append(tenant, "lost")

    assert str(raised.value) == f"tenant {tenant.pk}'s audit head moved under its row lock"
