"""A run its caller holds: the caller's own process runs the agent, hands the console its pause
(submit_paused), fetches the signed decisions once every ticket is decided (signed_decisions)
and reports what the agent did next (report_outcome).

The console never runs a caller's agent: its worker, the reaper and resolutions leave these runs
(executor caller) alone. Everything else is as for the console's own runs: the state sealed at
rest, one ticket per call through the same store_pause and open_tickets, the same decisions,
expiry and audit chain; execution.queue moves a decided caller's run to awaiting_caller instead
of queueing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from agents import Agent, RunState
from agents.items import ToolApprovalItem
from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from approvals import transitions
from approvals.audit import chain
from approvals.core.canonical import arguments_digest, loads_unique
from approvals.core.errors import ConflictError, DomainError
from approvals.core.redaction import mask_secrets
from approvals.core.signatures import sign_decision
from approvals.decisions.digest import stored_call
from approvals.decisions.tickets import PendingCall
from approvals.execution import registry, state
from approvals.execution.sessions import NO_SESSION, SessionRef
from approvals.execution.state import PauseError
from approvals.live import hints
from approvals.models import (
    Run,
    RunExecutor,
    RunStatus,
    Tenant,
    Ticket,
    TicketStatus,
    TicketVote,
)
from approvals.runs import lease
from approvals.runs.pause import store_next_pause, store_pause, title_from

# The session a caller's run names lives in its caller's process, never reopened here.
CALLER_SESSION = "caller"
DECISION_VERSION = 1
OUTCOMES = ("completed", "paused", "failed")
# A run's decisions are signed once the caller may act on them, and stay readable after.
DECIDED_RUN_STATUSES = frozenset(
    {RunStatus.AWAITING_CALLER, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.EXPIRED}
)


# The agent a ToolApprovalItem must name: reading a call from JSON needs none of its own (the
# call's agent name is taken from the JSON), and building an Agent costs more than the reading.
_ANY_AGENT = Agent(name="agent")
# Run's columns that are not relations (submit_paused reads them again after the tickets).
_OWN_COLUMNS = [
    f.attname for f in Run._meta.concrete_fields if not (f.is_relation or f.primary_key)
]


class InvalidStateError(PauseError):
    """The state a caller sent is not a paused run the console can hold; nothing was written."""


class InvalidOutcomeError(DomainError):
    """The outcome a caller reported is not one the console understands; nothing was written."""


class OutcomeConflictError(ConflictError):
    """The run is not where this outcome can be reported from; nothing was written."""


@dataclass(frozen=True)
class Submitted:
    """A caller's pause as submit_paused stored it: the run, and its tickets as they stand
    (no votes yet: a first pause has none)."""

    run: Run
    tickets: list[Ticket]


@dataclass(frozen=True)
class CheckedState:
    """A caller's state that may be stored: its JSON, the bytes to seal and its calls."""

    json: dict
    payload: bytes
    calls: list[PendingCall]

    @property
    def schema_version(self) -> str:
        return str(self.json["$schemaVersion"])


# --- reading a caller's state -------------------------------------------------------------------


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return mask_secrets(text)[:300]


def _as_object(state_json: Any) -> dict:
    if isinstance(state_json, str | bytes):
        try:
            state_json = loads_unique(state_json)
        except ValueError as error:
            raise InvalidStateError(f"the state is not JSON: {_short(error)}") from None
    if not isinstance(state_json, dict):
        raise InvalidStateError("the state must be a JSON object: send RunState.to_json() as it is")
    return state_json


def _interruptions(value: dict) -> list[dict]:
    """The interruptions of a state paused for approval, as the SDK reads them."""
    step = value.get("current_step")
    if not isinstance(step, dict) or step.get("type") != "next_step_interruption":
        raise InvalidStateError(
            "the state is not paused for approval: its current_step is not next_step_interruption"
        )
    data = step.get("data")
    items = (
        data.get("interruptions", step.get("interruptions"))
        if isinstance(data, dict)
        else step.get("interruptions")
    )
    if not isinstance(items, list) or not items:
        raise InvalidStateError("the state is paused but has no tool_approval_item to decide")
    for number, item in enumerate(items, start=1):
        if not isinstance(item, dict) or item.get("type") != "tool_approval_item":
            raise InvalidStateError(f"interruption {number} is not a tool_approval_item")
    return items


