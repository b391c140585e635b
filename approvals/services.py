"""Everything that changes several rows, writes the audit log, enqueues or broadcasts.

Each function owns its transaction and lists its side effects. The flow:
pause_run -> decide (compare-and-set; the last decision enqueues the resume) -> resume
(claim with a lease, verify, run the agent, store the outcome) -> reap (expired leases,
stale queue entries, expired tickets).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from agents import Runner, RunState
from agents.exceptions import UserError
from agents.run_state import CURRENT_SCHEMA_VERSION, SUPPORTED_SCHEMA_VERSIONS
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from approvals import audit, crypto, faults, ledger, live, preauth, registry
from approvals.agent_sessions import SessionRef, describe, reopen
from approvals.canonical import arguments_digest, canonical_arguments, canonical_json
from approvals.models import (
    IdempotencyRecord,
    LedgerStatus,
    Membership,
    PreAuthorization,
    Role,
    Run,
    RunStatus,
    Tenant,
    Ticket,
    TicketStatus,
)
from approvals.redaction import find_secrets, redact, secret_shape

logger = logging.getLogger(__name__)

STATE_PURPOSE = "approvals.run_state.v1"
MAX_MESSAGE_CHARS = 2000
REGENERATE = "Regenerate the approval"


# --- errors -----------------------------------------------------------------------------------


class PauseError(Exception):
    """The paused run cannot be stored; nothing was written."""


class NoInterruptionsError(PauseError):
    pass


class ContextNotSerializableError(PauseError):
    pass


class SecretInContextError(PauseError):
    pass


class DecisionError(Exception):
    """A decision was refused; nothing was written."""


class TicketNotFoundError(DecisionError):
    pass


class NotAllowedError(DecisionError):
    pass


class SelfApprovalError(DecisionError):
    pass


class TicketExpiredError(DecisionError):
    pass


class AlreadyDecidedError(DecisionError):
    def __init__(self, ticket: Ticket) -> None:
        who = ticket.decided_by.get_username() if ticket.decided_by else "someone"
        when = f"{ticket.decided_at:%Y-%m-%d %H:%M:%S} UTC" if ticket.decided_at else "earlier"
        super().__init__(f"Already {ticket.status} by {who} at {when}.")
        self.ticket = ticket


class InvalidDecisionError(DecisionError):
    pass


class _Refusal(Exception):
    """The worker will not run this state; the run is parked with the reason."""

    def __init__(self, reason: str, status: str = RunStatus.NEEDS_ATTENTION) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class _Unavailable(Exception):
    """Something the run needs is unreachable right now; nothing ran, so it can wait and retry."""


# --- state sealing --------------------------------------------------------------------------


def _binding(run: Run, generation: int) -> dict[str, object]:
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
            state_json["context"]["context_meta"]["serialized_via"] = "context_serializer"
        payload = json.dumps(state_json, ensure_ascii=False, allow_nan=False).encode()
    except (UserError, TypeError, ValueError) as error:
        raise ContextNotSerializableError(
            f"the run's context cannot be stored: {error}. Keep connections, locks and clients "
            "out of the context, or give the agent a context_serializer that leaves them out."
        ) from None
    context_entry = state_json.get("context", {})
    found = list(find_secrets(context_entry.get("context"), "context"))
    found += list(find_secrets(context_entry.get("tool_input"), "tool_input"))
    if found:
        raise SecretInContextError(
            "the run's context holds what looks like a secret, which must never be stored: "
            + ", ".join(found[:5])
            + ". Leave it out with a context_serializer and re-inject it in the "
            "context_deserializer from the environment."
        )
    return state_json, payload


def _seal_state(run: Run, payload: bytes, generation: int) -> None:
    sealed = crypto.seal(payload, purpose=STATE_PURPOSE, **_binding(run, generation))
    run.state_key_id = sealed.key_id
    run.state_nonce = sealed.nonce
    run.state_ciphertext = sealed.ciphertext
    run.state_generation = generation


def open_state(run: Run) -> dict:
    """The run's stored state as JSON. Raises crypto.CryptoError when it cannot be trusted."""
    plaintext = crypto.open_sealed(
        crypto.Sealed(run.state_key_id, bytes(run.state_nonce), bytes(run.state_ciphertext)),
        purpose=STATE_PURPOSE,
        **_binding(run, run.state_generation),
    )
    return json.loads(plaintext)


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


