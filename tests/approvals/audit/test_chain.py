"""The audit log: hash-chained per tenant, append-only in the database, verifiable."""

from __future__ import annotations

from datetime import UTC, datetime
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.db.utils import IntegrityError, ProgrammingError

from approvals.audit import chain as audit
from approvals.models import AuditEvent, Tenant
from tests.support import (
    TenantFactory,
    append_unkeyed,
    audit_guard_lifted,
    hmac_link,
    plain_sha256_link,
    relink_audit_tail,
)

pytestmark = pytest.mark.django_db

# Computed outside the project: hmac.new(b"1" * 32, ("cd" * 32 + "\n" + json.dumps(fields,
# sort_keys=True, separators=(",", ":"), ensure_ascii=False)).encode(), "sha256").hexdigest()
KNOWN_LINK = "32fa89fee770b0bf27dc4e35919c8618ca09634205498aa03d65bd1ef2341de6"

# What each vendor raises when the append-only trigger refuses a statement: SQLite's
# RAISE(ABORT) is a constraint failure; PostgreSQL's ERRCODE insufficient_privilege is class 42.
REFUSAL = {"sqlite": IntegrityError, "postgresql": ProgrammingError}


def _append(tenant: Tenant, action: str = "run.paused", **fields) -> AuditEvent:
    with transaction.atomic():
        return audit.append(tenant_id=tenant.pk, action=action, **fields)


def _chain(tenant: Tenant, length: int) -> list[AuditEvent]:
    return [_append(tenant, outcome=f"step {n}") for n in range(1, length + 1)]


def _assert_refused(excinfo, operation: str) -> None:
    assert type(excinfo.value) is REFUSAL[connection.vendor]
    assert f"approvals_auditevent is append-only: {operation} refused" in str(excinfo.value)


# --- the chain ----------------------------------------------------------------------------------


def test_append_links_each_event_to_the_previous_hash():
    tenant = TenantFactory()

    _chain(tenant, 4)

    events = list(AuditEvent.objects.filter(tenant=tenant).order_by("seq"))
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[0].prev_hash == audit.GENESIS
    assert [e.prev_hash for e in events[1:]] == [e.hash for e in events[:-1]]
    # Read back from the database, each stored hash still matches its recomputed contents.
    assert [audit.event_hash(e) for e in events] == [e.hash for e in events]


def test_append_moves_the_tenant_head_to_the_last_event():
    tenant = TenantFactory()

    last = _chain(tenant, 3)[-1]

    tenant.refresh_from_db()
    assert (tenant.audit_seq, tenant.audit_head) == (3, last.hash)


def test_append_keeps_independent_chains_per_tenant():
    acme = TenantFactory(slug="acme")
    globex = TenantFactory(slug="globex")

    for tenant in (acme, globex, acme, acme, globex):
        _append(tenant)

    acme_events = list(AuditEvent.objects.filter(tenant=acme).order_by("seq"))
    globex_events = list(AuditEvent.objects.filter(tenant=globex).order_by("seq"))
    assert [e.seq for e in acme_events] == [1, 2, 3]
    assert [e.seq for e in globex_events] == [1, 2]
    assert globex_events[0].prev_hash == audit.GENESIS
    assert globex_events[1].prev_hash == globex_events[0].hash
    assert acme_events[1].prev_hash == acme_events[0].hash


@pytest.mark.django_db(transaction=True)
def test_append_outside_a_transaction_is_refused():
    tenant = TenantFactory()

    with pytest.raises(RuntimeError) as excinfo:
        audit.append(tenant_id=tenant.pk, action="run.paused")

    assert str(excinfo.value) == "audit.append must run inside a transaction"
    assert AuditEvent.objects.filter(tenant=tenant).count() == 0


def test_append_redacts_a_secret_shaped_detail_value():
    tenant = TenantFactory()
    secret = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2"

    event = _append(tenant, detail={"note": secret, "count": 2})

    event.refresh_from_db()
    assert event.detail == {"note": "[redacted]", "count": 2}
    assert audit.event_hash(event) == event.hash


