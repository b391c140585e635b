"""Edit and approve: the call's arguments as form fields built from the tool's JSON schema."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from approvals.core.canonical import NestedTooDeeplyError, canonical_json
from approvals.decisions import calls
from approvals.decisions.decide import MAX_MESSAGE_CHARS

_SIMPLE_TYPES = {"string", "integer", "number", "boolean"}


ARG_PREFIX = "arg__"


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def argument_kind(prop: Any) -> str:
    """How an argument is edited: enum, string, integer, number, boolean, or json (the rest)."""
    if not isinstance(prop, dict):
        return "json"
    enum = prop.get("enum")
    if isinstance(enum, list) and enum and all(_scalar(v) for v in enum):
        return "enum"
    kind = prop.get("type")
    return kind if isinstance(kind, str) and kind in _SIMPLE_TYPES else "json"


def _shown(value: Any, kind: str) -> str:
    if kind == "string" and isinstance(value, str):
        return value
    if kind in {"integer", "number"} and isinstance(value, int | float):
        return json.dumps(value)
    if kind == "boolean" and isinstance(value, bool):
        return "true" if value else "false"
    if kind == "enum":
        return canonical_json(value)
    return json.dumps(value, indent=2, ensure_ascii=False)


class EditArgumentsForm(forms.Form):
    """The tool's arguments, one field per top-level property of its JSON schema.

    Text, numbers, booleans and enums get a field of their own; anything else (objects, lists,
    unions) is edited as JSON. A field left empty leaves the argument out. The arguments are
    checked against the schema, and each problem is shown on the field it concerns.
    """

    message = forms.CharField(
        required=False,
        max_length=MAX_MESSAGE_CHARS,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Note to the agent",
        help_text="Sent with the corrected arguments.",
    )
    extra = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        label="Other arguments (a JSON object)",
    )

    def __init__(self, *args, schema: dict, original: dict, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.schema = schema
        self.arguments: dict[str, Any] | None = None
        properties = schema.get("properties")
        self.properties: dict[str, Any] = properties if isinstance(properties, dict) else {}
        required = set(schema.get("required") or [])
        self.kinds: dict[str, str] = {}
        fields = {}
        for name, prop in self.properties.items():
            kind = argument_kind(prop)
            self.kinds[name] = kind
            label = name + ("" if name in required else " (optional)")
            help_text = str(prop.get("description", "")) if isinstance(prop, dict) else ""
            initial = _shown(original[name], kind) if name in original else ""
            if kind == "enum":
                choices = [("", "—")] + [
                    (canonical_json(v), v if isinstance(v, str) else canonical_json(v))
                    for v in prop["enum"]
                ]
                field = forms.ChoiceField(choices=choices, required=False)
            elif kind == "boolean":
                field = forms.ChoiceField(
                    choices=[("", "—"), ("true", "true"), ("false", "false")], required=False
                )
            elif kind == "json":
                field = forms.CharField(
                    required=False,
                    strip=False,
                    widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
                )
                help_text = (help_text + " " if help_text else "") + "As JSON."
            else:
                attrs = {"inputmode": "decimal"} if kind in {"integer", "number"} else {}
                field = forms.CharField(
                    required=False, strip=False, widget=forms.TextInput(attrs=attrs)
                )
            field.label, field.help_text, field.initial = label, help_text, initial
            fields[ARG_PREFIX + name] = field
        others = {k: v for k, v in original.items() if k not in self.properties}
        self.fields["extra"].initial = canonical_json(others) if others else ""
        # The arguments first, in the schema's order; the note last.
        self.fields = {**fields, "extra": self.fields["extra"], "message": self.fields["message"]}

    def argument_fields(self) -> list[forms.BoundField]:
        return [self[ARG_PREFIX + name] for name in self.properties]

    def _value(self, name: str, text: str) -> tuple[bool, Any]:
        """(present, value) of one argument as typed; a value of the wrong type is kept as
        typed so that the schema names what is wrong with it."""
        kind = self.kinds[name]
        if kind == "string":
            return (text != "", text)
        text = text.strip()
        if text == "":
            return False, None
        if kind in {"enum", "json"}:
            try:
                return True, calls.parse_value(text)
            except NestedTooDeeplyError:
                raise forms.ValidationError(calls.TOO_DEEP) from None
            except ValueError as error:
                raise forms.ValidationError(f"This is not valid JSON: {error}.") from None
        if kind == "boolean":
            return True, text == "true"
        try:
            return True, int(text)
        except ValueError:
            pass
        if kind == "number":
            try:
                number = float(text)
            except ValueError:
                return True, text
            if number != number or number in (float("inf"), float("-inf")):
                return True, text
            return True, number
        return True, text

    def clean(self):
        data = super().clean()
        arguments: dict[str, Any] = {}
        for name in self.properties:
            key = ARG_PREFIX + name
            if key in self.errors:
                continue
            try:
                present, value = self._value(name, self.data.get(key, "") or "")
            except forms.ValidationError as error:
                self.add_error(key, error)
                continue
            if present:
                arguments[name] = value
        extra_text = (data.get("extra") or "").strip()
        if extra_text:
            try:
                # An object of arguments: one level more than an argument's value.
                extra = calls.parse_value(extra_text, levels=calls.MAX_DEPTH + 1)
            except NestedTooDeeplyError:
                self.add_error("extra", calls.TOO_DEEP)
            except ValueError as error:
                self.add_error("extra", f"This is not valid JSON: {error}.")
            else:
                if not isinstance(extra, dict):
                    self.add_error("extra", "Other arguments must be a JSON object, like {}.")
                else:
                    clash = sorted(set(extra) & set(self.properties))
                    if clash:
                        self.add_error(
                            "extra", f"Set {', '.join(clash)} in its own field, not here."
                        )
                    arguments.update({k: v for k, v in extra.items() if k not in arguments})
        if self.errors:
            return data
        for problem in calls.schema_problems(self.schema, arguments):
            if problem.argument in self.properties:
                self.add_error(ARG_PREFIX + problem.argument, problem.message)
            elif problem.unknown:
                self.add_error("extra", problem.message)
            else:
                self.add_error(None, problem.message)
        if not self.errors:
            self.arguments = arguments
        return data
