"""How a run ended, as told outside the console: its final output (capped), the reason it
failed, and every decision on its calls.

The one reading of a finished run that webhooks and notification emails share, so they never
disagree. Free text (the output, reasons, approvers' messages) has secret-shaped values masked;
the arguments of a call are never part of it, and an edited call's message, which carries the
corrected arguments, is replaced by the approver's note.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from approvals.core.redaction import mask_secrets
from approvals.decisions.edit import NOTE_LEAD
from approvals.models import PreAuthorization, Run, Ticket, TicketStatus

# The most of a run's final output a notification carries (UTF-8 bytes).
OUTPUT_LIMIT = 16 * 1024


@dataclass(frozen=True)
class Decision:
    """One call of the run and what became of it."""

    ticket: int
    tool: str
    # approved, rejected, edited (rejected with corrected arguments, which the agent then
    # called again), expired or superseded.
    decision: str
    message: str
    # The people whose approvals counted (in the order they gave them).
    approvers: list[str]
    # Who decided: a username, "rule" or "expiry"; "" when nobody did.
    decided_by: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    status: str
    output: str
    truncated: bool
    reason: str
    decisions: list[Decision]


def capped(text: str, limit: int = OUTPUT_LIMIT) -> tuple[str, bool]:
    """text cut to at most limit UTF-8 bytes on a character boundary, and whether it was cut."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text, False
    return encoded[:limit].decode(errors="ignore"), True


def _note(message: str) -> str:
    """The approver's own note in an edit's message ("" when there is none)."""
    _, found, note = message.partition(NOTE_LEAD)
    return note.strip() if found else ""


def decisions(run: Run) -> list[Decision]:
    """Every decided call of the run, in the order the agent made them.

    Reads: the run's tickets with their decider and valid votes, and its pre-authorisations
    (which tell an edited call from a plain rejection); three queries.
    """
    edited = set(
        PreAuthorization.objects.filter(run=run).values_list("original_ticket_id", flat=True)
    )
    tickets = (
        Ticket.objects.filter(run=run)
        .exclude(status=TicketStatus.PENDING)
        .select_related("decided_by")
        .prefetch_related("votes__user")
        .order_by("pk")
    )
    found = []
    for ticket in tickets:
        decision = "edited" if ticket.pk in edited else ticket.status
        approvers = (
            [vote.user.get_username() for vote in ticket.votes.all() if vote.is_valid]
            if ticket.status == TicketStatus.APPROVED
            else []
        )
        decided_by = ticket.decision_source or (
            ticket.decided_by.get_username() if ticket.decided_by else ""
        )
        if ticket.status == TicketStatus.APPROVED and not approvers and ticket.decided_by:
            approvers = [ticket.decided_by.get_username()]
        message = (
            _note(ticket.decision_message) if decision == "edited" else ticket.decision_message
        )
        found.append(
            Decision(
                ticket=ticket.pk,
                tool=ticket.tool_name,
                decision=decision,
                message=mask_secrets(message),
                approvers=approvers,
                decided_by=decided_by,
            )
        )
    return found


def outcome(run: Run) -> Outcome:
    """How the run ended: its final output capped at OUTPUT_LIMIT, the reason it stopped (for
    a run that did not complete) and its decisions. Reads the tickets (see decisions)."""
    output, truncated = capped(mask_secrets(run.final_output))
    return Outcome(
        status=run.status,
        output=output,
        truncated=truncated,
        reason=mask_secrets(run.status_reason),
        decisions=decisions(run),
    )
