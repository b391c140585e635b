"""Starting a run the console runs: a registered agent, started over the API or a command, run by
the worker, never inside the request.

start_run checks the request (the agent version is deployed, the input has a shape the SDK
takes, the context can be stored exactly as pause_run stores one: execution.state's
serialize_state, secrets refused), seals the input and the context as the run's generation 0
(the state blob's key, purpose and binding to tenant and run; nothing of them in plain text
in the row), and creates the run in starting with its start task in one transaction.

The worker's task (start) claims the run with the same lease as a resume (runs.lease), opens
the sealed request, builds the agent from the registry (its context deserializer puts runtime
dependencies back), and runs it with the input, the context and the run's session, tool effects
through the ledger: interruptions pause the run with its tickets exactly as pause_run does
(runs.pause.store_first_pause), a final output completes it, an exception fails it with a safe
reason, an effect whose outcome is unknown parks it in needs attention.

A worker that dies while starting leaves the run starting under a lease that lapses. The
reaper then clears the lease and gives the run its start task again (runs.reaper), and the next
claim starts the agent again from its sealed input, as attempt + 1: the model is asked again;
an effect the earlier attempt confirmed is not repeated (the ledger's key is the run, the
operation and the resource), one it claimed without confirming parks the run in needs
attention; turns the earlier attempt wrote to the run's session stay in it. Past
APPROVALS_MAX_ATTEMPTS the run fails instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agents import RunContextWrapper, RunState
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals import members, transitions
from approvals.audit import chain
from approvals.core import crypto
from approvals.core.errors import DomainError, ForbiddenError
from approvals.decisions.tickets import PendingCall
from approvals.execution import ledger, queue, registry, state
from approvals.execution.sessions import NO_SESSION, SessionRef
from approvals.live import hints
from approvals.models import Run, RunExecutor, RunStatus, Tenant
from approvals.runs import checks, lease
from approvals.runs.pause import store_first_pause, title_from

# The sealed start request is the run's generation 0; its first pause is generation 1.
START_GENERATION = 0
REQUEST_VERSION = 1
# A started run's conversation lives in the console's own session store (sessions_admin's
# ORM session, opened by name through APPROVALS_SESSION_OPENERS).
SESSION_BACKEND = "django"
MAX_INPUT_CHARS = 100_000


class StartError(DomainError):
    """The start request cannot be run as it is; nothing was written."""


class NotAMemberError(ForbiddenError):
    """The person named as requesting the run is not a member of its tenant."""


def _text(value: Any, what: str, *, limit: int) -> str:
    if not isinstance(value, str):
        raise StartError(f"the {what} must be text")
    value = value.strip()
    if not value:
        raise StartError(f"name the {what}")
    if len(value) > limit:
        raise StartError(f"the {what} is longer than {limit} characters")
    return value


def _checked_input(value: Any) -> str | list[dict]:
    if isinstance(value, str):
        if not value.strip():
            raise StartError("the input is empty: send a prompt or a list of input items")
        if len(value) > MAX_INPUT_CHARS:
            raise StartError(f"the input is longer than {MAX_INPUT_CHARS} characters")
        return value
    if isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
        items = [dict(item) for item in value]
        if len(json.dumps(items, default=str)) > MAX_INPUT_CHARS:
            raise StartError(f"the input is longer than {MAX_INPUT_CHARS} characters")
        return items
    raise StartError("the input must be a prompt (text) or a non-empty list of input items")


def _session(tenant: Tenant, session_id: str | None) -> SessionRef:
    if session_id is None or session_id == "":
        return NO_SESSION
    session_id = _text(session_id, "session id", limit=255)
    if SESSION_BACKEND not in settings.APPROVALS_SESSION_OPENERS:
        raise StartError(
            f"this console has no {SESSION_BACKEND!r} session backend configured, so a started "
            "run cannot keep a session"
        )
    return SessionRef(SESSION_BACKEND, session_id, tenant.slug)


def _request_payload(spec: registry.AgentSpec, run_input: str | list[dict], context: Any):
    """The start request's JSON and bytes; the context as pause_run would store it."""
    fresh = RunState(
        context=RunContextWrapper(context), original_input=run_input, starting_agent=spec.build()
    )
    state_json, _ = state.serialize_state(
        fresh, context=context, context_serializer=spec.context_serializer
    )
    request = {
        "v": REQUEST_VERSION,
        "input": run_input,
        "context": state_json["context"]["context"],
    }
    payload = json.dumps(request, ensure_ascii=False, allow_nan=False).encode()
    return state_json, payload


