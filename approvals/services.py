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

from approvals import audit, ledger, live, policies, preauth, registry
from approvals.agent_sessions import SessionRef, describe, reopen
from approvals.core import crypto, faults
from approvals.core.canonical import arguments_digest, canonical_arguments, canonical_json
from approvals.core.redaction import find_secrets, redact, secret_shape
from approvals.models import (
    TERMINAL_RUN_STATUSES,
    ApprovalPolicy,
    ApproverGroup,
    ExpiryAction,
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
    TicketVote,
)

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


class AlreadyVotedError(DecisionError):
    """The same person approved this ticket already; a quorum needs distinct people."""


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


def _create_tickets(run: Run, interruptions, *, requested_by, now, resumed: bool) -> list[Ticket]:
    tickets = []
    for item in interruptions:
        raw = item.arguments
        tool_name = item.qualified_name or item.name or ""
        policy = policies.resolve(run.tenant_id, run.agent_key, tool_name)
        tickets.append(
            Ticket.objects.create(
                run=run,
                tenant_id=run.tenant_id,
                generation=run.state_generation,
                agent_name=getattr(item.agent, "name", "") or "",
                tool_name=tool_name,
                tool_call_id=item.call_id or "",
                arguments_json=canonical_arguments(raw),
                arguments_digest=arguments_digest(raw),
                requested_by=requested_by,
                created_at=now,
                expires_at=now + policies.time_to_live(policy),
                policy=None if policy.is_builtin else policy,
            )
        )
    for ticket in tickets:
        audit.append_for_ticket(
            ticket,
            action="ticket.created",
            actor=requested_by,
            outcome="pending",
            detail={
                "expires_at": ticket.expires_at.isoformat(),
                "call_id": ticket.tool_call_id,
                **({"policy": ticket.policy.version} if ticket.policy_id else {}),
            },
        )
        live.notify_on_commit(run.tenant_id, "ticket.created", ticket=ticket.pk, run=run.pk)
    # Only a resumed run can meet a pre-authorisation: one belongs to a ticket of its run.
    _decide_automatically(run, tickets, now=now, preauthorised=resumed)
    return tickets


def _decide_automatically(run: Run, tickets: list[Ticket], *, now, preauthorised: bool) -> None:
    """Offer each new ticket to the automatic deciders; queue the run if none is left pending.

    The policy's rules on argument values come first: a call a rule rejects is rejected even if
    an approver pre-authorised it. Then a call an approver edited and pre-authorised (preauth):
    it counts as that person's approval under the ticket's policy, so it approves the ticket
    when one approval is enough and is one vote towards a larger quorum otherwise (where an
    approving rule, if any, still decides). Runs inside the caller's transaction, with the run
    row written (and locked when resuming).
    """
    decided, by_person = False, None
    for ticket in tickets:
        policy = policies.policy_of(ticket)
        choice = policies.automatic_decision(policy, ticket.arguments_json)
        if choice is not None and not choice.approve:
            _record_automatic(ticket, choice, now=now)
            decided = True
            continue
        pre = preauth.candidate(run, ticket, now=now) if preauthorised else None
        if (
            pre is not None
            and not policies.refusal_for(pre.created_by, ticket, policy)
            and preauth.use(pre, ticket, now=now)
        ):
            progress = _vote(ticket, policy, user=pre.created_by, now=now)
            if progress.met:
                preauth.approve(run, ticket, pre, now=now)
                decided, by_person = True, pre.created_by
                continue
            preauth.count_as_vote(run, ticket, pre, progress=progress.describe())
        if choice is not None:
            _record_automatic(ticket, choice, now=now)
            decided = True
    if decided:
        _queue_if_decided(run, now=now, actor=by_person, actor_name="" if by_person else "policy")


def _record_automatic(ticket: Ticket, choice: policies.AutoDecision, *, now) -> None:
    status = TicketStatus.APPROVED if choice.approve else TicketStatus.REJECTED
    message = "" if choice.approve else choice.reason[:MAX_MESSAGE_CHARS]
    reason = f"{choice.rule}: {choice.reason}"
    Ticket.objects.filter(pk=ticket.pk, status=TicketStatus.PENDING).update(
        status=status,
        decided_at=now,
        decision_message=message,
        decision_source="rule",
        decision_reason=reason,
    )
    ticket.refresh_from_db()
    audit.append_for_ticket(
        ticket,
        action="ticket.auto_approved" if choice.approve else "ticket.auto_rejected",
        actor_name="policy",
        outcome=status,
        detail={
            "rule": choice.rule,
            "reason": choice.reason,
            "policy": ticket.policy.version if ticket.policy_id else 0,
        },
    )
    live.notify_on_commit(
        ticket.tenant_id, "ticket.decided", ticket=ticket.pk, run=ticket.run_id, status=status
    )


