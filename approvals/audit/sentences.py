"""An audit event as a person reads it: one sentence from the actions table, what changed from
what to what, and the rest of its detail as labelled facts.

Everything here is text: the page shows each part escaped (a value written by a user, a model
or a caller is never markup), and the export writes the sentence as one plain string. No
database query: an event's own fields and its detail are enough, so a page of them costs
nothing more.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass
from typing import Any

from approvals.audit import actions
from approvals.models import AuditEvent

# What a person reads for a key of an event's detail (policy fields first); any other key reads
# with its underscores as spaces.
FIELD_LABELS: dict[str, str] = {
    "required_approvals": "approvals needed",
    "group_rules": "approvals per group",
    "allowed_groups": "groups that may approve",
    "expiry_seconds": "expires after (seconds)",
    "on_expiry": "on expiry",
    "expiry_message": "message on expiry",
    "escalation_group": "escalation group",
    "escalation_seconds": "escalates after (seconds)",
    "auto_rules": "automatic rules",
    "tickets_moved": "pending tickets moved",
    "session_id": "session",
    "call_id": "tool call id",
    "policy": "policy version",
    "expires_at": "expires at",
    "status_code": "HTTP status",
    "audit_event": "audit event",
    "edited_digest": "digest of the edited arguments",
    "original_ticket": "edited from ticket",
    "preauthorised_by": "pre-authorised by",
    "took_over_from": "took over from",
    "duration_ms": "took (ms)",
    "previous_requests": "requests in the previous window",
    "previous_window": "previous window",
}

# A value longer than this is cut on the page and in the sentence; the export's detail column
# keeps it whole.
MAX_VALUE_CHARS = 500

_PLURAL = re.compile(r"^(\s\S*?)\(s\)")
# An ISO time as events store it (expires_at, window...): read as minutes, UTC.
_ISO_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})(:\d{2}(\.\d+)?)?(\+00:00|Z)$")


@dataclass(frozen=True)
class Part:
    """A piece of the sentence: literal wording, or a value taken from the event."""

    text: str
    is_value: bool = False


@dataclass(frozen=True)
class ChangeLine:
    """One thing that changed: what, how (changed, added, removed), from what, to what."""

    what: str
    kind: str
    before: str
    after: str

    @property
    def text(self) -> str:
        if self.kind == "added":
            return f"{self.what} added: {self.after}"
        if self.kind == "removed":
            return f"{self.what} removed: {self.before}"
        return f"{self.what} {self.before} → {self.after}"


@dataclass(frozen=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True)
class Description:
    parts: tuple[Part, ...]
    changes: tuple[ChangeLine, ...]
    facts: tuple[Fact, ...]

    @property
    def sentence(self) -> str:
        return "".join(part.text for part in self.parts)

    @property
    def text(self) -> str:
        """The sentence with what changed, as one line (the export's sentence column)."""
        changed = "; ".join(change.text for change in self.changes)
        return self.sentence + (f": {changed}" if changed else "") + "."


def label_of(key: str) -> str:
    return FIELD_LABELS.get(key, key.replace("_", " "))


def shown(value: Any) -> str:
    """A detail value as text: none, yes/no, a list joined by commas, anything else as JSON."""
    if value is None:
        text = "none"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, str):
        moment = _ISO_TIME.match(value)
        text = f"{moment[1]} {moment[2]} UTC" if moment else value
    elif isinstance(value, int | float):
        text = str(value)
    elif isinstance(value, list) and all(
        isinstance(v, str | int | float) and not isinstance(v, bool) for v in value
    ):
        text = ", ".join(str(v) for v in value) if value else "none"
    else:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _changes(raw: Any) -> tuple[ChangeLine, ...]:
    """Both shapes events record: {field: [before, after]} (a policy) and a list of
    {path, kind, before, after} (an edit, already shown as text)."""
    if isinstance(raw, dict):
        lines = []
        for key, pair in raw.items():
            if isinstance(pair, list | tuple) and len(pair) == 2:
                lines.append(
                    ChangeLine(label_of(str(key)), "changed", shown(pair[0]), shown(pair[1]))
                )
            else:
                lines.append(ChangeLine(label_of(str(key)), "changed", "", shown(pair)))
        return tuple(lines)
    if isinstance(raw, list):
        return tuple(
            ChangeLine(
                shown(row.get("path", "")),
                str(row.get("kind", "changed")),
                shown(row.get("before", "")),
                shown(row.get("after", "")),
            )
            for row in raw
            if isinstance(row, dict)
        )
    return ()


