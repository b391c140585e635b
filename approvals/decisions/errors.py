"""Why a decision was refused. Each carries its HTTP status and its sentence (core.errors), so the
ticket page, the batch, `manage.py decide` and any later API answer the same."""

from __future__ import annotations

from approvals.core.errors import ConflictError, DomainError, ForbiddenError, NotFoundError
from approvals.models import Ticket


class DecisionError(DomainError):
    """A decision was refused; nothing was written."""


class TicketNotFoundError(DecisionError, NotFoundError):
    pass


class NotAllowedError(DecisionError, ForbiddenError):
    pass


class SelfApprovalError(DecisionError, ForbiddenError):
    pass


class TwoFactorRequiredError(DecisionError, ForbiddenError):
    """The tenant asks its deciders for a second factor (Tenant.deciders_need_two_factor) and
    this one has none yet."""


class TicketExpiredError(DecisionError, ConflictError):
    pass


class AlreadyVotedError(DecisionError, ConflictError):
    """The same person approved this ticket already; a quorum needs distinct people."""


class AlreadyDecidedError(DecisionError, ConflictError):
    def __init__(self, ticket: Ticket) -> None:
        who = ticket.decided_by.get_username() if ticket.decided_by else "someone"
        when = f"{ticket.decided_at:%Y-%m-%d %H:%M:%S} UTC" if ticket.decided_at else "earlier"
        super().__init__(f"Already {ticket.status} by {who} at {when}.")
        self.ticket = ticket


class DigestMismatchError(DecisionError, ConflictError):
    """The call in the stored state is not the call the ticket shows: approving it would run
    something nobody saw."""


class FlaggedCallError(DecisionError, ConflictError):
    """A call with invisible or look-alike characters, approved where its flags were not shown."""


class InvalidDecisionError(DecisionError):
    pass


class ToolUnavailableError(InvalidDecisionError, ConflictError):
    """The run's agent version, as deployed here, lacks the tool: its schema cannot be read."""


class InvalidArgumentsError(InvalidDecisionError):
    """Edited arguments that do not fit the tool's JSON schema."""

    def __init__(self, problems: list) -> None:
        super().__init__(
            "the edited arguments do not fit the tool's schema: "
            + "; ".join(f"{p.argument}: {p.message}" if p.argument else p.message for p in problems)
        )
        self.problems = problems


class StepUpRequiredError(DecisionError, ForbiddenError):
    """The ticket's policy wants a second factor proven within the last `minutes` of the
    approver's session: only the ticket page, after asking for it, can approve."""

    def __init__(self, minutes: int, *, stale: bool = False) -> None:
        super().__init__(
            f"this approval needs a second factor confirmed within the last {minutes} "
            f"minute{'s' if minutes != 1 else ''}, which a batch or an API token cannot give: "
            "approve it from its ticket page"
        )
        self.minutes = minutes
        self.stale = stale
