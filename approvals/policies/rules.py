"""Automatic decisions by rule on argument values, and the text syntax the policy form uses.

Values are compared on a normalised form (NFKC, case-folded, invisible characters removed:
core.reading.normalised), so "Production" and "production\u200b" are "production" to a rule.
A "!=" or "not in" rule is a deny-list: it approves everything it does not name. Regular
expressions run on RE2, whose time is linear in the text: a model's argument cannot make a
rule's pattern run for seconds inside the ticket's transaction.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import re2

from approvals.core import reading
from approvals.models import (
    ApprovalPolicy,
)
from approvals.policies import quorum

OPERATORS = {
    "eq": "==",
    "ne": "!=",
    "in": "in",
    "not_in": "not in",
    "matches": "matches",
}


_SYMBOLS = {symbol: op for op, symbol in OPERATORS.items()}


@dataclass(frozen=True)
class AutoDecision:
    approve: bool
    rule: str
    reason: str


def _lookup(arguments: Any, path: str) -> tuple[bool, Any]:
    value = arguments
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _pattern(expression: str):
    """The expression compiled by RE2; raises re2.error when RE2 cannot run it."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(expression, options)


def rule_matches(rule: dict, arguments: Any) -> bool:
    """A missing argument never matches: an absent value is no evidence of low risk."""
    found, value = _lookup(arguments, rule["argument"])
    if not found:
        return False
    text, expected, op = _as_text(value), rule["value"], rule["op"]
    if op == "matches":
        try:
            pattern = _pattern(expected)
        except re2.error:
            # A rule saved before patterns ran on RE2: it decides nothing; a person does.
            return False
        plain = unicodedata.normalize("NFKC", text)
        return (
            pattern.fullmatch("".join(c for c in plain if not reading.is_invisible(c))) is not None
        )
    text = reading.normalised(text)
    if op == "eq":
        return text == reading.normalised(expected)
    if op == "ne":
        return text != reading.normalised(expected)
    options = [reading.normalised(o) for o in expected.split(",")]
    if op == "in":
        return text in options
    if op == "not_in":
        return text not in options
    return False


def describe_rule(rule: dict) -> str:
    return (
        f"{rule['decision']} if {rule['argument']} {OPERATORS[rule['op']]} {rule['value']} "
        f"because {rule['reason']}"
    )


def automatic_decision(policy: ApprovalPolicy, arguments_json: str) -> AutoDecision | None:
    """The first of the policy's rules that matches the canonical arguments, if any."""
    if not policy.auto_rules:
        return None
    try:
        arguments = json.loads(arguments_json)
    except ValueError:
        return None
    for rule in policy.auto_rules:
        if rule_matches(rule, arguments):
            return AutoDecision(
                approve=rule["decision"] == "approve",
                rule=describe_rule(rule).split(" because ")[0],
                reason=rule["reason"],
            )
    return None


_RULE_LINE = re.compile(
    r"^(?P<decision>approve|reject)\s+if\s+(?P<argument>[A-Za-z_][\w.]*)\s+"
    r"(?P<op>==|!=|not\s+in|in|matches)\s+(?P<value>.+?)\s+because\s+(?P<reason>.+)$",
    re.IGNORECASE,
)


_GROUP_LINE = re.compile(r"^(?P<count>\d+)\s+(?:from\s+)?(?P<group>.+)$")


class RuleSyntaxError(ValueError):
    pass


def parse_auto_rules(text: str) -> list[dict]:
    rules = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        match = _RULE_LINE.match(line)
        if match is None:
            raise RuleSyntaxError(
                f"line {number}: write 'approve if ARGUMENT OP VALUE because REASON' "
                "(OP is ==, !=, in, not in or matches)"
            )
        op = _SYMBOLS[" ".join(match["op"].lower().split())]
        value = match["value"].strip()
        _check_pattern(op, value, number)
        rules.append(
            {
                "argument": match["argument"],
                "op": op,
                "value": value,
                "decision": match["decision"].lower(),
                "reason": match["reason"].strip(),
            }
        )
    return rules


def format_auto_rules(rules: list[dict]) -> str:
    return "\n".join(describe_rule(r) for r in rules)


def _check_pattern(op: str, value: str, number: int) -> None:
    if op != "matches":
        return
    try:
        _pattern(value)
    except re2.error as error:
        reason = (
            error.args[0].decode() if error.args and isinstance(error.args[0], bytes) else error
        )
        raise RuleSyntaxError(
            f"line {number}: {value!r} is not a valid regular expression for RE2 "
            f"({reason}; look-arounds and back-references are not supported)"
        ) from None


# A condition is a rule without its decision: "environment == production".
_CONDITION_LINE = re.compile(
    r"^(?P<argument>[A-Za-z_][\w.]*)\s+(?P<op>==|!=|not\s+in|in|matches)\s+(?P<value>.+?)$",
    re.IGNORECASE,
)


def describe_condition(condition: dict) -> str:
    return f"{condition['argument']} {OPERATORS[condition['op']]} {condition['value']}"


def parse_conditions(text: str) -> list[dict]:
    """Conditions on argument values, one a line, compared as rule_matches compares them."""
    conditions = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        match = _CONDITION_LINE.match(line)
        if match is None:
            raise RuleSyntaxError(
                f"line {number}: write 'ARGUMENT OP VALUE', e.g. 'environment == production' "
                "(OP is ==, !=, in, not in or matches)"
            )
        op = _SYMBOLS[" ".join(match["op"].lower().split())]
        value = match["value"].strip()
        _check_pattern(op, value, number)
        conditions.append({"argument": match["argument"], "op": op, "value": value})
    return conditions


def format_conditions(conditions: list[dict]) -> str:
    return "\n".join(describe_condition(c) for c in conditions)


def parse_group_rules(text: str) -> list[dict]:
    rules = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        match = _GROUP_LINE.match(line)
        if match is None or not 1 <= int(match["count"]) <= quorum.MAX_APPROVALS:
            raise RuleSyntaxError(
                f"line {number}: write 'COUNT GROUP', e.g. '1 release managers' "
                f"(COUNT from 1 to {quorum.MAX_APPROVALS})"
            )
        rules.append({"group": match["group"].strip(), "count": int(match["count"])})
    return rules


def format_group_rules(rules: list[dict]) -> str:
    return "\n".join(f"{r['count']} {r['group']}" for r in rules)
