"""Paused runs cloned from one real paused run, approved in bulk, and what became of them."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from agents import Runner
from agents._tool_invocation import tool_invocation_identity_and_scope
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from approvals.core.canonical import arguments_digest, canonical_arguments
from approvals.execution import registry
from approvals.execution.queue import WAKE_CHANNEL, resume_run_task
from approvals.execution.state import open_state, seal_state
from approvals.models import AuditEvent, Run, RunStatus, Tenant, Ticket, TicketStatus, TicketVote
from approvals.runs.pause import pause_run
from devtools import demo
from devtools.processes import Proc

TEMPLATE_RELEASE = "2026.01.01-t0000"


# --- cloning one real paused run --------------------------------------------------------------


def make_template(tenant: Tenant, requester) -> tuple[Run, str]:
    """One real paused run of the release agent; its state JSON text, decrypted."""

    agent = registry.get_spec("release", "1").build()
    result = asyncio.run(
        Runner.run(agent, f"Deploy release {TEMPLATE_RELEASE} to production", context={})
    )
    run = pause_run(
        result, tenant=tenant, agent_key="release", agent_version="1", requested_by=requester
    )
    return run, json.dumps(open_state(run), ensure_ascii=False)


def _refingerprint(state: dict) -> None:
    """The SDK fingerprints each tool call's arguments; recompute them for the edited calls."""

    invocations = state.get("context", {}).get("tool_invocations") or {}
    raw_items = {}
    for item in state.get("generated_items", []):
        raw = item.get("raw_item") or {}
        if raw.get("call_id") in invocations:
            raw_items[raw["call_id"]] = raw
    for call_id, record in invocations.items():
        identity = tool_invocation_identity_and_scope(raw_items[call_id])
        record["approval_scope"] = identity[2]
        record["fingerprint"] = identity[3]


def clone_state(template_text: str, release: str) -> tuple[dict, bytes]:
    state = json.loads(template_text.replace(TEMPLATE_RELEASE, release))
    _refingerprint(state)
    return state, json.dumps(state, ensure_ascii=False, allow_nan=False).encode()


@dataclass
class Clone:
    run_id: int
    ticket_id: int
    release: str


def clone_runs(
    template: Run, template_text: str, tenant: Tenant, requester, releases: list[str]
) -> list[Clone]:
    """Paused runs like the template, each for its own release, re-sealed to its own row.

    Bulk inserts, no audit events for the clones (the worker appends its own to the chain).
    """
    template_ticket = Ticket.objects.get(run=template)
    now = timezone.now()
    clones: list[Clone] = []
    for start in range(0, len(releases), 1000):
        batch = releases[start : start + 1000]
        with transaction.atomic():
            runs = Run.objects.bulk_create(
                [
                    Run(
                        tenant=tenant,
                        agent_key=template.agent_key,
                        agent_version=template.agent_version,
                        schema_version=template.schema_version,
                        title=f"Deploy release {release} to production",
                        requested_by=requester,
                        state_key_id="",
                        state_nonce=b"",
                        state_ciphertext=b"",
                        created_at=now,
                        updated_at=now,
                    )
                    for release in batch
                ]
            )
            tickets = []
            for run, release in zip(runs, batch, strict=True):
                state, payload = clone_state(template_text, release)
                seal_state(run, payload, generation=1)
                raw = json.dumps({"release": release, "environment": "production"})
                tickets.append(
                    Ticket(
                        run=run,
                        tenant=tenant,
                        generation=1,
                        agent_name=template_ticket.agent_name,
                        tool_name=template_ticket.tool_name,
                        tool_call_id=template_ticket.tool_call_id.replace(
                            TEMPLATE_RELEASE, release
                        ),
                        arguments_json=canonical_arguments(raw),
                        arguments_digest=arguments_digest(raw),
                        requested_by=requester,
                        created_at=now,
                        expires_at=now + settings.APPROVALS_TICKET_TTL,
                    )
                )
            Run.objects.bulk_update(
                runs, ["state_key_id", "state_nonce", "state_ciphertext"], batch_size=500
            )
            Ticket.objects.bulk_create(tickets)
            clones += [
                Clone(r.pk, t.pk, rel) for r, t, rel in zip(runs, tickets, batch, strict=True)
            ]
    return clones


def approve_in_bulk(clones: list[Clone], approver, *, enqueue: bool = True) -> None:
    """What decide() leaves behind for many runs at once: approved tickets, queued runs, tasks."""

    now = timezone.now()
    with transaction.atomic():
        Ticket.objects.filter(pk__in=[c.ticket_id for c in clones]).update(
            status=TicketStatus.APPROVED, decided_by=approver, decided_at=now
        )
        # An approval is a vote, as decide() records it, and the resume checks it again.
        TicketVote.objects.bulk_create(
            TicketVote(ticket_id=c.ticket_id, user=approver, created_at=now, groups=[])
            for c in clones
        )
        Run.objects.filter(pk__in=[c.run_id for c in clones]).update(
            status=RunStatus.QUEUED, updated_at=now
        )
        if enqueue:
            for clone in clones:
                resume_run_task.enqueue(clone.run_id)
            with connection.cursor() as cursor:
                cursor.execute(f"NOTIFY {WAKE_CHANNEL}")


def finished_count(run_ids: list[int]) -> int:
    return Run.objects.filter(
        pk__in=run_ids,
        status__in=[RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION],
    ).count()


def wait_finished(
    run_ids: list[int], *, timeout: float, procs: list[Proc], poll: float = 0.5
) -> float:
    """Wait until the runs have finished; the host's monotonic clock when it saw that.

    Each look is a count over the runs (a few ms of this process's CPU and the database's, for
    a few hundred runs): looked at every poll seconds, so that the looking does not take cores
    from the workers being measured. The figures of one part's runs take when its last run
    finished from the runs' stored times (span_seconds); a figure that spans the waits between
    parts, or times from a moment of its own, passes a shorter poll.
    """
    deadline = time.monotonic() + timeout
    while finished_count(run_ids) < len(run_ids):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{len(run_ids) - finished_count(run_ids)} runs unfinished after {timeout:.0f}s\n"
                + "\n".join(p.tail() for p in procs)
            )
        dead = [p for p in procs if not p.alive()]
        if dead:
            raise RuntimeError("a worker died\n" + "\n".join(p.tail() for p in dead))
        time.sleep(poll)
    return time.monotonic()


def span_seconds(run_ids: list[int]) -> float:
    """From the first claim (run.resuming event) to the last finish, as stored."""
    first = (
        AuditEvent.objects.filter(action="run.resuming", run_id__in=run_ids)
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    last = (
        Run.objects.filter(pk__in=run_ids)
        .order_by("-finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )
    return (last - first).total_seconds()


def exactly_once(releases: Iterable[str]) -> dict[str, int]:

    wanted = set(releases)
    counts = Counter(
        e["release"] for e in demo.read_effects("deploy_release") if e["release"] in wanted
    )
    return {
        "expected": len(wanted),
        "effects": sum(counts.values()),
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "lost": len(wanted - set(counts)),
    }


def statuses(run_ids: list[int]) -> dict[str, int]:
    return dict(Counter(Run.objects.filter(pk__in=run_ids).values_list("status", flat=True)))