def test_append_redacts_a_secret_named_detail_key():
    tenant = TenantFactory()

    event = _append(tenant, detail={"api_key": "plain-looking", "agent": "release"})

    event.refresh_from_db()
    assert event.detail == {"api_key": "[redacted]", "agent": "release"}


# --- the database refuses changes -----------------------------------------------------------


def test_audit_event_orm_save_is_refused():
    event = _append(TenantFactory())
    event.outcome = "rewritten"

    with pytest.raises(REFUSAL[connection.vendor]) as excinfo, transaction.atomic():
        event.save()

    _assert_refused(excinfo, "UPDATE")
    assert AuditEvent.objects.get(pk=event.pk).outcome == ""


def test_audit_event_orm_queryset_update_is_refused():
    event = _append(TenantFactory())

    with pytest.raises(REFUSAL[connection.vendor]) as excinfo, transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(outcome="rewritten")

    _assert_refused(excinfo, "UPDATE")
    assert AuditEvent.objects.get(pk=event.pk).outcome == ""


def test_audit_event_orm_delete_is_refused():
    event = _append(TenantFactory())

    with pytest.raises(REFUSAL[connection.vendor]) as excinfo, transaction.atomic():
        event.delete()

    _assert_refused(excinfo, "DELETE")
    assert AuditEvent.objects.filter(pk=event.pk).count() == 1


def test_audit_event_orm_queryset_delete_is_refused():
    tenant = TenantFactory()
    _chain(tenant, 2)

    with pytest.raises(REFUSAL[connection.vendor]) as excinfo, transaction.atomic():
        AuditEvent.objects.filter(tenant=tenant).delete()

    _assert_refused(excinfo, "DELETE")
    assert AuditEvent.objects.filter(tenant=tenant).count() == 2


def test_audit_event_raw_sql_update_is_refused():
    event = _append(TenantFactory())

    with (
        pytest.raises(REFUSAL[connection.vendor]) as excinfo,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "UPDATE approvals_auditevent SET outcome = %s WHERE id = %s", ["rewritten", event.pk]
        )

    _assert_refused(excinfo, "UPDATE")
    assert AuditEvent.objects.get(pk=event.pk).outcome == ""


def test_audit_event_raw_sql_delete_is_refused():
    event = _append(TenantFactory())

    with (
        pytest.raises(REFUSAL[connection.vendor]) as excinfo,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("DELETE FROM approvals_auditevent WHERE id = %s", [event.pk])

    _assert_refused(excinfo, "DELETE")
    assert AuditEvent.objects.filter(pk=event.pk).count() == 1


def test_audit_event_insert_is_allowed_after_a_refusal():
    tenant = TenantFactory()
    event = _append(tenant)
    with pytest.raises(REFUSAL[connection.vendor]), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()

    second = _append(tenant)

    assert second.seq == 2
    assert audit.verify_chain(tenant).ok is True


# --- verify_chain --------------------------------------------------------------------------


def test_verify_chain_intact_is_ok():
    tenant = TenantFactory(slug="acme")
    _chain(tenant, 5)

    report = audit.verify_chain(tenant)

    assert report == audit.ChainReport("acme", 5, True)


def test_verify_chain_empty_is_ok():
    tenant = TenantFactory(slug="acme")

    assert audit.verify_chain(tenant) == audit.ChainReport("acme", 0, True)


def test_verify_chain_edited_field_is_detected():
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 4)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[1].pk).update(outcome="approved")

        report = audit.verify_chain(tenant)

    assert report == audit.ChainReport(
        "acme", 2, False, 2, events[1].pk, "contents differ from their hash"
    )


def test_verify_chain_edited_detail_is_detected():
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 3)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[2].pk).update(detail={"message": "forged"})

        report = audit.verify_chain(tenant)

    assert (report.ok, report.broken_seq, report.broken_event_id, report.reason) == (
        False,
        3,
        events[2].pk,
        "contents differ from their hash",
    )


def test_verify_chain_edited_event_with_recomputed_hash_is_detected_at_the_next_link():
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 4)
    with audit_guard_lifted():
        forged = AuditEvent.objects.get(pk=events[1].pk)
        forged.outcome = "approved"
        forged.hash = audit.event_hash(forged)
        forged.save()

        report = audit.verify_chain(tenant)

    assert report == audit.ChainReport(
        "acme", 3, False, 3, events[2].pk, "previous-hash link is broken"
    )