def _create_tickets(run: Run, interruptions, *, requested_by, now) -> list[Ticket]:
    expires_at = now + settings.APPROVALS_TICKET_TTL
    tickets = []
    for item in interruptions:
        raw = item.arguments
        tickets.append(
            Ticket.objects.create(
                run=run,
                tenant_id=run.tenant_id,
                generation=run.state_generation,
                agent_name=getattr(item.agent, "name", "") or "",
                tool_name=item.qualified_name or item.name or "",
                tool_call_id=item.call_id or "",
                arguments_json=canonical_arguments(raw),
                arguments_digest=arguments_digest(raw),
                requested_by=requested_by,
                created_at=now,
                expires_at=expires_at,
            )
        )
    for ticket in tickets:
        audit.append(
            tenant_id=run.tenant_id,
            action="ticket.created",
            actor=requested_by,
            run_id=run.pk,
            ticket_id=ticket.pk,
            tool_name=ticket.tool_name,
            arguments_digest=ticket.arguments_digest,
            outcome="pending",
            detail={"expires_at": ticket.expires_at.isoformat(), "call_id": ticket.tool_call_id},
        )
        live.notify_on_commit(run.tenant_id, "ticket.created", ticket=ticket.pk, run=run.pk)
    # Automatic decisions at creation: a call an approver edited and pre-authorised.
    preauthorised = [p for p in (preauth.match(run, t, now=now) for t in tickets) if p]
    if preauthorised:
        _queue_when_decided(run, actor=preauthorised[-1].created_by, now=now)
    return tickets


