"""Filters of the queue and the audit history."""

from __future__ import annotations

import re
from functools import cached_property

from django import forms
from django.conf import settings

from approvals import members
from approvals.audit import actions

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

    @cached_property
    def chosen(self) -> dict[str, str]:
        """What the person asked for, as sent, every field's ("" for one not sent): what the
        page's controls show again. A template comparing each option of a long list with
        form.data.<name> fails a lookup per option when the name was not sent; this dict has
        every name."""
        return {name: self.data.get(name, "") for name in self.fields}

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
        # Only members of the viewer's tenants: someone of another tenant is refused exactly
        # like a name nobody has.
        if name and not members.is_member_named(name, tenant_slugs=self.tenant_slugs):
            raise forms.ValidationError(f"Nobody called {name!r} is a member of your tenants.")
        return name


class AuditFilterForm(_TenantFilterForm):
    actor = forms.CharField(required=False, max_length=150)
    # Words of the detail (a session id, a release, a reason): see audit.history.history_page.
    q = forms.CharField(required=False, max_length=200)
    action = forms.CharField(required=False, max_length=64)
    outcome = forms.CharField(required=False, max_length=64)
    since = forms.DateField(required=False)
    until = forms.DateField(required=False)
    tenant_refusal = "You cannot read the history of a tenant called {slug!r}."

    # The outcomes events record: one list, kept with the actions (audit.actions).
    OUTCOMES = actions.OUTCOMES

    def clean_actor(self) -> str:
        value = self.cleaned_data["actor"]
        if value and not re.match(r"^[\w .:@+#-]{1,150}$", value):
            raise forms.ValidationError("That is not a valid actor name.")
        return value

    def clean_q(self) -> str:
        value = " ".join(self.cleaned_data["q"].split())
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise forms.ValidationError("The search cannot hold control characters.")
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
