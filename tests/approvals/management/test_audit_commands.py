"""manage.py audit_checkpoint, and verify_audit --against the checkpoint it wrote: a tail cut or
rewritten with write access to the database is found and its tenant named."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from approvals.audit import chain as audit
from approvals.audit import checkpoints
from approvals.core import signatures
from approvals.models import AuditEvent, Tenant
from tests.support import (
    TenantFactory,
    audit_events,
    audit_guard_lifted,
    plain_sha256_link,
    relink_audit_tail,
)

pytestmark = pytest.mark.django_db

SIGNING = b"s" * 32
OTHER_SIGNING = b"o" * 32


@pytest.fixture(autouse=True)
def _signing_key(settings):
    settings.APPROVALS_AUDIT_SIGNING_KEY = SIGNING


def _checkpoint(path: Path) -> dict:
    call_command("audit_checkpoint", "--output", str(path), stdout=StringIO(), stderr=StringIO())
    return json.loads(path.read_text())


def _verify(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("verify_audit", *args, stdout=out, stderr=err)
    except SystemExit as exit_:
        return exit_.code, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def _cut_to(tenant: Tenant, seq: int) -> None:
    """Delete the events after #seq and move the tenant's head back to #seq."""
    with audit_guard_lifted():
        AuditEvent.objects.filter(tenant=tenant, seq__gt=seq).delete()
    head = AuditEvent.objects.get(tenant=tenant, seq=seq).hash
    Tenant.objects.filter(pk=tenant.pk).update(audit_seq=seq, audit_head=head)


@pytest.fixture
def two_tenants():
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    audit_events(acme, 5)
    audit_events(globex, 2)
    return acme, globex


# --- audit_checkpoint ---------------------------------------------------------------------------


def test_audit_checkpoint_writes_a_signed_statement_per_tenant_and_audits_it(two_tenants, tmp_path):
    acme, globex = two_tenants
    path = tmp_path / "checkpoint.json"
    out = StringIO()

    call_command("audit_checkpoint", "--output", str(path), stdout=out, stderr=StringIO())

    assert out.getvalue() == f"checkpoint of 2 tenants written to {path}\n"
    statements = checkpoints.load(path.read_text(), public_key=signatures.public_key())
    assert [(s.tenant, s.seq) for s in statements] == [("acme", 5), ("globex", 2)]
    recorded = AuditEvent.objects.filter(action="audit.checkpointed").order_by("tenant__slug")
    assert [(e.tenant_id, e.seq, e.detail["seq"]) for e in recorded] == [
        (acme.pk, 6, 5),
        (globex.pk, 3, 2),
    ]
    assert audit.verify_chain(acme).ok and audit.verify_chain(globex).ok


def test_audit_checkpoint_without_output_prints_the_document(two_tenants):
    out = StringIO()

    call_command("audit_checkpoint", stdout=out, stderr=StringIO())

    document = json.loads(out.getvalue())
    assert [e["statement"]["tenant"] for e in document["tenants"]] == ["acme", "globex"]
    assert document["public_key"] == signatures.public_key()


def test_audit_checkpoint_leaves_out_a_broken_chain_and_exits_1(two_tenants, tmp_path):
    acme, _ = two_tenants
    path = tmp_path / "checkpoint.json"
    err = StringIO()
    with audit_guard_lifted():
        AuditEvent.objects.filter(tenant=acme, seq=2).update(outcome="approved")

        with pytest.raises(SystemExit) as excinfo:
            call_command("audit_checkpoint", "--output", str(path), stdout=StringIO(), stderr=err)

    assert excinfo.value.code == 1
    assert err.getvalue() == (
        "acme: chain broken at event #2: contents differ from their hash; "
        "left out of the checkpoint\n"
    )
    assert [e["statement"]["tenant"] for e in json.loads(path.read_text())["tenants"]] == ["globex"]


def test_audit_checkpoint_print_public_key_prints_the_signing_keys_public_key():
    out = StringIO()

    call_command("audit_checkpoint", "--print-public-key", stdout=out)

    assert out.getvalue() == signatures.public_key() + "\n"
    assert AuditEvent.objects.count() == 0


# --- verify_audit --against: truncation ---------------------------------------------------------


def test_truncated_tail_passes_verify_audit_alone_but_not_against_a_checkpoint(
    two_tenants, tmp_path
):
    acme, _ = two_tenants
    path = tmp_path / "checkpoint.json"
    document = _checkpoint(path)
    time = document["time"]
    _cut_to(acme, 3)

    alone = _verify()
    against = _verify("--against", str(path))

    # The chain alone ends where its (moved) head says: nothing to see.
    assert alone == (
        0,
        "acme: 3 events, chain intact, 0 unkeyed (legacy)\n"
        "globex: 3 events, chain intact, 0 unkeyed (legacy)\n",
        "",
    )
    code, out, err = against
    assert code == 1
    assert err == (
        f"acme: the chain ends at #3, but the checkpoint of {time} has it at #5: events were cut\n"
    )
    assert out.endswith(f"globex: event #2 as in the checkpoint of {time}\n")


def test_truncated_tail_regrown_by_new_events_is_found_as_rewritten(two_tenants, tmp_path):
    """After the cut the console goes on appending: the chain is as long again, and linked
    with the real key, but the checkpointed event is not the one there now."""
    acme, _ = two_tenants
    path = tmp_path / "checkpoint.json"
    document = _checkpoint(path)
    checkpointed = AuditEvent.objects.get(tenant=acme, seq=5).hash
    _cut_to(acme, 3)
    audit_events(acme, 3)

    code, out, err = _verify("--against", str(path))

    now = AuditEvent.objects.get(tenant=acme, seq=5).hash
    assert code == 1
    assert "acme: 6 events, chain intact" in out
    assert err == (
        f"acme: event #5 has hash {now[:16]}, but the checkpoint of {document['time']} says "
        f"{checkpointed[:16]}: the chain was rewritten\n"
    )