# --- pausing ----------------------------------------------------------------------------------


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
    ticket.created; after commit, a live hint to the tenant's pages.
    Raises NoInterruptionsError, registry.UnknownAgentError, ContextNotSerializableError,
    SecretInContextError or UnsupportedSessionError, having written nothing.
    """
    interruptions = list(result.interruptions or [])
    if not interruptions:
        raise NoInterruptionsError("the run is not waiting for any approval; nothing to store")
    spec = registry.get_spec(agent_key, str(agent_version))
    state_json, payload = serialize_state(
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
        if ref.backend == "openai_conversations":
            from sessions_admin.models import ConversationRecord

            # The Conversations API cannot list conversations; the sessions admin reads this.
            ConversationRecord.objects.update_or_create(
                tenant=tenant, conversation_id=ref.session_id, defaults={"last_seen": now}
            )
        # The blob's associated data names the run, so the row must exist before sealing.
        _seal_state(run, payload, generation=1)
        run.save(update_fields=["state_key_id", "state_nonce", "state_ciphertext"])
        audit.append(
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
        _create_tickets(run, interruptions, requested_by=requested_by, now=now)
    return run


# --- the queue ------------------------------------------------------------------------------

WAKE_CHANNEL = "approvals_resume"


def enqueue_resume(run_id: int) -> None:
    """Queue the run's resume in the caller's transaction, and wake a worker when it commits.

    The task row lives in the same database, so it commits or rolls back with the decision.
    On PostgreSQL a NOTIFY (also transactional: delivered only on commit) wakes a listening
    worker at once; a lost notification costs one poll interval, as the worker still polls.
    """
    from approvals.tasks import resume_run_task

    resume_run_task.enqueue(run_id)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {WAKE_CHANNEL}")


# --- deciding ---------------------------------------------------------------------------------


def membership_for(user, tenant_id: int) -> Membership | None:
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    return Membership.objects.filter(user=user, tenant_id=tenant_id).first()


def _checked_message(message: str) -> str:
    message = (message or "").strip()
    if len(message) > MAX_MESSAGE_CHARS:
        raise InvalidDecisionError(
            f"the message is {len(message)} characters; at most {MAX_MESSAGE_CHARS}"
        )
    return message


def _check_decider(ticket: Ticket, user, *, approve: bool) -> Membership:
    """The user may decide this ticket so; raises a DecisionError otherwise."""
    membership = membership_for(user, ticket.tenant_id)
    if membership is None:
        raise TicketNotFoundError("no such ticket")
    if not membership.can_decide:
        raise NotAllowedError(f"the {membership.role} role cannot decide tickets")
    if approve and ticket.is_requested_by(user):
        raise SelfApprovalError("you requested this call, so someone else must approve it")
    return membership


def _compare_and_set(
    ticket: Ticket, *, status: str, user, now, message: str = "", always: bool = False
) -> None:
    """Decide a pending, unexpired ticket, or raise why it cannot be decided any more."""
    won = Ticket.objects.filter(
        pk=ticket.pk, status=TicketStatus.PENDING, expires_at__gt=now
    ).update(
        status=status,
        decided_by=user,
        decided_at=now,
        decision_message=message,
        always=always,
    )
    if won:
        return
    current = Ticket.objects.select_related("decided_by").get(pk=ticket.pk)
    if current.status in (TicketStatus.PENDING, TicketStatus.EXPIRED):
        raise TicketExpiredError(
            f"this ticket expired at {current.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
            "the agent must ask again"
        )
    if current.status == TicketStatus.SUPERSEDED:
        raise TicketExpiredError("this ticket was withdrawn because its run ended")
    raise AlreadyDecidedError(current)


def _queue_when_decided(run: Run, *, actor, now) -> bool:
    """In the caller's transaction, with the run locked: when no ticket of the run's current
    state is pending, the paused run becomes queued and its resume is enqueued."""
    still_pending = Ticket.objects.filter(
        run=run, generation=run.state_generation, status=TicketStatus.PENDING
    ).exists()
    if still_pending or run.status != RunStatus.PAUSED:
        return False
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED, updated_at=now)
    run.status = RunStatus.QUEUED
    enqueue_resume(run.pk)
    audit.append(
        tenant_id=run.tenant_id,
        action="run.queued",
        actor=actor,
        run_id=run.pk,
        outcome=RunStatus.QUEUED,
    )
    live.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=RunStatus.QUEUED)
    return True


def decide(
    ticket: Ticket, *, user, approve: bool, message: str = "", always: bool = False
) -> Ticket:
    """Approve or reject a pending ticket: one compare-and-set from pending.

    Side effects, in one transaction: the ticket's decision; audit event ticket.approved or
    ticket.rejected; when it was the run's last pending ticket, the run becomes queued and the
    resume task is enqueued (the queue is in the same database, so both commit or neither);
    after commit, live hints. Raises TicketNotFoundError (not the user's tenant),
    NotAllowedError, SelfApprovalError, TicketExpiredError, AlreadyDecidedError or
    InvalidDecisionError, having written nothing.
    """
    message = _checked_message(message)
    if always and not approve:
        raise InvalidDecisionError("'always' goes with an approval, not a rejection")
    _check_decider(ticket, user, approve=approve)
    with transaction.atomic():
        # The run's lock orders decisions on one run, so exactly one of them sees "all decided".
        run = Run.objects.select_for_update().get(pk=ticket.run_id)
        now = timezone.now()
        status = TicketStatus.APPROVED if approve else TicketStatus.REJECTED
        _compare_and_set(ticket, status=status, user=user, now=now, message=message, always=always)
        audit.append(
            tenant_id=ticket.tenant_id,
            action=f"ticket.{status}",
            actor=user,
            run_id=run.pk,
            ticket_id=ticket.pk,
            tool_name=ticket.tool_name,
            arguments_digest=ticket.arguments_digest,
            outcome=status,
            detail={"always": always, "message": message} if message or always else {},
        )
        live.notify_on_commit(
            ticket.tenant_id, "ticket.decided", ticket=ticket.pk, run=run.pk, status=status
        )
        _queue_when_decided(run, actor=user, now=now)
    ticket.refresh_from_db()
    return ticket


class InvalidArgumentsError(InvalidDecisionError):
    """Edited arguments that do not fit the tool's JSON schema."""

    def __init__(self, problems: list[preauth.Problem]) -> None:
        super().__init__(
            "the edited arguments do not fit the tool's schema: "
            + "; ".join(f"{p.argument}: {p.message}" if p.argument else p.message for p in problems)
        )
        self.problems = problems


def edit_and_approve(
    ticket: Ticket, *, user, arguments: dict, message: str = ""
) -> PreAuthorization:
    """Reject a pending call with corrected arguments and pre-authorise exactly those.

    The SDK cannot approve a call with other arguments, so the model is asked to call again:
    the rejection message carries the corrected arguments as canonical JSON (and the approver's
    note), and when the resumed model calls the same tool with exactly that digest, the new
    ticket is approved in this user's name (preauth.match, from _create_tickets).
    Side effects, in one transaction: the ticket rejected by the same compare-and-set as a
    rejection; a PreAuthorization (canonical arguments, digest, expiry one ticket lifetime
    away); audit event ticket.edited with the changes; when it was the run's last pending
    ticket, the run queued and the resume enqueued; after commit, live hints. Raises
    TicketNotFoundError, NotAllowedError, SelfApprovalError (editing approves, so the requester
    may not), TicketExpiredError, AlreadyDecidedError, InvalidArgumentsError or
    InvalidDecisionError, having written nothing.
    """
    note = _checked_message(message)
    _check_decider(ticket, user, approve=True)
    if not isinstance(arguments, dict):
        raise InvalidDecisionError("the edited arguments must be a JSON object")
    tool = preauth.tool_for(ticket.run, ticket.tool_name)
    if tool is None:
        raise InvalidDecisionError(
            f"the tool {ticket.tool_name!r} is not in agent {ticket.run.agent_key!r} "
            f"version {ticket.run.agent_version!r} as deployed here, so its arguments cannot "
            "be checked; approve or reject the call as it is"
        )
    problems = preauth.schema_problems(tool.params_json_schema, arguments)
    if problems:
        raise InvalidArgumentsError(problems)
    edited_json = canonical_json(arguments)
    digest = arguments_digest(edited_json)
    if digest == ticket.arguments_digest:
        raise InvalidDecisionError(
            "the edited arguments are the same as the call's; approve the call instead"
        )
    rejection = preauth.correction_message(tool.name, edited_json, note)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=ticket.run_id)
        now = timezone.now()
        _compare_and_set(
            ticket, status=TicketStatus.REJECTED, user=user, now=now, message=rejection
        )
        pre = PreAuthorization.objects.create(
            tenant_id=ticket.tenant_id,
            run=run,
            tool_name=ticket.tool_name,
            arguments_json=edited_json,
            arguments_digest=digest,
            original_ticket=ticket,
            created_by=user,
            created_at=now,
            expires_at=now + settings.APPROVALS_TICKET_TTL,
        )
        audit.append(
            tenant_id=ticket.tenant_id,
            action="ticket.edited",
            actor=user,
            run_id=run.pk,
            ticket_id=ticket.pk,
            tool_name=ticket.tool_name,
            arguments_digest=ticket.arguments_digest,
            outcome=TicketStatus.REJECTED,
            detail={
                "edited_digest": digest,
                "changes": preauth.changes(json.loads(ticket.arguments_json), arguments),
                **({"message": note} if note else {}),
            },
        )
        live.notify_on_commit(
            ticket.tenant_id,
            "ticket.decided",
            ticket=ticket.pk,
            run=run.pk,
            status=TicketStatus.REJECTED,
        )
        _queue_when_decided(run, actor=user, now=now)
    ticket.refresh_from_db()
    return pre


