"""How a run ended, as told outside the console: its final output (capped), the reason it
failed, and every decision on its calls.

The one reading of a finished run that webhooks and notification emails share, so they never
disagree. Free text (the output, reasons, approvers' messages) has secret-shaped values masked;
the arguments of a call are never part of it, and an edited call's message, which carries the
corrected arguments, is replaced by the approver's note.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef

from approvals.core.redaction import mask_secrets
from approvals.decisions.edit import NOTE_LEAD
from approvals.models import PreAuthorization, Run, Ticket, TicketStatus, TicketVote

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


def decisions(run: Run, *, ticket_id: int | None = None) -> list[Decision]:
    """Every decided call of the run, in the order the agent made them; with ticket_id, only
    that ticket's (none when it is not a decided ticket of the run).

    Reads two queries of plain values, whatever the number of tickets and votes: the run's
    decided tickets with their decider and whether an edit (a pre-authorisation) came of each,
    then the valid votes on its approved tickets with their voters. The notifications pool
    tells this for every finished run and decided ticket, so model instances and a prefetch
    (four queries) cost the worker more than the rest of the fan-out.
    """
    username = get_user_model().USERNAME_FIELD
    chosen = Ticket.objects.filter(run=run)
    if ticket_id is not None:
        chosen = chosen.filter(pk=ticket_id)
    tickets = list(
        chosen.exclude(status=TicketStatus.PENDING)
        .annotate(edited=Exists(PreAuthorization.objects.filter(original_ticket=OuterRef("pk"))))
        .order_by("pk")
        .values_list(
            "pk",
            "tool_name",
            "status",
            "decision_source",
            "decision_message",
            f"decided_by__{username}",
            "edited",
        )
    )
    approved = [pk for pk, _, status, *_ in tickets if status == TicketStatus.APPROVED]
    voters: dict[int, list[str]] = defaultdict(list)
    if approved:
        votes = (
            TicketVote.objects.filter(ticket_id__in=approved, invalidated_at__isnull=True)
            .order_by("created_at", "pk")
            .values_list("ticket_id", f"user__{username}")
        )
        for voted, voter in votes:
            voters[voted].append(voter)
    found = []
    for pk, tool, status, source, message, decider, edited in tickets:
        decision = "edited" if edited else status
        approvers = voters.get(pk, []) if status == TicketStatus.APPROVED else []
        if status == TicketStatus.APPROVED and not approvers and decider is not None:
            approvers = [decider]
        found.append(
            Decision(
                ticket=pk,
                tool=tool,
                decision=decision,
                message=mask_secrets(_note(message) if edited else message),
                approvers=approvers,
                decided_by=source or decider or "",
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
