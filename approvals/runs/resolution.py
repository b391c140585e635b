"""Resolutions: an admin settles a run the worker parked because an effect's outcome is in doubt."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from approvals import members, transitions
from approvals.audit import chain
from approvals.core.errors import DomainError
from approvals.execution import queue
from approvals.live import hints
from approvals.models import (
    IdempotencyRecord,
    LedgerStatus,
    Run,
    RunExecutor,
    RunStatus,
)


class ResolutionError(DomainError):
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
    and the run is queued to finish (a run that never paused starts again from its input); "retry": the in-doubt claims are released so the effects
    run again, and the run is queued; "abandon": the run ends as failed.
    Side effects, in one transaction: ledger rows, the run's status, a resume task when queued,
    audit event run.resolved; after commit, live hints. Raises ResolutionError, writing nothing.
    """
    if not members.is_admin(user, run.tenant_id):
        raise ResolutionError("only an admin of this tenant can resolve a run")
    note = (note or "").strip()[:1000]
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.executor == RunExecutor.CALLER:
            raise ResolutionError("its caller runs this agent, so only its caller can settle it")
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
            reason = f"Stopped by {user.get_username()}." + (f" {note}" if note else "")
            transitions.move_runs(
                Run.objects.filter(pk=locked.pk),
                to=RunStatus.FAILED,
                status_reason=reason,
                finished_at=now,
                updated_at=now,
            )
        elif locked.state_generation == 0:
            # It never paused: its sealed start request is all there is, so it starts again.
            transitions.move_runs(
                Run.objects.filter(pk=locked.pk),
                to=RunStatus.STARTING,
                status_reason="",
                lease_owner="",
                lease_expires_at=None,
                attempts=0,
                updated_at=now,
            )
            queue.enqueue_start(locked.pk)
        else:
            transitions.move_runs(
                Run.objects.filter(pk=locked.pk),
                to=RunStatus.QUEUED,
                status_reason="",
                attempts=0,
                updated_at=now,
            )
            queue.enqueue_resume(locked.pk)
        locked.refresh_from_db()
        chain.append(
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
        hints.notify_on_commit(locked.tenant_id, "run.changed", run=locked.pk, status=locked.status)
    return locked
