"""A ticket's discussion: comments kept as audit events, so they never change."""

from __future__ import annotations

from django.db import transaction

from approvals.audit import chain
from approvals.core.errors import DomainError
from approvals.core.redaction import mask_secrets
from approvals.decisions import decide
from approvals.decisions.errors import (
    NotAllowedError,
)
from approvals.live import hints
from approvals.models import (
    AuditEvent,
    Membership,
    Ticket,
)

MAX_COMMENT_CHARS = 2000


class CommentError(DomainError):
    pass


def may_comment(membership: Membership | None) -> bool:
    return membership is not None and membership.can_comment


def comment(ticket: Ticket, *, user, text: str) -> AuditEvent:
    """Add a comment to a ticket's discussion; it lives in the audit log, so it never changes.

    Anything in the text that looks like a secret is masked before it is stored. Side effects,
    in one transaction: audit event ticket.commented with detail {"text": ...}; after commit, a
    "ticket.changed" live hint. Raises TicketNotFoundError, NotAllowedError (viewers read but do
    not write) or CommentError (empty or too long), having written nothing.
    """
    membership = decide.ticket_membership(user, ticket)
    if not may_comment(membership):
        raise NotAllowedError(f"the {membership.role} role can read comments, not write")
    text = (text or "").strip()
    if not text:
        raise CommentError("write something first")
    if len(text) > MAX_COMMENT_CHARS:
        raise CommentError(f"the comment is {len(text)} characters; at most {MAX_COMMENT_CHARS}")
    with transaction.atomic():
        event = chain.append_for_ticket(
            ticket,
            action="ticket.commented",
            actor=user,
            detail={"text": mask_secrets(text)},
        )
        hints.notify_on_commit(
            ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=ticket.run_id
        )
    return event


def comments(ticket: Ticket) -> list[AuditEvent]:
    """The ticket's comments, oldest first."""
    return list(
        AuditEvent.objects.filter(
            tenant_id=ticket.tenant_id, ticket_id=ticket.pk, action="ticket.commented"
        ).order_by("seq")
    )
