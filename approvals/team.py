"""Working as a team on tickets: claims ("I'm on it"), comments, and batch decisions.

Services in the manner of services.py: keyword-only, each owns its transaction, writes its audit
event inside it and sends a live hint ("ticket.changed") on commit. A batch decision is not a
new kind of decision: it is services.decide() once per ticket, each with its own
compare-and-set, audit event and run hand-off.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals import audit, live, policies, services
from approvals.core import crypto, presenters
from approvals.core.redaction import mask_secrets
from approvals.models import CLAIM_LAPSE, AuditEvent, Membership, Role, Ticket, TicketStatus

MAX_COMMENT_CHARS = 2000
MAX_BATCH = 100
# Viewers read a ticket's discussion; everyone else in the tenant may take part in it.
COMMENTING_ROLES = frozenset({Role.APPROVER, Role.AUDITOR, Role.ADMIN})


class TeamError(Exception):
    """A claim, release, comment or batch was refused; nothing was written."""


class ClaimConflictError(TeamError):
    def __init__(self, ticket: Ticket) -> None:
        who = ticket.claimed_by.get_username() if ticket.claimed_by else "someone"
        super().__init__(f"Claimed by {who} since {ticket.claimed_at:%Y-%m-%d %H:%M:%S} UTC.")
        self.ticket = ticket


class NotClaimableError(TeamError):
    pass


class CommentError(TeamError):
    pass


class BatchError(TeamError):
    pass


def _membership(user, ticket: Ticket) -> Membership:
    membership = services.membership_for(user, ticket.tenant_id)
    if membership is None:
        raise services.TicketNotFoundError("no such ticket")
    return membership


def _hint(ticket: Ticket) -> None:
    live.notify_on_commit(ticket.tenant_id, "ticket.changed", ticket=ticket.pk, run=ticket.run_id)


# --- claims -----------------------------------------------------------------------------------


def claim(ticket: Ticket, *, user, take_over: bool = False) -> Ticket:
    """Say "I'm on it" for a pending ticket, or renew one's own claim.

    One claim at a time: a live claim of someone else is refused with who and since when,
    unless take_over is set (recorded in the audit detail); a claim older than CLAIM_LAPSE is
    free to take. Side effects, in one transaction: the ticket's claimed_by/claimed_at; audit
    event ticket.claimed (not for a renewal); after commit, a "ticket.changed" live hint.
    Raises TicketNotFoundError, NotAllowedError, NotClaimableError or ClaimConflictError,
    having written nothing.
    """
    membership = _membership(user, ticket)
    if not membership.can_decide:
        raise services.NotAllowedError(f"the {membership.role} role cannot claim tickets")
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
            audit.append_for_ticket(
                ticket,
                action="ticket.claimed",
                actor=user,
                detail={"took_over_from": took_over} if took_over else {},
            )
            _hint(ticket)
    ticket.refresh_from_db()
    return ticket


def release(ticket: Ticket, *, user) -> Ticket:
    """Give up one's own claim on a ticket.

    Side effects, in one transaction: the claim is cleared; audit event ticket.released; after
    commit, a "ticket.changed" live hint. Raises TicketNotFoundError or NotClaimableError (the
    user holds no claim on it), having written nothing.
    """
    _membership(user, ticket)
    with transaction.atomic():
        won = Ticket.objects.filter(pk=ticket.pk, claimed_by=user).update(
            claimed_by=None, claimed_at=None
        )
        if not won:
            raise NotClaimableError("you are not on this ticket, so there is nothing to release")
        audit.append_for_ticket(
            ticket,
            action="ticket.released",
            actor=user,
        )
        _hint(ticket)
    ticket.refresh_from_db()
    return ticket


# --- comments ---------------------------------------------------------------------------------


def may_comment(membership: Membership | None) -> bool:
    return membership is not None and membership.role in COMMENTING_ROLES


def comment(ticket: Ticket, *, user, text: str) -> AuditEvent:
    """Add a comment to a ticket's discussion; it lives in the audit log, so it never changes.

    Anything in the text that looks like a secret is masked before it is stored. Side effects,
    in one transaction: audit event ticket.commented with detail {"text": ...}; after commit, a
    "ticket.changed" live hint. Raises TicketNotFoundError, NotAllowedError (viewers read but do
    not write) or CommentError (empty or too long), having written nothing.
    """
    membership = _membership(user, ticket)
    if not may_comment(membership):
        raise services.NotAllowedError(f"the {membership.role} role can read comments, not write")
    text = (text or "").strip()
    if not text:
        raise CommentError("write something first")
    if len(text) > MAX_COMMENT_CHARS:
        raise CommentError(f"the comment is {len(text)} characters; at most {MAX_COMMENT_CHARS}")
    with transaction.atomic():
        event = audit.append_for_ticket(
            ticket,
            action="ticket.commented",
            actor=user,
            detail={"text": mask_secrets(text)},
        )
        _hint(ticket)
    return event


def comments(ticket: Ticket) -> list[AuditEvent]:
    """The ticket's comments, oldest first."""
    return list(
        AuditEvent.objects.filter(
            tenant_id=ticket.tenant_id, ticket_id=ticket.pk, action="ticket.commented"
        ).order_by("seq")
    )


