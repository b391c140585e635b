"""Pausing: the agent's code hands over a paused run; the console stores it and opens its tickets.

Three functions store a pause, whoever holds the agent: store_pause a run handed over already
paused (pause_run; runs.remote for a caller's), store_first_pause the first pause of a run the
worker started (runs.start), and store_next_pause a run that paused again (the worker's resume;
runs.remote's report for a caller's). A first pause's audit event, tickets and signal are
written by one function either way (_first_paused).
"""

from __future__ import annotations

from typing import Any

from django.db import connections, router
from django.utils import timezone

from approvals import signals, transitions
from approvals.audit import chain, changes
from approvals.core import faults, statements
from approvals.core.redaction import secret_shape
from approvals.decisions import tickets
from approvals.decisions.tickets import PendingCall
from approvals.execution import registry, state
from approvals.execution.sessions import SessionRef, describe
from approvals.execution.state import NoInterruptionsError
from approvals.live import hints
from approvals.models import (
    Run,
    RunExecutor,
    RunStatus,
    Tenant,
    Ticket,
)


def title_from(original_input: Any) -> str:
    """A run's title: the text of its input (or of the first user message), on one line, at
    most 200 characters, and "[redacted]" when it looks like a secret."""
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
    run, _ = store_pause(
        tenant=tenant,
        agent_key=agent_key,
        agent_version=str(agent_version),
        state_json=state_json,
        payload=payload,
        calls=[PendingCall.of(item) for item in interruptions],
        requested_by=requested_by,
        session=describe(session),
        title=title_from(state_json.get("original_input")),
    )
    return run


def store_pause(
    *,
    tenant: Tenant,
    agent_key: str,
    agent_version: str,
    state_json: dict,
    payload: bytes,
    calls: list[PendingCall],
    requested_by,
    session: SessionRef,
    title: str,
    executor: str = RunExecutor.CONSOLE,
    detail: dict | None = None,
) -> tuple[Run, list[Ticket]]:
    """A paused run handed over whole, whoever holds the agent (pause_run, and runs.remote for
    a caller's run): the Run row with its state sealed as generation 1, audit event run.paused
    with detail merged in, one ticket per call, signals.run_paused after commit. On PostgreSQL
    the row is born paused (transitions.born_paused: its id read ahead, one INSERT); elsewhere
    it is created starting and moved by store_first_pause. One transaction; the state must
    already be checked. Returns the run and its tickets as store_first_pause returns them.
    """
    now = timezone.now()
    fields = {
        "tenant": tenant,
        "agent_key": agent_key,
        "agent_version": agent_version,
        "title": title,
        "requested_by": requested_by,
        "session_backend": session.backend,
        "session_id": session.session_id,
        "session_location": session.location,
        "executor": executor,
        "created_at": now,
        "updated_at": now,
    }
    schema_version = str(state_json.get("$schemaVersion", ""))
    using = router.db_for_write(Run)
    with chain.atomic():
        if connections[using].vendor == "postgresql":
            # Born paused: its id read ahead, its state sealed to it, one INSERT that also takes
            # the tenant's audit head (the head the events below link to).
            run = Run(
                pk=transitions.reserve_run_id(using),
                status=RunStatus.PAUSED,
                schema_version=schema_version,
                **fields,
            )
            state.seal_state(run, payload, generation=1)
            sql, params = transitions.born_paused(run, using=using)
            if len(changes.update_holding_head(sql, params, returning="1", using=using)) != 1:
                raise RuntimeError(f"run {run.pk} was not written paused")
            run._state.adding, run._state.db = False, using
            opened = _first_paused(run, schema_version, calls, requested_by, "", detail, now)
        else:
            # Created starting, then moved to paused by the one function that stores a run's
            # first pause, as a run the worker started is (nobody sees the row before the commit).
            run = transitions.create_run(
                schema_version=schema_version,
                state_key_id="",
                state_nonce=b"",
                state_ciphertext=b"",
                **fields,
            )
            opened = store_first_pause(
                run,
                state_json=state_json,
                payload=payload,
                calls=calls,
                requested_by=requested_by,
                detail=detail,
            )
            if opened is None:
                # A row nobody else sees before the commit is held as it was created.
                raise RuntimeError(
                    f"run {run.pk}, created in this transaction, was not held as created"
                )
    return run, opened


