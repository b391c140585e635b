"""The digest gate: the call in the run's stored state, recomputed, is the call the ticket shows.

The ticket page shows its result, and decide() refuses an approval without it: the page, the
batch, `manage.py decide` and any later API share this one check. The worker checks the same
digest again before it runs anything (runs.resume).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from approvals.core import crypto, presenters
from approvals.core.canonical import arguments_digest, canonical_arguments, sha256_hex
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


def stored_call(state_json: dict, call_id: str) -> tuple[str | None, set[str]] | None:
    """The raw argument string of the pending call with this id, as the worker will run it, and
    the names the state gives its tool; None when the state has no such pending call."""
    for item in state_json.get("generated_items") or []:
        if item.get("type") == "tool_approval_item":
            raw = item.get("raw_item") or {}
            if raw.get("call_id") == call_id:
                names = {str(n) for n in (raw.get("name"), item.get("tool_name")) if n}
                if item.get("tool_namespace") and item.get("tool_name"):
                    names.add(f"{item['tool_namespace']}.{item['tool_name']}")
                return raw.get("arguments"), names
    return None


def stored_call_arguments(state_json: dict, call_id: str) -> str | None:
    """The raw argument string of the pending call with this id, as the worker will run it."""
    found = stored_call(state_json, call_id)
    return found[0] if found else None


@dataclass(frozen=True)
class DigestCheck:
    ok: bool
    digest: str
    stored_digest: str = ""
    problem: str = ""
    differences: list[presenters.Change] = field(default_factory=list)
    # The call as the stored state holds it (canonical JSON), when the state could be read: the
    # page shows this, not the ticket's copy, so what is shown is what the digest covers.
    arguments_json: str = ""


def check_digest(ticket, state_json: dict | None, problem: str = "") -> DigestCheck:
    """Recompute the ticket's digest from the stored state, as the worker will."""
    if state_json is None:
        return DigestCheck(
            False, "", ticket.arguments_digest, problem or "the stored state cannot be read"
        )
    found = stored_call(state_json, ticket.tool_call_id)
    if found is None:
        return DigestCheck(
            False,
            "",
            ticket.arguments_digest,
            "the stored state has no pending call for this ticket",
        )
    raw, names = found
    digest = arguments_digest(raw)
    stored = canonical_arguments(raw)
    if ticket.tool_name not in names:
        return DigestCheck(
            False,
            digest,
            ticket.arguments_digest,
            f"the stored state calls {', '.join(sorted(names)) or 'no tool'}, not "
            f"{ticket.tool_name} as recorded on the ticket",
            arguments_json=stored,
        )
    if digest != ticket.arguments_digest:
        return DigestCheck(
            False,
            digest,
            ticket.arguments_digest,
            "the arguments in the stored state differ from those recorded on the ticket",
            presenters.diff(json.loads(ticket.arguments_json), json.loads(stored)),
            arguments_json=stored,
        )
    if stored != ticket.arguments_json:
        # The digest matches the state but the ticket's copy, which lists show, was changed.
        return DigestCheck(
            False,
            digest,
            ticket.arguments_digest,
            "the ticket's copy of the arguments differs from the stored state (an integrity "
            "error: someone changed the database)",
            presenters.diff(json.loads(ticket.arguments_json), json.loads(stored)),
            arguments_json=stored,
        )
    return DigestCheck(True, digest, ticket.arguments_digest, arguments_json=stored)


def verify(ticket: Ticket) -> DigestCheck:
    """Open the ticket's run state and check the ticket's call against it."""
    state_json, problem = read_state(ticket.run)
    return check_digest(ticket, state_json, problem)


def require_verified(ticket: Ticket) -> None:
    """Raises DigestMismatchError unless the stored call is exactly the one the ticket shows."""
    check = verify(ticket)
    if not check.ok:
        raise DigestMismatchError(f"not approved: {check.problem}")


def require_shown(ticket: Ticket, shown_digest: str) -> None:
    """Raises DigestMismatchError unless shown_digest is the digest the ticket shows: a caller
    that did not see the ticket's page (the API) names the call it decides by its digest."""
    if shown_digest != ticket.arguments_digest:
        raise DigestMismatchError(
            f"not decided: this ticket's arguments digest is {ticket.arguments_digest}, "
            f"not {shown_digest[:64] or 'empty'}; read the ticket again"
        )


def copy_is_intact(ticket: Ticket) -> bool:
    """The ticket's copy of the arguments still has its recorded digest: what lists show (the
    queue, the batch) is what the digest covers. Cheap: no state to open."""
    return sha256_hex(ticket.arguments_json) == ticket.arguments_digest