# --- batch decisions --------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchOutcome:
    ticket: Ticket
    done: bool
    # approved or rejected when done; otherwise why not, in a sentence.
    result: str


def _digest_problem(ticket: Ticket, states: dict[int, tuple[dict | None, str]]) -> str:
    """Why approving this ticket would run something other than what was shown, or ""."""
    if ticket.run_id not in states:
        try:
            states[ticket.run_id] = (services.open_state(ticket.run), "")
        except crypto.CryptoError as error:
            states[ticket.run_id] = (None, str(error))
        except ValueError:
            states[ticket.run_id] = (None, "the stored state is not valid JSON")
    state_json, problem = states[ticket.run_id]
    check = presenters.check_digest(ticket, state_json, problem)
    return "" if check.ok else check.problem


def _sentence(text: str) -> str:
    return (text[:1].upper() + text[1:]).rstrip(".") + "."


def decide_batch(
    ticket_ids: list[int], *, user, approve: bool, message: str = ""
) -> list[BatchOutcome]:
    """Approve or reject several tickets of one tool, each with its own services.decide().

    The batch is refused whole (BatchError, nothing written) when it is empty, longer than
    MAX_BATCH, names a ticket the user cannot see, mixes tools or carries too long a message.
    Otherwise each ticket is decided on its own: side effects are those of services.decide()
    for each ticket that was decided; a ticket that cannot be decided (already decided,
    expired, self-approval, not allowed, digest mismatch) is reported and left as it was.
    """
    ids = list(dict.fromkeys(ticket_ids))
    if not ids:
        raise BatchError("select at least one ticket")
    if len(ids) > MAX_BATCH:
        raise BatchError(f"a batch holds at most {MAX_BATCH} tickets; {len(ids)} were selected")
    message = (message or "").strip()
    if len(message) > services.MAX_MESSAGE_CHARS:
        raise BatchError(
            f"the message is {len(message)} characters; at most {services.MAX_MESSAGE_CHARS}"
        )
    tenant_ids = Membership.objects.filter(user=user).values_list("tenant_id", flat=True)
    found = Ticket.objects.filter(pk__in=ids, tenant_id__in=tenant_ids).select_related("run")
    tickets = {t.pk: t for t in found}
    missing = [pk for pk in ids if pk not in tickets]
    if missing:
        raise BatchError("no such ticket: " + ", ".join(f"#{pk}" for pk in missing))
    tools = sorted({t.tool_name for t in tickets.values()})
    if len(tools) > 1:
        raise BatchError("a batch holds tickets of one tool; this one mixes " + " and ".join(tools))
    outcomes = []
    states: dict[int, tuple[dict | None, str]] = {}
    for pk in ids:
        ticket = tickets[pk]
        # The digest is checked as on the ticket page: what is approved is what will run.
        problem = _digest_problem(ticket, states) if approve and ticket.is_pending else ""
        still_pending = Ticket.objects.filter(pk=pk, status=TicketStatus.PENDING).exists()
        # A ticket decided meanwhile is reported by decide(), with who decided it.
        if problem and still_pending:
            outcomes.append(BatchOutcome(ticket, False, _sentence(f"not approved: {problem}")))
            continue
        try:
            decided = services.decide(ticket, user=user, approve=approve, message=message)
        except services.AlreadyDecidedError as error:
            outcomes.append(BatchOutcome(error.ticket, False, str(error)))
        except services.DecisionError as error:
            outcomes.append(BatchOutcome(ticket, False, _sentence(str(error))))
        else:
            if decided.is_pending:
                # An approval that counts towards a quorum: recorded, but not decided yet.
                policy = policies.policy_of(decided)
                votes = list(decided.votes.select_related("user"))
                progress = policies.progress(decided, policy, votes)
                outcomes.append(
                    BatchOutcome(
                        decided, False, _sentence(f"approval recorded, {progress.describe()}")
                    )
                )
            else:
                outcomes.append(BatchOutcome(decided, True, decided.status))
    return outcomes
