"""Batch decisions from the queue: each ticket is its own decide(), reported per ticket."""

from __future__ import annotations

from dataclasses import dataclass

from approvals.core.errors import DomainError
from approvals.decisions import decide
from approvals.decisions.errors import (
    AlreadyDecidedError,
    DecisionError,
)
from approvals.models import (
    Membership,
    Ticket,
)

MAX_BATCH = 100


class BatchError(DomainError):
    pass


@dataclass(frozen=True)
class BatchOutcome:
    ticket: Ticket
    done: bool
    # approved or rejected when done; otherwise why not, in a sentence.
    result: str


def decide_batch(
    ticket_ids: list[int], *, user, approve: bool, message: str = ""
) -> list[BatchOutcome]:
    """Approve or reject several tickets of one tool, each with its own decide.decide().

    The batch is refused whole (BatchError, nothing written) when it is empty, longer than
    MAX_BATCH, names a ticket the user cannot see, mixes tools or carries too long a message.
    Otherwise each ticket is decided on its own: side effects are those of decide.decide()
    for each ticket that was decided; a ticket that cannot be decided (already decided,
    expired, self-approval, not allowed, digest mismatch) is reported and left as it was.
    """
    ids = list(dict.fromkeys(ticket_ids))
    if not ids:
        raise BatchError("select at least one ticket")
    if len(ids) > MAX_BATCH:
        raise BatchError(f"a batch holds at most {MAX_BATCH} tickets; {len(ids)} were selected")
    message = (message or "").strip()
    if len(message) > decide.MAX_MESSAGE_CHARS:
        raise BatchError(
            f"the message is {len(message)} characters; at most {decide.MAX_MESSAGE_CHARS}"
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
    for pk in ids:
        ticket = tickets[pk]
        try:
            decided = decide.decide(ticket, user=user, approve=approve, message=message)
        except AlreadyDecidedError as error:
            # Decided meanwhile: reported with who decided it and when.
            outcomes.append(BatchOutcome(error.ticket, False, error.sentence()))
        except DecisionError as error:
            outcomes.append(BatchOutcome(ticket, False, error.sentence()))
        else:
            if decided.is_pending:
                # An approval that counts towards a quorum: recorded, but not decided yet.
                progress = decide.progress_of(decided)
                outcomes.append(
                    BatchOutcome(decided, False, f"Approval recorded, {progress.describe()}.")
                )
            else:
                outcomes.append(BatchOutcome(decided, True, decided.status))
    return outcomes
