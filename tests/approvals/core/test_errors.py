"""Domain errors carry their HTTP status and their sentence, so every entry point answers alike."""

from __future__ import annotations

import pytest
from django.http import Http404

from approvals.core.errors import ConflictError, DomainError, ForbiddenError, NotFoundError
from approvals.decisions.errors import (
    AlreadyVotedError,
    DigestMismatchError,
    InvalidDecisionError,
    NotAllowedError,
    SelfApprovalError,
    TicketExpiredError,
    TicketNotFoundError,
    ToolUnavailableError,
)
from approvals.views.errors import explain


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (TicketNotFoundError("no such ticket"), 404),
        (NotAllowedError("the viewer role cannot decide tickets"), 403),
        (SelfApprovalError("you requested this call"), 403),
        (TicketExpiredError("this ticket expired"), 409),
        (AlreadyVotedError("you already approved this ticket"), 409),
        (DigestMismatchError("not approved: the arguments differ"), 409),
        (ToolUnavailableError("the tool is not deployed"), 409),
        (InvalidDecisionError("the message is too long"), 400),
        (DomainError("refused"), 400),
    ],
)
def test_domain_errors_carry_their_http_status(error, status):
    assert error.status == status


def test_sentence_capitalises_the_first_letter_and_ends_with_one_full_stop():
    assert NotAllowedError("the viewer role cannot decide tickets").sentence() == (
        "The viewer role cannot decide tickets."
    )
    assert ConflictError("Claimed by ann since 10:00 UTC.").sentence() == (
        "Claimed by ann since 10:00 UTC."
    )
    # Only the first letter changes: names keep their case.
    assert ForbiddenError("deploy_release needs Release Managers").sentence() == (
        "Deploy_release needs Release Managers."
    )


def test_explain_gives_a_page_the_sentence_and_the_status():
    assert explain(SelfApprovalError("you requested this call")) == (
        "You requested this call.",
        403,
    )


def test_explain_raises_404_for_an_object_the_user_cannot_see():
    with pytest.raises(Http404):
        explain(NotFoundError("no such ticket"))