def _call_of(number: int, item: dict) -> PendingCall:
    """A call read from the JSON of one tool_approval_item, with the SDK's own reading of its
    name, arguments and call id (ToolApprovalItem), so that it opens the ticket pause_run
    would open for the same interruption."""
    raw = item.get("raw_item", item.get("rawItem"))
    if not isinstance(raw, dict):
        raise InvalidStateError(f"interruption {number} has no raw_item object")
    agent = item.get("agent")
    agent_name = agent.get("name") if isinstance(agent, dict) else agent
    agent_name = agent_name if isinstance(agent_name, str) else ""
    tool_name, namespace = item.get("tool_name"), item.get("tool_namespace")
    sdk_item = ToolApprovalItem(
        agent=_ANY_AGENT,
        raw_item=dict(raw),
        tool_name=tool_name if isinstance(tool_name, str) else None,
        tool_namespace=namespace if isinstance(namespace, str) else None,
    )
    call = PendingCall.of(sdk_item)
    if not call.name:
        raise InvalidStateError(f"interruption {number} names no tool")
    if not call.call_id or not isinstance(call.call_id, str):
        raise InvalidStateError(f"interruption {number} ({call.name}) has no call_id")
    return PendingCall(
        name=call.name,
        qualified_name=call.qualified_name,
        arguments=call.arguments,
        call_id=call.call_id,
        agent_name=agent_name,
    )


def _require_stored(value: dict, number: int, call: PendingCall) -> None:
    """The call is the one the digest gate will find in the state (decisions.digest): a ticket
    an approver cannot verify must not be opened."""
    found = stored_call(value, call.call_id)
    if found is None:
        raise InvalidStateError(
            f"interruption {number} (call {call.call_id!r}) is not among the state's "
            "generated_items"
        )
    raw, names = found
    if (call.qualified_name or call.name) not in names:
        raise InvalidStateError(
            f"interruption {number} (call {call.call_id!r}) names another tool than its "
            "generated item"
        )
    if arguments_digest(raw) != arguments_digest(call.arguments):
        raise InvalidStateError(
            f"interruption {number} (call {call.call_id!r}) has other arguments than its "
            "generated item"
        )


def _loaded_calls(spec: registry.AgentSpec, value: dict, expected: int) -> list[PendingCall]:
    """The calls of the state as the registered agent version loads it (RunState.from_json)."""
    try:
        # On this thread's kept event loop: a fresh one per state costs milliseconds. The
        # agent is the one the process keeps for loading: building it costs milliseconds too.
        loaded = lease.run_async(
            RunState.from_json(
                registry.loading_agent(spec.key, spec.version),
                value,
                context_deserializer=spec.context_deserializer,
                # Only its calls are read here: the caller resumes it, rebuilding its own context.
                strict_context=False,
            )
        )
        calls = [PendingCall.of(item) for item in loaded.get_interruptions()]
    except Exception as error:
        raise InvalidStateError(
            f"agent {spec.key!r} version {spec.version!r} cannot load this state: {_short(error)}"
        ) from None
    if len(calls) != expected:
        raise InvalidStateError(
            f"agent {spec.key!r} version {spec.version!r} finds {len(calls)} of the state's "
            f"{expected} interruptions: the others name agents it does not have"
        )
    return calls


def check_state(agent_key: str, agent_version: str, state_json: Any) -> CheckedState:
    """A caller's paused state, checked as far as the console can check it.

    Always: a JSON object (a str is parsed, refusing repeated keys) of an SDK $schemaVersion
    this SDK supports, paused on next_step_interruption with at least one tool_approval_item,
    each naming its tool and call id (call ids distinct) and found, with the same tool and
    arguments, where the digest gate reads it (its generated_items), and no secret in its
    context. When the
    agent version is registered (execution.registry), also loaded with RunState.from_json by
    that agent. Raises InvalidStateError or SecretInContextError.
    """
    value = _as_object(state_json)
    version = value.get("$schemaVersion")
    if not isinstance(version, str) or not version:
        raise InvalidStateError("the state has no $schemaVersion: send RunState.to_json() as it is")
    unsupported = registry.unsupported_schema(version)
    if unsupported:
        raise InvalidStateError(unsupported)
    calls = [_call_of(n, item) for n, item in enumerate(_interruptions(value), start=1)]
    seen: set[str] = set()
    for call in calls:
        if call.call_id in seen:
            raise InvalidStateError(f"two interruptions share the call_id {call.call_id!r}")
        seen.add(call.call_id)
    for number, call in enumerate(calls, start=1):
        _require_stored(value, number, call)
    state.refuse_secrets(value)
    try:
        payload = json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as error:
        raise InvalidStateError(f"the state cannot be stored as JSON: {_short(error)}") from None
    try:
        spec = registry.get_spec(agent_key, agent_version)
    except registry.UnknownAgentError:
        # An agent the console does not run: the structure above is all it can check.
        spec = None
    if spec is not None:
        # A copy: the SDK may keep or change what it loads.
        calls = _loaded_calls(spec, json.loads(payload), len(calls))
    return CheckedState(value, payload, calls)