def _queue_if_decided(run: Run, *, now, actor=None, actor_name: str = "") -> bool:
    """When no ticket of the run's current state is pending, queue the run and its resume.

    Runs inside the caller's transaction, which holds the run's lock.
    """
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
        actor_name=actor_name,
        run_id=run.pk,
        outcome=RunStatus.QUEUED,
    )
    live.notify_on_commit(run.tenant_id, "run.changed", run=run.pk, status=RunStatus.QUEUED)
    return True


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
        _create_tickets(run, interruptions, requested_by=requested_by, now=now, resumed=False)
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
        # A decision ends whoever was "on it".
        claimed_by=None,
        claimed_at=None,
    )
    if won:
        return
    _refuse_unless_pending(Ticket.objects.select_related("decided_by").get(pk=ticket.pk), now)
    raise TicketExpiredError("this ticket could not be decided; reload it")


def decide(
    ticket: Ticket, *, user, approve: bool, message: str = "", always: bool = False
) -> Ticket:
    """Approve or reject a pending ticket under its policy.

    A rejection by anyone who may decide, or the approval that meets the policy's quorum and
    group rules, is one compare-and-set from pending. An approval that does not yet meet them
    is recorded as a vote and the ticket stays pending.
    Side effects, in one transaction: a TicketVote for each approval; the ticket's decision
    when it is final; audit event ticket.vote, ticket.approved (detail: every voter) or
    ticket.rejected; when it was the run's last pending ticket, the run becomes queued and the
    resume task is enqueued (the queue is in the same database, so both commit or neither);
    after commit, live hints. Raises TicketNotFoundError (not the user's tenant),
    NotAllowedError, SelfApprovalError, AlreadyVotedError, TicketExpiredError,
    AlreadyDecidedError or InvalidDecisionError, having written nothing.
    """
    message = _checked_message(message)
    if always and not approve:
        raise InvalidDecisionError("'always' goes with an approval, not a rejection")
    _check_decider(ticket, user, approve=approve)
    with transaction.atomic():
        # The run's lock orders decisions on one run, so exactly one of them sees "all decided".
        # Only what is read here: the row also holds the state blob, which need not travel.
        run = (
            Run.objects.select_for_update()
            .only("tenant_id", "status", "state_generation")
            .get(pk=ticket.run_id)
        )
        now = timezone.now()
        # Read under the lock: a policy change or an escalation may have moved the ticket.
        current = Ticket.objects.select_related("policy", "decided_by").get(pk=ticket.pk)
        _refuse_unless_pending(current, now)
        policy = policies.policy_of(current)
        refusal = policies.refusal_for(user, current, policy)
        if refusal:
            raise NotAllowedError(refusal)
        if always and not policies.allows_always(policy):
            raise InvalidDecisionError(
                "'always' is not offered under this ticket's policy: it asks for more than one "
                "person or rejects some arguments, so each later call needs its own approval"
            )
        if approve:
            progress = _vote(current, policy, user=user, now=now)
            if not progress.met:
                audit.append_for_ticket(
                    ticket,
                    action="ticket.vote",
                    actor=user,
                    outcome="pending",
                    detail={"progress": progress.describe(), "policy": policy.version},
                )
                live.notify_on_commit(
                    ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=run.pk
                )
                ticket.refresh_from_db()
                return ticket
        status = TicketStatus.APPROVED if approve else TicketStatus.REJECTED
        _compare_and_set(ticket, status=status, user=user, now=now, message=message, always=always)
        detail: dict[str, Any] = {"always": always, "message": message} if message or always else {}
        if approve and (progress.count > 1 or policy.group_rules):
            detail["voters"] = progress.voters
            detail["policy"] = policy.version
        audit.append_for_ticket(
            ticket,
            action=f"ticket.{status}",
            actor=user,
            outcome=status,
            detail=detail,
        )
        live.notify_on_commit(
            ticket.tenant_id, "ticket.decided", ticket=ticket.pk, run=run.pk, status=status
        )
        _queue_if_decided(run, now=now, actor=user)
    ticket.refresh_from_db()
    return ticket