def test_verify_chain_forged_event_with_its_next_link_rewritten_is_detected_at_the_next_event():
    """The attacker edits event #2, recomputes its hash and rewrites #3's stored prev_hash to
    match: #3's own hash covers the previous hash, so recomputing it from #2's shows the break."""
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 4)
    with audit_guard_lifted():
        forged = AuditEvent.objects.get(pk=events[1].pk)
        forged.outcome = "approved"
        forged.hash = audit.event_hash(forged)
        forged.save()
        AuditEvent.objects.filter(pk=events[2].pk).update(prev_hash=forged.hash)

        report = audit.verify_chain(tenant)

    assert report == audit.ChainReport(
        "acme", 3, False, 3, events[2].pk, "contents differ from their hash"
    )


def test_verify_chain_recomputes_each_link_from_the_previous_event_not_the_stored_field():
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 3)
    event = AuditEvent.objects.get(pk=events[1].pk)

    assert audit.event_hash(event) == event.hash
    assert audit.event_hash(event, prev_hash=events[0].hash) == event.hash
    assert audit.event_hash(event, prev_hash="0" * 64) != event.hash


def test_event_hash_known_answer(settings):
    """The link's formula, pinned: HMAC-SHA256 under the key of the previous hash, a newline and
    the canonical JSON of the event's fields. A change to it must be a deliberate one."""
    settings.APPROVALS_AUDIT_KEYS = [("a1", b"1" * 32)]
    event = AuditEvent(
        tenant_id=7,
        seq=3,
        created_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        actor_id=None,
        actor_name="worker",
        action="run.completed",
        run_id=11,
        ticket_id=None,
        tool_name="deploy_release",
        arguments_digest="ab" * 32,
        outcome="completed",
        detail={"output": "Release 2026.07.25 is live"},
        prev_hash="cd" * 32,
        hash_key_id="a1",
    )

    assert audit.event_hash(event) == KNOWN_LINK
    assert audit.event_hash(event, prev_hash="ce" * 32) != KNOWN_LINK


def test_verify_chain_deleted_middle_event_is_detected():
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 4)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[1].pk).delete()

        report = audit.verify_chain(tenant)

    assert report == audit.ChainReport("acme", 2, False, 2, events[2].pk, "event #2 is missing")


def test_verify_chain_deleted_last_event_is_detected():
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 4)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[3].pk).delete()

        report = audit.verify_chain(tenant)

    assert report == audit.ChainReport(
        "acme", 3, False, 4, None, "chain ends at #3 but the head says #4"
    )


def test_verify_chain_break_in_one_tenant_leaves_the_other_ok():
    acme = TenantFactory(slug="acme")
    globex = TenantFactory(slug="globex")
    acme_events = _chain(acme, 3)
    _chain(globex, 2)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=acme_events[0].pk).update(actor_name="mallory")

        acme_report = audit.verify_chain(acme)
        globex_report = audit.verify_chain(globex)

    assert (acme_report.ok, acme_report.broken_seq) == (False, 1)
    assert globex_report == audit.ChainReport("globex", 2, True)


def test_guard_lifted_is_reinstalled_afterwards():
    event = _append(TenantFactory())
    with audit_guard_lifted():
        pass

    with pytest.raises(REFUSAL[connection.vendor]), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()

    assert AuditEvent.objects.filter(pk=event.pk).count() == 1


# --- manage.py verify_audit -------------------------------------------------------------------


def test_verify_audit_command_intact_chain_reports_each_tenant():
    _chain(TenantFactory(slug="acme"), 3)
    _chain(TenantFactory(slug="globex"), 1)
    out, err = StringIO(), StringIO()

    call_command("verify_audit", stdout=out, stderr=err)

    assert out.getvalue() == (
        "acme: 3 events, chain intact, 0 unkeyed (legacy)\n"
        "globex: 1 events, chain intact, 0 unkeyed (legacy)\n"
    )
    assert err.getvalue() == ""


