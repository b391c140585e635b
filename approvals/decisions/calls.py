"""One canonical reading of a call: what its arguments say, whether they fit the tool's schema,
and what a person must be shown before approving it.

A call is **malformed** when its arguments are not a JSON object of the tool's arguments: text
that is not JSON, a repeated key (parsers disagree on which one wins), a key the tool does not
take (the SDK's tools drop unknown keys silently), two keys that differ only by invisible
characters, or a value of the wrong type. A malformed call is never approvable: it is rejected
to the model with the reasons, so a real model can correct itself (decisions.tickets).

A call is **flagged** when a key or a string holds invisible characters or letters that pass for
Latin ones (core.reading). A flagged call is approved only from its own ticket page, after the
flags were shown: never in a batch, by an automatic rule or by a pre-authorisation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.validators import validator_for

from approvals.core import reading
from approvals.core.canonical import UNPARSED, loads_within, nesting_depth, parse_arguments
from approvals.models import Ticket


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


# The validators of the schemas in use, each kept with its schema object: a deployed tool's
# schema is one object for the life of the process (registry.tool_schema), and building its
# validator costs more than checking most calls against it.
_validators: dict[int, tuple[dict, Any]] = {}
VALIDATORS_KEPT = 256


def _validator(schema: dict):
    kept = _validators.get(id(schema))
    if kept is not None and kept[0] is schema:
        return kept[1]
    validator = validator_for(schema, default=Draft202012Validator)(schema)
    if len(_validators) >= VALIDATORS_KEPT:
        _validators.clear()
    # The schema is kept with it, so its id names no other object while it is here.
    _validators[id(schema)] = (schema, validator)
    return validator


def schema_problems(schema: dict, arguments: Any) -> list[Problem]:
    """What is wrong with arguments under the tool's JSON schema; empty when they fit.

    Arguments nested deeper than MAX_DEPTH are refused before the schema is consulted (the
    validator recurses once per level)."""
    too_deep = _depth_problems(arguments)
    if too_deep:
        return too_deep
    validator = _validator(schema)
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


def _same_to_the_eye(key: str) -> str:
    return reading.normalised(key).replace(" ", "")


def malformed_reasons(raw: str | None, schema: dict | None) -> list[str]:
    """Why the model's argument string is not a call of the tool; empty when it is one.

    schema is the tool's parameters schema, or None when the deployed agent has no such
    function tool (its keys and types cannot be checked then; the rest still is).
    """
    value = parse_arguments(raw)
    if isinstance(value, dict) and set(value) == {UNPARSED}:
        return [
            "the arguments are not one JSON object with each key once (repeated keys, or not "
            "JSON at all)"
        ]
    if not isinstance(value, dict):
        return ["the arguments are not a JSON object"]
    reasons = []
    seen: dict[str, str] = {}
    for key in value:
        twin = seen.setdefault(_same_to_the_eye(str(key)), str(key))
        if twin != key:
            reasons.append(
                f"the keys {reading.join_path('', twin)} and {reading.join_path('', key)} differ "
                "only by invisible characters, spaces or case"
            )
    if schema is not None:
        allowed = set((schema.get("properties") or {}).keys())
        unknown = [k for k in value if allowed and k not in allowed]
        if unknown:
            reasons.append(
                "the tool takes no argument called "
                + ", ".join(reading.join_path("", k) for k in unknown)
            )
        try:
            problems = schema_problems(schema, value)
        except RecursionError:
            problems = [Problem(None, "The arguments are nested too deeply to check.")]
        for problem in problems:
            if problem.unknown and unknown:
                continue  # already said, with the names escaped
            where = f"{reading.join_path('', problem.argument)}: " if problem.argument else ""
            text = problem.message
            reasons.append(where + text[:1].lower() + text[1:].rstrip("."))
    return reasons


def malformed_message(tool: str, reasons: list[str]) -> str:
    """What the model reads when its call is rejected as malformed."""
    return (
        f"Your call of {tool} was not run and nobody was asked to approve it: "
        + "; ".join(reasons)
        + f". Call {tool} again with arguments that fit its schema."
    )


@dataclass(frozen=True)
class Reading:
    """A ticket's call as a person must read it."""

    value: Any
    flags: list[reading.Flag]

    @property
    def flagged(self) -> bool:
        return bool(self.flags)


def read(arguments_json: str) -> Reading:
    """The canonical arguments of a ticket, with their flags."""
    value = json.loads(arguments_json)
    return Reading(value, reading.flags_of(value))


def is_flagged(ticket: Ticket) -> bool:
    return read(ticket.arguments_json).flagged
