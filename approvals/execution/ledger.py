"""The idempotency ledger: side-effecting tools run through it, so an effect happens once.

The key is built by the console from tenant + approval + operation + resource, never by the
model. The key is claimed (committed) before the effect and confirmed after it. A key that is
already done returns its stored result; a key claimed by an attempt that never confirmed it
(a worker that died) is "in doubt": the run stops and waits for a person.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from approvals.audit import alone
from approvals.audit import chain as audit
from approvals.core import faults, statements
from approvals.core.canonical import canonical_json, sha256_hex
from approvals.models import IdempotencyRecord, LedgerStatus


class LedgerError(RuntimeError):
    pass


class EffectInDoubt(RuntimeError):  # noqa: N818 - the name says what a person must resolve
    pass


@dataclass
class ResumeScope:
    """What the ledger needs to know about the resume it runs in."""

    tenant_id: int
    run_id: int
    attempt: str
    tickets_by_call_id: dict[str, int]
    in_doubt: str = ""
    effects: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


_scope: ContextVar[ResumeScope | None] = ContextVar("approvals_resume_scope", default=None)


@contextmanager
def resume_scope(scope: ResumeScope) -> Iterator[ResumeScope]:
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def current_scope() -> ResumeScope | None:
    return _scope.get()


def idempotency_key(*, tenant_id: int, approval: str, operation: str, resource: str) -> str:
    return sha256_hex(
        canonical_json(["approvals.ledger.v1", tenant_id, approval, operation, resource])
    )


def _in_doubt(scope: ResumeScope, reason: str) -> EffectInDoubt:
    with scope.lock:
        scope.in_doubt = scope.in_doubt or reason
    return EffectInDoubt(reason)


def _claim(record: IdempotencyRecord) -> IdempotencyRecord:
    """Insert the claim so that it is committed before the effect: one INSERT, which commits on
    its own in the tool's thread (autocommit); inside a caller's transaction, in a savepoint so
    that a duplicate key leaves the transaction usable."""
    if connection.in_atomic_block:
        with transaction.atomic():
            _insert(record)
    else:
        _insert(record)
    return record


def _insert(record: IdempotencyRecord) -> None:
    """The claim's INSERT. Every effect sends it: on PostgreSQL written once per process
    (core.statements.bulk_create), elsewhere the model's save (bulk_create would wrap it in a
    transaction of its own); a key already claimed raises IntegrityError either way."""
    if connection.vendor == "postgresql":
        statements.bulk_create("ledger.claim", [record])
    else:
        record.save(force_insert=True)


def perform(
    tool_call_id: str | None, *, operation: str, resource: str, effect: Callable[[], str]
) -> str:
    """Run effect once for this approval, operation and resource; return its result.

    Side effects: inserts (claims) an IdempotencyRecord in its own committed transaction
    before the effect, then marks it done with the effect's result, or failed.
    Raises EffectInDoubt when an earlier attempt claimed the key and never confirmed it.
    """
    scope = current_scope()
    if scope is None:
        raise LedgerError(f"{operation} may only run inside an approved console resume")
    if scope.in_doubt:
        raise EffectInDoubt(scope.in_doubt)
    ticket_id = scope.tickets_by_call_id.get(tool_call_id or "")
    # A call approved by a sticky "always" decision has no ticket of its own: the run scopes it.
    approval = f"ticket:{ticket_id}" if ticket_id else f"run:{scope.run_id}"
    key = idempotency_key(
        tenant_id=scope.tenant_id, approval=approval, operation=operation, resource=resource
    )
    try:
        try:
            record = _claim(
                IdempotencyRecord(
                    tenant_id=scope.tenant_id,
                    key=key,
                    run_id=scope.run_id,
                    ticket_id=ticket_id,
                    operation=operation,
                    resource=resource[:500],
                    status=LedgerStatus.CLAIMED,
                    claimed_by=scope.attempt,
                )
            )
        except IntegrityError:
            existing = IdempotencyRecord.objects.get(key=key)
            if existing.status == LedgerStatus.DONE:
                return existing.result
            raise _in_doubt(
                scope,
                f"{operation} on {resource} was started by attempt {existing.claimed_by} at "
                f"{existing.claimed_at:%Y-%m-%d %H:%M:%S} UTC and never confirmed "
                f"({existing.status}); check whether it happened before deciding what to do",
            ) from None
        faults.point("after_claim")
        try:
            result = str(effect())
        except Exception as error:
            IdempotencyRecord.objects.filter(pk=record.pk).update(
                status=LedgerStatus.FAILED,
                error=f"{type(error).__name__}: {error}"[:2000],
                completed_at=timezone.now(),
            )
            raise
        faults.point("after_effect")
        try:
            done = audit.new_event(
                tenant_id=scope.tenant_id,
                action="effect.done",
                actor_name=f"worker {scope.attempt}",
                run_id=scope.run_id,
                ticket_id=ticket_id,
                tool_name=operation,
                outcome=LedgerStatus.DONE,
                detail={"resource": resource[:200]},
            )
            # The record's update and its event commit together: one statement of its own,
            # sent again once when the head had moved, else a transaction of two.
            alone.update_queryset_with_events(
                IdempotencyRecord.objects.filter(pk=record.pk),
                events=[done],
                status=LedgerStatus.DONE,
                result=result,
                completed_at=timezone.now(),
            )
        except Exception as error:
            # The effect ran, but that it did could not be recorded: its outcome is unknown to
            # the console, so the run waits for a person instead of failing or repeating it.
            raise _in_doubt(
                scope,
                f"{operation} on {resource} ran in attempt {scope.attempt} but its confirmation "
                f"could not be stored ({type(error).__name__}); check whether it happened",
            ) from error
        with scope.lock:
            scope.effects.append(record.pk)
        return result
    finally:
        # Tools run in the SDK's worker threads; do not leave a connection behind in each.
        if threading.current_thread() is not threading.main_thread():
            connection.close()
