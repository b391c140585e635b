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
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.validators import validator_for

from approvals.audit import chain
from approvals.core.canonical import (
    arguments_digest,
    canonical_json,
    loads_within,
    nesting_depth,
)
from approvals.decisions import decide, preauth
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


def find_tool(agent: Any, tool_name: str) -> Any | None:
    """The function tool called tool_name in the agent or any agent it hands off to."""
    stack, seen = [agent], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for tool in getattr(current, "tools", []) or []:
            names = {getattr(tool, "name", None), getattr(tool, "qualified_name", None)}
            if tool_name in names and isinstance(getattr(tool, "params_json_schema", None), dict):
                return tool
        for handoff in getattr(current, "handoffs", []) or []:
            target = handoff if hasattr(handoff, "tools") else getattr(handoff, "agent", None)
            if target is not None:
                stack.append(target)
    return None


def tool_for(run: Run, tool_name: str) -> Any | None:
    """The tool as the run's deployed agent version defines it, or None when it cannot be built."""
    try:
        agent = registry.get_spec(run.agent_key, run.agent_version).build()
    except Exception:
        return None
    return find_tool(agent, tool_name)


@dataclass(frozen=True)
class Problem:
    """One thing to fix: the top-level argument it concerns (None: the whole call; unknown:
    arguments the tool does not take)."""

    argument: str | None
    message: str
    unknown: bool = False


_TYPE_WORDS = {
    "string": "text",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "object": "a JSON object",
    "array": "a JSON list",
    "null": "null",
}


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _shown(instance: Any) -> str:
    got = json.dumps(instance, ensure_ascii=False)
    return got if len(got) <= 80 else got[:79] + "…"


def _describe_types(types: list, instance: Any) -> str:
    words = " or ".join(dict.fromkeys(_TYPE_WORDS.get(str(t), str(t)) for t in types))
    return f"Must be {words}, not {_shown(instance)}."


def _describe(error: ValidationError) -> str:
    got = _shown(error.instance)
    kind = error.validator
    value = error.validator_value
    if kind == "type":
        return _describe_types(_as_list(value), error.instance)
    if kind == "enum":
        return "Must be one of " + ", ".join(json.dumps(v) for v in value) + f", not {got}."
    if kind == "const":
        return f"Must be {json.dumps(value)}, not {got}."
    if kind in {"minimum", "exclusiveMinimum"}:
        return f"Must be at least {value}{' (exclusive)' if kind.startswith('exclusive') else ''}."
    if kind in {"maximum", "exclusiveMaximum"}:
        return f"Must be at most {value}{' (exclusive)' if kind.startswith('exclusive') else ''}."
    if kind == "minLength":
        return f"Must be at least {value} characters long."
    if kind == "maxLength":
        return f"Must be at most {value} characters long."
    if kind == "pattern":
        return f"Must match the pattern {value}."
    return error.message[:1].upper() + error.message[1:].rstrip(".") + "."


# Levels of lists and objects one argument's value may have. The schema check, the diff and the
# canonical JSON each recurse once per level, so a value nested without bound would exhaust the
# stack; no tool's arguments need anywhere near this many.
MAX_DEPTH = 32

TOO_DEEP = f"This value is nested too deeply: at most {MAX_DEPTH} levels of lists and objects."


def parse_value(text: str, *, levels: int = MAX_DEPTH) -> Any:
    """One argument's value typed as JSON (levels: how deep it may nest). Raises
    NestedTooDeeplyError (say TOO_DEEP) before parsing a value nested deeper, else ValueError
    when text is not JSON."""
    return loads_within(text, max_depth=levels)


def _depth_problems(arguments: Any) -> list[Problem]:
    if isinstance(arguments, dict):
        return [
            Problem(str(name), TOO_DEEP)
            for name, value in arguments.items()
            if nesting_depth(value, stop_after=MAX_DEPTH) > MAX_DEPTH
        ]
    if nesting_depth(arguments, stop_after=MAX_DEPTH + 1) > MAX_DEPTH + 1:
        return [Problem(None, TOO_DEEP)]
    return []


def schema_problems(schema: dict, arguments: Any) -> list[Problem]:
    """What is wrong with arguments under the tool's JSON schema; empty when they fit.

    Arguments nested deeper than MAX_DEPTH are refused before the schema is consulted (the
    validator recurses once per level)."""
    too_deep = _depth_problems(arguments)
    if too_deep:
        return too_deep
    cls = validator_for(schema, default=Draft202012Validator)
    validator = cls(schema)
    problems: list[Problem] = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.path))):
        path = list(error.path)
        if error.validator == "required" and not path and isinstance(error.instance, dict):
            for name in error.validator_value:
                if name not in error.instance:
                    problems.append(Problem(str(name), "This argument is required."))
            continue
        if error.validator == "additionalProperties" and not path:
            allowed = set((schema.get("properties") or {}).keys())
            extra = sorted(str(k) for k in error.instance if k not in allowed)
            problems.append(
                Problem(
                    None,
                    "The tool takes no argument called "
                    + ", ".join(repr(k) for k in extra)
                    + (f"; it takes {', '.join(sorted(allowed))}." if allowed else "."),
                    unknown=True,
                )
            )
            continue
        if error.validator in {"anyOf", "oneOf"} and error.context:
            # Optional[...] and unions: an alternative of the value's own type says what is
            # wrong inside it; when no alternative has its type, name the types it may have.
            inside = [e for e in error.context if e.validator != "type" or e.relative_path]
            if inside:
                error = max(inside, key=lambda e: len(e.relative_path))
                path = list(error.absolute_path)
            else:
                types = [t for e in error.context for t in _as_list(e.validator_value)]
                message = _describe_types(types, error.instance)
                problems.append(Problem(str(path[0]) if path else None, message))
                continue
        if path:
            top = str(path[0])
            inner = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[1:])
            message = _describe(error)
            problems.append(Problem(top, f"{top}{inner}: {message}" if inner else message))
        else:
            problems.append(Problem(None, _describe(error)))
    return problems


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


def check_editable(ticket: Ticket, user) -> Any:
    """The tool whose schema the user's edited arguments must fit, if the user may edit the
    ticket now: the edit page asks before showing its form, edit_and_approve() before acting.

    Raises TicketNotFoundError, NotAllowedError, SelfApprovalError (editing approves, so the
    requester may not), TicketExpiredError, AlreadyDecidedError or ToolUnavailableError.
    """
    decide.check_decider(ticket, user, approve=True)
    decide.refuse_unless_pending(ticket, timezone.now())
    tool = tool_for(ticket.run, ticket.tool_name)
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
    away); audit event ticket.edited with the changes; when it was the run's last pending
    ticket, the run queued and the resume enqueued; after commit, live hints. Raises
    TicketNotFoundError, NotAllowedError, SelfApprovalError (editing approves, so the requester
    may not), TicketExpiredError, AlreadyDecidedError, ToolUnavailableError,
    InvalidArgumentsError or InvalidDecisionError, having written nothing.
    """
    note = decide.checked_message(message)
    tool = check_editable(ticket, user)
    if not isinstance(arguments, dict):
        raise InvalidDecisionError("the edited arguments must be a JSON object")
    problems = schema_problems(tool.params_json_schema, arguments)
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
        chain.append_for_ticket(
            ticket,
            action="ticket.edited",
            actor=user,
            outcome=TicketStatus.REJECTED,
            detail={
                "edited_digest": digest,
                "changes": preauth.changes(json.loads(ticket.arguments_json), arguments),
                **({"message": note} if note else {}),
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
