"""Signed checkpoints of the audit chains: taken, audited, loaded back and compared."""

from __future__ import annotations

import json

import pytest

from approvals import signals
from approvals.audit import chain as audit
from approvals.audit import checkpoints
from approvals.core import signatures
from approvals.core.canonical import canonical_json
from approvals.models import AuditEvent, Tenant
from tests.support import TenantFactory, audit_events, audit_guard_lifted

pytestmark = pytest.mark.django_db

SIGNING = b"s" * 32
OTHER_SIGNING = b"o" * 32


@pytest.fixture(autouse=True)
def _signing_key(settings):
    settings.APPROVALS_AUDIT_SIGNING_KEY = SIGNING


def _public_key() -> str:
    return signatures.public_key()


def _statements(document: dict) -> dict[str, dict]:
    return {e["statement"]["tenant"]: e["statement"] for e in document["tenants"]}


# --- take ---------------------------------------------------------------------------------------


def test_take_signs_each_tenants_head_and_the_whole_document():
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    acme_last = audit_events(acme, 3)[-1]
    globex_last = audit_events(globex, 1)[-1]

    checkpoint = checkpoints.take(Tenant.objects.order_by("slug"))

    document = checkpoint.document
    assert checkpoint.broken == []
    assert (document["format"], document["public_key"]) == (checkpoints.FORMAT, _public_key())
    assert _statements(document) == {
        "acme": {
            "format": checkpoints.FORMAT,
            "tenant": "acme",
            "seq": 3,
            "head": acme_last.hash,
            "time": document["time"],
        },
        "globex": {
            "format": checkpoints.FORMAT,
            "tenant": "globex",
            "seq": 1,
            "head": globex_last.hash,
            "time": document["time"],
        },
    }
    for entry in document["tenants"]:
        statement = canonical_json(entry["statement"]).encode()
        signatures.verify(_public_key(), entry["signature"], statement)
    body = {k: v for k, v in document.items() if k != "signature"}
    signatures.verify(_public_key(), document["signature"], canonical_json(body).encode())


def test_take_an_empty_chain_is_checkpointed_at_zero():
    TenantFactory(slug="acme")

    document = checkpoints.take(Tenant.objects.all()).document

    assert _statements(document)["acme"]["seq"] == 0
    assert _statements(document)["acme"]["head"] == audit.GENESIS


def test_take_leaves_out_a_broken_chain_and_reports_it():
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    events = audit_events(acme, 2)
    audit_events(globex, 1)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[0].pk).update(outcome="approved")

        checkpoint = checkpoints.take(Tenant.objects.order_by("slug"))

    assert list(_statements(checkpoint.document)) == ["globex"]
    assert [(r.tenant_slug, r.broken_seq, r.reason) for r in checkpoint.broken] == [
        ("acme", 1, "contents differ from their hash")
    ]


# --- record -------------------------------------------------------------------------------------


def test_record_audits_each_tenant_and_signals_its_own_statement_after_commit(
    django_capture_on_commit_callbacks,
):
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    audit_events(acme, 2)
    checkpoint = checkpoints.take(Tenant.objects.order_by("slug"))
    heard = []

    def listen(sender, event, checkpoint, **kwargs):
        heard.append((event.tenant_id, event.action, checkpoint))

    signals.audit_checkpointed.connect(listen)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            events = checkpoints.record(checkpoint)
    finally:
        signals.audit_checkpointed.disconnect(listen)

    acme_event, globex_event = events
    assert (acme_event.tenant_id, acme_event.seq, acme_event.action) == (
        acme.pk,
        3,
        "audit.checkpointed",
    )
    assert acme_event.detail == {
        "seq": 2,
        "head": _statements(checkpoint.document)["acme"]["head"],
        "public_key": _public_key(),
    }
    assert (globex_event.tenant_id, globex_event.seq, globex_event.outcome) == (
        globex.pk,
        1,
        "checkpointed",
    )
    acme_entry, globex_entry = checkpoint.document["tenants"]
    assert heard == [
        (acme.pk, "audit.checkpointed", {**acme_entry, "public_key": _public_key()}),
        (globex.pk, "audit.checkpointed", {**globex_entry, "public_key": _public_key()}),
    ]
    assert audit.verify_chain(acme).ok


# --- load ---------------------------------------------------------------------------------------


def _text() -> str:
    audit_events(TenantFactory(slug="acme"), 3)
    audit_events(TenantFactory(slug="globex"), 1)
    return checkpoints.take(Tenant.objects.order_by("slug")).text()


def test_load_returns_the_statements_of_a_genuine_checkpoint():
    text = _text()

    statements = checkpoints.load(text, public_key=_public_key())

    assert [(s.tenant, s.seq) for s in statements] == [("acme", 3), ("globex", 1)]
    assert statements[0].head == Tenant.objects.get(slug="acme").audit_head


