"""Encryption at rest: AES-256-GCM bound to what the blob belongs to, with key rotation."""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from types import SimpleNamespace

import pytest

from approvals.core import crypto
from approvals.execution import state
from approvals.execution.state import open_state, rotate_keys
from approvals.models import AuditEvent, Run
from tests.support import TenantFactory, paused_run

K1 = os.urandom(32)
K2 = os.urandom(32)
PURPOSE = "tests.crypto"
PLAINTEXT = b'{"prompt": "Deploy release 2026.07.24 to production", "turn": 1}'


@pytest.fixture
def ring(settings):
    """Set the key ring; the first key is the primary."""

    def set_ring(*keys: tuple[str, bytes]) -> None:
        settings.APPROVALS_ENCRYPTION_KEYS = list(keys)

    set_ring(("k1", K1))
    return set_ring


def _flip(data: bytes, index: int) -> bytes:
    flipped = bytearray(data)
    flipped[index] ^= 0x01
    return bytes(flipped)


# --- seal and open ----------------------------------------------------------------------------


def test_seal_open_round_trip_returns_the_plaintext(ring):
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)

    assert crypto.open_sealed(sealed, purpose=PURPOSE, tenant=1, run=7) == PLAINTEXT


def test_seal_uses_the_primary_key_and_a_fresh_nonce(ring):
    first = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)
    second = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)

    assert (first.key_id, len(first.nonce)) == ("k1", crypto.NONCE_BYTES)
    assert first.nonce != second.nonce
    assert first.ciphertext != second.ciphertext


def test_associated_data_known_answer():
    """The bytes every stored blob was sealed with: changing them would leave every stored
    state unopenable, so they are fixed here."""
    assert crypto.associated_data(purpose="run-state", key_id="k1", tenant=1, run=7) == (
        b"run-state|key=k1|run=7|tenant=1"
    )


def test_seal_binding_order_does_not_matter(ring):
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)

    assert crypto.open_sealed(sealed, purpose=PURPOSE, run=7, tenant=1) == PLAINTEXT


def test_seal_ciphertext_does_not_contain_the_plaintext(ring):
    # Incompressible text, so that only encryption (not compression) can hide it.
    plaintext = os.urandom(64).hex().encode()

    sealed = crypto.seal(plaintext, purpose=PURPOSE, tenant=1, run=7)

    assert plaintext[:16] not in sealed.ciphertext


def test_open_sealed_of_a_state_that_inflates_past_the_cap_is_refused(ring, monkeypatch):
    """A sealed blob that decompresses to more than the cap (a zip bomb written with a key) is
    refused as tampered before it is inflated whole; one exactly at the cap opens."""
    sealed = crypto.seal(b"x" * 1000, purpose=PURPOSE, tenant=1, run=7)
    monkeypatch.setattr(crypto, "MAX_PLAINTEXT_BYTES", 1000)
    assert crypto.open_sealed(sealed, purpose=PURPOSE, tenant=1, run=7) == b"x" * 1000
    monkeypatch.setattr(crypto, "MAX_PLAINTEXT_BYTES", 999)

    with pytest.raises(crypto.TamperedError) as refused:
        crypto.open_sealed(sealed, purpose=PURPOSE, tenant=1, run=7)

    assert str(refused.value) == "the stored state is larger than allowed"


def test_open_sealed_flipped_ciphertext_byte_is_tampered(ring):
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)
    forged = dataclasses.replace(sealed, ciphertext=_flip(sealed.ciphertext, 3))

    with pytest.raises(crypto.TamperedError):
        crypto.open_sealed(forged, purpose=PURPOSE, tenant=1, run=7)


def test_open_sealed_flipped_tag_byte_is_tampered(ring):
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)
    forged = dataclasses.replace(sealed, ciphertext=_flip(sealed.ciphertext, -1))

    with pytest.raises(crypto.TamperedError):
        crypto.open_sealed(forged, purpose=PURPOSE, tenant=1, run=7)


def test_open_sealed_flipped_nonce_byte_is_tampered(ring):
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)
    forged = dataclasses.replace(sealed, nonce=_flip(sealed.nonce, 0))

    with pytest.raises(crypto.TamperedError):
        crypto.open_sealed(forged, purpose=PURPOSE, tenant=1, run=7)


def test_open_sealed_empty_nonce_is_tampered(ring):
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)
    forged = dataclasses.replace(sealed, nonce=b"")

    with pytest.raises(crypto.TamperedError):
        crypto.open_sealed(forged, purpose=PURPOSE, tenant=1, run=7)


@pytest.mark.parametrize(
    ("purpose", "binding"),
    [
        (PURPOSE, {"tenant": 1, "run": 8}),
        (PURPOSE, {"tenant": 2, "run": 7}),
        (PURPOSE, {"tenant": 1, "run": 7, "generation": 2}),
        (PURPOSE, {"tenant": 1}),
        ("tests.other_purpose", {"tenant": 1, "run": 7}),
    ],
    ids=["other-run", "other-tenant", "extra-binding", "missing-binding", "other-purpose"],
)
def test_open_sealed_different_binding_is_tampered(ring, purpose, binding):
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)

    with pytest.raises(crypto.TamperedError):
        crypto.open_sealed(sealed, purpose=purpose, **binding)


