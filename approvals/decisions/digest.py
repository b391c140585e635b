"""The digest gate: the call in the run's stored state, recomputed, is the call the ticket shows.

The ticket page shows its result, and decide() refuses an approval without it: the page, the
batch, `manage.py decide` and any later API share this one check. The worker checks the same
digest again before it runs anything (runs.resume).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from approvals.core import crypto, presenters
from approvals.core.canonical import arguments_digest, canonical_arguments
from approvals.decisions.errors import DigestMismatchError
from approvals.execution import state
from approvals.models import Run, Ticket


def read_state(run: Run) -> tuple[dict | None, str]:
    """The run's stored state as JSON, or None and why it cannot be read."""
    try:
        return state.open_state(run), ""
    except crypto.CryptoError as error:
        return None, str(error)
    except ValueError:
        return None, "the stored state is not valid JSON"


def stored_call_arguments(state_json: dict, call_id: str) -> str | None:
    """The raw argument string of the pending call with this id, as the worker will run it."""
    for item in state_json.get("generated_items") or []:
        if item.get("type") == "tool_approval_item":
            raw = item.get("raw_item") or {}
            if raw.get("call_id") == call_id:
                return raw.get("arguments")
    return None


@dataclass(frozen=True)
class DigestCheck:
    ok: bool
    digest: str
    stored_digest: str = ""
    problem: str = ""
    differences: list[presenters.Change] = field(default_factory=list)


def check_digest(ticket, state_json: dict | None, problem: str = "") -> DigestCheck:
    """Recompute the ticket's digest from the stored state, as the worker will."""
    if state_json is None:
        return DigestCheck(
            False, "", ticket.arguments_digest, problem or "the stored state cannot be read"
        )
    raw = stored_call_arguments(state_json, ticket.tool_call_id)
    if raw is None:
        return DigestCheck(
            False,
            "",
            ticket.arguments_digest,
            "the stored state has no pending call for this ticket",
        )
    digest = arguments_digest(raw)
    if digest == ticket.arguments_digest:
        return DigestCheck(True, digest, ticket.arguments_digest)
    return DigestCheck(
        False,
        digest,
        ticket.arguments_digest,
        "the arguments in the stored state differ from those recorded on the ticket",
        presenters.diff(json.loads(ticket.arguments_json), json.loads(canonical_arguments(raw))),
    )


def verify(ticket: Ticket) -> DigestCheck:
    """Open the ticket's run state and check the ticket's call against it."""
    state_json, problem = read_state(ticket.run)
    return check_digest(ticket, state_json, problem)


def require_verified(ticket: Ticket) -> None:
    """Raises DigestMismatchError unless the stored call is exactly the one the ticket shows."""
    check = verify(ticket)
    if not check.ok:
        raise DigestMismatchError(f"not approved: {check.problem}")