# --- resuming ---------------------------------------------------------------------------------


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class ResumeOutcome:
    run_id: int
    status: str
    reason: str = ""
    effects: list[int] = field(default_factory=list)


def _claim(run_id: int, worker_id: str) -> Run | None:
    now = timezone.now()
    lease = timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    with transaction.atomic():
        claimed = (
            Run.objects.filter(pk=run_id)
            .filter(
                Q(status=RunStatus.QUEUED) | Q(status=RunStatus.RESUMING, lease_expires_at__lt=now)
            )
            .update(
                status=RunStatus.RESUMING,
                lease_owner=worker_id,
                lease_expires_at=now + lease,
                attempts=F("attempts") + 1,
                updated_at=now,
            )
        )
        if not claimed:
            return None
        run = Run.objects.select_related("tenant").get(pk=run_id)
        audit.append(
            tenant_id=run.tenant_id,
            action="run.resuming",
            actor_name=f"worker {worker_id}",
            run_id=run.pk,
            outcome=RunStatus.RESUMING,
            detail={"attempt": run.attempts},
        )
    live.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=RunStatus.RESUMING)
    return run


def _owned(run: Run):
    return Run.objects.filter(
        pk=run.pk, status=RunStatus.RESUMING, lease_owner=run.lease_owner, attempts=run.attempts
    )


def _extend_lease(run: Run) -> bool:
    until = timezone.now() + timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    try:
        return bool(_owned(run).update(lease_expires_at=until))
    finally:
        from django.db import connection

        connection.close()


def _check_before_resume(run: Run, tickets: list[Ticket]) -> None:
    """Everything that must hold before any of the stored state is used."""
    if run.attempts > settings.APPROVALS_MAX_ATTEMPTS:
        raise _Refusal(
            f"resumed {run.attempts - 1} times without finishing; look at the worker logs"
        )
    if not tickets:
        raise _Refusal("the run has no tickets for its current state")
    undecided = [
        t for t in tickets if t.status not in (TicketStatus.APPROVED, TicketStatus.REJECTED)
    ]
    if undecided:
        raise _Refusal(f"ticket {undecided[0].pk} is {undecided[0].status}, not decided")
    now = timezone.now()
    grace = timedelta(seconds=settings.APPROVALS_RESUME_GRACE_SECONDS)
    for ticket in tickets:
        if ticket.decided_at is None or ticket.decided_at > ticket.expires_at:
            raise _Refusal(
                f"{REGENERATE}: ticket {ticket.pk} was decided after it expired", RunStatus.EXPIRED
            )
        # A decision is good until the ticket's expiry; a resume that starts much later must
        # not act on a stale approval.
        if now > ticket.expires_at + grace:
            raise _Refusal(
                f"{REGENERATE}: ticket {ticket.pk} expired at "
                f"{ticket.expires_at:%Y-%m-%d %H:%M:%S} UTC before the run could resume",
                RunStatus.EXPIRED,
            )
        if ticket.status == TicketStatus.APPROVED:
            approver = ticket.decided_by
            membership = membership_for(approver, run.tenant_id) if approver else None
            if membership is None or not membership.can_decide:
                who = approver.get_username() if approver else "a deleted user"
                raise _Refusal(
                    f"{REGENERATE}: {who}, who approved ticket {ticket.pk}, may no longer approve"
                )
            if ticket.is_requested_by(approver):
                raise _Refusal(f"{REGENERATE}: ticket {ticket.pk} was approved by its requester")
    if run.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        raise _Refusal(
            f"{REGENERATE}: the state was written in SDK schema {run.schema_version!r}, which this "
            f"SDK (schema {CURRENT_SCHEMA_VERSION}) cannot load"
        )
    try:
        registry.get_spec(run.agent_key, run.agent_version)
    except registry.UnknownAgentError as error:
        raise _Refusal(f"{REGENERATE}: {error}") from None


