"""Which audit actions notify, as which event (the table in approvals.audit.actions), and what a
notification says (Facts).

Everything else (votes, claims, comments, and the notifications' own webhook.* and email.*
events) notifies no one. Facts are read once per audit event and feed both the webhook payload
and the email; they carry ids, the tool name, the arguments digest, the status, the actor and a
link, never argument values. A run's end also carries how it ended (approvals.runs.outcome: the
final output capped, the failure's reason, the decisions on its calls).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from approvals.audit import actions
from approvals.core.links import public_url
from approvals.models import AuditEvent, Run, Tenant
from approvals.runs import outcome as outcomes
from notifications.models import Event

# The events that tell how a run ended, with its outcome.
RUN_EVENTS = frozenset({Event.RUN_COMPLETED, Event.RUN_FAILED})


def event_for(audit_event: AuditEvent) -> str | None:
    """The notification event an audit event stands for, or None."""
    detail = audit_event.detail if isinstance(audit_event.detail, dict) else {}
    # An expiry that rejects (policies) is a ticket.rejected written by the expiry.
    if audit_event.action == "ticket.rejected" and detail.get("by") == "expiry":
        return Event.TICKET_EXPIRED
    action = actions.ACTIONS.get(audit_event.action)
    return action.notify if action is not None and action.notify else None


def link_for(*, ticket_id: int | None, run_id: int | None) -> str:
    if ticket_id:
        return public_url("approvals:ticket", ticket_id)
    if run_id:
        return public_url("approvals:run", run_id)
    return public_url("approvals:queue")


@dataclass(frozen=True)
class Facts:
    """What a notification says, read once from the audit event and its run."""

    event: str
    action: str
    tenant_slug: str
    tenant_name: str
    ticket_id: int | None
    run_id: int | None
    run_title: str
    tool: str
    arguments_digest: str
    status: str
    actor: str
    actor_id: int | None
    requester_id: int | None
    time: datetime
    link: str
    # The approver group an escalation went to ("" for other events).
    group: str = ""
    # How the run ended, for run.completed and run.failed (None for other events).
    outcome: outcomes.Outcome | None = None
    # Who started the run ("" when nobody did, or it is gone).
    requester: str = ""
    # A decided ticket's message (masked; an edit's note, never its corrected arguments).
    message: str = ""
    # The run the facts were read from (None for an event without one): in_full() reads its
    # outcome or the ticket's message from it.
    run: Run | None = field(default=None, repr=False, compare=False)

    @property
    def not_approved(self) -> list[outcomes.Decision]:
        """The run's calls that did not go ahead as asked (rejected, edited, expired, ...)."""
        decisions = self.outcome.decisions if self.outcome is not None else []
        return [d for d in decisions if d.decision != "approved"]

    def payload(self, audit_event: AuditEvent) -> dict:
        payload = {
            # Stable across retries: receivers deduplicate on it.
            "id": f"{self.tenant_slug}:{audit_event.seq}",
            "event": self.event,
            "action": self.action,
            "tenant": self.tenant_slug,
            "ticket": self.ticket_id,
            "run": self.run_id,
            "run_title": self.run_title,
            "tool": self.tool,
            "arguments_digest": self.arguments_digest,
            "status": self.status,
            "actor": self.actor,
            "time": self.time.isoformat(),
            "url": self.link,
        }
        if self.outcome is not None:
            payload["decisions"] = [d.as_dict() for d in self.outcome.decisions]
            if self.event == Event.RUN_COMPLETED:
                payload["output"] = self.outcome.output
                payload["truncated"] = self.outcome.truncated
            else:
                payload["reason"] = self.outcome.reason
        return payload


# What facts_for reads of an event's run: for every event, and for a run's end as well.
_RUN_FIELDS = ("title", "requested_by__username", "tenant__slug", "tenant__name")
_END_FIELDS = ("status", "status_reason", "final_output")


