"""Edit and approve: an approver corrects a call's arguments; the call is rejected with them and
exactly that call is pre-authorised (decisions.preauth).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals.audit import chain
from approvals.core.canonical import arguments_digest, canonical_json
from approvals.core.redaction import is_secret_key, secret_shape
from approvals.decisions import calls, decide, preauth
from approvals.decisions.errors import (
    InvalidArgumentsError,
    InvalidDecisionError,
    NotAllowedError,
    ToolUnavailableError,
)
from approvals.execution import queue, registry
from approvals.live import hints
from approvals.models import (
    PreAuthorization,
    Run,
    Ticket,
    TicketStatus,
)
from approvals.policies import quorum, scopes

# The message to the model. The demo's scripted model parses it back with parse_correction().
CORRECTION = "The approver changed the arguments. Call {tool} again with exactly these arguments: {arguments}"


_CORRECTION_LEAD = re.compile(
    r"The approver changed the arguments\. Call (?P<tool>[\w.:-]+) again with exactly these "
    r"arguments: "
)


NOTE_LEAD = "Note from the approver: "


def tool_for(run: Run, tool_name: str) -> Any | None:
    """The tool as the run's deployed agent version defines it, or None when it cannot be built."""
    try:
        agent = registry.get_spec(run.agent_key, run.agent_version).build()
    except Exception:
        return None
    return registry.find_tool(agent, tool_name)


def correction_message(tool: str, canonical_arguments: str, note: str = "") -> str:
    text = CORRECTION.format(tool=tool, arguments=canonical_arguments)
    return f"{text}\n{NOTE_LEAD}{note}" if note else text


@dataclass(frozen=True)
class Correction:
    tool: str
    arguments: dict


def parse_correction(text: str) -> Correction | None:
    """The tool and arguments a rejection message asks for, or None when it asks for none."""
    match = _CORRECTION_LEAD.search(text or "")
    if match is None:
        return None
    try:
        arguments, _ = json.JSONDecoder().raw_decode(text, match.end())
    except ValueError:
        return None
    if not isinstance(arguments, dict):
        return None
    return Correction(match.group("tool"), arguments)


def _string_leaves(value: Any, path: str = "") -> dict[str, str]:
    """Each string in an argument tree by its path, secret-named fields left out."""
    if isinstance(value, dict):
        leaves: dict[str, str] = {}
        for key, item in value.items():
            if not is_secret_key(str(key)):
                leaves.update(_string_leaves(item, f"{path}.{key}"))
        return leaves
    if isinstance(value, list):
        leaves = {}
        for index, item in enumerate(value):
            leaves.update(_string_leaves(item, f"{path}[{index}]"))
        return leaves
    return {path: value} if isinstance(value, str) else {}


def retitled(title: str, *, before: dict, after: dict) -> str:
    """The run's title once an edit is recorded: each edited string argument whose old value
    the title names is named by its new value ("Deploy 2026.07.25" becomes "Deploy 2026.07.26"),
    so the run's title says what runs. A title naming none of them is kept as it is, and a new
    value that looks like a secret never goes into a title.

    No side effects; raises nothing.
    """
    old_leaves, new_leaves = _string_leaves(before), _string_leaves(after)
    for path, old in old_leaves.items():
        new = new_leaves.get(path)
        if new is None or new == old or not old or secret_shape(new):
            continue
        title = title.replace(old, new)
    return " ".join(title.split())[:200]


def check_editable(ticket: Ticket, user) -> Any:
    """The tool whose schema the user's edited arguments must fit, if the user may edit the
    ticket now: the edit page asks before showing its form, edit_and_approve() before acting.

    Raises TicketNotFoundError, NotAllowedError, SelfApprovalError (editing approves, so the
    requester may not), TicketExpiredError, AlreadyDecidedError or ToolUnavailableError.
    """
    decide.check_decider(ticket, user, approve=True)
    decide.refuse_unless_pending(ticket, timezone.now())
    run = ticket.run
    blocker = registry.resume_blocker(run)
    if blocker:
        # Nothing approved here could run, so the page must not suggest approving it.
        raise ToolUnavailableError(
            f"this run cannot resume here: {blocker}. Reject the call with a message to the "
            f"agent, or ask an admin to deploy agent {run.agent_key} v{run.agent_version}"
        )
    tool = tool_for(run, ticket.tool_name)
    if tool is None:
        raise ToolUnavailableError(
            f"the tool {ticket.tool_name} is not in agent {ticket.run.agent_key} "
            f"v{ticket.run.agent_version} as deployed here, so edited arguments cannot be "
            "checked; approve or reject the call as it is"
        )
    return tool


