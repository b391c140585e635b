from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model

from approvals import preauth
from approvals.canonical import canonical_json
from approvals.models import RunStatus, TicketStatus
from approvals.services import MAX_MESSAGE_CHARS

_NAME = re.compile(r"^[\w.:@+-]{1,200}$")


def _checked_name(value: str, what: str) -> str:
    if value and not _NAME.match(value):
        raise forms.ValidationError(f"That is not a valid {what} name.")
    return value


class _TenantFilterForm(forms.Form):
    """Filters over the tenants a user may see: the tenant must be one of them."""

    tenant = forms.CharField(required=False, max_length=64)
    tool = forms.CharField(required=False, max_length=200)
    after = forms.CharField(required=False, max_length=500)
    tenant_refusal = "You are not a member of a tenant called {slug!r}."

    def __init__(self, *args, tenant_slugs: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tenant_slugs = tenant_slugs

    def clean_tenant(self) -> str:
        slug = self.cleaned_data["tenant"]
        if slug and slug not in self.tenant_slugs:
            raise forms.ValidationError(self.tenant_refusal.format(slug=slug))
        return slug

    def clean_tool(self) -> str:
        return _checked_name(self.cleaned_data["tool"], "tool")


class QueueFilterForm(_TenantFilterForm):
    agent = forms.CharField(required=False, max_length=100)
    requester = forms.CharField(required=False, max_length=150)

    def clean_agent(self) -> str:
        agent = self.cleaned_data["agent"]
        if agent and agent not in settings.APPROVALS_AGENTS:
            raise forms.ValidationError(f"There is no agent called {agent!r}.")
        return agent

    def clean_requester(self) -> str:
        name = _checked_name(self.cleaned_data["requester"], "user")
        if name and not get_user_model().objects.filter(username=name).exists():
            raise forms.ValidationError(f"There is no user called {name!r}.")
        return name


class AuditFilterForm(_TenantFilterForm):
    actor = forms.CharField(required=False, max_length=150)
    action = forms.CharField(required=False, max_length=64)
    outcome = forms.CharField(required=False, max_length=64)
    since = forms.DateField(required=False)
    until = forms.DateField(required=False)
    tenant_refusal = "You cannot read the history of a tenant called {slug!r}."

    OUTCOMES = sorted(
        {
            *RunStatus.values,
            *TicketStatus.values,
            "done",
            "failed",
            "rotated",
            "exported",
            "cleared",
            "locked_out",
        }
    )

    def clean_actor(self) -> str:
        value = self.cleaned_data["actor"]
        if value and not re.match(r"^[\w .:@+#-]{1,150}$", value):
            raise forms.ValidationError("That is not a valid actor name.")
        return value

    def clean_action(self) -> str:
        value = self.cleaned_data["action"]
        if value and not re.match(r"^[a-z_]+\.[a-z_]+$", value):
            raise forms.ValidationError("Actions look like ticket.approved or run.completed.")
        return value

    def clean_outcome(self) -> str:
        value = self.cleaned_data["outcome"]
        if value and value not in self.OUTCOMES:
            raise forms.ValidationError(f"Unknown outcome {value!r}.")
        return value

    def clean(self):
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            raise forms.ValidationError("The start date is after the end date.")
        return data


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    message = forms.CharField(
        required=False,
        max_length=MAX_MESSAGE_CHARS,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Sent back to the model when you reject.",
    )
    always = forms.BooleanField(required=False)

    def clean(self):
        data = super().clean()
        if data.get("always") and data.get("decision") == "reject":
            raise forms.ValidationError("'Always approve' goes with an approval, not a rejection.")
        return data


class ResolveForm(forms.Form):
    resolution = forms.ChoiceField(
        choices=[
            ("happened", "The effect happened: record it and let the run finish"),
            ("retry", "The effect did not happen: run it again"),
            ("abandon", "Stop the run here"),
        ]
    )
    note = forms.CharField(
        required=False, max_length=1000, widget=forms.Textarea(attrs={"rows": 2})
    )


class TenantSwitchForm(forms.Form):
    tenant = forms.CharField(required=False, max_length=64)
    next = forms.CharField(required=False, max_length=500)


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
                return True, json.loads(text)
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
                extra = json.loads(extra_text)
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
        for problem in preauth.schema_problems(self.schema, arguments):
            if problem.argument in self.properties:
                self.add_error(ARG_PREFIX + problem.argument, problem.message)
            elif problem.unknown:
                self.add_error("extra", problem.message)
            else:
                self.add_error(None, problem.message)
        if not self.errors:
            self.arguments = arguments
        return data