async def _resume_async(run: Run, tickets: list[Ticket], state_json: dict) -> Any:
    spec = registry.get_spec(run.agent_key, run.agent_version)
    agent = spec.build()
    try:
        state = await RunState.from_json(
            agent,
            state_json,
            context_deserializer=spec.context_deserializer,
            strict_context=spec.context_deserializer is not None,
        )
    except Exception as error:
        raise _Refusal(
            f"{REGENERATE}: the stored state cannot be loaded by this code ({error})"
        ) from None

    by_call_id = {t.tool_call_id: t for t in tickets}
    interruptions = state.get_interruptions()
    seen = set()
    for item in interruptions:
        ticket = by_call_id.get(item.call_id or "")
        if ticket is None:
            raise _Refusal(f"the state asks about call {item.call_id!r}, which has no ticket")
        seen.add(ticket.tool_call_id)
        available = {getattr(tool, "name", None) for tool in getattr(item.agent, "tools", [])}
        if item.name not in available:
            raise _Refusal(
                f"{REGENERATE}: tool {item.name!r} is not available to agent "
                f"{getattr(item.agent, 'name', '?')!r} in this version; nothing was run"
            )
        if arguments_digest(item.arguments) != ticket.arguments_digest:
            raise _Refusal(
                f"the arguments of ticket {ticket.pk} ({ticket.tool_name}) differ from those that "
                "were shown and decided; nothing was run"
            )
        if ticket.status == TicketStatus.APPROVED:
            state.approve(item, always_approve=ticket.always)
        else:
            state.reject(item, rejection_message=ticket.decision_message or None)
    missing = set(by_call_id) - seen
    if missing:
        raise _Refusal(f"tickets for calls {sorted(missing)} are not in the stored state")

    stop = asyncio.Event()

    async def heartbeat() -> None:
        interval = max(settings.APPROVALS_LEASE_SECONDS / 3, 0.5)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval)
            except TimeoutError:
                if not await sync_to_async(_extend_lease, thread_sensitive=False)(run):
                    logger.warning("run %s: lease lost while resuming", run.pk)
                    return

    beat = asyncio.create_task(heartbeat())
    try:
        async with reopen(
            SessionRef(run.session_backend, run.session_id, run.session_location)
        ) as session:
            if session is not None:
                # Read before anything runs: an unreachable history must stop the resume
                # before an approved tool executes, not after.
                try:
                    await session.get_items(limit=1)
                except Exception as error:
                    raise _Unavailable(
                        f"the conversation session ({run.session_backend}) cannot be read: "
                        f"{_safe_reason(error)}"
                    ) from None
            return await Runner.run(agent, state, session=session)
    finally:
        stop.set()
        await beat


def _supersede_pending(run: Run) -> None:
    Ticket.objects.filter(run=run, status=TicketStatus.PENDING).update(
        status=TicketStatus.SUPERSEDED
    )


def _finish(
    run: Run, *, status: str, reason: str = "", final_output: str = "", action: str
) -> bool:
    """Store a terminal outcome if this attempt still owns the run."""
    now = timezone.now()
    with transaction.atomic():
        stored = _owned(run).update(
            status=status,
            status_reason=reason,
            final_output=final_output,
            lease_owner="",
            lease_expires_at=None,
            updated_at=now,
            finished_at=now,
        )
        if not stored:
            return False
        _supersede_pending(run)
        audit.append(
            tenant_id=run.tenant_id,
            action=action,
            actor_name=f"worker {run.lease_owner}",
            run_id=run.pk,
            outcome=status,
            detail={"reason": reason} if reason else {},
        )
        live.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=status)
    return True


def _release(run: Run, *, reason: str) -> bool:
    """Give the run back to the queue untouched; the reaper re-enqueues it after a lease."""
    with transaction.atomic():
        released = _owned(run).update(
            status=RunStatus.QUEUED,
            status_reason=reason,
            lease_owner="",
            lease_expires_at=None,
            updated_at=timezone.now(),
        )
        if released:
            audit.append(
                tenant_id=run.tenant_id,
                action="run.retry_later",
                actor_name=f"worker {run.lease_owner}",
                run_id=run.pk,
                outcome=RunStatus.QUEUED,
                detail={"reason": reason},
            )
            live.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=RunStatus.QUEUED)
    return bool(released)