def _runs(tenant_id: int, run_ids, *, ends: bool):
    return (
        Run.objects.select_related("tenant", "requested_by")
        .only(*_RUN_FIELDS, *(_END_FIELDS if ends else ()))
        .filter(pk__in=run_ids, tenant_id=tenant_id)
    )


def runs_named(tenant_id: int, audit_events: Iterable[AuditEvent]) -> dict[int, Run]:
    """The runs that the tenant's notifying events among audit_events name, by id, each read as
    facts_for reads it for them: with how it ended (status, reason, output) when one of them is
    a run's end. At most two queries (the runs with an end among the events, then the others),
    none when no such event names a run: a fan-out pass reads its events' runs once, as they are
    at its start, instead of once per event. A run that is gone, or of another tenant, is not
    in it."""
    ends: set[int] = set()
    others: set[int] = set()
    for audit_event in audit_events:
        if not audit_event.run_id or audit_event.tenant_id != tenant_id:
            continue
        event = event_for(audit_event)
        if event is not None:
            (ends if event in RUN_EVENTS else others).add(audit_event.run_id)
    runs: dict[int, Run] = {}
    for ids, with_end in ((ends, True), (others - ends, False)):
        if ids:
            runs.update((run.pk, run) for run in _runs(tenant_id, sorted(ids), ends=with_end))
    return runs


def facts_for(
    audit_event: AuditEvent,
    event: str,
    *,
    outline: bool = False,
    runs: Mapping[int, Run] | None = None,
) -> Facts:
    """What a notification of the event says.

    One query: the run with its tenant (most events name a run), else the tenant alone (none
    for the run when runs holds it); then the run's outcome (run.completed, run.failed: two
    queries) or the decided ticket's message (ticket.decided: two), unless outline, which
    leaves them out (outcome None, message ""): enough to know who is told (recipients_for).
    in_full() adds them to an outline.
    runs: the runs a fan-out pass read for its events (runs_named); the event's run is taken
    from it when it is there and of the event's tenant, else read here.
    """
    known = runs.get(audit_event.run_id) if runs is not None and audit_event.run_id else None
    run = None
    if known is not None and known.tenant_id == audit_event.tenant_id:
        run = known
    elif audit_event.run_id:
        run = _runs(audit_event.tenant_id, [audit_event.run_id], ends=event in RUN_EVENTS).first()
    tenant = (
        run.tenant if run else Tenant.objects.only("slug", "name").get(pk=audit_event.tenant_id)
    )
    facts = Facts(
        event=event,
        action=audit_event.action,
        tenant_slug=tenant.slug,
        tenant_name=tenant.name,
        ticket_id=audit_event.ticket_id,
        run_id=audit_event.run_id,
        run_title=run.title if run else "",
        tool=audit_event.tool_name,
        arguments_digest=audit_event.arguments_digest,
        status=audit_event.outcome,
        actor=audit_event.actor_name,
        actor_id=audit_event.actor_id,
        requester_id=run.requested_by_id if run else None,
        time=audit_event.created_at,
        link=link_for(ticket_id=audit_event.ticket_id, run_id=audit_event.run_id),
        group=str((audit_event.detail or {}).get("group", ""))
        if event == Event.TICKET_ESCALATED
        else "",
        requester=run.requested_by.get_username() if run and run.requested_by else "",
        run=run,
    )
    return facts if outline else in_full(facts)


def in_full(facts: Facts) -> Facts:
    """An outline of facts_for() with the run's outcome or the ticket's message read in."""
    run = facts.run
    if run is None:
        return facts
    if facts.event in RUN_EVENTS:
        return replace(facts, outcome=outcomes.outcome(run))
    if facts.event == Event.TICKET_DECIDED:
        return replace(facts, message=_message(run, facts.ticket_id))
    return facts


def _message(run: Run, ticket_id: int | None) -> str:
    """The decided ticket's message as the run's outcome tells it (one reading of edits)."""
    if ticket_id is None:
        return ""
    return next((d.message for d in outcomes.decisions(run, ticket_id=ticket_id)), "")
