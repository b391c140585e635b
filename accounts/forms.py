"""The forms of the accounts pages: one's sessions, a tenant's Sign-in settings."""

from __future__ import annotations

from django import forms

from accounts.models import GroupRole
from approvals.models import Role


class EndSessionsForm(forms.Form):
    """Sign out one of one's other sessions (by its id in the list), or all of them (none)."""

    session = forms.IntegerField(required=False, min_value=1)


class SignInForm(forms.Form):
    tenant = forms.CharField(widget=forms.HiddenInput)
    provider = forms.ChoiceField(required=False, label="Single sign-on provider")
    required = forms.BooleanField(required=False, label="Members must sign in with single sign-on")
    deciders_need_two_factor = forms.BooleanField(
        required=False, label="Deciders must have two-factor"
    )

    def __init__(self, *args, providers: list[tuple[str, str]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["provider"].choices = [("", "None (passwords and passkeys)"), *providers]

    def clean(self):
        data = super().clean()
        if data.get("required") and not data.get("provider"):
            self.add_error("required", "Choose the provider members must sign in with.")
        return data


class MappingForm(forms.Form):
    tenant = forms.CharField(widget=forms.HiddenInput)
    provider = forms.ChoiceField(label="Provider")
    group = forms.CharField(
        label="Group",
        max_length=GroupRole._meta.get_field("group").max_length,
        error_messages={"required": "Give the group's name as the provider sends it."},
    )
    role = forms.ChoiceField(label="Role", choices=Role.choices)

    def __init__(self, *args, providers: list[tuple[str, str]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["provider"].choices = providers
        if len(providers) == 1:
            self.fields["provider"].initial = providers[0][0]