def _store_new_pause(run: Run, result, spec: registry.AgentSpec) -> bool:
    _, payload = serialize_state(
        result.to_state(),
        context=result.context_wrapper.context,
        context_serializer=spec.context_serializer,
    )
    now = timezone.now()
    with transaction.atomic():
        locked = _owned(run).select_for_update().first()
        if locked is None:
            return False
        generation = locked.state_generation + 1
        _seal_state(locked, payload, generation)
        locked.status = RunStatus.PAUSED
        locked.status_reason = ""
        locked.lease_owner = ""
        locked.lease_expires_at = None
        locked.updated_at = now
        locked.save(
            update_fields=[
                "state_key_id",
                "state_nonce",
                "state_ciphertext",
                "state_generation",
                "status",
                "status_reason",
                "lease_owner",
                "lease_expires_at",
                "updated_at",
            ]
        )
        faults.point("while_storing_pause")
        audit.append(
            tenant_id=run.tenant_id,
            action="run.paused",
            actor_name=f"worker {run.lease_owner}",
            run_id=run.pk,
            outcome=RunStatus.PAUSED,
            detail={"tickets": len(result.interruptions), "generation": generation},
        )
        _create_tickets(locked, result.interruptions, requested_by=run.requested_by, now=now)
        live.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=RunStatus.PAUSED)
    return True