def test_load_a_checkpoint_signed_by_another_key_is_refused(settings):
    text = _text()
    settings.APPROVALS_AUDIT_SIGNING_KEY = OTHER_SIGNING

    with pytest.raises(checkpoints.CheckpointError) as excinfo:
        checkpoints.load(text, public_key=_public_key())

    assert str(excinfo.value).startswith("the checkpoint was signed by another key")


def test_load_another_keys_checkpoint_relabelled_with_the_expected_public_key_is_refused(
    settings,
):
    expected = _public_key()
    settings.APPROVALS_AUDIT_SIGNING_KEY = OTHER_SIGNING
    document = json.loads(_text())
    document["public_key"] = expected

    with pytest.raises(checkpoints.CheckpointError) as excinfo:
        checkpoints.load(json.dumps(document), public_key=expected)

    assert str(excinfo.value) == (
        "the checkpoint's signature does not verify: it was changed after it was signed"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("seq", 2), ("head", "0" * 64), ("tenant", "globex")],
)
def test_load_a_statement_edited_after_signing_is_refused(field, value):
    document = json.loads(_text())
    document["tenants"][0]["statement"][field] = value

    with pytest.raises(checkpoints.CheckpointError) as excinfo:
        checkpoints.load(json.dumps(document), public_key=_public_key())

    assert str(excinfo.value) == (
        "the checkpoint's signature does not verify: it was changed after it was signed"
    )


def test_load_a_tenant_taken_out_of_the_file_is_refused():
    document = json.loads(_text())
    del document["tenants"][0]

    with pytest.raises(checkpoints.CheckpointError):
        checkpoints.load(json.dumps(document), public_key=_public_key())


def test_load_a_statement_whose_own_signature_fails_is_refused():
    """The document signed again over an edited statement (only the key's holder could):
    each tenant's statement still has to verify on its own, as a webhook receiver checks it."""
    document = json.loads(_text())
    document["tenants"][0]["statement"]["seq"] = 2
    body = {k: v for k, v in document.items() if k != "signature"}
    document["signature"] = signatures.sign(canonical_json(body).encode())

    with pytest.raises(checkpoints.CheckpointError) as excinfo:
        checkpoints.load(json.dumps(document), public_key=_public_key())

    assert str(excinfo.value) == (
        "the statement of tenant 'acme' does not verify: it was changed after it was signed"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "the checkpoint is not JSON"),
        ("[]", f"the checkpoint is not a {checkpoints.FORMAT} document"),
        ('{"format": "other"}', f"the checkpoint is not a {checkpoints.FORMAT} document"),
    ],
)
def test_load_something_else_is_refused(text, message):
    with pytest.raises(checkpoints.CheckpointError) as excinfo:
        checkpoints.load(text, public_key=_public_key())

    assert str(excinfo.value) == message


# --- compare ------------------------------------------------------------------------------------


def _statement(tenant: Tenant) -> checkpoints.Statement:
    (statement,) = checkpoints.load(checkpoints.take([tenant]).text(), public_key=_public_key())
    return statement


def test_compare_a_chain_that_grew_since_the_checkpoint_is_fine():
    tenant = TenantFactory(slug="acme")
    audit_events(tenant, 2)
    statement = _statement(tenant)

    audit_events(tenant, 2)

    assert checkpoints.compare(statement) is None


def test_compare_a_chain_cut_below_the_checkpoint_names_the_tenant():
    tenant = TenantFactory(slug="acme")
    events = audit_events(tenant, 4)
    statement = _statement(tenant)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk__in=[events[2].pk, events[3].pk]).delete()
    Tenant.objects.filter(pk=tenant.pk).update(audit_seq=2, audit_head=events[1].hash)

    assert checkpoints.compare(statement) == (
        f"acme: the chain ends at #2, but the checkpoint of {statement.time} has it at #4: "
        "events were cut"
    )


def test_compare_a_checkpointed_event_replaced_names_the_tenant_and_both_hashes():
    tenant = TenantFactory(slug="acme")
    events = audit_events(tenant, 3)
    statement = _statement(tenant)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[2].pk).update(hash="e" * 64)

    assert checkpoints.compare(statement) == (
        f"acme: event #3 has hash {'e' * 16}, but the checkpoint of {statement.time} says "
        f"{events[2].hash[:16]}: the chain was rewritten"
    )


def test_compare_a_checkpointed_event_deleted_under_a_head_left_in_place_is_named():
    tenant = TenantFactory(slug="acme")
    events = audit_events(tenant, 3)
    statement = _statement(tenant)
    with audit_guard_lifted():
        AuditEvent.objects.filter(pk=events[2].pk).delete()

    assert checkpoints.compare(statement) == (
        f"acme: event #3 of the checkpoint of {statement.time} is missing"
    )


def test_compare_a_tenant_gone_is_named():
    statement = checkpoints.Statement("gone", 3, "a" * 64, "2026-12-01T00:00:00+00:00")

    assert checkpoints.compare(statement) == (
        "gone: in the checkpoint of 2026-12-01T00:00:00+00:00 at #3, but no such tenant now"
    )
