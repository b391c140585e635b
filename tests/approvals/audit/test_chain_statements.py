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


def _statements(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT", "ROLLBACK")]


def _append(tenant, outcome: str):
    return audit.append(tenant_id=tenant.pk, action="run.paused", outcome=outcome)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement append")
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