def start_run(
    *,
    tenant: Tenant,
    agent_key: str,
    agent_version: str,
    input: Any,
    requested_by,
    session_id: str | None = None,
    context: Any = None,
    title: str = "",
    via: dict | None = None,
) -> Run:
    """Start a registered agent in a worker: the run is created starting, the worker runs it.

    input: a prompt or a list of input items. context: what the agent's tools receive (a
    mapping unless the agent version has a context_serializer), checked and stored as
    pause_run stores a context. session_id: the conversation to keep the run in (the console's
    session store, per tenant). title: else the input's text. via (e.g. {"via": "api",
    "token_prefix": ...}) goes into the audit detail.
    Side effects, in one transaction: the Run (starting, executor console) with the input and
    the context sealed as generation 0, audit event run.started, the start task (and on
    PostgreSQL a NOTIFY, delivered on commit); after commit a live hint to the tenant's pages.
    Raises:
        StartError: a key, version, input, session id or title that is not usable (400).
        NotAMemberError: requested_by is not a member of the tenant (403).
        registry.UnknownAgentError: the agent version is not deployed here (400).
        registry.AgentConflictError: the agent key is registered in two places (409).
        state.ContextNotSerializableError, state.SecretInContextError: the context cannot be
            stored, or holds what looks like a secret (400).
    Nothing is written when it raises.
    """
    agent_key = _text(agent_key, "agent", limit=100)
    agent_version = _text(str(agent_version), "agent version", limit=50)
    if not isinstance(title, str):
        raise StartError("the title must be text")
    run_input = _checked_input(input)
    if requested_by is not None and members.membership_for(requested_by, tenant.pk) is None:
        raise NotAMemberError(
            f"{requested_by.get_username()} is not a member of {tenant.slug}, so cannot start "
            "its runs"
        )
    session = _session(tenant, session_id)
    spec = registry.get_spec(agent_key, agent_version)
    context = {} if context is None else context
    state_json, payload = _request_payload(spec, run_input, context)
    now = timezone.now()
    with transaction.atomic():
        run = transitions.create_run(
            tenant=tenant,
            agent_key=agent_key,
            agent_version=agent_version,
            schema_version=str(state_json.get("$schemaVersion", "")),
            title=title_from(title) if title.strip() else title_from(run_input),
            requested_by=requested_by,
            state_key_id="",
            state_nonce=b"",
            state_ciphertext=b"",
            session_backend=session.backend,
            session_id=session.session_id,
            session_location=session.location,
            executor=RunExecutor.CONSOLE,
            created_at=now,
            updated_at=now,
        )
        # The blob's associated data names the run, so the row must exist before sealing.
        state.seal_state(run, payload, generation=START_GENERATION)
        run.save(
            update_fields=["state_key_id", "state_nonce", "state_ciphertext", "state_generation"]
        )
        chain.append(
            tenant_id=tenant.pk,
            action="run.started",
            actor=requested_by,
            run_id=run.pk,
            outcome=RunStatus.STARTING,
            detail={
                "agent": agent_key,
                "version": agent_version,
                "session": session.backend or "none",
                **(via or {}),
            },
        )
        queue.enqueue_start(run.pk)
        hints.notify_on_commit(tenant.pk, "run.changed", run=run.pk, status=RunStatus.STARTING)
    return run


# --- the worker ---------------------------------------------------------------------------------


def _open_request(run: Run, spec: registry.AgentSpec) -> tuple[Any, Any]:
    try:
        request = state.open_state(run)
    except crypto.CryptoError as error:
        raise checks.Refusal(
            f"the start request was refused: {error}; nothing was run", RunStatus.FAILED
        ) from None
    if not isinstance(request, dict) or request.get("v") != REQUEST_VERSION:
        raise checks.Refusal(
            "the start request is not one this code reads; nothing was run", RunStatus.FAILED
        )
    context = request.get("context")
    if spec.context_deserializer is not None:
        context = spec.context_deserializer(context)
    return request.get("input"), context


def _store_pause(run: Run, result, spec: registry.AgentSpec) -> None:
    state_json, payload = state.serialize_state(
        result.to_state(),
        context=result.context_wrapper.context,
        context_serializer=spec.context_serializer,
    )
    store_first_pause(
        run,
        state_json=state_json,
        payload=payload,
        calls=[PendingCall.of(item) for item in result.interruptions],
        requested_by=run.requested_by,
        actor_name=f"worker {run.lease_owner}",
    )


def start(*, run_id: int, worker_id: str | None = None) -> lease.WorkOutcome:
    """Run a starting run's agent, at most once at a time.

    Side effects: claims the run with a lease (runs.lease: a second delivery or worker finds it
    claimed, or no longer starting, and does nothing); opens the sealed request; runs the agent
    (Runner.run with the input, the context and the run's session; side-effecting tools through
    the ledger); stores the outcome: paused with its tickets (store_first_pause), completed with
    its final output, failed with a safe reason, needs_attention when an effect is in doubt,
    or starting again later when its session cannot be read; audit events and live hints for
    each step. Raises nothing: every failure is the run's outcome.
    """
    worker_id = worker_id or lease.worker_identity()
    run = lease.claim(run_id, worker_id, lease.START)
    if run is None:
        return lease.not_claimed(run_id)
    scope = ledger.ResumeScope(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        attempt=f"{worker_id}#{run.attempts}",
        # No call of a starting run is approved: an effect is scoped by the run itself.
        tickets_by_call_id={},
    )
    try:
        if run.attempts > settings.APPROVALS_MAX_ATTEMPTS:
            raise checks.Refusal(
                f"started {run.attempts - 1} times without finishing; look at the worker logs",
                RunStatus.FAILED,
            )
        try:
            spec = registry.get_spec(run.agent_key, run.agent_version)
        except registry.UnknownAgentError as error:
            raise checks.Refusal(f"{error.sentence()} Nothing was run", RunStatus.FAILED) from None
        run_input, context = _open_request(run, spec)
        agent = spec.build()
        with ledger.resume_scope(scope):
            result = lease.run_async(lease.run_agent(run, agent, run_input, context=context))
    except Exception as error:
        return lease.stopped(run, scope, error)
    return lease.settled(
        run, scope, result, store_pause=lambda locked: _store_pause(locked, result, spec)
    )
