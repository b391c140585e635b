"""Pre-authorisations: when the model calls again with exactly the arguments an approver edited
(decisions.edit), the new ticket counts as that approver's approval, once.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import Any

from approvals import transitions
from approvals.audit import chain
from approvals.core import presenters
from approvals.core.redaction import is_secret_key
from approvals.live import hints
from approvals.models import (
    Membership,
    PreAuthorization,
    Run,
    Ticket,
    TicketStatus,
)


def changes(before: Any, after: Any) -> list[dict[str, str]]:
    """presenters.diff as plain data for an audit event, values of secret-named fields hidden."""
    rows = []
    for change in presenters.diff(before, after):
        row = asdict(change)
        leaf = re.split(r"[.\[]", change.path)[-1].rstrip("]").strip('"')
        if is_secret_key(leaf):
            row["before"] = "[redacted]" if row["before"] else ""
            row["after"] = "[redacted]" if row["after"] else ""
        rows.append(row)
    return rows


def candidate(run: Run, ticket: Ticket, *, now) -> PreAuthorization | None:
    """The unused, unexpired pre-authorisation of the same run, tool and argument digest whose
    author may still decide in the tenant and did not request the call; None when there is none.
    """
    candidates = PreAuthorization.objects.filter(
        run_id=run.pk,
        tool_name=ticket.tool_name,
        arguments_digest=ticket.arguments_digest,
        used_by__isnull=True,
        expires_at__gt=now,
    ).select_related("created_by", "original_ticket")
    for pre in candidates.order_by("pk"):
        author = pre.created_by
        if author is None or not author.is_active or ticket.is_requested_by(author):
            continue
        membership = Membership.objects.filter(user=author, tenant_id=run.tenant_id).first()
        if membership is None or not membership.can_decide:
            continue
        return pre
    return None


def use(pre: PreAuthorization, ticket: Ticket, *, now) -> bool:
    """Spend the pre-authorisation on this ticket: once only (a compare-and-set on used_by)."""
    if not PreAuthorization.objects.filter(pk=pre.pk, used_by__isnull=True).update(
        used_by=ticket, used_at=now
    ):
        return False
    pre.used_by = ticket
    pre.used_at = now
    return True


def _audit_detail(pre: PreAuthorization) -> dict:
    return {
        "preauthorised_by": pre.created_by.get_username(),
        "original_ticket": pre.original_ticket_id,
        "changes": changes(
            json.loads(pre.original_ticket.arguments_json), json.loads(pre.arguments_json)
        ),
    }


def approve(run: Run, ticket: Ticket, pre: PreAuthorization, *, now, detail=None) -> None:
    """Approve the just-created ticket in the author's name; inside the creating transaction.

    Side effects: the ticket approved; audit event ticket.preauthorised; after commit, a live
    hint. Queueing the run, when nothing is left pending, is the caller's.
    """
    author = pre.created_by
    message = (
        f"Pre-authorised by {author.get_username()}: edited from ticket #{pre.original_ticket_id}."
    )
    won = transitions.move_tickets(
        Ticket.objects.filter(pk=ticket.pk, expires_at__gt=now),
        to=TicketStatus.APPROVED,
        decided_by=author,
        decided_at=now,
        decision_message=message,
    )
    if not won:
        raise RuntimeError(f"ticket {ticket.pk} was decided while it was being created")
    ticket.status = TicketStatus.APPROVED
    ticket.decided_by = author
    ticket.decided_at = now
    ticket.decision_message = message
    chain.append_for_ticket(
        ticket,
        action="ticket.preauthorised",
        actor=author,
        outcome=TicketStatus.APPROVED,
        detail={**_audit_detail(pre), **(detail or {})},
    )
    hints.notify_on_commit(
        run.tenant_id, "ticket.decided", ticket=ticket.pk, run=run.pk, status=TicketStatus.APPROVED
    )


def count_as_vote(run: Run, ticket: Ticket, pre: PreAuthorization, *, progress: str) -> None:
    """The pre-authorisation gave the author's approval, but the ticket's policy needs more
    people: the ticket stays pending with that vote. Audit event ticket.vote (outcome pending,
    the detail naming the pre-authorisation) and a live hint."""
    chain.append_for_ticket(
        ticket,
        action="ticket.vote",
        actor=pre.created_by,
        outcome=TicketStatus.PENDING,
        detail={**_audit_detail(pre), "progress": progress},
    )
    hints.notify_on_commit(run.tenant_id, "ticket.changed", ticket=ticket.pk, run=run.pk)