def store_first_pause(
    run: Run,
    *,
    state_json: dict,
    payload: bytes,
    calls: list[PendingCall],
    requested_by,
    actor_name: str = "",
    detail: dict | None = None,
) -> list[Ticket] | None:
    """The first pause of a run that is starting: a run the worker started (runs.start) that
    paused, or on SQLite a new row of pause_run or runs.remote (store_pause). The run is starting
    and held by whoever calls (a lease, or a row nobody else sees yet): its state sealed as
    generation 1, the run moved to paused (lease cleared), audit event run.paused (detail merged
    in), one ticket per call (decisions.tickets), and after commit signals.run_paused.

    Runs in the caller's transaction; the state must already be checked. Returns the tickets
    opened, as they stand when it returns (decisions.tickets.open_tickets: the automatic
    deciders may have decided some; a first pause's tickets have no votes yet), or None, having
    written nothing, when the run is no longer held as the caller saw it.
    """
    now = timezone.now()
    state.seal_state(run, payload, generation=1)
    schema_version = str(state_json.get("$schemaVersion", ""))
    values = {
        "run": run.pk,
        "owner": run.lease_owner,
        "attempts": run.attempts,
        **state.sealed_fields(run),
        "schema": schema_version,
        "now": now,
    }
    if connections[run._state.db].vendor == "postgresql":
        # Every pause sends it: written once per process (core.statements).
        sql, params = statements.statement("pause.store_first_pause", _first_pause, values)
    else:
        sql, params = _first_pause(values)
    moved = changes.update_holding_head(sql, params, returning="1", using=run._state.db)
    if not moved:
        return None
    # What the move wrote, without reading it back.
    run.status, run.status_reason, run.schema_version = RunStatus.PAUSED, "", schema_version
    run.lease_owner, run.lease_expires_at, run.updated_at = "", None, now
    return _first_paused(run, schema_version, calls, requested_by, actor_name, detail, now)


def _first_paused(
    run: Run,
    schema_version: str,
    calls: list[PendingCall],
    requested_by,
    actor_name: str,
    detail: dict | None,
    now,
) -> list[Ticket]:
    """What follows a run's first pause, however its row was written (moved to paused, or born
    paused): audit event run.paused, its tickets, signals.run_paused after commit."""
    chain.append(
        tenant_id=run.tenant_id,
        action="run.paused",
        actor=requested_by if not actor_name else None,
        actor_name=actor_name,
        run_id=run.pk,
        outcome=RunStatus.PAUSED,
        detail={
            "agent": run.agent_key,
            "version": run.agent_version,
            "schema": schema_version,
            "tickets": len(calls),
            "session": run.session_backend or "none",
            **(detail or {}),
        },
    )
    opened = tickets.open_tickets(run, calls, requested_by=requested_by, now=now, resumed=False)
    signals.send_on_commit(signals.run_paused, run=run)
    return opened


def _first_pause(values) -> tuple[str, tuple]:
    """store_first_pause's move of the run, held as its caller saw it, to paused with its
    sealed state: the UPDATE and its parameters."""
    held = Run.objects.filter(
        pk=values["run"],
        status=RunStatus.STARTING,
        lease_owner=values["owner"],
        attempts=values["attempts"],
    )
    return transitions.move_run_statement(
        held,
        to=RunStatus.PAUSED,
        **{name: values[name] for name in state.SEALED_FIELDS},
        schema_version=values["schema"],
        status_reason="",
        lease_owner="",
        lease_expires_at=None,
        updated_at=values["now"],
    )


def store_next_pause(
    run: Run,
    *,
    payload: bytes,
    calls: list[PendingCall],
    actor=None,
    actor_name: str = "",
    schema_version: str | None = None,
    detail: dict | None = None,
) -> None:
    """The one way a run that went on pauses again, whoever ran it (the worker's resume, or
    its caller's report): the new state sealed as the next generation, the run moved back to
    paused, audit event run.paused, one ticket per new call (earlier generations' tickets stay
    as they were decided), a live hint after commit.

    Runs in the caller's transaction, which holds the run's row locked and has checked that
    the run may pause again from where it is.
    """
    now = timezone.now()
    generation = run.state_generation + 1
    state.seal_state(run, payload, generation)
    transitions.move_runs(
        Run.objects.filter(pk=run.pk),
        to=RunStatus.PAUSED,
        write=changes.update_queryset_holding_head,
        **state.sealed_fields(run),
        **({"schema_version": schema_version} if schema_version is not None else {}),
        status_reason="",
        lease_owner="",
        lease_expires_at=None,
        updated_at=now,
    )
    # The tickets opened below read the run as it is now: what the move wrote.
    run.status, run.status_reason, run.updated_at = RunStatus.PAUSED, "", now
    run.lease_owner, run.lease_expires_at = "", None
    if schema_version is not None:
        run.schema_version = schema_version
    faults.point("while_storing_pause")
    chain.append(
        tenant_id=run.tenant_id,
        action="run.paused",
        actor=actor,
        actor_name=actor_name,
        run_id=run.pk,
        outcome=RunStatus.PAUSED,
        detail={"tickets": len(calls), "generation": generation, **(detail or {})},
    )
    tickets.open_tickets(run, calls, requested_by=run.requested_by, now=now, resumed=True)
    hints.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=RunStatus.PAUSED)