def _refuse_unless_pending(current: Ticket, now) -> None:
    if current.status == TicketStatus.PENDING and current.expires_at > now:
        return
    if current.status in (TicketStatus.PENDING, TicketStatus.EXPIRED):
        raise TicketExpiredError(
            f"this ticket expired at {current.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
            "the agent must ask again"
        )
    if current.status == TicketStatus.SUPERSEDED:
        raise TicketExpiredError("this ticket was withdrawn because its run ended")
    raise AlreadyDecidedError(current)


def _vote(ticket: Ticket, policy: ApprovalPolicy, *, user, now) -> policies.Progress:
    """Record the user's approval as a vote and return where the quorum stands."""
    votes = list(ticket.votes.filter(invalidated_at__isnull=True).select_related("user"))
    mine = next((v for v in votes if v.user_id == user.pk), None)
    if mine is not None:
        progress = policies.progress(ticket, policy, votes)
        raise AlreadyVotedError(
            f"you already approved this ticket at {mine.created_at:%Y-%m-%d %H:%M:%S} UTC; "
            f"it needs another person ({progress.describe()})"
        )
    vote = TicketVote.objects.create(
        ticket=ticket,
        user=user,
        policy=None if policy.is_builtin else policy,
        created_at=now,
        groups=policies.counted_groups(policies.groups_of(user, ticket.tenant_id), ticket, policy),
    )
    return policies.progress(ticket, policy, [*votes, vote])


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
    ticket counts as this user's approval (_decide_automatically, from _create_tickets).
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
        # Read under the lock, as decide() does: an escalation may have moved the ticket.
        current = Ticket.objects.select_related("policy").get(pk=ticket.pk)
        policy = policies.policy_of(current)
        refusal = policies.refusal_for(user, current, policy)
        if refusal:
            raise NotAllowedError(refusal)
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
            expires_at=now + policies.time_to_live(policy),
        )
        audit.append_for_ticket(
            ticket,
            action="ticket.edited",
            actor=user,
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
        _queue_if_decided(run, now=now, actor=user)
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
    # The run waits for its last ticket, whose expiry may be later than its siblings' (another
    # policy, an escalation): an approval is stale only once the whole generation has expired.
    deadline = max(t.expires_at for t in tickets)
    for ticket in tickets:
        if ticket.status == TicketStatus.REJECTED and ticket.decision_source == "expiry":
            # Rejected because it expired: the decision is the expiry itself, and runs nothing.
            continue
        if ticket.decided_at is None or ticket.decided_at > ticket.expires_at:
            raise _Refusal(
                f"{REGENERATE}: ticket {ticket.pk} was decided after it expired", RunStatus.EXPIRED
            )
        # A decision is good until the tickets' expiry; a resume that starts much later must
        # not act on a stale approval. A rejection runs nothing, so it never goes stale.
        if ticket.status == TicketStatus.APPROVED and now > deadline + grace:
            raise _Refusal(
                f"{REGENERATE}: ticket {ticket.pk} expired at "
                f"{deadline:%Y-%m-%d %H:%M:%S} UTC before the run could resume",
                RunStatus.EXPIRED,
            )
        if ticket.status == TicketStatus.APPROVED and ticket.decision_source != "rule":
            approver = ticket.decided_by
            membership = membership_for(approver, run.tenant_id) if approver else None
            if membership is None or not membership.can_decide:
                who = approver.get_username() if approver else "a deleted user"
                raise _Refusal(
                    f"{REGENERATE}: {who}, who approved ticket {ticket.pk}, may no longer approve"
                )
            if ticket.is_requested_by(approver):
                raise _Refusal(f"{REGENERATE}: ticket {ticket.pk} was approved by its requester")
            # Every vote of a quorum counts, so each voter must still hold, not only the last.
            votes = list(ticket.votes.filter(invalidated_at__isnull=True).select_related("user"))
            for vote in votes:
                voter = membership_for(vote.user, run.tenant_id)
                if voter is None or not voter.can_decide or ticket.is_requested_by(vote.user):
                    raise _Refusal(
                        f"{REGENERATE}: {vote.user.get_username()}, whose approval counted for "
                        f"ticket {ticket.pk}, may no longer approve"
                    )
            # Group membership counts as it is now, not as it was at the vote: someone taken
            # out of a group since no longer speaks for it.
            policy = policies.policy_of(ticket)
            if policy.group_rules or policy.allowed_groups or policy.escalation_group:
                for vote in votes:
                    now_in = policies.groups_of(vote.user, run.tenant_id)
                    vote.groups = [g for g in vote.groups if g in now_in]
                    why = policies.vote_refusal(vote, now_in, ticket, policy)
                    if why:
                        raise _Refusal(
                            f"{REGENERATE}: {vote.user.get_username()}, whose approval counted "
                            f"for ticket {ticket.pk}, may no longer approve it: {why}"
                        )
            # And the quorum itself: a voter whose account was deleted took the vote along.
            if policy.required_approvals > 1 or policy.group_rules:
                progress = policies.progress(ticket, policy, votes)
                if not progress.met:
                    raise _Refusal(
                        f"{REGENERATE}: ticket {ticket.pk} no longer has the approvals its "
                        f"policy needs ({progress.describe()})"
                    )
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
        _create_tickets(
            locked, result.interruptions, requested_by=run.requested_by, now=now, resumed=True
        )
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
    rejected: list[int] = field(default_factory=list)
    escalated: list[int] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)


