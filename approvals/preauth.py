"""Edit and approve: pre-authorising exactly the call an approver corrected.

The SDK approves a call with the arguments the model gave, never with others. So an approver
who wants other arguments rejects the call with a message that carries the corrected arguments
(services.edit_and_approve), and a PreAuthorization records exactly that tool and digest for
the run. When the resumed model calls the tool again with exactly those arguments, the new
ticket counts as the approver's approval, once (services._decide_automatically: candidate(),
use(), then approve() or count_as_vote() under the ticket's policy); any other call stays a
normal ticket.

This module does not import services: services calls it while it creates tickets.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from django.db.models import Q
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.validators import validator_for

from approvals import audit, live, registry
from approvals.core import presenters
from approvals.core.redaction import is_secret_key
from approvals.models import Membership, PreAuthorization, Run, Ticket, TicketStatus

# The message to the model. The demo's scripted model parses it back with parse_correction().
CORRECTION = "The approver changed the arguments. Call {tool} again with exactly these arguments: {arguments}"
_CORRECTION_LEAD = re.compile(
    r"The approver changed the arguments\. Call (?P<tool>[\w.:-]+) again with exactly these "
    r"arguments: "
)
NOTE_LEAD = "Note from the approver: "


# --- the tool and its schema ---------------------------------------------------------------


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


# --- validating edited arguments -----------------------------------------------------------


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


def schema_problems(schema: dict, arguments: Any) -> list[Problem]:
    """What is wrong with arguments under the tool's JSON schema; empty when they fit."""
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


# --- the message to the model ----------------------------------------------------------------


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


# --- the diff, as the audit log keeps it ----------------------------------------------------


def changes(before: Any, after: Any) -> list[dict[str, str]]:
    """presenters.diff as plain data for an audit event, values of secret-named fields hidden."""
    rows = []
    for change in presenters.diff(before, after):
        row = asdict(change)
        leaf = re.split(r"[.\[]", change.path)[-1].rstrip("]")
        if is_secret_key(leaf):
            row["before"] = "[redacted]" if row["before"] else ""
            row["after"] = "[redacted]" if row["after"] else ""
        rows.append(row)
    return rows


# --- matching a new call -------------------------------------------------------------------


def candidate(run: Run, ticket: Ticket, *, now) -> PreAuthorization | None:
    """The unused, unexpired pre-authorisation of the same run, tool and argument digest whose
    author may still decide in the tenant and did not request the call; None when there is none.
    """
    candidates = PreAuthorization.objects.filter(
        run_id=run.pk,
        tool_name=ticket.tool_name,
        arguments_digest=ticket.arguments_digest,
        used_by__isnull=True,
        expires_at__gt=now,
    ).select_related("created_by", "original_ticket")
    for pre in candidates.order_by("pk"):
        author = pre.created_by
        if author is None or not author.is_active or ticket.is_requested_by(author):
            continue
        membership = Membership.objects.filter(user=author, tenant_id=run.tenant_id).first()
        if membership is None or not membership.can_decide:
            continue
        return pre
    return None


def use(pre: PreAuthorization, ticket: Ticket, *, now) -> bool:
    """Spend the pre-authorisation on this ticket: once only (a compare-and-set on used_by)."""
    if not PreAuthorization.objects.filter(pk=pre.pk, used_by__isnull=True).update(
        used_by=ticket, used_at=now
    ):
        return False
    pre.used_by = ticket
    pre.used_at = now
    return True


def _audit_detail(pre: PreAuthorization) -> dict:
    return {
        "preauthorised_by": pre.created_by.get_username(),
        "original_ticket": pre.original_ticket_id,
        "changes": changes(
            json.loads(pre.original_ticket.arguments_json), json.loads(pre.arguments_json)
        ),
    }


def approve(run: Run, ticket: Ticket, pre: PreAuthorization, *, now, detail=None) -> None:
    """Approve the just-created ticket in the author's name; inside the creating transaction.

    Side effects: the ticket approved; audit event ticket.preauthorised; after commit, a live
    hint. Queueing the run, when nothing is left pending, is the caller's.
    """
    author = pre.created_by
    message = (
        f"Pre-authorised by {author.get_username()}: edited from ticket #{pre.original_ticket_id}."
    )
    won = Ticket.objects.filter(
        Q(pk=ticket.pk) & Q(status=TicketStatus.PENDING) & Q(expires_at__gt=now)
    ).update(
        status=TicketStatus.APPROVED,
        decided_by=author,
        decided_at=now,
        decision_message=message,
    )
    if not won:
        raise RuntimeError(f"ticket {ticket.pk} was decided while it was being created")
    ticket.status = TicketStatus.APPROVED
    ticket.decided_by = author
    ticket.decided_at = now
    ticket.decision_message = message
    audit.append_for_ticket(
        ticket,
        action="ticket.preauthorised",
        actor=author,
        outcome=TicketStatus.APPROVED,
        detail={**_audit_detail(pre), **(detail or {})},
    )
    live.notify_on_commit(
        run.tenant_id, "ticket.decided", ticket=ticket.pk, run=run.pk, status=TicketStatus.APPROVED
    )


def count_as_vote(run: Run, ticket: Ticket, pre: PreAuthorization, *, progress: str) -> None:
    """The pre-authorisation gave the author's approval, but the ticket's policy needs more
    people: the ticket stays pending with that vote. Audit event ticket.vote (outcome pending,
    the detail naming the pre-authorisation) and a live hint."""
    audit.append_for_ticket(
        ticket,
        action="ticket.vote",
        actor=pre.created_by,
        outcome=TicketStatus.PENDING,
        detail={**_audit_detail(pre), "progress": progress},
    )
    live.notify_on_commit(run.tenant_id, "ticket.changed", ticket=ticket.pk, run=run.pk)
