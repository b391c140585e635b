"""Which audit actions notify, as which event (the table in approvals.audit.actions), and what a
notification says (Facts).

Everything else (votes, claims, comments, and the notifications' own webhook.* and email.*
events) notifies no one. Facts are read once per audit event and feed both the webhook payload
and the email; they carry ids, the tool name, the arguments digest, the status, the actor and a
link, never argument values.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.urls import reverse

from approvals.audit import actions
from approvals.models import AuditEvent, Run, Tenant
from notifications.models import Event


def event_for(audit_event: AuditEvent) -> str | None:
    """The notification event an audit event stands for, or None."""
    detail = audit_event.detail if isinstance(audit_event.detail, dict) else {}
    # An expiry that rejects (policies) is a ticket.rejected written by the expiry.
    if audit_event.action == "ticket.rejected" and detail.get("by") == "expiry":
        return Event.TICKET_EXPIRED
    action = actions.ACTIONS.get(audit_event.action)
    return action.notify if action is not None and action.notify else None


def link_for(*, ticket_id: int | None, run_id: int | None) -> str:
    base = settings.APPROVALS_PUBLIC_URL.rstrip("/")
    if ticket_id:
        return base + reverse("approvals:ticket", args=[ticket_id])
    if run_id:
        return base + reverse("approvals:run", args=[run_id])
    return base + reverse("approvals:queue")


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

    def payload(self, audit_event: AuditEvent) -> dict:
        return {
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


def facts_for(audit_event: AuditEvent, event: str) -> Facts:
    # One query: the run with its tenant (most events name a run), else the tenant alone.
    run = (
        Run.objects.select_related("tenant")
        .only("title", "requested_by_id", "tenant__slug", "tenant__name")
        .filter(pk=audit_event.run_id, tenant_id=audit_event.tenant_id)
        .first()
        if audit_event.run_id
        else None
    )
    tenant = (
        run.tenant if run else Tenant.objects.only("slug", "name").get(pk=audit_event.tenant_id)
    )
    return Facts(
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
    )
