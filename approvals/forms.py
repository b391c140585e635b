from __future__ import annotations

import re

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model

from approvals import policies, registry
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