def test_verify_audit_command_broken_chain_exits_1_naming_the_event():
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 3)
    _chain(TenantFactory(slug="globex"), 1)
    out, err = StringIO(), StringIO()
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[1].pk).update(tool_name="deploy_release")

        with pytest.raises(SystemExit) as excinfo:
            call_command("verify_audit", stdout=out, stderr=err)

    assert excinfo.value.code == 1
    assert err.getvalue() == (
        f"acme: chain broken at event #2 (id {events[1].pk}): contents differ from their hash\n"
    )
    assert out.getvalue() == "globex: 1 events, chain intact, 0 unkeyed (legacy)\n"


def test_verify_audit_command_deleted_tail_exits_1_without_an_id():
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 2)
    err = StringIO()
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[1].pk).delete()

        with pytest.raises(SystemExit) as excinfo:
            call_command("verify_audit", stdout=StringIO(), stderr=err)

    assert excinfo.value.code == 1
    assert (
        err.getvalue() == "acme: chain broken at event #2: chain ends at #1 but the head says #2\n"
    )


def test_verify_audit_command_tenant_option_checks_only_that_tenant():
    _chain(TenantFactory(slug="acme"), 2)
    _chain(TenantFactory(slug="globex"), 1)
    out = StringIO()

    call_command("verify_audit", "--tenant", "globex", stdout=out, stderr=StringIO())

    assert out.getvalue() == "globex: 1 events, chain intact, 0 unkeyed (legacy)\n"


def test_verify_audit_command_unknown_tenant_is_a_command_error():
    with pytest.raises(CommandError) as excinfo:
        call_command("verify_audit", "--tenant", "nope", stdout=StringIO(), stderr=StringIO())

    assert str(excinfo.value) == "no tenant 'nope'"


# --- an attacker with database write access -------------------------------------------------


@pytest.mark.parametrize(
    "link",
    [plain_sha256_link, hmac_link(b"w" * 32)],
    ids=["plain-sha256", "hmac-with-a-wrong-key"],
)
def test_verify_audit_edited_event_with_every_later_hash_recomputed_is_detected(link):
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 4)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[1].pk).update(outcome="approved")
    relink_audit_tail(tenant, 2, link)
    err = StringIO()

    with audit_guard_lifted(), pytest.raises(SystemExit) as excinfo:
        call_command("verify_audit", stdout=StringIO(), stderr=err)

    assert excinfo.value.code == 1
    assert err.getvalue().startswith(f"acme: chain broken at event #2 (id {events[1].pk}): ")


def test_verify_audit_edited_event_with_its_tail_relinked_unkeyed_is_detected():
    """The tail rewritten in the form events had before the chain had a key."""
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 4)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[1].pk).update(outcome="approved", hash_key_id="")
        AuditEvent.objects.filter(seq__gt=2).update(hash_key_id="")
    relink_audit_tail(tenant, 2, plain_sha256_link)

    with audit_guard_lifted():
        report = audit.verify_chain(tenant)

    assert report == audit.ChainReport(
        "acme", 2, False, 2, events[1].pk, "an unkeyed event after a keyed one"
    )


# --- the key ----------------------------------------------------------------------------------

K1 = b"1" * 32
K2 = b"2" * 32


def _payload_link(event: AuditEvent, key: bytes) -> str:
    return hmac_link(key)(event.prev_hash, audit._event_payload(event))


def test_append_links_with_hmac_sha256_under_the_first_audit_key(settings):
    settings.APPROVALS_AUDIT_KEYS = [("a1", K1), ("a0", K2)]
    tenant = TenantFactory()

    first, second = _chain(tenant, 2)

    first.refresh_from_db()
    assert (first.hash_key_id, second.hash_key_id) == ("a1", "a1")
    assert first.hash == _payload_link(first, K1)
    assert second.hash == _payload_link(second, K1)
    assert first.hash != plain_sha256_link(first.prev_hash, audit._event_payload(first))


def test_key_rotation_old_events_verify_and_new_ones_use_the_new_key(settings):
    settings.APPROVALS_AUDIT_KEYS = [("a1", K1)]
    tenant = TenantFactory(slug="acme")
    _chain(tenant, 2)
    settings.APPROVALS_AUDIT_KEYS = [("a2", K2), ("a1", K1)]

    _chain(tenant, 2)

    keys = list(AuditEvent.objects.filter(tenant=tenant).order_by("seq").values_list("hash_key_id"))
    assert keys == [("a1",), ("a1",), ("a2",), ("a2",)]
    assert audit.verify_chain(tenant) == audit.ChainReport("acme", 4, True)