def reap(*, now=None) -> ReapReport:
    """Recover what workers left behind, and expire what nobody decided in time.

    Side effects: runs whose lease expired (their worker died) go back to queued with a new
    resume task; queued runs that waited longer than a lease get their task again (a duplicate
    is harmless: the claim lets one through); a pending ticket past its expiry gets its
    policy's expiry action: "expire" (the ticket and its paused run expire), "reject" (the
    ticket is rejected with a message for the model, ticket.rejected with detail by=expiry, and
    the run is queued when nothing else of it is pending) or "escalate" (ticket.escalated: the
    escalation group decides, with a new expiry; a second lapse rejects). Audit events and live
    hints for each.
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
                Ticket.objects.filter(
                    run=run, status=TicketStatus.PENDING, expires_at__lte=now
                ).select_related("policy")
            )
            if not expiring:
                continue
            to_expire = []
            for ticket in expiring:
                policy = policies.policy_of(ticket)
                action = policy.on_expiry
                if action == ExpiryAction.ESCALATE and (
                    ticket.escalated_at or not policy.escalation_group
                ):
                    # A second lapse (or nowhere to escalate to) ends in a rejection.
                    action = ExpiryAction.REJECT
                if action == ExpiryAction.ESCALATE:
                    _escalate(ticket, policy, now=now)
                    report.escalated.append(ticket.pk)
                elif action == ExpiryAction.REJECT:
                    _reject_on_expiry(ticket, policy, now=now)
                    report.rejected.append(ticket.pk)
                else:
                    to_expire.append(ticket)
            if to_expire:
                Ticket.objects.filter(pk__in=[t.pk for t in to_expire]).update(
                    status=TicketStatus.EXPIRED
                )
            for ticket in to_expire:
                audit.append_for_ticket(
                    ticket,
                    action="ticket.expired",
                    actor_name="reaper",
                    outcome=TicketStatus.EXPIRED,
                )
            if to_expire and run.status == RunStatus.PAUSED:
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
            elif _queue_if_decided(run, now=now, actor_name="reaper"):
                report.queued.append(run.pk)
            live.notify_on_commit(
                run.tenant_id,
                "run.changed",
                run=run.pk,
                status=RunStatus.EXPIRED if run.pk in report.expired_runs else run.status,
            )
    return report


EXPIRY_MESSAGE = (
    "Nobody approved this {tool} call before its approval expired at {when} UTC, so it was "
    "rejected and did not run. Do not retry it without asking the user."
)


def _reject_on_expiry(ticket: Ticket, policy: ApprovalPolicy, *, now) -> None:
    """The policy's expiry action "reject": the model is told, and the run can go on."""
    message = (policy.expiry_message or "").strip() or EXPIRY_MESSAGE.format(
        tool=ticket.tool_name, when=f"{ticket.expires_at:%Y-%m-%d %H:%M:%S}"
    )
    Ticket.objects.filter(pk=ticket.pk, status=TicketStatus.PENDING).update(
        status=TicketStatus.REJECTED,
        decided_at=now,
        decision_message=message[:MAX_MESSAGE_CHARS],
        decision_source="expiry",
        decision_reason=f"not decided by {ticket.expires_at:%Y-%m-%d %H:%M:%S} UTC",
    )
    audit.append_for_ticket(
        ticket,
        action="ticket.rejected",
        actor_name="reaper",
        outcome=TicketStatus.REJECTED,
        detail={"by": "expiry", "message": message[:MAX_MESSAGE_CHARS], "policy": policy.version},
    )
    live.notify_on_commit(
        ticket.tenant_id,
        "ticket.decided",
        ticket=ticket.pk,
        run=ticket.run_id,
        status=TicketStatus.REJECTED,
    )