def _safe_reason(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return str(redact(text))[:1000]


def resume(*, run_id: int, worker_id: str | None = None) -> ResumeOutcome:
    """Resume a queued run whose tickets are all decided, at most once at a time.

    Side effects: claims the run with a lease (a second delivery or worker finds it claimed and
    does nothing); checks expiry, approvers' permissions, the agent version and SDK schema,
    decrypts, re-checks every argument digest; runs the agent with the decisions applied and the
    original session (side-effecting tools go through the ledger); stores the outcome:
    completed, paused again with new tickets, failed, needs_attention or expired; audit events
    and live hints for each step.
    """
    worker_id = worker_id or worker_identity()
    run = _claim(run_id, worker_id)
    if run is None:
        current = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
        return ResumeOutcome(run_id, current or "missing", "not claimed: another delivery has it")
    tickets = list(
        Ticket.objects.filter(run=run, generation=run.state_generation)
        .select_related("decided_by", "requested_by")
        .order_by("pk")
    )
    scope = ledger.ResumeScope(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        attempt=f"{worker_id}#{run.attempts}",
        tickets_by_call_id={t.tool_call_id: t.pk for t in tickets},
    )
    try:
        _check_before_resume(run, tickets)
        try:
            state_json = open_state(run)
        except crypto.CryptoError as error:
            raise _Refusal(f"the stored state was refused: {error}; nothing was run") from None
        if str(state_json.get("$schemaVersion")) != run.schema_version:
            raise _Refusal("the stored state does not match its run record; nothing was run")
        spec = registry.get_spec(run.agent_key, run.agent_version)
        with ledger.resume_scope(scope):
            result = asyncio.run(_resume_async(run, tickets, state_json))
    except _Unavailable as unavailable:
        reason = f"{unavailable}; will try again"
        _release(run, reason=reason)
        return ResumeOutcome(run.pk, RunStatus.QUEUED, reason, scope.effects)
    except _Refusal as refusal:
        _finish(run, status=refusal.status, reason=refusal.reason, action="run.refused")
        return ResumeOutcome(run.pk, refusal.status, refusal.reason, scope.effects)
    except Exception as error:
        if scope.in_doubt:
            _finish(
                run, status=RunStatus.NEEDS_ATTENTION, reason=scope.in_doubt, action="run.in_doubt"
            )
            return ResumeOutcome(run.pk, RunStatus.NEEDS_ATTENTION, scope.in_doubt, scope.effects)
        logger.exception("run %s failed while resuming", run.pk)
        reason = _safe_reason(error)
        _finish(run, status=RunStatus.FAILED, reason=reason, action="run.failed")
        return ResumeOutcome(run.pk, RunStatus.FAILED, reason, scope.effects)
    if scope.in_doubt:
        # The SDK may have turned the ledger's error into a tool message; the run still stops.
        _finish(run, status=RunStatus.NEEDS_ATTENTION, reason=scope.in_doubt, action="run.in_doubt")
        return ResumeOutcome(run.pk, RunStatus.NEEDS_ATTENTION, scope.in_doubt, scope.effects)
    if result.interruptions:
        try:
            stored = _store_new_pause(run, result, spec)
        except (PauseError, IntegrityError) as error:
            reason = _safe_reason(error) if isinstance(error, IntegrityError) else str(error)
            _finish(run, status=RunStatus.FAILED, reason=reason, action="run.failed")
            return ResumeOutcome(run.pk, RunStatus.FAILED, reason, scope.effects)
        status = RunStatus.PAUSED
    else:
        output = result.final_output
        text = output if isinstance(output, str) else json.dumps(output, default=str)
        stored = _finish(run, status=RunStatus.COMPLETED, final_output=text, action="run.completed")
        status = RunStatus.COMPLETED
    if not stored:
        logger.warning("run %s: outcome not stored, the lease had passed to another worker", run.pk)
        return ResumeOutcome(run.pk, "lease_lost", "another worker owns the run now", scope.effects)
    return ResumeOutcome(run.pk, status, "", scope.effects)


# --- the reaper -------------------------------------------------------------------------------


@dataclass
class ReapReport:
    requeued: list[int] = field(default_factory=list)
    reenqueued: list[int] = field(default_factory=list)
    expired_runs: list[int] = field(default_factory=list)


def reap(*, now=None) -> ReapReport:
    """Recover what workers left behind, and expire what nobody decided in time.

    Side effects: runs whose lease expired (their worker died) go back to queued with a new
    resume task; queued runs that waited longer than a lease get their task again (a duplicate
    is harmless: the claim lets one through); runs with a pending ticket past its expiry become
    expired and their pending tickets expired. Audit events and live hints for each.
    """
    now = now or timezone.now()
    report = ReapReport()
    stale = now - timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    for run_id in Run.objects.filter(
        status=RunStatus.RESUMING, lease_expires_at__lt=now
    ).values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.filter(pk=run_id).first()
            moved = Run.objects.filter(
                pk=run_id, status=RunStatus.RESUMING, lease_expires_at__lt=now
            ).update(status=RunStatus.QUEUED, lease_owner="", lease_expires_at=None, updated_at=now)
            if not moved:
                continue
            enqueue_resume(run_id)
            audit.append(
                tenant_id=run.tenant_id,
                action="run.requeued",
                actor_name="reaper",
                run_id=run_id,
                outcome=RunStatus.QUEUED,
                detail={"reason": f"worker {run.lease_owner} stopped renewing its lease"},
            )
            live.notify_on_commit(run.tenant_id, "run.changed", run=run_id, status=RunStatus.QUEUED)
        report.requeued.append(run_id)
    for run_id in Run.objects.filter(status=RunStatus.QUEUED, updated_at__lt=stale).values_list(
        "pk", flat=True
    ):
        with transaction.atomic():
            if Run.objects.filter(pk=run_id, status=RunStatus.QUEUED, updated_at__lt=stale).update(
                updated_at=now
            ):
                enqueue_resume(run_id)
                report.reenqueued.append(run_id)
    expired_run_ids = (
        Ticket.objects.filter(status=TicketStatus.PENDING, expires_at__lte=now)
        .values_list("run_id", flat=True)
        .distinct()
    )
    for run_id in list(expired_run_ids):
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            expiring = list(
                Ticket.objects.filter(run=run, status=TicketStatus.PENDING, expires_at__lte=now)
            )
            if not expiring:
                continue
            Ticket.objects.filter(pk__in=[t.pk for t in expiring]).update(
                status=TicketStatus.EXPIRED
            )
            for ticket in expiring:
                audit.append(
                    tenant_id=run.tenant_id,
                    action="ticket.expired",
                    actor_name="reaper",
                    run_id=run.pk,
                    ticket_id=ticket.pk,
                    tool_name=ticket.tool_name,
                    arguments_digest=ticket.arguments_digest,
                    outcome=TicketStatus.EXPIRED,
                )
            if run.status == RunStatus.PAUSED:
                Run.objects.filter(pk=run.pk).update(
                    status=RunStatus.EXPIRED,
                    status_reason="a ticket expired before anyone decided it",
                    updated_at=now,
                    finished_at=now,
                )
                _supersede_pending(run)
                audit.append(
                    tenant_id=run.tenant_id,
                    action="run.expired",
                    actor_name="reaper",
                    run_id=run.pk,
                    outcome=RunStatus.EXPIRED,
                )
                report.expired_runs.append(run.pk)
            live.notify_on_commit(
                run.tenant_id,
                "run.changed",
                run=run.pk,
                status=RunStatus.EXPIRED if run.pk in report.expired_runs else run.status,
            )
    return report


# --- people resolving what the worker could not -------------------------------------------


class ResolutionError(Exception):
    pass


def in_doubt_effects(run: Run) -> list[IdempotencyRecord]:
    return list(
        IdempotencyRecord.objects.filter(
            run=run, status__in=[LedgerStatus.CLAIMED, LedgerStatus.FAILED]
        ).order_by("pk")
    )


def resolve(run: Run, *, user, resolution: str, note: str = "") -> Run:
    """An admin settles a run that needs attention.

    "happened": the in-doubt effects are recorded as done (the tool will not run them again)
    and the run is queued to finish; "retry": the in-doubt claims are released so the effects
    run again, and the run is queued; "abandon": the run ends as failed.
    Side effects, in one transaction: ledger rows, the run's status, a resume task when queued,
    audit event run.resolved; after commit, live hints. Raises ResolutionError, writing nothing.
    """
    membership = membership_for(user, run.tenant_id)
    if membership is None or membership.role != Role.ADMIN:
        raise ResolutionError("only an admin of this tenant can resolve a run")
    note = (note or "").strip()[:1000]
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status != RunStatus.NEEDS_ATTENTION:
            raise ResolutionError(
                f"the run is {locked.get_status_display().lower()}, not waiting for a person"
            )
        doubtful = in_doubt_effects(locked)
        if resolution in {"happened", "retry"} and not doubtful:
            raise ResolutionError("no effect of this run is in doubt; it can only be stopped")
        now = timezone.now()
        if resolution == "happened":
            for record in doubtful:
                IdempotencyRecord.objects.filter(pk=record.pk).update(
                    status=LedgerStatus.DONE,
                    result=f"Confirmed as done by {user.get_username()}."
                    + (f" {note}" if note else ""),
                    completed_at=now,
                )
        elif resolution == "retry":
            IdempotencyRecord.objects.filter(pk__in=[r.pk for r in doubtful]).delete()
        elif resolution != "abandon":
            raise ResolutionError(f"unknown resolution {resolution!r}")
        if resolution == "abandon":
            locked.status = RunStatus.FAILED
            locked.status_reason = f"Stopped by {user.get_username()}." + (
                f" {note}" if note else ""
            )
            locked.finished_at = now
        else:
            locked.status = RunStatus.QUEUED
            locked.status_reason = ""
            locked.attempts = 0
            enqueue_resume(locked.pk)
        locked.updated_at = now
        locked.save(
            update_fields=["status", "status_reason", "finished_at", "attempts", "updated_at"]
        )
        audit.append(
            tenant_id=locked.tenant_id,
            action="run.resolved",
            actor=user,
            run_id=locked.pk,
            outcome=locked.status,
            detail={
                "resolution": resolution,
                "effects": [f"{r.operation} {r.resource}" for r in doubtful],
                **({"note": note} if note else {}),
            },
        )
        live.notify_on_commit(locked.tenant_id, "run.changed", run=locked.pk, status=locked.status)
    return locked


def record_sign_in_failure(*, username: str, locked_out: bool) -> None:
    """Failed and locked-out sign-ins go into the audit chain of each tenant the name belongs to.

    Side effects: one audit event per tenant of the user named (none for unknown names, which
    would otherwise let anyone fill the log).
    """
    tenant_ids = list(
        Membership.objects.filter(user__username=username).values_list("tenant_id", flat=True)
    )
    for tenant_id in tenant_ids:
        with transaction.atomic():
            audit.append(
                tenant_id=tenant_id,
                action="auth.locked_out" if locked_out else "auth.sign_in_failed",
                actor_name=username[:150],
                outcome="locked_out" if locked_out else "failed",
            )


def record_export(*, user, tenant_ids: list[int], fmt: str, filters: dict) -> None:
    """An export of the audit history is itself audited, once per tenant it covers."""
    for tenant_id in tenant_ids:
        with transaction.atomic():
            audit.append(
                tenant_id=tenant_id,
                action="audit.exported",
                actor=user,
                outcome="exported",
                detail={"format": fmt, "filters": {k: str(v) for k, v in filters.items() if v}},
            )


# --- keys -------------------------------------------------------------------------------------


def rotate_keys() -> dict[str, int]:
    """Re-encrypt every stored state under the primary key.

    Side effects: each run not yet under the primary key is re-sealed in its own transaction
    (row locked); one audit event keys.rotated per tenant with the count. Runs whose blob
    cannot be opened are left as they are and counted as failed.
    """
    primary = crypto.primary_key_id()
    counts = {"rotated": 0, "already_current": 0, "failed": 0}
    per_tenant: dict[int, int] = {}
    for run_id in Run.objects.exclude(state_key_id=primary).values_list("pk", flat=True).iterator():
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            if run.state_key_id == primary:
                counts["already_current"] += 1
                continue
            try:
                plaintext = crypto.open_sealed(
                    crypto.Sealed(
                        run.state_key_id, bytes(run.state_nonce), bytes(run.state_ciphertext)
                    ),
                    purpose=STATE_PURPOSE,
                    **_binding(run, run.state_generation),
                )
            except crypto.CryptoError:
                counts["failed"] += 1
                continue
            _seal_state(run, plaintext, run.state_generation)
            run.save(update_fields=["state_key_id", "state_nonce", "state_ciphertext"])
            counts["rotated"] += 1
            per_tenant[run.tenant_id] = per_tenant.get(run.tenant_id, 0) + 1
    counts["already_current"] += (
        Run.objects.filter(state_key_id=primary).count() - counts["rotated"]
    )
    for tenant_id, count in per_tenant.items():
        with transaction.atomic():
            audit.append(
                tenant_id=tenant_id,
                action="keys.rotated",
                actor_name="rotate_keys",
                outcome="rotated",
                detail={"runs": count, "key": primary},
            )
    return counts
