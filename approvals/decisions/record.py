"""A ticket's decision record: everything the console knows of one decision, in one place, for an
auditor to read or export on its own.

It holds the exact arguments and their digest, the policy version that governed the ticket,
each approval (and whether a policy change invalidated it), the decision (who, when, how, with
what message), what ran for it (the ledger's effects and their results), the run's outcome, and
every audit event of the ticket and of its run as sentences. Views of a ticket are not
recorded: nothing logs who opened a page, so the record says so instead of guessing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from approvals.audit import chain, history, sentences
from approvals.audit.sentences import Description
from approvals.models import AuditEvent, IdempotencyRecord, Ticket
from approvals.policies import scopes

VIEWS_NOT_RECORDED = (
    "Views are not recorded: the console logs every decision, vote, claim, comment and export "
    "of a ticket, never who opened its page."
)

FORMATS = ("json", "csv")

# A run's events that are not about one ticket (queued, resuming, completed...) are part of
# every one of its tickets' records; these many at most, oldest first.
MAX_EVENTS = 1000


@dataclass
class DecisionRecord:
    ticket: Ticket
    policy_label: str
    policy_version: int
    required_approvals: int
    votes: list = field(default_factory=list)
    effects: list[IdempotencyRecord] = field(default_factory=list)
    events: list[tuple[AuditEvent, Description]] = field(default_factory=list)

    @property
    def run(self):
        return self.ticket.run

    @property
    def arguments(self) -> Any:
        return json.loads(self.ticket.arguments_json)

    @property
    def decided_by_name(self) -> str:
        ticket = self.ticket
        if ticket.decided_by_id:
            return ticket.decided_by.get_username()
        if ticket.decision_source:
            return ticket.decision_source
        return ""


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def decision_record(*, ticket: Ticket) -> DecisionRecord:
    """The record of a ticket the caller may read (views.access decides who may).

    No side effects: four reads (policy, votes, effects, events), whatever the ticket's history.
    Raises nothing for a ticket that exists.
    """
    policy = scopes.policy_of(ticket)
    votes = list(ticket.votes.select_related("user", "policy").order_by("created_at", "pk"))
    effects = list(
        IdempotencyRecord.objects.filter(ticket_id=ticket.pk).order_by("claimed_at", "pk")
    )
    events = list(
        AuditEvent.objects.filter(tenant_id=ticket.tenant_id, run_id=ticket.run_id)
        .filter(Q(ticket_id=ticket.pk) | Q(ticket_id__isnull=True))
        .select_related("tenant")
        .order_by("seq")[:MAX_EVENTS]
    )
    return DecisionRecord(
        ticket=ticket,
        policy_label=scopes.version_label(policy),
        policy_version=policy.version,
        required_approvals=policy.required_approvals,
        votes=votes,
        effects=effects,
        events=[(event, sentences.describe(event)) for event in events],
    )


def as_data(record: DecisionRecord) -> dict[str, Any]:
    """The record as JSON-ready data: the export's JSON, exact (arguments as stored)."""
    ticket, run = record.ticket, record.run
    return {
        "ticket": {
            "id": ticket.pk,
            "tenant": ticket.tenant.slug,
            "tool": ticket.tool_name,
            "call_id": ticket.tool_call_id,
            "generation": ticket.generation,
            "requested_by": ticket.requested_by.get_username() if ticket.requested_by_id else None,
            "created_at": _time(ticket.created_at),
            "expires_at": _time(ticket.expires_at),
            "status": ticket.status,
        },
        "arguments_json": ticket.arguments_json,
        "arguments_digest": ticket.arguments_digest,
        "policy": {
            "version": record.policy_version,
            "label": record.policy_label,
            "required_approvals": record.required_approvals,
        },
        "views": {"recorded": False, "note": VIEWS_NOT_RECORDED},
        "votes": [
            {
                "user": vote.user.get_username(),
                "at": _time(vote.created_at),
                "policy_version": vote.policy.version if vote.policy_id else 0,
                "groups": vote.groups,
                "valid": vote.is_valid,
                "invalidated_reason": vote.invalidated_reason or None,
            }
            for vote in record.votes
        ],
        "decision": {
            "status": ticket.status,
            "decided_by": record.decided_by_name or None,
            "decided_at": _time(ticket.decided_at),
            "source": ticket.decision_source or None,
            "reason": ticket.decision_reason or None,
            "message": ticket.decision_message or None,
            "always": ticket.always,
        },
        "effects": [
            {
                "operation": effect.operation,
                "resource": effect.resource,
                "status": effect.status,
                "claimed_by": effect.claimed_by,
                "claimed_at": _time(effect.claimed_at),
                "completed_at": _time(effect.completed_at),
                "result": effect.result,
                "error": effect.error or None,
            }
            for effect in record.effects
        ],
        "run": {
            "id": run.pk,
            "title": run.title,
            "agent": run.agent_key,
            "agent_version": run.agent_version,
            "status": run.status,
            "reason": run.status_reason or None,
            "final_output": run.final_output or None,
            "finished_at": _time(run.finished_at),
        },
        "events": [
            {
                "seq": event.seq,
                "at": _time(event.created_at),
                "actor": event.actor_name,
                "action": event.action,
                "sentence": described.text,
                "outcome": event.outcome,
                "arguments_digest": event.arguments_digest,
                "hash": event.hash,
            }
            for event, described in record.events
        ],
    }