def _escalate(ticket: Ticket, policy: ApprovalPolicy, *, now) -> None:
    """The policy's expiry action "escalate": the escalation group decides, with a new window."""
    expires_at = now + policies.escalation_window(policy)
    Ticket.objects.filter(pk=ticket.pk, status=TicketStatus.PENDING).update(
        # Another group decides now: whoever was "on it" is not any more.
        escalated_at=now,
        expires_at=expires_at,
        claimed_by=None,
        claimed_at=None,
    )
    audit.append_for_ticket(
        ticket,
        action="ticket.escalated",
        actor_name="reaper",
        outcome=TicketStatus.PENDING,
        detail={
            "group": policy.escalation_group,
            "expires_at": expires_at.isoformat(),
            "policy": policy.version,
        },
    )
    live.notify_on_commit(ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=ticket.run_id)


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


# --- policies ---------------------------------------------------------------------------------


class PolicyError(Exception):
    """A policy or group change was refused; nothing was written."""


class PolicyUnchanged(PolicyError):
    """The values are those of the current version: no new version, no approvals invalidated."""

    def __init__(self, policy: ApprovalPolicy) -> None:
        super().__init__(f"nothing changed: {policy.scope_label} stays at v{policy.version}")
        self.policy = policy


POLICY_FIELDS = (
    "required_approvals",
    "group_rules",
    "allowed_groups",
    "expiry_seconds",
    "on_expiry",
    "expiry_message",
    "escalation_group",
    "escalation_seconds",
    "auto_rules",
)


def _require_admin(user, tenant_id: int) -> None:
    membership = membership_for(user, tenant_id)
    if membership is None or membership.role != Role.ADMIN:
        raise PolicyError("only an admin of this tenant can change its policies")


def version_label(policy: ApprovalPolicy) -> str:
    return "the built-in default" if policy.is_builtin else f"v{policy.version}"


def save_policy(
    *, tenant: Tenant, user, agent_key: str = "", tool_name: str = "", **values: Any
) -> ApprovalPolicy:
    """Write the next version of the policy for (tenant, agent_key, tool_name).

    Side effects, in one transaction: a new immutable ApprovalPolicy row (version + 1); audit
    event policy.changed with the fields that changed; every pending ticket the new version now
    governs moves to it, and the approvals given under the old version are invalidated (audit
    ticket.votes_invalidated, live hint ticket.changed). Raises PolicyError (PolicyUnchanged
    when the values are the current version's), writing nothing.
    """
    _require_admin(user, tenant.pk)
    unknown = set(values) - set(POLICY_FIELDS)
    if unknown:
        raise PolicyError(f"unknown policy fields: {sorted(unknown)}")
    required = int(values.get("required_approvals", 1))
    if not 1 <= required <= policies.MAX_APPROVALS:
        raise PolicyError(f"required approvals must be from 1 to {policies.MAX_APPROVALS}")
    named = policies.groups_named(ApprovalPolicy(**values))
    _check_groups_exist(tenant, named)
    if values.get("on_expiry") == ExpiryAction.ESCALATE and not values.get("escalation_group"):
        raise PolicyError("escalation needs a group to escalate to")
    for rule in values.get("auto_rules") or []:
        if rule.get("op") not in policies.OPERATORS:
            raise PolicyError(f"unknown operator {rule.get('op')!r}")
    with transaction.atomic():
        # The tenant's lock orders concurrent edits, so versions never collide, and a group
        # deleted meanwhile (delete_group takes the same lock) is seen here.
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        _check_groups_exist(tenant, named)
        latest = policies.latest_for_scope(tenant.pk, agent_key, tool_name)
        previous = latest if latest is not None and not latest.retired else None
        before = previous or policies.builtin_policy(tenant.pk)
        now = timezone.now()
        policy = ApprovalPolicy(
            tenant=tenant,
            agent_key=agent_key,
            tool_name=tool_name,
            version=(latest.version if latest else 0) + 1,
            created_by=user,
            created_at=now,
            **values,
        )
        changes = {
            name: [getattr(before, name), getattr(policy, name)]
            for name in POLICY_FIELDS
            if getattr(before, name) != getattr(policy, name)
        }
        # Saving the same values again must not cost pending tickets their approvals.
        if previous is not None and not changes:
            raise PolicyUnchanged(previous)
        _write_version(
            policy,
            user=user,
            now=now,
            why=f"changed the policy to v{policy.version}",
            action="policy.changed",
            outcome="changed",
            changes=changes,
        )
    return policy