def _fields(event: AuditEvent) -> dict[str, str]:
    fields = {"actor": event.actor_name or "system"}
    if event.ticket_id:
        fields["ticket"] = f"ticket #{event.ticket_id}"
    if event.run_id:
        fields["run"] = f"run #{event.run_id}"
    if event.tool_name:
        fields["tool"] = event.tool_name
    if event.outcome:
        fields["outcome"] = event.outcome
    return fields


def _render(template: str, fields: dict[str, str], detail: dict) -> tuple[list[Part], set[str]]:
    """The template's parts, and the detail keys it used. Raises KeyError for a field the
    event does not have (the caller falls back to the generic sentence)."""
    parts: list[Part] = []
    used: set[str] = set()
    for literal, name, _spec, _conversion in string.Formatter().parse(template):
        if literal:
            previous = parts[-1] if parts else None
            if previous is not None and previous.is_value:
                ending = r"\1" if previous.text == "1" else r"\1s"
                literal = _PLURAL.sub(ending, literal)
            parts.append(Part(literal))
        if name is None:
            continue
        if name in fields:
            parts.append(Part(fields[name], is_value=True))
        elif name in detail and detail[name] not in (None, "", [], {}):
            parts.append(Part(shown(detail[name]), is_value=True))
            used.add(name)
        else:
            raise KeyError(name)
    return parts, used


def _generic(event: AuditEvent, fields: dict[str, str]) -> list[Part]:
    # "Approval requested by alice (deploy_release, ticket #12)"
    parts = [Part(actions.label(event.action) + " by "), Part(fields["actor"], is_value=True)]
    about = [fields[name] for name in ("tool", "ticket", "run") if name in fields]
    if about:
        parts.append(Part(" ("))
        for index, text in enumerate(about):
            if index:
                parts.append(Part(", "))
            parts.append(Part(text, is_value=True))
        parts.append(Part(")"))
    return parts


def _capitalised(parts: list[Part], template: str) -> list[Part]:
    # A sentence opening on "ticket #12" or "run #3" reads with a capital; a username never
    # changes case.
    # The generic sentence opens on the action's label, as the table writes it.
    if template and (template.startswith(("{ticket}", "{run}")) or not parts[0].is_value):
        first = parts[0]
        parts[0] = Part(first.text[:1].upper() + first.text[1:], first.is_value)
    return parts


def describe(event: AuditEvent) -> Description:
    """The event as a sentence (its action's template, or the generic one when the action has
    none or the event lacks a field it names), what changed, and the other facts of its detail."""
    detail = event.detail if isinstance(event.detail, dict) else {"detail": event.detail}
    fields = _fields(event)
    action = actions.ACTIONS.get(event.action)
    template = action.sentence if action else ""
    used: set[str] = set()
    parts: list[Part] | None = None
    if template:
        try:
            parts, used = _render(template, fields, detail)
        except (KeyError, ValueError, IndexError):
            parts, used = None, set()
    if parts is None:
        template = ""
        parts = _generic(event, fields)
    facts = tuple(
        Fact(label_of(str(key)), shown(value))
        for key, value in detail.items()
        if key not in used and key != "changes" and value not in (None, "", [], {})
    )
    return Description(tuple(_capitalised(parts, template)), _changes(detail.get("changes")), facts)