def _text(value: Any, what: str, *, limit: int) -> str:
    if not isinstance(value, str):
        raise InvalidStateError(f"the {what} must be text")
    if len(value) > limit:
        raise InvalidStateError(f"the {what} is longer than {limit} characters")
    return value


# --- the caller hands over a pause --------------------------------------------------------------


def submit_paused(
    *,
    tenant: Tenant,
    agent_key: str,
    agent_version: str,
    state_json: Any,
    requested_by=None,
    session_id: str = "",
    title: str = "",
    via: dict | None = None,
) -> Submitted:
    """Store a pause the caller's own process holds, and open one ticket per call.

    state_json is RunState.to_json() (a dict, or its JSON text), checked by check_state. The run
    is executor caller: once its tickets are decided it waits for its caller
    (awaiting_caller), never for a worker. title: the caller's, else the state's input, as
    pause_run takes it. via (e.g. {"via": "api", "token_prefix": "abcd1234"}) goes into the
    audit detail.
    Side effects, as pause_run's (pause.store_pause), in one transaction: the Run with its
    sealed state, its tickets (decisions.tickets: malformed calls rejected, automatic
    decisions), audit events run.paused and ticket.created, live hints and signals.run_paused
    after commit. Returns the run and its tickets, as they stand once stored. Raises
    InvalidStateError or SecretInContextError, having written nothing.
    """
    agent_key = _text(agent_key, "agent key", limit=100).strip()
    agent_version = _text(str(agent_version), "agent version", limit=50).strip()
    if not agent_key or not agent_version:
        raise InvalidStateError("name the agent and its version")
    session_id = _text(session_id or "", "session id", limit=255)
    title = _text(title or "", "title", limit=10_000)
    checked = check_state(agent_key, agent_version, state_json)
    run, opened = store_pause(
        tenant=tenant,
        agent_key=agent_key,
        agent_version=agent_version,
        state_json=checked.json,
        payload=checked.payload,
        calls=checked.calls,
        requested_by=requested_by,
        session=SessionRef(CALLER_SESSION, session_id) if session_id else NO_SESSION,
        title=title_from(title)
        if title.strip()
        else title_from(checked.json.get("original_input")),
        executor=RunExecutor.CALLER,
        detail={"executor": RunExecutor.CALLER, **(via or {})},
    )
    if any(ticket.status != TicketStatus.PENDING for ticket in opened):
        # The automatic deciders decided a call, and may have moved the run: its own columns as
        # they now are (its tenant and requester, which no decision changes, stay as given).
        # Otherwise the run is as store_pause wrote it.
        run.refresh_from_db(fields=_OWN_COLUMNS)
    return Submitted(run, opened)


# --- the caller fetches the decisions -----------------------------------------------------------


def _utc(moment) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _approvers(ticket: Ticket) -> list[str]:
    names = [vote.user.get_username() for vote in ticket.valid_votes]
    decider = ticket.decided_by.get_username() if ticket.decided_by else None
    if ticket.status == TicketStatus.REJECTED:
        return [decider] if decider else []
    if decider and decider not in names:
        names.append(decider)
    return names


def decision_payload(run: Run, ticket: Ticket) -> dict:
    """What a signed decision says about one decided ticket (docs/API.md, SignedDecision)."""
    approve = ticket.status == TicketStatus.APPROVED
    return {
        "v": DECISION_VERSION,
        "tenant": run.tenant.slug,
        "run": run.pk,
        "generation": ticket.generation,
        "ticket": ticket.pk,
        "call_id": ticket.tool_call_id,
        "tool_name": ticket.tool_name,
        "arguments_digest": ticket.arguments_digest,
        "decision": "approve" if approve else "reject",
        # What the model reads for a rejection (an expiry's message, for one the policy
        # rejects on expiry); an approval carries none.
        "message": "" if approve else ticket.decision_message,
        "approvers": _approvers(ticket),
        "decided_at": _utc(ticket.decided_at),
    }


