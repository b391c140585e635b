"""Which audit actions notify, and as which event. Everything else (votes, claims, comments,
and the notifications' own webhook.* and email.* events) notifies no one."""

from __future__ import annotations

from approvals.models import AuditEvent
from notifications.models import Event

ACTIONS: dict[str, str] = {
    "ticket.created": Event.TICKET_CREATED,
    "ticket.approved": Event.TICKET_DECIDED,
    "ticket.rejected": Event.TICKET_DECIDED,
    "ticket.auto_approved": Event.TICKET_DECIDED,
    "ticket.auto_rejected": Event.TICKET_DECIDED,
    "ticket.preauthorised": Event.TICKET_DECIDED,
    "ticket.edited": Event.TICKET_DECIDED,
    "ticket.expired": Event.TICKET_EXPIRED,
    "ticket.escalated": Event.TICKET_ESCALATED,
    "run.completed": Event.RUN_COMPLETED,
    "run.failed": Event.RUN_FAILED,
    "run.expired": Event.RUN_FAILED,
    "run.in_doubt": Event.RUN_FAILED,
}


def event_for(audit_event: AuditEvent) -> str | None:
    """The notification event an audit event stands for, or None."""
    detail = audit_event.detail if isinstance(audit_event.detail, dict) else {}
    # An expiry that rejects (policies) is a ticket.rejected written by the expiry.
    if audit_event.action == "ticket.rejected" and detail.get("by") == "expiry":
        return Event.TICKET_EXPIRED
    return ACTIONS.get(audit_event.action)