def remove_policy(
    *, tenant: Tenant, user, agent_key: str = "", tool_name: str = ""
) -> ApprovalPolicy:
    """Remove a scope's own policy: its tickets fall back to the next scope that has one (the
    tool alone, the agent alone, the tenant default, then the built-in default).

    Side effects, in one transaction under the tenant's lock: a new version marked retired
    (keeping the removed version's values, for the history); every pending ticket it governed
    moves to the fallback and the approvals it had are invalidated (audit
    ticket.votes_invalidated, live hint ticket.changed); audit event policy.removed. Raises
    PolicyError when the scope has no policy of its own, writing nothing.
    """
    _require_admin(user, tenant.pk)
    with transaction.atomic():
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        current = policies.current_for_scope(tenant.pk, agent_key, tool_name)
        if current is None:
            raise PolicyError(
                f"{ApprovalPolicy(agent_key=agent_key, tool_name=tool_name).scope_label} "
                "has no policy of its own to remove"
            )
        now = timezone.now()
        retired = ApprovalPolicy(
            tenant=tenant,
            agent_key=agent_key,
            tool_name=tool_name,
            version=current.version + 1,
            retired=True,
            created_by=user,
            created_at=now,
            **{name: getattr(current, name) for name in POLICY_FIELDS},
        )
        _write_version(
            retired,
            user=user,
            now=now,
            why=f"removed the policy for {retired.scope_label}",
            action="policy.removed",
            outcome="removed",
            removed=current.version,
        )
    return retired


def _write_version(
    policy: ApprovalPolicy, *, user, now, why: str, action: str, outcome: str, **detail: Any
) -> None:
    """Store a scope's new version, move the pending tickets it now decides (their approvals
    invalidated with `why`) and audit it. Runs in the caller's transaction, under the tenant's
    lock."""
    policy.save()
    moved = _move_pending_tickets(policy, user=user, now=now, why=why)
    audit.append(
        tenant_id=policy.tenant_id,
        action=action,
        actor=user,
        outcome=outcome,
        detail={
            "scope": policy.scope_label,
            "agent": policy.agent_key,
            "tool": policy.tool_name,
            "version": policy.version,
            **detail,
            "tickets_moved": moved,
        },
    )


def _move_pending_tickets(scope: ApprovalPolicy, *, user, now, why: str) -> int:
    """Move each pending ticket of the scope to the policy that governs it now.

    A ticket of the scope that a more specific scope governs stays where it is. The approvals a
    moved ticket had were given under other rules: they are invalidated, with `why`.
    """
    pending = Ticket.objects.filter(
        tenant_id=scope.tenant_id, status=TicketStatus.PENDING
    ).select_related("run", "policy")
    if scope.tool_name:
        pending = pending.filter(tool_name=scope.tool_name)
    if scope.agent_key:
        pending = pending.filter(run__agent_key=scope.agent_key)
    moved = 0
    governing: dict[tuple[str, str], ApprovalPolicy] = {}  # one resolve per agent and tool
    for ticket in pending:
        key = (ticket.run.agent_key, ticket.tool_name)
        if key not in governing:
            governing[key] = policies.resolve(ticket.tenant_id, *key)
        policy = governing[key]
        if ticket.policy_id == policy.pk:
            continue
        old = policies.policy_of(ticket)
        Ticket.objects.filter(pk=ticket.pk).update(policy=policy if policy.pk else None)
        moved += 1
        votes = list(ticket.votes.filter(invalidated_at__isnull=True).select_related("user"))
        if not votes:
            continue
        reason = f"invalidated when {user.get_username()} {why} at {now:%Y-%m-%d %H:%M} UTC"
        TicketVote.objects.filter(pk__in=[v.pk for v in votes]).update(
            invalidated_at=now, invalidated_reason=reason
        )
        noun = "approval" if len(votes) == 1 else "approvals"
        audit.append_for_ticket(
            ticket,
            action="ticket.votes_invalidated",
            actor=user,
            outcome=TicketStatus.PENDING,
            detail={
                "voters": [v.user.get_username() for v in votes],
                "from": old.version,
                "to": policy.version,
                "reason": f"{len(votes)} {noun} given under policy {version_label(old)} "
                f"were {reason}; approve again",
            },
        )
        live.notify_on_commit(
            ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=ticket.run_id
        )
    return moved


