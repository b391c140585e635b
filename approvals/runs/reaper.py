"""The reaper: runs whose worker died go back to the queue; tickets nobody decided in time get their
policy's expiry action (decisions.expiry).

A run the worker was starting (runs.start) whose lease lapsed stays starting: the reaper clears
the lease and gives it its start task again, so the next claim starts the agent again from its
sealed input (attempt + 1; the ledger keeps an effect the dead attempt confirmed from running
twice, and parks the run in needs attention for one it left unconfirmed). A starting run no
worker claimed within a lease gets its start task again, as a queued run gets its resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals import transitions
from approvals.audit import chain
from approvals.decisions import expiry
from approvals.execution import queue
from approvals.live import hints
from approvals.models import (
    Run,
    RunExecutor,
    RunStatus,
    Ticket,
    TicketStatus,
)


@dataclass
class ReapReport:
    requeued: list[int] = field(default_factory=list)
    reenqueued: list[int] = field(default_factory=list)
    expired_runs: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    escalated: list[int] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)
    awaiting_caller: list[int] = field(default_factory=list)


def reap(*, now=None) -> ReapReport:
    """Recover what workers left behind, and expire what nobody decided in time.

    Side effects: runs whose lease expired (their worker died) go back to queued with a new
    resume task; starting runs whose lease expired keep starting, without the lease, with a new
    start task (audit run.requeued); queued runs, and starting runs nobody claimed, that waited
    longer than a lease get their task again (a duplicate is harmless: the claim lets one
    through); a pending ticket past its expiry gets its
    policy's expiry action: "expire" (the ticket and its paused run expire), "reject" (the
    ticket is rejected with a message for the model, ticket.rejected with detail by=expiry, and
    the run is queued when nothing else of it is pending, or for a caller's run waits for its
    caller) or "escalate" (ticket.escalated: the
    escalation group decides, with a new expiry; a second lapse rejects). Audit events and live
    hints for each.
    """
    now = now or timezone.now()
    report = ReapReport()
    stale = now - timedelta(seconds=settings.APPROVALS_LEASE_SECONDS)
    # Only the console's runs have a worker to recover: a caller's run is never resumed here.
    console = Run.objects.filter(executor=RunExecutor.CONSOLE)
    for run_id in console.filter(status=RunStatus.RESUMING, lease_expires_at__lt=now).values_list(
        "pk", flat=True
    ):
        with transaction.atomic():
            run = Run.objects.filter(pk=run_id).first()
            moved = transitions.move_runs(
                console.filter(pk=run_id, status=RunStatus.RESUMING, lease_expires_at__lt=now),
                to=RunStatus.QUEUED,
                lease_owner="",
                lease_expires_at=None,
                updated_at=now,
            )
            if not moved:
                continue
            queue.enqueue_resume(run_id)
            chain.append(
                tenant_id=run.tenant_id,
                action="run.requeued",
                actor_name="reaper",
                run_id=run_id,
                outcome=RunStatus.QUEUED,
                detail={"reason": f"worker {run.lease_owner} stopped renewing its lease"},
            )
            hints.notify_on_commit(
                run.tenant_id, "run.changed", run=run_id, status=RunStatus.QUEUED
            )
        report.requeued.append(run_id)
    lapsed_starts = console.filter(status=RunStatus.STARTING, lease_expires_at__lt=now).exclude(
        lease_owner=""
    )
    for run_id in lapsed_starts.values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.filter(pk=run_id).first()
            moved = transitions.move_runs(
                lapsed_starts.filter(pk=run_id),
                to=RunStatus.STARTING,
                lease_owner="",
                lease_expires_at=None,
                updated_at=now,
            )
            if not moved:
                continue
            queue.enqueue_start(run_id)
            chain.append(
                tenant_id=run.tenant_id,
                action="run.requeued",
                actor_name="reaper",
                run_id=run_id,
                outcome=RunStatus.STARTING,
                detail={
                    "reason": f"worker {run.lease_owner} stopped renewing its lease while "
                    "starting the run; it starts again from its input"
                },
            )
            hints.notify_on_commit(
                run.tenant_id, "run.changed", run=run_id, status=RunStatus.STARTING
            )
        report.requeued.append(run_id)
    for run_id in console.filter(status=RunStatus.QUEUED, updated_at__lt=stale).values_list(
        "pk", flat=True
    ):
        with transaction.atomic():
            if console.filter(pk=run_id, status=RunStatus.QUEUED, updated_at__lt=stale).update(
                updated_at=now
            ):
                queue.enqueue_resume(run_id)
                report.reenqueued.append(run_id)
    unclaimed_starts = console.filter(status=RunStatus.STARTING, lease_owner="")
    for run_id in unclaimed_starts.filter(updated_at__lt=stale).values_list("pk", flat=True):
        with transaction.atomic():
            if unclaimed_starts.filter(pk=run_id, updated_at__lt=stale).update(updated_at=now):
                queue.enqueue_start(run_id)
                report.reenqueued.append(run_id)
    expired_run_ids = (
        Ticket.objects.filter(status=TicketStatus.PENDING, expires_at__lte=now)
        .values_list("run_id", flat=True)
        .distinct()
    )
    for run_id in list(expired_run_ids):
        done = expiry.expire_run_tickets(run_id, now=now)
        report.escalated += done.escalated
        report.rejected += done.rejected
        if done.run_expired:
            report.expired_runs.append(run_id)
        if done.run_queued:
            report.queued.append(run_id)
        if done.run_awaiting_caller:
            report.awaiting_caller.append(run_id)
    return report