def test_open_sealed_unknown_key_id_is_refused(ring):
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)
    ring(("k2", K2))

    with pytest.raises(crypto.UnknownKeyError) as excinfo:
        crypto.open_sealed(sealed, purpose=PURPOSE, tenant=1, run=7)

    assert str(excinfo.value) == "key 'k1' is not in the key ring"


def test_open_sealed_relabelled_key_id_is_tampered(ring):
    ring(("k1", K1), ("k2", K2))
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)
    relabelled = dataclasses.replace(sealed, key_id="k2")

    with pytest.raises(crypto.TamperedError):
        crypto.open_sealed(relabelled, purpose=PURPOSE, tenant=1, run=7)


def test_open_sealed_after_rotation_opens_a_blob_of_the_old_key(ring):
    sealed = crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7)
    ring(("k2", K2), ("k1", K1))

    assert crypto.primary_key_id() == "k2"
    assert crypto.open_sealed(sealed, purpose=PURPOSE, tenant=1, run=7) == PLAINTEXT
    assert crypto.seal(PLAINTEXT, purpose=PURPOSE, tenant=1, run=7).key_id == "k2"


# --- real run states -------------------------------------------------------------------------


@pytest.mark.django_db
def test_pause_run_state_ciphertext_does_not_contain_the_prompt(ring):
    run = paused_run(TenantFactory(), prompt="Deploy release 2026.07.24 to production")

    state = open_state(run)

    assert state["original_input"] == "Deploy release 2026.07.24 to production"
    assert b"2026.07.24" not in bytes(run.state_ciphertext)
    assert b"deploy_release" not in bytes(run.state_ciphertext)


def test_seal_compresses_at_zlibs_fastest_level(ring):
    """Every pause pays for the compression: level 1 (a third of the default's time on a
    100-turn state, about as small). The blob holds exactly level 1's stream, under GCM."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    plaintext = json.dumps(
        {"turns": [{"role": "assistant", "text": "x" * 40 + str(n)} for n in range(200)]}
    ).encode()

    sealed = crypto.seal(plaintext, purpose=PURPOSE, tenant=1)

    aad = crypto.associated_data(purpose=PURPOSE, key_id="k1", tenant=1)
    compressed = AESGCM(K1).decrypt(sealed.nonce, sealed.ciphertext, aad)
    assert compressed == zlib.compress(plaintext, 1)
    assert compressed != zlib.compress(plaintext)
    assert crypto.open_sealed(sealed, purpose=PURPOSE, tenant=1) == plaintext


@pytest.mark.django_db
def test_pause_run_state_is_compressed_below_its_json_size(ring):
    run = paused_run(TenantFactory())

    plaintext = json.dumps(open_state(run), ensure_ascii=False).encode()

    assert len(bytes(run.state_ciphertext)) < len(plaintext)


@pytest.mark.django_db
def test_open_state_swapped_between_runs_is_tampered(ring):
    tenant = TenantFactory()
    first = paused_run(tenant)
    second = paused_run(tenant, prompt="Deploy release 2026.07.25 to staging")
    second.state_key_id = first.state_key_id
    second.state_nonce = first.state_nonce
    second.state_ciphertext = first.state_ciphertext

    with pytest.raises(crypto.TamperedError):
        open_state(second)


@pytest.mark.django_db
def test_rotate_keys_reencrypts_a_paused_run_under_the_new_primary(ring):
    run = paused_run(TenantFactory())
    before = open_state(run)
    assert run.state_key_id == "k1"
    ring(("k2", K2), ("k1", K1))

    counts = rotate_keys()

    assert counts == {"rotated": 1, "already_current": 0, "failed": 0}
    run.refresh_from_db()
    assert run.state_key_id == "k2"
    ring(("k2", K2))
    assert open_state(run) == before


@pytest.mark.django_db
def test_rotate_keys_run_not_rotated_fails_once_the_old_key_is_removed(ring):
    tenant = TenantFactory()
    rotated = paused_run(tenant)
    ring(("k2", K2), ("k1", K1))
    rotate_keys()
    # A run paused by a process that still had only k1, after the rotation ran.
    ring(("k1", K1))
    late = paused_run(tenant, prompt="Deploy release 2026.07.25 to staging")
    ring(("k2", K2))

    assert open_state(Run.objects.get(pk=rotated.pk))["original_input"] == (
        "Deploy release 2026.07.24 to production"
    )
    with pytest.raises(crypto.UnknownKeyError):
        open_state(Run.objects.get(pk=late.pk))


@pytest.mark.django_db
def test_rotate_keys_repeated_counts_runs_as_already_current(ring):
    tenant = TenantFactory()
    paused_run(tenant)
    paused_run(tenant, prompt="Deploy release 2026.07.25 to staging")
    ring(("k2", K2), ("k1", K1))
    rotate_keys()

    counts = rotate_keys()

    assert counts == {"rotated": 0, "already_current": 2, "failed": 0}


@pytest.mark.django_db
def test_rotate_keys_unopenable_run_is_counted_failed_and_left_alone(ring):
    run = paused_run(TenantFactory())
    ciphertext = bytes(run.state_ciphertext)
    ring(("k2", K2))

    counts = rotate_keys()

    assert counts == {"rotated": 0, "already_current": 0, "failed": 1}
    run.refresh_from_db()
    assert (run.state_key_id, bytes(run.state_ciphertext)) == ("k1", ciphertext)


@pytest.mark.django_db
def test_rotate_keys_writes_one_audit_event_per_tenant(ring):
    acme = TenantFactory(slug="acme")
    paused_run(acme)
    paused_run(acme, prompt="Deploy release 2026.07.25 to staging")
    paused_run(TenantFactory(slug="globex"))
    ring(("k2", K2), ("k1", K1))

    rotate_keys()

    events = AuditEvent.objects.filter(action="keys.rotated").order_by("tenant__slug")
    assert [(e.tenant.slug, e.detail) for e in events] == [
        ("acme", {"runs": 2, "key": "k2"}),
        ("globex", {"runs": 1, "key": "k2"}),
    ]


def _before_the_first_lock(monkeypatch, act) -> None:
    """Run act() once, between rotate_keys' read of the stale runs and its first lock."""
    atomic, done = state.transaction.atomic, []

    def first(*args, **kwargs):
        if not done:
            done.append(True)
            act()
        return atomic(*args, **kwargs)

    monkeypatch.setattr(state, "transaction", SimpleNamespace(atomic=first))