def test_whole_chain_rewritten_unkeyed_is_found_against_a_checkpoint(two_tenants, tmp_path):
    """What the key alone cannot see (test_chain: rewritten as a legacy chain), a checkpoint
    does."""
    acme, _ = two_tenants
    path = tmp_path / "checkpoint.json"
    _checkpoint(path)
    with audit_guard_lifted():
        AuditEvent.objects.filter(tenant=acme, seq=2).update(outcome="approved")
        AuditEvent.objects.filter(tenant=acme).update(hash_key_id="")
    relink_audit_tail(acme, 1, plain_sha256_link)

    code, out, err = _verify("--against", str(path))

    assert code == 1
    assert "acme: 6 events, chain intact, 6 unkeyed (legacy)\n" in out
    assert err.startswith("acme: event #5 has hash ")
    assert err.endswith(": the chain was rewritten\n")


def test_verify_against_an_intact_chain_passes(two_tenants, tmp_path):
    path = tmp_path / "checkpoint.json"
    time = _checkpoint(path)["time"]
    audit_events(two_tenants[0], 1)

    code, out, err = _verify("--against", str(path))

    assert (code, err) == (0, "")
    assert out == (
        "acme: 7 events, chain intact, 0 unkeyed (legacy)\n"
        "globex: 3 events, chain intact, 0 unkeyed (legacy)\n"
        f"acme: event #5 as in the checkpoint of {time}\n"
        f"globex: event #2 as in the checkpoint of {time}\n"
    )


def test_verify_against_names_a_tenant_created_after_the_checkpoint(two_tenants, tmp_path):
    path = tmp_path / "checkpoint.json"
    _checkpoint(path)
    TenantFactory(slug="initech")

    code, out, _ = _verify("--against", str(path))

    assert code == 0
    assert out.endswith("initech: not in the checkpoint\n")


def test_verify_against_with_tenant_checks_only_that_tenant(two_tenants, tmp_path):
    acme, _ = two_tenants
    path = tmp_path / "checkpoint.json"
    time = _checkpoint(path)["time"]
    _cut_to(acme, 3)

    code, out, err = _verify("--against", str(path), "--tenant", "globex")

    assert (code, err) == (0, "")
    assert out == (
        "globex: 3 events, chain intact, 0 unkeyed (legacy)\n"
        f"globex: event #2 as in the checkpoint of {time}\n"
    )


# --- verify_audit --against: a checkpoint that cannot be trusted --------------------------------


def test_verify_against_a_checkpoint_signed_by_another_key_is_refused(
    two_tenants, tmp_path, settings
):
    path = tmp_path / "checkpoint.json"
    _checkpoint(path)
    settings.APPROVALS_AUDIT_SIGNING_KEY = OTHER_SIGNING

    with pytest.raises(CommandError) as excinfo:
        _verify("--against", str(path))

    assert str(excinfo.value).startswith(
        f"{path}: the checkpoint was signed by another key (public key "
    )


def test_verify_against_with_the_public_key_of_an_earlier_signing_key_accepts_its_checkpoint(
    two_tenants, tmp_path, settings
):
    path = tmp_path / "checkpoint.json"
    earlier = _checkpoint(path)["public_key"]
    settings.APPROVALS_AUDIT_SIGNING_KEY = OTHER_SIGNING

    code, _, err = _verify("--against", str(path), "--public-key", earlier)

    assert (code, err) == (0, "")


def test_verify_against_a_checkpoint_forged_with_another_keys_public_key_is_refused(
    two_tenants, tmp_path, settings
):
    """Someone with their own key signs a statement of the chain they made, and gives its
    public key: verify_audit checks against the console's key, not the file's."""
    path = tmp_path / "checkpoint.json"
    expected = signatures.public_key()
    settings.APPROVALS_AUDIT_SIGNING_KEY = OTHER_SIGNING
    _checkpoint(path)
    settings.APPROVALS_AUDIT_SIGNING_KEY = SIGNING

    with pytest.raises(CommandError) as excinfo:
        _verify("--against", str(path))

    assert f"expected {expected})" in str(excinfo.value)


@pytest.mark.parametrize(("field", "value"), [("seq", 3), ("head", "a" * 64)])
def test_verify_against_a_checkpoint_edited_after_signing_is_refused(
    two_tenants, tmp_path, field, value
):
    """The edit that would make a cut tail pass: the checkpoint's seq or head moved back."""
    acme, _ = two_tenants
    path = tmp_path / "checkpoint.json"
    document = _checkpoint(path)
    document["tenants"][0]["statement"][field] = value
    path.write_text(json.dumps(document))
    _cut_to(acme, 3)

    with pytest.raises(CommandError) as excinfo:
        _verify("--against", str(path))

    assert str(excinfo.value) == (
        f"{path}: the checkpoint's signature does not verify: it was changed after it was signed"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read {path}: No such file or directory"),
        ("{", "{path}: the checkpoint is not JSON"),
    ],
    ids=["missing", "not-json"],
)
def test_verify_against_an_unreadable_file_is_a_command_error(tmp_path, content, message):
    path = tmp_path / "checkpoint.json"
    if content is not None:
        path.write_text(content)

    with pytest.raises(CommandError) as excinfo:
        _verify("--against", str(path))

    assert str(excinfo.value) == message.format(path=path)