def test_key_removed_from_the_ring_while_its_events_remain_is_a_break(settings):
    settings.APPROVALS_AUDIT_KEYS = [("a1", K1)]
    tenant = TenantFactory(slug="acme")
    first = _chain(tenant, 2)[0]
    settings.APPROVALS_AUDIT_KEYS = [("a2", K2)]

    report = audit.verify_chain(tenant)

    assert report == audit.ChainReport(
        "acme", 1, False, 1, first.pk, "linked with key 'a1', which is not in APPROVALS_AUDIT_KEYS"
    )


def test_verify_chain_event_relinked_with_a_key_id_of_the_ring_but_another_key_is_detected(
    settings,
):
    settings.APPROVALS_AUDIT_KEYS = [("a1", K1)]
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 3)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[2].pk).update(outcome="approved")
    relink_audit_tail(tenant, 3, hmac_link(K2))

    with audit_guard_lifted():
        report = audit.verify_chain(tenant)

    assert report == audit.ChainReport(
        "acme", 3, False, 3, events[2].pk, "contents differ from their hash"
    )


def test_verify_chain_head_moved_to_another_hash_at_the_same_seq_is_detected():
    tenant = TenantFactory(slug="acme")
    _chain(tenant, 2)
    Tenant.objects.filter(pk=tenant.pk).update(audit_head="f" * 64)

    report = audit.verify_chain(tenant)

    assert report == audit.ChainReport(
        "acme", 2, False, 2, None, "the head's hash is not that of event #2"
    )


# --- events from before the chain had a key (legacy) -------------------------------------------


def test_legacy_events_without_a_key_id_verify_and_are_counted():
    tenant = TenantFactory(slug="acme")
    for _ in range(3):
        append_unkeyed(tenant)

    assert audit.verify_chain(tenant) == audit.ChainReport("acme", 3, True, unkeyed=3)


def test_legacy_events_followed_by_keyed_ones_verify():
    tenant = TenantFactory(slug="acme")
    append_unkeyed(tenant)
    append_unkeyed(tenant)

    _chain(tenant, 2)

    assert audit.verify_chain(tenant) == audit.ChainReport("acme", 4, True, unkeyed=2)


def test_an_unkeyed_event_after_a_keyed_one_is_a_break():
    tenant = TenantFactory(slug="acme")
    append_unkeyed(tenant)
    _chain(tenant, 1)
    late = append_unkeyed(tenant)

    report = audit.verify_chain(tenant)

    assert report == audit.ChainReport(
        "acme", 3, False, 3, late.pk, "an unkeyed event after a keyed one", unkeyed=1
    )


def test_verify_audit_command_reports_the_unkeyed_events_of_each_tenant():
    acme = TenantFactory(slug="acme")
    append_unkeyed(acme)
    append_unkeyed(acme)
    _chain(acme, 1)
    _chain(TenantFactory(slug="globex"), 2)
    out = StringIO()

    call_command("verify_audit", stdout=out, stderr=StringIO())

    assert out.getvalue() == (
        "acme: 3 events, chain intact, 2 unkeyed (legacy)\n"
        "globex: 2 events, chain intact, 0 unkeyed (legacy)\n"
    )


def test_a_whole_chain_rewritten_unkeyed_passes_the_chain_alone_counted_as_legacy():
    """The limit of the key alone (docs/AUDIT.md): with no keyed event left, the rewritten
    chain reads as a legacy one. Its count shows it; a checkpoint catches it
    (tests/approvals/management/test_audit_commands.py)."""
    tenant = TenantFactory(slug="acme")
    events = _chain(tenant, 3)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[1].pk).update(outcome="approved")
        AuditEvent.objects.filter(tenant=tenant).update(hash_key_id="")
    relink_audit_tail(tenant, 1, plain_sha256_link)

    assert audit.verify_chain(tenant) == audit.ChainReport("acme", 3, True, unkeyed=3)
