"""Editing approval policies and approver groups."""

from __future__ import annotations

from django import forms
from django.conf import settings

from approvals.decisions.decide import MAX_MESSAGE_CHARS
from approvals.execution import registry
from approvals.models import ApprovalPolicy, ExpiryAction
from approvals.policies import quorum, rules, versions


class PolicyForm(forms.Form):
    """One version of an approval policy; rules are typed as short lines of text."""

    tenant = forms.CharField(max_length=64, widget=forms.HiddenInput)
    agent = forms.ChoiceField(required=False, label="Agent")
    tool = forms.ChoiceField(required=False, label="Tool")
    required_approvals = forms.IntegerField(
        min_value=1,
        max_value=quorum.MAX_APPROVALS,
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
        help_text="One per line: 'approve if environment in staging, dev because they are low "
        "risk'. Operators: ==, !=, in, not in, matches (a regular expression, RE2). Values are "
        "compared ignoring case, width and invisible characters. Prefer an allow-list (== or "
        "in): a '!=' or 'not in' rule is a deny-list and approves every value it does not name. "
        "A call with invisible or look-alike characters is never approved by a rule.",
    )

    step_up_minutes = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=versions.MAX_STEP_UP_MINUTES,
        label="Second factor within (minutes)",
        help_text="Empty: no step-up. Set: approving asks for a second factor (authenticator "
        "app, recovery code or passkey) unless the approver confirmed one this recently. A "
        "batch or an API token cannot approve such a call.",
    )
    step_up_rules = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Second factor only when",
        help_text="One condition per line, e.g. 'environment == production'; any line that "
        "matches asks for it. Empty: every approval under this policy. Operators as above.",
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
            "group_rules": rules.format_group_rules(policy.group_rules or []),
            "allowed_groups": list(policy.allowed_groups or []),
            "expiry_minutes": policy.expiry_seconds // 60 if policy.expiry_seconds else None,
            "on_expiry": policy.on_expiry,
            "expiry_message": policy.expiry_message,
            "escalation_group": policy.escalation_group,
            "escalation_minutes": (
                policy.escalation_seconds // 60 if policy.escalation_seconds else None
            ),
            "auto_rules": rules.format_auto_rules(policy.auto_rules or []),
            "step_up_minutes": policy.step_up_minutes,
            "step_up_rules": rules.format_conditions(policy.step_up_rules or []),
        }

    def clean_group_rules(self) -> list[dict]:
        try:
            parsed = rules.parse_group_rules(self.cleaned_data["group_rules"])
        except rules.RuleSyntaxError as error:
            raise forms.ValidationError(str(error).capitalize() + ".") from None
        unknown = sorted({r["group"] for r in parsed} - set(self.groups))
        if unknown:
            raise forms.ValidationError(
                f"There is no group called {unknown[0]!r}; create it under Groups first."
            )
        return parsed

    def clean_auto_rules(self) -> list[dict]:
        try:
            return rules.parse_auto_rules(self.cleaned_data["auto_rules"])
        except rules.RuleSyntaxError as error:
            raise forms.ValidationError(str(error).capitalize() + ".") from None

    def clean_step_up_rules(self) -> list[dict]:
        try:
            return rules.parse_conditions(self.cleaned_data["step_up_rules"])
        except rules.RuleSyntaxError as error:
            # Not capitalize(): it would lower the ARGUMENT OP VALUE placeholders.
            text = str(error)
            raise forms.ValidationError(text[:1].upper() + text[1:] + ".") from None

    def clean(self):
        data = super().clean()
        if data.get("step_up_rules") and not data.get("step_up_minutes"):
            self.add_error(
                "step_up_minutes", "Say within how many minutes, or clear the conditions."
            )
        if data.get("on_expiry") == ExpiryAction.ESCALATE and not data.get("escalation_group"):
            self.add_error("escalation_group", "Choose the group to escalate to.")
        rules = data.get("group_rules") or []
        needed = sum(r["count"] for r in rules)
        if data.get("required_approvals") and needed > quorum.MAX_APPROVALS:
            self.add_error("group_rules", f"At most {quorum.MAX_APPROVALS} approvals in all.")
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
            "step_up_minutes": data["step_up_minutes"],
            "step_up_rules": data["step_up_rules"] if data["step_up_minutes"] else [],
        }


class GroupForm(forms.Form):
    tenant = forms.CharField(max_length=64, widget=forms.HiddenInput)
    name = forms.CharField(max_length=100, label="Group name")
    members = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Members",
        help_text="Only approvers and admins may decide, so only they are offered; change a "
        "member's role on the Team page.",
    )

    def __init__(self, *args, usernames: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["members"].choices = [(u, u) for u in usernames]

    def clean_name(self) -> str:
        name = " ".join(self.cleaned_data["name"].split())
        if not name:
            raise forms.ValidationError("A group needs a name.")
        return name