def edit_and_approve(
    ticket: Ticket, *, user, arguments: dict, message: str = ""
) -> PreAuthorization:
    """Reject a pending call with corrected arguments and pre-authorise exactly those.

    The SDK cannot approve a call with other arguments, so the model is asked to call again:
    the rejection message carries the corrected arguments as canonical JSON (and the approver's
    note), and when the resumed model calls the same tool with exactly that digest, the new
    ticket counts as this user's approval (automatic.decide_automatically, from tickets.open_tickets).
    Side effects, in one transaction: the ticket rejected by the same compare-and-set as a
    rejection; a PreAuthorization (canonical arguments, digest, expiry one ticket lifetime
    away); the run's title names the edited values (retitled()), the requested one kept in the event; audit event ticket.edited
    with the changes; when it was the run's last pending
    ticket, the run queued and the resume enqueued; after commit, live hints. Raises
    TicketNotFoundError, NotAllowedError, SelfApprovalError (editing approves, so the requester
    may not), TicketExpiredError, AlreadyDecidedError, ToolUnavailableError,
    InvalidArgumentsError or InvalidDecisionError, having written nothing.
    """
    note = decide.checked_message(message)
    tool = check_editable(ticket, user)
    if not isinstance(arguments, dict):
        raise InvalidDecisionError("the edited arguments must be a JSON object")
    problems = calls.schema_problems(tool.params_json_schema, arguments)
    if problems:
        raise InvalidArgumentsError(problems)
    edited_json = canonical_json(arguments)
    digest = arguments_digest(edited_json)
    if digest == ticket.arguments_digest:
        raise InvalidDecisionError(
            "the edited arguments are the same as the call's; approve the call instead"
        )
    rejection = correction_message(tool.name, edited_json, note)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=ticket.run_id)
        now = timezone.now()
        # Read under the lock, as decide() does: an escalation may have moved the ticket.
        current = Ticket.objects.select_related("policy").get(pk=ticket.pk)
        policy = scopes.policy_of(current)
        refusal = quorum.refusal_for(user, current, policy)
        if refusal:
            raise NotAllowedError(refusal)
        decide.compare_and_set(
            ticket, status=TicketStatus.REJECTED, user=user, now=now, message=rejection
        )
        pre = PreAuthorization.objects.create(
            tenant_id=ticket.tenant_id,
            run=run,
            tool_name=ticket.tool_name,
            arguments_json=edited_json,
            arguments_digest=digest,
            original_ticket=ticket,
            created_by=user,
            created_at=now,
            expires_at=now + scopes.time_to_live(policy),
        )
        requested = run.title
        title = retitled(requested, before=json.loads(ticket.arguments_json), after=arguments)
        if title != requested:
            run.title = title
            run.save(update_fields=["title"])
        chain.append_for_ticket(
            ticket,
            action="ticket.edited",
            actor=user,
            outcome=TicketStatus.REJECTED,
            detail={
                "edited_digest": digest,
                "changes": preauth.changes(json.loads(ticket.arguments_json), arguments),
                **({"message": note} if note else {}),
                # What was asked stays on record when the title now names what runs.
                **({"title": {"before": requested, "after": title}} if title != requested else {}),
            },
        )
        hints.notify_on_commit(
            ticket.tenant_id,
            "ticket.decided",
            ticket=ticket.pk,
            run=run.pk,
            status=TicketStatus.REJECTED,
        )
        queue.queue_if_decided(run, now=now, actor=user)
    ticket.refresh_from_db()
    return pre
