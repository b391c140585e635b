"""Pausing: the agent's code hands over a paused run; the console stores it and opens its tickets."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals import signals
from approvals.audit import chain
from approvals.core.redaction import secret_shape
from approvals.decisions import tickets
from approvals.execution import registry, state
from approvals.execution.sessions import describe
from approvals.execution.state import NoInterruptionsError
from approvals.models import (
    Run,
    RunStatus,
    Tenant,
)


def _title_from(original_input: Any) -> str:
    text = original_input if isinstance(original_input, str) else ""
    if not text and isinstance(original_input, list):
        for item in original_input:
            if isinstance(item, dict) and item.get("role") == "user":
                content = item.get("content")
                text = content if isinstance(content, str) else ""
                break
    text = " ".join(text.split())
    return "[redacted]" if secret_shape(text) else text[:200]


def pause_run(
    result,
    *,
    tenant: Tenant,
    agent_key: str,
    agent_version: str,
    requested_by=None,
    session=None,
    context_serializer=None,
) -> Run:
    """Store a paused RunResult and open one ticket per interruption.

    Side effects, in one transaction: a Run with the compressed, encrypted state; one Ticket per
    interruption (canonical arguments, SHA-256 digest, expiry); audit events run.paused and
    ticket.created; after commit, a live hint to the tenant's pages and signals.run_paused.
    Raises NoInterruptionsError, registry.UnknownAgentError, ContextNotSerializableError,
    SecretInContextError or UnsupportedSessionError, having written nothing.
    """
    interruptions = list(result.interruptions or [])
    if not interruptions:
        raise NoInterruptionsError("the run is not waiting for any approval; nothing to store")
    spec = registry.get_spec(agent_key, str(agent_version))
    state_json, payload = state.serialize_state(
        result.to_state(),
        context=result.context_wrapper.context,
        context_serializer=context_serializer or spec.context_serializer,
    )
    ref = describe(session)
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.create(
            tenant=tenant,
            agent_key=agent_key,
            agent_version=str(agent_version),
            schema_version=str(state_json.get("$schemaVersion", "")),
            title=_title_from(state_json.get("original_input")),
            requested_by=requested_by,
            state_key_id="",
            state_nonce=b"",
            state_ciphertext=b"",
            session_backend=ref.backend,
            session_id=ref.session_id,
            session_location=ref.location,
            created_at=now,
            updated_at=now,
        )
        # The blob's associated data names the run, so the row must exist before sealing.
        state.seal_state(run, payload, generation=1)
        run.save(update_fields=["state_key_id", "state_nonce", "state_ciphertext"])
        chain.append(
            tenant_id=tenant.pk,
            action="run.paused",
            actor=requested_by,
            run_id=run.pk,
            outcome=RunStatus.PAUSED,
            detail={
                "agent": agent_key,
                "version": str(agent_version),
                "schema": run.schema_version,
                "tickets": len(interruptions),
                "session": ref.backend or "none",
            },
        )
        tickets.open_tickets(run, interruptions, requested_by=requested_by, now=now, resumed=False)
        signals.send_on_commit(signals.run_paused, run=run)
    return run