CSV_HEADER = ["section", "item", "at", "who", "value"]


def csv_rows(record: DecisionRecord) -> Iterator[list]:
    """The record as CSV rows (section, item, at, who, value), the header first; every text
    cell made spreadsheet-safe."""
    data = as_data(record)
    rows: list[list] = []
    for name, value in data["ticket"].items():
        rows.append(["ticket", name, "", "", value])
    rows.append(["arguments", "json", "", "", data["arguments_json"]])
    rows.append(["arguments", "digest", "", "", data["arguments_digest"]])
    rows.append(["policy", "version", "", "", data["policy"]["label"]])
    rows.append(["policy", "required_approvals", "", "", data["policy"]["required_approvals"]])
    rows.append(["views", "recorded", "", "", VIEWS_NOT_RECORDED])
    for vote in data["votes"]:
        state = "valid" if vote["valid"] else f"invalidated: {vote['invalidated_reason']}"
        rows.append(["vote", "approval", vote["at"], vote["user"], state])
    decision = data["decision"]
    rows.append(
        [
            "decision",
            decision["status"],
            decision["decided_at"],
            decision["decided_by"],
            decision["message"] or decision["reason"] or "",
        ]
    )
    for effect in data["effects"]:
        rows.append(
            [
                "effect",
                f"{effect['operation']} {effect['resource']}",
                effect["completed_at"] or effect["claimed_at"],
                effect["claimed_by"],
                f"{effect['status']}: {effect['error'] or effect['result']}",
            ]
        )
    run = data["run"]
    rows.append(
        ["run", run["status"], run["finished_at"], "", run["final_output"] or run["reason"] or ""]
    )
    for event in data["events"]:
        rows.append(["event", event["action"], event["at"], event["actor"], event["sentence"]])
    yield list(CSV_HEADER)
    for row in rows:
        yield [history.spreadsheet_safe("" if cell is None else cell) for cell in row]


def record_export(*, ticket: Ticket, user, fmt: str) -> None:
    """An export of a decision record is itself audited.

    Side effects: one audit.record_exported event on the ticket, in its own transaction.
    Raises ValueError for a format other than json or csv, writing nothing.
    """
    if fmt not in FORMATS:
        raise ValueError(f"decision records export as {' or '.join(FORMATS)}, not {fmt!r}")
    with transaction.atomic():
        chain.append_for_ticket(
            ticket,
            action="audit.record_exported",
            actor=user,
            outcome="exported",
            detail={"format": fmt},
        )
