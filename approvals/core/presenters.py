"""Turn stored facts into what a person reads: transcripts, argument tables, diffs, digest checks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from approvals.core import reading
from approvals.core.canonical import canonical_arguments
from approvals.core.redaction import mask_secrets

FOLD_AT = 160


@dataclass(frozen=True)
class Entry:
    kind: str  # user, assistant, tool_call, tool_output, system
    text: str = ""
    tool: str = ""
    call_id: str = ""
    arguments: list[ArgRow] = field(default_factory=list)


@dataclass(frozen=True)
class ArgRow:
    """One row of an arguments table, as a person reads it: nothing cut, nothing invisible."""

    path: str
    value: str  # strings quoted, numbers, booleans and null as themselves; escapes visible
    kind: str = "text"  # text, number, boolean, null, object, list
    depth: int = 0
    is_container: bool = False
    flagged: bool = False
    # A long value shows its first FOLD_AT characters and says how many more there are.
    head: str = ""
    more: int = 0


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or part.get("refusal") or ""))
        return "\n".join(p for p in parts if p)
    return ""


def kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "list"
    return "text"


def shown(value: Any) -> str:
    """A scalar as JSON writes it (a string in quotes), with invisible characters escaped: text,
    numbers, booleans and null never read alike."""
    if isinstance(value, dict | list) and not value:
        return "{}" if isinstance(value, dict) else "[]"
    return reading.escape(json.dumps(value, ensure_ascii=False))


def argument_rows(value: Any, path: str = "", depth: int = 0) -> list[ArgRow]:
    """Rows of a table: nested values as nested rows under their parent, every value whole."""
    rows: list[ArgRow] = []
    if isinstance(value, dict) and value:
        if path:
            rows.append(ArgRow(path, f"{len(value)} fields", "object", depth, is_container=True))
        for key in value:
            child = reading.join_path(path, key)
            rows.extend(argument_rows(value[key], child, depth + (1 if path else 0)))
        return rows
    if isinstance(value, list) and value:
        rows.append(
            ArgRow(path or "(list)", f"{len(value)} items", "list", depth, is_container=True)
        )
        for index, item in enumerate(value):
            rows.extend(argument_rows(item, f"{path}[{index}]", depth + 1))
        return rows
    text = shown(value)
    long = len(text) > FOLD_AT
    return [
        ArgRow(
            path or "(value)",
            text,
            kind_of(value),
            depth,
            flagged=bool(reading.flags_of(value) or reading.flags_in(path, path)),
            head=text[:FOLD_AT] if long else "",
            more=len(text) - FOLD_AT if long else 0,
        )
    ]


def arguments_rows_from_json(arguments_json: str) -> list[ArgRow]:
    return argument_rows(json.loads(arguments_json))


def summary(arguments_json: str, limit: int = 90) -> str:
    """One line of the top level, key=value, cut only with a count of what is not shown."""
    try:
        value = json.loads(arguments_json)
    except ValueError:
        value = arguments_json
    if isinstance(value, dict):
        text = ", ".join(f"{reading.join_path('', k)}={shown(v)}" for k, v in value.items())
    else:
        text = shown(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … {len(text) - limit} more characters"


def transcript(state_json: dict) -> list[Entry]:
    """The run's conversation so far, from its stored state; secret-looking text masked, as the
    run's title is."""
    return [_masked(entry) for entry in _transcript(state_json)]


def _masked(entry: Entry) -> Entry:
    if not entry.text:
        return entry
    return Entry(entry.kind, mask_secrets(entry.text), entry.tool, entry.call_id, entry.arguments)


def _transcript(state_json: dict) -> list[Entry]:
    entries: list[Entry] = []
    original = state_json.get("original_input")
    if isinstance(original, str):
        entries.append(Entry("user", original))
    elif isinstance(original, list):
        for item in original:
            entries.extend(_entries_from_input_item(item))
    for item in state_json.get("generated_items") or []:
        kind = item.get("type")
        raw = item.get("raw_item") or {}
        if kind == "message_output_item":
            entries.append(Entry("assistant", _text_of(raw.get("content"))))
        elif kind == "tool_call_item":
            args = raw.get("arguments")
            entries.append(
                Entry(
                    "tool_call",
                    tool=str(raw.get("name") or item.get("tool_name") or ""),
                    call_id=str(raw.get("call_id") or ""),
                    arguments=argument_rows(json.loads(canonical_arguments(args))),
                )
            )
        elif kind == "tool_call_output_item":
            output = item.get("output", raw.get("output"))
            entries.append(
                Entry(
                    "tool_output",
                    text=output if isinstance(output, str) else json.dumps(output),
                    call_id=str(raw.get("call_id") or ""),
                )
            )
    return entries


def _entries_from_input_item(item: Any) -> list[Entry]:
    if not isinstance(item, dict):
        return []
    role = item.get("role")
    if role in {"user", "assistant", "system", "developer"}:
        return [Entry("user" if role == "user" else role, _text_of(item.get("content")))]
    if item.get("type") == "function_call":
        return [
            Entry(
                "tool_call",
                tool=str(item.get("name", "")),
                call_id=str(item.get("call_id", "")),
                arguments=argument_rows(json.loads(canonical_arguments(item.get("arguments")))),
            )
        ]
    if item.get("type") == "function_call_output":
        return [
            Entry("tool_output", text=str(item.get("output")), call_id=str(item.get("call_id")))
        ]
    return []


def entries_from_items(items: list) -> list[Entry]:
    """A session's items (SDK input items) as entries for a person."""
    entries: list[Entry] = []
    for item in items:
        if (
            isinstance(item, dict)
            and item.get("type") == "message"
            and item.get("role") == "assistant"
        ):
            entries.append(Entry("assistant", _text_of(item.get("content"))))
        else:
            entries.extend(_entries_from_input_item(item))
    return entries


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # added, removed, changed
    before: str = ""
    after: str = ""


def _flatten(value: Any, path: str = "") -> dict[str, str]:
    """Each leaf by its unambiguous path, shown with its type: {"x": {"y": "1"}} and
    {"x.y": 1} share no path, and "[]" (text) is not [] (an empty list)."""
    if isinstance(value, dict) and value:
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat.update(_flatten(item, reading.join_path(path, key)))
        return flat
    if isinstance(value, list) and value:
        flat = {}
        for index, item in enumerate(value):
            flat.update(_flatten(item, f"{path}[{index}]"))
        return flat
    return {path or "(value)": shown(value)}


def diff(before: Any, after: Any) -> list[Change]:
    """Field-level changes from before to after: added, removed and changed leaves, where a
    change of type or of structure is a change."""
    old, new = _flatten(before), _flatten(after)
    changes = []
    for path in sorted(old.keys() | new.keys()):
        if path not in old:
            changes.append(Change(path, "added", after=new[path]))
        elif path not in new:
            changes.append(Change(path, "removed", before=old[path]))
        elif old[path] != new[path]:
            changes.append(Change(path, "changed", old[path], new[path]))
    return changes