@pytest.mark.django_db
def test_rotate_keys_counts_runs_another_rotation_resealed_meanwhile_once(ring, monkeypatch):
    tenant = TenantFactory()
    runs = [paused_run(tenant), paused_run(tenant, prompt="Deploy release 2026.07.25 to staging")]
    ring(("k2", K2), ("k1", K1))
    other: list[dict[str, int]] = []
    # Another rotation re-seals them all.
    _before_the_first_lock(monkeypatch, lambda: other.append(rotate_keys()))

    counts = rotate_keys()

    assert other == [{"rotated": 2, "already_current": 0, "failed": 0}]
    assert counts == {"rotated": 0, "already_current": 2, "failed": 0}
    assert {Run.objects.get(pk=run.pk).state_key_id for run in runs} == {"k2"}
    assert AuditEvent.objects.filter(action="keys.rotated").count() == 1


@pytest.mark.django_db
def test_rotate_keys_goes_on_past_a_run_another_rotation_resealed_meanwhile(ring, monkeypatch):
    tenant = TenantFactory()
    first, second = paused_run(tenant), paused_run(tenant, prompt="Deploy 2026.07.25 to staging")
    ring(("k2", K2), ("k1", K1))
    resealed: list[int] = []

    def another_rotation_reseals_the_first() -> None:
        run = Run.objects.get(pk=first.pk)
        state.seal_state(run, state.open_sealed_state(run), run.state_generation)
        run.save(update_fields=["state_key_id", "state_nonce", "state_ciphertext"])
        resealed.append(run.pk)

    _before_the_first_lock(monkeypatch, another_rotation_reseals_the_first)

    counts = rotate_keys()

    assert resealed == [first.pk]
    assert counts == {"rotated": 1, "already_current": 1, "failed": 0}
    assert [Run.objects.get(pk=run.pk).state_key_id for run in (first, second)] == ["k2", "k2"]
    # Each still opens, under the new key.
    assert [
        open_state(Run.objects.get(pk=run.pk))["$schemaVersion"] for run in (first, second)
    ] == [
        first.schema_version,
        second.schema_version,
    ]


@pytest.mark.django_db
def test_rotate_keys_counts_every_run_it_rotated_or_could_not_open_and_goes_on_past_those(
    ring,
):
    tenant = TenantFactory()
    # Paused under a key the ring no longer has: these cannot be opened.
    ring(("k0", os.urandom(32)))
    lost = [paused_run(tenant), paused_run(tenant, prompt="Deploy release 2026.07.25 to qa")]
    ring(("k1", K1))
    kept = [paused_run(tenant), paused_run(tenant, prompt="Deploy release 2026.07.25 to staging")]
    ring(("k2", K2), ("k1", K1))

    counts = rotate_keys()

    assert counts == {"rotated": 2, "already_current": 0, "failed": 2}
    assert [Run.objects.get(pk=run.pk).state_key_id for run in lost + kept] == [
        "k0",
        "k0",
        "k2",
        "k2",
    ]
    event = AuditEvent.objects.get(action="keys.rotated")
    assert (event.tenant_id, event.actor_name, event.outcome, event.detail) == (
        tenant.pk,
        "rotate_keys",
        "rotated",
        {"runs": 2, "key": "k2"},
    )
