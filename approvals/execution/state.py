"""The run's state at rest: serialised (refusing secrets and unstorable contexts), sealed with the
console's keys and bound to its tenant, run and generation; opened again; re-sealed when keys
rotate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agents import RunState
from agents.exceptions import UserError
from django.db import transaction

from approvals.audit import chain
from approvals.core import crypto
from approvals.core.errors import DomainError
from approvals.core.redaction import find_secrets
from approvals.models import (
    Run,
)


class PauseError(DomainError):
    """The paused run cannot be stored; nothing was written."""


class NoInterruptionsError(PauseError):
    pass


class ContextNotSerializableError(PauseError):
    pass


class SecretInContextError(PauseError):
    pass


STATE_PURPOSE = "approvals.run_state.v1"


def binding(run: Run, generation: int) -> dict[str, object]:
    return {"tenant": run.tenant_id, "run": run.pk, "generation": generation}


def serialize_state(
    state: RunState, *, context: Any, context_serializer=None
) -> tuple[dict, bytes]:
    """The state as JSON, refusing contexts that cannot be stored safely.

    The SDK stores a mapping context as it is and only consults a context_serializer for other
    types; here the serializer applies to mappings too, so that runtime dependencies (clients,
    tokens) can be left out of any context and put back by the deserializer at resume.
    """
    try:
        state_json = state.to_json(context_serializer=context_serializer, strict_context=True)
        if context_serializer is not None and isinstance(context, Mapping):
            serialized = context_serializer(context)
            if not isinstance(serialized, Mapping):
                raise TypeError("the context_serializer must return a mapping")
            state_json["context"]["context"] = dict(serialized)
            # As the SDK marks what its serializer made: only the deserializer rebuilds it whole.
            meta = state_json["context"]["context_meta"]
            meta["serialized_via"], meta["requires_deserializer"] = "context_serializer", True
        payload = json.dumps(state_json, ensure_ascii=False, allow_nan=False).encode()
    except (UserError, TypeError, ValueError) as error:
        raise ContextNotSerializableError(
            f"the run's context cannot be stored: {error}. Keep connections, locks and clients "
            "out of the context, or give the agent a context_serializer that leaves them out."
        ) from None
    refuse_secrets(state_json)
    return state_json, payload


def refuse_secrets(state_json: dict) -> None:
    """Raise SecretInContextError when the state's context (or tool input) holds what looks
    like a secret; the paths found, never the values, are in the sentence."""
    context_entry = state_json.get("context")
    context_entry = context_entry if isinstance(context_entry, Mapping) else {}
    found = list(find_secrets(context_entry.get("context"), "context"))
    found += list(find_secrets(context_entry.get("tool_input"), "tool_input"))
    if found:
        raise SecretInContextError(
            "the run's context holds what looks like a secret, which must never be stored: "
            + ", ".join(found[:5])
            + ". Leave it out with a context_serializer and re-inject it in the "
            "context_deserializer from the environment."
        )


def seal_state(run: Run, payload: bytes, generation: int) -> None:
    sealed = crypto.seal(payload, purpose=STATE_PURPOSE, **binding(run, generation))
    run.state_key_id = sealed.key_id
    run.state_nonce = sealed.nonce
    run.state_ciphertext = sealed.ciphertext
    run.state_generation = generation


# The run's columns seal_state() sets.
SEALED_FIELDS = ("state_key_id", "state_nonce", "state_ciphertext", "state_generation")


def sealed_fields(run: Run) -> dict[str, object]:
    """The sealed state's columns as seal_state() left them on the row, for an UPDATE."""
    return {name: getattr(run, name) for name in SEALED_FIELDS}


def open_sealed_state(run: Run) -> bytes:
    """The run's stored state as sealed. Raises crypto.CryptoError when it cannot be trusted."""
    return crypto.open_sealed(
        crypto.Sealed(run.state_key_id, bytes(run.state_nonce), bytes(run.state_ciphertext)),
        purpose=STATE_PURPOSE,
        **binding(run, run.state_generation),
    )


def open_state(run: Run) -> dict:
    """The run's stored state as JSON. Raises crypto.CryptoError when it cannot be trusted."""
    return json.loads(open_sealed_state(run))


def rotate_keys() -> dict[str, int]:
    """Re-encrypt every stored state under the primary key.

    Side effects: each run not yet under the primary key is re-sealed in its own transaction
    (row locked); one audit event keys.rotated per tenant with the count. Runs whose blob
    cannot be opened are left as they are and counted as failed.
    """
    primary = crypto.primary_key_id()
    counts = {"rotated": 0, "already_current": 0, "failed": 0}
    per_tenant: dict[int, int] = {}
    stale = Run.objects.exclude(state_key_id=primary).order_by("pk")
    for run_id in stale.values_list("pk", flat=True).iterator():
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            if run.state_key_id == primary:
                # Another rotation re-sealed it meanwhile: counted with the current ones below.
                continue
            try:
                plaintext = open_sealed_state(run)
            except crypto.CryptoError:
                counts["failed"] += 1
                continue
            seal_state(run, plaintext, run.state_generation)
            run.save(update_fields=["state_key_id", "state_nonce", "state_ciphertext"])
            counts["rotated"] += 1
            per_tenant[run.tenant_id] = per_tenant.get(run.tenant_id, 0) + 1
    counts["already_current"] = Run.objects.filter(state_key_id=primary).count() - counts["rotated"]
    for tenant_id, count in per_tenant.items():
        with transaction.atomic():
            chain.append(
                tenant_id=tenant_id,
                action="keys.rotated",
                actor_name="rotate_keys",
                outcome="rotated",
                detail={"runs": count, "key": primary},
            )
    return counts
