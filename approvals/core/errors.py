"""Domain errors: a refusal that the console explains, having written nothing.

Each error carries what every entry point needs: `status`, the HTTP status a page or the API
answers with, and `sentence()`, the explanation a person reads. A view maps them in one place
(approvals.views.errors), a command prints the sentence and exits non-zero, and a batch reports
it per item: the same refusal reads the same everywhere.
"""

from __future__ import annotations


class DomainError(Exception):
    """A request the console refuses; nothing was written."""

    status = 400

    def sentence(self) -> str:
        """The message as a sentence: a capital first letter and one full stop."""
        text = str(self)
        return (text[:1].upper() + text[1:]).rstrip(".") + "."


class NotFoundError(DomainError):
    """The object does not exist for this user (another tenant's answers the same)."""

    status = 404


class ForbiddenError(DomainError):
    """The user may see the object but not do this to it."""

    status = 403


class ConflictError(DomainError):
    """The object's state does not allow it now (decided, expired, claimed by someone else)."""

    status = 409
