"""Claims: one person says "I'm on it" for a pending ticket."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals.audit import chain
from approvals.core.errors import ConflictError
from approvals.decisions import decide
from approvals.decisions.errors import (
    NotAllowedError,
)
from approvals.live import hints
from approvals.models import (
    CLAIM_LAPSE,
    Ticket,
    TicketStatus,
)


class ClaimConflictError(ConflictError):
    def __init__(self, ticket: Ticket) -> None:
        who = ticket.claimed_by.get_username() if ticket.claimed_by else "someone"
        super().__init__(f"Claimed by {who} since {ticket.claimed_at:%Y-%m-%d %H:%M:%S} UTC.")
        self.ticket = ticket


class NotClaimableError(ConflictError):
    pass


def claim(ticket: Ticket, *, user, take_over: bool = False) -> Ticket:
    """Say "I'm on it" for a pending ticket, or renew one's own claim.

    One claim at a time: a live claim of someone else is refused with who and since when,
    unless take_over is set (recorded in the audit detail); a claim older than CLAIM_LAPSE is
    free to take. Side effects, in one transaction: the ticket's claimed_by/claimed_at; audit
    event ticket.claimed (not for a renewal); after commit, a "ticket.changed" live hint.
    Raises TicketNotFoundError, NotAllowedError, NotClaimableError or ClaimConflictError,
    having written nothing.
    """
    membership = decide.ticket_membership(user, ticket)
    if not membership.can_decide:
        raise NotAllowedError(f"the {membership.role} role cannot claim tickets")
    with transaction.atomic():
        now = timezone.now()
        open_tickets = Ticket.objects.filter(
            pk=ticket.pk, status=TicketStatus.PENDING, expires_at__gt=now
        )
        # Locked alone: PostgreSQL cannot lock the nullable side of a join (claimed_by).
        before = open_tickets.select_for_update().first()
        if before is None:
            current = Ticket.objects.get(pk=ticket.pk)
            state = "expired" if current.is_pending else current.status
            raise NotClaimableError(f"this ticket is {state}, so there is nothing to claim")
        previous = before.active_claimant
        renewal = previous is not None and previous.pk == user.pk
        free = (
            Q(claimed_by__isnull=True) | Q(claimed_by=user) | Q(claimed_at__lte=now - CLAIM_LAPSE)
        )
        # The condition is the compare-and-set: of two people claiming at once, one wins.
        won = (open_tickets if take_over else open_tickets.filter(free)).update(
            claimed_by=user, claimed_at=now
        )
        if not won:
            current = Ticket.objects.select_related("claimed_by").get(pk=ticket.pk)
            if current.claim_is_active:
                raise ClaimConflictError(current)
            raise NotClaimableError("this ticket changed while you claimed it; try again")
        if not renewal:
            took_over = previous.get_username() if previous is not None else ""
            chain.append_for_ticket(
                ticket,
                action="ticket.claimed",
                actor=user,
                detail={"took_over_from": took_over} if took_over else {},
            )
            hints.notify_on_commit(
                ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=ticket.run_id
            )
    ticket.refresh_from_db()
    return ticket


def release(ticket: Ticket, *, user) -> Ticket:
    """Give up one's own claim on a ticket.

    Side effects, in one transaction: the claim is cleared; audit event ticket.released; after
    commit, a "ticket.changed" live hint. Raises TicketNotFoundError or NotClaimableError (the
    user holds no claim on it), having written nothing.
    """
    decide.ticket_membership(user, ticket)
    with transaction.atomic():
        won = Ticket.objects.filter(pk=ticket.pk, claimed_by=user).update(
            claimed_by=None, claimed_at=None
        )
        if not won:
            raise NotClaimableError("you are not on this ticket, so there is nothing to release")
        chain.append_for_ticket(
            ticket,
            action="ticket.released",
            actor=user,
        )
        hints.notify_on_commit(
            ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=ticket.run_id
        )
    ticket.refresh_from_db()
    return ticket