def signed_decisions(run: Run) -> list[dict]:
    """One signed decision per decided ticket of the run's current generation, for its caller.

    Only a caller's run that reached awaiting_caller (or ended) has any: [] otherwise, and for
    the console's runs. A superseded ticket (its caller gave up) is left out. Each entry is
    core.signatures.sign_decision(decision_payload(...)). Writes nothing.
    """
    if run.executor != RunExecutor.CALLER or run.status not in DECIDED_RUN_STATUSES:
        return []
    valid = TicketVote.objects.filter(invalidated_at__isnull=True).select_related("user")
    tickets = (
        Ticket.objects.filter(
            run=run,
            generation=run.state_generation,
            status__in=[TicketStatus.APPROVED, TicketStatus.REJECTED],
        )
        .select_related("decided_by")
        .prefetch_related(
            Prefetch("votes", queryset=valid.order_by("created_at", "pk"), to_attr="valid_votes")
        )
        .order_by("pk")
    )
    return [sign_decision(decision_payload(run, ticket)) for ticket in tickets]


# --- the caller reports what happened next ------------------------------------------------------


def _refusal(run: Run, outcome: str) -> str:
    status = run.get_status_display().lower()
    if run.status == RunStatus.PAUSED:
        return (
            f"run {run.pk} still waits for decisions, so it cannot be {outcome} yet; a caller "
            "that gives up reports it failed"
        )
    if run.status in DECIDED_RUN_STATUSES - {RunStatus.AWAITING_CALLER}:
        return f"run {run.pk} already ended ({status}); nothing more can be reported"
    return f"run {run.pk} is {status}, not waiting for its caller"


def report_outcome(
    run: Run,
    *,
    status: str,
    output: str = "",
    state_json: Any = None,
    error: str = "",
    actor=None,
    via: dict | None = None,
) -> Run:
    """What the caller's agent did with the decisions, or that the caller gave up.

    From awaiting_caller: "completed" (output becomes the final output), "paused" (state_json,
    checked as submit_paused checks it, is sealed as the next generation and its calls get new
    tickets; the earlier generations' tickets stay decided) or "failed" (error becomes the
    reason). From paused, only "failed": the caller gives up and the pending tickets are
    superseded. actor: the person reporting (None: the caller itself); via goes into the audit
    detail.
    Side effects, in one transaction under the run's lock: the run's status; audit event
    run.completed, run.failed or run.paused (with ticket.created, as pause.store_next_pause);
    live hints after commit. Raises InvalidOutcomeError (an unknown status, or output or error
    that is not text), InvalidStateError or SecretInContextError (the new state), or
    OutcomeConflictError (a console's run, or a run not where this can be reported from),
    having written nothing.
    """
    if status not in OUTCOMES:
        raise InvalidOutcomeError(
            f"the status must be completed, paused or failed, not {str(status)[:40]!r}"
        )
    if run.executor != RunExecutor.CALLER:
        raise OutcomeConflictError(
            f"run {run.pk} is resumed by the console's worker, not by its caller"
        )
    if not isinstance(output, str) or not isinstance(error, str):
        raise InvalidOutcomeError("the output and the error must be text")
    checked = (
        check_state(run.agent_key, run.agent_version, state_json) if status == "paused" else None
    )
    reason = mask_secrets(" ".join(error.split()))[:1000] or "its caller reported a failure"
    detail = dict(via or {})
    actor_name = "" if actor is not None else "caller"
    sources = {RunStatus.AWAITING_CALLER} | ({RunStatus.PAUSED} if status == "failed" else set())
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status not in sources:
            raise OutcomeConflictError(_refusal(locked, status))
        now = timezone.now()
        if checked is not None:
            store_next_pause(
                locked,
                payload=checked.payload,
                calls=checked.calls,
                actor=actor,
                actor_name=actor_name,
                schema_version=checked.schema_version,
                detail=detail,
            )
        else:
            final = RunStatus.COMPLETED if status == "completed" else RunStatus.FAILED
            transitions.move_runs(
                Run.objects.filter(pk=locked.pk, status__in=sources),
                to=final,
                final_output=output if final == RunStatus.COMPLETED else "",
                status_reason=reason if final == RunStatus.FAILED else "",
                finished_at=now,
                updated_at=now,
            )
            transitions.supersede_pending(locked)
            chain.append(
                tenant_id=locked.tenant_id,
                action="run.completed" if final == RunStatus.COMPLETED else "run.failed",
                actor=actor,
                actor_name=actor_name,
                run_id=locked.pk,
                outcome=final,
                detail={**({"reason": reason} if final == RunStatus.FAILED else {}), **detail},
            )
            hints.notify_on_commit(locked.tenant_id, "run.changed", run=locked.pk, status=final)
    run.refresh_from_db()
    return run
