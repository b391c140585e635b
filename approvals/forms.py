from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model

from approvals import policies, preauth, registry
from approvals.core.canonical import canonical_json
from approvals.models import ApprovalPolicy, ExpiryAction, RunStatus, TicketStatus
from approvals.services import MAX_MESSAGE_CHARS
from approvals.team import MAX_BATCH, MAX_COMMENT_CHARS

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
            "changed",
            "created",
            # webhooks (notifications)
            "active",
            "inactive",
            "deleted",
            "delivered",
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


class PolicyForm(forms.Form):
    """One version of an approval policy; rules are typed as short lines of text."""

    tenant = forms.CharField(max_length=64, widget=forms.HiddenInput)
    agent = forms.ChoiceField(required=False, label="Agent")
    tool = forms.ChoiceField(required=False, label="Tool")
    required_approvals = forms.IntegerField(
        min_value=1,
        max_value=policies.MAX_APPROVALS,
        initial=1,
        label="Approvals needed",
        help_text="Distinct people; the requester never counts.",
    )
    group_rules = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Approvals needed from groups",
        help_text="One per line: COUNT GROUP, e.g. '1 release managers'.",
    )
    allowed_groups = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Who may decide",
        help_text="None ticked: any approver or admin of the tenant.",
    )
    expiry_minutes = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=60 * 24 * 30,
        label="Expires after (minutes)",
        help_text="Empty: the console's default.",
    )
    on_expiry = forms.ChoiceField(choices=ExpiryAction.choices, label="On expiry")
    expiry_message = forms.CharField(
        required=False,
        max_length=MAX_MESSAGE_CHARS,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Message to the model on an expiry rejection",
    )
    escalation_group = forms.ChoiceField(required=False, label="Escalate to")
    escalation_minutes = forms.IntegerField(
        required=False, min_value=1, max_value=60 * 24 * 30, label="Escalation window (minutes)"
    )
    auto_rules = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        label="Automatic decisions",
        help_text="One per line: 'approve if environment != production because staging is low "
        "risk'. Operators: ==, !=, in, not in, matches (a regular expression).",
    )

    def __init__(self, *args, groups: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.groups = groups
        self.fields["agent"].choices = [("", "any agent")] + [
            (key, key) for key in sorted(settings.APPROVALS_AGENTS)
        ]
        self.fields["tool"].choices = [("", "any tool")] + [
            (name, name) for name in registry.tool_names()
        ]
        self.fields["allowed_groups"].choices = [(g, g) for g in groups]
        self.fields["escalation_group"].choices = [("", "nobody")] + [(g, g) for g in groups]

    @classmethod
    def initial_from(cls, policy: ApprovalPolicy, tenant_slug: str) -> dict:
        return {
            "tenant": tenant_slug,
            "agent": policy.agent_key,
            "tool": policy.tool_name,
            "required_approvals": policy.required_approvals,
            "group_rules": policies.format_group_rules(policy.group_rules or []),
            "allowed_groups": list(policy.allowed_groups or []),
            "expiry_minutes": policy.expiry_seconds // 60 if policy.expiry_seconds else None,
            "on_expiry": policy.on_expiry,
            "expiry_message": policy.expiry_message,
            "escalation_group": policy.escalation_group,
            "escalation_minutes": (
                policy.escalation_seconds // 60 if policy.escalation_seconds else None
            ),
            "auto_rules": policies.format_auto_rules(policy.auto_rules or []),
        }

    def clean_group_rules(self) -> list[dict]:
        try:
            rules = policies.parse_group_rules(self.cleaned_data["group_rules"])
        except policies.RuleSyntaxError as error:
            raise forms.ValidationError(str(error).capitalize() + ".") from None
        unknown = sorted({r["group"] for r in rules} - set(self.groups))
        if unknown:
            raise forms.ValidationError(
                f"There is no group called {unknown[0]!r}; create it under Groups first."
            )
        return rules

    def clean_auto_rules(self) -> list[dict]:
        try:
            return policies.parse_auto_rules(self.cleaned_data["auto_rules"])
        except policies.RuleSyntaxError as error:
            raise forms.ValidationError(str(error).capitalize() + ".") from None

    def clean(self):
        data = super().clean()
        if data.get("on_expiry") == ExpiryAction.ESCALATE and not data.get("escalation_group"):
            self.add_error("escalation_group", "Choose the group to escalate to.")
        rules = data.get("group_rules") or []
        needed = sum(r["count"] for r in rules)
        if data.get("required_approvals") and needed > policies.MAX_APPROVALS:
            self.add_error("group_rules", f"At most {policies.MAX_APPROVALS} approvals in all.")
        return data

    def policy_values(self) -> dict:
        data = self.cleaned_data
        return {
            "required_approvals": data["required_approvals"],
            "group_rules": data["group_rules"],
            "allowed_groups": data["allowed_groups"],
            "expiry_seconds": data["expiry_minutes"] * 60 if data["expiry_minutes"] else None,
            "on_expiry": data["on_expiry"],
            "expiry_message": data["expiry_message"].strip(),
            "escalation_group": data["escalation_group"],
            "escalation_seconds": (
                data["escalation_minutes"] * 60 if data["escalation_minutes"] else None
            ),
            "auto_rules": data["auto_rules"],
        }


class GroupForm(forms.Form):
    tenant = forms.CharField(max_length=64, widget=forms.HiddenInput)
    name = forms.CharField(max_length=100, label="Group name")
    members = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Members"
    )

    def __init__(self, *args, usernames: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["members"].choices = [(u, u) for u in usernames]

    def clean_name(self) -> str:
        name = " ".join(self.cleaned_data["name"].split())
        if not name:
            raise forms.ValidationError("A group needs a name.")
        return name


class ClaimForm(forms.Form):
    action = forms.ChoiceField(
        choices=[("claim", "I'm on it"), ("take_over", "Take over"), ("release", "Release")]
    )


class CommentForm(forms.Form):
    text = forms.CharField(
        max_length=MAX_COMMENT_CHARS,
        widget=forms.Textarea(attrs={"rows": 3}),
        error_messages={"required": "Write something first."},
    )


class _TicketIds(forms.Field):
    """Ticket numbers, from repeated "ticket" fields (the queue's checkboxes)."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value) -> list[int]:
        values = value if isinstance(value, list | tuple) else [value] if value else []
        if len(values) > MAX_BATCH:
            raise forms.ValidationError(
                f"A batch holds at most {MAX_BATCH} tickets; {len(values)} were selected."
            )
        ids = []
        for item in values:
            text = str(item).strip()
            if not text.isascii() or not text.isdigit() or len(text) > 18:
                raise forms.ValidationError(f"{text[:20]!r} is not a ticket number.")
            ids.append(int(text))
        return list(dict.fromkeys(ids))


class BatchDecisionForm(forms.Form):
    ticket = _TicketIds(required=False)
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    message = forms.CharField(required=False, max_length=MAX_MESSAGE_CHARS)

    def clean_ticket(self) -> list[int]:
        if not self.cleaned_data["ticket"]:
            raise forms.ValidationError("Select at least one ticket.")
        return self.cleaned_data["ticket"]


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