def _check_groups_exist(tenant: Tenant, named: set[str]) -> None:
    existing = set(
        ApproverGroup.objects.filter(tenant=tenant, name__in=named).values_list("name", flat=True)
    )
    if named - existing:
        raise PolicyError(f"no such group: {', '.join(sorted(named - existing))}")


def delete_group(*, tenant: Tenant, user, name: str) -> None:
    """Delete an approver group that no current policy names and no open ticket depends on.

    An approved ticket whose run has not resumed yet keeps the policy version it was decided
    under, and the resume checks its voters against that version's groups as they are then:
    deleting a group that version names would void those approvals, so it is refused too.

    Side effects, in one transaction under the tenant's lock (which save_policy also takes, so
    no policy can start naming the group meanwhile): the group row and its memberships; audit
    event group.deleted with its members. Raises PolicyError naming what uses the group,
    writing nothing.
    """
    _require_admin(user, tenant.pk)
    name = " ".join((name or "").split())
    if not name or len(name) > 100 or "\x00" in name:
        raise PolicyError("name the group to delete")
    with transaction.atomic():
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        group = ApproverGroup.objects.filter(tenant=tenant, name=name).first()
        if group is None:
            raise PolicyError(f"there is no group {name!r}")
        users = [
            str(policy)
            for policy in policies.current_policies(tenant.pk)
            if name in policies.groups_named(policy)
        ]
        if users:
            raise PolicyError(
                f"the group {name} is named by {', '.join(users)}; "
                "change those policies first, then delete it"
            )
        # The versions open tickets hold are few, however many the tickets: read those.
        open_tickets = Ticket.objects.filter(
            tenant=tenant, status__in=[TicketStatus.PENDING, TicketStatus.APPROVED]
        ).exclude(run__status__in=TERMINAL_RUN_STATUSES)
        naming = [
            policy.pk
            for policy in ApprovalPolicy.objects.filter(pk__in=open_tickets.values("policy_id"))
            if name in policies.groups_named(policy)
        ]
        holding = list(
            open_tickets.filter(policy_id__in=naming)
            .order_by("pk")
            .values_list("pk", flat=True)[:6]
        )
        if holding:
            shown = ", ".join(f"#{pk}" for pk in holding[:5]) + (" ..." if len(holding) > 5 else "")
            raise PolicyError(
                f"the group {name} still counts for ticket{'s' if len(holding) > 1 else ''} "
                f"{shown}, decided or pending under an earlier policy version; delete it once "
                "their runs have moved on"
            )
        members = sorted(group.members.values_list("username", flat=True))
        group.delete()
        audit.append(
            tenant_id=tenant.pk,
            action="group.deleted",
            actor=user,
            outcome="deleted",
            detail={"group": name, "removed": members},
        )


def save_group(*, tenant: Tenant, user, name: str, members: list) -> ApproverGroup:
    """Create an approver group, or set the members of an existing one.

    Side effects, in one transaction: the group row and its members (only members of the
    tenant are kept); audit event group.changed. Raises PolicyError, writing nothing.
    """
    _require_admin(user, tenant.pk)
    name = " ".join((name or "").split())
    if not name or len(name) > 100:
        raise PolicyError("a group needs a name of at most 100 characters")
    member_ids = set(
        Membership.objects.filter(tenant=tenant, user__in=members).values_list("user_id", flat=True)
    )
    with transaction.atomic():
        group, created = ApproverGroup.objects.get_or_create(tenant=tenant, name=name)
        before = set(group.members.values_list("username", flat=True))
        group.members.set(member_ids)
        after = set(group.members.values_list("username", flat=True))
        audit.append(
            tenant_id=tenant.pk,
            action="group.changed",
            actor=user,
            outcome="created" if created else "changed",
            detail={
                "group": name,
                "added": sorted(after - before),
                "removed": sorted(before - after),
            },
        )
    return group
